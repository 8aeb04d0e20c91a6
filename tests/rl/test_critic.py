"""PPO's critic on a LoRA policy (memkit.rl.critic.ValueModel): a second adapter on the policy's own
peft model instead of a copied backbone. It starts as the copied-backbone critic, leaves the policy's
forward, checkpoints, rollout weights and exports alone, and a PPO update moves each parameter only
through its own loss; on a random-init tiny Llama with real peft LoRA adapters."""

from __future__ import annotations

import json

import dist_worker as dw
import pytest
import torch

from memkit.core.trajectory import TrainingUnit
from memkit.models import LoadedModel, LoraSpec, apply_lora, export_merged, identity_wrap
from memkit.models.adapters import CRITIC_ADAPTER, save_policy
from memkit.models.vllm_backend import merged_state_dict
from memkit.rl import update as update_module
from memkit.rl.critic import ValueModel
from memkit.rl.losses import token_logprobs
from memkit.rl.packing import pack

LORA = LoraSpec(r=4, alpha=8)


def lora_policy(seed: int = 0):
    """The tiny Llama with LoRA adapters whose B is non-zero (a trained adapter: it changes the forward)."""
    model = apply_lora(dw.tiny_llama(seed), LORA)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def packed(mode: str = "separate"):
    batch = pack([TrainingUnit.of(t) for t in dw.trajectories()], mode, 0)
    return batch.input_ids, batch.attention_mask, batch.position_ids, batch


def nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def copied_critic(model, share):
    """The critic a multi-process Learner builds (``share=False``: a copied backbone), whatever it is told."""
    return ValueModel(model, share=False)


def test_shared_critic_starts_as_the_copied_backbone_critic():
    """Same head on both: V of the shared critic (adapter ``critic`` = a copy of the policy adapter)
    equals V of the deep-copied backbone (which carries the policy adapter) to 1e-6 in fp32."""
    model = lora_policy()
    copied, shared = ValueModel(model, share=False), ValueModel(model)
    assert shared.shares_backbone and not copied.shares_backbone
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(1, 32, generator=g), torch.randn(1, generator=g)
    with torch.no_grad():
        for v in (copied, shared):
            v.head.weight.copy_(w)
            v.head.bias.copy_(b)
        ids, mask, pos, _ = packed()
        a, c = shared(ids, mask, pos), copied(ids, mask, pos)
    assert a.dtype == torch.float32 and a.abs().max() > 0.1  # a head that reads h: the test compares h
    assert float((a - c).abs().max()) <= 1e-6
    with torch.no_grad():
        assert float(ValueModel(model)(ids, mask, pos).abs().max()) == 0.0  # a fresh head: V = 0, as before


def test_policy_forward_rollout_weights_and_reference_ignore_the_critic_adapter():
    """Log-probs of the policy and of the reference (adapters disabled), and the merged weights vLLM
    loads, are bit-identical with and without the critic adapter, however far it has trained."""
    model = lora_policy()
    ids, mask, pos, _ = packed()

    def observe():
        with torch.no_grad():
            policy = token_logprobs(model, ids, mask, pos)
            with model.disable_adapter():
                ref = token_logprobs(model, ids, mask, pos)
        return policy, ref, merged_state_dict(model)

    before = observe()
    critic = ValueModel(model)
    with torch.no_grad():
        for p in critic.adapter.values():  # a critic that has moved away from the policy
            p.add_(0.5)
    after = observe()
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    assert before[2].keys() == after[2].keys() and all(torch.equal(before[2][k], after[2][k]) for k in before[2])
    assert not torch.equal(before[0], before[1])  # the policy adapter does change the forward
    assert model.active_adapters == ["default"]


def test_the_critic_adapter_is_active_only_inside_its_forward_even_on_an_error():
    model = lora_policy()
    critic = ValueModel(model)
    with pytest.raises(IndexError):
        critic(torch.tensor([[10_000]]))  # past the vocabulary: the embedding fails mid-forward
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "_active_adapter")]
    assert layers and all(m.active_adapters == ["default"] for m in layers)
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    assert all(grads[n] == ("lora_" in n) for n in grads)  # both adapters trainable, the base frozen


def _ppo_learner(share: bool, monkeypatch, **over):
    if not share:  # the copied backbone, as a multi-process run builds it
        monkeypatch.setattr(update_module, "ValueModel", copied_critic)
    learner = dw.make_learner("ppo", model=lora_policy(), sort_micro_batches=False, **over)
    monkeypatch.undo()
    return learner


def _critic_weights(learner) -> dict:
    """The critic's LoRA weights by the policy adapter's parameter name, and its head."""
    critic = learner.acc.unwrap_model(learner.critic)
    if critic.shares_backbone:
        named = {k.replace("__", "."): p for k, p in critic.adapter.items()}
        out = {
            k.replace(f".{CRITIC_ADAPTER}.", ".default.").removeprefix("base_model.model."): p for k, p in named.items()
        }
    else:
        out = {f"model.{k}": p for k, p in critic.backbone.named_parameters() if "lora_" in k}
    return {**{k: p.detach().clone() for k, p in out.items()}, "head": critic.head.weight.detach().clone()}


def test_ppo_update_moves_each_parameter_through_its_own_loss(monkeypatch):
    """One PPO update (2 epochs, LoRA): the policy optimizer holds the policy adapter alone, the critic's
    its adapter and head; the base never moves; and the update is the copied-backbone critic's: the same
    policy adapter (so no value-loss gradient reached it, nor the actor's clip norm) and the same
    critic adapter + head (so the value loss reached them, and no policy-loss gradient did)."""
    shared = _ppo_learner(True, monkeypatch)
    model = shared.policy
    base0 = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    adapter0 = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    critic = shared.acc.unwrap_model(shared.critic)
    opt_ids = {id(p) for g in shared.opt.param_groups for p in g["params"]}
    copt_ids = {id(p) for g in shared.copt.param_groups for p in g["params"]}
    assert opt_ids == {id(p) for n, p in model.named_parameters() if ".lora_" in n and ".default." in n}
    assert copt_ids == {id(p) for p in critic.adapter.values()} | {id(critic.head.weight), id(critic.head.bias)}
    shared.update(dw.trajectories())
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], p) for n, p in base0.items())  # frozen base weights
    for who in (".default.", f".{CRITIC_ADAPTER}."):  # both adapters trained, by their own optimizer
        assert any(not torch.equal(now[n], p) for n, p in adapter0.items() if who in n), who
    assert float(critic.head.weight.detach().abs().max()) > 0

    copied = _ppo_learner(False, monkeypatch)
    copied.update(dw.trajectories())
    pol = lambda lr: {n: p for n, p in lr.policy.named_parameters() if CRITIC_ADAPTER not in n}  # noqa: E731
    a, b = pol(shared), pol(copied)
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    a, b = _critic_weights(shared), _critic_weights(copied)
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6


def test_shared_critic_update_is_the_same_under_gradient_checkpointing(monkeypatch):
    """Checkpointing recomputes each layer's forward in the backward: the value loss's backward runs
    with the critic adapter active (``ValueModel.scope``), so the recomputed activations are the critic's."""
    runs = []
    for ckpt in (False, True):
        learner = _ppo_learner(True, monkeypatch, gradient_checkpointing=ckpt)
        learner.update(dw.trajectories())
        runs.append({**dict(learner.policy.named_parameters()), "head": learner.critic.head.weight})
    assert max(float((runs[0][k] - runs[1][k]).abs().max()) for k in runs[0]) <= 1e-6


class _Tok:
    pad_token_id = 0

    def save_pretrained(self, directory):
        (directory / "tokenizer_config.json").write_text("{}")


def test_policy_checkpoint_resume_and_export_leave_the_critic_adapter_out(monkeypatch, tmp_path):
    """A PPO run's saved policy is the policy adapter alone (no ``critic/`` adapter, no critic key);
    accelerate's state (what ``--resume`` loads) brings the critic adapter back; ``export_merged`` merges
    the policy adapter alone."""
    learner = _ppo_learner(True, monkeypatch)
    learner.update(dw.trajectories())
    model = learner.policy
    save_policy(model, _Tok(), tmp_path / "policy")
    from safetensors.torch import load_file

    keys = load_file(tmp_path / "policy" / "adapter_model.safetensors").keys()
    assert keys and not any(CRITIC_ADAPTER in k for k in keys)
    assert not (tmp_path / "policy" / CRITIC_ADAPTER).exists()
    assert json.loads((tmp_path / "policy" / "adapter_config.json").read_text())["r"] == LORA.r

    learner.acc.save_state(str(tmp_path / "state"), safe_serialization=False)
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    head = learner.critic.head.weight.detach().clone()
    with torch.no_grad():
        for p in [*model.parameters(), *learner.critic.parameters()]:
            p.add_(1.0)
    learner.acc.load_state(str(tmp_path / "state"))
    assert all(torch.equal(p, trained[n]) for n, p in model.named_parameters())
    assert torch.equal(learner.critic.head.weight, head)

    merged = merged_state_dict(model)  # what vLLM loads: the policy adapter merged
    export_merged(LoadedModel(model, _Tok(), "tiny", identity_wrap), tmp_path / "export")
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert all(torch.equal(exported[k], merged[k]) for k in exported)


def test_shared_critic_holds_a_fraction_of_the_copied_critics_parameter_bytes():
    """Parameter bytes the critic adds to the policy's: its adapter + head when shared, the whole
    backbone + head when copied (tiny Llama, r = 4 on q/k/v/o: 1,825 vs 23,617 parameters)."""
    model = lora_policy()
    policy_bytes = nbytes(model.parameters())
    copied = nbytes(ValueModel(model, share=False).parameters())
    shared = ValueModel(model)
    added = nbytes(model.parameters()) + nbytes([shared.head.weight, shared.head.bias]) - policy_bytes
    assert added == nbytes(shared.parameters())  # its adapter sits in the policy's model: counted once
    print(f"critic parameter bytes: shared {added:,} vs copied {copied:,} ({copied / added:.1f}x)")
    assert copied > 10 * added
    backbone = nbytes(p for n, p in model.named_parameters() if "lora_" not in n and "lm_head" not in n)
    assert copied >= backbone  # the copy holds every base weight of the backbone again


@pytest.mark.parametrize("mode", ["mem1_exact"])
def test_shared_critic_reads_packed_rows_as_the_copied_one(mode):
    """The 2D-masked rows of an exact packing (``blocks`` attention): the same values either way."""
    from memkit.rl.packed_forward import packed_attention

    model = lora_policy()
    critics = [ValueModel(model, share=False), ValueModel(model)]
    for c in critics:
        torch.nn.init.normal_(c.head.weight, generator=torch.Generator().manual_seed(5))
    ids, mask, pos, batch = packed(mode)
    out = []
    with torch.no_grad():
        for c in critics:
            with packed_attention(c, mask, "blocks") as m:
                out.append(batch.at_pred(c(ids, m, pos)))
    assert float((out[0] - out[1]).abs().max()) <= 1e-6
