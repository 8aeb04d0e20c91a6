"""HTML rendering of trajectories: one call as a fragment, or a whole static page.

``render_call_html(traj, i)`` is what :class:`memkit.viz.trace.TraceViewer` shows for the
call under its slider, and what :func:`to_html` stacks into a self-contained page (inline
CSS and a small inline JS slider; without JS every turn is shown, with anchors) for readers
without a kernel. All trajectory text goes through ``html.escape``.
"""

from __future__ import annotations

import difflib
import html
import re
from pathlib import Path

from memkit.agents.memact import INFO_PRUNED_IDS
from memkit.agents.memt import INFO_STORE_OPS, INFO_STORE_SIZES
from memkit.core.io import atomic_write_text
from memkit.core.trajectory import Call, Trajectory
from memkit.viz.colors import CSS, css_class, legend_html, span_open

MEMORY_KINDS = ("memory", "mem")  # preferred; "think" is the fallback (MEM1-style internal state)
_RECORD_ID = re.compile(r"(?:\bid\s*[=:]\s*[\"']?|\[|#)\s*([A-Za-z_]*\d+)")


# ----------------------------------------------------------------------------- spans
def render_spans(text: str, spans: dict[str, list[tuple[int, int]]]) -> str:
    """Escape ``text`` and wrap each character span in ``<span class="mk-span mk-<kind>">``.

    Spans may nest or overlap: each piece of text takes the innermost (shortest) span that
    covers it. Spans are clipped to the text; empty ones are ignored.
    """
    n = len(text)
    flat = []
    for kind, lst in spans.items():
        for s, e in lst:
            s, e = max(0, int(s)), min(n, int(e))
            if e > s:
                flat.append((s, e, kind))
    cuts = sorted({0, n, *(s for s, _, _ in flat), *(e for _, e, _ in flat)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        covering = [(e - s, kind) for s, e, kind in flat if s <= a and b <= e]
        piece = html.escape(text[a:b])
        if covering:
            kind = min(covering)[1]
            out.append(f"{span_open(kind)}{piece}</span>")
        else:
            out.append(piece)
    return "".join(out)


def _span_texts(text: str, spans: dict, kind: str) -> list[str]:
    return [text[s:e] for s, e in sorted(spans.get(kind, []))]


# ----------------------------------------------------------------------------- memory
def memory_source(traj: Trajectory) -> tuple[str, str] | None:
    """Where a method keeps its memory: ``("context"|"output", kind)``, or None.

    Prefers "memory"/"mem" spans in the context (what the model was shown), then in the
    output (what it wrote), then "think" (MEM1's internal state) in the same order.
    """
    for kinds in (MEMORY_KINDS, ("think",)):
        for where in ("context", "output"):
            for kind in kinds:
                if any(kind in getattr(c, f"{where}_char_spans") for c in traj.calls):
                    return where, kind
    return None


def memory_text(call: Call, source: tuple[str, str] | None) -> str:
    """The text of the memory spans of ``call`` (joined by newlines); "" when none."""
    if source is None:
        return ""
    where, kind = source
    text = call.context_text if where == "context" else call.output_text
    spans = call.context_char_spans if where == "context" else call.output_char_spans
    return "\n".join(_span_texts(text, spans, kind))


def diff_html(old: str, new: str) -> str:
    """Word-level diff of two memory texts: ``<ins class="mk-ins">`` / ``<del class="mk-del">``."""
    tok = re.compile(r"\s+|\w+|[^\w\s]")
    a, b = tok.findall(old), tok.findall(new)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(html.escape("".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(f'<del class="mk-del">{html.escape("".join(a[i1:i2]))}</del>')
        if j2 > j1:
            out.append(f'<ins class="mk-ins">{html.escape("".join(b[j1:j2]))}</ins>')
    return "".join(out)


def previous_same_role(traj: Trajectory, i: int) -> int | None:
    """Index of the last call before ``i`` with the same role, or None."""
    role = traj.calls[i].role
    for j in range(i - 1, -1, -1):
        if traj.calls[j].role == role:
            return j
    return None


# ----------------------------------------------------------------------------- counts
def _union_len(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def part_counts(spans: dict, total: int) -> list[tuple[str, int]]:
    """(kind, size) per kind in order of first appearance, plus "(untagged)" for the rest."""
    rows = [(k, sum(e - s for s, e in v)) for k, v in sorted(spans.items(), key=lambda kv: min(kv[1], default=(0, 0)))]
    rest = total - _union_len([s for v in spans.values() for s in v])
    if rest > 0:
        rows.append(("(untagged)", rest))
    return rows


def _counts_table(call: Call) -> str:
    rows = []
    if call.context_spans:
        part, unit, spans, total = "context", "tokens", call.context_spans, call.n_context
    else:
        part, unit, spans, total = "context", "chars", call.context_char_spans, len(call.context_text)
    rows += [(part, k, n, unit) for k, n in part_counts(spans, total)]
    if call.context_ids:
        rows.append(("context", "total", call.n_context, "tokens"))
    if call.output_spans:
        spans, total, unit = call.output_spans, call.n_output, "tokens"
    else:
        spans, total, unit = call.output_char_spans, len(call.output_text), "chars"
    rows += [("output", k, n, unit) for k, n in part_counts(spans, total)]
    if call.output_ids:
        rows.append(("output", "total", call.n_output, "tokens"))
    if call.observation_ids:
        rows.append(("observation", "total", len(call.observation_ids), "tokens"))
    elif call.observation_text:
        rows.append(("observation", "total", len(call.observation_text), "chars"))

    def kind_cell(k: str) -> str:
        plain = k == "total" or k.startswith("(")
        return html.escape(k) if plain else f"{span_open(k)}{html.escape(k)}</span>"

    body = "".join(f"<tr><td>{p}</td><td>{kind_cell(k)}</td><td>{n}</td><td>{u}</td></tr>" for p, k, n, u in rows)
    return f'<table class="mk-counts"><tr><th>part</th><th>kind</th><th>size</th><th>unit</th></tr>{body}</table>'


# ----------------------------------------------------------------------------- records (MemAct)
def record_spans(call: Call) -> list[tuple[str | None, str]]:
    """``(record id or None, text)`` for each context span of kind "record", in order."""
    out = []
    for text in _span_texts(call.context_text, call.context_char_spans, "record"):
        m = _RECORD_ID.search(text[:60])
        out.append((m.group(1) if m else None, text))
    return out


def pruned_ids(traj: Trajectory, i: int) -> list[str]:
    """Record ids pruned by call ``i``, as strings: ``traj.info[INFO_PRUNED_IDS][i]``, the
    per-call lists MemAct's ``trajectory_info`` writes (the records call ``i`` saw and deleted)."""
    pruned = traj.info.get(INFO_PRUNED_IDS) if isinstance(traj.info, dict) else None
    if not pruned or i >= len(pruned) or pruned[i] is None:
        return []
    ids = pruned[i] if isinstance(pruned[i], (list, tuple)) else [pruned[i]]
    return [str(x) for x in ids]


def _records_html(traj: Trajectory, i: int) -> str:
    records, pruned = record_spans(traj.calls[i]), pruned_ids(traj, i)
    if not records and INFO_PRUNED_IDS not in traj.info:
        return ""
    parts = ['<div class="mk-head">records</div>']
    if pruned:
        ids = ", ".join(f'<span class="mk-pruned">{html.escape(p)}</span>' for p in pruned)
        parts.append(f'<div class="mk-pruned-ids">pruned by this call: {ids}</div>')
    else:
        parts.append('<div class="mk-pruned-ids">pruned by this call: none</div>')
    if records:
        rows = []
        for rid, text in records:
            cls = ' class="mk-pruned"' if rid is not None and rid in pruned else ""
            short = text if len(text) <= 120 else text[:117] + "..."
            rows.append(f"<tr{cls}><td>{html.escape(rid or '?')}</td><td>{html.escape(short)}</td></tr>")
        parts.append(
            f"<div>{len(records)} record(s) in context</div>"
            f'<table class="mk-counts mk-records"><tr><th>id</th><th>record</th></tr>{"".join(rows)}</table>'
        )
    return "".join(parts)


def _store_html(traj: Trajectory, i: int) -> str:
    """Mem-T: the store operations call ``i`` ran and the store's size after it."""
    info = traj.info if isinstance(traj.info, dict) else {}
    ops, sizes = (info.get(INFO_STORE_OPS) or {}).get(str(i)), (info.get(INFO_STORE_SIZES) or {}).get(str(i))
    if ops is None and sizes is None:
        return ""
    parts = ['<div class="mk-head">memory store</div>']
    if sizes:
        parts.append("<div>after this call: " + ", ".join(f"{n} {html.escape(t)}" for t, n in sizes.items()) + "</div>")
    rows = "".join(
        f"<tr><td>{html.escape(str(op))}</td><td>{html.escape(str(mid or ''))}</td>"
        f"<td>{html.escape(str(text))}</td></tr>"
        for op, mid, text in ops or []
    )
    parts.append(
        f'<table class="mk-counts mk-store"><tr><th>op</th><th>id</th><th>memory</th></tr>{rows}</table>'
        if rows
        else "<div>no store operation</div>"
    )
    return "".join(parts)


# ----------------------------------------------------------------------------- one call
def trajectory_header_html(traj: Trajectory) -> str:
    golds = " | ".join(" / ".join(g) for g in traj.golds)
    status = "" if traj.valid else f' <span class="mk-invalid">invalid: {html.escape(str(traj.reason))}</span>'
    return (
        f'<div class="mk-traj-head"><b>{html.escape(traj.method)}</b> task '
        f"<code>{html.escape(traj.task_id)}</code> (sample {traj.group_index}) &middot; "
        f"{len(traj.calls)} call(s) &middot; answer: <code>{html.escape(str(traj.answer))}</code> &middot; "
        f"gold: <code>{html.escape(golds)}</code> &middot; reward: {html.escape(str(traj.reward))}{status}</div>"
    )


def render_call_html(traj: Trajectory, i: int, include_css: bool = True, header: bool = True) -> str:
    """HTML of call ``i``: context and output coloured by kind, observation, sizes,
    memory diff against the previous call of the same role, and pruned MemAct records."""
    if not 0 <= i < len(traj.calls):
        raise IndexError(f"call {i} out of range: trajectory has {len(traj.calls)} call(s)")
    call = traj.calls[i]
    kinds = list(dict.fromkeys([*call.context_char_spans, *call.output_char_spans]))
    status = "" if call.valid else f' <span class="mk-invalid">invalid: {html.escape(str(call.reason))}</span>'
    parts = [f"<style>{CSS}</style>" if include_css else "", '<div class="mk-root mk-call">']
    if header:
        parts.append(trajectory_header_html(traj))
    parts.append(
        f'<div class="mk-head">call {i} / {len(traj.calls) - 1} &middot; turn {call.turn} '
        f"&middot; role {html.escape(call.role)}{status}</div>"
    )
    parts.append(legend_html(kinds))
    parts.append(
        f'<div class="mk-head">context</div><div class="mk-text mk-context">'
        f"{render_spans(call.context_text, call.context_char_spans)}</div>"
    )
    parts.append(
        f'<div class="mk-head">output</div><div class="mk-text mk-output">'
        f"{render_spans(call.output_text, call.output_char_spans)}</div>"
    )
    if call.observation_text is not None:
        parts.append(
            f'<div class="mk-head">observation</div>'
            f'<div class="mk-text mk-observation">{html.escape(call.observation_text)}</div>'
        )
    parts.append('<div class="mk-head">sizes</div>' + _counts_table(call))
    source = memory_source(traj)
    if source is not None:
        j = previous_same_role(traj, i)
        old = memory_text(traj.calls[j], source) if j is not None else ""
        against = f"call {j}" if j is not None else "empty (first call of this role)"
        parts.append(
            f'<div class="mk-head">memory diff ({html.escape(source[0])} '
            f'<span class="{css_class(source[1])}">{html.escape(source[1])}</span> spans) '
            f"against {against}</div>"
            f'<div class="mk-text mk-diff">{diff_html(old, memory_text(call, source))}</div>'
        )
    parts.append(_records_html(traj, i))
    parts.append(_store_html(traj, i))
    parts.append("</div>")
    return "".join(parts)


# ----------------------------------------------------------------------------- static page
_PAGE_JS = """
document.querySelectorAll('.mk-traj').forEach(function (t) {
  var turns = t.querySelectorAll('.mk-turn'), range = t.querySelector('.mk-range'),
      label = t.querySelector('.mk-range-label'), all = t.querySelector('.mk-all');
  t.querySelector('.mk-ctl').style.display = '';
  function show() {
    var v = parseInt(range.value, 10);
    turns.forEach(function (s, i) { s.style.display = (all.checked || i === v) ? '' : 'none'; });
    label.textContent = 'call ' + v + ' / ' + (turns.length - 1);
  }
  range.addEventListener('input', show); all.addEventListener('change', show);
  turns.forEach(function (s, i) { if (location.hash === '#' + s.id) range.value = i; });
  show();
});
"""


def to_html(
    trajectories: Trajectory | list[Trajectory], path: str | Path | None = None, title: str = "memkit trajectories"
) -> str:
    """A self-contained HTML page of one or more trajectories (inline CSS and JS).

    Every call is a ``<section id="t<k>-c<i>">`` with anchors; a small inline script adds a
    slider per trajectory (without JS all calls are shown). Written atomically to ``path``
    when given. Returns the HTML.
    """
    trajs = [trajectories] if isinstance(trajectories, Trajectory) else list(trajectories)
    body = []
    for k, traj in enumerate(trajs):
        n = len(traj.calls)
        nav = " ".join(f'<a href="#t{k}-c{i}">{i}</a>' for i in range(n))
        body.append(
            f'<div class="mk-traj" id="t{k}"><h2>trajectory {k}</h2>{trajectory_header_html(traj)}'
            f'<div class="mk-nav">calls: {nav}</div>'
            f'<div class="mk-ctl" style="display:none"><input type="range" class="mk-range" min="0" '
            f'max="{max(n - 1, 0)}" value="0" step="1"> <span class="mk-range-label"></span> '
            f'<label><input type="checkbox" class="mk-all"> show all</label></div>'
        )
        for i in range(n):
            body.append(
                f'<section class="mk-turn" id="t{k}-c{i}">'
                f"{render_call_html(traj, i, include_css=False, header=False)}</section>"
            )
        body.append("</div><hr>")
    page = (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}\nbody {{ margin: 16px; }} .mk-turn {{ border-top: 1px solid #ccc; padding-top: 4px; }}"
        f'</style></head><body class="mk-root"><h1>{html.escape(title)}</h1>{"".join(body)}'
        f"<script>{_PAGE_JS}</script></body></html>\n"
    )
    if path is not None:
        atomic_write_text(path, page)
    return page
