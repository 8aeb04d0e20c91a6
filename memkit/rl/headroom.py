"""Exploration headroom: how much greedy EM can RL reach from a policy by sampling it?

A policy-gradient update only reinforces what the policy *samples*. An answer that greedy
decoding gets wrong can become right after RL only if the sampling policy sometimes writes it;
if none of N samples ever does, the advantage at that point is the same for the whole group and
nothing pushes the policy there. So before training, compare, per answer slot (question ``j``
of task ``i``), greedy correctness ``g_ij`` in {0, 1} with the share ``s_ij`` of N samples at
temperature T that answer it right:

    headroom  = (1 / S) Σ_ij (1 - g_ij) · 1[s_ij > 0]         (greedy wrong, some sample right)
    EM bound  = (1 / S) Σ_ij g_ij  +  headroom               (S = number of slots)

The bound is optimistic: it assumes RL turns every slot it ever sampled right into a greedy
answer (and breaks none). The sample accuracy on greedy-*right* slots says how much of an RL
run's training-reward rise is mere sharpening (sampling catching up with greedy), which moves
the greedy EM not at all. Slots are scored by EM with the count rule of the methods' rewards
(:func:`memkit.metrics.qa.slot_scores`: a wrong answer count scores every slot 0; an invalid
trajectory answers nothing) — EM, also where the training reward is F1 (MemSearcher eq. 9).
:func:`memkit.lab.evaluation.measure_headroom` rolls out a policy spec and calls this.
"""

from __future__ import annotations

from collections import defaultdict

from memkit.core.trajectory import Trajectory
from memkit.metrics.qa import slot_scores


def slot_em(traj: Trajectory) -> list[float]:
    """EM of each of the trajectory's k answer slots (:func:`memkit.metrics.qa.slot_scores`; 0 for
    all when the trajectory is invalid or answers another number of questions)."""
    if not traj.golds:
        raise ValueError(f"trajectory {traj.task_id!r} has no golds; roll out world tasks (Task.golds) to score it")
    return slot_scores(traj.answer if traj.valid else None, traj.golds) or [0.0] * len(traj.golds)


def exploration_headroom(greedy: list[Trajectory], samples: list[Trajectory]) -> dict:
    """The module's quantities from one greedy trajectory per task and N sampled ones per task.

    Returns ``{"slots", "greedy_em", "greedy_wrong", "wrong_reachable", "headroom", "em_bound",
    "sample_em", "sample_em_greedy_right", "sample_em_greedy_wrong", "n_samples"}`` (EM per slot;
    ``wrong_reachable``: greedy-wrong slots that at least one sample answers right).
    """
    if not greedy:
        raise ValueError("no greedy trajectories: roll out the tasks once with temperature 0")
    greedy_ids = [t.task_id for t in greedy]
    if len(set(greedy_ids)) != len(greedy_ids):
        raise ValueError(
            "greedy has several trajectories for one task; roll out the tasks once (n=1) with temperature 0"
        )
    stray = sorted({t.task_id for t in samples} - set(greedy_ids))
    if stray:
        raise ValueError(
            f"samples of tasks without a greedy trajectory: {stray[:3]}; roll out the same tasks both ways"
        )
    by_task: dict[str, list[list[float]]] = defaultdict(list)
    for t in samples:
        by_task[t.task_id].append(slot_em(t))
    counts = {t.task_id: len(by_task.get(t.task_id, ())) for t in greedy}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise ValueError(
            f"every greedy task needs the same number (>= 1) of samples, got {sorted(set(counts.values()))}; "
            "roll out the same tasks with n=N"
        )
    n = counts[greedy[0].task_id]
    right = wrong = reachable = 0
    acc_right = acc_wrong = 0.0
    for t in greedy:
        for j, g in enumerate(slot_em(t)):
            share = sum(s[j] for s in by_task[t.task_id]) / n
            if g > 0:
                right += 1
                acc_right += share
            else:
                wrong += 1
                acc_wrong += share
                reachable += share > 0
    slots = right + wrong
    return {
        "slots": slots,
        "greedy_em": right / slots,
        "greedy_wrong": wrong,
        "wrong_reachable": reachable,
        "headroom": reachable / slots,
        "em_bound": (right + reachable) / slots,
        "sample_em": (acc_right + acc_wrong) / slots,
        "sample_em_greedy_right": acc_right / right if right else float("nan"),
        "sample_em_greedy_wrong": acc_wrong / wrong if wrong else float("nan"),
        "n_samples": n,
    }
