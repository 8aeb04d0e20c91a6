"""The KL reference of full fine-tuning (``RuntimeConfig.ref_dtype``): a frozen copy of the initial
policy in float32 or bfloat16 (``memkit.models.frozen_copy``). bfloat16 holds half the bytes and moves
the reference's log-probs only by rounding; its log-probs and the KL stay float32; on CPU the default
keeps the float32 copy, bit for bit. On a random-init tiny Llama."""

from __future__ import annotations

import dist_worker as dw
import pytest
import torch

from memkit.core.trajectory import TrainingUnit
from memkit.models import frozen_copy
from memkit.rl.engines import reference_dtype

#: |log pi_ref(bf16) - log pi_ref(fp32)| on the random-init tiny Llama's trained tokens: measured max
#: 1.3e-3, mean 4.8e-4 (every packing); a trained model's sharper logits round further
BF16_MAX_GAP, BF16_MEAN_GAP = 5e-3, 2e-3


def _refs(learner):
    """The reference log-probs ``[B, L]`` the update holds fixed, for every micro-batch of the batch."""
    trajs = dw.trajectories()
    units = [TrainingUnit.of(t) for t in trajs]
    rewards = torch.tensor([t.reward for t in trajs])
    exp = learner._experience(units, list(range(len(trajs))), rewards, [t.task_id for t in trajs], trajs)
    return exp.ref, exp.mask


def nbytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("packing", ["separate", "mem1_exact", "mem1_mask"])
def test_bf16_reference_is_half_the_bytes_and_close_in_logprob(packing):
    """``ref_dtype="bfloat16"``: half the parameter bytes of the float32 copy, float32 log-probs within
    ``BF16_MAX_GAP`` (max) / ``BF16_MEAN_GAP`` (mean) of the float32 reference's on the trained tokens;
    ``auto`` on CPU is the float32 copy, bit for bit."""
    runs = {d: dw.make_learner("grpo", packing=packing, ref_dtype=d) for d in ("auto", "float32", "bfloat16")}
    assert {d: next(r.ref.parameters()).dtype for d, r in runs.items()} == {
        "auto": torch.float32,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
    }
    assert 2 * nbytes(runs["bfloat16"].ref) == nbytes(runs["float32"].ref) == nbytes(runs["float32"].policy)
    (auto, m), (fp32, _), (bf16, _) = (_refs(runs[d]) for d in ("auto", "float32", "bfloat16"))
    assert torch.equal(auto, fp32)
    assert bf16.dtype == torch.float32  # the KL term (memkit.rl.losses.kl_penalty) is computed in float32
    gap = (bf16 - fp32).abs()[m.bool()]
    print(f"{packing}: bf16 reference log-prob gap max {float(gap.max()):.2e} mean {float(gap.mean()):.2e}")
    assert 0 < float(gap.max()) <= BF16_MAX_GAP and float(gap.mean()) <= BF16_MEAN_GAP


def test_reference_dtype_auto_is_bf16_on_a_gpu_and_the_policys_dtype_elsewhere():
    model = dw.tiny_llama()
    assert reference_dtype("auto", "cuda", model) == torch.bfloat16
    assert reference_dtype("auto", "cpu", model) == torch.float32
    assert reference_dtype("auto", "cpu", model.to(torch.bfloat16)) == torch.bfloat16
    assert reference_dtype("float32", "cuda", model) == torch.float32


def test_frozen_copy_casts_once_keeps_ties_and_shares_nothing():
    model = dw.tiny_llama()
    model.lm_head.weight = model.model.embed_tokens.weight  # a tied head (SmolLM2, Qwen2.5-0.5B)
    ref = frozen_copy(model, torch.bfloat16)
    assert ref.lm_head.weight is ref.model.embed_tokens.weight
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in ref.parameters())
    assert not ref.training and model.model.embed_tokens.weight.dtype == torch.float32
    ours = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in ours for p in ref.parameters())
    same = frozen_copy(model)
    assert all(
        torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(model.parameters(), same.parameters())
    )
