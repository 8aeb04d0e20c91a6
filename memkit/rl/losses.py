"""Policy / value / KL losses and their aggregation (verl ``core_algos`` naming).

Conventions
-----------
Every per-token tensor here is ``[B, L]`` and *token aligned*: ``logp[b, i]`` is
``log pi(x[b, i] | context of token i)``, the same index as the token it scores (see
:func:`token_logprobs`). ``mask`` is 1 on tokens that enter the loss (the policy's own
output tokens; observations, prompts and padding are 0). Bool, int or float masks are
accepted; they are used multiplicatively only.

Each vectorised kernel has a plain Python loop reference (``*_loop``) that the tests compare
against across seeds; the loops are written for reading, not speed.
"""

from __future__ import annotations

import math

import torch

from memkit.rl.choices import AGG_MODES, KL_KINDS  # noqa: F401  the aggregations and estimators below


# ----------------------------------------------------------------------------- aggregation
def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """sum(v * m) / max(sum(m), 1) over ``dim`` (all dims when None)."""
    m = mask.to(values.dtype)
    return (values * m).sum(dim=dim) / m.sum(dim=dim).clamp(min=1.0)


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar.

    values, mask: ``[B, L]``. Rows whose mask is all zero (padding rows) are ignored by the
    ``seq-mean-*`` modes (verl would divide by zero there).

    - ``token-mean``:          sum_{b,t} m v / sum_{b,t} m          (every token weighs the same)
    - ``seq-mean-token-sum``:  1/B' sum_b sum_t m v                  (longer sequences weigh more)
    - ``seq-mean-token-mean``: 1/B' sum_b (sum_t m v / sum_t m)      (every sequence weighs the same;
      with one row per call this is MemSearcher eq. 7: 1/sum_i n_i sum_i sum_j J(T_ij))

    B' = number of rows with at least one masked-in token.
    """
    m = mask.to(values.dtype)
    if mode == "token-mean":
        return masked_mean(values, m)
    row_n = m.sum(-1)
    live = (row_n > 0).to(values.dtype)
    n_rows = live.sum().clamp(min=1.0)
    row_sum = (values * m).sum(-1)
    if mode == "seq-mean-token-sum":
        return (row_sum * live).sum() / n_rows
    if mode == "seq-mean-token-mean":
        return (row_sum / row_n.clamp(min=1.0) * live).sum() / n_rows
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGG_MODES}")


def aggregate_loop(values, mask, mode: str = "token-mean") -> float:
    """Loop reference for :func:`aggregate` (python floats)."""
    v, m = values.tolist(), [[float(x) for x in r] for r in mask.tolist()]
    if mode == "token-mean":
        num = sum(v[b][t] * m[b][t] for b in range(len(v)) for t in range(len(v[b])))
        den = sum(sum(r) for r in m)
        return num / max(den, 1.0)
    per_row = []
    for b in range(len(v)):
        n = sum(m[b])
        if n == 0:
            continue
        s = sum(v[b][t] * m[b][t] for t in range(len(v[b])))
        per_row.append(s if mode == "seq-mean-token-sum" else s / n)
    if mode not in AGG_MODES:
        raise ValueError(mode)
    return sum(per_row) / max(len(per_row), 1)


# ----------------------------------------------------------------------------- policy loss
def ppo_clip_terms(
    logp,
    old_logp,
    advantages,
    mask,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate per token, and its metrics as sums over ``mask``'s tokens.

    shape: logp, old_logp, advantages, mask ``[B, L]`` -> ``l`` ``[B, L]`` (the ``l_t`` of
    :func:`ppo_clip_loss`, to be weighted by the caller) and ``{"clip_frac", "clip_frac_lower",
    "approx_kl", "ratio", "tokens"}``: sums over masked tokens (of the clipped indicator,
    ``old_logp - logp``, ``r_t``, 1), so a trainer adds them over micro-batches and divides once.
    """
    eps_high = clip_low if clip_high is None else clip_high
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + eps_high)
    loss_tok = torch.maximum(l1, l2)
    lower = torch.zeros_like(loss_tok, dtype=torch.bool)
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError("clip_ratio_c must be > 1 (dual-clip lower bound)")
        l3 = -advantages * clip_ratio_c
        lower = (advantages < 0) & (loss_tok > l3)
        loss_tok = torch.where(advantages < 0, torch.minimum(loss_tok, l3), loss_tok)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        stats = {
            "clip_frac": float(((l2 > l1).to(logp.dtype) * m).sum()),
            "clip_frac_lower": float((lower.to(logp.dtype) * m).sum()),
            "approx_kl": float((-log_ratio * m).sum()),
            "ratio": float((ratio * m).sum()),
            "tokens": float(m.sum()),
        }
    return loss_tok, stats


def ppo_clip_loss(
    logp,
    old_logp,
    advantages,
    mask,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    agg: str = "token-mean",
    clip_ratio_c: float | None = None,
):
    """PPO clipped surrogate (Schulman et al. 2017), per token (:func:`ppo_clip_terms`), then :func:`aggregate`.

    logp, old_logp, advantages, mask: ``[B, L]`` (token aligned). ``clip_high`` defaults to
    ``clip_low`` (symmetric); a larger ``clip_high`` is DAPO's clip-higher.

        r_t   = exp(logp_t - old_logp_t)               (log-ratio clamped to [-20, 20])
        l_t   = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
        dual clip (``clip_ratio_c`` = c > 1, Ye et al. 2019), only where A_t < 0:
        l_t   = min(l_t, -A_t c)
        loss  = aggregate(l, mask, agg)

    Returns ``(loss, stats)``; stats (detached scalars): ``clip_frac`` (share of masked tokens
    where the clipped term is the active one), ``approx_kl`` = mean(old_logp - logp) (verl's
    ``ppo_kl``), ``ratio_mean``, ``clip_frac_lower`` (dual clip active).
    """
    loss_tok, sums = ppo_clip_terms(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c)
    n = max(sums["tokens"], 1.0)
    stats = {
        "clip_frac": sums["clip_frac"] / n,
        "clip_frac_lower": sums["clip_frac_lower"] / n,
        "approx_kl": sums["approx_kl"] / n,
        "ratio_mean": sums["ratio"] / n,
    }
    return aggregate(loss_tok, mask, agg), stats


def ppo_clip_loss_loop(
    logp, old_logp, advantages, mask, clip_low=0.2, clip_high=None, agg="token-mean", clip_ratio_c=None
) -> float:
    """Loop reference for :func:`ppo_clip_loss` (loss value only)."""
    eh = clip_low if clip_high is None else clip_high
    rows = []
    for b in range(logp.shape[0]):
        row = []
        for t in range(logp.shape[1]):
            a = float(advantages[b, t])
            r = math.exp(max(-20.0, min(20.0, float(logp[b, t]) - float(old_logp[b, t]))))
            rc = min(max(r, 1.0 - clip_low), 1.0 + eh)
            lt = max(-a * r, -a * rc)
            if clip_ratio_c is not None and a < 0:
                lt = min(lt, -a * clip_ratio_c)
            row.append(lt)
        rows.append(row)
    return aggregate_loop(torch.tensor(rows, dtype=torch.float64), mask, agg)


# ----------------------------------------------------------------------------- value loss
def value_terms(values, old_values, returns, mask, clip: float | None = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic's clipped squared error per token, ``0.5 * l_t`` of :func:`value_loss`, and
    ``{"vf_clip_frac"}``: the number of masked tokens where the clipped term is the larger.
    shape: all ``[B, L]`` -> ``[B, L]``."""
    l1 = (values - returns) ** 2
    if clip is None:
        l2 = l1
    else:
        l2 = (old_values + torch.clamp(values - old_values, -clip, clip) - returns) ** 2
    with torch.no_grad():
        stats = {"vf_clip_frac": float(((l2 > l1).to(values.dtype) * mask.to(values.dtype)).sum())}
    return 0.5 * torch.maximum(l1, l2), stats


def value_loss(values, old_values, returns, mask, clip: float | None = 0.2, agg: str = "token-mean"):
    """PPO critic loss with value clipping. All inputs ``[B, L]``.

        v_clip = old_v + clip(v - old_v, -c, c)
        l_t    = max((v_t - R_t)^2, (v_clip_t - R_t)^2)     (plain (v - R)^2 when clip is None)
        loss   = 0.5 * aggregate(l, mask, agg)

    Returns ``(loss, stats)`` with ``vf_clip_frac`` (share where the clipped term is larger).
    """
    loss_tok, sums = value_terms(values, old_values, returns, mask, clip)
    return aggregate(loss_tok, mask, agg), {"vf_clip_frac": sums["vf_clip_frac"] / max(float(mask.sum()), 1.0)}


def value_loss_loop(values, old_values, returns, mask, clip=0.2, agg="token-mean") -> float:
    rows = []
    for b in range(values.shape[0]):
        row = []
        for t in range(values.shape[1]):
            v, ov, R = float(values[b, t]), float(old_values[b, t]), float(returns[b, t])
            vc = v if clip is None else ov + min(max(v - ov, -clip), clip)
            row.append(max((v - R) ** 2, (vc - R) ** 2))
        rows.append(row)
    return 0.5 * aggregate_loop(torch.tensor(rows, dtype=torch.float64), mask, agg)


# ----------------------------------------------------------------------------- KL to reference
def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs (Schulman 2020,
    http://joschu.net/blog/kl-approx.html). With d = ref_logp - logp (samples from pi):

    - ``k1`` / ``kl``:          -d = logp - ref_logp              (unbiased, high variance, can be < 0)
    - ``abs``:                  |logp - ref_logp|
    - ``k2`` / ``mse``:         0.5 * d^2                          (biased, low variance)
    - ``k3`` / ``low_var_kl``:  exp(d) - d - 1 >= 0                (unbiased, low variance);
      as in verl, d is clamped to [-20, 20] and the result to [-10, 10] for stability
      (the clamps only act on extreme tokens; ``k3`` and ``low_var_kl`` are the same function).

    Shapes: any, elementwise; ``[B, L]`` in the trainer.
    """
    if kind in ("k1", "kl"):
        return logp - ref_logp
    if kind == "abs":
        return (logp - ref_logp).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (logp - ref_logp).square()
    if kind in ("k3", "low_var_kl"):
        d = torch.clamp(ref_logp - logp, -20.0, 20.0)
        return torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_KINDS}")


def kl_penalty_loop(logp, ref_logp, kind="low_var_kl") -> list:
    out = []
    for a, r in zip(logp.flatten().tolist(), ref_logp.flatten().tolist()):
        if kind in ("k1", "kl"):
            out.append(a - r)
        elif kind == "abs":
            out.append(abs(a - r))
        elif kind in ("k2", "mse"):
            out.append(0.5 * (r - a) ** 2)
        else:
            d = min(max(r - a, -20.0), 20.0)
            out.append(min(max(math.exp(d) - d - 1.0, -10.0), 10.0))
    return out


# ----------------------------------------------------------------------------- entropy / log-probs
def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v.  ``[..., V] -> [...]``."""
    p = torch.softmax(logits.float(), dim=-1)
    return torch.logsumexp(logits.float(), dim=-1) - (p * logits.float()).sum(-1)


def entropy_from_logits_loop(logits) -> list:
    out = []
    for row in logits.reshape(-1, logits.shape[-1]).tolist():
        m = max(row)
        z = sum(math.exp(x - m) for x in row)
        out.append(-sum((math.exp(x - m) / z) * ((x - m) - math.log(z)) for x in row))
    return out


def _scored(logits, input_ids, b, t, temperature: float, with_entropy: bool):
    """``logp [B, L]`` (and entropy) from the float32 logits ``[N, V]`` predicting the N scored tokens
    ``input_ids[b, t]``; 0 at every other position."""
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[b, t] = logits.gather(-1, input_ids[b, t, None])[:, 0] - torch.logsumexp(logits, dim=-1)
    if with_entropy:
        ent = torch.zeros_like(logp)
        ent[b, t] = entropy_from_logits(logits)
        return logp, ent
    return logp


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask=None,
    position_ids=None,
    pred_index: torch.Tensor | None = None,
    with_entropy: bool = False,
    loss_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
):
    """Token-aligned log-probs of ``input_ids`` under ``model`` (one forward pass).

    input_ids ``[B, L]``; attention_mask ``[B, L]`` (padding, bool/0-1) or ``[B, 1, L, L]``
    (bool, True = may attend, or additive float 0/-inf, see ``packed_forward.model_attention_mask``);
    position_ids ``[B, L]`` or None; pred_index ``[B, L]`` long: which position's logits predict
    token i (default i - 1, the causal predecessor; -1 = no prediction, logp = 0 there).

        out[b, i] = log_softmax(logits[b, pred_index[b, i]] / T)[input_ids[b, i]]

    ``temperature`` T: the policy scored is the tempered one, softmax(logits / T), which is what
    :class:`~memkit.models.HFBackend` samples from and records at T (verl's actor divides the
    logits by the rollout temperature the same way). T = 1 is the model itself; greedy decoding
    is the same for every T.

    ``loss_mask [B, L]``: when given, only those tokens are scored (0 elsewhere) and the LM
    head runs only at their predicting positions: the same numbers for the tokens a loss uses,
    without the ``[B, L, V]`` logits of the context. A bare model runs its body and then its head
    on the N scored positions (``models.decoder_and_head``); a wrapped one (DDP, FSDP, DeepSpeed,
    whose forward must run) is called with HF's ``logits_to_keep`` = the K positions any row needs
    (``[B, K, V]`` logits, K <= L; one row per micro-batch: K = N).

    Returns ``logp [B, L]`` (float32), and ``entropy [B, L]`` of the same distributions when
    ``with_entropy``.
    """
    from memkit.models.training import decoder_and_head

    B, L = input_ids.shape
    if pred_index is None:
        pred_index = torch.arange(-1, L - 1, device=input_ids.device).expand(B, L)
    kw = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if position_ids is not None:
        kw["position_ids"] = position_ids
    src = pred_index.clamp(min=0)
    valid = pred_index >= 0
    parts = decoder_and_head(model) if loss_mask is not None else None
    if parts is not None:
        decoder, head = parts
        b, t = (loss_mask.bool() & valid).nonzero(as_tuple=True)  # the N scored tokens
        hidden = decoder(**kw).last_hidden_state  # [B, L, H]
        return _scored(head(hidden[b, src[b, t]]).float(), input_ids, b, t, temperature, with_entropy)  # [N, V]
    if loss_mask is not None:  # a wrapped model (DDP, FSDP, DeepSpeed): its forward, the head where scored
        scored = loss_mask.bool() & valid
        keep = torch.unique(src[scored])  # [K] sorted positions whose logits a token needs
        try:
            logits = model(**kw, logits_to_keep=keep).logits  # [B, K, V]
        except TypeError:  # a model without logits_to_keep: every position's logits, below
            keep = None
        if keep is not None:
            b, t = scored.nonzero(as_tuple=True)
            logits = logits[b, torch.searchsorted(keep, src[b, t])].float()  # [N, V]
            return _scored(logits, input_ids, b, t, temperature, with_entropy)
    logits = model(**kw).logits.float()  # [B, L, V]
    if temperature != 1.0:
        logits = logits / temperature
    rows = torch.arange(B, device=input_ids.device).unsqueeze(-1)  # [B, 1]
    lse = torch.logsumexp(logits, dim=-1)  # [B, L]
    logp = logits[rows, src, input_ids] - lse.gather(1, src)  # [B, L], no [B, L, V] copy
    if loss_mask is not None:
        valid = valid & loss_mask.bool()
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    if with_entropy:
        ent = entropy_from_logits(logits).gather(1, src)
        return logp, torch.where(valid, ent, torch.zeros_like(ent))
    return logp
