"""How a trainer runs a loaded model: the transformer body and the LM head apart, and activation
checkpointing on or off.

Both save memory and compute in the training forward of SFT and the RL update, without changing a
log-prob: :func:`decoder_and_head` lets a loss run the head only at the positions it scores (the
head is ~25% of the tiny model's FLOPs per token, and most positions of a call are context), and
:func:`checkpointed_training` keeps one input per decoder layer for the backward instead of every
intermediate. Loading the model is :mod:`memkit.models.loading`.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

#: Config fields of models whose forward changes the logits after the LM head (Gemma 2/3,
#: Cohere, Granite): body + head alone would give other log-probs.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _wrapped_for_training(model) -> bool:
    """DDP, FSDP (1 or 2), a DeepSpeed engine or a :class:`~memkit.models.lockstep.Lockstep` around the model."""
    from memkit.models.lockstep import Lockstep

    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, Lockstep)):
        return True
    if type(model).__name__ == "DeepSpeedEngine":
        return True
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(model, (FSDPModule, FullyShardedDataParallel))


def decoder_and_head(model):
    """``(transformer body, LM head)`` of a causal LM, peft-wrapped or not, or None.

    Losses that need log-probs at a few positions (SFT outputs, RL response tokens) run the
    body once and the head only where needed: the head is ~25% of the tiny model's FLOPs per
    token, and most positions of a call are context. None (callers fall back to ``model(...)``)
    for DDP/FSDP/DeepSpeed-wrapped models, whose forward runs the gradient hooks or the
    unsharding, and for models whose forward changes the logits after the head.
    """
    if _wrapped_for_training(model):
        return None  # the wrapper's forward does the gradient hooks / unsharding: go through it (logits_to_keep)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    if any(getattr(cfg, name, None) not in (None, 1, 1.0) for name in _LOGIT_POSTPROCESSING):
        return None  # its forward rescales the head's logits after the head (softcapping, ...)
    decoder = getattr(base, getattr(base, "base_model_prefix", "model"), None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    return (decoder, head) if decoder is not None and head is not None else None


def set_gradient_checkpointing(model, on: bool) -> None:
    """Turn activation checkpointing of an HF model (peft-wrapped or not) on or off.

    On, each decoder layer keeps only its input for the backward and recomputes the rest: activation
    memory ~ layers x tokens x hidden instead of layers x tokens x (every intermediate). HF checkpoints
    only in training mode (``model.train()``), so the caller trains in train mode; dropout must then be
    0 for the log-probs to equal eval mode's (memkit's models are built with dropout 0: a test checks
    on/off give the same log-probs and gradients). Non-reentrant checkpointing, which needs no input
    that requires grad (LoRA's frozen embeddings)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        if on:
            raise ValueError(f"{type(base).__name__} does not support gradient checkpointing; turn it off")
        return
    new = hasattr(base, "activation_checkpointing_enable")  # transformers >= 5.x names; 4.x has gradient_*
    if on:
        if new:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        base.config.use_cache = False
    elif any(getattr(m, "gradient_checkpointing", False) for m in base.modules()):
        base.activation_checkpointing_disable() if new else base.gradient_checkpointing_disable()
        base.config.use_cache = True


@contextmanager
def checkpointed_training(model, on: bool = True):
    """Inside: ``model`` in training mode with gradient checkpointing (:func:`set_gradient_checkpointing`);
    after: eval mode, checkpointing off (rollouts use the KV cache). ``on=False``: leaves it alone."""
    if not on:
        yield model
        return
    set_gradient_checkpointing(model, True)
    model.train()
    try:
        yield model
    finally:
        set_gradient_checkpointing(model, False)
        model.eval()


def frozen_copy(model, dtype: torch.dtype | None = None):
    """A frozen deep copy of ``model`` (eval mode, ``requires_grad=False``) whose floating-point
    parameters are cast to ``dtype`` (None: kept): the KL reference of full fine-tuning.

    The copy is made parameter by parameter (each cast once, tied weights stay tied), so a bfloat16
    copy of a float32 model never holds a float32 copy first: 2 bytes per parameter instead of 4.
    Buffers (rotary frequencies) are copied as they are."""
    memo = {}
    for p in model.parameters():
        if id(p) not in memo:
            cast = dtype if dtype is not None and p.is_floating_point() else p.dtype
            memo[id(p)] = torch.nn.Parameter(p.detach().to(cast, copy=True), requires_grad=False)
    return copy.deepcopy(model, memo).eval()
