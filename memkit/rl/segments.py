"""DCPO's training units (MemAct §3.3, Algorithm 1): segments cut at memory edits, sampled
round-robin over a prompt's trajectories.

A Prune&Write deletes records, so the next context is no longer an extension of the last one
(H_{t+1} is not a superset of H_t) and one causal forward over the trajectory would condition
later tokens on deleted ones. DCPO cuts the trajectory at each edit into segments

    sigma_i = (C_i, y_i)                                                        (eq. 2)

with a fixed prefix C_i: inside a segment each call's context extends the previous call's, so
in the paper's format the segment is one causal sequence (memkit's MemAct writes a record's
``[id]`` before it, so a row also holds each earlier output again as context; ``pack``'s
``mem1_exact`` trie stores the shared prefix once and stays exact). memkit cuts wherever a
call's context does not start with the previous call's context tokens: the call that prunes
ends its segment (it was generated under its pre-prune context) and the next call starts one. Any format works: every MEM1 call is a segment, a ReAct
trajectory is one.

Final segment (Algorithm 1, line 27): y_i holds only the calls after the last edit; the notes
that survive in its context are context, not trained again (the authors' code re-trains them).

Sampling (Algorithm 1, line 31, "trajectory-based round-robin", §3.3.1): exactly N_seg segments
per prompt. Trajectories are visited in a random order, round after round; a visit takes one of
the trajectory's segments not taken yet (uniformly), or, once all are taken, any of them (with
replacement). So every trajectory gets a segment before any gets a second (when N_seg allows).

The ``dcpo`` credit rule (eq. 4-6: every segment inherits its trajectory's advantage) is
registered here too.
"""

from __future__ import annotations

import zlib
from typing import Hashable, Sequence

import torch

from memkit.core.trajectory import TrainingUnit, Trajectory
from memkit.rl.advantages import grpo_advantages, grpo_advantages_loop
from memkit.rl.credit.registry import CreditBatch, register_credit


def segment_calls(traj: Trajectory) -> list[tuple[int, ...]]:
    """The trajectory's segments: runs of call indices whose contexts extend each other, each cut
    where a call's context does not start with the previous call's context tokens. Calls that
    generated nothing (cut off before generating) are left out; a segment is never empty.

    shape: ``T`` calls -> ``K + 1`` tuples of ascending call indices (a partition of the calls that
    generated tokens)."""
    if traj.is_tree:
        raise ValueError(f"segment_calls needs a chain; {traj.task_id!r} is a tree (train its paths: Trajectory.path)")
    out: list[list[int]] = []
    prev = None
    for i, call in enumerate(traj.calls):
        extends = prev is not None and list(call.context_ids[: len(prev)]) == prev
        if not extends:
            out.append([])
        if call.output_ids:
            out[-1].append(i)
        prev = list(call.context_ids)
    return [tuple(s) for s in out if s]


def segment_units(traj: Trajectory) -> list[TrainingUnit]:
    """:func:`segment_calls` as training units."""
    return [TrainingUnit(traj, s) for s in segment_calls(traj)]


def sampler_draws(counts: Sequence[int], n_seg: int, generator: torch.Generator) -> dict:
    """The random numbers one round-robin draw uses (so the sampler and its loop reference see
    the same ones): ``order`` a permutation of the trajectories with segments, ``keys [T, S]``
    (a trajectory takes its untaken segments in ascending key order) and ``u [n_seg]`` (the
    with-replacement picks)."""
    counts = torch.as_tensor(counts, dtype=torch.long)
    live = (counts > 0).nonzero(as_tuple=True)[0]
    order = live[torch.randperm(len(live), generator=generator)]
    keys = torch.rand(len(counts), max(int(counts.max()) if len(counts) else 0, 1), generator=generator)
    return {"order": order, "keys": keys, "u": torch.rand(max(n_seg, 0), generator=generator)}


def sample_segments(counts: Sequence[int], n_seg: int, draws: dict) -> torch.Tensor:
    """Round-robin segment sampling, vectorised over the ``n_seg`` slots.

    Slot s goes to trajectory ``order[s mod T']`` in round ``r = s div T'`` (T' = trajectories
    with segments); it takes that trajectory's r-th segment in key order while r < its count,
    else ``floor(u_s * count)``. shape: counts ``[T]`` -> ``[n_seg, 2]`` long (trajectory, segment)."""
    counts = torch.as_tensor(counts, dtype=torch.long)
    order, keys, u = draws["order"], draws["keys"], draws["u"]
    if n_seg <= 0 or len(order) == 0:
        return torch.zeros(0, 2, dtype=torch.long)
    s = torch.arange(n_seg)
    traj = order[s % len(order)]
    rnd = s // len(order)
    cols = torch.arange(keys.shape[1])
    ranked = torch.where(cols < counts[:, None], keys, torch.full_like(keys, float("inf"))).argsort(dim=1)
    fresh = ranked[traj, rnd.clamp(max=keys.shape[1] - 1)]
    again = (u[:n_seg] * counts[traj]).long().clamp(max=counts[traj] - 1)
    return torch.stack([traj, torch.where(rnd < counts[traj], fresh, again)], dim=1)


def sample_segments_loop(counts: Sequence[int], n_seg: int, draws: dict) -> list[tuple[int, int]]:
    """Loop reference for :func:`sample_segments`: visit trajectories round after round, each
    visit taking the untaken segment with the smallest key, or a uniform pick once none is left."""
    counts = [int(c) for c in counts]
    order = [int(i) for i in draws["order"]]
    taken = {i: [] for i in order}
    out, s = [], 0
    while order and s < n_seg:
        for i in order:
            if s == n_seg:
                break
            left = [j for j in range(counts[i]) if j not in taken[i]]
            if left:
                j = min(left, key=lambda j: float(draws["keys"][i, j]))
                taken[i].append(j)
            else:
                j = min(int(float(draws["u"][s]) * counts[i]), counts[i] - 1)
            out.append((i, j))
            s += 1
    return out


def dcpo_units(
    trajs: Sequence[Trajectory], n_seg: int, seed: int = 0, group_ids: Sequence[Hashable] | None = None
) -> list[TrainingUnit]:
    """DCPO's training batch: each prompt's trajectories segmented, then ``n_seg`` segments drawn
    round-robin per prompt (``n_seg <= 0``: every segment once, no sampling). A segment drawn
    twice is two units. The draw is seeded by ``seed`` and the prompt (so a resumed run repeats it).

    shape: ``N`` trajectories (``G`` prompts) -> ``G * n_seg`` units (fewer only for a prompt
    without any trained call)."""
    group_ids = [t.task_id for t in trajs] if group_ids is None else list(group_ids)
    groups: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    units: list[TrainingUnit] = []
    for g, members in groups.items():
        segs = [segment_calls(trajs[i]) for i in members]
        if n_seg <= 0:
            units += [TrainingUnit(trajs[i], s) for i, ss in zip(members, segs) for s in ss]
            continue
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(repr(g).encode()))
        counts = [len(ss) for ss in segs]
        for t, j in sample_segments(counts, n_seg, sampler_draws(counts, n_seg, gen)).tolist():
            units.append(TrainingUnit(trajs[members[t]], segs[t][j]))
    return units


# ----------------------------------------------------------------------------- the `dcpo` credit rule
def _dcpo_trajectory_advantages(cb: CreditBatch, cfg, loop: bool = False):
    """A(tau) of every trajectory (eq. 4): group statistics over all N_traj samples of the prompt
    (``dcpo.group_stats='all'``, the paper) or over the trajectories with a sampled segment
    (``'sampled'``, the authors' code; the others get 0 and are not trained)."""
    keep = (
        [True] * len(cb.group_ids)
        if cb.trained is None or cfg.dcpo.group_stats == "all"
        else [bool(k) for k in cb.trained.tolist()]
    )
    idx = [i for i, k in enumerate(keep) if k]
    groups = [cb.group_ids[i] for i in idx]
    norm = cfg.grpo_norm_std
    if loop:
        part = grpo_advantages_loop([float(cb.rewards[i]) for i in idx], groups, norm_std=norm)
        out = [0.0] * len(keep)
        for i, a in zip(idx, part):
            out[i] = a
        return out
    out = torch.zeros(len(keep))
    if idx:
        out[torch.tensor(idx)] = grpo_advantages(cb.rewards[torch.tensor(idx)], groups, norm_std=norm).float()
    return out


def dcpo_loop(cb: CreditBatch, cfg) -> list[list[float]]:
    """Loop reference for :func:`dcpo`: A(tau) of each row's trajectory on its trained tokens."""
    a = _dcpo_trajectory_advantages(cb, cfg, loop=True)
    m = cb.batch.loss_mask
    return [[a[int(cb.row_traj[b])] if m[b, t] > 0 else 0.0 for t in range(m.shape[1])] for b in range(m.shape[0])]


def _dcpo_units(trajs, cfg, seed: int):
    return dcpo_units(trajs, cfg.dcpo.segments, seed)


@register_credit("dcpo", dcpo_loop, units=_dcpo_units, paper="MemAct eq. 4-6, Algorithm 1 (DCPO)")
def dcpo(cb: CreditBatch, cfg):
    """DCPO: every sampled segment sigma of trajectory tau inherits tau's advantage.

    A(tau) = (R(tau) - mean(R_u)) / (std(R_u) + eps), R_u the rewards of prompt u's samples   (eq. 4)
    L = -E_u [ 1/|G(u)| sum_tau sum_{(C, y) in Sigma(tau)} J_clip(y | C, A(tau)) ]           (eq. 5-6)
    The units (segments, :func:`memkit.rl.segments.dcpo_units`) are the rows; ``agg =
    'seq-mean-token-mean'`` makes the loss eq. 5-6's sum over segments (N_seg per prompt).
    shape: rewards ``[N]`` -> advantages ``[B, L]`` (0 off ``loss_mask``).
    """
    a = _dcpo_trajectory_advantages(cb, cfg).to(cb.batch.loss_mask.device)
    return a[cb.row_traj.to(a.device)].unsqueeze(-1) * cb.batch.loss_mask.to(a.dtype), None


__all__ = [
    "segment_calls",
    "segment_units",
    "sampler_draws",
    "sample_segments",
    "sample_segments_loop",
    "dcpo_units",
    "dcpo",
    "dcpo_loop",
]
