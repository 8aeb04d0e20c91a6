"""Batched sampling with a hand-written decoding loop, recording each token's log-prob.

Why not ``model.generate``: RL needs, for every generated token, the log-prob the *sampling
policy* gave it (PPO's ``old_logprobs``), exact stop-string handling (the rollout engine
parses ``</search>`` / ``</answer>`` and must train on exactly the ids it generated), and a
loop students can read in one screen. The loop is the textbook one:

1. **Left padding.** Prompts of different lengths are right-aligned in a (B, L) tensor so
   every row's next token is at column -1. ``attention_mask`` (B, L) is 0 on pads.
2. **Position ids = cumsum(mask) - 1.** Each row's first real token gets position 0, as in
   an unbatched forward, so padding does not shift RoPE (this is what makes batched
   output equal unbatched output). Pads get position 0; they are masked anyway.
3. **KV cache.** A prefill fills the cache (:mod:`memkit.models.kv`: identical prompts run
   once, a prefix shared by several prompts once, the rest in length-sorted chunks, written
   into a buffer preallocated for the new tokens); every later step feeds only the (B', 1)
   new tokens, the mask grows by one column, positions by 1.
4. **Sampling.** ``temperature == 0`` -> greedy argmax; else sample from
   softmax(logits / T), optionally restricted to the top-p nucleus.
5. **Finishing.** A row ends on an EOS id ("eos", the EOS id is kept in ``ids`` because the
   policy chose it and must be trained on it), when its decoded text (special tokens
   skipped, as in ``Generation.text``) contains a stop string ("stop", ids end with the
   token that completed the stop string), or at
   ``max_new_tokens`` ("length"). Finished rows are dropped from the batch and the cache
   (``DynamicCache.batch_select_indices``) once they are half of it (a compaction copies the
   cache), so long and short answers do not cost the same.

**Which log-prob is recorded.** For every sampled token we store
``log_softmax(logits / T)[token]`` with ``T = temperature`` (``T = 1`` for greedy). This is
the quantity a trainer recomputes with a fresh forward (:func:`sequence_logprobs`) for the
PPO ratio ``exp(logp_new - logp_old)``: at the first update the ratio is exactly 1 (up to
float noise). It is *not* the top-p renormalised probability: top-p is treated as a sampler
detail, as in verl/OpenRLHF; recording the truncated distribution would make old and new
log-probs come from different distributions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from memkit.models.kv import cache_kwarg, growable, left_pad, prefill


@dataclass
class Generation:
    """One generated continuation.

    ``ids``/``logprobs`` have equal length (one log-prob per generated id); ``text`` is
    ``decode(ids, skip_special_tokens=True)`` so it matches ``ids`` exactly (it can run a few
    characters past a stop string if the last token does).
    """

    ids: list[int]
    logprobs: list[float]
    text: str
    finish: Literal["stop", "eos", "length"] = "stop"


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for src in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        if src is None:
            continue
        ids.update([src] if isinstance(src, int) else list(src))
    return ids


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | Sequence[torch.Generator] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row.

    Args:
        logits: (B, V) next-token logits.
        generator: one generator for the whole batch, or B of them: row ``i`` then draws from its
            own stream, so its token depends on its logits and its stream only, not on which other
            rows share the batch (see :func:`inverse_cdf_sample`).
    Returns:
        tokens (B,) long and their log-probs (B,) float32 under ``log_softmax(logits / T)``
        (``T = 1`` when ``temperature == 0``, i.e. greedy).
    """
    logits = logits.float()
    if temperature == 0:
        logp = F.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
    logp = F.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        sorted_p = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    tok = inverse_cdf_sample(probs, generator)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


def uniform_draws(
    rows: int, generator: torch.Generator | Sequence[torch.Generator] | None, device: torch.device
) -> torch.Tensor:
    """(rows, 1) float64 draws from U[0, 1): ``rows`` from one stream, or one from each of ``rows`` streams.

    In a list, a ``None`` entry (a finished row still in the batch) draws nothing and gets 0.5.
    """
    if generator is None or isinstance(generator, torch.Generator):
        gen_device = generator.device if generator is not None else device
        return torch.rand((rows, 1), generator=generator, device=gen_device, dtype=torch.float64).to(device)
    if len(generator) != rows:
        raise ValueError(f"got {len(generator)} generators for {rows} rows; pass one per row, or a single generator")
    u = [
        0.5 if g is None else torch.rand((), generator=g, device=g.device, dtype=torch.float64).item()
        for g in generator
    ]
    return torch.tensor(u, dtype=torch.float64, device=device)[:, None]


def inverse_cdf_sample(
    probs: torch.Tensor, generator: torch.Generator | Sequence[torch.Generator] | None
) -> torch.Tensor:
    """One draw per row of ``probs`` (B, V), non-negative and not necessarily normalised.

    Inverse-transform sampling: with ``c = cumsum(p)`` and ``u ~ U[0, c_V)``, token ``i`` is the
    first with ``c_i > u``, which happens with probability ``p_i / c_V``; zero-probability tokens
    (``c_i = c_{i-1}``) are never picked. Same law as ``torch.multinomial(p, 1)``, but ~20x faster
    on CPU at rollout sizes (measured: docs/findings.md, 'Generation').
    With one generator per row, each row's ``u`` comes from its own stream (:func:`uniform_draws`).
    """
    cdf = probs.double().cumsum(-1)  # float64: the last entries of a float32 cumsum drift
    u = uniform_draws(probs.shape[0], generator, probs.device)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0]
    return tok.clamp_(max=probs.shape[-1] - 1)


@dataclass
class GenerationStats:
    """Where :class:`HFBackend`'s time went (summed over ``generate`` calls; ``reset()`` to restart)."""

    calls: int = 0
    prefill_seconds: float = 0.0
    prefill_tokens: int = 0  # prompt tokens actually run (after deduplication, padding excluded)
    decode_seconds: float = 0.0  # decode forwards + sampling + stop checks
    decode_steps: int = 0  # batched forwards of one new token per row
    decode_rows: int = 0  # rows summed over decode steps (rows / steps = mean batch)

    def reset(self) -> None:
        self.__init__()


class HFBackend:
    """Generation backend over any ``transformers`` causal LM (tiny, SmolLM2, Qwen ...).

    ``generate`` takes token ids (the engine tokenises contexts so it controls ids exactly)
    and returns one :class:`Generation` per prompt, in order.
    """

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self._growable: bool | None = None  # decided on first use (kv.growable)
        self.compact_below = 0.5  # drop finished rows when the live ones fall to this share of the batch
        self.min_shared_prefix: int | None = 16  # share prompt prefixes of >= this many tokens (None: off)
        self._stops: tuple[str, ...] = ()
        self._stop_hit: dict[int, bool] = {}
        self.stats = GenerationStats()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_weights(self, model) -> None:
        """The rollout-backend protocol's sync (:mod:`memkit.models.backend`): this loop decodes with
        the training model itself, so an optimizer step is seen at once; only a different model
        object (e.g. a reloaded one) is pointed at. Nothing is copied."""
        if model is not self.model:
            self.model, self._growable = model, None
            self.max_positions = getattr(model.config, "max_position_embeddings", None)

    def _check(self, prompts, max_new_tokens, temperature, top_p):
        if isinstance(prompts, (str, bytes)) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate(prompts=...) wants a list of token-id lists, e.g. [tokenizer.encode(text)]")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; start it with at least one token (e.g. tokenizer.bos_token_id)")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0 (0 means greedy)")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p={top_p} must be in (0, 1]; 1.0 disables nucleus sampling")
        longest = max(len(p) for p in prompts)
        if self.max_positions and longest + max_new_tokens > self.max_positions:
            raise ValueError(
                f"prompt of {longest} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
                f"max_position_embeddings={self.max_positions}; shorten the context or max_new_tokens"
            )

    def _may_stop(self, token_id: int) -> bool:
        """Can this token complete a stop string? Only if its own text holds a stop's last char."""
        hit = self._stop_hit.get(token_id)
        if hit is None:
            piece = self.tokenizer.decode([token_id], skip_special_tokens=True)
            # '\ufffd': part of a multi-byte character, which may finish a non-ASCII stop string
            hit = not piece or "\ufffd" in piece or any(s[-1] in piece for s in self._stops)
            self._stop_hit[token_id] = hit
        return hit

    def _hits_stop(self, ids: list[int], stop: tuple[str, ...], window: int) -> bool:
        """Does the text of ``ids`` (as in ``Generation.text``: specials skipped) contain a stop?

        Only the last ``window`` tokens are decoded (a stop string completed by the newest
        token lies there: >= 1 character per 4 byte-level tokens); the whole output is decoded
        when skipped special tokens made that tail too short to tell.
        """
        text = self.tokenizer.decode(ids[-window:], skip_special_tokens=True)
        if len(ids) > window and len(text) < window // 4:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return any(s in text for s in stop)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        stop: Sequence[str] = (),
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
    ) -> list[Generation]:
        """Sample continuations of ``prompts`` (B lists of ids) in one batch; see module doc.

        ``generator``: one stream for the batch, or a list of B streams, one per prompt: then a
        prompt's continuation is the one it would get alone with its stream (batch-invariant
        sampling; equal up to float noise in the logits, which flips a token only when a draw
        lands within ~1e-6 of a boundary between two tokens' probability mass).
        """
        if not prompts:
            return []
        self._check(prompts, max_new_tokens, temperature, top_p)
        if generator is not None and not isinstance(generator, torch.Generator):
            generator = list(generator)
            if len(generator) != len(prompts):
                raise ValueError(
                    f"got {len(generator)} generators for {len(prompts)} prompts; "
                    "pass one per prompt, or a single torch.Generator"
                )
        stop = tuple(s for s in stop if s)
        if stop != self._stops:
            self._stops, self._stop_hit = stop, {}
        if max_new_tokens == 0:
            return [Generation([], [], "", "length") for _ in prompts]
        model, dev = self.model, self.device
        was_training = model.training
        model.eval()  # dropout off: the recorded log-probs must be those of the policy itself
        try:
            return self._loop(prompts, max_new_tokens, stop, temperature, top_p, generator, dev)
        finally:
            model.train(was_training)

    def _loop(self, prompts, max_new_tokens, stop, temperature, top_p, generator, dev):
        B, st, t0 = len(prompts), self.stats, time.perf_counter()
        if self._growable is None:
            self._growable = growable(self.model)
        if self._growable:  # deduplicated, length-bucketed prefill into a preallocated cache (kv.py)
            logits, cache, mask, next_pos, n_run = prefill(
                self.model, prompts, self.pad_id, max_new_tokens, min_shared=self.min_shared_prefix
            )
            st.prefill_tokens += n_run
        else:  # e.g. sliding-window caches: one plain prefill, DynamicCache
            input_ids, mask, positions = (t.to(dev) for t in left_pad(prompts, self.pad_id))
            cache = DynamicCache(config=self.model.config)
            logits = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **cache_kwarg(self.model, cache),
            ).logits[:, -1, :]
            next_pos = positions[:, -1] + 1  # (B,)
            st.prefill_tokens += sum(len(p) for p in prompts)
        cache_kw = cache_kwarg(self.model, cache)  # one cache object for the whole call (compaction edits it in place)
        t1 = time.perf_counter()
        st.calls += 1
        st.prefill_seconds += t1 - t0
        rows: list[int | None] = list(range(B))  # batch position -> original row; None = finished
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        finish: list[str] = ["length"] * B
        window = 4 * max((len(s) for s in stop), default=0) + 8  # tokens that can hold a stop string

        per_row = isinstance(generator, list)  # one stream per row: follows the rows through compactions
        for _ in range(max_new_tokens):
            tok, lp = sample_next(logits, temperature, top_p, generator)
            live = []
            for j, (row, t, tok_lp) in enumerate(zip(rows, tok.tolist(), lp.tolist())):
                if row is None:  # finished earlier, still in the batch until the next compaction
                    continue
                out_ids[row].append(t)
                out_lp[row].append(tok_lp)
                if t in self.eos_ids:
                    finish[row] = "eos"
                elif stop and self._may_stop(t) and self._hits_stop(out_ids[row], stop, window):
                    finish[row] = "stop"
                elif len(out_ids[row]) < max_new_tokens:
                    live.append(j)
                    continue
                rows[j] = None
                if per_row:  # its stream is the trajectory's: no draws for tokens that are thrown away
                    generator[j] = None
            if not live:
                break
            # Drop finished rows from the batch and the cache once they are a large share of it:
            # each compaction copies the whole cache, so it is amortised rather than done per row.
            if len(live) <= self.compact_below * len(rows):
                idx = torch.tensor(live, device=dev)
                cache.batch_select_indices(idx)
                mask, tok, next_pos = mask[idx], tok[idx], next_pos[idx]
                rows = [rows[j] for j in live]
                if per_row:
                    generator = [generator[j] for j in live]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            logits = self.model(
                input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], use_cache=True, **cache_kw
            ).logits[:, -1, :]
            next_pos = next_pos + 1
            st.decode_steps += 1
            st.decode_rows += len(rows)
        st.decode_seconds += time.perf_counter() - t1
        return [
            Generation(out_ids[i], out_lp[i], self.tokenizer.decode(out_ids[i], skip_special_tokens=True), finish[i])
            for i in range(B)
        ]


@torch.no_grad()
def sequence_logprobs(
    model, context_ids: Sequence[int], output_ids: Sequence[int], temperature: float = 1.0
) -> torch.Tensor:
    """Log-probs of ``output_ids`` given ``context_ids`` from one fresh (uncached) forward.

    Returns a float32 tensor of shape (len(output_ids),): entry k is
    ``log_softmax(logits[len(context)-1+k] / T)[output_ids[k]]``, the same quantity
    :class:`HFBackend` records (``temperature=0`` is treated as ``T=1``, like greedy).
    Use it to check recorded ``old_logprobs`` or to score a fixed answer.
    """
    if len(context_ids) == 0:
        raise ValueError("context_ids is empty; a log-prob needs at least one token of context (e.g. BOS)")
    if len(output_ids) == 0:
        return torch.zeros(0)
    T = temperature if temperature > 0 else 1.0
    dev = next(model.parameters()).device
    ids = torch.tensor([list(context_ids) + list(output_ids)], dtype=torch.long, device=dev)
    logits = model(input_ids=ids).logits[0, len(context_ids) - 1 : -1].float()  # (n_out, V)
    logp = F.log_softmax(logits / T, dim=-1)
    return logp.gather(-1, ids[0, len(context_ids) :, None])[:, 0].cpu()
