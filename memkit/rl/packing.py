"""Packing training units into tensors: one row per call, or one row per unit with a 2D
attention mask (MEM1 §3.2, App. B.7).

``pack`` takes :class:`memkit.core.trajectory.TrainingUnit`s (a trajectory and a subset of its calls; a plain
trajectory means all its calls that generated tokens), so a MEM1 trajectory, a MemSearcher call, a DCPO
segment and a tree path all become rows the same way. Context refs resolve through the whole trajectory:
a ref to a call outside the unit is placed as ordinary (untrained) context tokens.

Conventions (all modes)
-----------------------
- Everything per token is ``[B, L]`` and *token aligned*: ``loss_mask[b, i]``,
  ``old_logprobs[b, i]`` and ``call_ids[b, i]`` describe token ``input_ids[b, i]`` itself.
  The logits that predict token i sit at position ``pred_index[b, i]`` (i - 1 in a causal
  row; elsewhere in a 2D-masked row), -1 where nothing predicts it.
  :func:`memkit.rl.packed_forward.packed_token_logprobs` returns log-probs in the same layout.
- ``attention_mask`` is bool, True = may attend: ``[B, L]`` (padding, causal implied) for
  ``separate``; ``[B, 1, L, L]`` (query x key, no causal implied) for the 2D modes. Every
  row attends at least to itself (padding too) so no softmax row is empty.
- Rows are right-padded with ``pad_id``; padding has loss_mask 0, call_ids -1, position 0.
- How a 2D mask reaches the model (bool vs additive, per attention backend):
  :mod:`memkit.rl.packed_forward`.

Modes
-----
``separate``
    Row = ``context_ids + output_ids`` of one call; positions 0..n-1 (exact by construction).
    ``unit_index``/``call_index`` give each row's unit (its index in pack's input list) and call.
``mem1_mask`` (the paper's masked trajectory)
    One row per trajectory: every token stored once, ``(prompt, out_1, obs_1, [chat], out_2,
    obs_2, ...)``. Call t's context is resolved through ``context_refs``: a ref to an earlier
    output reuses the stitched tokens; an observation is placed at its first reference;
    non-ref context pieces (chat suffixes, any literal text) are placed as new tokens, except the
    literal prefix identical to call 0's (the fixed prompt), which is shared (exactly). Tokens
    placed for call t attend to the stitched copies of call t's context before them and to
    themselves (MEM1's Attn_t); tokens reused from earlier calls keep their own attention row.
    So an observation O_i, placed for the call whose context is ``(q, S_i A_i, O_i)``, attends
    to {q, S_i A_i, O_i}: what the rollout computed it under. §3.2's formula, read literally,
    would also let O_i see S_{i-1} A_{i-1} O_{i-1}; memkit follows the prose rule ("only the
    tokens retained in memory at the time"), see docs/findings.md, 'Which 2D mask'.
    Position ids are contiguous over the stitched row (App. B.7). Approximate: a reused state
    out_{t-1} sits at other positions and (less obviously) carries hidden states computed while
    *generating* it, where it attended to ctx_{t-1}, not to what preceded it in ctx_t. Calls 1
    and 2 of a MEM1 trajectory are exact; the gap appears from call 3 on.
``mem1_exact``
    A token's key/value depends on its position *and* on everything it attends to, so exactness
    needs every context token of call t to have call t's full causal history, not just the
    right position id. Two tokens can be shared iff they have the same ids at the same positions
    with the same history, i.e. share a prefix. So the row is a prefix trie of the calls'
    sequences ``context_ids + output_ids``: each trie node is one token, with position = its
    depth (the rollout position) and attention = its ancestors + itself. Output tokens always get
    fresh nodes (each is trained once) but later contexts may walk through them. For MEM1 this
    is App. B.7's duplication: ``(q, S1A1, O1, S2A2, [S2A2]', O2, S3A3, [S3A3]', ...)``: the
    prompt and S1A1 once (call 2's context q S1A1 O1 extends call 1's sequence), each later state
    that a next call reads twice (generated copy, trained; context copy at the next call's
    positions) less any prefix it shares with a sibling (e.g. its opening ``<think>``), each
    observation once. For ReAct (context t+1 extends context t + output t)
    it collapses to one plain causal sequence. Refs are not needed (only checked).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memkit.core.trajectory import Call, TrainingUnit, Trajectory, as_unit
from memkit.rl.choices import PACKING_MODES as MODES  # noqa: F401  the three packings pack() builds


@dataclass
class PackedBatch:
    mode: str
    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # bool: [B, L] (separate) or [B, 1, L, L] (2D modes), True = attend
    position_ids: torch.Tensor  # [B, L] long
    pred_index: torch.Tensor  # [B, L] long, position whose logits predict token i; -1 = none
    loss_mask: torch.Tensor  # [B, L] float 0/1, 1 on trained output tokens (token aligned)
    old_logprobs: torch.Tensor  # [B, L] float, sampling log-prob of each output token, 0 elsewhere
    call_ids: torch.Tensor  # [B, L] long, call index (in its trajectory) of each trained token, -1 elsewhere
    unit_index: torch.Tensor  # [B] long, unit of each row (index into pack's input list)
    call_index: torch.Tensor  # [B] long, call of each row (separate), -1 for per-unit rows
    lengths: torch.Tensor  # [B] long, non-padding tokens per row

    @property
    def n_tokens(self) -> int:
        """Tokens processed by the forward pass (padding excluded)."""
        return int(self.lengths.sum())

    @property
    def n_attention_pairs(self) -> int:
        """(query, key) pairs attended, a proxy for attention FLOPs (padding excluded)."""
        if self.attention_mask.dim() == 2:
            return int(sum(n * (n + 1) // 2 for n in self.lengths.tolist()))
        valid = torch.arange(self.input_ids.shape[1]) < self.lengths[:, None]  # [B, L]
        m = self.attention_mask[:, 0] & valid[:, :, None] & valid[:, None, :]
        return int(m.sum())

    @property
    def n_padded_tokens(self) -> int:
        """Token slots the forward pass really runs, padding included: ``B * L``."""
        return int(self.input_ids.shape[0] * self.input_ids.shape[1])

    @property
    def n_attention_cells(self) -> int:
        """Attention scores a dense kernel computes, padding and masked cells included:
        ``B * L * L`` per head and layer (sdpa/eager with an explicit mask skip nothing)."""
        B, L = self.input_ids.shape
        return int(B * L * L)

    def at_pred(self, per_position: torch.Tensor) -> torch.Tensor:
        """Read a per-position quantity at each token's predicting position, ``[B, L] -> [B, L]``
        (0 where nothing predicts). E.g. critic values: V(s_t) for action token t is the value
        head's output at ``pred_index[t]`` (verl reads it at t - 1)."""
        out = per_position.gather(1, self.pred_index.clamp(min=0).to(per_position.device))
        return out * (self.pred_index >= 0).to(per_position.device, per_position.dtype)


# ----------------------------------------------------------------------------- helpers
def _ref_source(calls: list[Call], t: int, ref) -> tuple[int, str, int]:
    """Resolve a context ref of call t to (call j, kind, offset into j's ids); checks it is a
    verbatim copy."""
    s, e, j, kind = ref
    if not 0 <= j < t:
        raise ValueError(f"call {t}: context ref {ref} points to call {j}, not an earlier call")
    if kind not in ("output", "observation"):
        raise ValueError(f"call {t}: context ref kind {kind!r} is not 'output' or 'observation'")
    src = calls[j].output_ids if kind == "output" else calls[j].observation_ids
    piece = list(calls[t].context_ids[s:e])
    n = len(piece)
    for off in range(0, len(src) - n + 1):
        if list(src[off : off + n]) == piece:
            return j, kind, off
    raise ValueError(f"call {t}: context[{s}:{e}] is not a verbatim copy of call {j}'s {kind}")


def _check_call(call: Call, t: int) -> None:
    if len(call.logprobs) != len(call.output_ids):
        raise ValueError(f"call {t}: {len(call.logprobs)} logprobs for {len(call.output_ids)} output ids")


class Row:
    """One packed row under construction: tokens plus, per call, the row indices of its full
    sequence (context + output) and which of them this call placed."""

    def __init__(self):
        self.ids: list[int] = []
        self.pos: list[int] = []
        self.calls: list[tuple[int, list[int], list[bool], int]] = []  # (call, full indices, placed_here, n_ctx)

    def new(self, tok: int, pos: int = -1) -> int:
        self.ids.append(int(tok))
        self.pos.append(pos)
        return len(self.ids) - 1


def _layout_mem1_mask(calls: list[Call], chosen: tuple[int, ...]) -> Row:
    row = Row()
    placed: dict[tuple[int, str], list] = {}
    prompt_idx: list[int] = []  # the first chosen call's literal prefix, shareable by later calls
    for t in chosen:
        c = calls[t]
        _check_call(c, t)
        kinds = [None] * len(c.context_ids)
        for ref in c.context_refs:
            j, kind, off = _ref_source(calls, t, ref)
            for p in range(ref[0], ref[1]):
                kinds[p] = (j, kind, off + p - ref[0])
        full, here = [], []
        sharing = True
        for p, tok in enumerate(c.context_ids):
            src = kinds[p]
            if src is None:
                sharing = sharing and p < len(prompt_idx) and row.ids[prompt_idx[p]] == tok
                if sharing:
                    full.append(prompt_idx[p])
                    here.append(False)
                else:
                    i = row.new(tok)
                    full.append(i)
                    here.append(True)
                    if t == chosen[0] and len(prompt_idx) == p:
                        prompt_idx.append(i)
                continue
            sharing = False
            j, kind, k = src
            src = calls[j].output_ids if kind == "output" else calls[j].observation_ids
            slots = placed.setdefault((j, kind), [None] * len(src))
            if slots[k] is None:  # first seen: an observation, or an output the unit does not train
                slots[k] = row.new(tok)
                full.append(slots[k])
                here.append(True)
            else:
                full.append(slots[k])
                here.append(False)
        outs = [row.new(tok) for tok in c.output_ids]
        placed[(t, "output")] = outs
        row.calls.append((t, full + outs, here + [True] * len(outs), len(c.context_ids)))
    row.pos = list(range(len(row.ids)))  # contiguous over the stitched row (App. B.7)
    return row


def _layout_trie(calls: list[Call], chosen: tuple[int, ...]) -> Row:
    row = Row()
    children: dict[tuple[int, int], int] = {}  # (parent index or -1, token) -> node index
    for t in chosen:
        c = calls[t]
        _check_call(c, t)
        for ref in c.context_refs:
            _ref_source(calls, t, ref)  # validation only
        full, here, parent = [], [], -1
        for p, tok in enumerate(c.context_ids):
            key = (parent, int(tok))
            node = children.get(key)
            if node is None:
                node = children[key] = row.new(tok, p)
                here.append(True)
            else:
                here.append(False)
            full.append(node)
            parent = node
        for k, tok in enumerate(c.output_ids):
            node = row.new(tok, len(c.context_ids) + k)  # always fresh: trained once
            children.setdefault((parent, int(tok)), node)
            full.append(node)
            here.append(True)
            parent = node
        row.calls.append((t, full, here, len(c.context_ids)))
    return row


def layout_row(unit: TrainingUnit | Trajectory, mode: str) -> Row:
    """The row of ``unit`` (a trajectory: all its calls) under a 2D ``mode`` (``mem1_mask`` or
    ``mem1_exact``: the prefix trie) before it becomes tensors: what :func:`pack` fills its row from
    and :func:`memkit.rl.row_pieces.row_pieces` names the pieces of. ``Row.calls`` says where each
    call's full sequence (context + output) sits in the row."""
    unit = as_unit(unit)
    return (_layout_mem1_mask if mode == "mem1_mask" else _layout_trie)(unit.traj.calls, unit.calls)


def _fill_2d(row: Row, calls: list[Call], b: int, out: dict) -> None:
    """Write one 2D-mode row into the batch tensors ``out`` (vectorised per call)."""
    n = len(row.ids)
    out["input_ids"][b, :n] = torch.tensor(row.ids)
    out["position_ids"][b, :n] = torch.tensor(row.pos)
    mask = out["attention_mask"][b, 0]
    for t, full, here, n_ctx in row.calls:
        idx = torch.tensor(full, dtype=torch.long)
        q = torch.tensor([k for k, h in enumerate(here) if h], dtype=torch.long)
        if len(q):
            tri = torch.ones(len(full), len(full), dtype=torch.bool).tril()
            mask[idx[q].unsqueeze(-1), idx.unsqueeze(0)] |= tri[q]
        o = idx[n_ctx:]
        if len(o):
            out["call_ids"][b, o] = t
            out["old_logprobs"][b, o] = torch.tensor(calls[t].logprobs, dtype=torch.float32)
            out["pred_index"][b, o] = idx[n_ctx - 1 : -1] if n_ctx > 0 else torch.cat([idx.new_tensor([-1]), idx[:-1]])
            out["loss_mask"][b, o] = (out["pred_index"][b, o] >= 0).float()


# ----------------------------------------------------------------------------- public API
def pack(units: list[TrainingUnit | Trajectory], mode: str = "separate", pad_id: int = 0) -> PackedBatch:
    """Pack training units into a :class:`PackedBatch` (see the module docstring for the modes).

    A :class:`Trajectory` in ``units`` means all its calls that generated tokens.
    Shapes: ``separate``: B = total calls, L = max(n_ctx + n_out); 2D modes: B = number of
    units, L = longest packed row.
    """
    if mode not in MODES:
        raise ValueError(f"unknown packing mode {mode!r}; choose one of {MODES}")
    units = [as_unit(u) for u in units]
    if mode == "separate":
        seqs = [(i, t, c) for i, u in enumerate(units) for t, c in u]
        for _, t, c in seqs:
            _check_call(c, t)
        lengths = [c.n_context + c.n_output for _, _, c in seqs]
    else:
        rows = [layout_row(u, mode) for u in units]
        lengths = [len(r.ids) for r in rows]
    B, L = len(lengths), max(lengths, default=0)
    ar = torch.arange(L)
    out = {
        "input_ids": torch.full((B, L), pad_id, dtype=torch.long),
        "position_ids": torch.zeros(B, L, dtype=torch.long),
        "pred_index": torch.full((B, L), -1, dtype=torch.long),
        "loss_mask": torch.zeros(B, L),
        "old_logprobs": torch.zeros(B, L),
        "call_ids": torch.full((B, L), -1, dtype=torch.long),
    }
    if mode == "separate":
        out["attention_mask"] = ar.unsqueeze(0) < torch.tensor(lengths).unsqueeze(-1)
        for b, (i, t, c) in enumerate(seqs):
            n, nc = lengths[b], c.n_context
            out["input_ids"][b, :n] = torch.tensor(list(c.context_ids) + list(c.output_ids), dtype=torch.long)
            out["position_ids"][b, :n] = ar[:n]
            out["pred_index"][b, :n] = ar[:n] - 1
            out["call_ids"][b, nc:n] = t
            out["old_logprobs"][b, nc:n] = torch.tensor(c.logprobs, dtype=torch.float32)
            out["loss_mask"][b, max(nc, 1) : n] = 1.0
        unit_index = [i for i, _, _ in seqs]
        call_index = [t for _, t, _ in seqs]
    else:
        eye = torch.eye(L, dtype=torch.bool)
        out["attention_mask"] = eye.expand(B, 1, L, L).clone()  # padding attends to itself
        for b, (row, u) in enumerate(zip(rows, units)):
            _fill_2d(row, u.traj.calls, b, out)
        unit_index, call_index = list(range(B)), [-1] * B
    return PackedBatch(
        mode=mode,
        unit_index=torch.tensor(unit_index, dtype=torch.long),
        call_index=torch.tensor(call_index, dtype=torch.long),
        lengths=torch.tensor(lengths, dtype=torch.long),
        **out,
    )


def length_groups(lengths, max_groups: int) -> list[list[int]]:
    """Rows cut into at most ``max_groups`` groups of similar length, so that each group's forward
    pass pads only to its own longest row instead of the batch's.

    Rows are sorted by length and cut into contiguous runs; the cut minimises the padded slots

        Σ_g |g| · max_{r ∈ g} len(r)

    by dynamic programming over the sorted lengths (``best[k][j]``: the cheapest cut of the
    ``j`` shortest rows into ``k`` runs). Returns lists of row indices (into ``lengths``), short
    rows first; every row appears exactly once. ``max_groups = 1`` gives one group of all rows.
    """
    order = sorted(range(len(lengths)), key=lambda r: int(lengths[r]))
    s = [int(lengths[r]) for r in order]
    n, k_max = len(s), max(1, min(int(max_groups), len(s)))
    if n == 0:
        return []
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k_max + 1)]  # best[k][j]: first j sorted rows in k runs
    cut = [[0] * (n + 1) for _ in range(k_max + 1)]
    best[0][0] = 0
    for k in range(1, k_max + 1):
        for j in range(1, n + 1):
            for i in range(k - 1, j):  # the last run is sorted rows i..j-1, padded to s[j-1]
                c = best[k - 1][i] + (j - i) * s[j - 1]
                if c < best[k][j]:
                    best[k][j], cut[k][j] = c, i
    k = min(range(1, k_max + 1), key=lambda kk: (best[kk][n], kk))
    groups, j = [], n
    while k > 0:
        i = cut[k][j]
        groups.append(order[i:j])
        j, k = i, k - 1
    return groups[::-1]
