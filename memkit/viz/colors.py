"""One fixed colour palette for every span kind / output tag, shared by all viewers.

Context kinds (from the methods' Segments) and output tags (from the parsers) share the
palette so that e.g. a ``<search>`` the model wrote and the same query copied into a later
context read as the same colour. Unknown kinds get a stable fallback colour.
"""

from __future__ import annotations

import hashlib
import html

# Light backgrounds: text stays black and readable on all of them.
PALETTE: dict[str, str] = {
    # context kinds
    "system": "#e0e0e0",
    "question": "#ffe08a",
    "memory": "#b9e6b0",
    "mem": "#b9e6b0",
    "think": "#c9dcff",
    "search": "#ffc9a3",
    "tool_call": "#ffc9a3",
    "answer": "#f5a9c8",
    "information": "#d7c8f2",
    "hint": "#fff3c4",
    "record": "#a8e3e6",
    "records": "#a8e3e6",
    "chat": "#f0e0c8",
    "note": "#e6f0a8",
}

FALLBACK = ("#f2d0a0", "#c0e8d0", "#d8d0f0", "#f0c8c8", "#c8e0f0", "#e8e8b0")

INSERT_COLOR = "#a6f0a6"  # memory diff: inserted text
DELETE_COLOR = "#f5a3a3"  # memory diff: deleted text
PRUNED_COLOR = "#f5a3a3"  # MemAct: records pruned by this call


def color_for(kind: str) -> str:
    """Background colour of a span kind; stable for unknown kinds (hash of the name)."""
    if kind in PALETTE:
        return PALETTE[kind]
    h = int(hashlib.md5(kind.encode("utf-8")).hexdigest(), 16)
    return FALLBACK[h % len(FALLBACK)]


def css_class(kind: str) -> str:
    """CSS class name of a kind: ``mk-<kind>`` with anything outside [A-Za-z0-9_-] as '_'."""
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in kind)
    return f"mk-{safe}"


def span_open(kind: str) -> str:
    """Opening tag of a coloured span: class ``mk-span mk-<kind>`` plus an inline background."""
    return (
        f'<span class="mk-span {css_class(kind)}" data-kind="{html.escape(kind, quote=True)}" '
        f'style="background:{color_for(kind)}" title="{html.escape(kind, quote=True)}">'
    )


def legend_html(kinds) -> str:
    """A row of coloured chips, one per kind, in the order given."""
    chips = "".join(f"{span_open(k)}{html.escape(k)}</span> " for k in kinds)
    return f'<div class="mk-legend">{chips}</div>'


CSS = f"""
.mk-root {{ font-family: system-ui, sans-serif; font-size: 13px; color: #111; }}
.mk-text {{ white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, Menlo, Consolas, monospace;
  font-size: 12px; background: #fafafa; border: 1px solid #ddd; padding: 6px; margin: 2px 0 8px 0;
  max-height: 420px; overflow-y: auto; color: #111; }}
.mk-span {{ border-radius: 2px; color: #111; }}
.mk-legend {{ margin: 4px 0; line-height: 2; }}
.mk-legend .mk-span {{ padding: 1px 6px; margin-right: 2px; font-size: 11px; }}
.mk-head {{ font-weight: 600; margin: 6px 0 2px 0; }}
.mk-invalid {{ color: #b00020; font-weight: 600; }}
.mk-counts {{ border-collapse: collapse; margin: 2px 0 8px 0; }}
.mk-counts td, .mk-counts th {{ border: 1px solid #ddd; padding: 1px 6px; text-align: right; }}
.mk-counts td:nth-child(-n+2), .mk-counts th:nth-child(-n+2) {{ text-align: left; }}
ins.mk-ins {{ background: {INSERT_COLOR}; text-decoration: none; }}
del.mk-del {{ background: {DELETE_COLOR}; }}
.mk-pruned {{ background: {PRUNED_COLOR}; text-decoration: line-through; }}
.mk-records td {{ font-family: ui-monospace, monospace; font-size: 12px; }}
"""
