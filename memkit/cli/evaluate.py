"""``memkit eval``: evaluate methods at several objective counts and print the table."""
from __future__ import annotations

from pathlib import Path

from memkit.cli.args import methods
from memkit.cli.rollout import add_context_options, add_policy
from memkit.cli.world import add_common


def add_parser(sub) -> None:
    from memkit.agents import METHODS

    sp = sub.add_parser("eval", help="evaluate methods at several objective counts and print the table")
    add_common(sp, objectives="1,2,4,8")
    sp.add_argument("--method", type=methods, default=list(METHODS), help="comma-separated: " + ", ".join(METHODS))
    add_policy(sp)
    sp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    sp.add_argument("--retriever", default="bm25", help="bm25 or dense")
    sp.add_argument("--out-dir", default=None, help="write JSONL traces here")
    add_context_options(sp)
    sp.set_defaults(func=run)


def run(args) -> int:
    from memkit.evaluation import evaluate
    from memkit.kit import load_kit
    from memkit.metrics import format_table
    from memkit.trajectory import save_jsonl

    kit = load_kit(args.world_seed, retriever=args.retriever)
    rows = []
    for method in args.method:
        results = evaluate(method, kit, objectives=args.objectives, n_tasks=args.n_tasks, policy=args.policy,
                           temperature=args.temperature, prompt=args.prompt, k_docs=args.k_docs)
        for k, (summary, trajs) in results.items():
            rows.append({"method": method, "k": k, **summary})
            if args.out_dir:
                save_jsonl(trajs, Path(args.out_dir) / f"{method}-{args.policy.replace('/', '_')}-k{k}.jsonl")
    print(format_table(rows))
    if args.out_dir:
        print(f"traces written to {args.out_dir}/")
    return 0
