"""The ``mempo`` credit rule (MemPO eq. 3, 6-9): the trajectory advantage A^T on every trained token,
plus the group-normalised memory advantage A^M on the tokens of each call's ``<mem>`` span (the
equations: :func:`mempo`).

R_M, the memory reward each ``Call.reward`` holds, is computed by the answer-probability probes of
:mod:`memkit.rl.memory_reward` (eq. 4-5); the rule names :func:`~memkit.rl.memory_reward.prepare_memory_reward`
as its ``prepare`` hook, so the update scores every memory under the current policy first. Registered
when :mod:`memkit.rl.credit` loads; :func:`mempo_loop` is its token-by-token reference.
"""

from __future__ import annotations

import torch

from memkit.rl.advantages import grpo_advantages, grpo_advantages_loop
from memkit.rl.credit.registry import (
    CreditBatch,
    group_advantages,
    group_advantages_loop,
    register_credit,
    scored_calls,
)
from memkit.rl.memory_reward import memory_span, prepare_memory_reward


def _memories(cb: CreditBatch, cfg) -> tuple[list[tuple[int, int]], list[float], list]:
    """Every scored memory of the update: (trajectory, call), its R_M, and its normalisation group:
    the task (``pooled``, eq. 6-8: all (i, t) of the N samples) or (task, turn) (``per_step``)."""
    per_step = cfg.mem_reward.norm == "per_step"
    if not cb.trajectories:
        raise ValueError("credit rule 'mempo' needs CreditBatch.trajectories (the update's trajectories)")
    where, r = scored_calls(
        cb,
        lambda call: memory_span(call) is not None,
        "a call that wrote <mem> needs its memory reward: score it with "
        "memkit.rl.memory_reward.score_memories (the update does, by the rule's prepare hook)",
    )
    keys = [(cb.group_ids[i], cb.trajectories[i].calls[c].turn) if per_step else cb.group_ids[i] for i, c in where]
    return where, r, keys


def mempo_loop(cb: CreditBatch, cfg) -> list[list[float]]:
    """Loop reference for :func:`mempo`: A_M per memory by python group statistics, then each row
    walked token by token, counting each call's output position."""
    a_t = group_advantages_loop(cb, cfg)
    where, r, keys = _memories(cb, cfg)
    a_m = dict(zip(where, grpo_advantages_loop(r, keys, norm_std=cfg.grpo_norm_std)))
    b = cb.batch
    B, L = b.loss_mask.shape
    out = [[0.0] * L for _ in range(B)]
    for row in range(B):
        u = int(b.unit_index[row])
        i, unit = int(cb.unit_traj[u]), cb.units[u]
        seen: dict[int, int] = {}
        for t in range(L):
            c = int(b.call_ids[row, t])
            if c < 0:
                continue
            o = seen[c] = seen.get(c, -1) + 1  # the o-th output token of call c
            if b.loss_mask[row, t] > 0:
                span = memory_span(unit.traj.calls[c])
                extra = a_m[(i, c)] if span is not None and span[0] <= o < span[1] else 0.0
                out[row][t] = a_t[i] + extra
    return out


@register_credit("mempo", mempo_loop, prepare=prepare_memory_reward, paper="MemPO eq. 3, 6-9")
def mempo(cb: CreditBatch, cfg):
    """MemPO: the trajectory advantage everywhere, plus the memory advantage on ``<mem>`` tokens.

    A^T_i = (R_i - mean_g R) / std_g R                                   (eq. 3)
    A^M_{i,t} = (R_M(i,t) - mean_G R_M) / std_G R_M, G = all (i', t') of i's task   (eq. 6-8)
    A_{i,k} = A^T_i + A^M_{i,t} if token k lies in mem_t (tags included), else A^T_i   (eq. 9)
    ``mem_reward.norm='per_step'``: G = the memories of i's task at the same turn t.
    shape: rewards ``[N]``, R_M per memory -> advantages ``[B, L]`` (0 off ``loss_mask``).
    """
    b = cb.batch
    a_t = group_advantages(cb, cfg).cpu()
    where, r, keys = _memories(cb, cfg)
    a_m = grpo_advantages(torch.tensor(r), keys, norm_std=cfg.grpo_norm_std) if r else None
    a_m_of = dict(zip(where, a_m.tolist() if a_m is not None else []))
    # table[u, c, o]: A^M on output token o of call c of unit u when it lies in <mem>, else 0
    n_out = max((len(u.traj.calls[c].output_ids) for u in cb.units for c in u.calls), default=0)
    n_call = 1 + max((max(u.calls) for u in cb.units if u.calls), default=0)
    table = torch.zeros(len(cb.units), n_call, max(n_out, 1))
    for u_idx, unit in enumerate(cb.units):
        i = int(cb.unit_traj[u_idx])
        for c in unit.calls:
            span = memory_span(unit.traj.calls[c])
            if span is not None:
                table[u_idx, c, span[0] : span[1]] = a_m_of[(i, c)]
    # output position of every token: its rank among its row's tokens of the same call
    cid = b.call_ids.clamp(min=0)
    onehot = torch.nn.functional.one_hot(cid, n_call) * (b.call_ids >= 0).unsqueeze(-1)
    pos = (onehot.cumsum(1).gather(-1, cid.unsqueeze(-1)).squeeze(-1) - 1).clamp(min=0, max=table.shape[2] - 1)
    extra = table[b.unit_index.unsqueeze(-1).expand_as(cid), cid, pos]
    mask = b.loss_mask.float()
    adv = (a_t[cb.row_traj].unsqueeze(-1) + extra) * mask
    return adv.to(b.loss_mask.device), None


__all__ = ["mempo", "mempo_loop"]
