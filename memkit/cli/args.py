"""Argument types the subcommands share, and flags generated from a config dataclass.

:func:`add_config_flags` gives every field of a config dataclass one flag, so a knob is defined
once (the field, its default and the docstring right under it) and the command line follows:

    field ``n_samples: int = 4`` + its docstring  ->  ``--n-samples N``  (help = the docstring)

``bool`` fields become ``--flag/--no-flag``, ``tuple[int, ...]`` a comma list (``1,2,4``), ``dict`` a
JSON object, ``X | None`` also accepts ``none``, a nested dataclass one flag per inner field
(``--oracle-p-drop-fact``), and ``field(metadata={"choices": ...})`` restricts the values.
:func:`config_from_args` builds the dataclass back from the parsed namespace by field name.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing

from memkit.core.fields import flat_names


# ---- argument types --------------------------------------------------------------------------------
def ints(text: str) -> list[int]:
    """Comma-separated positive integers: ``1,2,4,8``."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4,8, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"objective counts must be >= 1, got {text!r}")
    return values


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number like 3, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def methods(text: str, streams: bool = True) -> list[str]:
    """Comma-separated memory formats (``memkit.agents.QA_METHODS``; ``ALL_METHODS`` if ``streams``)."""
    from memkit.agents import ALL_METHODS, QA_METHODS, STREAM_METHODS

    names = [m.strip() for m in text.split(",") if m.strip()]
    allowed = ALL_METHODS if streams else QA_METHODS
    for name in names:
        if name in STREAM_METHODS and not streams:
            raise argparse.ArgumentTypeError(
                f"{name} reads conversation streams, not wiki tasks: use `memkit eval --method {name}`"
            )
        if name not in allowed:
            raise argparse.ArgumentTypeError(f"unknown method {name!r}; choose from {', '.join(allowed)}")
    return names


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'expected a JSON object like \'{{"reward_metric": "em"}}\', got {text!r}')
    return value


def minutes(text: str) -> float:
    """Minutes as seconds."""
    try:
        return 60 * float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected minutes like 10 or 0.5, got {text!r}") from None


def add_max_minutes(parser, default_seconds: float | None, zero: str | None = None, dest: str = "max_seconds") -> None:
    """``--max-minutes M``: the seconds field ``dest`` (``max_seconds``; TrainConfig's ``budget.seconds``) in
    minutes. ``zero``: what 0 means, when it means no budget (None); otherwise 0 reaches the config as is."""

    def budget(text: str) -> float | None:
        seconds = minutes(text)
        return None if zero and seconds == 0 else seconds

    shown = "none" if default_seconds is None else f"{default_seconds / 60:g}"
    parser.add_argument(
        "--max-minutes",
        dest=dest,
        type=budget,
        default=argparse.SUPPRESS,
        metavar="M",
        help=f"--max-seconds in minutes{f'; 0 = {zero}' if zero else ''} (default: {shown})",
    )


# ---- flags from a config dataclass ------------------------------------------------------------------
def field_docs(cls) -> dict[str, str]:
    """The attribute docstrings of a dataclass: the string literal right under each field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)).body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _help(doc: str) -> str:
    first = doc.split("\n\n")[0]
    return re.sub(r"\s+", " ", first.replace("``", "")).strip().replace("%", "%%")


def _unwrap_optional(tp):
    """``(inner type, accepts None)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _or_none(parse, optional: bool):
    if not optional:
        return parse

    def parse_or_none(text: str):
        return None if text.strip().lower() == "none" else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")
    return parse_or_none


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4, got {text!r}") from None


def _shown(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value)
    return "none" if value is None else str(value)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


class Computed(str):
    """A command's default that it computes after parsing (e.g. ``runs/<method>-<algo>``): the
    flag's default is None and its help shows this text."""


def add_config_flags(
    parser,
    cls,
    *,
    aliases: dict[str, list[str]] | None = None,
    required=(),
    defaults: dict | None = None,
    prefix: str = "",
    instance=None,
    flags: dict | None = None,
) -> None:
    """Add one flag per field of dataclass ``cls`` (see the module doc).

    ``aliases``: extra option strings of a field's flag (``{"n_samples": ["--n"]}``);
    ``required``: fields the command line must give; ``defaults``: the command's own default for
    a field (when it differs from the dataclass's, e.g. a computed one); ``prefix``/``instance``:
    used for nested dataclasses (dest ``outer.inner``, defaults from the outer default instance).
    A field's flag is its flat name (:func:`memkit.core.fields.flat_names`: ``--outer-inner`` unless the
    group's metadata says otherwise), the name older checkpoints stored it under.
    """
    aliases, defaults = aliases or {}, defaults or {}
    flags = flags if flags is not None else {path: flat for path, flat, _ in flat_names(cls)}
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        name = prefix + f.name
        default = defaults.get(name, getattr(instance, f.name) if instance is not None else _default(f))
        tp, optional = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            add_config_flags(
                parser,
                tp,
                aliases=aliases,
                required=required,
                defaults=defaults,
                prefix=name + ".",
                instance=default,
                flags=flags,
            )
            continue
        options = ["--" + flags[name].replace("_", "-"), *aliases.get(name, [])]
        kw = dict(dest=name, help=_help(docs.get(f.name, "")))
        shown = str(default) if isinstance(default, Computed) else _shown(default)
        if name in required:
            kw["required"] = True
        else:
            kw["default"] = None if isinstance(default, Computed) else default
        if "default" in kw:
            kw["help"] += f" (default: {'auto' if tp is bool and default is None else shown})"
        if tp is bool:
            parser.add_argument(*options, action=argparse.BooleanOptionalAction, **kw)
            continue
        kw["metavar"] = f.name.upper()
        if tp in (int, float, str):
            parse = tp
        elif typing.get_origin(tp) is tuple and typing.get_args(tp)[:1] == (int,):
            parse, kw["metavar"] = _int_tuple, "N,N,..."
        elif tp is dict or typing.get_origin(tp) is dict:
            parse, kw["metavar"] = json_object, "JSON"
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for type {tp!r}")
        kw["type"] = _or_none(parse, optional)
        if f.metadata.get("choices"):
            kw["choices"] = tuple(f.metadata["choices"]) + ((None,) if optional else ())
            kw["metavar"] = "{" + ",".join(map(str, f.metadata["choices"])) + "}"
        parser.add_argument(*options, **kw)


def config_from_args(cls, args: argparse.Namespace, prefix: str = ""):
    """The dataclass ``cls`` from a namespace :func:`add_config_flags` filled, by field name."""
    hints, values = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        tp, _ = _unwrap_optional(hints[f.name])
        name = prefix + f.name
        values[f.name] = config_from_args(tp, args, name + ".") if dataclasses.is_dataclass(tp) else getattr(args, name)
    return cls(**values)
