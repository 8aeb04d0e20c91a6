"""Notebook viewers: trajectories (TraceViewer, to_html), attention masks (MaskViewer, plot_mask) and
memory operation trees (TreeViewer)."""

from memkit.viz.colors import PALETTE, color_for
from memkit.viz.html import render_call_html, to_html
from memkit.viz.mask import MaskViewer, plot_mask
from memkit.viz.trace import TraceViewer
from memkit.viz.tree import TreeViewer, tree_svg

__all__ = [
    "TraceViewer",
    "TreeViewer",
    "tree_svg",
    "to_html",
    "render_call_html",
    "MaskViewer",
    "plot_mask",
    "PALETTE",
    "color_for",
]
