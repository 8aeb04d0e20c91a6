"""RL core: losses (PPO clip, KL, value, entropy), credit rules behind a registry (GRPO,
multi-context, GAE, MemPO, DCPO, MoT-GRPO) and packing of training units into tensors (separate,
MEM1 mask, exact).

The names below load their module on first use (PEP 562), so ``memkit.rl.config`` (the trainer's
knobs) imports without torch; :mod:`memkit.rl.credit` registers every paper's rule when it loads.
"""

from __future__ import annotations

import importlib

#: public name -> the module of memkit.rl that defines it
_HOME = {
    **dict.fromkeys(
        (
            "aggregate",
            "masked_mean",
            "ppo_clip_loss",
            "value_loss",
            "kl_penalty",
            "entropy_from_logits",
            "token_logprobs",
        ),
        "losses",
    ),
    **dict.fromkeys(
        ("grpo_advantages", "gae", "discounted_returns", "masked_whiten", "broadcast_to_calls"), "advantages"
    ),
    **dict.fromkeys(("CREDIT_RULES", "CreditBatch", "get_credit", "register_credit"), "credit"),
    **dict.fromkeys(("PackedBatch", "pack"), "packing"),
    **dict.fromkeys(("packed_token_logprobs", "model_attention_mask", "packing_gap"), "packed_forward"),
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"memkit.rl.{_HOME[name]}"), name)
    raise AttributeError(f"module 'memkit.rl' has no attribute {name!r}")


__all__ = list(_HOME)
