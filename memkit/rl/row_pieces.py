"""Which piece of which call every token of a packed row is: the blocks of a packed row named in
MEM1's notation (``q, S1A1, O1, S2A2, [S2A2]', O2, ...``), for drawing a packed mask
(:mod:`memkit.viz.mask`) and for tests that check where each call's tokens land.

:func:`row_pieces` walks the same rows as :func:`memkit.rl.packing.pack` (a ``separate`` row per
call; a 2D mode's row from :func:`memkit.rl.packing.layout_row`), so its token indices are the
packed tensors'; it builds no tensors.
"""

from __future__ import annotations

from typing import NamedTuple

from memkit.core.trajectory import Call, TrainingUnit, Trajectory, as_unit
from memkit.rl.packing import MODES, layout_row


class RowPiece(NamedTuple):
    """A run ``[start, end)`` of one packed row that comes from one piece of one call.

    ``kind``: ``prompt`` (call 0's context outside any ref), ``output`` (call ``call``'s
    generated tokens, trained), ``copy`` (a context copy of call ``call``'s output: mem1_exact's
    duplicated state, or any earlier output inside a ``separate`` row), ``observation``
    (call ``call``'s tool result), ``context`` (other context tokens first placed for call
    ``call``, e.g. chat suffixes). ``label`` names it in MEM1's notation: ``q``, ``S1A1``,
    ``[S1A1]'``, ``O1``, ``c2`` (1-based, as the paper counts turns).
    """

    start: int
    end: int
    kind: str
    call: int
    label: str


def _label(kind: str, call: int) -> str:
    i = call + 1
    return {"prompt": "q", "output": f"S{i}A{i}", "copy": f"[S{i}A{i}]'", "observation": f"O{i}"}.get(kind, f"c{i}")


def _ref_kind(call: Call, p: int) -> tuple[str, int] | None:
    for s, e, j, kind in call.context_refs:
        if s <= p < e:
            return ("copy" if kind == "output" else "observation"), j
    return None


def _runs(tags: list[tuple[str, int]]) -> list[RowPiece]:
    out, start = [], 0
    for i in range(1, len(tags) + 1):
        if i == len(tags) or tags[i] != tags[start]:
            kind, call = tags[start]
            out.append(RowPiece(start, i, kind, call, _label(kind, call)))
            start = i
    return out


def row_pieces(units: list[TrainingUnit | Trajectory], mode: str) -> list[list[RowPiece]]:
    """The pieces of every row of ``pack(units, mode)``, in row order (same rows, same
    token indices): for drawing a packed mask with its blocks named, e.g. for a MEM1 row under
    ``mem1_exact``: ``q, S1A1, O1, S2A2, [S2A2]', O2, S3A3, ...``. A context token belongs to
    the call that placed it (see the module docstring); refs say whether it copies an earlier
    output or an observation."""
    if mode not in MODES:
        raise ValueError(f"unknown packing mode {mode!r}; choose one of {MODES}")
    rows = []
    for u in map(as_unit, units):
        tr = u.traj
        if mode == "separate":
            first = list(tr.calls[u.calls[0]].context_ids) if u.calls else []
            for t, c in u:
                n_pre = 0  # call 0's prompt, repeated at the start of every later call
                while (
                    n_pre < min(len(first), c.n_context)
                    and c.context_ids[n_pre] == first[n_pre]
                    and _ref_kind(c, n_pre) is None
                ):
                    n_pre += 1
                tags = [_ref_kind(c, p) or (("prompt", 0) if p < n_pre else ("context", t)) for p in range(c.n_context)]
                rows.append(_runs(tags + [("output", t)] * c.n_output))
            continue
        row = layout_row(u, mode)
        tags: list = [None] * len(row.ids)
        for t, full, here, n_ctx in row.calls:
            for p, (i, placed) in enumerate(zip(full, here)):
                if placed and tags[i] is None:
                    tags[i] = (
                        ("output", t)
                        if p >= n_ctx
                        else (_ref_kind(tr.calls[t], p) or (("prompt", 0) if t == u.calls[0] else ("context", t)))
                    )
        rows.append(_runs(tags))
    return rows


__all__ = ["RowPiece", "row_pieces"]
