"""The task sets of a world: training tasks (SFT, RL) and held-out evaluation tasks.

Held-out tasks ask test questions only (:func:`~memkit.world.splits.question_split`) and use the
seeds of :data:`EVAL_SEEDS`; training tasks ask sft or rl questions and never use those seeds.
"""

from __future__ import annotations

from memkit.world.generator import make_tasks
from memkit.world.splits import TRAINING_SPLITS

DEFAULT_KINDS = ("1hop", "bridge", "comparison")

#: Task seeds reserved for evaluation: :func:`held_out_tasks` (1000 + k, or 1000 + seed + k in the
#: notebooks) and validation sets (``TrainConfig.eval.seed``). Training never uses them.
EVAL_SEEDS = range(1000, 10_000)


def training_seed(seed: int, k: int) -> int:
    """The task seed of training run ``seed`` at ``k`` questions: ``100 seed + k``, moved past
    :data:`EVAL_SEEDS` when it lands there (seed >= 10), so no seed trains on held-out tasks.
    Seeds 0-9 keep their values, which the cached SFT models were trained on."""
    base = seed * 100 + k
    return base + 10_000 if base in EVAL_SEEDS else base


def training_tasks(world, objectives, n_tasks: int, seed: int, kinds=DEFAULT_KINDS, split: str = "sft"):
    """Training tasks of question ``split`` ("sft" for behaviour cloning, "rl" for RL, never
    "test"), ``n_tasks`` split evenly over ``objectives``, composed with :func:`training_seed`."""
    if split not in TRAINING_SPLITS:
        raise ValueError(f"training tasks never draw test questions (split={split!r}); use one of {TRAINING_SPLITS}")
    per_k = max(1, n_tasks // len(objectives))
    return [
        t
        for k in objectives
        for t in make_tasks(world, n=per_k, k=k, seed=training_seed(seed, k), kinds=kinds, split=split)
    ]


def held_out_tasks(world, n: int, k: int, seed: int = 1000, kinds=DEFAULT_KINDS):
    """The held-out ``k``-question tasks of seed base ``seed`` (in :data:`EVAL_SEEDS`): test
    questions only, composed with seed ``seed + k``. A smaller ``n`` gives a prefix of the same
    list. ``memkit eval``, the trainer's periodic evaluation and the headroom measurement draw these."""
    return make_tasks(world, n=n, k=k, seed=seed + k, kinds=kinds, split="test")
