"""``memkit world``: write the synthetic corpus and tasks as JSONL."""

from __future__ import annotations

from pathlib import Path

from memkit.cli.args import ints

HELP = "write the synthetic corpus and tasks as JSONL"


def add_arguments(sp) -> None:
    from memkit.world.splits import SPLITS, TRAIN

    add_common(sp)
    sp.add_argument("--out", default="world", help="output directory")
    sp.add_argument(
        "--split",
        choices=("all", *SPLITS, TRAIN),
        default="all",
        help="questions the tasks draw (memkit.world.question_split): sft = behaviour cloning's, "
        "rl = RL's, train = both, test = the held-out ones no training task asks",
    )


def add_common(sp, objectives: str = "2", world_seed: bool = True) -> None:
    """``--world-seed --seed --objectives --n-tasks`` of world, rollout and eval (``world_seed=False``: the
    command takes ``--world-seed`` from its data flags, :func:`memkit.cli.rollout.add_real_data`)."""
    if world_seed:
        sp.add_argument("--world-seed", type=int, default=0, help="seed of the synthetic world")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--objectives", type=ints, default=ints(objectives), help="comma-separated k values, e.g. 1,2,4,8")
    sp.add_argument("--n-tasks", type=int, default=50, help="tasks per objective count")


def run(args) -> int:
    from memkit.world import make_tasks, make_world, save_corpus_jsonl, save_tasks_jsonl

    world = make_world(seed=args.seed)
    out = Path(args.out)
    save_corpus_jsonl(world, out / "corpus.jsonl")
    tasks = [
        t
        for k in args.objectives
        for t in make_tasks(
            world, n=args.n_tasks, k=k, seed=args.seed + k, split=None if args.split == "all" else args.split
        )
    ]
    save_tasks_jsonl(tasks, out / "tasks.jsonl")
    print(
        f"wrote {len(world.passages)} passages to {out / 'corpus.jsonl'} and {len(tasks)} tasks to {out / 'tasks.jsonl'}"
    )
    return 0
