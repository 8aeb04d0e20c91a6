"""Attention that skips what a packed row's 2D mask forbids: ``blocks`` (gathered key blocks,
any device, no compile) and ``flex`` (PyTorch ``flex_attention`` with a ``BlockMask``, CUDA).

A MEM1 row packs a whole trajectory (3-4k tokens at k = 8) but each token attends only to its
own call's context (a few hundred), so dense attention over the ``[L, L]`` mask computes ~90%
masked cells and made packing slower than one row per call. ``blocks`` cuts the row into query
blocks of :data:`BLOCK` tokens, gathers for each block only the keys some query in it may see
(the union of its mask rows: about one call's context), and runs one ``scaled_dot_product_attention``
per group of blocks with similar key counts, masked by the gathered sub-mask. Same softmax over
the same allowed keys, so the same numbers up to float rounding (tests/rl/test_flex_packing.py).
``flex`` hands a ``BlockMask`` (which 128 x 128 tiles hold an allowed cell) to transformers'
``flex_attention`` backend; it needs ``torch.compile`` and has no CPU backward in torch 2.13.
Which path runs where: :func:`memkit.rl.packed_forward.packed_attention`.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

from memkit.rl.choices import ATTENTION_PATHS  # noqa: F401  the paths this module implements (``TrainConfig.runtime.attention``)

#: query tokens per block of the ``blocks`` path: larger blocks gather more keys per query,
#: smaller ones make more, smaller matmuls (64 was the fastest on CPU at k = 8)
BLOCK = 64
#: sdpa calls per forward of the ``blocks`` path: blocks sorted by key count and cut into this
#: many equal runs, each padded to its own longest key set (1 = one call padded to the longest)
KEY_GROUPS = 4
#: name the ``blocks`` path is registered under in transformers' ``AttentionInterface``
BLOCKS_IMPL = "memkit_blocks"
#: tile size of the ``flex`` path's BlockMask (flex_attention's default)
FLEX_BLOCK = 128


class BlockPlan(NamedTuple):
    """Which keys each query block of a packed batch gathers; built once per mask, shared by
    every layer. Indices are flat into the batch's ``B * L`` tokens. Per group of blocks:
    ``qrows [n, BLOCK]`` (past a row's end: clamped, ``qvalid`` False, output dropped),
    ``krows [n, K]`` (padded past each block's key count) and ``sub [n, BLOCK, K]`` bool
    (the mask restricted to those keys)."""

    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    shape: tuple[int, int]  # (B, L)

    @property
    def n_cells(self) -> int:
        """Scores computed per head and layer (a dense kernel: ``B * L * L``)."""
        return sum(sub.numel() for *_, sub in self.parts)


def block_plan(mask: torch.Tensor, block: int = BLOCK, key_groups: int = KEY_GROUPS) -> BlockPlan:
    """The :class:`BlockPlan` of a bool mask ``[B, 1, L, L]`` (True = may attend, query x key).

    Block j of row b holds queries ``j*block .. (j+1)*block - 1``; its keys are
    ``{k : mask[b, 0, q, k] for some q in the block}``, in row order. A query row with no
    allowed key (none from ``pack``) attends to the block's first key instead of giving NaN."""
    if mask.dim() != 4 or mask.dtype != torch.bool:
        raise ValueError(f"block_plan needs a bool [B, 1, L, L] mask, got {mask.dtype} {tuple(mask.shape)}")
    m = mask[:, 0]
    B, L, _ = m.shape
    nb = math.ceil(L / block)
    mb = F.pad(m, (0, 0, 0, nb * block - L)).reshape(B * nb, block, L)  # rows past L: no keys
    union = mb.any(1)  # [B*nb, L]
    count = union.sum(-1)
    keys = torch.sort(union.to(torch.uint8), dim=-1, descending=True, stable=True).indices  # allowed keys first
    qpos = torch.arange(nb * block, device=m.device).view(nb, block)
    parts = []
    for g in torch.sort(count).indices.tensor_split(min(key_groups, B * nb)):
        if not len(g):
            continue
        K = max(int(count[g].max()), 1)
        kidx = keys[g, :K]  # [n, K]
        sub = mb[g].gather(2, kidx[:, None, :].expand(-1, block, -1))
        sub &= (torch.arange(K, device=m.device) < count[g, None])[:, None, :]
        sub[..., 0] |= ~sub.any(-1)
        row, q = (g // nb)[:, None], qpos[g % nb]
        parts.append((row * L + q.clamp(max=L - 1), q < L, row * L + kidx, sub))
    return BlockPlan(parts, (B, L))


def block_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: BlockPlan,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v over the plan's gathered keys only.

    shape: query ``[B, H, L, D]``, key/value ``[B, Hkv, L, D]`` (``H`` a multiple of ``Hkv``:
    grouped-query heads are repeated) -> ``[B, L, H, D]`` (what transformers' attention
    functions return)."""
    B, H, L, D = query.shape
    if key.shape[1] != H:
        key, value = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (key, value))
    flat = lambda t: t.transpose(1, 2).reshape(B * L, H, t.shape[-1])  # noqa: E731
    qf, kf, vf = flat(query), flat(key), flat(value)
    rows, outs = [], []
    for qrows, qvalid, krows, sub in plan.parts:
        o = F.scaled_dot_product_attention(
            qf[qrows].transpose(1, 2),
            kf[krows].transpose(1, 2),
            vf[krows].transpose(1, 2),
            attn_mask=sub[:, None],
            dropout_p=dropout,
            scale=scale,
        )  # [n, H, BLOCK, Dv]
        rows.append(qrows[qvalid])
        outs.append(o.transpose(1, 2)[qvalid])
    out = query.new_zeros(B * L, H, value.shape[-1]).index_put((torch.cat(rows),), torch.cat(outs))
    return out.view(B, L, H, -1)


_PLANS: list = []  # (weakref to a mask, its _version, plan), newest first


def cached_plan(mask: torch.Tensor) -> BlockPlan:
    """:func:`block_plan` of ``mask``, reused while the same tensor (unchanged) comes back: by
    every layer of a forward, and by the old / reference / update forwards of a micro-batch."""
    for ref, version, plan in _PLANS:
        if ref() is mask and mask._version == version:
            return plan
    plan = block_plan(mask)
    _PLANS.insert(0, (weakref.ref(mask), mask._version, plan))
    del _PLANS[8:]
    return plan


def _hf_blocks(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function of the ``blocks`` path; anything but a square bool 4D
    mask (generation with a cache, a padding mask) goes to sdpa unchanged."""
    if (
        attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.dtype != torch.bool
        or query.shape[2] != key.shape[2]
    ):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return block_attention(query, key, value, cached_plan(attention_mask), scaling, dropout), None


def register_blocks() -> str:
    """Register the ``blocks`` path with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(BLOCKS_IMPL, _hf_blocks)
    return BLOCKS_IMPL


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except ImportError:
        return False
    return True


def flex_block_mask(mask: torch.Tensor, block: int = FLEX_BLOCK):
    """A ``BlockMask`` equal to the bool mask ``[B, 1, L, L]``: tiles with no allowed cell are
    skipped, tiles with only allowed cells run without ``mask_mod``, the rest read the mask."""
    from torch.nn.attention.flex_attention import BlockMask

    m = mask[:, 0]
    B, L, _ = m.shape
    nb = math.ceil(L / block)
    mp = F.pad(m, (0, nb * block - L, 0, nb * block - L)).contiguous()  # [B, Lp, Lp], padding never attends
    tiles = mp.view(B, nb, block, nb, block)
    full = tiles.all(4).all(2)  # [B, nb, nb]
    partial = tiles.any(4).any(2) & ~full

    def kv(sel):
        idx = torch.sort(sel.to(torch.uint8), dim=-1, descending=True, stable=True).indices
        return sel.sum(-1).to(torch.int32)[:, None], idx.to(torch.int32)[:, None]

    def mask_mod(b, h, q, k):
        return mp[b, q, k]

    return BlockMask.from_kv_blocks(*kv(partial), *kv(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(L, L))


__all__ = [
    "ATTENTION_PATHS",
    "BLOCK",
    "KEY_GROUPS",
    "BlockPlan",
    "block_plan",
    "block_attention",
    "cached_plan",
    "register_blocks",
    "flex_available",
    "flex_block_mask",
]
