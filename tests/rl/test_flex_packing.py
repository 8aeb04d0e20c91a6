"""Attention that skips masked cells (memkit.rl.block_attention): the gathered key blocks and the
flex BlockMask stand for exactly the packed 2D mask (loop references, cell by cell), and the
log-probs and gradients through them equal the dense masked path and per-call recomputation,
on real oracle rollouts (tests/fixtures/traces.py) packed in every mode."""

from __future__ import annotations

import pytest
import torch

from memkit.lab.policies import fresh_tiny
from memkit.rl.block_attention import block_attention, block_plan, flex_available, flex_block_mask
from memkit.rl.config import TrainConfig
from memkit.rl.packed_forward import packed_attention, packed_token_logprobs, packing_gap
from memkit.rl.packing import pack
from memkit.rl.update import Learner
from tests.fixtures.traces import kit, oracle_traces

TOL = 1e-4  # the bound on max |dlogp| (float32); measured ~1e-6
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_flex = pytest.mark.skipif(not flex_available(), reason="this torch build has no flex_attention")


def _trajs(method: str = "mem1", k: int = 2):
    return [t for t in oracle_traces(method, k, 3, 11) if t.valid]


@pytest.fixture(scope="module")
def model():
    return fresh_tiny(kit(), 0).model.eval()


def _mask(mode: str, method: str = "mem1", k: int = 2) -> torch.Tensor:
    """A micro-batch of three rows of unequal length (right padding included)."""
    batch = pack(_trajs(method, k), mode, kit().tokenizer.pad_token_id)
    assert batch.attention_mask.dim() == 4
    return batch.attention_mask


# ----------------------------------------------------------------------------- the masks
@pytest.mark.parametrize("block,groups", [(64, 4), (48, 1), (100, 3)])
@pytest.mark.parametrize("mode", ["mem1_mask", "mem1_exact"])
def test_block_plan_is_the_dense_mask_cell_by_cell(mode, block, groups):
    mask = _mask(mode)
    B, _, L, _ = mask.shape
    plan = block_plan(mask, block, groups)
    rebuilt = torch.zeros(B, L, L, dtype=torch.bool)
    seen = torch.zeros(B * L, dtype=torch.long)
    for qrows, qvalid, krows, sub in plan.parts:
        for i in range(len(qrows)):
            keys = krows[i].tolist()
            b = keys[0] // L
            assert all(kr // L == b for kr in keys), "a block gathers keys of its own row only"
            for a in range(block):
                if not qvalid[i, a]:
                    continue
                q = int(qrows[i, a])
                assert q // L == b
                seen[q] += 1
                for c in sub[i, a].nonzero()[:, 0].tolist():
                    rebuilt[b, q % L, keys[c] % L] = True
    assert (seen == 1).all(), "every query token is computed exactly once"
    assert torch.equal(rebuilt, mask[:, 0])
    assert plan.n_cells < B * L * L / 2  # what it is for: masked cells are skipped (at k = 8: ~90%)


@needs_flex
@pytest.mark.parametrize("mode", ["mem1_mask", "mem1_exact"])
def test_flex_block_mask_is_the_dense_mask_cell_by_cell(mode):
    mask = _mask(mode)
    B, _, L, _ = mask.shape
    bm = flex_block_mask(mask, block=128)
    n = bm.kv_num_blocks.shape[-1]
    rebuilt = torch.zeros(B, n * 128, n * 128, dtype=torch.bool)
    ar = torch.arange(128)
    for b in range(B):
        for qb in range(n):
            q = qb * 128 + ar[:, None]
            for kb in bm.full_kv_indices[b, 0, qb, : bm.full_kv_num_blocks[b, 0, qb]].tolist():
                rebuilt[b, qb * 128 : (qb + 1) * 128, kb * 128 : (kb + 1) * 128] = True
            for kb in bm.kv_indices[b, 0, qb, : bm.kv_num_blocks[b, 0, qb]].tolist():
                k = kb * 128 + ar[None, :]
                cells = bm.mask_mod(torch.tensor(b), torch.tensor(0), q, k)
                rebuilt[b, qb * 128 : (qb + 1) * 128, kb * 128 : (kb + 1) * 128] = cells
    assert torch.equal(rebuilt[:, :L, :L], mask[:, 0])
    assert not rebuilt[:, L:].any() and not rebuilt[:, :, L:].any()


def test_block_attention_equals_masked_sdpa_with_grouped_heads():
    mask = _mask("mem1_exact")
    B, _, L, _ = mask.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, 6, L, 8, generator=g)
    k, v = (torch.randn(B, 2, L, 8, generator=g) for _ in range(2))  # 3 query heads per key head
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=mask, scale=0.3
    ).transpose(1, 2)
    out = block_attention(q, k, v, block_plan(mask, 32, 3), scale=0.3)
    assert out.shape == (B, L, 6, 8)
    assert float((out - dense).abs().max()) < 1e-5


# ----------------------------------------------------------------------------- the model
def _logps_and_grads(model, batch, path):
    model.zero_grad(set_to_none=True)
    logp = packed_token_logprobs(model, batch, attention=path)
    (logp * batch.loss_mask.to(logp.device)).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return logp.detach().cpu(), grads.cpu()


@pytest.mark.parametrize(
    "method,k,mode",
    [
        ("mem1", 4, "mem1_mask"),
        ("mem1", 4, "mem1_exact"),
        ("memsearcher", 2, "mem1_exact"),
        ("amem", 4, "mem1_exact"),
        ("mem1", 2, "separate"),
    ],
)
def test_blocks_logprobs_and_gradients_equal_the_dense_path(model, method, k, mode):
    batch = pack(_trajs(method, k), mode, kit().tokenizer.pad_token_id)
    lp_dense, g_dense = _logps_and_grads(model, batch, "dense")
    lp_blocks, g_blocks = _logps_and_grads(model, batch, "blocks")
    m = batch.loss_mask > 0
    assert m.any()
    assert float((lp_blocks - lp_dense)[m].abs().max()) <= TOL
    assert float((g_blocks - g_dense).abs().max()) <= 1e-5 * float(g_dense.abs().max()) + 1e-6
    assert model.config._attn_implementation == "sdpa"  # switched for the forward only


def test_blocks_logprobs_equal_per_call_recomputation(model):
    """mem1_exact rows through the blocks path == one plain causal forward per call."""
    with torch.no_grad():
        gap = packing_gap(model, _trajs("mem1", 2), "mem1_exact")
    assert gap["max_abs"] <= TOL and gap["n_tokens"] > 0


def test_packed_attention_passes_separate_rows_and_refuses_flex_backward_on_cpu(model):
    batch = pack(_trajs(), "separate", 0)
    with packed_attention(model, batch.attention_mask, "blocks") as m:
        assert m is batch.attention_mask and model.config._attn_implementation == "sdpa"
    mask = _mask("mem1_exact")
    if flex_available():
        with pytest.raises(ValueError, match="no backward on CPU"):
            with packed_attention(model, mask, "flex"):
                pass
    with pytest.raises(ValueError, match="unknown attention path"):
        with packed_attention(model, mask, "sparse"):
            pass
    with pytest.raises(ValueError, match="TrainConfig.runtime.attention"):
        TrainConfig.from_flags(attention="sparse").validate()


@pytest.mark.parametrize(
    "algo,packing", [("ppo", "mem1_exact"), pytest.param("grpo", "mem1_mask", marks=pytest.mark.slow)]
)
def test_learner_update_is_the_same_with_blocks_and_dense(algo, packing):
    """The whole update (old, reference and critic forwards, loss, backward) on real rollouts:
    the same gradients and statistics along either attention path."""
    trajs = _trajs("mem1", 2)
    for i, t in enumerate(trajs):  # distinct rewards, so advantages (and gradients) are non-zero
        t.reward = float(i % 2)
    out = {}
    for path in ("dense", "blocks"):
        cfg = TrainConfig.from_flags(
            method="mem1",
            algo=algo,
            packing=packing,
            init="tiny",
            device="cpu",
            attention=path,
            n_samples=2,
            lr=1e-3,
            eval_every=0,
            save_every=0,
            out_dir="",
            kl_coef=0.01,
            recompute_old_logprobs=True,
        )
        learner = Learner(cfg, fresh_tiny(kit(), 0).model, kit().tokenizer)
        learner.keep_grads = True
        stats = learner.update(trajs)
        grads = torch.cat([p.grad.flatten() for p in learner.policy.parameters() if p.grad is not None])
        out[path] = stats, grads
        assert learner.policy.config._attn_implementation == "sdpa"
    (s_d, g_d), (s_b, g_b) = out["dense"], out["blocks"]
    assert float(g_d.abs().max()) > 0
    assert float((g_b - g_d).abs().max()) <= 1e-4 * float(g_d.abs().max()) + 1e-6
    for key in ("pg_loss", "kl", "entropy", "ratio", "old_logprob_gap"):
        assert s_b[key] == pytest.approx(s_d[key], abs=1e-5), key


# ----------------------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.parametrize("path", ["blocks", pytest.param("flex", marks=needs_flex)])
@pytest.mark.parametrize("mode", ["mem1_mask", "mem1_exact"])
def test_cuda_paths_equal_the_dense_path(path, mode):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        gpu = fresh_tiny(kit(), 0).model.eval().to("cuda")
        batch = pack(_trajs("mem1", 4), mode, kit().tokenizer.pad_token_id)
        lp_dense, g_dense = _logps_and_grads(gpu, batch, "dense")
        lp, g = _logps_and_grads(gpu, batch, path)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    m = batch.loss_mask > 0
    assert float((lp - lp_dense)[m].abs().max()) <= TOL
    assert float((g - g_dense).abs().max()) <= 1e-4 * float(g_dense.abs().max()) + 1e-5
