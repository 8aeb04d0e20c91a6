"""The KV cache of batched sampling: deduplicated, length-bucketed prefill into a preallocated cache.

Each choice below was measured (docs/findings.md, 'Generation'):

* **Preallocated cache.** ``DynamicCache`` grows each layer with ``torch.cat``, copying the
  whole cache at every decoded token; here the new key/value is written into a buffer
  allocated once (:class:`GrowingLayer`), ~3x faster per step at B = 64.
* **Length-bucketed prefill.** Small forwards of length-sorted rows beat one padded forward
  (less padding, and activations that stay in cache). :func:`prefill` runs such chunks and
  writes each one's keys/values, right-aligned, into the shared buffer, so decoding still runs
  all rows in one batch.
* **Duplicate contexts are prefilled once.** A GRPO group starts from one prompt (and samples
  that made the same choices share later contexts too): rows with identical ids share one
  prefill and their cache rows are copied (vLLM's prefix caching, for whole contexts).
* **Shared prefixes are prefilled once.** Rows that start alike (the samples of a GRPO group
  share the task prompt at every turn) are grouped by :func:`prefix_groups`; all groups'
  prefixes run once, batched, and every prompt's own part runs on top of a copy of its
  prefix's cache (vLLM's automatic prefix caching, within one batch). It pays on SmolLM2-135M;
  on the 1.2M-parameter tiny model attention and cache copies, not the projections that sharing
  saves, are most of the cost, so it saves tokens more than time.
* ``logits_to_keep=1``: only the last position's logits are computed during prefill.

Numbers stay those of a plain forward: every row keeps its own positions (``cumsum(mask) -
1``, continued after a shared prefix) and its padding is masked, so the padding columns left of
a chunk in the buffer, and between a shared prefix and a row's own part, change nothing (tested
against unbatched generation).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values live in a buffer with room for ``capacity`` tokens.

    ``keys``/``values`` are views ``buffer[:, :, :length]``: attention sees exactly what a
    ``DynamicLayer`` would, but appending writes in place instead of reallocating.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        b, h, n, _ = keys.shape
        self._k = keys.new_zeros((b, h, capacity, keys.shape[-1]))
        self._v = values.new_zeros((b, h, capacity, values.shape[-1]))
        self._k[:, :, :n] = keys
        self._v[:, :, :n] = values
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._n = n
        self._view()

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    def update(self, key_states, value_states, *args, **kwargs):
        k = key_states.shape[-2]
        if self._n + k > self._k.shape[2]:  # out of room: grow like DynamicLayer would
            extra = max(k, self._k.shape[2])
            self._k = torch.cat([self._k, self._k.new_zeros(*self._k.shape[:2], extra, self._k.shape[3])], dim=2)
            self._v = torch.cat([self._v, self._v.new_zeros(*self._v.shape[:2], extra, self._v.shape[3])], dim=2)
        self._k[:, :, self._n : self._n + k] = key_states
        self._v[:, :, self._n : self._n + k] = value_states
        self._n += k
        self._view()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._view()

    def _unsupported(self, *args, **kwargs):
        # DynamicLayer's versions reassign keys/values and would leave _k/_v/_n stale: the next
        # update() would then write at the old length. Our generation loop never calls them.
        raise NotImplementedError("GrowingLayer supports update() and batch_select_indices() only")

    crop = batch_repeat_interleave = reorder_cache = reset = offload = prefetch = _unsupported


def dedupe(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Unique prompts (first-seen order) and, per input row, the index of its unique prompt."""
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(p) for p in index], rows


def length_chunks(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices sorted by length, cut into chunks of <= max_rows rows and <= max_tokens padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks, cur = [], []
    for i in order:
        if cur and (len(cur) >= max_rows or (len(cur) + 1) * lengths[i] > max_tokens):
            chunks.append(cur)
            cur = []
        cur.append(i)
    return chunks + [cur] if cur else chunks


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def prefix_groups(prompts: list[list[int]], min_len: int = 16) -> list[tuple[int, list[int]]]:
    """Disjoint groups of >= 2 prompts sharing a prefix of >= ``min_len`` tokens: ``[(P, rows)]``.

    Prompts sorted lexicographically put shared prefixes next to each other; cutting that order
    where the neighbours' common prefix falls below a threshold ``tau`` gives groups whose
    shared prefix ``P`` is the smallest neighbour LCP inside (capped so every row keeps >= 1
    token of its own, whose logits start decoding). ``tau`` is chosen among the neighbour LCPs
    to save the most tokens, ``sum((len(rows) - 1) * P)``: a batch-wide instruction (short, all
    rows) loses to per-task prompts (long, a few rows each) when those save more.
    """
    n = len(prompts)
    order = sorted(range(n), key=lambda i: prompts[i])
    adj = [_lcp(prompts[order[j - 1]], prompts[order[j]]) for j in range(1, n)]  # adj[j-1]: order[j-1] vs order[j]
    best: tuple[int, list] = (0, [])
    for tau in sorted({a for a in adj if a >= min_len}):
        groups, start = [], 0
        for end in range(1, n + 1):  # the run order[start:end] ends where the neighbour LCP drops below tau
            if end < n and adj[end - 1] >= tau:
                continue
            if end - start >= 2:
                run = order[start:end]
                P = min(min(adj[start : end - 1]), min(len(prompts[i]) for i in run) - 1)
                if P >= min_len:
                    groups.append((P, run))
            start = end
        saved = sum((len(rows) - 1) * P for P, rows in groups)
        if saved > best[0]:
            best = (saved, groups)
    return best[1]


_CACHE_KWARG: dict[type, str] = {}


def cache_kwarg(model, cache) -> dict:
    """``{name: cache}`` for a forward call, ``name`` being what this transformers calls it.

    transformers 5.x renamed the forward argument ``past_key_values`` to ``cache`` (the old name
    still works but warns on every call, and goes in 5.40); 4.x only knows ``past_key_values``.
    Looked up once per model class, on the base model under a peft or DDP wrapper.
    """
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else getattr(model, "module", model)
    cls = type(base)
    if cls not in _CACHE_KWARG:
        params = inspect.signature(base.forward).parameters
        _CACHE_KWARG[cls] = "cache" if "cache" in params else "past_key_values"
    return {_CACHE_KWARG[cls]: cache}


def _forward_last(model, ids, mask, positions, cache):
    kw = dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache_kwarg(model, cache))
    try:
        out = model(**kw, logits_to_keep=1)
    except TypeError:  # a model without logits_to_keep: same numbers, more work
        out = model(**kw)
    return out.logits[:, -1, :]


def left_pad(prompts: list[list[int]], pad_id: int, width: int | None = None):
    """(ids, mask, positions), each (B, width): rows right-aligned, positions ``cumsum(mask) - 1``."""
    width = width or max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _prefix_caches(model, heads: list[list[int]], pad_id: int, max_rows: int, max_tokens: int, dev):
    """Keys/values of each shared prefix, batched like any prompts: per head, per layer ``(k, v)``
    of shape (heads, P, head_dim) (its real columns only)."""
    out: list = [None] * len(heads)
    for chunk in length_chunks([len(h) for h in heads], max_rows, max_tokens):
        ids, mask, pos = (t.to(dev) for t in left_pad([heads[i] for i in chunk], pad_id))
        cache = DynamicCache(config=model.config)
        _forward_last(model, ids, mask, pos, cache)
        for r, i in enumerate(chunk):
            P = len(heads[i])
            out[i] = [(layer.keys[r, :, -P:], layer.values[r, :, -P:]) for layer in cache.layers]
    return out


def _past_from_prefixes(model, kv, P_rows: list[int], head_rows: list[int | None], dev):
    """A DynamicCache of the chunk's prefixes, right-aligned in width max(P), and its (b, width) mask."""
    b, width = len(P_rows), max(P_rows)
    mask = torch.zeros((b, width), dtype=torch.long, device=dev)
    cache = DynamicCache(config=model.config)
    some = kv[next(h for h in head_rows if h is not None)]
    for li, (k0, v0) in enumerate(some):
        k = k0.new_zeros((b, k0.shape[0], width, k0.shape[2]))
        v = v0.new_zeros((b, v0.shape[0], width, v0.shape[2]))
        for r, (P, h) in enumerate(zip(P_rows, head_rows)):
            if P:
                k[r, :, width - P :], v[r, :, width - P :] = kv[h][li]
                mask[r, width - P :] = 1
        cache.update(k, v, li)
    return cache, mask


def prefill(
    model,
    prompts: list[list[int]],
    pad_id: int,
    room: int,
    max_rows: int = 8,
    max_tokens: int = 4096,
    min_shared: int | None = 16,
):
    """Prefill ``prompts`` and return ``(logits, cache, mask, next_pos, n_run)`` ready for decoding.

    Args:
        prompts: B token-id lists (duplicates allowed; each distinct one is run once).
        room: tokens to be generated after the prompt (the buffer is allocated for them).
        min_shared: shortest prefix worth sharing between distinct prompts (:func:`prefix_groups`);
            None turns prefix sharing off.
    Returns:
        logits (B, V) of the next token; a ``DynamicCache`` over (B, ·, L) built from
        :class:`GrowingLayer`; the 2D attention mask (B, L), L >= the longest prompt (a row whose
        prefix was shared has padding between prefix and suffix: masked, positions skip it);
        next position id per row (B,); the number of prompt tokens actually run.
    """
    dev = next(model.parameters()).device
    uniq, rows = dedupe(prompts)
    n = len(uniq)
    # 1. shared prefixes, each run once (all of them batched together)
    groups = prefix_groups(uniq, min_shared) if min_shared is not None else []
    P_of, head_of = [0] * n, [None] * n
    for g, (P, members) in enumerate(groups):
        for i in members:
            P_of[i], head_of[i] = P, g
    heads = [uniq[members[0]][:P] for P, members in groups]
    kv = _prefix_caches(model, heads, pad_id, max_rows, max_tokens, dev) if heads else []
    n_run = sum(map(len, heads))
    # 2. every distinct prompt's own part, in length-sorted chunks, on top of its prefix's cache.
    # A row's span in its chunk is its prefix + the chunk's padded suffix width: the buffer is
    # as wide as the widest span (= the longest prompt when nothing is shared).
    own = [len(uniq[i]) - P_of[i] for i in range(n)]
    chunks = length_chunks(own, max_rows, max_tokens)
    L = max(P_of[i] + max(own[j] for j in chunk) for chunk in chunks for i in chunk)
    mask = torch.zeros((n, L), dtype=torch.long, device=dev)
    logits, keys, values = None, [], []
    for chunk in chunks:
        ids, cmask, pos = (t.to(dev) for t in left_pad([uniq[i][P_of[i] :] for i in chunk], pad_id))
        n_run += int(cmask.sum())
        P_rows = [P_of[i] for i in chunk]
        if max(P_rows):
            cache, pmask = _past_from_prefixes(model, kv, P_rows, [head_of[i] for i in chunk], dev)
            cmask = torch.cat([pmask, cmask], dim=1)
            pos = pos + torch.tensor(P_rows, device=dev)[:, None]
        else:
            cache = DynamicCache(config=model.config)
        last = _forward_last(model, ids, cmask, pos, cache)
        idx, width = torch.tensor(chunk, device=dev), cmask.shape[1]  # <= L: the chunk's widest span
        if logits is None:
            logits = last.new_empty((n, last.shape[-1]))
            for layer in cache.layers:
                k, v = layer.keys, layer.values
                keys.append(k.new_zeros((n, k.shape[1], L, k.shape[3])))
                values.append(v.new_zeros((n, v.shape[1], L, v.shape[3])))
        logits[idx] = last
        mask[idx, L - width :] = cmask
        for layer, k_all, v_all in zip(cache.layers, keys, values):
            k_all[idx, :, L - width :] = layer.keys
            v_all[idx, :, L - width :] = layer.values
    sel = torch.tensor(rows, device=dev)
    if len(uniq) < len(prompts):
        logits, mask = logits[sel], mask[sel]
        keys, values = [k[sel] for k in keys], [v[sel] for v in values]
    out = DynamicCache(config=model.config)
    out.layers = [GrowingLayer(k, v, L + room) for k, v in zip(keys, values)]
    next_pos = mask.sum(-1)  # = last position + 1
    return logits, out, mask, next_pos, n_run


def growable(model) -> bool:
    """True when the model's default cache is plain full-attention layers (no sliding window,
    no linear attention), i.e. :func:`prefill`'s cache can stand in for it."""
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # noqa: BLE001 - an exotic config: use the plain path
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
