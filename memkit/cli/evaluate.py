"""``memkit eval``: evaluate methods at several objective counts and print the table."""

from __future__ import annotations

import argparse
from pathlib import Path

from memkit.cli.args import json_object, methods, positive
from memkit.cli.rollout import add_context_options, add_policy, add_real_data, data_config, kit_and_tasks, placed_policy
from memkit.cli.world import add_common

HELP = "evaluate methods at several objective counts and print the table"


def add_arguments(sp) -> None:
    from memkit.agents import ALL_METHODS, METHODS
    from memkit.world.streams import SIZES

    add_common(sp, objectives="1,2,4,8", world_seed=False)
    sp.add_argument(
        "--method",
        type=methods,
        default=list(METHODS),
        help="comma-separated (default: the papers' formats): " + ", ".join(ALL_METHODS),
    )
    sp.add_argument(
        "--method-kwargs",
        type=json_object,
        default={},
        metavar="JSON",
        help='keyword arguments of the format, as the model was cloned with, e.g. mem1 {"answers": "each"}',
    )
    add_policy(sp)
    sp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    sp.add_argument("--out-dir", default=None, help="write JSONL traces here")
    add_context_options(sp)
    add_real_data(sp)
    streams = sp.add_argument_group("conversation streams (--method memt)")
    streams.add_argument(
        "--streams",
        choices=sorted(SIZES),
        default="smoke",
        help="size of the synthetic conversations (full: ~20 sessions, ~300 turns, like LoCoMo)",
    )
    streams.add_argument("--n-conversations", type=positive, default=4, help="synthetic conversations to evaluate on")
    streams.add_argument(
        "--locomo", default=None, help="a LoCoMo JSON file (data/locomo10.json) instead of synthetic ones"
    )
    sp.add_argument("--n", action=NotAnEvalFlag, help=argparse.SUPPRESS)


class NotAnEvalFlag(argparse.Action):
    """``memkit eval --n``: rollout's and train's ``--n`` is a group size, which eval has not; the
    error names the two counts eval has, instead of argparse's "ambiguous option"."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            "--n is not an eval flag: --n-tasks N sets the tasks per objective count, "
            "--n-conversations N the Mem-T conversations (--method memt)"
        )


def run_streams(args, kit) -> None:
    """``--method memt``: build memories, answer every question, print the per-category table."""
    from memkit.lab.memt.evaluation import evaluate_streams, format_stream_table
    from memkit.world.locomo import load_locomo
    from memkit.world.streams import make_conversations

    convs = (
        load_locomo(args.locomo)
        if args.locomo
        else make_conversations(kit.world, args.n_conversations, seed=1000 + args.seed, size=args.streams)
    )
    if not any(c.qa for c in convs):
        raise ValueError(f"{args.locomo or 'the synthetic streams'} hold no questions to answer")
    summary, _, trajs = evaluate_streams(
        kit,
        convs,
        policy=args.policy,
        temperature=args.temperature,
        seed=args.seed,
        method_kwargs={"retriever": args.retriever},
    )
    where = args.locomo or f"{len(convs)} synthetic {args.streams} conversations"
    print(f"memt on {where}: {len(trajs)} questions, {summary[0]['wall_seconds']:.1f} s")
    print(format_stream_table(summary))
    if args.out_dir:
        from memkit.core.trajectory import save_jsonl

        save_jsonl(trajs, Path(args.out_dir) / f"memt-{args.policy.replace('/', '_')}.jsonl")


def run(args) -> int:
    from memkit.core.trajectory import save_jsonl
    from memkit.lab.evaluation import evaluate
    from memkit.lab.kit import load_kit
    from memkit.metrics.qa import format_table

    data = data_config(args)  # a bad combination is named before the world loads
    kit, own = kit_and_tasks(args, load_kit(args.world_seed, retriever=args.retriever), data)
    sets = None if own is None else {k: [t for t in own if t.k == k] for k in args.objectives}  # the file's, per k
    rows = []
    for method in args.method:
        if method == "memt":
            run_streams(args, kit)
            continue
        results = evaluate(
            method,
            kit,
            objectives=args.objectives,
            n_tasks=args.n_tasks,
            policy=placed_policy(args, method, kit),
            temperature=args.temperature,
            prompt=args.prompt,
            k_docs=args.k_docs,
            min_new_tokens=args.min_new_tokens,
            task_sets=sets,
            method_kwargs=args.method_kwargs,
        )
        for k, (summary, trajs) in results.items():
            rows.append({"method": method, "k": k, **summary})
            if args.out_dir:
                save_jsonl(trajs, Path(args.out_dir) / f"{method}-{args.policy.replace('/', '_')}-k{k}.jsonl")
    if rows:
        print(format_table(rows))
    if args.out_dir:
        print(f"traces written to {args.out_dir}/")
    return 0
