"""TraceViewer: step through the calls of a trajectory in a notebook.

    from memkit.viz import TraceViewer
    TraceViewer(traj)            # one trajectory: a "turn" slider over its calls
    TraceViewer([t0, t1, t2])    # several: a "trajectory" dropdown as well

The view under the slider is :func:`memkit.viz.html.render_call_html` (the exact context
with spans coloured by kind, the output coloured by tag, the observation, sizes per part,
the memory diff against the previous call of the same role, MemAct's pruned records).
"""

from __future__ import annotations

import ipywidgets as widgets

from memkit.core.trajectory import Trajectory
from memkit.viz.html import render_call_html, trajectory_header_html


class TraceViewer(widgets.VBox):
    """An ipywidgets view of one or more trajectories, one call at a time.

    Attributes: ``slider`` (IntSlider, description "turn", class ``mk-turn-slider``),
    ``html`` (the HTML widget showing the call), ``selector`` (Dropdown or None).
    """

    def __init__(self, trajectory: Trajectory | list[Trajectory], index: int = 0):
        trajs = [trajectory] if isinstance(trajectory, Trajectory) else list(trajectory)
        if not trajs:
            raise ValueError("TraceViewer needs at least one trajectory")
        self.trajectories = trajs
        self.slider = widgets.IntSlider(
            value=0,
            min=0,
            max=0,
            step=1,
            description="turn",
            continuous_update=True,
            layout=widgets.Layout(width="60%"),
        )
        self.slider.add_class("mk-turn-slider")
        self.html = widgets.HTML()
        self.html.add_class("mk-trace-html")
        self.selector = None
        controls = [self.slider]
        if len(trajs) > 1:
            options = [
                (f"{k}: {t.method} {t.task_id} #{t.group_index} (reward {t.reward})", k) for k, t in enumerate(trajs)
            ]
            self.selector = widgets.Dropdown(
                options=options, value=index, description="trajectory", layout=widgets.Layout(width="60%")
            )
            self.selector.observe(self._on_traj, names="value")
            controls.insert(0, self.selector)
        self._k = index
        super().__init__(children=[*controls, self.html])
        self.add_class("mk-trace")
        self.slider.observe(self._on_turn, names="value")
        self._reset_slider()
        self._refresh()

    @property
    def trajectory(self) -> Trajectory:
        """The trajectory currently shown."""
        return self.trajectories[self._k]

    def render_call_html(self, i: int) -> str:
        """HTML of call ``i`` of the current trajectory (the same fragment ``to_html`` uses)."""
        return render_call_html(self.trajectory, i)

    def _reset_slider(self) -> None:
        n = len(self.trajectory.calls)
        self.slider.value = 0  # before max so the value is always in range
        self.slider.max = max(n - 1, 0)
        self.slider.disabled = n <= 1

    def _refresh(self) -> None:
        traj = self.trajectory
        if not traj.calls:
            self.html.value = trajectory_header_html(traj) + "<div>(no calls)</div>"
        else:
            self.html.value = self.render_call_html(self.slider.value)

    def _on_turn(self, change) -> None:
        self._refresh()

    def _on_traj(self, change) -> None:
        self._k = change["new"]
        with self.slider.hold_trait_notifications():
            self._reset_slider()
        self._refresh()
