"""Continuous batching: calls join the decode batch between steps and leave it when they finish.

:meth:`HFBackend.generate` decodes one batch of prompts until its last row finishes, and the
rollout engine waits for that before it builds the next turn's contexts (``schedule="rounds"``).
Rows that finish early idle, and the batch thins out while its longest answer is still being
written: on the SFT'd tiny model's 64 MEM1 rollouts, 487 decode steps carried 20 rows on average.
A decode step costs a fixed ~5 ms here (Python and kernel launches of the 4-layer forward) plus
~0.2 ms per row, so thin steps are expensive. A :class:`ContinuousBatch` keeps the batch full: the
engine (``RolloutConfig.schedule="continuous"``) hands a finished call's trajectory its tool
observation and admits its next call as soon as it is built, into the slot a finished row left.

The KV cache is one buffer per layer, ``(slots, heads, capacity, head_dim)``, in which every row
writes its next token at the same column ``n`` (what a batched forward needs). A row admitted at
step ``n`` has its prompt's keys/values (prefilled with :func:`memkit.models.kv.prefill`, shared
prefixes and duplicates run once) written right-aligned just left of ``n``; its mask is 0
elsewhere and its positions are its own, so it sees exactly what it would alone. Attention reads
columns ``[s, n)`` only, ``s`` = the first column of the oldest live row, so columns of finished
calls fall out of the view without a copy; when ``n`` reaches the capacity the live columns are
copied to the buffer's start (``rebase``, amortised over many steps). Slots of finished rows are
reused by the next admitted calls; when at least ``compact_below`` of the slots are dead and none
are refilled the batch is compacted.

Sampling follows :class:`HFBackend` (same recorded log-probs, stop strings, EOS, length). With
one generator per row (``RolloutConfig.sample_seeds``) every call samples exactly the tokens it
samples in ``HFBackend.generate`` or alone, so both schedules give the same trajectories.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from transformers import DynamicCache

from memkit.models.generation import Generation, HFBackend, sample_next
from memkit.models.kv import GrowingLayer, prefill


class SlotLayer(GrowingLayer):
    """A :class:`GrowingLayer` whose view starts at column ``s`` and whose rows can be rewritten."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        self._s = 0
        super().__init__(keys, values, capacity)

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, self._s : self._n], self._v[:, :, self._s : self._n]

    def update(self, key_states, value_states, *args, **kwargs):
        if self._n + key_states.shape[-2] > self._k.shape[2]:
            raise RuntimeError("SlotLayer is full: ContinuousBatch rebases before every step")  # never reached
        return super().update(key_states, value_states, *args, **kwargs)

    def set_start(self, s: int) -> None:
        self._s = s
        self._view()

    def write(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Row ``slot`` gets ``keys``/``values`` (heads, L, head_dim) right-aligned at the write column."""
        n, L = self._n, keys.shape[1]
        self._k[slot, :, n - L : n] = keys
        self._v[slot, :, n - L : n] = values

    def rebase(self, shift: int, capacity: int) -> None:
        """Move the visible columns ``[s, n)`` to ``[shift, shift + n - s)`` of a new buffer of ``capacity``."""
        width = self._n - self._s
        k = self._k.new_zeros((*self._k.shape[:2], capacity, self._k.shape[3]))
        v = self._v.new_zeros((*self._v.shape[:2], capacity, self._v.shape[3]))
        k[:, :, shift : shift + width] = self._k[:, :, self._s : self._n]
        v[:, :, shift : shift + width] = self._v[:, :, self._s : self._n]
        self._k, self._v, self._s, self._n = k, v, 0, shift + width
        self._view()

    def add_slots(self, count: int) -> None:
        self._k = torch.cat([self._k, self._k.new_zeros((count, *self._k.shape[1:]))])
        self._v = torch.cat([self._v, self._v.new_zeros((count, *self._v.shape[1:]))])
        self._view()


@dataclass
class Request:
    """One call to decode: ``key`` comes back with its :class:`Generation`."""

    key: Any
    prompt: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    generator: torch.Generator | None = None  # this row's own stream; None = the batch's shared one


@dataclass
class _Row:
    req: Request
    first: int  # first buffer column of its prompt
    window: int  # tokens whose text can hold a stop string
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class ContinuousBatch:
    """A decode batch that rows join (:meth:`admit`) and leave (:meth:`step` returns them) at any step."""

    def __init__(self, backend: HFBackend, temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, compact_below: float = 0.5):
        self.backend, self.model, self.tok = backend, backend.model, backend.tokenizer
        self.temperature, self.top_p, self.generator, self.compact_below = temperature, top_p, generator, compact_below
        self.slots: list[_Row | None] = []
        self.cache: DynamicCache | None = None
        self.mask = self.logits = self.next_pos = None  # (slots, capacity) / (slots, V) / (slots,)
        self._may_stop: dict[tuple[str, ...], dict[int, bool]] = {}

    @property
    def live(self) -> int:
        return sum(r is not None for r in self.slots)

    # ------------------------------------------------------------------ buffer bookkeeping
    @property
    def _layers(self) -> list[SlotLayer]:
        return self.cache.layers

    @property
    def _n(self) -> int:
        return self._layers[0]._n

    def _set_start(self) -> None:
        live = [r.first for r in self.slots if r is not None]
        s = min(live) if live else self._n
        for layer in self._layers:
            layer.set_start(s)

    def _rebase(self, shift: int, room: int) -> None:
        s, n = self._layers[0]._s, self._n
        capacity = shift + (n - s) + room
        for layer in self._layers:
            layer.rebase(shift, capacity)
        mask = self.mask.new_zeros((self.mask.shape[0], capacity))
        mask[:, shift : shift + n - s] = self.mask[:, s:n]
        self.mask = mask
        for row in self.slots:
            if row is not None:
                row.first = row.first - s + shift

    def _room(self) -> int:
        """Columns still to be written by the live rows (at most), plus slack so rebases are rare."""
        left = [r.req.max_new_tokens - len(r.ids) for r in self.slots if r is not None]
        return max(left, default=0) + 64

    def __enter__(self):
        self._was_training = self.model.training
        self.model.eval()  # dropout off: the recorded log-probs must be those of the policy itself
        return self

    def __exit__(self, *exc):
        self.model.train(self._was_training)

    # ------------------------------------------------------------------ admitting calls
    @torch.no_grad()
    def admit(self, requests: Sequence[Request]) -> list[tuple[Any, Generation]]:
        """Prefill ``requests`` and place them in free slots; returns any that finish at once
        (``max_new_tokens == 0``) as ``(key, Generation)``."""
        done = [(r.key, Generation([], [], "", "length")) for r in requests if r.max_new_tokens == 0]
        requests = [r for r in requests if r.max_new_tokens > 0]
        if not requests:
            return done
        be = self.backend
        be._check([r.prompt for r in requests], max(r.max_new_tokens for r in requests), self.temperature, self.top_p)
        t0 = time.perf_counter()
        logits, cache, mask, pos, n_run = prefill(self.model, [r.prompt for r in requests], be.pad_id, 0,
                                                  min_shared=be.min_shared_prefix)
        be.stats.prefill_tokens += n_run
        be.stats.calls += 1
        L = mask.shape[1]
        if self.cache is None or self.live == 0:
            self._start(requests, logits, cache, mask, pos)
        else:
            self._insert(requests, logits, cache, mask, pos, L)
        be.stats.prefill_seconds += time.perf_counter() - t0
        return done

    def _window(self, stop) -> int:
        return 4 * max((len(s) for s in stop), default=0) + 8

    def _start(self, requests, logits, cache, mask, pos) -> None:
        L = mask.shape[1]
        capacity = L + max(r.max_new_tokens for r in requests) + 64
        layers = [SlotLayer(layer.keys, layer.values, capacity) for layer in cache.layers]
        self.cache = DynamicCache(config=self.model.config)
        self.cache.layers = layers
        self.mask = mask.new_zeros((len(requests), capacity))
        self.mask[:, :L] = mask
        self.logits, self.next_pos = logits, pos.clone()
        self.slots = [_Row(r, first=0, window=self._window(r.stop)) for r in requests]

    def _insert(self, requests, logits, cache, mask, pos, L) -> None:
        free = [i for i, r in enumerate(self.slots) if r is None]
        if len(free) < len(requests):  # more calls than free slots: grow the batch (a copy, rare)
            extra = len(requests) - len(free)
            for layer in self._layers:
                layer.add_slots(extra)
            self.mask = torch.cat([self.mask, self.mask.new_zeros((extra, self.mask.shape[1]))])
            self.logits = torch.cat([self.logits, self.logits.new_zeros((extra, self.logits.shape[1]))])
            self.next_pos = torch.cat([self.next_pos, self.next_pos.new_zeros(extra)])
            free += list(range(len(self.slots), len(self.slots) + extra))
            self.slots += [None] * extra
        n = self._n
        if n < L:  # the new prompts are longer than the columns written so far: make room on the left
            self._rebase(L - (n - self._layers[0]._s), self._room() + max(r.max_new_tokens for r in requests))
            n = self._n
        for j, (slot, req) in enumerate(zip(free, requests)):
            for layer, new in zip(self._layers, cache.layers):
                layer.write(slot, new.keys[j], new.values[j])
            self.mask[slot] = 0
            self.mask[slot, n - L : n] = mask[j]
            self.logits[slot], self.next_pos[slot] = logits[j], pos[j]
            self.slots[slot] = _Row(req, first=n - L, window=self._window(req.stop))
        self._set_start()

    # ------------------------------------------------------------------ decoding
    def _stops_here(self, row: _Row, token: int) -> bool:
        stop = row.req.stop
        if not stop:
            return False
        cache = self._may_stop.setdefault(stop, {})
        hit = cache.get(token)
        if hit is None:
            piece = self.tok.decode([token], skip_special_tokens=True)
            hit = cache[token] = not piece or "\ufffd" in piece or any(s[-1] in piece for s in stop)
        return hit and self.backend._hits_stop(row.ids, stop, row.window)

    @torch.no_grad()
    def step(self) -> list[tuple[Any, Generation]]:
        """Sample one token for every live row, retire the finished ones, run one batched forward.

        Returns the calls that finished, as ``(key, Generation)``."""
        if not self.live:
            return []
        t0, st = time.perf_counter(), self.backend.stats
        streams = [r.req.generator if r is not None else None for r in self.slots]
        own = all(g is not None for g, r in zip(streams, self.slots) if r is not None)
        tok, lp = sample_next(self.logits, self.temperature, self.top_p, streams if own else self.generator)
        finished = []
        for j, (row, t, l) in enumerate(zip(self.slots, tok.tolist(), lp.tolist())):
            if row is None:
                continue
            row.ids.append(t)
            row.logprobs.append(l)
            if t in self.backend.eos_ids:
                finish = "eos"
            elif self._stops_here(row, t):
                finish = "stop"
            elif len(row.ids) >= row.req.max_new_tokens:
                finish = "length"
            else:
                continue
            finished.append((row.req.key, Generation(row.ids, row.logprobs, self.tok.decode(row.ids, skip_special_tokens=True), finish)))
            self.slots[j] = None
        if finished:
            self._set_start()
        if self.live:
            self._forward(tok)
        st.decode_seconds += time.perf_counter() - t0
        return finished

    def _forward(self, tok: torch.Tensor) -> None:
        if len(self.slots) >= 2 and self.live <= self.compact_below * len(self.slots):  # drop dead rows (a copy)
            keep = [j for j, r in enumerate(self.slots) if r is not None]
            idx = torch.tensor(keep, device=self.mask.device)
            self.cache.batch_select_indices(idx)
            self.mask, self.next_pos, tok = self.mask[idx], self.next_pos[idx], tok[idx]
            self.slots = [self.slots[j] for j in keep]
        if self._n >= self.mask.shape[1]:
            self._rebase(0, self._room())
        n, s = self._n, self._layers[0]._s
        self.mask[:, n] = 1  # every row sees its new token (dead rows too: no all-masked row)
        self.logits = self.model(input_ids=tok[:, None], attention_mask=self.mask[:, s : n + 1],
                                 position_ids=self.next_pos[:, None], past_key_values=self.cache,
                                 use_cache=True).logits[:, -1, :]
        self.next_pos = self.next_pos + 1
        self.backend.stats.decode_steps += 1
        self.backend.stats.decode_rows += len(self.slots)
