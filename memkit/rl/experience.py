"""What one RL update holds fixed, and the forwards that compute it (OpenRLHF's ``Experience`` and
experience maker): for each micro-batch, the packed rows and their model inputs, the loss mask, old
and reference log-probs, critic values, and the credit rule's advantages and returns, all ``[B, L]``
and token aligned, computed once under ``no_grad`` before the PPO epochs of
:meth:`memkit.rl.update.Learner.update` reuse them.

:class:`ExperienceMaker` is the base of :class:`memkit.rl.update.Learner`: the packed forwards
(``_logprobs``, ``_values``; the PPO step reruns them with gradients), ``_experience`` for one
micro-batch and ``_whiten`` over the whole rollout batch. It reads what the Learner sets up:
``cfg``, ``acc``, ``policy``, ``ref``, ``critic``, ``is_peft``, ``packing``, ``recompute``,
``credit``, ``pad_id``, ``world`` and ``global_sums``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from memkit.core.trajectory import TrainingUnit
from memkit.models.adapters import adapters_disabled
from memkit.rl.advantages import masked_moments, masked_whiten, moments_to_mean_var
from memkit.rl.credit import CreditBatch
from memkit.rl.losses import token_logprobs
from memkit.rl.packed_forward import packed_attention
from memkit.rl.packing import PackedBatch, length_groups, pack


def _cut_rows(t: torch.Tensor | None, rows: torch.Tensor, width: int) -> torch.Tensor | None:
    """Rows ``rows`` of a packed tensor, cut to their first ``width`` positions: ``[B, L]`` ->
    ``[b, width]``, a 2D mask ``[B, 1, L, L]`` -> ``[b, 1, width, width]``."""
    if t is None:
        return None
    return t[rows][..., :width] if t.dim() == 2 else t[rows][..., :width, :width]


@dataclass
class Experience:
    """What the update holds fixed for one micro-batch (``[B, L]`` tensors, token aligned with ``batch``):
    the packed rows and their model inputs, the loss mask, old (and reference) log-probs, critic values,
    the credit rule's advantages and returns, and the row groups each forward runs as."""

    batch: PackedBatch
    inputs: tuple  # (ids, attention mask, position ids, predicted-token index): Learner._inputs
    mask: torch.Tensor  # the loss mask: generated tokens of the trained calls
    old: torch.Tensor  # log-probs of the policy that sampled (recomputed or the rollout's)
    gap: float  # sum |old - rollout's| over the mask (old_logprob_gap)
    groups: list  # (rows, width) of each forward (``packing.length_groups``)
    padded: int  # token slots the forwards run: rows x width, summed over the groups
    ref: torch.Tensor | None = None  # the reference policy's log-probs (kl.coef > 0)
    values: torch.Tensor | None = None  # the critic's values (ppo), masked
    credit: CreditBatch | None = None
    adv: torch.Tensor | None = None  # advantages, masked (whitened in place for ppo)
    returns: torch.Tensor | None = None  # value targets (ppo)


class ExperienceMaker:
    """The no-grad half of the update: packed forwards and each micro-batch's :class:`Experience`
    (a base of :class:`memkit.rl.update.Learner`, whose attributes it reads)."""

    def _inputs(self, batch: PackedBatch):
        dev = self.acc.device  # the bool mask: each forward's packed_attention puts it in its path's form
        return (
            batch.input_ids.to(dev),
            batch.attention_mask.to(dev),
            batch.position_ids.to(dev),
            batch.pred_index.to(dev),
        )

    def _logprobs(self, model, inputs, with_entropy=False, loss_mask=None, groups=None):
        """Token log-probs (and entropy) ``[B, L]`` of the packed rows; with several ``groups``
        (``(row indices, width)``, ``packing.length_groups``) one forward per group, cut to its width."""

        def score(ids, mask, pos, pred, loss_mask):
            with self.acc.autocast(), packed_attention(model, mask, self.cfg.runtime.attention) as mask:
                return token_logprobs(
                    model,
                    ids,
                    mask,
                    pos,
                    pred,
                    with_entropy=with_entropy,
                    loss_mask=loss_mask,
                    temperature=self.cfg.temperature,
                )  # the policy trained is the one sampled

        if groups is None or len(groups) <= 1:  # one group holds every row at the full width
            return score(*inputs, loss_mask)
        ids = inputs[0]
        full = [torch.zeros(ids.shape, dtype=torch.float32, device=ids.device) for _ in range(1 + with_entropy)]
        for rows, width in groups:  # rows are right-padded: past the group's longest row is padding
            rows = torch.as_tensor(rows, device=ids.device)
            out = score(*(_cut_rows(t, rows, width) for t in (*inputs, loss_mask)))
            for f, part in zip(full, out if with_entropy else (out,)):
                f[rows, :width] = part
        return tuple(full) if with_entropy else full[0]

    def _values(self, critic, batch, inputs) -> torch.Tensor:
        ids, mask, pos, _ = inputs
        with self.acc.autocast(), packed_attention(critic, mask, self.cfg.runtime.attention) as mask:
            return batch.at_pred(critic(ids, mask, pos))

    @torch.no_grad()
    def _experience(
        self, units: list[TrainingUnit], unit_traj: list[int], rewards: torch.Tensor, group_ids, trajs=(), trained=None
    ) -> Experience | None:
        """Pack one micro-batch and compute everything the update holds fixed: old and reference
        log-probs, critic values, advantages and returns (all ``[B, L]``, token aligned).
        ``unit_traj``: which of the update's trajectories (``rewards [N]``, ``group_ids``) each unit is."""
        if not units:
            return self._idle_forwards()
        batch = pack(units, self.packing, self.pad_id)
        if batch.input_ids.shape[1] == 0:
            return self._idle_forwards()
        dev, inputs = self.acc.device, self._inputs(batch)
        lengths = batch.lengths.tolist()
        # one forward per micro-batch across processes: DDP's reducer expects one forward per backward
        row_groups = self.cfg.runtime.row_groups if self.world == 1 else 1
        groups = [(g, max(lengths[r] for r in g)) for g in length_groups(lengths, row_groups)]
        m = batch.loss_mask.to(dev)
        rollout_old = batch.old_logprobs.to(dev)
        old = self._logprobs(self.policy, inputs, loss_mask=m, groups=groups) if self.recompute else rollout_old
        exp = Experience(
            batch=batch,
            inputs=inputs,
            mask=m,
            old=old,
            gap=float(((old - rollout_old).abs() * m).sum()),
            groups=groups,
            padded=sum(len(g) * w for g, w in groups),
        )
        if self.cfg.kl.coef > 0:
            ctx = adapters_disabled(self.policy) if self.is_peft else contextlib.nullcontext()
            with ctx:
                exp.ref = self._logprobs(self.policy if self.is_peft else self.ref, inputs, loss_mask=m, groups=groups)
        values = None
        if self.critic is not None:
            values = self._values(self.acc.unwrap_model(self.critic), batch, inputs)
            exp.values = values * m
        cb = CreditBatch(
            batch=batch,
            units=units,
            unit_traj=torch.tensor(unit_traj, dtype=torch.long),
            rewards=rewards,
            group_ids=group_ids,
            values=values,
            trajectories=trajs,
            trained=trained,
        )
        adv, returns = self.credit.fn(cb, self.cfg)
        exp.credit, exp.adv = cb, adv.to(dev) * m
        if returns is not None:
            exp.returns = returns.to(dev)
        return exp

    def _one_token(self) -> torch.Tensor:
        """``[1, 1]`` pad ids: the input of a forward a rank runs only to keep in step with the others."""
        return torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.acc.device)

    def _idle_forwards(self) -> None:
        """An empty micro-batch (this rank has fewer units than another): no experience, and under FSDP
        the forwards a real one runs, in its order, on one token (old log-probs when recomputed, then the
        reference's), so every rank all-gathers the same layers in step (memkit.rl.engines). None."""
        if not self.sharded:
            return None
        ids = self._one_token()
        if self.recompute:
            self.policy(input_ids=ids, use_cache=False)
        if self.cfg.kl.coef > 0:
            with adapters_disabled(self.policy) if self.is_peft else contextlib.nullcontext():
                (self.policy if self.is_peft else self.ref)(input_ids=ids, use_cache=False)
        return None

    def _whiten(self, exps) -> None:
        """Whiten advantages over the whole rollout batch, every micro-batch and process (verl's PPO)."""
        live = [e for e in exps if e is not None]
        parts = [masked_moments(e.adv, e.mask) for e in live]
        totals = self.global_sums([sum(p[k] for p in parts) for k in range(3)])
        mean_var = moments_to_mean_var(*totals)
        for e in live:
            e.adv = masked_whiten(e.adv, e.mask, mean_var=mean_var)


__all__ = ["Experience", "ExperienceMaker"]
