"""The tiny policy: a ~1.2M-parameter Llama built from a config, trained from scratch.

Why Llama: it is the architecture of the papers' Qwen/Llama policies (RoPE, RMSNorm, SwiGLU),
so everything downstream (KV cache, LoRA target names ``q_proj``..., position ids) is the
same code path as for a 7B model.

Why this size (4 layers x hidden 128, 4 heads of 32): on 2 CPU cores SFT is bounded by the
training sequences it gets through per minute, not by capacity. Copying names out of the context
(what every format needs) is learnt by attention heads over many steps, so a narrower model that
runs more steps a minute learns it sooner; wider, shallower or differently initialised variants
did no better (measured: docs/findings.md, 'Tiny model size').

Parameter count for vocab V: embeddings V*128 (tied with the LM head) + 4 layers x
(4*128*128 attention + 3*128*344 MLP) ~= 0.79M + V*128, i.e. ~1.2M at V ~ 3000 (the world
tokenizer stops merging below its 4096 cap).

Attention implementation: ``"sdpa"`` (PyTorch scaled_dot_product_attention). It accepts the
boolean / additive 4D masks that MEM1's packed trajectories need, and is what transformers
picks by default; ``"eager"`` gives the same numbers (tested to 1e-5). Which is faster depends on
the CPU, so CPU SFT times both (``SFTConfig.cpu_attention``).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_config(
    vocab_size: int,
    *,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    attn_implementation: str = "sdpa",
) -> LlamaConfig:
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
    cfg = tiny_config(
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation=attn_implementation,
    )
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
