"""``memkit reproduce``: run every notebook with papermill and write a report (:mod:`memkit.course.reproduce`)."""

from __future__ import annotations

import sys

HELP = "run every notebook with papermill and write a report"


def add_arguments(p) -> None:
    from memkit.course.reproduce import __doc__ as doc

    p.description = doc.split("\n\n")[0]
    p.add_argument(
        "--smoke",
        action="store_true",
        help="SMOKE=True: small sizes, minutes (default: the lab mode, SMOKE=False, hours on 2 cores "
        "from an empty cache: docs/reference.md, 'The lab mode')",
    )
    p.add_argument("--model", default="tiny", help="MODEL parameter: tiny, smollm2-135m, HF id/path")
    p.add_argument("--seed", type=int, default=0, help="SEED parameter (default 0)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="notebook stems or unique prefixes")
    p.add_argument("--out", default="runs", help="root of the run directories (default runs/)")
    p.add_argument("--notebooks-dir", default=None, help="default: the repository's notebooks/")
    p.add_argument("--kernel", default=None, help="Jupyter kernel name (default: this Python)")
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="an earlier run directory: keep its notebooks that finished ok, run the rest",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="lab mode: train the lab's clones and run the notebooks on N lanes side by side, each "
        "pinned to its share of the cores (make reproduce: 2; default 1, one after another)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="seeds per arm in the notebooks that compare RL arms (04-06, 08; their default: 1, judged "
        "against the 3-seed spread in docs/findings.md; 3 measures the spread)",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="lab mode: also the full-study notebooks (08, the head-to-head: RL minutes for eight contestants "
        "and the ReAct, A-MEM and summarisation clones; make reproduce FULL=1); --only runs any notebook it names",
    )
    p.add_argument("--timeout", type=float, default=None, help="per-cell timeout in seconds")
    p.add_argument(
        "--results",
        default=None,
        metavar="PATH",
        help="also write the claims page there (make reproduce: docs/results.md); "
        "RESULTS.md in the run directory is always written",
    )


def run(args) -> int:
    """Exit status 1 if any notebook failed, 2 on a bad argument."""
    from memkit.course.reproduce import failed_notebooks, reproduce

    try:
        run_dir = reproduce(
            smoke=args.smoke,
            model=args.model,
            notebooks=args.only,
            out_root=args.out,
            kernel=args.kernel,
            seed=args.seed,
            notebooks_dir=args.notebooks_dir,
            timeout=args.timeout,
            resume=args.resume,
            results=args.results,
            jobs=args.jobs,
            seeds=args.seeds,
            full=args.full,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"memkit reproduce: error: {e}", file=sys.stderr)
        return 2
    return 1 if failed_notebooks(run_dir) else 0
