"""memkit.models.plan and ``memkit plan``: every memory term against real tensors on CPU.

Parameter counts equal ``sum(p.numel())`` of real models (tiny, random-init Qwen2 / Llama, SmolLM2);
weight, gradient and AdamW bytes equal the tensors after one step; the activation estimate is
compared with the bytes autograd saves for backward (unique storages, parameters excluded, peak of
the live ones through forward and backward, measured with ``saved_tensors_hooks``) within
``TOLERANCE``; the KV cache with the cache a forward returns. The CLI prints a table, ``--json`` a dict,
and bad input exits 2 with one line naming the fix.
"""

from __future__ import annotations

import json

import pytest
import torch

from memkit.cli import build_parser, main
from memkit.models import LORA_TARGETS, LoraSpec, apply_lora, load_policy
from memkit.models.plan import (
    PRESETS,
    Setup,
    activation_bytes,
    arch_from_config,
    gradient_bytes,
    kv_cache_bytes,
    max_micro_batch,
    optimizer_bytes,
    param_count,
    plan,
    terms,
    weight_bytes,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

#: measured / planned saved activations must lie in [1 - TOLERANCE, 1 + TOLERANCE]. The estimate
#: counts every tensor the decoder layers and the loss save (measured 0.99-1.003 on tiny, SmolLM2 and
#: Qwen2); what it leaves out is small (RoPE's cos / sin, token ids, layer 0's norm input under LoRA).
TOLERANCE = 0.10
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def saved_peak(model, ids) -> int:
    """Peak bytes of the tensors autograd holds for backward during ``model(ids, labels=ids)`` and its
    backward: unique storages, parameters excluded, a storage counted while any saved tensor uses it."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    live, now, peak = {}, [0], [0]

    class Held:  # what autograd keeps instead of the tensor; freed when autograd releases it
        def __init__(self, t):
            storage = t.untyped_storage()
            self.t, self.key, self.n = t, storage.data_ptr(), storage.nbytes()
            if self.key in params:
                self.key = None
                return
            live[self.key] = live.get(self.key, 0) + 1
            if live[self.key] == 1:
                now[0] += self.n
                peak[0] = max(peak[0], now[0])

        def __del__(self):
            if self.key is not None:
                live[self.key] -= 1
                if not live[self.key]:
                    del live[self.key]
                    now[0] -= self.n

    with torch.autograd.graph.saved_tensors_hooks(Held, lambda held: held.t):
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    assert not live, "saved tensors still held after backward"
    return peak[0]


def _random_model(kind: str, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[kind]
    cfg = config_cls(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=500,
        **kw,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return model_cls(cfg)


def _check_activations(model, setup, batch, seq, checkpointing, label):
    arch = arch_from_config((model.get_base_model() if setup.lora else model).config)
    model.train()
    if checkpointing:  # reentrant: its saved inputs and the recomputation pass through the hooks
        kwargs = {"use_reentrant": True}  # (transformers' default, non-reentrant, holds the same out of their sight)
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    ids = torch.randint(3, arch.vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    measured = saved_peak(model, ids)
    planned = activation_bytes(arch, setup, batch * seq, checkpointing, transient=False)
    ratio = measured / planned
    assert abs(ratio - 1) <= TOLERANCE, f"{label}: measured {measured} / planned {planned:.0f} = {ratio:.3f}"
    return ratio


# ---- parameter counts --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind,kw",
    [
        ("qwen2", {"tie_word_embeddings": False}),
        ("qwen2", {"tie_word_embeddings": True}),
        ("llama", {"attention_bias": True, "mlp_bias": True}),
    ],
)
def test_param_count_equals_random_models(kind, kw):
    model = _random_model(kind, **kw)
    assert param_count(arch_from_config(model.config)) == sum(p.numel() for p in model.parameters())


def test_param_count_equals_tiny():
    model = load_policy("tiny").model
    assert param_count(arch_from_config(model.config)) == sum(p.numel() for p in model.parameters())


def test_presets_match_published_sizes():
    """Qwen2.5 model cards: 0.49B, 3.09B, 7.61B, 14.7B parameters."""
    sizes = {name: round(param_count(arch) / 1e9, 2) for name, arch in PRESETS.items()}
    assert sizes == {"qwen2.5-0.5b": 0.49, "qwen2.5-3b": 3.09, "qwen2.5-7b": 7.62, "qwen2.5-14b": 14.77}


# ---- weights, gradients, AdamW state -------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,lora", [("fp32", None), ("fp32", "attention"), ("fp32", "all-linear"), ("bf16", None), ("bf16", "attention")]
)
def test_weight_gradient_optimizer_bytes_equal_tensors(dtype, lora):
    """fp32: all three exact. bf16: weights and gradients exact; the AdamW term assumes fp32 moments (+ fp32
    master weights in full FT), which torch.optim.AdamW keeps only for fp32 parameters: checked under LoRA
    (fp32 adapters), not for full bf16 FT."""
    model = load_policy("tiny", dtype=DTYPES[dtype]).model
    arch = arch_from_config(model.config)
    if lora:
        model = apply_lora(model, LoraSpec(target_modules=LORA_TARGETS[lora]))
    setup = Setup(dtype=dtype, lora=lora is not None, lora_targets=LORA_TARGETS[lora] if lora else None)
    assert sum(p.nbytes for p in model.parameters()) == weight_bytes(arch, setup)
    model.train()
    ids = torch.randint(3, arch.vocab, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == sum(p.requires_grad for p in model.parameters())
    assert sum(g.nbytes for g in grads) == gradient_bytes(arch, setup)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    opt.step()
    state = sum(v.nbytes for s in opt.state.values() for k, v in s.items() if k != "step")
    if dtype == "fp32" or lora:
        assert state == optimizer_bytes(arch, setup)


# ---- activations ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["full", "full+ckpt", "lora:attention", "lora:all-linear"])
def test_activations_tiny_match_saved_tensors(dtype, mode):
    model = load_policy("tiny", dtype=DTYPES[dtype]).model
    lora = mode.split(":")[1] if mode.startswith("lora") else None
    if lora:
        model = apply_lora(model, LoraSpec(target_modules=LORA_TARGETS[lora]))
    setup = Setup(dtype=dtype, lora=lora is not None, lora_targets=LORA_TARGETS[lora] if lora else None)
    _check_activations(model, setup, 2, 64, mode.endswith("ckpt"), f"tiny {dtype} {mode}")


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations_qwen2_gqa_match_saved_tensors(checkpointing):
    """Grouped-query attention (4 query heads, 2 key-value heads) and Qwen2's q/k/v biases."""
    _check_activations(_random_model("qwen2"), Setup(dtype="fp32"), 2, 32, checkpointing, "qwen2")


def test_kv_cache_equals_the_cache_a_forward_returns():
    model = _random_model("qwen2").eval()
    with torch.no_grad():
        out = model(input_ids=torch.randint(3, 500, (3, 20)), use_cache=True)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert measured == kv_cache_bytes(arch_from_config(model.config), Setup(dtype="fp32"), 3, 20)


@pytest.mark.slow
def test_smollm2_params_and_activations():
    """SmolLM2-135M (GQA 9 / 3 heads, 30 layers, 49k vocab), fp32, 1 x 32 tokens: ~20 s on a fresh cache."""
    model = load_policy("smollm2-135m").model
    assert param_count(arch_from_config(model.config)) == sum(p.numel() for p in model.parameters())
    _check_activations(model, Setup(dtype="fp32"), 1, 32, False, "smollm2 full")
    _check_activations(model, Setup(dtype="fp32"), 1, 32, True, "smollm2 full+ckpt")
    model = apply_lora(load_policy("smollm2-135m").model, LoraSpec())
    _check_activations(model, Setup(dtype="fp32", lora=True), 1, 32, False, "smollm2 lora")


# ---- the largest micro-batch -------------------------------------------------------------------------
@pytest.mark.parametrize("checkpointing", [False, True])
def test_max_micro_batch_is_the_largest_that_fits(checkpointing):
    arch, setup, budget, kv = PRESETS["qwen2.5-3b"], Setup(lora=True), 79 * 2**30, 2e9
    best = max_micro_batch(arch, setup, 4096, kv, checkpointing, budget)
    assert best >= 1
    assert terms(arch, setup, best, 4096, kv, checkpointing)["total"] <= budget
    assert terms(arch, setup, best + 1, 4096, kv, checkpointing)["total"] > budget


def test_full_7b_on_one_gpu_names_the_optimizer_and_fits_sharded():
    p = plan(PRESETS["qwen2.5-7b"], Setup())
    assert {m["max_micro_batch"] for m in p["modes"].values()} == {0}
    assert p["modes"]["checkpointing"]["dominant"] == "optimizer"
    sharded = plan(PRESETS["qwen2.5-7b"], Setup(gpus=8, zero=3))
    assert sharded["modes"]["checkpointing"]["max_micro_batch"] >= 1


def test_zero2_shards_gradients_and_adamw_but_not_weights_or_reference():
    """ZeRO-2 per GPU: weights and reference as DDP's, gradients and AdamW state / N; ZeRO-3 also the weights."""
    arch = PRESETS["qwen2.5-7b"]
    ddp, z2, z3 = (terms(arch, Setup(gpus=8, zero=z), 1, 4096, 0.0, True) for z in (0, 2, 3))
    assert z2["weights"] == ddp["weights"] and z2["reference"] == ddp["reference"]
    assert z2["gradients"] == ddp["gradients"] / 8 and z2["optimizer"] == ddp["optimizer"] / 8
    assert z3["gradients"] == z2["gradients"] and z3["weights"] < ddp["weights"] / 4


def test_the_grid_picks_the_first_engine_that_fits():
    """Every row's engine is the first of one process / DDP / ZeRO-2 / ZeRO-3 whose plan fits with
    checkpointing, and the ones before it do not: 7B full fine-tuning needs ZeRO-2 on 8 x 80 GB,
    14B needs ZeRO-3, which memkit train still refuses (the row says so)."""
    from memkit.models.plan_grid import ENGINES, fit_grid

    rows = fit_grid(gpus=(1, 8))
    assert len(rows) == 4 * 2 * 2
    for r in rows:
        tried = (0,) if r["gpus"] == 1 else (0, 2, 3)
        fits = [
            plan(PRESETS[r["model"]], Setup(lora=r["lora"], gpus=r["gpus"], zero=z))["modes"]["checkpointing"]["fits"]
            for z in tried
        ]
        first = next((z for z, ok in zip(tried, fits) if ok), None)
        assert r["zero"] == first, r
        assert r["engine"] == (ENGINES[(r["gpus"] > 1, first)] if first is not None else "does not fit")
    by = {(r["model"], r["lora"], r["gpus"]): r for r in rows}
    assert by["qwen2.5-7b", False, 8]["zero"] == 2 and by["qwen2.5-7b", False, 1]["zero"] is None
    assert by["qwen2.5-14b", False, 8]["zero"] == 3 and "fsdp2.yaml" in by["qwen2.5-14b", False, 8]["engine"]
    assert all(by[m, True, 1]["zero"] == 0 for m in PRESETS)  # LoRA: every size on one 80 GB GPU


# ---- the command ---------------------------------------------------------------------------------------
def test_cli_grid_prints_every_row(capsys):
    assert main(["plan", "--grid"]) == 0
    out = capsys.readouterr().out
    assert out.count("qwen2.5-") == 16 and "deepspeed_zero2.yaml" in out and "does not fit" in out, out


def test_cli_prints_a_table(capsys):
    assert main(["plan", "--model", "qwen2.5-7b", "--lora", "--micro-batch", "1", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    for label in (
        "weights",
        "gradients",
        "optimizer (AdamW)",
        "reference model",
        "activations (layers)",
        "logits",
        "KV cache",
        "total",
        "largest micro-batch",
    ):
        assert label in out, out
    assert "no ckpt" in out and "ckpt" in out and "LoRA r=16" in out


def test_cli_json_and_lever(capsys):
    assert main(["plan", "--model", "qwen2.5-7b", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["modes"]["no_checkpointing"]["max_micro_batch"] == 0 and p["params"] == param_count(PRESETS["qwen2.5-7b"])
    assert main(["plan", "--model", "qwen2.5-7b"]) == 0
    assert "dominates: try --lora" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--model", "qwen9-1t"], ["unknown model", "qwen2.5-7b"]),
        (["--model", "qwen2.5-7b", "--gpu-mem", "-5"], ["--gpu-mem", "> 0"]),
        (["--model", "qwen2.5-7b", "--zero", "3"], ["--gpus"]),
        (["--model", "qwen2.5-7b", "--zero", "2"], ["--gpus"]),
        ([], ["--model", "--grid"]),
        (["--model", "qwen2.5-7b", "--lora-r", "8"], ["add --lora"]),
    ],
)
def test_cli_bad_input_exits_2(capsys, argv, words):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memkit plan: error:") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


def test_help_names_every_preset():
    sub = build_parser(only="plan")._subparsers._group_actions[0].choices["plan"]
    assert all(name in sub.format_help() for name in PRESETS)


def test_cli_reads_a_local_config_dir(tmp_path, capsys):
    model = _random_model("qwen2")
    model.config.save_pretrained(tmp_path)  # config.json only: the planner reads nothing else
    assert main(["plan", "--model", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == sum(p.numel() for p in model.parameters())
