"""The GPU paths give the CPU's numbers: generation log-probs, the RL update, a training run.

Skipped without CUDA (CI has none); run on a GPU machine with ``pytest tests/models/test_gpu.py``.
TF32 is turned off so float32 matmuls on the GPU round like the CPU's, and the comparisons
can use float32 tolerances.
"""

from __future__ import annotations

import gc
import json
import math

import dist_worker as dw
import pytest
import torch

from tests.rl.test_trainer import _assert_same_update, _loop_cfg, _update

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("algo", sorted(dw.CASES))
def test_cuda_update_matches_the_cpu_update(algo):
    """``Learner.update`` on the GPU (accelerate's device placement, packed masks built on the GPU)
    moves every parameter as on the CPU."""
    from memkit.rl.config import TrainConfig
    from memkit.rl.engines import make_accelerator

    cpu_cond, gpu_cond = {}, {}
    # a float32 KL reference on both (``ref_dtype="auto"`` is bfloat16 on a GPU: a 2.5e-3 weight gap, measured)
    cpu_acc = make_accelerator(TrainConfig.from_flags(device="cpu"))
    on_cpu = dw.make_learner(algo, accelerator=cpu_acc, ref_dtype="float32")
    cpu, cpu_stats = _update(_keep(on_cpu), dw.trajectories(), cpu_cond)
    gpu_acc = make_accelerator(TrainConfig.from_flags(device="cuda"))
    learner = _keep(dw.make_learner(algo, accelerator=gpu_acc, ref_dtype="float32"))
    assert learner.acc.device.type == "cuda"  # right after a CPU accelerator in this process
    gpu, gpu_stats = _update(learner, dw.trajectories(), gpu_cond)
    # cuBLAS and the CPU's BLAS sum in other orders: gradients differ by ~3e-5 of their scale (measured
    # on an H100, 6.4e-8 on a 2e-3 gradient), 3x what one CPU path gets between its own two runs
    conditioned = {k: cpu_cond[k] & gpu_cond[k].cpu() for k in cpu_cond}
    _assert_same_update(cpu, gpu, conditioned, grad_rel=2e-4, weight_abs=1e-5)
    for key in ("pg_loss", "kl", "entropy", "grad_norm"):
        assert math.isclose(cpu_stats[key], gpu_stats[key], rel_tol=1e-4, abs_tol=1e-6), key


def _keep(learner):
    learner.keep_grads = True
    return learner


def test_cuda_generation_records_the_logprobs_a_fresh_forward_gives():
    """The batched engine on the GPU: recorded log-probs == a fresh forward (<= 1e-4), and greedy
    decoding picks the CPU's tokens."""
    from test_models import _texts

    from memkit.models import HFBackend, build_tiny, sequence_logprobs, train_tokenizer

    tok = train_tokenizer(_texts(), vocab_size=512)
    model = build_tiny(tok, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # large random weights: peaked distributions show any masking or position slip
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    prompts = [
        tok.encode(t, add_special_tokens=False)
        for t in ("alice", "bob was born in kelmora in 1950.", "the city of kelmora brontex was born")
    ]
    cpu_greedy = HFBackend(model, tok).generate(prompts, 12, temperature=0)
    gpu_model = model.to("cuda")
    be = HFBackend(gpu_model, tok)
    assert [o.ids for o in be.generate(prompts, 12, temperature=0)] == [o.ids for o in cpu_greedy]
    outs = be.generate(prompts, 16, temperature=0.9, top_p=0.95, generator=torch.Generator().manual_seed(0))
    for p, o in zip(prompts, outs):
        ref = sequence_logprobs(gpu_model, p, o.ids, temperature=0.9)
        assert (ref.cpu() - torch.tensor(o.logprobs)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_cuda_training_run_learns_logs_and_checkpoints(kit, tmp_path, precision):
    """``train(device="cuda")`` end to end: rollouts on the GPU model, updates that move it,
    finite logs, a checkpoint that loads. bf16 autocast re-scores the old log-probs (its forward
    differs from the float32 rollout's), so its first PPO ratio is 1 up to bf16 rounding."""
    from memkit.lab.runs import train
    from memkit.models import build_tiny, load_policy

    res = train(_loop_cfg(tmp_path / "r", 2, device="cuda", mixed_precision=precision), kit, progress=False)
    assert next(res.model.parameters()).device.type == "cuda"
    init = build_tiny(kit.tokenizer, seed=0).state_dict()
    moved = max(float((v.detach().cpu() - init[k]).abs().max()) for k, v in res.model.state_dict().items())
    assert moved > 1e-4
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r[m]) for r in rows for m in ("kl", "entropy", "vf_loss"))
    loaded = load_policy(str(res.path / "policy"))
    key = "model.embed_tokens.weight"
    assert torch.equal(
        loaded.model.state_dict()[key], res.model.state_dict()[key].detach().cpu().to(loaded.model.dtype)
    )


# ---- the real-model check: one device call (`issues` 54), numbers to $MEMKIT_GPU_REPORT ----------------
QWEN_SHAPES = ("qwen2.5-0.5b", "qwen2.5-7b")


def _qwen_shaped(name: str):
    """A random-init Qwen2 model with ``name``'s architecture (memkit.models.plan.PRESETS), built on the
    GPU in bf16 (nothing is downloaded: only a config travels)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from memkit.models.plan import resolve_arch

    a = resolve_arch(name)
    cfg = Qwen2Config(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        tie_word_embeddings=a.tied,
        max_position_embeddings=32768,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = Qwen2ForCausalLM(cfg)
        finally:
            torch.set_default_dtype(old)
    return model.eval(), a


def _long_trajectories(n: int, context: int, output: int, vocab: int):
    """``n`` one-call trajectories of ``context + output`` tokens, rewards spread in each group of 2."""
    from memkit.core.trajectory import Call, Trajectory

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(10, vocab, (context + output,), generator=g).tolist()
        call = Call(turn=0, role="act", context_ids=ids[:context], output_ids=ids[context:], logprobs=[-3.0] * output)
        out.append(
            Trajectory(task_id=f"t{i // 2}", method="mem1", calls=[call], group_index=i % 2, reward=float(i % 2))
        )
    return out


@pytest.mark.parametrize("name", QWEN_SHAPES)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_bf16_lora_grpo_step_on_a_qwen_shaped_model_against_the_plan(name, checkpointing):
    """A bf16 LoRA GRPO update (micro-batch 1 x 4,096 tokens, separate rows) on a random-init
    Qwen2.5-shaped model: the adapters move, ``torch.cuda.max_memory_allocated`` is within +-15% of
    ``memkit plan``'s training total, and the tokens/s are reported."""
    import os
    import time

    from accelerate import Accelerator

    from memkit.models import LoraSpec, apply_lora
    from memkit.models.plan import Setup, terms
    from memkit.rl.config import TrainConfig
    from memkit.rl.update import Learner

    gc.collect()  # a failed earlier case's frames can hold its model: measure above what is left
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model, arch = _qwen_shaped(name)
    model = apply_lora(model, LoraSpec(r=16, alpha=32))
    cfg = TrainConfig.from_flags(
        method="mem1",
        init="tiny",
        algo="grpo",
        packing="separate",
        lora=True,
        kl_coef=0.001,
        micro_batch_size=1,
        mini_batches=1,
        ppo_epochs=1,
        lr=1e-4,
        out_dir="",
        device="cuda",
        gradient_checkpointing=checkpointing,
        log_entropy=False,
    )
    learner = Learner(cfg, model, dw.Tok(), accelerator=Accelerator())
    trajs = _long_trajectories(4, 3584, 512, arch.vocab)
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters() if p.requires_grad}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    stats = learner.update(trajs)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base
    moved = sum(not torch.equal(before[n], p.detach()) for n, p in learner.policy.named_parameters() if p.requires_grad)
    del model, learner, before
    # the update runs the LM head on the 512 response tokens only (memkit.models.decoder_and_head)
    planned = terms(arch, Setup(dtype="bf16", lora=True, lora_r=16), 1, 4096, 0.0, checkpointing, head_tokens=512)[
        "total"
    ]
    row = {
        "model": name,
        "checkpointing": checkpointing,
        "peak_gb": peak / 2**30,
        "planned_gb": planned / 2**30,
        "ratio": peak / planned,
        "tokens_per_s": stats["tokens_processed"] / seconds,
        "seconds": seconds,
        "adapters_moved": moved,
        "left_before_gb": base / 2**30,
        "gpu": torch.cuda.get_device_name(),
    }
    print(json.dumps(row))
    if os.environ.get("MEMKIT_GPU_REPORT"):
        with open(os.environ["MEMKIT_GPU_REPORT"], "a") as f:
            f.write(json.dumps(row) + "\n")
    assert moved > 0 and math.isfinite(stats["pg_loss"])
    assert 0.85 <= row["ratio"] <= 1.15, row
