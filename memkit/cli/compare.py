"""``memkit compare``: RL runs of different memory formats on the same held-out tasks, with their budgets.

    memkit train --method mem1 --out runs/mem1-s0 ...; memkit train --method memsearcher --out runs/ms-s0 ...
    memkit compare runs/mem1-s0 runs/mem1-s1 runs/ms-s0 runs/ms-s1 --objectives 1,2,4 --figure figures/h2h.png
    memkit compare sft/mem1 sft/react --tasks offline --corpus offline --objectives 1,2 --n-tasks 10  # SFT only

A ``memkit sft --out`` checkpoint is a row too (budget: its SFT minutes, no rollout tokens), and
``--tasks --corpus`` score every run on held-out composites of real questions (:mod:`memkit.lab.real`).

Per method (mean +- std over its runs): training minutes and rollout tokens (the budget each run spent,
from its metrics.jsonl), EM and peak tokens at each k; the Pareto figure at the largest k
(:mod:`memkit.lab.compare`).
"""

from __future__ import annotations

import json

from memkit.cli.args import ints
from memkit.cli.rollout import add_real_data, data_config

HELP = "RL runs of different memory formats side by side: budgets, EM and peak tokens by k, a Pareto figure"


def add_arguments(sp) -> None:
    sp.description = __doc__.splitlines()[0]
    sp.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="`memkit train --out` directories (one per method and seed) or `memkit sft --out` checkpoints",
    )
    sp.add_argument("--objectives", type=ints, default=ints("1,2,4"), help="comma-separated k values (default 1,2,4)")
    sp.add_argument("--n-tasks", type=int, default=50, help="held-out tasks per objective count (default 50)")
    sp.add_argument("--seed", type=int, default=1000, help="seed of the held-out tasks (default 1000)")
    sp.add_argument("--figure", default=None, metavar="PNG", help="write EM vs peak tokens at the largest k here")
    sp.add_argument("--json", action="store_true", help="print one JSON row per run instead of the table")
    sp.add_argument(
        "--min-new-tokens", type=int, default=None,
        help="output tokens a call may write (default: the format's budget for tiny models, 512 for a chat model)",
    )  # fmt: skip
    add_real_data(sp)


def run(args) -> int:
    from memkit.lab.compare import compare_runs, format_compare, plot_pareto
    from memkit.lab.kit import load_kit
    from memkit.lab.real import data_kit

    data = data_config(args)  # --world-seed: the synthetic world the runs trained on, unless --tasks / --corpus
    kit = data_kit(load_kit(data.world_seed), data)
    kw = {} if args.min_new_tokens is None else {"min_new_tokens": args.min_new_tokens}
    rows = compare_runs(args.runs, kit, args.objectives, args.n_tasks, args.seed, **kw)
    print("\n".join(json.dumps(r) for r in rows) if args.json else format_compare(rows, args.objectives))
    if args.figure:
        print(f"figure: {plot_pareto(rows, max(args.objectives), args.figure)}")
    return 0
