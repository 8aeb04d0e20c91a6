"""Attention-mask figures and a viewer (MEM1's packed masks, DCPO pieces, ...).

    plot_mask(mask, tokens=toks, title="MEM1 mask").savefig("figures/mem1_mask.png")
    plot_mask(mask, pieces=[(0, 70, "q"), (70, 105, "S1A1"), ...])  # named blocks, long rows
    MaskViewer(batch_mask)      # [B,1,L,L] or [B,L,L]: a "batch" slider picks the row

Cell (q, k) is filled when query position q may attend to key position k. A figure draws the
mask it is given: for MEM1 that is what ``memkit.rl.packing`` builds, where an observation O_i
attends to {q, S_i A_i, O_i} rather than to §3.2's literal {S_{i-1}, A_{i-1}, O_{i-1}, S_i, A_i,
O_i} (why: docs/findings.md, 'Which 2D mask').
"""

from __future__ import annotations

import io
from typing import Sequence

import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure

MAX_LABELS = 48  # tick labels for every token up to this length


def as_numpy(mask) -> np.ndarray:
    """A bool numpy array from a torch tensor, numpy array or nested list."""
    if hasattr(mask, "detach"):  # torch.Tensor without importing torch
        mask = mask.detach().cpu().numpy()
    arr = np.asarray(mask)
    if arr.dtype != bool:
        arr = arr != 0  # additive masks use 0 for "allowed": pass bool masks for those
    return arr


def as_batch(mask) -> np.ndarray:
    """Shape [B, L, L] from [L, L], [B, L, L] or [B, 1, L, L]."""
    arr = as_numpy(mask)
    if arr.ndim == 2:
        arr = arr[None]
    elif arr.ndim == 4:
        if arr.shape[1] != 1:
            raise ValueError(f"4-D mask must be [B, 1, L, L], got {tuple(arr.shape)}")
        arr = arr[:, 0]
    if arr.ndim != 3 or arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"mask must be [L, L], [B, L, L] or [B, 1, L, L], got {tuple(np.shape(mask))}")
    return arr


def _piece_triples(pieces) -> list[tuple[int, int, str]]:
    """``(start, end, label)`` from 3-tuples or objects with ``start``/``end``/``label``
    (e.g. ``memkit.rl.row_pieces.RowPiece``)."""
    out = []
    for piece in pieces:
        if hasattr(piece, "label"):
            out.append((int(piece.start), int(piece.end), str(piece.label)))
        else:
            a, b, lab = piece
            out.append((int(a), int(b), str(lab)))
    return out


def plot_mask(
    mask,
    ax=None,
    tokens: Sequence[str] | None = None,
    title: str | None = None,
    row_labels: Sequence[str] | None = None,
    boundaries: Sequence[int] | None = None,
    pieces=None,
) -> Figure:
    """Draw a 2-D [L, L] attention mask (rows = queries, columns = keys); return the figure.

    ``tokens`` label the axes when there are at most ``MAX_LABELS`` of them (``row_labels``
    overrides the row labels); ``boundaries`` are positions where a new call/segment starts,
    drawn as lines. ``pieces`` (``(start, end, label)`` runs, or ``Segment``s) name blocks of
    a long row: a line at each start and the label at the block's middle on both axes (token
    labels are then not drawn). Without ``ax`` a new (pyplot-free) Figure is made, so it is
    safe in loops.
    """
    arr = as_numpy(mask)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"plot_mask wants one [L, L] mask, got shape {tuple(arr.shape)}; pick a batch row first")
    L = arr.shape[0]
    if ax is None:
        size = min(10.0, max(3.5, 0.18 * L + 1.5))
        fig = Figure(figsize=(size, size))
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    ax.imshow(arr, cmap="Blues", vmin=0, vmax=1, interpolation="nearest", aspect="equal")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    cols = list(tokens) if tokens is not None else None
    rows = list(row_labels) if row_labels is not None else cols
    segs = _piece_triples(pieces) if pieces is not None else []
    if segs:
        mids = [(a + b - 1) / 2 for a, b, _ in segs]
        names = [lab for _, _, lab in segs]
        ax.set_xticks(mids)
        ax.set_xticklabels(names, rotation=90, fontsize=7)
        ax.set_yticks(mids)
        ax.set_yticklabels(names, fontsize=7)
        boundaries = list(boundaries or ()) + [a for a, _, _ in segs]
    else:
        for labels, set_ticks, set_labels, rot in (
            (cols, ax.set_xticks, ax.set_xticklabels, 90),
            (rows, ax.set_yticks, ax.set_yticklabels, 0),
        ):
            if labels is not None and len(labels) == L and L <= MAX_LABELS:
                set_ticks(range(L))
                set_labels([str(t) for t in labels], rotation=rot, fontsize=7)
    for b in boundaries or ():
        if 0 < b < L:
            ax.axhline(b - 0.5, color="#d62728", lw=0.8)
            ax.axvline(b - 0.5, color="#d62728", lw=0.8)
    allowed = int(arr.sum())
    ax.set_title(
        title if title is not None else f"mask {L}x{L}, {allowed} allowed ({allowed / max(L * L, 1):.0%})", fontsize=10
    )
    return fig


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """PNG bytes of a figure (works for pyplot-free Figures, in any backend)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def mask_summary(arr: np.ndarray) -> str:
    """One line: size, allowed fraction, whether it is causal (nothing above the diagonal)."""
    L = arr.shape[-1]
    causal = not np.triu(arr, k=1).any()
    return f"{L}x{L}, {int(arr.sum())} allowed ({arr.mean():.1%}), {'causal' if causal else 'NOT causal'}"


class MaskViewer(widgets.VBox):
    """An ipywidgets + matplotlib view of an attention mask ([L,L] or a batch of them).

    With a batch a ``batch`` IntSlider (``self.slider``) selects the row; ``self.figure``
    is the current matplotlib Figure, shown as a PNG in ``self.image`` (so it displays
    whatever the notebook's matplotlib backend). ``pieces``: one list of named runs for
    all rows, or one list per row (``memkit.rl.row_pieces.row_pieces`` gives the latter).
    """

    def __init__(
        self,
        mask,
        tokens: Sequence[str] | Sequence[Sequence[str]] | None = None,
        row_labels: Sequence[str] | None = None,
        boundaries: Sequence[int] | None = None,
        title: str | None = None,
        pieces=None,
    ):
        self.masks = as_batch(mask)
        self.tokens, self.row_labels, self.boundaries, self.title = tokens, row_labels, boundaries, title
        self.pieces = pieces
        self.figure: Figure | None = None
        self.image = widgets.Image(format="png")
        self.info = widgets.HTML()
        self.slider = widgets.IntSlider(value=0, min=0, max=len(self.masks) - 1, description="batch")
        self.slider.observe(lambda change: self._draw(), names="value")
        controls = [self.slider] if len(self.masks) > 1 else []
        super().__init__(children=[*controls, self.info, self.image])
        self.add_class("mk-mask")
        self._draw()

    def _tokens_for(self, b: int):
        t = self.tokens
        if t is not None and len(t) and not isinstance(t[0], str):  # one token list per batch row
            return t[b]
        return t

    def _pieces_for(self, b: int):
        s = self.pieces
        if (
            s is not None
            and len(s)
            and isinstance(s[0], (list, tuple))
            and (not len(s[0]) or not isinstance(s[0][0], (int, str)))
        ):  # one list of runs per batch row
            return s[b]
        return s

    def _draw(self) -> None:
        b = self.slider.value
        arr = self.masks[b]
        self.figure = plot_mask(
            arr,
            tokens=self._tokens_for(b),
            title=self.title,
            row_labels=self.row_labels,
            boundaries=self.boundaries,
            pieces=self._pieces_for(b),
        )
        self.info.value = f"batch {b}: {mask_summary(arr)}"
        self.image.value = figure_png(self.figure)


__all__ = ["plot_mask", "MaskViewer", "as_batch", "as_numpy", "mask_summary", "figure_png"]
