"""The tiny policy: a ~1.2M-parameter Llama built from a config, trained from scratch.

Why Llama: it is the architecture of the papers' Qwen/Llama policies (RoPE, RMSNorm, SwiGLU),
so everything downstream (KV cache, LoRA target names ``q_proj``..., position ids) is the
same code path as for a 7B model.

Why this size (4 layers x hidden 128, 4 heads of 32): on 2 CPU cores SFT is bounded by the
training sequences it gets through per minute (steps of 16; half the batch for twice the steps
did not help, see ``SFTConfig.batch_size``), not by capacity. Measured on MEM1 2-objective tasks (same data,
same prompt): hidden 256 (3.9M params) reached 0.06 EM per question after 819 steps / 10 min;
hidden 128 runs a step ~2.2x faster and reached 0.29 after 1735 steps; hidden 192 with 6
heads 0.10 after 1185 steps. Copying names out of the context (what every format needs) is
learnt by heads over many steps; the small width was never the limit. Depth is not either:
on a slow AVX2-only 2-core machine, 2 layers instead of 4 ran 2,031 steps in ``memkit sft``'s 10
minutes (0.30 s a step against 0.42) and reached EM 0.23 against 0.21 (100 held-out tasks),
inside the noise, so the 4 layers the papers' recipes and our recorded numbers assume stay.
The initialisation helps a little, not enough: HF's normal(0, 0.02) on every matrix against
0.04 and 0.08 (the same data, the 1,383 steps ``memkit sft``'s 10 minutes run there, each run on
one core with ``max_seconds=None``) reached EM 0.16, 0.275 and 0.245 with seed 0, and 0.18 (0.02)
against 0.24 (0.04) with seed 1 (100 held-out tasks, standard error ~0.03): about +0.09, far
from the 0.6 that ~2,500 steps give, so the default stays (every recorded number assumes it).

Parameter count for vocab V: embeddings V*128 (tied with the LM head) + 4 layers x
(4*128*128 attention + 3*128*344 MLP) ~= 0.79M + V*128, i.e. ~1.2M at V ~ 3000 (the world
tokenizer stops merging below its 4096 cap).

Attention implementation: ``"sdpa"`` (PyTorch scaled_dot_product_attention). It accepts the
boolean / additive 4D masks that MEM1's packed trajectories need, and is what transformers
picks by default; ``"eager"`` gives the same numbers (tested to 1e-5) and is slower.
"""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_config(vocab_size: int, *, pad_token_id: int = 0, bos_token_id: int = 1,
                eos_token_id: int = 2, attn_implementation: str = "sdpa") -> LlamaConfig:
    """The tiny model's config (defaults match :func:`train_tokenizer`'s special ids)."""
    if vocab_size < 8:
        raise ValueError(f"vocab_size={vocab_size} is not a real vocabulary; pass len(tokenizer)")
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=344,  # ~8/3 * 128 rounded to a multiple of 8 (SwiGLU sizing)
        num_hidden_layers=4,
        num_attention_heads=4,  # head_dim 32
        num_key_value_heads=4,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        initializer_range=0.02,
    )
    cfg._attn_implementation = attn_implementation
    return cfg


def build_tiny(tokenizer, seed: int = 0, attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """A freshly initialised float32 tiny Llama sized to ``tokenizer`` (same seed -> same weights).

    ``len(tokenizer)`` (not ``tokenizer.vocab_size``) is used so the added tag tokens get rows.
    The global torch RNG is restored afterwards so building a model does not shift other
    seeded code.
    """
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise ValueError(f"tokenizer has no {name[:-3]}; build it with memkit.models.train_tokenizer")
    cfg = tiny_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, attn_implementation=attn_implementation)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).to(torch.float32)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()
