"""The PPO critic (MEM1 §3.2) and the loss weights that make an aggregation exact over a whole
mini-batch split into micro-batches and processes. GAE itself is a credit rule
(:mod:`memkit.rl.credit`).

Shapes follow ``memkit.rl.packing``: per-token tensors are ``[B, L]`` and token aligned.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from memkit.models.adapters import CRITIC_ADAPTER, adapter_active, policy_adapters


class ValueModel(nn.Module):
    """V(s) = w^T h(s) + b: the policy's transformer backbone under the critic's own weights, plus a
    linear head.

    ``forward(input_ids [B, L], attention_mask, position_ids [B, L]) -> values [B, L]`` (float32),
    the value of the state *after* reading each position. The value of action token t is read
    at its predicting position: ``batch.at_pred(values)`` (verl reads position t - 1).

    The head starts at zero, so V = 0 and the first advantages are the raw returns. Its backbone:

    - a **LoRA policy** (``share``, the default for a peft model): the critic is a second adapter,
      ``critic`` (:data:`memkit.models.adapters.CRITIC_ADAPTER`, the policy adapter's ``LoraConfig``),
      on the *same* peft model, its weights a copy of the policy adapter's, so
      ``h(s) = backbone(s; W_base + s B_critic A_critic)`` starts equal to the copied backbone's and the
      frozen base ``W_base`` sits in memory once (a 7B critic costs its adapter, not a 7B copy). The
      forward runs with the critic adapter alone active (:func:`memkit.models.adapters.adapter_active`;
      ``requires_grad`` untouched), so the value loss reaches the critic adapter and the head only, the
      policy loss the policy adapter only. :meth:`scope` keeps the critic adapter active around a
      backward too (gradient checkpointing recomputes the forward there). Checkpoints of the policy,
      the rollout engine and ``export_merged`` leave the critic adapter out
      (:func:`memkit.models.adapters.policy_adapters`).
    - **full fine-tuning**, or ``share=False``: a deep copy of the backbone (the price of training every
      weight). :class:`memkit.rl.update.Learner` passes ``share=False`` in a multi-process run: DDP
      would wrap the one model in two reducers (policy and critic), each expecting gradients for the
      other's adapter, so there the LoRA critic keeps its own copied backbone (its LoRA layers trained,
      its base frozen).
    """

    def __init__(self, policy_model: nn.Module, share: bool | None = None):
        super().__init__()
        is_peft = hasattr(policy_model, "peft_config")
        share = is_peft if share is None else share
        if share and not is_peft:
            raise ValueError("a critic shares the policy's backbone only as a LoRA adapter: use a peft policy")
        base = policy_model.get_base_model() if is_peft else policy_model
        prefix = getattr(base, "base_model_prefix", "model")
        if not hasattr(base, prefix):
            raise ValueError(
                f"cannot find the transformer backbone ({type(base).__name__}.{prefix}) to build a "
                "critic from; use algo='grpo' or a transformers causal LM"
            )
        self.config = base.config  # model_attention_mask reads config._attn_implementation
        self.head = nn.Linear(base.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        if share:
            # kept out of the module tree (a tuple): the critic's own parameters are its adapter and head
            self._shared = (policy_model, getattr(base, prefix))
            self.adapter = nn.ParameterDict(
                {name.replace(".", "__"): p for name, p in add_critic_adapter(policy_model).items()}
            )
        else:
            self._shared = None
            self.backbone = copy.deepcopy(getattr(base, prefix))

    @property
    def shares_backbone(self) -> bool:
        """The critic is an adapter on the policy's own model (no copied backbone)."""
        return self._shared is not None

    def scope(self):
        """A context in which the shared model runs the critic's adapter alone (a no-op for a copied
        backbone): wrap a value loss's forward *and* backward in it."""
        if self._shared is None:
            return contextlib.nullcontext()
        return adapter_active(self._shared[0], CRITIC_ADAPTER)

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        backbone = self.backbone if self._shared is None else self._shared[1]
        with self.scope():
            h = backbone(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1).float()


def add_critic_adapter(peft_model: nn.Module) -> dict[str, nn.Parameter]:
    """Add adapter :data:`~memkit.models.adapters.CRITIC_ADAPTER` to ``peft_model`` with the policy
    adapter's ``LoraConfig`` and a copy of its weights (``A_critic = A_policy``, ``B_critic = B_policy``),
    trainable; returns its parameters by name. An existing critic adapter (a second Learner on the same
    model) is re-made. The policy adapter stays active and its ``requires_grad`` as it was."""
    (policy,) = policy_adapters(peft_model, active=True)  # one policy adapter is what is trained
    if CRITIC_ADAPTER in peft_model.peft_config:
        peft_model.delete_adapter(CRITIC_ADAPTER)
    with torch.random.fork_rng(devices=[]):  # peft draws A from the global RNG: leave the run's stream alone
        peft_model.add_adapter(CRITIC_ADAPTER, copy.deepcopy(peft_model.peft_config[policy]))
    params = dict(peft_model.named_parameters())
    own = {name: p for name, p in params.items() if f".{CRITIC_ADAPTER}." in name}
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(params[name.replace(f".{CRITIC_ADAPTER}.", f".{policy}.")])
            p.requires_grad_(True)
    return own


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
