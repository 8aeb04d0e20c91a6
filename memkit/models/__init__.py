"""Policies: tiny (from scratch), SmolLM2-135M (offline GGUF), any HF id; LoRA; generation.

Public API::

    load_policy(spec, lora=None, cache_dir=None, device=None, dtype=None, *, texts=None, seed=0) -> LoadedModel
    LoadedModel(model, tokenizer, spec, wrap, backend_factory=None).backend() -> RolloutBackend (HFBackend by default)
    LoraSpec(r=16, alpha=32, dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    train_tokenizer(texts, vocab_size=4096) -> PreTrainedTokenizerFast
    tiny_config(vocab_size) -> LlamaConfig ; build_tiny(tokenizer, seed) -> LlamaForCausalLM
    load_smollm2(cache_dir, dtype, device) -> (model, tokenizer)
    HFBackend(model, tokenizer).generate(prompts, max_new_tokens, stop, temperature, top_p, generator) -> list[Generation]
    RolloutBackend: generate(...) and sync_weights(model), the seam every engine plugs into (memkit.models.backend)
    sequence_logprobs(model, context_ids, output_ids, temperature=1.0) -> Tensor (len(output_ids),)
"""

from memkit.models.adapters import export_merged
from memkit.models.backend import BackendFactory, RolloutBackend, check_backend, hf_backend
from memkit.models.generation import Generation, HFBackend, sample_next, sequence_logprobs
from memkit.models.loading import (
    K_DOCS_ATTR,
    LORA_TARGETS,
    LoadedModel,
    LoraSpec,
    apply_lora,
    chat_wrap,
    identity_wrap,
    is_chat,
    load_policy,
    trained_k_docs,
    wrap_for,
)
from memkit.models.smollm import find_gguf, load_smollm2
from memkit.models.tiny import build_tiny, tiny_config
from memkit.models.tokenizer import SPECIAL_TOKENS, TAGS, tag_ids, train_tokenizer
from memkit.models.training import checkpointed_training, decoder_and_head, frozen_copy, set_gradient_checkpointing

__all__ = [
    "Generation",
    "HFBackend",
    "sample_next",
    "sequence_logprobs",
    "BackendFactory",
    "RolloutBackend",
    "check_backend",
    "hf_backend",
    "K_DOCS_ATTR",
    "LORA_TARGETS",
    "LoraSpec",
    "LoadedModel",
    "apply_lora",
    "chat_wrap",
    "checkpointed_training",
    "frozen_copy",
    "decoder_and_head",
    "identity_wrap",
    "load_policy",
    "trained_k_docs",
    "is_chat",
    "wrap_for",
    "set_gradient_checkpointing",
    "export_merged",
    "find_gguf",
    "load_smollm2",
    "build_tiny",
    "tiny_config",
    "SPECIAL_TOKENS",
    "TAGS",
    "tag_ids",
    "train_tokenizer",
]
