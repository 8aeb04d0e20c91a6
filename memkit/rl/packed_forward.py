"""A packed batch meets the model: the attention-mask form each backend needs, log-probs of a
packed batch, and how far they are from recomputing every call on its own.

Mask convention verified in transformers 5.x (``masking_utils._preprocess_mask_arguments``):
a 4D mask is returned as-is, untouched. The ``sdpa`` backend then hands it to
``scaled_dot_product_attention``: bool True = attend, float = *added* to the scores. The
``eager`` backend always *adds* it (``attn_weights + attention_mask``), so there a bool mask
becomes +1/+0 and masks nothing. A 0/1 float mask masks nothing on either backend (the MEM1
reference code's bug). :func:`model_attention_mask` therefore passes bool to ``sdpa`` and an
additive 0/-inf float mask to ``eager``; tests pin all four behaviours.

A 2D mask's dense attention computes every masked cell; :func:`packed_attention` picks the path
that skips them (``TrainConfig.runtime.attention``, :mod:`memkit.rl.block_attention`).
"""

from __future__ import annotations

import contextlib

import torch

from memkit.core.trajectory import TrainingUnit, Trajectory, as_unit
from memkit.models.generation import sequence_logprobs
from memkit.rl.block_attention import ATTENTION_PATHS, flex_available, flex_block_mask, register_blocks
from memkit.rl.losses import token_logprobs
from memkit.rl.packing import PackedBatch, pack

MASK_FORMS = ("bool", "additive", "float01")


def mask_in_form(mask: torch.Tensor, form: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """memkit's bool 4D mask (True = attend) written another way: ``bool`` (as is),
    ``additive`` (0 where allowed, -inf elsewhere: correct on every backend) or ``float01``
    (1.0 / 0.0, what ``mask.to(bf16)`` gives: the MEM1 reference code's pitfall). Attention
    backends *add* a float mask to the scores, so ``float01`` shifts allowed keys by +1 and
    masks nothing."""
    if form == "bool":
        return mask
    if form == "additive":
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    if form == "float01":
        return mask.to(dtype)
    raise ValueError(f"unknown mask form {form!r}; choose one of {MASK_FORMS}")


@torch.no_grad()
def mask_form_logit_gap(model, batch: PackedBatch, form: str) -> dict:
    """How much the logits move when a 2D-packed batch's mask reaches ``model`` in ``form``
    instead of the right form (:func:`model_attention_mask`).

    Compared at the positions that predict trained tokens (``pred_index`` where ``loss_mask``
    is 1). Returns ``{"logit_max_abs", "logit_mean_abs", "logprob_max_abs"}`` (the last on the
    trained tokens' log-probs). ~1e-6 means the form masks correctly on this backend."""
    if batch.attention_mask.dim() != 4:
        raise ValueError("mask_form_logit_gap needs a 2D-mode batch (mem1_mask or mem1_exact)")
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    ids, pos = batch.input_ids.to(dev), batch.position_ids.to(dev)
    mask = batch.attention_mask.to(dev)
    right = model(
        input_ids=ids, attention_mask=model_attention_mask(mask, model), position_ids=pos, use_cache=False
    ).logits.float()
    other = model(
        input_ids=ids, attention_mask=mask_in_form(mask, form, dtype), position_ids=pos, use_cache=False
    ).logits.float()
    sel = batch.loss_mask > 0
    b, i = sel.nonzero(as_tuple=True)
    q = batch.pred_index[b, i]
    b, q, tok = b.to(dev), q.to(dev), batch.input_ids[sel].to(dev)
    d = (right[b, q] - other[b, q]).abs()
    lp = lambda x: x[b, q].log_softmax(-1).gather(-1, tok[:, None])[:, 0]  # noqa: E731
    return {
        "logit_max_abs": float(d.max()) if d.numel() else 0.0,
        "logit_mean_abs": float(d.mean()) if d.numel() else 0.0,
        "logprob_max_abs": float((lp(right) - lp(other)).abs().max()) if d.numel() else 0.0,
    }


def model_attention_mask(mask: torch.Tensor, model) -> torch.Tensor:
    """Convert memkit's bool mask (True = attend) into what ``model``'s attention backend
    expects. ``[B, L]`` padding masks pass through (transformers builds causal + padding).
    4D: ``sdpa`` gets the bool mask; ``eager`` an additive float mask, 0 where allowed and -inf
    elsewhere (never 0/1: added to the scores, a 0/1 mask masks nothing)."""
    if mask.dim() == 2:
        return mask
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa") or "sdpa"
    if impl == "sdpa":
        return mask
    if impl == "eager":
        return mask_in_form(mask, "additive", next(model.parameters()).dtype)
    raise NotImplementedError(f"2D packed masks need attn_implementation 'sdpa' or 'eager', not {impl!r}")


def resolve_attention(path: str, device) -> str:
    """The attention path a 2D-masked forward on ``device`` takes: ``dense`` | ``blocks`` | ``flex``.

    ``auto`` = ``blocks`` on CPU, where attention is most of a packed row's work and the gathered
    blocks skip ~90% of its cells at k = 8 (``flex`` has no CPU backward and compiles for ~20 s
    per row length); ``dense`` elsewhere: on a GPU the tiny model's forward is bound by kernel
    launches, not FLOPs, and the dense kernel was the fastest of the three
    (``benchmarks/grpo_step.py``; figures: docs/findings.md, 'Benchmarks')."""
    if path not in ATTENTION_PATHS:
        raise ValueError(f"unknown attention path {path!r}; choose one of {ATTENTION_PATHS}")
    if path == "flex" and not flex_available():
        raise ValueError("attention='flex' needs torch.nn.attention.flex_attention (torch >= 2.5); use 'blocks'")
    if path == "auto":
        return "blocks" if torch.device(device).type == "cpu" else "dense"
    return path


def _configs(model) -> list:
    """Every distinct transformers config inside ``model`` (a critic's backbone holds a copy)."""
    seen = {}
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            seen[id(cfg)] = cfg
    return list(seen.values())


@contextlib.contextmanager
def packed_attention(model, mask: torch.Tensor, path: str = "auto"):
    """Run ``model`` on a packed batch's mask along attention ``path`` (``TrainConfig.runtime.attention``):
    yields the mask to pass as ``attention_mask``, with the model's attention implementation
    switched for the duration of the block (restored after; a backward needs no switch).

    ``[B, L]`` padding masks (``separate`` rows) and ``dense`` pass through
    :func:`model_attention_mask`. A bool ``[B, 1, L, L]`` mask under ``blocks`` stays as is and
    runs on :func:`memkit.rl.block_attention.block_attention`; under ``flex`` it becomes a
    ``BlockMask`` for transformers' ``flex_attention`` backend (no CPU backward)."""
    path = resolve_attention(path, mask.device)
    if mask.dim() != 4 or path == "dense":
        yield model_attention_mask(mask, model)
        return
    if mask.dtype != torch.bool:
        raise ValueError("packed_attention takes memkit's bool mask (True = attend); it converts it itself")
    if path == "flex" and mask.device.type == "cpu" and torch.is_grad_enabled():
        raise ValueError("attention='flex' has no backward on CPU (torch flex_attention); use 'blocks' or 'auto'")
    impl, arg = (register_blocks(), mask) if path == "blocks" else ("flex_attention", flex_block_mask(mask))
    configs = _configs(model)
    before = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = impl
    try:
        yield arg
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = b


def packed_token_logprobs(model, batch: PackedBatch, with_entropy: bool = False, attention: str = "auto"):
    """Token-aligned log-probs ``[B, L]`` of ``batch.input_ids`` under ``model`` (same layout as
    ``batch.old_logprobs``); compare / train only where ``batch.loss_mask`` is 1. With
    ``with_entropy`` also returns the entropy ``[B, L]`` of each predicting distribution.
    ``attention``: the path of a 2D mask (:func:`packed_attention`)."""
    dev = next(model.parameters()).device
    with packed_attention(model, batch.attention_mask.to(dev), attention) as mask:
        return token_logprobs(
            model,
            batch.input_ids.to(dev),
            mask,
            batch.position_ids.to(dev),
            batch.pred_index.to(dev),
            with_entropy=with_entropy,
        )


@torch.no_grad()
def packing_gap(model, units: list[TrainingUnit | Trajectory], mode: str, pad_id: int = 0) -> dict:
    """Measure how far a packing's output-token log-probs are from per-call recomputation (one
    plain causal forward of each call's ``context_ids + output_ids``:
    :func:`memkit.models.generation.sequence_logprobs`, the reference every packing is judged by).

    Returns ``{"max_abs", "mean_abs", "per_call_max": [[...] per unit], "n_tokens"}``.
    """
    units = [as_unit(u) for u in units]
    batch = pack(units, mode, pad_id)
    logp = packed_token_logprobs(model, batch)
    diffs, per_call = [], []
    for i, unit in enumerate(units):
        row_max = []
        for t, c in unit:
            # a call without context: its first token is predicted by nothing (nor trained)
            ref = (
                sequence_logprobs(model, c.context_ids, c.output_ids)
                if c.n_context
                else sequence_logprobs(model, c.output_ids[:1], c.output_ids[1:])
            )
            # separate: one row per call; the 2D modes: one row per trajectory
            b = int(((batch.unit_index == i) & (batch.call_index == t)).nonzero()[0]) if mode == "separate" else i
            sel = (batch.call_ids[b] == t) & (batch.loss_mask[b] > 0)
            d = (logp[b][sel].cpu() - ref.cpu()).abs()
            diffs.append(d)
            row_max.append(float(d.max()) if len(d) else 0.0)
        per_call.append(row_max)
    d = torch.cat(diffs) if diffs else torch.zeros(0)
    return {
        "max_abs": float(d.max()) if len(d) else 0.0,
        "mean_abs": float(d.mean()) if len(d) else 0.0,
        "per_call_max": per_call,
        "n_tokens": batch.n_tokens,
    }
