"""Credit assignment as a registry: each rule turns outcome rewards into per-token advantages.

A rule is one pure function registered under a name (verl's ``register_adv_est`` pattern); the
update looks it up by name and never branches on the algorithm. Each method declares its default
rule (``Method.default_credit``); ``TrainConfig.credit`` / ``memkit train --credit`` override it.

    grpo           A_i = (R_i - mean_g R) / std_g R on every trained token of trajectory i
    multi_context  A_i copied to every call of trajectory i (MemSearcher eq. 6-8): grpo itself, by name
    gae            GAE over each trajectory's trained tokens with critic values (MEM1 §3.2),
                   then whitened over the whole rollout batch (verl)
    mempo          A_T on every trained token, + A_M (the group-normalised memory reward R_M) on
                   each call's ``<mem>`` tokens (MemPO eq. 6-9): :mod:`memkit.rl.credit.mempo`
    dcpo           each sampled segment inherits A(tau) of its trajectory (MemAct eq. 4-6), the
                   units drawn by Algorithm 1: :mod:`memkit.rl.segments`
    mot            A_intra + A_inter on every tree node (Mem-T eq. 10-15): :mod:`memkit.rl.mot`

Every rule has the signature ``rule(cb: CreditBatch, cfg) -> (advantages [B, L], returns [B, L]
or None)`` on one packed micro-batch, and a loop reference ``<rule>_loop(cb, cfg) -> [B][L]``
compared in ``tests/rl/test_credit.py`` on real rollouts. ``cfg`` is any object with the knobs a
rule reads (``TrainConfig``: ``grpo_norm_std``, ``gamma``, ``lam``, ``mem_reward.norm``). Adding a
paper's credit is one more registered function; a paper's own rule lives beside its math or in
its own module of this package (the last three above, imported by ``memkit.rl.credit`` so the
registry always holds them). A rule that trains
other units than whole trajectories (DCPO's segments, MoT's trees) names a ``units`` function the
update calls first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch

from memkit.core.trajectory import TrainingUnit, Trajectory
from memkit.rl.advantages import gae, gae_loop, grpo_advantages, grpo_advantages_loop
from memkit.rl.packing import PackedBatch


@dataclass
class CreditBatch:
    """What a credit rule sees: one packed micro-batch and the whole update's outcomes.

    - ``batch``: the rows, ``[B, L]``; ``batch.unit_index[b]`` is row b's unit (index into ``units``)
    - ``units``: the micro-batch's training units, ``U`` of them
    - ``unit_traj``: ``[U]`` long, which of the update's ``N`` trajectories each unit comes from
    - ``rewards``: ``[N]`` outcome reward of every trajectory of the update (this process)
    - ``group_ids``: ``N`` hashables, same id = samples of the same task (the GRPO group)
    - ``values``: ``[B, L]`` critic values read at each token's predicting position, or None
    - ``trajectories``: the update's ``N`` trajectories (rules with per-call rewards read them:
      MemPO's R_M in ``Call.reward``, pooled over all memories of a group)
    - ``trained``: ``[N]`` bool, trajectories with at least one unit in the update (None: all);
      DCPO's ``sampled`` group statistics read it
    """

    batch: PackedBatch
    units: list[TrainingUnit]
    unit_traj: torch.Tensor
    rewards: torch.Tensor
    group_ids: Sequence[Hashable]
    values: torch.Tensor | None = None
    trajectories: Sequence[Trajectory] = ()
    trained: torch.Tensor | None = None

    @property
    def row_traj(self) -> torch.Tensor:
        """``[B]`` long: the trajectory (0..N-1) of every row."""
        return self.unit_traj[self.batch.unit_index]


CreditFn = Callable[[CreditBatch, object], "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(frozen=True)
class CreditRule:
    """A registered rule and what the update must provide for it."""

    name: str
    fn: CreditFn
    loop: Callable
    needs_values: bool = False  # the update trains a critic and passes its values
    needs_groups: bool = True  # needs >= 2 samples per task (group statistics)
    whiten: bool = False  # whiten over the whole rollout batch when TrainConfig.critic.whiten_advantages
    paper: str = ""
    prepare: Callable | None = None  # (trajs, learner) -> global stats: extra forwards the rule needs first
    units: Callable | None = None  # (trajs, cfg, seed) -> the TrainingUnits to train; None = whole trajectories


CREDIT_RULES: dict[str, CreditRule] = {}


def register_credit(
    name: str,
    loop: Callable,
    *,
    needs_values: bool = False,
    needs_groups: bool = True,
    whiten: bool = False,
    paper: str = "",
    prepare: Callable | None = None,
    units: Callable | None = None,
):
    """Decorator: register ``fn`` as credit rule ``name`` with its loop reference.

    ``prepare(trajs, learner) -> dict``: forwards the rule needs under the current policy before its
    advantages (MemPO's memory probes write ``Call.reward``); the update calls it first and logs
    what it returns. ``units(trajs, cfg, seed)``: the training units, when not whole trajectories."""

    def deco(fn: CreditFn) -> CreditFn:
        if name in CREDIT_RULES:
            raise ValueError(f"credit rule {name!r} is already registered")
        CREDIT_RULES[name] = CreditRule(name, fn, loop, needs_values, needs_groups, whiten, paper, prepare, units)
        return fn

    return deco


def get_credit(name: str) -> CreditRule:
    if name not in CREDIT_RULES:
        raise ValueError(f"unknown credit rule {name!r}; choose one of {sorted(CREDIT_RULES)}")
    return CREDIT_RULES[name]


def scored_calls(cb: CreditBatch, selects: Callable, fix: str) -> tuple[list[tuple[int, int]], list[float]]:
    """``(trajectory, call)`` and ``Call.reward`` of every call of the update's trajectories that
    ``selects(call)``, in order: what a rule that credits single calls (MemPO's memories, MoT's
    tree nodes) normalises. A selected call without a reward raises, naming ``fix``."""
    where, r = [], []
    for i, traj in enumerate(cb.trajectories):
        for c, call in enumerate(traj.calls):
            if not selects(call):
                continue
            if call.reward is None:
                raise ValueError(f"call {c} of {traj.task_id!r} has no reward for this credit rule; {fix}")
            where.append((i, c))
            r.append(float(call.reward))
    return where, r


# ----------------------------------------------------------------------------- grpo
def group_advantages(cb: CreditBatch, cfg) -> torch.Tensor:
    """``[N]``: GRPO advantage of every trajectory of the update (eq. 5 of MemSearcher)."""
    return grpo_advantages(cb.rewards, cb.group_ids, norm_std=cfg.grpo_norm_std)


def group_advantages_loop(cb: CreditBatch, cfg) -> list[float]:
    """Loop reference for :func:`group_advantages` (python floats, ``N`` of them)."""
    return grpo_advantages_loop(cb.rewards.tolist(), list(cb.group_ids), norm_std=cfg.grpo_norm_std)


def grpo_loop(cb: CreditBatch, cfg) -> list[list[float]]:
    """Loop reference for :func:`grpo`: A_i on every trained token of every row of trajectory i."""
    a = group_advantages_loop(cb, cfg)
    m = cb.batch.loss_mask
    return [[a[int(cb.row_traj[b])] * float(m[b, t]) for t in range(m.shape[1])] for b in range(m.shape[0])]


@register_credit("grpo", grpo_loop, paper="Shao et al. 2024 (GRPO); verl compute_grpo_outcome_advantage")
def grpo(cb: CreditBatch, cfg):
    """Group-normalised outcome advantage on every trained token of the trajectory.

    A_i = (R_i - mean_g R) / (std_g R + eps), g = the samples of i's task (``grpo_norm_std=False``:
    R_i - mean_g R, Dr. GRPO). shape: rewards ``[N]`` -> advantages ``[B, L]`` (0 off ``loss_mask``).
    """
    a = group_advantages(cb, cfg).to(cb.batch.loss_mask.device)
    return a[cb.row_traj.to(a.device)].unsqueeze(-1) * cb.batch.loss_mask.to(a.dtype), None


# ----------------------------------------------------------------------------- multi_context
def multi_context_loop(cb: CreditBatch, cfg) -> list[list[float]]:
    """MemSearcher's multi-context GRPO as the paper writes it: A_i (eq. 5), copied to each call j of
    trajectory i, A_{i,j} = A_i (eq. 8), then to each call's trained tokens."""
    a = group_advantages_loop(cb, cfg)
    per_call = {}
    for u_idx, unit in enumerate(cb.units):
        for call in unit.calls:
            per_call[(u_idx, call)] = a[int(cb.unit_traj[u_idx])]
    b = cb.batch
    B, L = b.loss_mask.shape
    return [
        [per_call[(int(b.unit_index[r]), int(b.call_ids[r, t]))] if b.loss_mask[r, t] > 0 else 0.0 for t in range(L)]
        for r in range(B)
    ]


# Copying A_i to every call and every call's tokens is what ``grpo`` does to every trained token of
# trajectory i, whatever the packing: the rule is ``grpo`` itself, kept under MemSearcher's name
# (its formats default to it, one call per row); its loop reference above is eq. 8 step by step, and
# tests/rl/test_credit.py checks the two agree on real rollouts.
register_credit("multi_context", multi_context_loop, paper="MemSearcher eq. 6-8 (multi-context GRPO)")(grpo)
multi_context = grpo


# ----------------------------------------------------------------------------- per-call values and tokens
def _rank_table(cb: CreditBatch) -> torch.Tensor:
    """``[U, C]`` long: flat index (units in order, each unit's calls in order, as
    ``broadcast_to_calls`` lays them out) of call c of unit u; -1 where u does not train c."""
    width = 1 + max((max(u.calls) for u in cb.units if u.calls), default=0)
    table = torch.full((len(cb.units), width), -1, dtype=torch.long)
    offset = 0
    for u_idx, unit in enumerate(cb.units):
        table[u_idx, list(unit.calls)] = torch.arange(offset, offset + len(unit.calls))
        offset += len(unit.calls)
    return table


def _call_positions(cb: CreditBatch, table: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` long: the flat call index (``table``, :func:`_rank_table`) of every trained token;
    -1 elsewhere."""
    b = cb.batch
    rows = b.unit_index[:, None].expand_as(b.call_ids)
    trained = (b.loss_mask > 0) & (b.call_ids >= 0)
    pos = table[rows.clamp(min=0), b.call_ids.clamp(min=0)]
    return torch.where(trained, pos, torch.full_like(pos, -1))


def call_values_to_tokens(cb: CreditBatch, values: dict[tuple[int, int], float]) -> torch.Tensor:
    """``[B, L]``: every trained token gets ``values[(trajectory, call)]`` of the call it belongs to
    (0 off ``loss_mask``), for rules that give each call its own advantage (MoT-GRPO's nodes)."""
    b = cb.batch
    n_call = 1 + max((max(u.calls) for u in cb.units if u.calls), default=0)
    table = torch.zeros(len(cb.units), n_call)
    for u_idx, unit in enumerate(cb.units):
        i = int(cb.unit_traj[u_idx])
        for c in unit.calls:
            table[u_idx, c] = values[(i, c)]
    cid = b.call_ids.clamp(min=0)
    return (table[b.unit_index.unsqueeze(-1).expand_as(cid), cid] * b.loss_mask.float()).to(b.loss_mask.device)


# ----------------------------------------------------------------------------- gae
def trajectory_gae(
    batch: PackedBatch, values: torch.Tensor, rewards: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over each unit's trained tokens in generation order, for any packing.

    values ``[B, L]`` (V(s_t) of each token, already read at its predicting position),
    rewards ``[U]`` (outcome reward of each unit of the batch, placed on its last trained
    token) -> ``(advantages, returns)`` ``[B, L]``, zero off ``loss_mask``.

    The trained tokens of unit i are gathered, in call order, into one compressed row (for
    ``mem1_*`` packing its packed row read left to right; for ``separate`` its call rows one
    after another), so V(s_{t+1}) of a call's last token is the value of the *next call's* first
    token, the temporal difference MEM1 §3.2 builds its masked trajectory for. Then
    :func:`memkit.rl.advantages.gae` runs on ``[U, T]`` and the result is scattered back.
    """
    N = int(rewards.numel())
    m = batch.loss_mask.to(values.device) > 0
    b, i = m.nonzero(as_tuple=True)  # row-major: rows in (unit, call) order, tokens in order
    tr = batch.unit_index.to(values.device)[b]
    order = torch.argsort(tr, stable=True)
    b, i, tr = b[order], i[order], tr[order]
    counts = torch.bincount(tr, minlength=N)
    pos = torch.arange(len(tr), device=values.device) - (counts.cumsum(0) - counts)[tr]
    T = int(counts.max()) if len(tr) else 0
    v = values.new_zeros(N, T)
    mask = values.new_zeros(N, T)
    r = values.new_zeros(N, T)
    v[tr, pos] = values[b, i].float()
    mask[tr, pos] = 1.0
    has = (counts > 0).nonzero(as_tuple=True)[0]
    r[has, counts[has] - 1] = rewards.to(values.device, torch.float32)[has]
    adv_c, ret_c = gae(r, v, mask, gamma, lam)
    adv, ret = torch.zeros_like(values, dtype=torch.float32), torch.zeros_like(values, dtype=torch.float32)
    adv[b, i], ret[b, i] = adv_c[tr, pos], ret_c[tr, pos]
    return adv, ret


def gae_rule_loop(cb: CreditBatch, cfg):
    """Loop reference for :func:`gae_credit`: walk each unit's trained tokens in row-major order
    (python lists), run :func:`memkit.rl.advantages.gae_loop` on them, scatter back."""
    b = cb.batch
    B, L = b.loss_mask.shape
    adv = [[0.0] * L for _ in range(B)]
    ret = [[0.0] * L for _ in range(B)]
    for u_idx in range(len(cb.units)):
        where = [(r, t) for r in range(B) if int(b.unit_index[r]) == u_idx for t in range(L) if b.loss_mask[r, t] > 0]
        if not where:
            continue
        vals = torch.tensor([[float(cb.values[r, t]) for r, t in where]])
        rew = torch.zeros_like(vals)
        rew[0, -1] = float(cb.rewards[int(cb.unit_traj[u_idx])])
        a, g = gae_loop(rew, vals, torch.ones_like(vals), cfg.critic.gamma, cfg.critic.lam)
        for k, (r, t) in enumerate(where):
            adv[r][t], ret[r][t] = a[0][k], g[0][k]
    return adv, ret


@register_credit(
    "gae",
    gae_rule_loop,
    needs_values=True,
    needs_groups=False,
    whiten=True,
    paper="MEM1 §3.2 (PPO with a critic); Schulman et al. 2016 (GAE)",
)
def gae_credit(cb: CreditBatch, cfg):
    """PPO credit: GAE over each unit's trained tokens, outcome reward on its last trained token.

    delta_t = r_t + gamma V_{t'} - V_t,  A_t = delta_t + gamma lam A_{t'},  R_t = A_t + V_t
    (t' = the unit's next trained token). Whitening over the whole rollout batch is the update's
    job (it needs every micro-batch and process: ``CreditRule.whiten``).
    shape: values ``[B, L]``, rewards ``[N]`` -> (advantages ``[B, L]``, returns ``[B, L]``).
    """
    if cb.values is None:
        raise ValueError("credit rule 'gae' needs critic values (the update passes them when the rule says so)")
    for unit in cb.units:  # the TD chain must follow generation: each call continues the previous one
        calls = unit.traj.calls  # (a call built by hand without a parent is taken in list order)
        if any(calls[j].parent not in (None, i) for i, j in zip(unit.calls, unit.calls[1:])):
            raise ValueError(
                f"credit rule 'gae' needs each unit to be a chain (every call's parent the unit's "
                f"previous call); unit {unit.calls} of {unit.traj.task_id!r} is not: train tree paths "
                "as separate units (Trajectory.path)"
            )
    return trajectory_gae(cb.batch, cb.values, cb.rewards[cb.unit_traj], cfg.critic.gamma, cfg.critic.lam)


def record_call_advantages(cb: CreditBatch, advantages: torch.Tensor) -> None:
    """Write each trained call's mean token advantage into ``Call.advantage`` (for viewers and
    notebooks: a per-call number even where a rule assigns per-token credit, as GAE does).
    shape: advantages ``[B, L]``, what the update trains (after any whitening). Calls shared by
    several units (a tree's common prefix) keep the last unit's value."""
    table = _rank_table(cb)
    pos = _call_positions(cb, table).flatten()
    keep = pos >= 0
    n = int(table.max()) + 1 if table.numel() else 0
    vals = advantages.detach().float().cpu().flatten()
    sums = torch.zeros(n).index_add_(0, pos[keep], vals[keep])
    counts = torch.zeros(n).index_add_(0, pos[keep], torch.ones(int(keep.sum())))
    for u_idx, unit in enumerate(cb.units):
        for call in unit.calls:
            k = int(table[u_idx, call])
            if counts[k] > 0:
                unit.traj.calls[call].advantage = float(sums[k] / counts[k])


__all__ = [
    "CreditBatch",
    "CreditRule",
    "CREDIT_RULES",
    "register_credit",
    "get_credit",
    "scored_calls",
    "call_values_to_tokens",
    "group_advantages",
    "group_advantages_loop",
    "grpo",
    "multi_context",
    "gae_credit",
    "trajectory_gae",
    "record_call_advantages",
]
