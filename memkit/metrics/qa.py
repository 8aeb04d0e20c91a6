"""Accuracy metrics of the papers, and the table ``memkit eval`` prints.

Accuracy (MEM1 App. B.4.1, MemPO §5.1, all following SQuAD's official script):

* ``normalize_answer``: lower-case, drop punctuation, drop the articles a/an/the, collapse
  whitespace.
* EM = 1 if the normalised prediction equals any normalised gold alias, else 0.
* F1 = max over gold aliases of 2pr/(p+r), with p = c/l, r = c/g, c the size of the
  multiset intersection of prediction and gold tokens, l and g their token counts.
* Multi-objective QA (MEM1 §3.3): k questions in one task, answers separated by ``;``;
  each question is scored on its own slot; a task's score is the sum over its questions.
  If the number of answers is not k, no slot can be aligned, so every question scores 0.

The efficiency metrics (peak tokens, TT/PT, dependency, tool calls, memory actions) are
:mod:`memkit.metrics.efficiency`; :func:`summarize` puts both in one row of the eval table.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Sequence

import numpy as np

from memkit.core.trajectory import Trajectory
from memkit.metrics.efficiency import (
    EXCLUDE,
    dependency,
    memory_actions,
    peak_tokens,
    step_peak_tokens,
    tool_calls,
    total_tokens,
)

_PUNCT = frozenset(string.punctuation)


# ----------------------------------------------------------------------------- accuracy
def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower, strip punctuation, drop a/an/the, collapse whitespace."""
    s = "".join(ch for ch in str(s).lower() if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _golds(golds) -> list[str]:
    if isinstance(golds, str):
        golds = [golds]
    golds = [g for g in (golds or []) if isinstance(g, str)]
    if not golds:
        raise ValueError("no gold answer given: pass a str or a non-empty list of gold aliases")
    return golds


def exact_match(pred: str | None, golds) -> float:
    """1.0 if normalised ``pred`` equals any normalised gold alias; None/empty pred -> 0."""
    golds = _golds(golds)
    if not pred or not normalize_answer(pred):
        return 0.0
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in golds))


def f1(pred: str | None, golds) -> float:
    """Token-multiset F1, max over gold aliases (module docstring); None/empty pred -> 0."""
    golds = _golds(golds)
    pt = normalize_answer(pred).split() if pred else []
    if not pt:
        return 0.0
    best = 0.0
    for g in golds:
        gt = normalize_answer(g).split()
        c = sum((Counter(pt) & Counter(gt)).values())
        if c:
            p, r = c / len(pt), c / len(gt)
            best = max(best, 2 * p * r / (p + r))
    return best


def split_answers(text: str | None, k: int | None = None) -> list[str]:
    """Answers of a multi-objective task: ``text`` split on ``;``, each stripped (MEM1 §3.3).

    A single trailing ``;`` ("a; b;") is tolerated; None/empty text -> []. ``k == 1`` keeps the
    whole text as the one answer (plain QA: a ';' inside it is no separator). The agents check
    the answer count with this rule and :func:`score_multi` aligns slots with it.
    """
    if k is not None and k <= 1:
        return [(text or "").strip()]
    if not text or not text.strip():
        return []
    parts = [p.strip() for p in text.split(";")]
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


_METRICS = {"em": exact_match, "f1": f1}


def slot_scores(pred: str | None, golds: Sequence[Sequence[str]], metric=exact_match) -> list[float]:
    """Per-question scores of a k-question answer, slot j against ``golds[j]`` (the rule above); ``[]``
    when the answer count is not k. Never raises: a question whose aliases cannot be scored scores 0."""
    if len(slots := split_answers(pred or "", len(golds))) != len(golds):
        return []
    out = []
    for a, g in zip(slots, golds):
        try:
            out.append(float(metric(a, g)))
        except (ValueError, TypeError):  # an agent's reward scores any task
            out.append(0.0)
    return out


def score_multi(pred: str | None, golds: Sequence[Sequence[str]], metric: str = "em") -> dict:
    """Score a k-question answer: ``{"per_question": [...], "sum": s, "mean": s / k}``; ``golds[j]``
    holds the aliases of question j. Slots as :func:`slot_scores` (k == 1: the whole prediction is
    the answer); a wrong answer count scores every question 0 (MEM1 §3.3: matched by position)."""
    if metric not in _METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(_METRICS)}")
    if isinstance(golds, str) or not golds or any(isinstance(g, str) or not g for g in golds):
        raise ValueError(
            "golds must be a non-empty list of alias lists, one per question, "
            "e.g. [['Paris'], ['1999', 'nineteen ninety-nine']] (Task.golds)"
        )
    k = len(golds)
    per = slot_scores(pred, golds, _METRICS[metric]) or [0.0] * k
    return {"per_question": per, "sum": float(sum(per)), "mean": float(sum(per)) / k}


# ------------------------------------------------------------------------------ summary
COLUMNS = (
    "method",
    "k",
    "n",
    "em",
    "em_1hop",
    "em_bridge",
    "em_comparison",
    "f1",
    "peak_tokens",
    "pt",
    "tt",
    "dependency",
    "tool_calls",
    "memory_actions",
    "seconds",
    "wall_seconds",
    "invalid_rate",
)


def summarize(trajs: Sequence[Trajectory], exclude: Sequence[str] = EXCLUDE) -> dict:
    """One row of the eval table: means over trajectories of every metric above, and
    ``context_tokens``, the mean context length per call (MemAct Fig. 3's x axis).

    ``em``/``f1`` are means per *question* (a k-question task contributes k scores, so the
    numbers are comparable across k; multiply by k for MEM1's per-task sums). ``seconds`` is
    the mean per trajectory of its calls' wall time; ``invalid_rate`` the fraction of
    trajectories that ended in an invalid turn.
    """
    trajs = list(trajs)
    if not trajs:
        raise ValueError("summarize() got no trajectories; roll some out first (memkit.lab.evaluation.rollout)")
    em, f1s = [], []
    for t in trajs:
        if not t.golds:
            raise ValueError(f"trajectory {t.task_id!r} has no golds; set Trajectory.golds = task.golds")
        em += score_multi(t.answer, t.golds, "em")["per_question"]
        f1s += score_multi(t.answer, t.golds, "f1")["per_question"]
    mean = lambda xs: float(np.mean(xs))  # noqa: E731
    return {
        "n": len(trajs),
        "em": mean(em),
        "f1": mean(f1s),
        "peak_tokens": mean([peak_tokens(t, exclude) for t in trajs]),
        "pt": mean([step_peak_tokens(t, exclude) for t in trajs]),
        "tt": mean([total_tokens(t, exclude) for t in trajs]),
        "dependency": mean(dependency(trajs, exclude)),
        "context_tokens": float(np.mean([c.n_context for t in trajs for c in t.calls] or [0.0])),
        "tool_calls": mean([tool_calls(t) for t in trajs]),
        "memory_actions": mean([memory_actions(t) for t in trajs]),
        "seconds": mean([sum(c.seconds for c in t.calls) for t in trajs]),
        "invalid_rate": mean([not t.valid for t in trajs]),
    }


def em_by_kind(trajs: Sequence[Trajectory], tasks) -> dict[str, float]:
    """EM per question, split by question kind: ``{"em_1hop": ..., "em_bridge": ..., "em_comparison": ...}``.

    ``tasks``: the tasks the trajectories answered (matched by ``Trajectory.task_id``); only the
    kinds they ask appear. Where a model fails shows here: the tiny SFT'd models answer comparison
    questions near the 0.5 that always naming one of the two entities would score, well below
    1-hop and bridge questions (measured: docs/findings.md).
    """
    by_id = {t.id: t for t in tasks}
    scores: dict[str, list[float]] = {}
    for traj in trajs:
        task = by_id.get(traj.task_id)
        if task is None:
            raise ValueError(
                f"trajectory {traj.task_id!r} answers none of the tasks given; pass the tasks it rolled out"
            )
        for q, em in zip(task.questions, score_multi(traj.answer, traj.golds, "em")["per_question"]):
            scores.setdefault(q.kind, []).append(em)
    return {f"em_{kind}": float(np.mean(v)) for kind, v in sorted(scores.items())}


def _fmt(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
        return str(v)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if not math.isfinite(v):
        return str(v)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3f}"


def format_table(rows: Sequence[dict]) -> str:
    """Plain-text table of summary rows (known columns first, in :data:`COLUMNS` order)."""
    rows = list(rows)
    if not rows:
        return "(no rows)"
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    for r in rows:
        cols += [c for c in r if c not in cols]
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, width))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in width])] + [line(r) for r in cells])
