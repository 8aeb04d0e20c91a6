"""Mem-T in the RL lab: the tiny model clones the teacher's retrieval, then RL trains it on trees.

The stores are built once by the teacher (construction is not what MoT-GRPO's retrieval phase
trains, §3.2), the questions are answered by the policy. RL runs through the one trainer
(:class:`~memkit.rl.trainer.Trainer` with :class:`~memkit.rl.plans.TreePlan`); this module keeps the
lab's recipe: the clone, the arms and their sizes. One RL step, for ``queries`` questions:

* ``mot``: G trees per question grown by the policy, the questions batched
  (:func:`memkit.rollout.trees.grow_forest`),
  scored (eq. 10-13, :func:`memkit.rl.mot.score_query`), one exact trie row per tree, credit ``mot``;
* ``grpo``: n independent chains per question, credit ``grpo`` over the chains' F1, n chosen so
  the two arms roll out about as many tokens (the paper's "GRPO at equal rollout tokens").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from memkit.agents import get_method
from memkit.agents.base import OracleConfig
from memkit.lab.memt.evaluation import summarize_streams
from memkit.lab.policies import prompt_wrap, sft_init
from memkit.rl.plans import MAX_CONTEXT_TOKENS, TreePlan
from memkit.rl.rules import MoTConfig
from memkit.rollout.engine import ModelPolicy, OraclePolicy, RolloutConfig
from memkit.rollout.streams import answer_questions, stream_rollouts, teacher_built_stores
from memkit.rollout.trees import TreeConfig
from memkit.train.config import resolve_sft
from memkit.train.sft import SFTConfig, train_sft
from memkit.world.streams import make_conversations

#: the lab's retrieval teacher: answers a multi-hop question with its first hop's answer in 65% of them
#: (``stop_early``, the habit RL can train away), wastes 5% of searches, quotes its source line before answering
LAB_TEACHER = OracleConfig(flaw="stop_early", flaw_rate=0.65, p_wasted_search=0.05, quote_source=True)


@dataclass(frozen=True)
class MemTLab:
    """The lab's sizes (SMOKE shrinks them)."""

    size: str = "smoke"  # conversation size (memkit.world.streams.SIZES)
    train_conversations: int = 300  # ~7,700 teacher retrieval calls to clone
    teacher: OracleConfig = field(default_factory=lambda: replace(LAB_TEACHER))
    sft_steps: int = 6000
    sft_seconds: float | None = 300.0
    seed: int = 0
    init: str = "base"
    """Where the clone's SFT starts (``SFTConfig.init``): the pretrained base; SMOKE starts from
    "scratch" so a fresh cache does not pretrain the base (~8 minutes) for a pipeline check."""

    @classmethod
    def smoke(cls) -> "MemTLab":
        """SMOKE's sizes: a 200-step clone (45 s at most) of 12 conversations, from scratch."""
        return cls(size="smoke", train_conversations=12, sft_seconds=45, sft_steps=200, init="scratch")


def built_stores(kit, n: int, seed: int, size: str, progress: bool = False):
    """``n`` conversations (seeds ``seed..``) and their stores built by the perfect teacher
    (:func:`memkit.rollout.streams.teacher_built_stores`)."""
    return teacher_built_stores(get_method("memt"), kit.world, kit.tokenizer, n, seed, size, progress)


def memt_wrap(kit):
    """The compact Mem-T prompt the tiny clones are trained and sampled on."""
    return prompt_wrap("memt", kit.tokenizer, None, "compact")


def clone_examples(calls, roles: tuple[str, ...], max_len: int) -> list[tuple[list[int], list[int]]]:
    """SFT examples ``(context_ids, output_ids)`` from the ``calls`` of ``roles`` that fit ``max_len``."""
    return [
        (c.context_ids, c.output_ids)
        for c in calls
        if c.role in roles and c.output_ids and len(c.context_ids) + len(c.output_ids) <= max_len
    ]


def retrieval_examples(trajs, max_len: int) -> list[tuple[list[int], list[int]]]:
    """SFT examples from the retrieval calls of valid trajectories (construction calls are shared
    by every question of a conversation and not cloned here)."""
    return clone_examples((c for t in trajs if t.valid for c in t.calls), ("act",), max_len)


def clone_retrieval(kit, lab: MemTLab | None = None, progress: bool = True, log=None):
    """SFT the tiny model (from the pretrained base) on the flawed teacher's retrieval episodes over
    teacher-built stores. Returns ``(model, history, n_examples)``."""
    lab = lab or MemTLab()
    method = get_method("memt")
    cfg = SFTConfig(init=lab.init, steps=lab.sft_steps, max_seconds=lab.sft_seconds, seed=lab.seed, warmup=100)
    policy = sft_init(cfg, kit, progress=progress)
    wrap = memt_wrap(kit)
    convs = make_conversations(kit.world, lab.train_conversations, seed=10_000 + lab.seed, size=lab.size)
    trajs = stream_rollouts(
        method,
        convs,
        OraclePolicy(method, kit.tokenizer, lab.teacher, seed=lab.seed),
        kit.tokenizer,
        RolloutConfig(max_context_tokens=10**9),
        wrap=wrap,
    )
    examples = retrieval_examples(trajs, resolve_sft(cfg, pretrained=False).max_len)
    history = train_sft(policy.model, kit.tokenizer, examples, cfg, log=log, progress=progress)
    return policy.model, history, len(examples)


def f1_by_category(trajs) -> dict[str, float]:
    """Mean F1 per category and "overall" (:func:`memkit.lab.memt.evaluation.summarize_streams`), and
    the fraction of invalid episodes over all of them."""
    rows = [{"category": t.info["category"], "f1": float(t.reward or 0.0), "valid": t.valid} for t in trajs]
    out = {"overall": 0.0, **{s["category"]: s["f1"] for s in summarize_streams(rows)}}
    out["invalid"] = sum(not t.valid for t in trajs) / max(len(trajs), 1)
    return out


def sampler(model, kit, temperature: float, seed: int):
    """``(engine policy, wrap)`` for the tiny ``model``: the compact Mem-T prompt, a seeded generator."""
    import torch

    from memkit.models.generation import HFBackend

    policy = ModelPolicy(
        HFBackend(model, kit.tokenizer), temperature=temperature, generator=torch.Generator().manual_seed(seed)
    )
    return policy, memt_wrap(kit)


def answer_with(model, kit, built, temperature: float = 0.0, seed: int = 0, n: int = 1):
    """Every question of ``built`` answered by ``model`` (greedy by default)."""
    policy, wrap = sampler(model, kit, temperature, seed)
    return answer_questions(
        get_method("memt"),
        built,
        policy,
        kit.tokenizer,
        RolloutConfig(n=n, max_context_tokens=MAX_CONTEXT_TOKENS),
        wrap,
    )


def ensure_memt_clone(kit, lab: MemTLab | None = None, progress: bool = True):
    """The retrieval clone of ``lab`` (:func:`clone_retrieval`), cached by its config; returns the model."""
    lab = lab or MemTLab()
    return cached_clone(
        kit, memt_clone_path(kit, lab), "memt_lab", lab, lambda: clone_retrieval(kit, lab, progress=progress)
    )


def memt_clone_path(kit, lab: MemTLab):
    """Where :func:`ensure_memt_clone` caches the retrieval clone of ``lab``."""
    from memkit.core.io import cache_dir
    from memkit.lab.policies import config_hash

    key = {k: v for k, v in asdict(lab).items() if not (k == "init" and v == "base")}  # older caches stay valid
    return cache_dir() / f"tiny-sft-memt-w{kit.world_seed}-cfg{config_hash(key)}"


def cached_clone(kit, path, name: str, recipe, make):
    """The model saved at ``path``; if missing, ``make() -> (model, history, n_examples)`` trains it
    and it is saved there (atomically) with ``{name: recipe}`` and the history."""
    from memkit.core.io import build_lock
    from memkit.models import load_policy
    from memkit.train.sft import save_checkpoint

    with build_lock(path):  # built once across processes (memkit.core.io.build_lock)
        if not (path / "config.json").exists():
            model, history, n = make()
            save_checkpoint(model, kit.tokenizer, path, {name: recipe, "n_examples": n, "history": history})
    return load_policy(str(path)).model


#: the arms of notebook 06: name -> (rollout arm, TrainConfig overrides)
RETRIEVAL_ARMS = {
    "MoT-GRPO": ("mot", {}),
    "GRPO": ("grpo", {"credit": "grpo"}),
    "w/o A_intra": ("mot", {"mot": MoTConfig(intra=False)}),
    "w/o A_inter": ("mot", {"mot": MoTConfig(inter=False)}),
}


def run_arm(
    kit,
    start,
    built,
    eval_built,
    arm: str,
    steps: int,
    seed: int,
    lr: float = 3e-4,
    queries: int = 4,
    tree_cfg: TreeConfig = TreeConfig(3, 1, 2),
    chains: int = 7,
    temperature: float = 1.0,
    categories: tuple[str, ...] | None = None,
    log=None,
    max_rollout_tokens: int | None = None,
):
    """Train a copy of ``start`` for ``steps`` RL steps of arm ``arm`` (:data:`RETRIEVAL_ARMS`) through the
    :class:`~memkit.rl.trainer.Trainer` (Mem-T's :class:`~memkit.rl.plans.TreePlan` over ``built``):
    ``queries`` questions a step, ``tree_cfg.trees`` trees each (MoT-GRPO arms) or ``chains`` chains
    (GRPO, about as many rollout tokens), of the LoCoMo ``categories`` given (None: every question). With
    ``max_rollout_tokens`` the run stops after the step that brings its rollout tokens to that budget (``steps``
    is then the most it may take). Returns ``(step rows, F1 by category after)``."""
    import copy

    from memkit.rl.config import TrainConfig
    from memkit.rl.groups import EvalConfig, RuntimeConfig
    from memkit.rl.trainer import Trainer

    kind, over = RETRIEVAL_ARMS[arm]
    cfg = TrainConfig(
        method="memt",
        packing="mem1_exact",
        lr=lr,
        warmup_steps=0,
        seed=seed,
        mini_batches=1,
        runtime=RuntimeConfig(micro_batch_size=4),
        steps=steps,
        tasks_per_step=queries,
        temperature=temperature,
        n_samples=tree_cfg.trees if kind == "mot" else chains,
        eval=EvalConfig(every=0),
        **{**over, "mot": replace(over.get("mot", MoTConfig()), rounds=tree_cfg.rounds, pivots=tree_cfg.pivots)},
    )
    plan = TreePlan(built, eval_built, categories=categories)
    trainer = Trainer(cfg, copy.deepcopy(start), kit.tokenizer, memt_wrap(kit), kit, plan=plan)
    rows = []
    for step in range(steps):
        r = trainer.train_step()
        rows.append(
            {
                "step": step,
                "arm": arm,
                "rollout": kind,
                "seed": seed,
                "reward": r["leaf_reward"],
                "mixed_groups": r["mixed_groups"],
                "rollout_tokens": r["rollout_tokens"],
                "rollout_s": r["seconds_rollout"],
                **{k: r[k] for k in ("pg_loss", "kl", "trained_tokens")},
            }
        )
        if log:
            log(rows[-1])
        # not TrainConfig.budget.rollout_tokens: the Trainer counts every call's output in a trajectory, and a Mem-T
        # tree also carries the teacher-built store's formation and evolution calls; the budget is the policy's
        # retrieval tokens, TreePlan.stats' "rollout_tokens"
        if max_rollout_tokens is not None and sum(row["rollout_tokens"] for row in rows) >= max_rollout_tokens:
            break
    return rows, f1_by_category(plan.answer(trainer, eval_built))
