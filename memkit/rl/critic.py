"""The PPO critic (MEM1 §3.2) and the loss weights that make an aggregation exact over a whole
mini-batch split into micro-batches and processes. GAE itself is a credit rule
(:mod:`memkit.rl.credit`).

Shapes follow ``memkit.rl.packing``: per-token tensors are ``[B, L]`` and token aligned.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class ValueModel(nn.Module):
    """V(s) = w^T h(s) + b: a *copy* of the policy's transformer backbone plus a linear head.

    ``forward(input_ids [B, L], attention_mask, position_ids [B, L]) -> values [B, L]`` (float32),
    the value of the state *after* reading each position. The value of action token t is read
    at its predicting position: ``batch.at_pred(values)`` (verl reads position t - 1).

    The head starts at zero, so V = 0 and the first advantages are the raw returns. For a LoRA
    policy the copied backbone keeps its LoRA layers: base weights stay frozen and the critic
    trains its own adapters + head (a full copy of a 7B critic is the price of full fine-tuning).
    """

    def __init__(self, policy_model: nn.Module):
        super().__init__()
        base = policy_model.get_base_model() if hasattr(policy_model, "get_base_model") else policy_model
        prefix = getattr(base, "base_model_prefix", "model")
        if not hasattr(base, prefix):
            raise ValueError(
                f"cannot find the transformer backbone ({type(base).__name__}.{prefix}) to build a "
                "critic from; use algo='grpo' or a transformers causal LM"
            )
        self.backbone = copy.deepcopy(getattr(base, prefix))
        self.config = base.config  # model_attention_mask reads config._attn_implementation
        self.head = nn.Linear(base.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        h = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1).float()


def loss_weights(loss_mask: torch.Tensor, agg: str, n_tokens: float, n_rows: float) -> torch.Tensor:
    """Per-token weights ``w [B, L]`` with ``sum_{b,t} w l`` = ``aggregate(l, mask, agg)`` over the
    *whole* mini-batch, of which ``loss_mask`` is one micro-batch on one process.

    ``n_tokens`` / ``n_rows`` are mini-batch totals over all micro-batches and processes
    (trained tokens; rows with at least one trained token):

    - ``token-mean``:          w = m / n_tokens
    - ``seq-mean-token-sum``:  w = m / n_rows
    - ``seq-mean-token-mean``: w = m / (row_tokens * n_rows)

    Summing ``sum(w * l)`` over micro-batches (gradient accumulation) and processes (DDP sums
    after multiplying by the world size, since DDP averages) gives exactly the full-batch loss:
    a per-micro-batch mean (what naive accumulation does) would weigh a token by 1 / (tokens
    of *its* micro-batch) instead.
    """
    m = loss_mask if loss_mask.is_floating_point() else loss_mask.float()
    if agg == "token-mean":
        return m / max(n_tokens, 1.0)
    if agg == "seq-mean-token-sum":
        return m / max(n_rows, 1.0)
    if agg == "seq-mean-token-mean":
        return m / (m.sum(-1, keepdim=True).clamp(min=1.0) * max(n_rows, 1.0))
    raise ValueError(f"unknown aggregation {agg!r}")
