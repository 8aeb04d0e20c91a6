"""``TrainConfig``: every knob of the RL trainer, one documented field each (CleanRL style).

The defaults are a small MEM1-style GRPO run on the tiny SFT'd model; the papers' values are
noted where they differ (MEM1: PPO, lr 1e-6 actor / 1e-5 critic, kl 0.001 low_var_kl;
MemSearcher: GRPO, group size 5, lr 1e-6). ``validate()`` turns a bad value into one
``ValueError`` that names the fix.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from memkit.agents import METHODS, STREAM_METHODS
from memkit.agents.base import PROMPTS
from memkit.rl.choices import AGG_MODES, ATTENTION_PATHS, KL_KINDS, PACKING_MODES
from memkit.rl.rules import DCPOConfig, MemPOConfig, MoTConfig
from memkit.world.splits import TRAINING_SPLITS
from memkit.world.task_sets import EVAL_SEEDS

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("no", "bf16", "fp16")

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
    method: str = field(default="mem1", metadata={"choices": METHODS + STREAM_METHODS})
    """Memory format (``memkit.agents.METHODS``): decides contexts, parsing and the outcome reward."""
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
    lora: bool = False
    """Train LoRA adapters (peft) instead of all weights; the reference policy is then the base
    model with adapters disabled (no second copy in memory)."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scale numerator (update scaled by alpha / r)."""

    # ---- rollouts ----------------------------------------------------------------------
    steps: int = 50
    """Training steps; each is one rollout batch followed by ``ppo_epochs`` passes over it."""
    max_seconds: float | None = None
    """Wall-clock budget of the training loop (None = run all ``steps``). The loop stops before a
    step would start past it, then evaluates and saves where it stopped (``Trainer.run``)."""
    tasks_per_step: int = 8
    """Distinct tasks per step (global, split over processes)."""
    n_samples: int = 4
    """Trajectories per task (the GRPO group size G)."""
    objectives: tuple[int, ...] = (2,)
    """Questions per training task (MEM1 trains on 2-objective tasks)."""
    n_train_tasks: int = 1000
    """Size of the training task pool (``memkit.world.training_tasks`` of :attr:`question_split`)."""
    question_split: str = field(default="rl", metadata={
        "choices": TRAINING_SPLITS, "hint": "rl: questions SFT never saw; sft; train: both. test is evaluation's"})
    """Which questions the training tasks ask (``memkit.world.question_split``): ``"rl"`` (default),
    the tenth of the questions that behaviour cloning never saw, so RL rewards answers the policy
    had to search for rather than recall; ``"sft"`` the ones SFT cloned; ``"train"`` both. Never
    ``"test"``: the held-out evaluation asks those."""
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
    critic_lr: float = 5e-5
    """Critic learning rate (ppo only)."""
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
    micro_batch_size: int = 8
    """Trajectories per forward pass per process (gradient accumulation inside a mini-batch;
    the update is the same for any value, up to float rounding)."""
    attention: str = field(default="auto", metadata={"choices": ATTENTION_PATHS})
    """Attention of the update's forwards over 2D-masked rows (``mem1_mask``, ``mem1_exact``):
    ``dense`` (sdpa over the whole [L, L] mask: every masked cell computed, which made packing
    slower than ``separate`` rows), ``blocks`` (only the keys each 64-query block may see, no
    compile) or ``flex`` (``flex_attention`` with a BlockMask; compiled, CUDA only). ``auto`` =
    ``blocks`` on CPU, ``dense`` on a GPU, where the tiny model is launch-bound
    (``packed_forward.resolve_attention``, measured by ``benchmarks/grpo_step.py``). The same
    log-probs to ~1e-6 either way; ``separate`` rows are plain causal and ignore it."""
    row_groups: int = 4
    """A micro-batch's rows run as up to this many forward passes of similar-length rows, each
    padded only to its own longest row (``packing.length_groups``); 1 = one forward padded to the
    longest row. The same log-probs either way: rows never attend to each other. Multi-process
    runs keep one forward per micro-batch (DDP's reducer expects one forward per backward)."""

    # ---- loss --------------------------------------------------------------------------
    clip_low: float = 0.2
    """PPO clip epsilon (lower, and upper unless ``clip_high`` is set)."""
    clip_high: float | None = None
    """Upper clip epsilon (DAPO clip-higher, e.g. 0.28); None = ``clip_low``."""
    clip_ratio_c: float | None = None
    """Dual-clip bound c > 1 for negative advantages (None = off)."""
    kl_coef: float = 0.001
    """Weight of KL(pi || pi_ref) in the loss (0 = no reference model is kept)."""
    kl_kind: str = field(default="low_var_kl", metadata={"choices": KL_KINDS})
    """KL estimator: k1 | k2 | k3 (= low_var_kl) | abs ... (``memkit.rl.losses.kl_penalty``)."""
    agg: str = field(default="token-mean", metadata={"choices": AGG_MODES})
    """Loss aggregation over the whole mini-batch (all micro-batches and processes):
    token-mean | seq-mean-token-mean (MemSearcher eq. 7 with separate packing) | seq-mean-token-sum."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (entropy is logged either way when ``log_entropy``)."""
    log_entropy: bool = True
    """Compute the policy entropy on trained tokens (costs a [B, L, V] softmax)."""
    recompute_old_logprobs: bool | None = None
    """Recompute old log-probs with the packed forward before updating (verl; the mean gap to the
    rollout's is logged as ``old_logprob_gap``). None = only where they differ from what the rollout
    recorded: ``mem1_mask`` packing (App. B.7's position ids) or mixed precision. ``separate`` and
    ``mem1_exact`` rows reproduce the rollout's log-probs (tested to 1e-4), so their rollout values
    serve as old log-probs and the update saves a forward pass (``benchmarks/update_cost.py``)."""

    # ---- credit assignment ---------------------------------------------------------------
    grpo_norm_std: bool = True
    """GRPO: divide by the group std (False = Dr. GRPO, mean-centring only)."""
    gamma: float = 1.0
    """PPO discount over trained tokens."""
    lam: float = 1.0
    """PPO GAE lambda."""
    whiten_advantages: bool = True
    """PPO: whiten GAE advantages over the whole rollout batch, all processes (verl)."""
    vf_clip: float | None = 0.5
    """PPO value clipping range around the old values (None = off)."""
    mem_reward: MemPOConfig = field(default_factory=MemPOConfig)
    """MemPO's memory reward (credit ``mempo``): :class:`memkit.rl.rules.MemPOConfig`, flags ``--mem-reward-*``."""
    dcpo: DCPOConfig = field(default_factory=DCPOConfig)
    """MemAct's DCPO (credit ``dcpo``): :class:`memkit.rl.rules.DCPOConfig`, flags ``--dcpo-*``."""
    mot: MoTConfig = field(default_factory=MoTConfig)
    """Mem-T's MoT-GRPO (credit ``mot``): :class:`memkit.rl.rules.MoTConfig`, flags ``--mot-*``."""

    # ---- evaluation, logging, checkpoints --------------------------------------------------
    eval_every: int = 10
    """Greedy evaluation on held-out tasks every N steps (0 = never); also after the last step."""
    eval_at_start: bool = True
    """Also evaluate before the first step (the step-0 point of learning curves)."""
    eval_tasks: int = 32
    """Held-out tasks per objective count (``memkit.world.held_out_tasks(world, eval_tasks, k, eval_seed)``)."""
    eval_seed: int = 1000
    """Seed base of those tasks. 1000 = ``evaluation.evaluate``'s default test tasks (the first
    ``eval_tasks`` of them: a smaller n gives a prefix of the same list). To keep a *validation*
    set apart from the tasks a final table reports, give it another base (notebook 03 uses 3000:
    other compositions of the same held-out test questions).
    Must lie in ``memkit.world.EVAL_SEEDS`` (1000-9999), which training tasks never use."""
    eval_objectives: tuple[int, ...] = (2,)
    """Objective counts evaluated."""
    save_every: int = 10
    """Checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted after a new one is complete)."""
    out_dir: str = "runs/train"
    """Run directory: metrics.jsonl, metrics.csv, eval.jsonl, checkpoints/."""

    # ---- reproducibility / hardware ------------------------------------------------------
    seed: int = 0
    """Seeds model init (tiny), task sampling and rollouts (each step re-seeds from (seed, step, rank))."""
    world_seed: int = 0
    """Synthetic world used for tasks when no kit is given."""
    device: str = field(default="auto", metadata={"choices": DEVICES})
    """``auto`` (GPU if available), ``cpu`` or ``cuda``; multi-GPU via ``accelerate launch``/``torchrun``."""
    mixed_precision: str = field(default="no", metadata={"choices": PRECISIONS})
    """``no`` | ``bf16`` | ``fp16`` (accelerate autocast; bf16 on GPUs)."""

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
        if self.recompute_old_logprobs is None:
            return self.resolved_packing() == "mem1_mask" or self.mixed_precision != "no"
        return bool(self.recompute_old_logprobs)

    def validate(self) -> "TrainConfig":
        from memkit.agents import get_method

        def bad(name, why):
            raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r}: {why}")

        for name, f, value in _choice_fields(self):  # every field that declares choices (the CLI's flags offer them)
            if value not in f.metadata["choices"]:
                raise ValueError(f"TrainConfig.{name}={value!r}: choose one of {', '.join(map(str, f.metadata['choices']))}"
                                 + (f" ({f.metadata['hint']})" if "hint" in f.metadata else ""))
        try:
            get_method(self.method, **self.method_kwargs)
        except (TypeError, ValueError) as e:  # an unknown keyword or a bad value, named by the method
            bad("method_kwargs", f"{e} (see memkit.agents.{self.method})")
        for name in ("steps", "tasks_per_step", "n_samples", "ppo_epochs", "mini_batches", "micro_batch_size",
                     "row_groups", "n_train_tasks", "keep_checkpoints"):
            if int(getattr(self, name)) < 1:
                bad(name, "must be >= 1")
        if self.mot.pivots < 1:
            raise ValueError(f"TrainConfig.mot.pivots={self.mot.pivots!r}: must be >= 1 (N_v pivot nodes per tree and round)")
        if self.eval_seed not in EVAL_SEEDS or self.eval_seed + max(self.eval_objectives, default=0) not in EVAL_SEEDS:
            bad("eval_seed", f"evaluation seeds live in [{EVAL_SEEDS.start}, {EVAL_SEEDS.stop}) (training tasks use "
                             "the others, memkit.world.training_seed); e.g. 1000 (test) or 3000 (validation)")
        for name in ("eval_every", "save_every", "eval_tasks", "warmup_steps"):
            if int(getattr(self, name)) < 0:
                bad(name, "must be >= 0 (0 turns it off)")
        if not self.objectives or min(self.objectives) < 1:
            bad("objectives", "give question counts >= 1, e.g. (2,)")
        if self.max_seconds is not None and self.max_seconds <= 0:
            bad("max_seconds", "must be > 0, or None for no wall-clock budget")
        if self.lr <= 0 or self.critic_lr <= 0:
            bad("lr", "learning rates must be > 0")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            bad("kl_coef", "kl_coef and entropy_coef must be >= 0")
        if not 0 < self.clip_low < 1 or (self.clip_high is not None and self.clip_high <= 0):
            bad("clip_low", "clip ranges must be in (0, 1), e.g. 0.2")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            bad("clip_ratio_c", "the dual-clip bound must be > 1 (e.g. 3.0) or None")
        if self.temperature <= 0:
            bad("temperature", "training rollouts must sample (temperature > 0, usually 1.0)")
        if self.attention == "flex":
            import torch

            if self.device == "cpu" or not torch.cuda.is_available():
                bad("attention", "flex_attention has no backward on CPU; use auto or blocks")
        if self.mot.rounds < 0:
            raise ValueError(f"TrainConfig.mot.rounds={self.mot.rounds!r}: must be >= 0 (0: each tree is its seed chain only)")
        if self.dcpo.segments < 0:
            raise ValueError(f"TrainConfig.dcpo.segments={self.dcpo.segments!r}: give N_seg >= 1 segments per prompt, "
                             "or 0 for every segment once")
        # last: the registry loads the rules (and torch), so every other bad value is named without it
        from memkit.rl.credit import CREDIT_RULES

        if self.credit != "auto" and self.credit not in CREDIT_RULES:
            bad("credit", f"choose auto or one of {sorted(CREDIT_RULES)}")
        rule = CREDIT_RULES[self.resolved_credit()]
        if rule.needs_values != (ALGO_CREDIT[self.algo] == "gae"):
            bad("credit", f"rule {rule.name!r} {'needs' if rule.needs_values else 'trains without'} a critic, "
                          f"which algo={self.algo!r} {'does not train' if rule.needs_values else 'trains'}: pick a "
                          "critic-free rule with grpo, gae with ppo, or credit='auto'")
        if rule.needs_groups and self.n_samples < 2:
            bad("n_samples", f"credit rule {rule.name!r} normalises within a group of samples per task: set "
                             "n_samples >= 2 (e.g. 4), or use algo='ppo' (gae)")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config of ``to_dict`` (a checkpoint's ``memkit.json``); the flat rule knobs of older
        checkpoints (``mem_reward_bias``, ``dcpo_segments``, ``mot_alpha``, ...) fold into their rule's config."""
        d = dict(d)
        for name, rule in _RULES.items():
            nested = dict(d.get(name) or {})
            for key in [k for k in d if k.startswith(name + "_")]:
                nested[key[len(name) + 1:]] = d.pop(key)
            if nested or name in d:
                known = {f.name for f in fields(rule)}
                if set(nested) - known:
                    raise ValueError(f"unknown {rule.__name__} fields {sorted(set(nested) - known)}; valid: {sorted(known)}")
                d[name] = rule(**nested)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; valid fields: {sorted(names)}")
        for key in ("objectives", "eval_objectives"):
            if key in d and d[key] is not None:
                d[key] = tuple(d[key])
        return cls(**d)


#: the nested rule configs: field name (= the flags' prefix) -> dataclass
_RULES = {"mem_reward": MemPOConfig, "dcpo": DCPOConfig, "mot": MoTConfig}


def _choice_fields(cfg):
    """``(dotted name, field, value)`` of every field with ``choices``, the nested rule configs' too."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in _RULES:
            yield from ((f"{f.name}.{n}", g, v) for n, g, v in _choice_fields(value))
        elif "choices" in f.metadata:
            yield f.name, f, value


#: fields that must match for ``--resume`` to continue a run (others may change, e.g. steps); the
#: resolved credit rule must match too (a checkpoint from before ``credit`` existed reads as ``auto``)
RESUME_KEYS = ("algo", "method", "method_kwargs", "init", "packing", "lora", "lora_r", "lora_alpha", "seed", "world_seed")

__all__ = ["TrainConfig", "ALGOS", "RESUME_KEYS"]
