"""Credit assignment: GRPO group normalisation, GAE over masked token sequences, and the
multi-context broadcast of trajectory advantages to calls (MemSearcher eq. 6-8).

Each vectorised kernel has a loop reference (``*_loop``) compared in the tests across seeds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Sequence

import torch


def _group_codes(group_ids, device) -> torch.Tensor:
    """Map arbitrary hashable group ids (task ids, ints) to dense codes 0..G-1, ``[N]`` long."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].to(device)
    codes: dict[Hashable, int] = {}
    return torch.tensor([codes.setdefault(g, len(codes)) for g in group_ids], dtype=torch.long, device=device)


def grpo_advantages(
    rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor, eps: float = 1e-6, norm_std: bool = True
) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024; verl ``compute_grpo_outcome_advantage``).

    rewards ``[N]`` (one scalar per trajectory), group_ids ``[N]`` (same id = same prompt/task).

        A_i = (R_i - mean_g(R)) / (std_g(R) + eps)      (norm_std, the original GRPO)
        A_i =  R_i - mean_g(R)                           (not norm_std, Dr. GRPO)

    std is the unbiased (Bessel, n-1) sample std, as ``torch.std`` in verl. A group of size 1
    gets mean 0 and std 1 as in verl, i.e. A_i = R_i / (1 + eps) (its raw reward, not 0).
    Returns ``[N]``.
    """
    r = rewards.to(torch.float32)
    g = _group_codes(group_ids, r.device)
    G = int(g.max()) + 1 if g.numel() else 0
    n = torch.zeros(G, device=r.device).index_add_(0, g, torch.ones_like(r))
    mean = torch.zeros(G, device=r.device).index_add_(0, g, r) / n
    sq = torch.zeros(G, device=r.device).index_add_(0, g, (r - mean[g]) ** 2)
    std = torch.sqrt(sq / (n - 1).clamp(min=1))
    single = n == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    centred = r - mean[g]
    return centred / (std[g] + eps) if norm_std else centred


def grpo_advantages_loop(rewards, group_ids, eps=1e-6, norm_std=True) -> list[float]:
    """Loop reference for :func:`grpo_advantages` (dict of groups, python floats)."""
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    r = [float(x) for x in rewards]
    groups = defaultdict(list)
    for x, gid in zip(r, ids):
        groups[gid].append(x)
    stats = {}
    for gid, xs in groups.items():
        if len(xs) == 1:
            stats[gid] = (0.0, 1.0)
        else:
            m = sum(xs) / len(xs)
            stats[gid] = (m, (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5)
    out = []
    for x, gid in zip(r, ids):
        m, s = stats[gid]
        out.append((x - m) / (s + eps) if norm_std else x - m)
    return out


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation over token sequences with holes (Schulman et al. 2016).

    token_rewards, values, mask: ``[B, T]``; returns ``(advantages, returns)``, both ``[B, T]``,
    zero where mask is 0. Tokens with mask 0 (observations or prompts inside a MEM1 packed row,
    padding) are *skipped*: the recursion runs over the masked-in tokens only, as if the sequence
    were compressed to them (verl's multi-turn GAE). With t' = the next masked-in token after t:

        delta_t = r_t + gamma * V_{t'} - V_t          (V_{t'} = 0 past the last one)
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t                           (the critic's regression target)

    Rewards placed on mask-0 tokens are ignored: put the outcome reward on the last output
    token. Vectorised over the batch; one reverse scan over T. No whitening (see
    :func:`masked_whiten`).
    """
    m = mask.to(values.dtype)
    B, T = values.shape
    next_v = values.new_zeros(B)
    last = values.new_zeros(B)
    adv = torch.zeros_like(values)
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        delta = token_rewards[:, t] + gamma * next_v - values[:, t]
        a_t = delta + gamma * lam * last
        adv[:, t] = a_t * mt
        next_v = torch.where(mt > 0, values[:, t], next_v)
        last = torch.where(mt > 0, a_t, last)
    returns = (adv + values) * m
    return adv, returns


def gae_loop(token_rewards, values, mask, gamma=1.0, lam=1.0):
    """Loop reference for :func:`gae`: compress each row to its masked-in tokens and run the
    textbook recursion there, then scatter back. Returns nested lists ``[B][T]``."""
    B, T = values.shape
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        idx = [t for t in range(T) if float(mask[b, t]) > 0]
        r = [float(token_rewards[b, t]) for t in idx]
        v = [float(values[b, t]) for t in idx]
        a_next = 0.0
        for k in range(len(idx) - 1, -1, -1):
            v_next = v[k + 1] if k + 1 < len(idx) else 0.0
            a_next = r[k] + gamma * v_next - v[k] + gamma * lam * a_next
            adv[b][idx[k]] = a_next
            ret[b][idx[k]] = a_next + v[k]
    return adv, ret


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Monte-Carlo returns over masked-in tokens (REINFORCE): G_t = r_t + gamma * G_{t'}.

    Equal to ``gae(r, 0, mask, gamma, lam=1)[0]``. ``[B, T] -> [B, T]``, 0 where mask is 0.
    """
    zeros = torch.zeros_like(token_rewards, dtype=torch.float32)
    return gae(token_rewards.to(torch.float32), zeros, mask, gamma=gamma, lam=1.0)[0]


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """``(sum, sum of squares, count)`` of the masked-in entries: what processes and micro-batches
    add up before :func:`masked_whiten` (``moments_to_mean_var`` turns the totals into mean, var)."""
    m = mask.to(values.dtype)
    return float((values * m).sum()), float((values**2 * m).sum()), float(m.sum())


def moments_to_mean_var(s1: float, s2: float, n: float) -> tuple[float, float]:
    """Mean and unbiased (n - 1) variance from :func:`masked_moments` totals."""
    mean = s1 / max(n, 1.0)
    return mean, max(s2 - n * mean**2, 0.0) / max(n - 1.0, 1.0)


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    mean_var: tuple[float, float] | None = None,
):
    """(x - mean) / sqrt(var + eps) over the masked-in entries (unbiased var); 0 elsewhere.

    ``mean_var`` gives statistics taken over more than this tensor (every micro-batch and process
    of a rollout batch, as verl whitens PPO advantages); None = this tensor's own. ``[B, L]``."""
    m = mask.to(values.dtype)
    if mean_var is None:
        n = m.sum()
        mean = (values * m).sum() / n.clamp(min=1)
        var = (((values - mean) * m) ** 2).sum() / (n - 1).clamp(min=1)
        out = (values - mean) * torch.rsqrt(var + eps)
    else:
        mean, var = mean_var
        out = (values - mean) / math.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


def broadcast_to_calls(traj_advantages: torch.Tensor, call_counts: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Multi-context GRPO (MemSearcher eq. 6-8): A_{i,j} = A_i for every call j of trajectory i.

    traj_advantages ``[N]``, call_counts ``[N]`` (n_i calls of trajectory i) ->
    ``[sum_i n_i]``, calls in trajectory order then call order (the order of ``pack(...,
    "separate")`` rows).
    """
    counts = torch.as_tensor(call_counts, dtype=torch.long, device=traj_advantages.device)
    return torch.repeat_interleave(traj_advantages, counts)


def broadcast_to_calls_loop(traj_advantages, call_counts) -> list[float]:
    out = []
    for a, n in zip(traj_advantages.tolist(), list(call_counts)):
        out.extend([a] * int(n))
    return out
