"""``TrainConfig``: every knob of the RL trainer, one documented field each (CleanRL style).

The knobs of one concern live in one group (:mod:`memkit.rl.groups`: ``cfg.lora``, ``cfg.clip``,
``cfg.kl``, ``cfg.critic``, ``cfg.eval``, ``cfg.save``, ``cfg.runtime``; :mod:`memkit.rl.rules`: each
credit rule's own), 40 top-level fields in all. A grouped knob keeps its flat name as its flag
(``--kl-coef``), in :meth:`TrainConfig.from_flags` / :meth:`TrainConfig.with_flags` and in older
checkpoints (:meth:`TrainConfig.from_dict`).

The defaults are a small MEM1-style GRPO run on the tiny SFT'd model; the papers' values are
noted where they differ (MEM1 App. B.1: PPO, lr 1e-6 actor / 1e-5 critic; its released scripts add
kl 0.001 low_var_kl; MemSearcher: GRPO, group size 5, lr 1e-6). ``validate()`` turns a bad value into
one ``ValueError`` that names the fix.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace

from memkit.agents import ALL_METHODS, STREAM_METHODS
from memkit.agents.base import PROMPTS
from memkit.core.fields import flat_names
from memkit.rl.choices import AGG_MODES, PACKING_MODES
from memkit.rl.groups import (
    BudgetConfig,
    ClipConfig,
    CriticConfig,
    DataConfig,
    EvalConfig,
    KLConfig,
    LoRAConfig,
    RuntimeConfig,
    SaveConfig,
)
from memkit.rl.rules import DCPOConfig, MemPOConfig, MoTConfig
from memkit.world.splits import TRAINING_SPLITS
from memkit.world.task_sets import EVAL_SEEDS

#: algorithm -> its credit rule (``memkit.rl.credit``); "method" = the memory format's own
#: group-relative rule (``Method.default_credit``: grpo; multi_context for MemSearcher; mempo; dcpo for MemAct)
ALGO_CREDIT = {"grpo": "method", "ppo": "gae"}
ALGOS = tuple(ALGO_CREDIT)


@dataclass
class TrainConfig:
    # ---- what is trained ---------------------------------------------------------------
    algo: str = field(default="grpo", metadata={"choices": ALGOS})
    """``grpo`` (group-normalised outcome advantage copied to every call: MemSearcher's
    multi-context GRPO) or ``ppo`` (critic + GAE over each trajectory's trained tokens: MEM1 §3.2).
    GRPO is the default because PPO's critic starts as a fresh value head: on the tiny model it
    never predicted the reward better than a constant, and a GRPO step costs half as much
    (measured: docs/findings.md, 'RL settings')."""
    method: str = field(default="mem1", metadata={"choices": ALL_METHODS})
    """Memory format (``memkit.agents.ALL_METHODS``): decides contexts, parsing and the outcome reward."""
    method_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of ``get_method`` (e.g. memsearcher ``memory_budget_words``)."""
    init: str = "tiny-sft"
    """Initial policy: ``tiny-sft`` (cached SFT checkpoint of ``method``; make it with
    ``memkit sft --method M``; for ``memt`` the RL lab's retrieval clone, trained on first use),
    ``tiny-sft:<tag>`` (a variant ``memkit sft`` saved under that tag), ``tiny`` (random init),
    ``smollm2-135m``, a checkpoint dir or a hub id."""
    prompt: str = field(default="auto", metadata={"choices": PROMPTS})
    """Instruction in each context: ``paper`` | ``compact`` | ``auto`` (compact for tiny models,
    as ``memkit sft`` trains them; paper for chat models) — see ``policies.prompt_wrap``."""
    packing: str = field(default="auto", metadata={"choices": ("auto", *PACKING_MODES)})
    """``separate`` | ``mem1_mask`` | ``mem1_exact`` (see ``memkit.rl.packing``); ``auto`` = the
    method's ``default_packing`` (``mem1_mask`` for mem1: the paper's masked trajectory;
    ``separate`` otherwise)."""
    credit: str = "auto"
    """Credit rule (``memkit.rl.credit.CREDIT_RULES``: grpo | multi_context | gae | mempo | dcpo); ``auto`` = what
    ``algo`` implies (``ALGO_CREDIT``: the method's ``default_credit`` for grpo, gae for ppo). A rule
    that needs values (gae) trains a critic."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters instead of full fine-tuning: :class:`memkit.rl.groups.LoRAConfig`, flags ``--lora``, ``--lora-r``, ``--lora-alpha``."""

    # ---- rollouts ----------------------------------------------------------------------
    steps: int = 50
    """Training steps; each is one rollout batch followed by ``ppo_epochs`` passes over it."""
    budget: BudgetConfig = field(default_factory=BudgetConfig, metadata={"prefix": "max_"})
    """Wall-clock and rollout-token budgets (None = run all ``steps``): :class:`memkit.rl.groups.BudgetConfig`,
    flags ``--max-seconds`` / ``--max-minutes``, ``--max-rollout-tokens``."""
    tasks_per_step: int = 8
    """Distinct tasks per step (global, split over processes)."""
    n_samples: int = 4
    """Trajectories per task (the GRPO group size G)."""
    objectives: tuple[int, ...] = (2,)
    """Questions per training task (MEM1 trains on 2-objective tasks)."""
    n_train_tasks: int = 1000
    """Size of the training task pool (``memkit.world.training_tasks`` of :attr:`question_split`)."""
    question_split: str = field(
        default="rl",
        metadata={
            "choices": TRAINING_SPLITS,
            "hint": "rl: questions SFT never saw; sft; train: both. test is evaluation's",
        },
    )
    """Which questions the training tasks ask (``memkit.world.question_split``): ``"rl"`` (default),
    the tenth of the questions that behaviour cloning never saw, so RL rewards answers the policy
    had to search for rather than recall; ``"sft"`` the ones SFT cloned; ``"train"`` both. Never
    ``"test"``: the held-out evaluation asks those."""
    data: DataConfig = field(default_factory=DataConfig, metadata={"prefix": ""})
    """The synthetic world of ``world_seed``, or real questions over a real corpus:
    :class:`memkit.rl.groups.DataConfig`, flags ``--world-seed``, ``--tasks``, ``--corpus``, ``--answerable``,
    ``--retriever`` (training tasks of ``question_split`` and held-out ones: :func:`memkit.lab.real.data_kit`)."""
    max_turns: int | None = None
    """Tool calls per trajectory; None = the method's per-task limit (hops + 4, as evaluation uses)."""
    max_context_tokens: int = 2048
    """A call whose context is longer ends its trajectory as invalid (format penalty)."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts, and of the policy the loss trains: every log-prob
    of the update (new, old, reference) is ``log_softmax(logits / T)``, the numbers the rollout
    records, so the first PPO ratio is 1 for any T (verl divides the logits the same way). The
    papers use 1.0. Greedy evaluation is the same policy for every T; a lower T makes the samples
    differ from greedy only where the model is unsure, so the group's reward differences come from
    the choices that decide greedy answers (notebooks 02/03 use 0.5). At T = 1 an SFT'd tiny model's
    samples are far worse than its greedy answers and RL spends its steps sharpening them
    (measured: docs/findings.md, 'RL settings')."""
    top_p: float = 1.0
    """Nucleus sampling for training rollouts (1.0 = off)."""

    # ---- optimisation ------------------------------------------------------------------
    lr: float = 1e-5
    """Actor learning rate (AdamW). The papers use ~1e-6 for 3B-7B models; the tiny SFT'd model
    barely moves below ~1e-4, so notebooks 02/03 use 3e-4 (measured: docs/findings.md, 'RL settings')."""
    warmup_steps: int = 0
    """Linear learning-rate warmup (optimizer steps), then constant (verl default)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip, applied separately to actor and critic."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batches: int = 1
    """Optimizer steps per epoch: the local trajectories are cut into this many mini-batches."""

    # ---- loss --------------------------------------------------------------------------
    clip: ClipConfig = field(default_factory=ClipConfig)
    """The PPO ratio clip: :class:`memkit.rl.groups.ClipConfig`, flags ``--clip-low``, ``--clip-high``, ``--clip-ratio-c``."""
    kl: KLConfig = field(default_factory=KLConfig)
    """The KL term: :class:`memkit.rl.groups.KLConfig`, flags ``--kl-coef``, ``--kl-kind``."""
    agg: str = field(default="token-mean", metadata={"choices": AGG_MODES})
    """Loss aggregation over the whole mini-batch (all micro-batches and processes):
    token-mean | seq-mean-token-mean (MemSearcher eq. 7 with separate packing) | seq-mean-token-sum."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (entropy is logged either way when ``log_entropy``)."""

    # ---- credit assignment ---------------------------------------------------------------
    grpo_norm_std: bool = True
    """GRPO: divide by the group std (False = Dr. GRPO, mean-centring only)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """PPO's critic and GAE: :class:`memkit.rl.groups.CriticConfig`, flags ``--critic-lr``, ``--gamma``, ``--lam``,
    ``--whiten-advantages``, ``--vf-clip``."""
    mem_reward: MemPOConfig = field(default_factory=MemPOConfig)
    """MemPO's memory reward (credit ``mempo``): :class:`memkit.rl.rules.MemPOConfig`, flags ``--mem-reward-*``."""
    dcpo: DCPOConfig = field(default_factory=DCPOConfig)
    """MemAct's DCPO (credit ``dcpo``): :class:`memkit.rl.rules.DCPOConfig`, flags ``--dcpo-*``."""
    mot: MoTConfig = field(default_factory=MoTConfig)
    """Mem-T's MoT-GRPO (credit ``mot``): :class:`memkit.rl.rules.MoTConfig`, flags ``--mot-*``."""

    # ---- evaluation, logging, checkpoints --------------------------------------------------
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation during training: :class:`memkit.rl.groups.EvalConfig`, flags ``--eval-every``,
    ``--eval-at-start``, ``--eval-tasks``, ``--eval-seed``, ``--eval-objectives``."""
    save: SaveConfig = field(default_factory=SaveConfig)
    """Checkpoints: :class:`memkit.rl.groups.SaveConfig`, flags ``--save-every``, ``--keep-checkpoints``."""
    out_dir: str = "runs/train"
    """Run directory: metrics.jsonl, metrics.csv, eval.jsonl, checkpoints/."""

    # ---- reproducibility / hardware ------------------------------------------------------
    seed: int = 0
    """Seeds model init (tiny), task sampling and rollouts (each step re-seeds from (seed, step, rank))."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig, metadata={"prefix": ""})
    """Speed, memory and hardware, never what is learnt: :class:`memkit.rl.groups.RuntimeConfig`, flags
    ``--micro-batch-size``, ``--attention``, ``--row-groups``, ``--recompute-old-logprobs``, ``--log-entropy``,
    ``--device``, ``--mixed-precision``, ``--dtype``, ``--ref-dtype``, ``--backend``, ``--backend-dtype``."""

    # ------------------------------------------------------------------------------------------
    def resolved_packing(self) -> str:
        """The packing mode: ``packing``, or the method's ``default_packing`` when ``auto``."""
        if self.packing == "auto":
            from memkit.agents import get_method

            return get_method(self.method, **self.method_kwargs).default_packing
        return self.packing

    def resolved_credit(self) -> str:
        """The credit rule's name: ``credit``, or what ``algo`` implies when ``auto``."""
        if self.credit != "auto":
            return self.credit
        rule = ALGO_CREDIT[self.algo]
        if rule == "method":
            from memkit.agents import get_method

            return get_method(self.method, **self.method_kwargs).default_credit
        return rule

    def resolved_recompute(self) -> bool:
        """Recompute old log-probs before the update (``RuntimeConfig.recompute_old_logprobs``; None = where
        the rollout's differ: ``mem1_mask`` packing or mixed precision)."""
        rt = self.runtime
        if rt.recompute_old_logprobs is None:
            return self.resolved_packing() == "mem1_mask" or rt.mixed_precision != "no"
        return bool(rt.recompute_old_logprobs)

    def validate(self) -> "TrainConfig":
        from memkit.agents import get_method

        def at(name):  # a dotted name: "eval.seed"
            obj = self
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj

        flags = {path: flat for path, flat, _ in flat_names(type(self))}

        def named(name, value):  # a grouped knob also names its flag: TrainConfig.eval.seed=5 (flag --eval-seed)
            return f"TrainConfig.{name}={value!r}" + (
                f" (flag --{flags[name].replace('_', '-')})" if "." in name else ""
            )

        def bad(name, why):
            raise ValueError(f"{named(name, at(name))}: {why}")

        for name, f, value in _choice_fields(self):  # every field that declares choices (the CLI's flags offer them)
            if value not in f.metadata["choices"]:
                raise ValueError(
                    f"{named(name, value)}: choose one of {', '.join(map(str, f.metadata['choices']))}"
                    + (f" ({f.metadata['hint']})" if "hint" in f.metadata else "")
                )
        try:
            get_method(self.method, **self.method_kwargs)
        except (TypeError, ValueError) as e:  # an unknown keyword or a bad value, named by the method
            bad("method_kwargs", f"{e} (see memkit.agents.{self.method})")
        for name in (
            "steps",
            "tasks_per_step",
            "n_samples",
            "ppo_epochs",
            "mini_batches",
            "runtime.micro_batch_size",
            "runtime.row_groups",
            "n_train_tasks",
            "save.keep",
        ):
            if int(at(name)) < 1:
                bad(name, "must be >= 1")
        try:
            self.data.check()
        except ValueError as e:
            bad("data.answerable", str(e))
        if self.data.real and self.method in STREAM_METHODS:
            bad("data.tasks", f"{self.method} learns from conversation streams, not questions over a corpus")
        if self.mot.pivots < 1:
            bad("mot.pivots", "must be >= 1 (N_v pivot nodes per tree and round)")
        ev = self.eval
        if ev.seed not in EVAL_SEEDS or ev.seed + max(ev.objectives, default=0) not in EVAL_SEEDS:
            bad(
                "eval.seed",
                f"evaluation seeds live in [{EVAL_SEEDS.start}, {EVAL_SEEDS.stop}) (training tasks use "
                "the others, memkit.world.training_seed); e.g. 1000 (test) or 3000 (validation)",
            )
        for name in ("eval.every", "save.every", "eval.tasks", "warmup_steps"):
            if int(at(name)) < 0:
                bad(name, "must be >= 0 (0 turns it off)")
        if not self.objectives or min(self.objectives) < 1:
            bad("objectives", "give question counts >= 1, e.g. (2,)")
        for name, what in (("budget.seconds", "wall-clock"), ("budget.rollout_tokens", "token")):
            if at(name) is not None and at(name) <= 0:
                bad(name, f"must be > 0, or None for no {what} budget")
        if self.lr <= 0:
            bad("lr", "learning rates must be > 0")
        if self.critic.lr <= 0:
            bad("critic.lr", "learning rates must be > 0")
        if self.kl.coef < 0:
            bad("kl.coef", "must be >= 0 (0 keeps no reference model)")
        if self.entropy_coef < 0:
            bad("entropy_coef", "must be >= 0")
        if not 0 < self.clip.low < 1 or (self.clip.high is not None and self.clip.high <= 0):
            bad("clip.low", "clip ranges must be in (0, 1), e.g. 0.2")
        if self.clip.ratio_c is not None and self.clip.ratio_c <= 1:
            bad("clip.ratio_c", "the dual-clip bound must be > 1 (e.g. 3.0) or None")
        if self.temperature <= 0:
            bad("temperature", "training rollouts must sample (temperature > 0, usually 1.0)")
        if self.runtime.attention == "flex":
            import torch

            if self.runtime.device == "cpu" or not torch.cuda.is_available():
                bad("runtime.attention", "flex_attention has no backward on CPU; use auto or blocks")
        if self.runtime.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            from memkit.models.vllm_backend import INSTALL_HINT

            bad("runtime.backend", f"vLLM is not installed: {INSTALL_HINT}")
        if self.runtime.backend == "hf" and self.runtime.backend_dtype != "auto":
            bad(
                "runtime.backend_dtype",
                "the HF loop decodes with the training model itself: use auto, or --backend vllm",
            )
        if self.mot.rounds < 0:
            bad("mot.rounds", "must be >= 0 (0: each tree is its seed chain only)")
        if self.dcpo.segments < 0:
            bad("dcpo.segments", "give N_seg >= 1 segments per prompt, or 0 for every segment once")
        # last: the registry loads the rules (and torch), so every other bad value is named without it
        from memkit.rl.credit import CREDIT_RULES

        if self.credit != "auto" and self.credit not in CREDIT_RULES:
            bad("credit", f"choose auto or one of {sorted(CREDIT_RULES)}")
        rule = CREDIT_RULES[self.resolved_credit()]
        if rule.needs_values != (ALGO_CREDIT[self.algo] == "gae"):
            bad(
                "credit",
                f"rule {rule.name!r} {'needs' if rule.needs_values else 'trains without'} a critic, "
                f"which algo={self.algo!r} {'does not train' if rule.needs_values else 'trains'}: pick a "
                "critic-free rule with grpo, gae with ppo, or credit='auto'",
            )
        if rule.needs_groups and self.n_samples < 2:
            bad(
                "n_samples",
                f"credit rule {rule.name!r} normalises within a group of samples per task: set "
                "n_samples >= 2 (e.g. 4), or use algo='ppo' (gae)",
            )
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_flags(cls, **flags) -> "TrainConfig":
        """The config of keyword arguments named as the command line's flags: ``kl_coef=0`` is
        ``--kl-coef 0`` (``cfg.kl.coef``), ``eval_every=5`` is ``cfg.eval.every``, ``attention="blocks"``
        is ``cfg.runtime.attention``; ungrouped fields and whole groups pass as they are."""
        return cls.from_dict(flags)

    def with_flags(self, **flags) -> "TrainConfig":
        """A copy with fields changed by their flag names (:meth:`from_flags`): ``cfg.with_flags(eval_every=0)``."""
        return self.from_dict({**self.to_dict(), **flags})

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config of ``to_dict`` (a checkpoint's ``memkit.json``). Older checkpoints stored the
        grouped knobs flat (``eval_every``, ``kl_coef``, ``mem_reward_bias``, ``attention``, ...): each folds
        into its group under its flat name (:func:`memkit.rl.groups.flat_names`, the flag's name)."""
        d, nested = dict(d), {}
        for name in _GROUPS:  # to_dict's nested groups first: "lora" is also lora.enabled's flat name
            if isinstance(d.get(name), dict):
                nested.update({f"{name}.{key}": v for key, v in d.pop(name).items()})
        for path, flat, _ in flat_names(cls):
            if "." in path and flat in d:
                nested[path] = d.pop(flat)
        unknown = sorted(set(d) - {f.name for f in fields(cls)} - set(_GROUPS))
        unknown += sorted(
            p for p in nested if p.split(".", 1)[1] not in {f.name for f in fields(_GROUPS[p.split(".")[0]])}
        )
        if unknown:
            raise ValueError(
                f"unknown TrainConfig fields {unknown}; valid fields: {sorted(p for p, _, _ in flat_names(cls))}"
            )
        for name, group in _GROUPS.items():
            inner = {p.split(".", 1)[1]: v for p, v in nested.items() if p.split(".")[0] == name}
            if "objectives" in inner and inner["objectives"] is not None:
                inner["objectives"] = _counts(inner["objectives"])
            if name in d:  # a group instance, and any flat knobs of it on top
                d[name] = replace(d[name], **inner) if inner else d[name]
            else:
                d[name] = group(**inner)
        if d.get("objectives") is not None:
            d["objectives"] = _counts(d["objectives"])
        return cls(**d)


def _counts(objectives) -> tuple[int, ...]:
    """Question counts as a tuple: ``2`` (one count) or any iterable of them, e.g. ``[1, 2]``."""
    return (objectives,) if isinstance(objectives, int) else tuple(objectives)


#: TrainConfig's nested groups: field name -> dataclass (the rules' configs and memkit.rl.groups')
_GROUPS = {
    f.name: type(f.default_factory())
    for f in fields(TrainConfig)
    if callable(f.default_factory) and is_dataclass(f.default_factory())
}


def _choice_fields(cfg):
    """``(dotted name, field, value)`` of every field with ``choices``, the nested groups' too."""
    for path, _, f in flat_names(type(cfg)):
        if "choices" in f.metadata:
            obj = cfg
            for part in path.split("."):
                obj = getattr(obj, part)
            yield path, f, obj


#: fields that must match for ``--resume`` to continue a run (others may change, e.g. steps); the
#: resolved credit rule must match too (a checkpoint from before ``credit`` existed reads as ``auto``)
RESUME_KEYS = ("algo", "method", "method_kwargs", "init", "packing", "lora", "seed", "data")  # data: world_seed too

__all__ = ["TrainConfig", "ALGOS", "RESUME_KEYS"]
