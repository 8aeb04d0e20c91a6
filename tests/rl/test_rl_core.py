"""memkit.rl core: losses, advantages, packing. Vectorised kernels vs loop references across
seeds; packed log-probs vs per-call recomputation on a random-init tiny Llama."""

from __future__ import annotations

import math

import pytest
import torch

from memkit.core.trajectory import Call, Trajectory
from memkit.models.generation import sequence_logprobs
from memkit.rl import advantages as adv, losses as L
from memkit.rl.packed_forward import model_attention_mask, packed_token_logprobs, packing_gap
from memkit.rl.packing import pack

SEEDS = range(6)


def _batch(seed, B=4, T=9, p_mask=0.7):
    g = torch.Generator().manual_seed(seed)
    x = lambda: torch.randn(B, T, generator=g, dtype=torch.float64)  # noqa: E731
    mask = torch.rand(B, T, generator=g) < p_mask
    mask[-1] = False  # an all-padding row
    mask[0, 0] = True
    return x, mask, g


# ============================================================================ losses
@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_aggregate_matches_loop(mode):
    for s in SEEDS:
        x, mask, _ = _batch(s)
        v = x()
        assert float(L.aggregate(v, mask, mode)) == pytest.approx(L.aggregate_loop(v, mask, mode), abs=1e-10)


def test_aggregate_modes_differ_and_reject_unknown():
    v = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert float(L.aggregate(v, m, "token-mean")) == pytest.approx(8 / 5)
    assert float(L.aggregate(v, m, "seq-mean-token-sum")) == pytest.approx(4.0)
    assert float(L.aggregate(v, m, "seq-mean-token-mean")) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        L.aggregate(v, m, "token-sum")


@pytest.mark.parametrize(
    "clip_high,clip_c,mode",
    [(None, None, "token-mean"), (0.28, None, "seq-mean-token-mean"), (None, 3.0, "seq-mean-token-sum")],
)
def test_ppo_clip_matches_loop(clip_high, clip_c, mode):
    for s in SEEDS:
        x, mask, _ = _batch(s)
        logp, old = -x().abs(), -x().abs()
        A = 2 * x()
        loss, st = L.ppo_clip_loss(logp, old, A, mask, 0.2, clip_high, mode, clip_c)
        ref = L.ppo_clip_loss_loop(logp, old, A, mask, 0.2, clip_high, mode, clip_c)
        assert float(loss) == pytest.approx(ref, abs=1e-9)
        assert float(st["approx_kl"]) == pytest.approx(float(((old - logp) * mask).sum() / mask.sum()))
        assert 0.0 <= float(st["clip_frac"]) <= 1.0


def test_ppo_clip_gradient_is_zero_on_clipped_tokens():
    old = torch.zeros(1, 4)
    logp = torch.tensor([[0.5, 0.05, -0.5, -0.05]], requires_grad=True)  # ratios 1.65, 1.05, 0.61, 0.95
    A = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, st = L.ppo_clip_loss(logp, old, A, torch.ones(1, 4))
    loss.backward()
    g = logp.grad[0]
    assert g[0] == 0 and g[2] == 0  # A>0 & r>1+eps, A<0 & r<1-eps: clipped, no gradient
    assert g[1] == pytest.approx(-1.0 * math.exp(0.05) / 4) and g[3] == pytest.approx(math.exp(-0.05) / 4)
    assert float(st["clip_frac"]) == pytest.approx(0.5)


def test_value_loss_matches_loop():
    for s in SEEDS:
        x, mask, _ = _batch(s)
        v, ov, R = x(), x(), x()
        for clip in (None, 0.2):
            loss, _ = L.value_loss(v, ov, R, mask, clip, "token-mean")
            assert float(loss) == pytest.approx(L.value_loss_loop(v, ov, R, mask, clip), abs=1e-9)


@pytest.mark.parametrize("kind", L.KL_KINDS)
def test_kl_penalty_matches_loop(kind):
    for s in SEEDS:
        x, _, _ = _batch(s)
        a, r = 3 * x(), 3 * x()
        got = L.kl_penalty(a, r, kind).flatten().tolist()
        assert got == pytest.approx(L.kl_penalty_loop(a, r, kind), abs=1e-9)
    with pytest.raises(ValueError):
        L.kl_penalty(a, r, "k4")


def test_kl_estimators_are_unbiased_for_true_kl():
    """Monte-Carlo: E_{x~p}[k1] = E_{x~p}[k3] = KL(p||q); k3 >= 0 everywhere."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(20, generator=g), 0)
    q = torch.softmax(torch.randn(20, generator=g), 0)
    true = float((p * (p.log() - q.log())).sum())
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    lp, lq = p.log()[x].double(), q.log()[x].double()
    k3 = L.kl_penalty(lp, lq, "k3")
    assert float(L.kl_penalty(lp, lq, "k1").mean()) == pytest.approx(true, rel=0.03)
    assert float(k3.mean()) == pytest.approx(true, rel=0.03)
    assert float(k3.min()) >= 0 and float(k3.std()) < float(L.kl_penalty(lp, lq, "k1").std())


def test_entropy_matches_loop_and_uniform():
    for s in SEEDS:
        logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(s), dtype=torch.float64) * 3
        assert L.entropy_from_logits(logits).flatten().tolist() == pytest.approx(
            L.entropy_from_logits_loop(logits), abs=1e-5
        )
    assert float(L.entropy_from_logits(torch.zeros(7))) == pytest.approx(math.log(7), abs=1e-6)


# ============================================================================ advantages
def test_grpo_matches_loop_across_seeds():
    for s in SEEDS:
        g = torch.Generator().manual_seed(s)
        n = 13
        r = torch.randint(0, 3, (n,), generator=g).float() / 2
        gid = [f"task{int(i)}" for i in torch.randint(0, 5, (n,), generator=g)] + ["lonely"]
        r = torch.cat([r, torch.tensor([0.7])])
        for norm in (True, False):
            assert adv.grpo_advantages(r, gid, norm_std=norm).tolist() == pytest.approx(
                adv.grpo_advantages_loop(r, gid, norm_std=norm), abs=1e-5
            )
        assert adv.grpo_advantages(r, torch.tensor([hash(x) % 7 for x in gid])).shape == (n + 1,)


def test_grpo_properties():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.3])
    gid = [0, 0, 0, 0, 1, 1, 2]
    a = adv.grpo_advantages(r, gid)
    assert float(a[:4].sum()) == pytest.approx(0, abs=1e-6)
    assert a[:4].tolist() == pytest.approx([0.866, -0.866, 0.866, -0.866], abs=1e-3)  # unbiased std 0.577
    assert a[4:6].tolist() == [0.0, 0.0]  # identical rewards: no signal
    assert float(a[6]) == pytest.approx(0.3, abs=1e-5)  # verl: singleton keeps its raw reward


def test_gae_matches_loop_across_seeds():
    for s in SEEDS:
        x, mask, g = _batch(s, B=5, T=17)
        gamma, lam = float(torch.rand(1, generator=g)) * 0.5 + 0.5, float(torch.rand(1, generator=g))
        r, v = x(), x()
        a, R = adv.gae(r, v, mask, gamma, lam)
        ra, rR = adv.gae_loop(r, v, mask, gamma, lam)
        assert a.tolist() == [pytest.approx(row, abs=1e-9) for row in ra]
        assert R.tolist() == [pytest.approx(row, abs=1e-9) for row in rR]


def test_gae_skips_masked_tokens():
    """Observation tokens inserted between outputs (mask 0, arbitrary values/rewards) change
    nothing on the output tokens."""
    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(1, 6, generator=g), torch.randn(1, 6, generator=g)
    a0, _ = adv.gae(r, v, torch.ones(1, 6), 0.9, 0.8)
    keep = torch.tensor([1, 1, 0, 0, 1, 1, 1, 0, 1, 0], dtype=torch.bool)
    r2, v2 = torch.randn(1, 10, generator=g), torch.randn(1, 10, generator=g)
    r2[0, keep], v2[0, keep] = r[0], v[0]
    a2, _ = adv.gae(r2, v2, keep[None], 0.9, 0.8)
    assert a2[0, keep].tolist() == pytest.approx(a0[0].tolist(), abs=1e-6)
    assert a2[0, ~keep].abs().sum() == 0


def test_gae_lambda1_gamma1_is_return_minus_value():
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    a, R = adv.gae(r, v, torch.ones(1, 4))
    assert R.tolist()[0] == pytest.approx([1, 1, 1, 1])
    assert a.tolist()[0] == pytest.approx([0.9, 0.8, 0.7, 0.6])
    assert adv.discounted_returns(r, torch.ones(1, 4), 0.5).tolist()[0] == pytest.approx([0.125, 0.25, 0.5, 1])


def test_broadcast_to_calls_matches_loop():
    for s in SEEDS:
        g = torch.Generator().manual_seed(s)
        a = torch.randn(6, generator=g)
        n = torch.randint(1, 5, (6,), generator=g).tolist()
        assert adv.broadcast_to_calls(a, n).tolist() == pytest.approx(adv.broadcast_to_calls_loop(a, n))


def test_masked_whiten():
    v = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    w = adv.masked_whiten(v, m)
    assert w.tolist()[0] == pytest.approx([-1, 0, 1, 0], abs=1e-6)


# ============================================================================ packing
def _model(impl="sdpa", init=0.02):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init,
    )
    cfg._attn_implementation = impl
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def sdpa_model():
    return _model("sdpa")


def _ids(g):
    """Distinct token ids per trajectory, so no two calls share a prefix by accident."""
    perm = torch.randperm(96, generator=g) + 4
    it = iter(perm.tolist())
    return lambda n: [next(it) for _ in range(n)]


def mem1_traj(seed, n_calls=4, chat=None, P=7):
    """MEM1 contexts: ctx_1 = prompt; ctx_t = prompt + out_{t-1} + obs_{t-1} (+ chat suffix)."""
    g = torch.Generator().manual_seed(seed)
    take = _ids(g)
    prompt, calls = take(P), []
    for t in range(n_calls):
        ctx, refs = list(prompt), []
        if t:
            p = calls[-1]
            refs.append((len(ctx), len(ctx) + p.n_output, t - 1, "output"))
            ctx += p.output_ids
            refs.append((len(ctx), len(ctx) + len(p.observation_ids), t - 1, "observation"))
            ctx += p.observation_ids
            ctx += list(chat or [])
        out = take(3 + (seed + t) % 4)
        lp = torch.rand(len(out), generator=g).log().tolist()
        calls.append(
            Call(
                turn=t,
                role="act",
                context_ids=ctx,
                output_ids=out,
                logprobs=lp,
                context_refs=refs,
                observation_ids=take(3 + t % 2) if t < n_calls - 1 else [],
            )
        )
    return Trajectory(task_id=f"t{seed}", method="mem1", calls=calls, reward=float(seed % 2))


def react_traj(seed, n_calls=3):
    """ReAct contexts: ctx_{t+1} = ctx_t + out_t + obs_t (everything kept)."""
    g = torch.Generator().manual_seed(seed)
    take = _ids(g)
    ctx, refs, calls = take(5), [], []
    for t in range(n_calls):
        out, obs = take(4), take(3)
        calls.append(
            Call(
                turn=t,
                role="act",
                context_ids=list(ctx),
                output_ids=out,
                logprobs=[-1.0] * 4,
                context_refs=list(refs),
                observation_ids=obs,
            )
        )
        refs += [(len(ctx), len(ctx) + 4, t, "output"), (len(ctx) + 4, len(ctx) + 7, t, "observation")]
        ctx += out + obs
    return Trajectory(task_id="r", method="react", calls=calls)


TRAJS = [mem1_traj(0, 4), mem1_traj(1, 3, chat=[1, 2]), mem1_traj(2, 5, chat=[3])]


def _causal_logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_transformers_4d_mask_convention(impl):
    """transformers 5.x passes a 4D mask through untouched. sdpa: bool True = attend; eager
    *adds* the mask. Additive 0/-inf works on both; a 0/1 float mask (or bool on eager) masks
    nothing: logits move by >> 1e-4. model_attention_mask picks the right form."""
    model = _model(impl)
    ids = torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(0))
    ref = _causal_logits(model, ids, None).detach()
    causal = torch.ones(20, 20, dtype=torch.bool).tril().expand(2, 1, 20, 20)
    additive = torch.zeros(2, 1, 20, 20).masked_fill(~causal, float("-inf"))
    diff = lambda m: float((_causal_logits(model, ids, m) - ref).abs().max().detach())  # noqa: E731
    assert diff(additive) <= 1e-5
    assert diff(model_attention_mask(causal, model)) <= 1e-5
    assert diff(causal.float()) > 1e-2  # 0/1 float as additive: no masking at all
    if impl == "sdpa":
        assert diff(causal) <= 1e-5
    else:
        assert diff(causal) > 1e-2  # eager adds a bool mask as +1/+0


def test_separate_equals_per_call_recompute(sdpa_model):
    gap = packing_gap(sdpa_model, TRAJS, "separate")
    assert gap["max_abs"] <= 1e-5, gap


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_mem1_exact_equals_per_call_recompute(impl, sdpa_model):
    model = sdpa_model if impl == "sdpa" else _model("eager")
    gap = packing_gap(model, TRAJS, "mem1_exact")
    assert gap["max_abs"] <= 1e-4, gap


def test_mem1_mask_gap_is_measured(sdpa_model, capsys):
    """Paper's masked trajectory: exact for calls 1-2 (same positions, same history), off from
    call 3 on, where the reused state sits at other positions with other hidden states."""
    out = {}
    for init, model in (("0.02", sdpa_model), ("0.2", _model("sdpa", 0.2))):
        gap = packing_gap(model, TRAJS, "mem1_mask")
        for per_call in gap["per_call_max"]:
            assert max(per_call[:2]) <= 1e-4, per_call
            assert min(per_call[2:]) > 1e-4, per_call
        exact = packing_gap(model, TRAJS, "mem1_exact")["max_abs"]
        out[init] = (gap["max_abs"], gap["mean_abs"], exact)
    with capsys.disabled():
        for init, (mx, mean, ex) in out.items():
            print(
                f"\n[mem1 gap] init_std={init}: mem1_mask max|dlogp|={mx:.4g} mean={mean:.3g}; mem1_exact max={ex:.2g}"
            )


class _Wrapper(torch.nn.Module):
    """Forward-only, as DDP / FSDP / a DeepSpeed engine are to the loss: no body or head to call apart."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kw):
        return self.module(**kw)


@pytest.mark.parametrize("mode", ["separate", "mem1_mask", "mem1_exact"])
def test_loss_masked_logprobs_equal_full_logits(mode):
    """token_logprobs(loss_mask=m) runs the LM head only where m needs it: same log-probs,
    entropies and gradients on the scored tokens as the full [B, L, V] path, 0 elsewhere, for a
    bare model (body, then head on the N scored positions) and a wrapped one (its forward with
    ``logits_to_keep``: the head on K < L positions)."""
    from memkit.rl.losses import token_logprobs

    model = _model("sdpa", 0.2)
    b = pack(TRAJS, mode, pad_id=0)
    args = (b.input_ids, model_attention_mask(b.attention_mask, model), b.position_ids, b.pred_index)
    m = b.loss_mask.bool()
    head_rows = []
    hook = model.lm_head.register_forward_hook(lambda mod, i, o: head_rows.append(i[0].shape[-2]))
    runs = []
    for net, mask in ((model, None), (model, m), (_Wrapper(model), m)):
        model.zero_grad()
        logp, ent = token_logprobs(net, *args, with_entropy=True, loss_mask=mask)
        ((logp * m).sum() + (ent * m).sum()).backward()
        runs.append((logp, ent, [p.grad.clone() for p in model.parameters()]))
    hook.remove()
    (lf, ef, gf) = runs[0]
    for lm, em, gm in runs[1:]:
        assert (lm[~m] == 0).all() and (em[~m] == 0).all()
        assert (lf[m] - lm[m]).abs().max() <= 1e-5 and (ef[m] - em[m]).abs().max() <= 1e-5
        assert max(float((a - c).abs().max()) for a, c in zip(gf, gm)) <= 1e-4  # float32 summation order
    L = b.input_ids.shape[1]
    assert head_rows[0] == L and head_rows[1] == int(m.sum()) and head_rows[2] < L, (head_rows, L)


def test_react_packs_into_one_causal_sequence(sdpa_model):
    tr = react_traj(0)
    last = tr.calls[-1]
    ex = pack([tr], "mem1_exact")
    assert ex.n_tokens == last.n_context + last.n_output
    assert ex.input_ids[0].tolist() == last.context_ids + last.output_ids
    n = ex.n_tokens
    assert torch.equal(ex.attention_mask[0, 0], torch.ones(n, n, dtype=torch.bool).tril())
    assert torch.equal(ex.position_ids[0], torch.arange(n))
    for mode in ("mem1_exact", "mem1_mask"):  # refs cover everything: the stitched row is exact
        assert packing_gap(sdpa_model, [tr], mode)["max_abs"] <= 1e-4


@pytest.mark.parametrize("mode", ["separate", "mem1_mask", "mem1_exact"])
def test_packed_fields_align_with_calls(mode):
    b = pack(TRAJS, mode, pad_id=0)
    B, Lx = b.input_ids.shape
    for f in (b.position_ids, b.pred_index, b.loss_mask, b.old_logprobs, b.call_ids):
        assert f.shape == (B, Lx)
    assert b.attention_mask.dtype == torch.bool
    assert b.attention_mask.shape == ((B, Lx) if mode == "separate" else (B, 1, Lx, Lx))
    for row in range(B):
        i = int(b.unit_index[row])
        for t, c in enumerate(TRAJS[i].calls):
            if mode == "separate" and int(b.call_index[row]) != t:
                continue
            sel = b.call_ids[row] == t
            assert b.input_ids[row][sel].tolist() == c.output_ids
            assert b.old_logprobs[row][sel].tolist() == pytest.approx(c.logprobs)
            assert bool((b.loss_mask[row][sel] == 1).all())
            first = int(sel.nonzero()[0])
            assert b.input_ids[row, b.pred_index[row, first]] == c.context_ids[-1]
        assert float(b.loss_mask[row][b.call_ids[row] < 0].abs().sum()) == 0
    if mode != "separate":  # every query row attends to itself, nothing outside the row
        d = b.attention_mask[:, 0].diagonal(dim1=-2, dim2=-1)
        assert bool(d.all())
        valid = torch.arange(Lx) < b.lengths[:, None]
        assert not bool((b.attention_mask[:, 0] & valid[:, :, None] & ~valid[:, None, :]).any())


def test_tokens_processed():
    sep, mask, exact = (pack(TRAJS, m) for m in ("separate", "mem1_mask", "mem1_exact"))
    assert sep.n_tokens == sum(c.n_total for tr in TRAJS for c in tr.calls)
    stitched = sum(
        len(tr.calls[0].context_ids)
        + sum(c.n_output + len(c.observation_ids) for c in tr.calls)
        + sum(c.n_context - c.context_refs[-1][1] for c in tr.calls[1:])
        for tr in TRAJS
    )
    assert mask.n_tokens == stitched
    # exact duplicates each state from call 3 on (out_1's copy equals the generated one)
    assert exact.n_tokens == stitched + sum(c.n_output for tr in TRAJS for c in tr.calls[1:-1])
    assert sep.n_tokens > exact.n_tokens > mask.n_tokens
    assert sep.n_attention_pairs > mask.n_attention_pairs


def test_bad_refs_raise():
    tr = mem1_traj(0, 3)
    tr.calls[2].context_refs[0] = (7, 9, 2, "output")  # points at itself
    with pytest.raises(ValueError):
        pack([tr], "mem1_mask")
    tr = mem1_traj(0, 3)
    tr.calls[1].context_ids[8] = 0  # no longer a verbatim copy
    with pytest.raises(ValueError):
        pack([tr], "mem1_exact")


def test_ppo_backward_through_packed_logprobs(sdpa_model):
    b = pack(TRAJS, "mem1_exact")
    logp = packed_token_logprobs(sdpa_model, b)
    adv_tok = torch.tensor([1.0, -1.0, 0.5])[b.unit_index][:, None] * b.loss_mask
    loss, st = L.ppo_clip_loss(logp, b.old_logprobs, adv_tok, b.loss_mask, agg="seq-mean-token-mean")
    loss.backward()
    grads = [p.grad for p in sdpa_model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    sdpa_model.zero_grad(set_to_none=True)
    ref = sequence_logprobs(sdpa_model, TRAJS[0].calls[2].context_ids, TRAJS[0].calls[2].output_ids)
    assert torch.allclose(logp[0][b.call_ids[0] == 2].detach(), ref, atol=1e-4)


def test_at_pred_reads_predicting_position():
    b = pack(TRAJS[:1], "mem1_exact")
    x = torch.arange(b.input_ids.shape[1], dtype=torch.float32)[None] + 1
    got = b.at_pred(x)
    assert torch.equal(got, torch.where(b.pred_index >= 0, b.pred_index.float() + 1, torch.zeros_like(got)))


def test_padded_tokens_and_attention_cells():
    for mode in ("separate", "mem1_mask", "mem1_exact"):
        b = pack(TRAJS, mode)
        B, Lx = b.input_ids.shape
        assert b.n_padded_tokens == B * Lx >= b.n_tokens
        assert b.n_attention_cells == B * Lx * Lx >= b.n_attention_pairs


@pytest.mark.parametrize("mode", ["separate", "mem1_mask", "mem1_exact"])
def test_row_pieces_tile_rows_and_name_mem1_blocks(mode):
    from memkit.rl.row_pieces import row_pieces

    b, segs = pack(TRAJS, mode), row_pieces(TRAJS, mode)
    assert len(segs) == b.input_ids.shape[0]
    for row, runs in enumerate(segs):
        assert runs[0].start == 0 and runs[-1].end == int(b.lengths[row])
        assert all(x.end == y.start and x.start < x.end for x, y in zip(runs, runs[1:]))
        tr = TRAJS[int(b.unit_index[row])]
        for s in runs:
            ids = b.input_ids[row, s.start : s.end].tolist()
            cid = b.call_ids[row, s.start : s.end]
            if s.kind == "output":
                assert bool((cid == s.call).all()) and ids == tr.calls[s.call].output_ids
            else:
                assert bool((cid == -1).all())
            if s.kind == "copy":
                assert ids == tr.calls[s.call].output_ids
            if s.kind == "observation":
                assert ids == tr.calls[s.call].observation_ids
            if s.kind == "prompt":
                assert ids == tr.calls[0].context_ids[: len(ids)]
    labels = [s.label for s in segs[0]]
    expect = {
        "separate": ["q", "S1A1"],
        "mem1_mask": ["q", "S1A1", "O1", "S2A2", "O2", "S3A3", "O3", "S4A4"],
        "mem1_exact": ["q", "S1A1", "O1", "S2A2", "[S2A2]'", "O2", "S3A3", "[S3A3]'", "O3", "S4A4"],
    }[mode]
    assert labels == expect
    if mode == "separate":
        assert [s.label for s in segs[2]] == ["q", "[S2A2]'", "O2", "S3A3"]
        assert [s.label for s in row_pieces(TRAJS[1:2], mode)[1]] == ["q", "[S1A1]'", "O1", "c2", "S2A2"]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_mask_form_logit_gap(impl, sdpa_model):
    """The 0/1-float pitfall as a number: float01 moves the logits a lot on both backends, a
    bool mask only on eager (added as +1/+0), an additive 0/-inf mask never."""
    from memkit.rl.packed_forward import mask_form_logit_gap, mask_in_form

    model = sdpa_model if impl == "sdpa" else _model("eager")
    b = pack(TRAJS, "mem1_exact")
    gap = {f: mask_form_logit_gap(model, b, f) for f in ("bool", "additive", "float01")}
    assert gap["additive"]["logit_max_abs"] <= 1e-5
    assert gap["float01"]["logit_max_abs"] > 0.1 and gap["float01"]["logprob_max_abs"] > 1e-2
    assert (gap["bool"]["logit_max_abs"] <= 1e-5) == (impl == "sdpa")
    m = b.attention_mask
    assert mask_in_form(m, "float01").unique().tolist() == [0.0, 1.0]
    assert torch.equal(mask_in_form(m, "additive") == 0, m)
    with pytest.raises(ValueError, match="unknown mask form"):
        mask_in_form(m, "ones")
    with pytest.raises(ValueError, match="2D-mode batch"):
        mask_form_logit_gap(model, pack(TRAJS, "separate"), "float01")


def test_plot_mask_and_viewer_name_row_pieces():
    from memkit.rl.row_pieces import row_pieces
    from memkit.viz.mask import MaskViewer, plot_mask

    b, segs = pack(TRAJS, "mem1_exact"), row_pieces(TRAJS, "mem1_exact")
    n = int(b.lengths[0])
    fig = plot_mask(b.attention_mask[0, 0, :n, :n], pieces=segs[0])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [s.label for s in segs[0]]
    assert [t.get_text() for t in ax.get_yticklabels()] == [s.label for s in segs[0]]
    assert len(ax.lines) == 2 * (len(segs[0]) - 1)  # a boundary at each start but 0, both axes
    plot_mask(b.attention_mask[0, 0, :n, :n], pieces=[(s.start, s.end, s.label) for s in segs[0]])
    v = MaskViewer(b.attention_mask, pieces=segs)
    v.slider.value = 2
    assert [t.get_text() for t in v.figure.axes[0].get_xticklabels()] == [s.label for s in segs[2]]


def _brute_force_padding(lengths, max_groups):
    """The fewest padded slots over every cut of the sorted lengths into <= max_groups runs."""
    import itertools

    s = sorted(lengths)
    best = float("inf")
    for k in range(1, min(max_groups, len(s)) + 1):
        for cuts in itertools.combinations(range(1, len(s)), k - 1):
            bounds = (0,) + cuts + (len(s),)
            best = min(best, sum((b - a) * s[b - 1] for a, b in zip(bounds[:-1], bounds[1:])))
    return best


def test_length_groups_match_brute_force():
    """``length_groups`` (dynamic programming) finds the cut with the fewest padded slots, covers
    every row once, and never exceeds the group count; checked against trying every cut."""
    import random

    from memkit.rl.packing import length_groups

    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 8))]
        k = rng.randint(1, 4)
        groups = length_groups(lengths, k)
        assert sorted(r for g in groups for r in g) == list(range(len(lengths)))
        assert 1 <= len(groups) <= k
        padded = sum(len(g) * max(lengths[r] for r in g) for g in groups)
        assert padded == _brute_force_padding(lengths, k), (lengths, k, groups)
    assert length_groups([], 3) == [] and length_groups([5, 9], 1) == [[0, 1]]
