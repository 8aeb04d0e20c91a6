"""RL core: losses (PPO clip, KL, value, entropy), credit rules behind a registry (GRPO,
multi-context, GAE, MemPO, DCPO, MoT-GRPO) and packing of training units into tensors (separate,
MEM1 mask, exact)."""
from memkit.rl.advantages import (broadcast_to_calls, discounted_returns, gae, grpo_advantages,
                                  masked_whiten)
from memkit.rl.credit import CREDIT_RULES, CreditBatch, get_credit, register_credit
from memkit.rl import memory_reward, mot, segments  # noqa: F401  register the `mempo`, `mot`, `dcpo` credit rules
from memkit.rl.losses import (aggregate, entropy_from_logits, kl_penalty, masked_mean, ppo_clip_loss,
                              token_logprobs, value_loss)
from memkit.rl.packed_forward import model_attention_mask, packed_token_logprobs, packing_gap
from memkit.rl.packing import PackedBatch, pack

__all__ = [
    "aggregate", "masked_mean", "ppo_clip_loss", "value_loss", "kl_penalty", "entropy_from_logits",
    "token_logprobs", "grpo_advantages", "gae", "discounted_returns", "masked_whiten",
    "broadcast_to_calls", "CREDIT_RULES", "CreditBatch", "get_credit", "register_credit",
    "PackedBatch", "pack", "packed_token_logprobs", "model_attention_mask", "packing_gap",
]
