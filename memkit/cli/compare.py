"""``memkit compare``: RL runs of different memory formats on the same held-out tasks, with their budgets.

    memkit train --method mem1 --out runs/mem1-s0 ...; memkit train --method memsearcher --out runs/ms-s0 ...
    memkit compare runs/mem1-s0 runs/mem1-s1 runs/ms-s0 runs/ms-s1 --objectives 1,2,4 --figure figures/h2h.png

Per method (mean +- std over its runs): training minutes and rollout tokens (the budget each run spent,
from its metrics.jsonl), EM and peak tokens at each k; the Pareto figure at the largest k
(:mod:`memkit.lab.compare`).
"""

from __future__ import annotations

import json

from memkit.cli.args import ints

HELP = "RL runs of different memory formats side by side: budgets, EM and peak tokens by k, a Pareto figure"


def add_arguments(sp) -> None:
    sp.description = __doc__.splitlines()[0]
    sp.add_argument("runs", nargs="+", metavar="RUN", help="`memkit train --out` directories (one per method and seed)")
    sp.add_argument("--objectives", type=ints, default=ints("1,2,4"), help="comma-separated k values (default 1,2,4)")
    sp.add_argument("--n-tasks", type=int, default=50, help="held-out tasks per objective count (default 50)")
    sp.add_argument("--seed", type=int, default=1000, help="seed of the held-out tasks (default 1000)")
    sp.add_argument("--world-seed", type=int, default=0, help="seed of the synthetic world the runs trained on")
    sp.add_argument("--figure", default=None, metavar="PNG", help="write EM vs peak tokens at the largest k here")
    sp.add_argument("--json", action="store_true", help="print one JSON row per run instead of the table")


def run(args) -> int:
    from memkit.lab.compare import compare_runs, format_compare, plot_pareto
    from memkit.lab.kit import load_kit

    rows = compare_runs(args.runs, load_kit(args.world_seed), args.objectives, args.n_tasks, args.seed)
    print("\n".join(json.dumps(r) for r in rows) if args.json else format_compare(rows, args.objectives))
    if args.figure:
        print(f"figure: {plot_pareto(rows, max(args.objectives), args.figure)}")
    return 0
