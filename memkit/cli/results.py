"""``memkit results``: judge the papers' claims on earlier ``memkit reproduce`` runs (:mod:`memkit.course.results`)."""

from __future__ import annotations

HELP = "judge the papers' claims on earlier reproduce runs: docs/results.md"


def add_arguments(r) -> None:
    r.description = (
        "Regenerate the claims page (memkit.course.results) from runs of `memkit reproduce`; "
        "a later run directory wins for a notebook that ran ok in several."
    )
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="runs/<time> directories")
    r.add_argument("--out", default="docs/results.md", help="where to write the page (default docs/results.md)")


def run(args) -> int:
    from memkit.course.results import write_results

    print(f"wrote {write_results(args.run_dirs, args.out)}")
    return 0
