"""Efficiency metrics of the papers: token counts, dependency length, tool calls and memory actions.

Per trajectory (a trajectory is a list of LLM calls; call i has n_p(i) context tokens and n_o(i)
generated tokens). Context tokens of the kinds in ``exclude`` (default the system prompt) are not
counted, as MEM1 App. B.4.1 does for peak tokens and dependency; we apply the same convention to
MemPO's TT/PT so all columns are comparable.

* peak tokens (MEM1 App. B.4.1: "the maximum number of tokens in any single sequence
  throughout the agent's entire trajectory") = max_i n_p(i) + n_o(i).
* TT (MemPO §5.1: "total number of tokens consumed to solve a question") = sum_i n_p(i) +
  n_o(i): every call re-reads its whole context, as an API bills it. (MemPO Table 2 is
  consistent with this reading: ReAct's TT is ~5x its PT, which a once-counted history
  could not give.)
* PT (MemPO §5.1: "maximum number of tokens consumed in a single step") = max over turns t
  of sum_{i in turn t} n_p(i) + n_o(i). A step is one interaction turn (``Call.turn``); it
  equals peak tokens except where a turn makes two calls (MemSearcher's memory update).
* dependency: see :func:`dependency`.

The vectorised metrics come with Python-loop references (``*_loop``) that the tests hold them to.
Accuracy (EM, F1) and the eval table that puts both together are :mod:`memkit.metrics.qa`.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from memkit.core.trajectory import Call, Trajectory

EXCLUDE = ("system",)
#: output tags counted as one tool call each
TOOL_TAGS = ("search", "tool_call")
#: output tags counted as one memory action each (MemPO <mem>, MemSearcher <memory>)
MEMORY_TAGS = ("mem", "memory")
#: the tags of one MemAct Prune&Write, a_mem = (I_target, c) (MemAct §3.2 eq. 1): the ids in
#: <prune> and the note in <note> are two arguments of *one* action, not two actions
PRUNE_WRITE_TAGS = ("prune", "note", "prune_write")
_TOOL_NAME = re.compile(r"""["']name["']\s*:\s*["']([^"']*)["']""")


def _excluded(call: Call, exclude: Sequence[str]) -> int:
    n = sum(max(0, min(e, call.n_context) - max(s, 0)) for kind in exclude for s, e in call.context_spans.get(kind, ()))
    return min(n, call.n_context)


def _sizes(traj: Trajectory, exclude: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-call (n_p, n_o) with ``exclude`` kinds taken out of the context."""
    n_p = np.array([c.n_context - _excluded(c, exclude) for c in traj.calls], dtype=np.int64)
    n_o = np.array([c.n_output for c in traj.calls], dtype=np.int64)
    return n_p, n_o


def peak_tokens(traj: Trajectory, exclude: Sequence[str] = EXCLUDE) -> int:
    """MEM1 peak token usage: max over calls of context + output tokens (0 for no calls)."""
    n_p, n_o = _sizes(traj, exclude)
    return int((n_p + n_o).max(initial=0))


def total_tokens(traj: Trajectory, exclude: Sequence[str] = EXCLUDE) -> int:
    """MemPO TT: sum over calls of context + output tokens."""
    n_p, n_o = _sizes(traj, exclude)
    return int((n_p + n_o).sum())


def step_peak_tokens(traj: Trajectory, exclude: Sequence[str] = EXCLUDE) -> int:
    """MemPO PT: max over turns of the tokens consumed by that turn's calls."""
    n_p, n_o = _sizes(traj, exclude)
    if not traj.calls:
        return 0
    _, turn = np.unique([c.turn for c in traj.calls], return_inverse=True)
    return int(np.bincount(turn, weights=n_p + n_o).max())


def dependency(trajs: Trajectory | Sequence[Trajectory], exclude: Sequence[str] = EXCLUDE, formula: str = "paper"):
    """MEM1 dependency length (App. B.4.1, after Zhang et al. 2025), vectorised over all calls.

    "The total number of historical tokens on which each generated token effectively
    depends." With n_p(i) prefix and n_o(i) output tokens at step i, the paper prints

        formula="paper":   Dependency = sum_i (2 n_o(i) + n_p(i)) * n_o(i) / 2.

    Counting literally (the j-th generated token, j = 0..n_o-1, sees n_p + j tokens) gives

        formula="causal":  Dependency = sum_i sum_j (n_p(i) + j) = sum_i (2 n_p(i) + n_o(i) - 1) n_o(i) / 2,

    i.e. the printed formula has n_p and n_o swapped; we default to the printed one so
    numbers are comparable with the paper's tables and offer the literal count to compare.
    The system prompt is excluded (``exclude``), as in the paper. Returns a float for one
    trajectory, a list of floats for a sequence. :func:`dependency_loop` is the reference.
    """
    single = isinstance(trajs, Trajectory)
    trajs = [trajs] if single else list(trajs)
    if formula not in ("paper", "causal"):
        raise ValueError(f"unknown dependency formula {formula!r}; choose 'paper' or 'causal'")
    sizes = [_sizes(t, exclude) for t in trajs]
    owner = np.repeat(np.arange(len(trajs)), [len(t.calls) for t in trajs])
    n_p = np.concatenate([s[0] for s in sizes] + [np.zeros(0, np.int64)]).astype(np.float64)
    n_o = np.concatenate([s[1] for s in sizes] + [np.zeros(0, np.int64)]).astype(np.float64)
    per_call = (2 * n_o + n_p) * n_o / 2 if formula == "paper" else (2 * n_p + n_o - 1) * n_o / 2
    out = np.bincount(owner, weights=per_call, minlength=len(trajs)).tolist()
    return out[0] if single else out


def dependency_loop(traj: Trajectory, exclude: Sequence[str] = EXCLUDE, formula: str = "paper") -> float:
    """Naive reference for :func:`dependency` on one trajectory: Python loops over calls
    (and, for ``"causal"``, over every generated token and what it attends to)."""
    total = 0.0
    for call in traj.calls:
        n_p = call.n_context - _excluded(call, exclude)
        n_o = call.n_output
        if formula == "paper":
            total += (2 * n_o + n_p) * n_o / 2
        else:
            for j in range(n_o):
                total += n_p + j
    return total


def _span_text(call: Call, tag: str, k: int) -> str:
    spans = call.output_char_spans.get(tag, [])
    return call.output_text[spans[k][0] : spans[k][1]] if k < len(spans) else ""


def _is_prune_call(call: Call, k: int) -> bool:
    """A MemAct Prune&Write issued as the k-th ``<tool_call>``: its function ``"name"`` (e.g.
    ``prune_context``) names a prune. Only the name is read, so a search whose *query* says
    "prune" stays a search."""
    m = _TOOL_NAME.search(_span_text(call, "tool_call", k))
    return bool(m and "prune" in m.group(1).lower())


def tool_calls(traj: Trajectory) -> int:
    """Output spans tagged ``search`` or ``tool_call``, except ``tool_call``s whose text names a
    prune (MemAct's Prune&Write is a memory action, counted by :func:`memory_actions`)."""
    n = 0
    for c in traj.calls:
        n += len(c.output_spans.get("search", []))
        n += sum(not _is_prune_call(c, k) for k in range(len(c.output_spans.get("tool_call", []))))
    return n


def memory_actions(traj: Trajectory) -> int:
    """Memory edits, one per action whatever its number of tags. Per call:

    * each output span tagged ``mem`` (MemPO) or ``memory`` (MemSearcher);
    * one MemAct Prune&Write per ``<prune>``/``<note>`` pair: a_mem = (I_target, c) is one
      action (MemAct §3.2 eq. 1) written as two tags, so a call counts
      max(#prune, #note, #prune_write) spans, not their sum (a ``<note>`` with no ``<prune>``,
      a write that deletes nothing, is one action too; so is the A-MEM baseline's ``<note>``, the note
      each of its calls adds to the store);
    * each prune ``tool_call`` (the paper's ``prune_context`` function-call form);
    * a ``role="memory"`` call with none of these (a bare MemSearcher memory update): one.

    MEM1's internal state ``<think>`` is not counted: it is rewritten on every turn as part of
    the reasoning, not a separate action (and ``<think>`` is plain reasoning in every other
    format), so MEM1 and ReAct score 0.
    """
    n = 0
    for c in traj.calls:
        m = sum(len(c.output_spans.get(t, [])) for t in MEMORY_TAGS)
        m += max(len(c.output_spans.get(t, [])) for t in PRUNE_WRITE_TAGS)
        m += sum(_is_prune_call(c, k) for k in range(len(c.output_spans.get("tool_call", []))))
        n += m if (m or c.role != "memory") else 1
    return n


def context_tokens_per_turn(
    trajs: Sequence[Trajectory], role: str | None = "act", exclude: Sequence[str] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """MemSearcher Fig. 3: mean number of tokens in the LLM context at each turn.

    Turn t (1-based) of a trajectory is its t-th call with ``role`` (``None``: every call), so
    a MemSearcher turn is counted by its act call and a ReAct call is one turn. Context tokens
    of the kinds in ``exclude`` are left out (default none: the paper counts the whole
    context). Calls without a context are skipped: the rollout engine records a turn-limit
    failure as a call that was never made (no context, no output). Returns ``(mean, count)``,
    both ``[T]`` with T the most turns of any trajectory: ``mean[t-1]`` averages turn t over the
    ``count[t-1]`` trajectories that reached it. :func:`context_tokens_per_turn_loop` is the
    reference.
    """
    turn_idx, n_ctx = [], []
    for t in trajs:
        n_p, _ = _sizes(t, exclude)
        keep = np.array([(role is None or c.role == role) and c.n_context > 0 for c in t.calls], dtype=bool)
        sel = n_p[keep] if len(keep) else n_p
        turn_idx.append(np.arange(len(sel)))
        n_ctx.append(sel)
    turn = np.concatenate(turn_idx + [np.zeros(0, np.int64)]).astype(np.int64)
    size = np.concatenate(n_ctx + [np.zeros(0, np.int64)]).astype(np.float64)
    count = np.bincount(turn)
    mean = np.bincount(turn, weights=size, minlength=len(count)) / np.maximum(count, 1)
    return mean, count


def context_tokens_per_turn_loop(
    trajs: Sequence[Trajectory], role: str | None = "act", exclude: Sequence[str] = ()
) -> tuple[list[float], list[int]]:
    """Loop reference for :func:`context_tokens_per_turn` (lists of per-turn sums and counts)."""
    sums: list[float] = []
    counts: list[int] = []
    for t in trajs:
        turn = 0
        for c in t.calls:
            if (role is not None and c.role != role) or not c.context_ids:
                continue
            if turn == len(sums):
                sums.append(0.0)
                counts.append(0)
            sums[turn] += c.n_context - _excluded(c, exclude)
            counts[turn] += 1
            turn += 1
    return [s / n for s, n in zip(sums, counts)], counts


# ------------------------------------------------------------------------------ per run
def rollout_tokens(history: list[dict]) -> int:
    """Tokens the policy generated in a run's training rollouts (its step rows): sum over steps of ``response_tokens x
    n_trajectories`` (the mean output tokens per trajectory times the step's trajectories, all processes).
    A step row without them (a plan that logs no rollout stats) counts 0."""
    return int(round(sum(r.get("response_tokens", 0.0) * r.get("n_trajectories", 0) for r in history)))
