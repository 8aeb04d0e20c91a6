"""Behaviour cloning: the loss masks, the loss against a per-example loop, learning, checkpoints."""

import math

import pytest
import torch

from memkit.models import build_tiny, train_tokenizer
from memkit.train.sft import (
    AttentionProbe,
    SFTConfig,
    collect_examples,
    lr_shape,
    make_batch,
    save_checkpoint,
    sft_loss,
    sft_uses_bf16,
    train_sft,
)


@pytest.fixture(scope="module")
def tok():
    texts = ["<think>Q1: Marda.</think><answer>Marda</answer>", "The hometown of The Shokross is Marda."] * 20
    return train_tokenizer(texts, vocab_size=300)


def _examples(tok, n=6):
    out = []
    for i in range(n):
        ctx = tok(f"Question {i}: where is The Shokross from? The hometown of The Shokross is Marda.")["input_ids"]
        y = tok(f"<think>Q1: Marda.</think><answer>Marda {i}</answer>")["input_ids"]
        out.append((ctx[: 10 + i], y))
    return out


def test_make_batch_masks_outputs_only(tok):
    ex = _examples(tok, 3)
    ids, attn, out = make_batch(ex, pad_id=tok.pad_token_id)
    for i, (c, o) in enumerate(ex):
        assert ids[i, : len(c) + len(o)].tolist() == c + o
        assert out[i].nonzero().flatten().tolist() == list(range(len(c), len(c) + len(o)))
        assert attn[i].sum() == len(c) + len(o)
    assert not (out & ~attn.bool()).any()  # padding is never a target


def _loss_loop(model, examples, context_weight, keep=None):
    """Per-example reference: mean NLL over all output tokens (+ w * mean NLL over the context
    tokens, only those with ``keep[i][t]`` when ``keep`` is given)."""
    out_nll, ctx_nll = [], []
    for i, (c, o) in enumerate(examples):
        seq = torch.tensor([c + o])
        logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), -1)
        for t in range(1, len(c) + len(o)):
            if t >= len(c):
                out_nll.append(-logp[t - 1, seq[0, t]].item())
            elif keep is None or keep[i][t]:
                ctx_nll.append(-logp[t - 1, seq[0, t]].item())
    loss = sum(out_nll) / len(out_nll)
    return loss + (context_weight * sum(ctx_nll) / len(ctx_nll) if context_weight else 0.0)


@pytest.mark.parametrize("w", [0.0, 0.5])
def test_sft_loss_matches_per_example_loop(tok, w):
    torch.manual_seed(0)
    model = build_tiny(tok, seed=1)
    ex = _examples(tok)
    ids, attn, out = make_batch(ex, pad_id=tok.pad_token_id)
    with torch.no_grad():
        got = sft_loss(model, ids, attn, out, context_weight=w).item()
    assert got == pytest.approx(_loss_loop(model, ex, w), abs=1e-4)


@pytest.mark.parametrize("lm_head_on_scored_only", [True, False])
def test_sft_loss_on_a_context_subset_matches_loop(tok, monkeypatch, lm_head_on_scored_only):
    """context_keep scores a subset of context tokens; both code paths (LM head on the scored
    positions only, and the full-logits path a DDP-wrapped model takes) equal the loop."""
    import memkit.train.sft as sft

    if not lm_head_on_scored_only:
        monkeypatch.setattr(sft, "decoder_and_head", lambda model: None)
    model = build_tiny(tok, seed=1)
    ex = _examples(tok)
    ids, attn, out = make_batch(ex, pad_id=tok.pad_token_id)
    keep = torch.rand(ids.shape, generator=torch.Generator().manual_seed(3)) < 0.3
    with torch.no_grad():
        got = sft.sft_loss(model, ids, attn, out, context_weight=0.7, context_keep=keep).item()
    want = _loss_loop(model, ex, 0.7, keep=keep.tolist())
    assert got == pytest.approx(want, abs=1e-4)
    assert got != pytest.approx(_loss_loop(model, ex, 0.7), abs=1e-3)  # the subset matters


def test_sft_learns_the_outputs(tok):
    model = build_tiny(tok, seed=0)
    ex = _examples(tok)
    ids, attn, out = make_batch(ex, pad_id=tok.pad_token_id)
    with torch.no_grad():
        before = sft_loss(model, ids, attn, out).item()
    cfg = SFTConfig(steps=40, batch_size=6, lr=3e-3, warmup=5, log_every=10)
    hist = train_sft(model, tok, ex, cfg, progress=False)
    with torch.no_grad():
        after = sft_loss(model, ids, attn, out).item()
    assert before > math.log(50) and after < 0.25 * before, (before, after)
    assert model.config._attn_implementation == "sdpa"  # trained with eager on CPU, handed back as built
    assert [r["step"] for r in hist] == [0, 10, 20, 30, 39]


@pytest.mark.parametrize("caps", [{"avx512_bf16": True}, {}])
def test_sft_autocasts_to_bf16_only_where_asked_on_cpus(monkeypatch, caps):
    """bf16=None: float32 on every CPU (a CPU with bf16 vector instructions ran the tiny model's
    steps 1.69x slower in bf16); an explicit True/False always wins."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    cpu = torch.device("cpu")
    assert sft_uses_bf16(None, cpu) is False
    assert sft_uses_bf16(True, cpu) is True and sft_uses_bf16(False, cpu) is False


@pytest.mark.parametrize("bf16,dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_sft_steps_run_in_the_chosen_precision(tok, bf16, dtype):
    model = build_tiny(tok, seed=0)
    seen = []
    model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    hist = train_sft(
        model, tok, _examples(tok), SFTConfig(steps=2, batch_size=6, bf16=bf16, log_every=1), progress=False
    )
    assert set(seen) == {dtype} and hist[0]["autocast"] == str(dtype).removeprefix("torch.")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights and AdamW stay float32


def test_attention_probe_alternates_then_picks_the_lower_median_per_token():
    probe = AttentionProbe(warmup=2, rounds=3)
    assert [probe.kernel_for(s) for s in range(10)] == [None, None] + ["eager", "sdpa"] * 3 + [None, None]
    assert [s for s in range(12) if probe.done(s)] == [8]
    assert probe.faster() == "eager"  # nothing timed: keep the default
    for sec in (1.0, 1.1, 0.9):
        probe.record("eager", sec, 100)
        probe.record("sdpa", 1.5 * sec, 200)  # more seconds, but on twice the tokens
    assert probe.faster() == "sdpa"
    tie = AttentionProbe()
    tie.record("eager", 1.0, 10), tie.record("sdpa", 1.0, 10)
    assert tie.faster() == "eager"


@pytest.mark.parametrize("winner", ["sdpa", "eager"])
def test_train_sft_times_both_kernels_then_keeps_the_winner(tok, monkeypatch, winner):
    monkeypatch.setattr(AttentionProbe, "faster", lambda self: winner)
    model = build_tiny(tok, seed=0)
    hist = train_sft(model, tok, _examples(tok), SFTConfig(steps=12, batch_size=3, log_every=1), progress=False)
    used = [r["attention"] for r in hist]
    assert used == ["eager"] * 2 + ["eager", "sdpa"] * 4 + [winner] * 2
    assert model.config._attn_implementation == "sdpa"  # handed back as built


def test_sft_loss_and_gradients_agree_between_the_attention_kernels(tok):
    """The probe trains with both kernels, so they must give the same loss and gradients."""
    ids, attn, out = make_batch(_examples(tok), pad_id=tok.pad_token_id)
    got = {}
    for kernel in AttentionProbe.KERNELS:
        model = build_tiny(tok, seed=0)
        model.set_attn_implementation(kernel)
        loss = sft_loss(model, ids, attn, out, context_weight=1.0)
        loss.backward()
        got[kernel] = (loss.item(), model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    assert got["eager"][0] == pytest.approx(got["sdpa"][0], abs=1e-5)
    assert torch.allclose(got["eager"][1], got["sdpa"][1], atol=1e-5)


def test_train_sft_fixed_cpu_attention_and_a_clear_error(tok):
    model = build_tiny(tok, seed=0)
    hist = train_sft(
        model, tok, _examples(tok), SFTConfig(steps=4, batch_size=3, log_every=1, cpu_attention="sdpa"), progress=False
    )
    assert {r["attention"] for r in hist} == {"sdpa"}
    with pytest.raises(ValueError, match="cpu_attention='flash'.*'auto', 'eager' or 'sdpa'"):
        SFTConfig(cpu_attention="flash")


class _Call:
    def __init__(self, c, o):
        self.context_ids, self.output_ids = c, o


class _Traj:
    def __init__(self, calls):
        self.calls = calls


def test_collect_examples_drops_long_and_empty_calls():
    trajs = [_Traj([_Call([1] * 5, [2] * 3), _Call([1] * 9, [2] * 3), _Call([1] * 3, [])])]
    ex, dropped = collect_examples(trajs, max_len=10)
    assert ex == [([1] * 5, [2] * 3)] and dropped == 1


def test_checkpoint_round_trip_is_exact_and_replaces_atomically(tok, tmp_path):
    from memkit.models import load_policy

    model = build_tiny(tok, seed=3)
    path = tmp_path / "ckpt"
    save_checkpoint(build_tiny(tok, seed=4), tok, path)  # an older checkpoint is replaced whole
    save_checkpoint(model, tok, path, meta={"note": "x"})
    assert not (tmp_path / "ckpt.tmp").exists() and (path / "memkit.json").exists()
    loaded = load_policy(str(path))
    ids = torch.tensor([tok("The hometown of The Shokross")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(loaded.model(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6)


def test_time_budget_stops_training_and_ends_the_schedule(tok):
    model = build_tiny(tok, seed=0)
    cfg = SFTConfig(steps=10_000, batch_size=6, lr=1e-3, warmup=1, log_every=10_000, max_seconds=0.5)
    hist = train_sft(model, tok, _examples(tok), cfg, progress=False)
    assert hist[-1]["step"] < 10_000 - 1 and hist[-1]["seconds"] >= 0.5
    assert hist[-1]["lr"] < 1e-3 * 0.05  # the schedule ran on wall time, not on the 10k steps


def test_budget_note_names_the_minutes_a_slow_machine_needs():
    """A machine where a step takes 0.42 s (an AVX2-only CPU with the earlier words4 tokenizer): 1,383
    steps in the 10-minute budget, EM 0.21. The note says so and names the budget that reaches
    SKILL_STEPS at the measured pace."""
    from memkit.train.sft import SKILL_STEPS, budget_note

    cfg = SFTConfig()
    slow = [{"step": 0, "seconds": 1.0}, {"step": 1382, "seconds": 583.0}]
    note = budget_note(slow, cfg, total_seconds=609.0, method="mem1")
    per_step = 583.0 / 1383
    assert note is not None and "after 1383 of 4000 steps" in note and "0.42 s a step" in note
    assert math.ceil((26.0 + SKILL_STEPS * per_step) / 60) == 15 and "--max-minutes 15`" in note
    assert budget_note([{"step": 2038, "seconds": 575.0}], cfg, 600.0, "mem1") is None  # 2,039 steps: enough
    assert budget_note([{"step": 99, "seconds": 5.0}], SFTConfig(steps=100), 6.0, "mem1") is None  # all its steps
    assert budget_note(slow, SFTConfig(max_seconds=None), 609.0, "mem1") is None  # no budget: nothing stopped it
    assert budget_note(slow, SFTConfig(init="base"), 609.0, "mem1") is None  # SKILL_STEPS is a from-scratch figure


def test_lr_schedules_hold_then_decay_and_reject_unknown_names(tok):
    wsd = lr_shape(SFTConfig(schedule="wsd", decay_fraction=0.25))
    assert [wsd(f) for f in (0.0, 0.5, 0.75)] == [1.0, 1.0, 1.0]
    assert wsd(0.875) == pytest.approx(0.5) and wsd(1.0) == 0.0
    cos = lr_shape(SFTConfig(schedule="cosine"))
    assert cos(0.0) == 1.0 and cos(0.5) == pytest.approx(0.5) and cos(1.0) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="'wsd' or 'cosine'"):
        SFTConfig(schedule="linear")
    with pytest.raises(ValueError, match="decay_fraction"):
        SFTConfig(decay_fraction=0.0)
    # through the optimiser: warmup, the plateau at lr, then the decay to 0 over the last fifth
    cfg = SFTConfig(steps=50, batch_size=6, lr=1e-3, warmup=5, log_every=1, decay_fraction=0.2)
    lrs = [r["lr"] for r in train_sft(build_tiny(tok, seed=0), tok, _examples(tok), cfg, progress=False)]
    # (row s logs the rate of step s + 1)
    assert lrs[0] < lrs[2] < 1e-3 and all(x == pytest.approx(1e-3) for x in lrs[3:40])
    assert all(a > b for a, b in zip(lrs[39:], lrs[40:])) and lrs[-1] == 0.0


def test_decoder_and_head_refuses_models_that_rescale_their_logits(tok):
    """Gemma-style logit softcapping happens in forward() after the head: body + head alone
    would give other log-probs, so the helper must send callers to the full forward."""
    from memkit.models.training import decoder_and_head

    model = build_tiny(tok, seed=0)
    assert decoder_and_head(model) is not None
    model.config.final_logit_softcapping = 30.0
    assert decoder_and_head(model) is None


def test_sft_trains_on_all_cores_and_restores_the_callers_threads():
    import os

    from memkit.core.cpu import all_cores

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # what the notebooks set for generation
        with all_cores() as n:
            assert torch.get_num_threads() == n == max(1, len(os.sched_getaffinity(0)))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_busy_cpu_note_warns_only_when_other_jobs_hold_the_cores():
    from memkit.core.cpu import busy_cpu_note, cpu_busy_share

    assert busy_cpu_note(busy=0.05) is None
    note = busy_cpu_note(busy=0.9)
    assert note is not None and "--max-minutes 0" in note and "90%" in note
    share = cpu_busy_share(interval=0.05)
    assert share is None or 0.0 <= share <= 1.0


def test_keep_freed_memory_sets_glibc_thresholds_once(monkeypatch):
    """mallopt(M_MMAP_THRESHOLD = -3, 32 MiB) and mallopt(M_TRIM_THRESHOLD = -1, 1 GiB), once per
    process; a C library without glibc's mallopt, or MEMKIT_KEEP_FREED_MEMORY=0, leaves malloc alone."""
    import ctypes

    import memkit.core.cpu as cpu

    calls = []

    class GlibcLike:
        def gnu_get_libc_version(self):
            return b"2.36"

        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: GlibcLike())
    monkeypatch.delenv("MEMKIT_KEEP_FREED_MEMORY", raising=False)
    monkeypatch.setattr(cpu, "_kept", None)
    assert cpu.keep_freed_memory() is True and cpu.keep_freed_memory() is True
    assert sorted(calls) == [(-3, 32 << 20), (-1, 1 << 30)]  # (param, value) each once

    class NotGlibc:  # e.g. musl or macOS: no gnu_get_libc_version
        def mallopt(self, param, value):
            raise AssertionError("must not be called")

    monkeypatch.setattr(ctypes, "CDLL", lambda name: NotGlibc())
    monkeypatch.setattr(cpu, "_kept", None)
    assert cpu.keep_freed_memory() is False
    monkeypatch.setattr(ctypes, "CDLL", lambda name: GlibcLike())
    monkeypatch.setattr(cpu, "_kept", None)
    monkeypatch.setenv("MEMKIT_KEEP_FREED_MEMORY", "0")
    assert cpu.keep_freed_memory() is False and len(calls) == 2


def test_keep_freed_memory_takes_effect_on_this_machine():
    """On the real C library (glibc here) both mallopt calls succeed (mallopt returns 1)."""
    import os
    import platform
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MEMKIT_KEEP_FREED_MEMORY"}
    out = subprocess.run(
        [sys.executable, "-c", "from memkit.core.cpu import keep_freed_memory as k; print(k(), k())"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    expected = "True True" if platform.libc_ver()[0] == "glibc" else "False False"
    assert out.stdout.strip() == expected, out.stderr


def test_sft_variants_get_their_own_cache_tag_and_never_replace_the_default(capsys):
    """`memkit sft --objectives 1,2,3` used to overwrite the default checkpoint that the notebooks
    and `memkit train` start from. A variant recipe now saves under a tag naming it, evaluates that
    model, and loads back as tiny-sft:<tag>; a missing tag and a bad --tag get one clear error."""
    from memkit.cli import main
    from memkit.lab.policies import init_spec, sft_checkpoint_path, sft_tag
    from memkit.rl.config import TrainConfig

    assert sft_tag(SFTConfig(method="memsearcher", steps=10, max_seconds=None)) == "default"
    assert sft_tag(SFTConfig(objectives=(1, 2, 3))) == "k1-2-3-n4000-s0"
    assert sft_tag(SFTConfig(seed=1)) == "k1-2-n4000-s1"
    from dataclasses import replace

    from memkit.cli import build_parser
    from memkit.cli.args import config_from_args

    d = SFTConfig()  # other oracle data is another recipe, even with the default tasks
    assert sft_tag(replace(d, oracle=replace(d.oracle, show_comparison=True))) == "k1-2-n4000-s0-cmp"
    other = sft_tag(replace(d, oracle=replace(d.oracle, p_wrong_answer=0.1)))
    assert other.startswith("k1-2-n4000-s0-o") and other != "k1-2-n4000-s0-cmp"
    assert config_from_args(
        SFTConfig, build_parser().parse_args(["sft", "--method", "mem1", "--show-comparison"])
    ).oracle == replace(d.oracle, show_comparison=True)
    default = sft_checkpoint_path("mem1", 0)
    existed = default.exists()
    rc = main(
        [
            "sft",
            "--method",
            "mem1",
            "--objectives",
            "1,2,3",
            "--n-tasks",
            "6",
            "--steps",
            "2",
            "--max-minutes",
            "0",
            "--eval-tasks",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "--init tiny-sft:k1-2-3-n6-s0" in out and "tiny-sft:k1-2-3-n6-s0 mem1 k=2: EM" in out
    assert sft_checkpoint_path("mem1", 0, "k1-2-3-n6-s0").is_dir() and default.exists() == existed
    assert init_spec(TrainConfig(init="tiny-sft:k1-2-3-n6-s0"), 0) == str(
        sft_checkpoint_path("mem1", 0, "k1-2-3-n6-s0")
    )
    with pytest.raises(FileNotFoundError, match="tag 'k9-n1-s0'"):
        init_spec(TrainConfig(init="tiny-sft:k9-n1-s0"), 0)
    assert main(["sft", "--method", "mem1", "--tag", "../x", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--tag '../x'" in err and len(err.strip().splitlines()) == 1
