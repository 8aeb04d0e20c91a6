"""``memkit`` command line: world, rollout, sft, eval, train, reproduce.

Every bad input (unknown method, model, missing file) ends with one line naming the fix and
exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"objective counts must be >= 1, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number like 3, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _methods(text: str) -> list[str]:
    from memkit.agents import METHODS

    names = [m.strip() for m in text.split(",") if m.strip()]
    for name in names:
        if name not in METHODS:
            raise argparse.ArgumentTypeError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return names


def cmd_world(args) -> int:
    from memkit.world import make_tasks, make_world, save_corpus_jsonl, save_tasks_jsonl

    world = make_world(seed=args.seed)
    out = Path(args.out)
    save_corpus_jsonl(world, out / "corpus.jsonl")
    tasks = [t for k in args.objectives for t in make_tasks(world, n=args.n_tasks, k=k, seed=args.seed + k,
                                                                  split=None if args.split == "all" else args.split)]
    save_tasks_jsonl(tasks, out / "tasks.jsonl")
    print(f"wrote {len(world.passages)} passages to {out / 'corpus.jsonl'} and {len(tasks)} tasks to {out / 'tasks.jsonl'}")
    return 0


def cmd_rollout(args) -> int:
    from memkit.pipeline import load_kit, rollout
    from memkit.rollout.trajectory import save_jsonl
    from memkit.world import load_tasks_jsonl, make_tasks

    kit = load_kit(args.world_seed, retriever=args.retriever)
    tasks = load_tasks_jsonl(args.tasks) if args.tasks else make_tasks(kit.world, n=args.n_tasks, k=args.objectives[0], seed=args.seed)
    trajs = rollout(args.method, tasks, kit, policy=args.policy, n=args.n, temperature=args.temperature, seed=args.seed,
                    progress=True, prompt=args.prompt, k_docs=args.k_docs)
    save_jsonl(trajs, args.out)
    ok = sum(t.valid for t in trajs)
    print(f"wrote {len(trajs)} trajectories ({ok} valid) to {args.out}")
    return 0


def cmd_eval(args) -> int:
    from memkit.metrics import format_table
    from memkit.pipeline import evaluate, load_kit
    from memkit.rollout.trajectory import save_jsonl

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


def cmd_sft(args) -> int:
    from memkit.cpu import busy_cpu_note
    from memkit.pipeline import evaluate, load_kit, sft_checkpoint_path, sft_tag, train_sft_model
    from memkit.sft import SFTConfig, budget_note

    cfg = SFTConfig(method=args.method, steps=args.steps, n_tasks=args.n_tasks, objectives=tuple(args.objectives),
                    seed=args.seed, max_seconds=60 * args.max_minutes if args.max_minutes else None)
    if args.show_comparison:
        cfg.oracle = replace(cfg.oracle, show_comparison=True)
    tag = args.tag or sft_tag(cfg)
    if not all(c.isalnum() or c in "-_." for c in tag):
        raise ValueError(f"--tag {tag!r}: use letters, digits, '-', '_' or '.' (it becomes part of a directory name)")
    kit = load_kit(args.world_seed)
    note = busy_cpu_note() if cfg.max_seconds else None
    if note:
        print(note, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    path, history, n_ex = train_sft_model(args.method, kit, cfg, log=lambda r: print(
        f"step {r['step']:5d}  loss {r['loss']:.4f}  lr {r['lr']:.2e}  {r['seconds']:.0f}s  attention {r['attention']}", flush=True),
        path=sft_checkpoint_path(args.method, args.world_seed, tag))
    spec = "tiny-sft" if tag == "default" else f"tiny-sft:{tag}"
    print(f"trained on {n_ex} calls in {time.perf_counter() - t0:.0f}s; checkpoint: {path}\n"
          f"use it as --policy {spec} (memkit eval / rollout) or --init {spec} (memkit train)")
    note = budget_note(history, cfg, time.perf_counter() - t0, args.method)
    if note:
        print(note, file=sys.stderr, flush=True)
    if args.eval_tasks:
        results = evaluate(args.method, kit, objectives=args.eval_objectives, n_tasks=args.eval_tasks, policy=spec)
        for k, (summary, _) in results.items():
            kinds = ", ".join(f"{c[3:]} {v:.2f}" for c, v in summary.items() if c.startswith("em_"))
            print(f"{spec} {args.method} k={k}: EM per question {summary['em']:.3f} ({kinds})  F1 {summary['f1']:.3f}  "
                  f"invalid {summary['invalid_rate']:.2f}  peak tokens {summary['peak_tokens']:.0f}")
    print(f"total wall time {time.perf_counter() - t0:.0f}s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from memkit.agents import METHODS
    from memkit.pipeline import POLICY_SPECS, PROMPTS
    from memkit.world.splits import SPLITS, TRAIN

    p = argparse.ArgumentParser(prog="memkit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp, objectives="2"):
        sp.add_argument("--world-seed", type=int, default=0, help="seed of the synthetic world")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--objectives", type=_ints, default=_ints(objectives), help="comma-separated k values, e.g. 1,2,4,8")
        sp.add_argument("--n-tasks", type=int, default=50, help="tasks per objective count")

    def context_options(sp):
        sp.add_argument("--prompt", choices=PROMPTS, default="auto",
                        help="paper = the paper's instruction, compact = the tiny model's one-line prompt; "
                             "auto = compact for tiny models, paper otherwise")
        sp.add_argument("--k-docs", type=_positive, default=None,
                        help="passages per search (default: what the model was SFT'd with, e.g. 1 for tiny-sft; "
                             "else 3)")

    sp = sub.add_parser("world", help="write the synthetic corpus and tasks as JSONL")
    common(sp)
    sp.add_argument("--out", default="world", help="output directory")
    sp.add_argument("--split", choices=("all", *SPLITS, TRAIN), default="all",
                    help="questions the tasks draw (memkit.world.question_split): sft = behaviour cloning's, "
                         "rl = RL's, train = both, test = the held-out ones no training task asks")
    sp.set_defaults(func=cmd_world)

    policy_help = "policy: " + ", ".join(POLICY_SPECS)
    sp = sub.add_parser("rollout", help="roll out a method and write JSONL traces")
    common(sp)
    sp.add_argument("--method", type=lambda s: _methods(s)[0], required=True, help=", ".join(METHODS))
    sp.add_argument("--policy", default="oracle", help=policy_help)
    sp.add_argument("--tasks", help="a tasks JSONL (from `memkit world`) instead of generated tasks")
    sp.add_argument("--n", type=int, default=1, help="trajectories per task (group size)")
    sp.add_argument("--temperature", type=float, default=1.0)
    sp.add_argument("--retriever", default="bm25", help="bm25 or dense")
    sp.add_argument("--out", default="traces.jsonl")
    context_options(sp)
    sp.set_defaults(func=cmd_rollout)

    sp = sub.add_parser("eval", help="evaluate methods at several objective counts and print the table")
    common(sp, objectives="1,2,4,8")
    sp.add_argument("--method", type=_methods, default=list(METHODS), help="comma-separated: " + ", ".join(METHODS))
    sp.add_argument("--policy", default="oracle", help=policy_help)
    sp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    sp.add_argument("--retriever", default="bm25", help="bm25 or dense")
    sp.add_argument("--out-dir", default=None, help="write JSONL traces here")
    context_options(sp)
    sp.set_defaults(func=cmd_eval)

    from memkit.sft import SFTConfig

    sp = sub.add_parser("sft", help="behaviour-clone the oracle into the tiny model (cached checkpoint)")
    common(sp, objectives="1,2")
    sp.set_defaults(n_tasks=SFTConfig.n_tasks)
    sp.add_argument("--method", type=lambda s: _methods(s)[0], required=True, help=", ".join(METHODS))
    sp.add_argument("--steps", type=int, default=SFTConfig.steps)
    sp.add_argument("--max-minutes", type=float, default=10.0,
                    help="wall-clock budget of the whole SFT (oracle data + optimisation): the learning-rate schedule "
                         "shrinks to fit, so a slow machine trains fewer steps (default 10; 0 = exactly --steps, "
                         "reproducible)")
    sp.add_argument("--show-comparison", action="store_true",
                    help="clone oracle traces that write a comparison's two values before its winner "
                         "(OracleConfig.show_comparison; saved under its own tag, e.g. k1-2-n4000-s0-cmp)")
    sp.add_argument("--eval-tasks", type=int, default=100, help="held-out tasks to evaluate after training (0 = skip)")
    sp.add_argument("--eval-objectives", type=_ints, default=[2])
    sp.add_argument("--tag", default=None,
                    help="cache tag of the checkpoint (default: 'default' for the default --objectives / --n-tasks / "
                         "--seed, else one naming them, e.g. k1-2-3-n4000-s0); load it as --policy tiny-sft:TAG")
    sp.set_defaults(func=cmd_sft)

    from memkit.reproduce import add_reproduce_parser

    add_reproduce_parser(sub)
    try:
        from memkit.rl.cli import add_train_parser

        add_train_parser(sub)
    except ImportError:
        pass
    return p


def main(argv=None) -> int:
    from memkit.cpu import keep_freed_memory

    args = build_parser().parse_args(argv)
    keep_freed_memory()  # reuse freed tensor memory instead of page-faulting it back (memkit.cpu)
    func = getattr(args, "func", None) or args.handler
    try:
        return func(args) or 0
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"memkit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
