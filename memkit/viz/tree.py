"""TreeViewer: a query's memory operation trees (Mem-T §3.2) drawn, one node at a time inspected.

    from memkit.viz import TreeViewer
    TreeViewer(query_trees.trees)    # the G trees of one query (scored: memkit.rl.mot.score_query)

The drawing (SVG) places each node at its depth, leaves left to right, coloured by its node
reward R(v) (eq. 10). Under it one button per node; a click shows that node's context and output
(the trace viewer's rendering), its observation, R(v), and both advantages: A_intra over its
tree and A_inter over all the query's trees (eq. 11-12), with A_total = their sum (eq. 13).
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from memkit.core.trajectory import Trajectory
from memkit.rl.mot import MoTConfig, tree_advantages, tree_nodes
from memkit.viz.html import render_call_html

X_STEP, Y_STEP, R = 46, 56, 14


def layout(tree: Trajectory) -> dict[int, tuple[float, int]]:
    """``{node: (x, depth)}``: leaves at x = 0, 1, 2, ... in order, a parent above its children's middle."""
    nodes, children = tree_nodes(tree)
    is_node = set(nodes)
    roots = [i for i in nodes if tree.calls[i].parent not in is_node]
    pos: dict[int, tuple[float, int]] = {}
    next_x = [0.0]

    def place(i: int, depth: int) -> float:
        kids = children[i]
        if not kids:
            x = next_x[0]
            next_x[0] += 1
        else:
            xs = [place(k, depth + 1) for k in kids]
            x = sum(xs) / len(xs)
        pos[i] = (x, depth)
        return x

    for r in roots:
        place(r, 1)
    return pos


def _colour(r: float | None) -> str:
    """Red (0) to green (>= 1) by node reward; grey when unscored."""
    if r is None:
        return "#bbbbbb"
    t = max(0.0, min(1.0, r))
    return f"rgb({int(220 - 150 * t)},{int(90 + 110 * t)},90)"


def tree_svg(tree: Trajectory, selected: int | None = None) -> str:
    """The tree as an SVG: a root (the built memory + question), then every retrieval node."""
    pos = layout(tree)
    if not pos:
        return "<div>(no retrieval calls)</div>"
    width = int(X_STEP * (max(x for x, _ in pos.values()) + 2))
    height = int(Y_STEP * (max(d for _, d in pos.values()) + 1) + R)
    root_x = (min(x for x, d in pos.values() if d == 1) + max(x for x, d in pos.values() if d == 1)) / 2

    def xy(x, d):
        return X_STEP * (x + 1), Y_STEP * d + R

    parts = [f'<svg class="mk-tree-svg" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for i, (x, d) in pos.items():
        p = tree.calls[i].parent
        px, pd = pos.get(p, (root_x, 0))
        (x1, y1), (x2, y2) = xy(px, pd), xy(x, d)
        parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#888"/>')
    rx, ry = xy(root_x, 0)
    parts.append(f'<rect x="{rx - R}" y="{ry - R}" width="{2 * R}" height="{2 * R}" fill="#ddd" stroke="#555"/>')
    for i, (x, d) in pos.items():
        cx, cy = xy(x, d)
        call = tree.calls[i]
        stroke = "#000" if i == selected else "#555"
        width_ = 3 if i == selected else 1
        parts.append(
            f'<circle class="mk-tree-dot" cx="{cx}" cy="{cy}" r="{R}" fill="{_colour(call.reward)}" '
            f'stroke="{stroke}" stroke-width="{width_}"><title>node {i}: R={call.reward}</title></circle>'
            f'<text x="{cx}" y="{cy + 4}" font-size="10" text-anchor="middle">{i}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


class TreeViewer(widgets.VBox):
    """The trees of one query; ``select(tree, node)`` shows a node (what a click on its button does).

    Attributes: ``selector`` (Dropdown over trees, or None), ``drawing`` (HTML with the SVG),
    ``buttons`` (one Button per node, class ``mk-tree-node``), ``detail`` (HTML, class ``mk-tree-detail``).
    """

    def __init__(self, trees: Trajectory | list[Trajectory], cfg: MoTConfig = MoTConfig(), index: int = 0):
        self.trees = [trees] if isinstance(trees, Trajectory) else list(trees)
        if not self.trees:
            raise ValueError("TreeViewer needs at least one tree")
        self.cfg, self._k, self.node = cfg, index, None
        self._intra, self._inter = self._advantages()
        self.selector = None
        if len(self.trees) > 1:
            self.selector = widgets.Dropdown(
                options=[(f"tree {k}", k) for k in range(len(self.trees))], value=index, description="tree"
            )
            self.selector.observe(lambda ch: self.select(ch["new"]), names="value")
        self.drawing, self.detail = widgets.HTML(), widgets.HTML()
        self.drawing.add_class("mk-tree-drawing")
        self.detail.add_class("mk-tree-detail")
        self.button_box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
        self.buttons: list[widgets.Button] = []
        super().__init__(
            children=[*([self.selector] if self.selector else []), self.drawing, self.button_box, self.detail]
        )
        self.add_class("mk-tree")
        self.select(index)

    @property
    def tree(self) -> Trajectory:
        return self.trees[self._k]

    def _advantages(self):
        """``(intra, inter)``: ``{(tree, node): A}`` from the node rewards in ``Call.reward``."""
        where = [(t, i) for t, tree in enumerate(self.trees) for i in tree_nodes(tree)[0]]
        if not where or any(self.trees[t].calls[i].reward is None for t, i in where):
            return {}, {}
        r = [float(self.trees[t].calls[i].reward) for t, i in where]
        import torch

        trees, query = [t for t, _ in where], [0] * len(where)
        intra = tree_advantages(torch.tensor(r), trees, query, MoTConfig(eps=self.cfg.eps, inter=False)).tolist()
        inter = tree_advantages(torch.tensor(r), trees, query, MoTConfig(eps=self.cfg.eps, intra=False)).tolist()
        return dict(zip(where, intra)), dict(zip(where, inter))

    def select(self, tree: int, node: int | None = None) -> None:
        """Show tree ``tree`` and (default: its first node) node ``node``."""
        rebuild = tree != self._k or not self.buttons
        self._k = tree
        nodes = tree_nodes(self.tree)[0]
        if rebuild:
            self.buttons = []
            for i in nodes:
                b = widgets.Button(
                    description=f"node {i}",
                    tooltip=f"R = {self.tree.calls[i].reward}",
                    layout=widgets.Layout(width="auto"),
                )
                b.add_class("mk-tree-node")
                b.on_click(lambda _b, i=i: self.select(self._k, i))
                self.buttons.append(b)
            self.button_box.children = self.buttons
        self.node = node if node is not None else (nodes[0] if nodes else None)
        for b, i in zip(self.buttons, nodes):
            b.button_style = "info" if i == self.node else ""
        self.drawing.value = tree_svg(self.tree, self.node)
        self.detail.value = self.node_html(self.node) if self.node is not None else "(no nodes)"

    def node_html(self, i: int) -> str:
        """Node ``i`` of the current tree: R(v), A_intra, A_inter, A_total, then its call."""
        call = self.tree.calls[i]
        key = (self._k, i)

        def num(x):
            return "-" if x is None else f"{x:+.3f}"

        intra, inter = self._intra.get(key), self._inter.get(key)
        total = None if intra is None else (intra if self.cfg.intra else 0) + (inter if self.cfg.inter else 0)
        head = (
            f'<div class="mk-head">node {i} &middot; R(v) = {num(call.reward)} &middot; A_intra = {num(intra)} '
            f"&middot; A_inter = {num(inter)} &middot; A_total = {num(total)}"
            f"{'' if call.valid else ' &middot; invalid: ' + html.escape(str(call.reason))}</div>"
        )
        return head + render_call_html(self.tree, i, header=False)
