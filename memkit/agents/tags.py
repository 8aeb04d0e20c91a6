"""Tolerant extraction of ``<tag>...</tag>`` actions, shared by every memory format.

All five papers write their actions as XML-style tags (MEM1 App. B.3 Prompt 1-2,
MemSearcher §3.1, MemPO Table 6, MemAct §3.2; Search-R1 for the ReAct baseline). A policy
that is still learning writes anything, so nothing here raises: every function returns a
value or an error string. The rollout engine turns an error into an invalid turn with the
method's format penalty (DESIGN.md "Malformed output never crashes a rollout").

Rules of :func:`parse_action` (one place, so all formats judge format errors alike):

* exactly one action tag among ``actions`` must be present and closed; two different ones
  ("both search and answer") or the same one twice ("multiple <search>") is an error,
  because every prompt says "Do not search multiple queries simultaneously";
* each tag in ``required`` (``think`` for MEM1, ``mem`` + ``think`` for MemPO) must be
  present, closed, and come before the action (the prompts fix the order);
* the action's content must not be empty;
* text after the action's closing tag is ignored (generation stops there anyway).
"""

from __future__ import annotations

import json
import re

from memkit.core.trajectory import Parsed

_OPEN = "<{}>"
_CLOSE = "</{}>"


def extract(text: str, tag: str) -> str | None:
    """Content of the first complete ``<tag>...</tag>`` (stripped), or None."""
    if not isinstance(text, str):
        return None
    start = text.find(_OPEN.format(tag))
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(_CLOSE.format(tag), start)
    return None if end < 0 else text[start:end].strip()


def span(text: str, tag: str) -> tuple[int, int] | None:
    """``[start, end)`` of the first complete ``<tag>...</tag>`` including the tags, or None."""
    start = text.find(_OPEN.format(tag))
    if start < 0:
        return None
    end = text.find(_CLOSE.format(tag), start + len(tag) + 2)
    return None if end < 0 else (start, end + len(tag) + 3)


def count_open(text: str, tag: str) -> int:
    return text.count(_OPEN.format(tag))


def tag_status(text: str, tag: str) -> str:
    """ "absent" | "unclosed" | "ok" for the first occurrence of ``tag``."""
    if _OPEN.format(tag) not in text:
        return "absent"
    return "ok" if span(text, tag) is not None else "unclosed"


def parse_action(
    text, actions: tuple[str, ...], required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
) -> Parsed:
    """Parse ``[required tags...] <action>argument</action>``; see the module docstring."""
    if not isinstance(text, str) or not text.strip():
        return Parsed(ok=False, error="empty output")
    present = [a for a in actions if _OPEN.format(a) in text]
    if not present:
        expected = " or ".join(f"<{a}>" for a in actions)
        return Parsed(ok=False, error=f"no action tag (expected {expected})")
    if len(present) > 1:
        return Parsed(ok=False, error=f"both {' and '.join(present)} in one output")
    action = present[0]
    if count_open(text, action) > 1:
        return Parsed(ok=False, error=f"multiple <{action}> in one output")
    act_span = span(text, action)
    if act_span is None:
        return Parsed(ok=False, error=f"unclosed <{action}>")
    fields: dict[str, str] = {}
    for tag in required:
        status = tag_status(text[: act_span[0]], tag)
        if status == "absent":
            whole = tag_status(text, tag)
            return Parsed(
                ok=False, error=f"missing <{tag}>" if whole == "absent" else f"<{tag}> must come before <{action}>"
            )
        if status == "unclosed":
            return Parsed(ok=False, error=f"unclosed <{tag}>")
        fields[tag] = extract(text, tag) or ""
    for tag in optional:
        if tag_status(text[: act_span[0]], tag) == "unclosed":
            return Parsed(ok=False, error=f"unclosed <{tag}>")
        value = extract(text[: act_span[0]], tag)
        if value is not None:
            fields[tag] = value
    argument = extract(text, action) or ""
    fields[action] = argument
    if not argument:
        return Parsed(ok=False, action=action, fields=fields, error=f"empty {action}")
    return Parsed(ok=True, action=action, argument=argument, fields=fields)


_QUERY_RE = re.compile(r'"query"\s*:\s*"((?:[^"\\]|\\.)*)"')


def tool_call_query(body: str) -> str | None:
    """Query of a ``<tool_call>`` body: JSON ``{"name":..,"arguments":{"query":..}}`` (MemSearcher
    Table 4), a loose ``"query": "..."`` pair, or, failing both, the plain text."""
    try:
        obj = json.loads(body)
        if isinstance(obj, dict):
            args = obj.get("arguments", obj)
            if isinstance(args, dict) and isinstance(args.get("query"), str):
                return args["query"].strip()
    except (ValueError, TypeError, RecursionError):
        pass
    m = _QUERY_RE.search(body)
    if m:
        return m.group(1).replace('\\"', '"').strip()
    if "{" in body or "}" in body:
        return None  # JSON-looking but without a query: a malformed call, not a query
    return body.strip()


def words(text: str) -> int:
    """Word count: the tokenizer-free length proxy used for memory budgets."""
    return len(text.split())
