"""``memkit`` command line: world, rollout, eval, pretrain, sft, train, reproduce (one module each).

Every bad input (unknown method, model, missing file) ends with one line naming the fix and
exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import sys

from memkit.cli import evaluate, pretrain, reproduce, rollout, sft, train, world

SUBCOMMANDS = (world, rollout, evaluate, pretrain, sft, reproduce, train)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memkit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return p


def main(argv=None) -> int:
    from memkit.cpu import keep_freed_memory

    args = build_parser().parse_args(argv)
    keep_freed_memory()  # reuse freed tensor memory instead of page-faulting it back (memkit.cpu)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"memkit {args.command}: error: {e}", file=sys.stderr)
        return 2


__all__ = ["build_parser", "main"]
