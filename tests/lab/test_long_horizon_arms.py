"""MemPO and MemAct where their mechanisms act (memkit.lab.long_horizon_arms): the equal-token arms, the rows
they are judged by, and both studies end to end at SMOKE size (real training runs of the tiny model)."""

from __future__ import annotations

import json

import pytest

from memkit.core.io import latest_checkpoint
from memkit.lab.long_horizon_arms import (
    MEMACT_LIMIT,
    RUN_KEYS,
    arm_rows,
    equal_token_arms,
    memact_study,
    memact_summary,
    mempo_study,
    mempo_summary,
    memt_study,
    memt_summary,
)
from memkit.metrics.efficiency import rollout_tokens
from tests.rl.test_trainer import _loop_cfg


def test_the_baseline_trains_until_it_has_the_paper_arms_tokens(kit, tmp_path):
    """The paper's arm trains its steps; the baseline (here: half the tasks per step, so half the tokens per
    step) trains until it has generated as many tokens, which takes it more steps, at most twice as many."""
    base = _loop_cfg(tmp_path, 2, eval_every=10_000, save_every=0, eval_at_start=False)
    runs = equal_token_arms(base, ("paper", {}), ("baseline", dict(tasks_per_step=1)), [0], kit)
    paper, baseline = runs["paper", 0].history, runs["baseline", 0].history
    budget = rollout_tokens(paper)
    assert len(paper) == 2 and 2 < len(baseline) <= 4
    assert rollout_tokens(baseline[:-1]) < budget and (rollout_tokens(baseline) >= budget or len(baseline) == 4)
    assert [e["step"] for e in runs["baseline", 0].eval_history] == [len(baseline)]  # one evaluation, at the stop


def test_arm_rows_average_over_seeds_and_keep_missing_values_missing():
    starts = {"start": {key: 1.0 for key in RUN_KEYS} | {"mem_p": None}}

    class Run:  # a TrainResult's two fields arm_rows reads
        def __init__(self, em, mem_p):
            self.history = [{"seconds": 60.0, "response_tokens": 10.0, "n_trajectories": 4}]
            self.eval_history = [{"k": 2, "em": em, "invalid_rate": 0.0, "tool_calls": 2.0, "memory_actions": 1.0,
                                  "context_tokens": 100.0, **({} if mem_p is None else {"mem_p": mem_p})}]  # fmt: skip

    rows = arm_rows(starts, {("a", 0): Run(0.2, None), ("a", 1): Run(0.4, None), ("b", 0): Run(0.5, 0.3)}, 2)
    by = {r["arm"]: r for r in rows}
    assert by["start"]["em_std"] == 0.0 and by["start"]["mem_p"] is None
    assert by["a"]["em"] == pytest.approx(0.3) and by["a"]["em_std"] == pytest.approx(0.1414, abs=1e-4)
    assert by["a"]["em_seeds"] == [0.2, 0.4] and by["a"]["mem_p"] is None and by["a"]["mem_p_std"] is None
    assert by["a"]["em_bridge"] is None  # no bridge question asked
    assert (by["b"]["mem_p"], by["b"]["rollout_tokens"], by["b"]["minutes"], by["b"]["seeds"]) == (0.3, 40.0, 1.0, 1)


def test_both_studies_run_end_to_end_at_smoke_size(kit, tmp_path):
    """SMOKE: 20-step clones, one RL step per arm; every arm and start is in the table and in the summary the
    results page judges, the baselines got the paper arms' tokens, and MemAct's evaluations ran under the limit."""
    mp = mempo_study(kit, [0], tmp_path / "mp", smoke=True, n_tasks=2)
    assert [r["arm"] for r in mp["rows"]] == ["SFT start", "MemPO", "GRPO"] and mp["k"] == 3
    s = mempo_summary(mp)
    assert s["rollout_tokens_grpo"] >= s["rollout_tokens_mempo"] > 0 or s["steps_grpo"] == 2
    ma = memact_study(kit, [0], tmp_path / "ma", smoke=True, n_tasks=2)
    assert [r["arm"] for r in ma["rows"]] == ["SFT start", "SFT start, window", "DCPO", "fixed interval",
                                              "sliding window"]  # fmt: skip
    s = memact_summary(ma)
    assert s["limit"] == MEMACT_LIMIT and s["rollout_tokens_fixed"] >= s["rollout_tokens_dcpo"] or s["steps_fixed"] == 2
    assert all(0.0 <= s[f"invalid_{a}"] <= 1.0 for a in ("start", "window_start", "dcpo", "fixed", "window"))
    for run in ("DCPO-s0", "fixed interval-s0", "sliding window-s0"):
        config = json.loads((latest_checkpoint(tmp_path / "ma" / run / "checkpoints") / "memkit.json").read_text())
        assert config["config"]["max_context_tokens"] == MEMACT_LIMIT


def test_the_memt_study_runs_end_to_end_at_smoke_size(kit):
    """SMOKE: the lab's small retrieval clone on small stores, one MoT-GRPO step and GRPO to its tokens; the start
    and both arms are scored on every held-out question and summarised for the results page."""
    st = memt_study(kit, [0], smoke=True)
    assert [r["arm"] for r in st["rows"]] == ["SFT start", "MoT-GRPO", "GRPO"] and st["questions"] > 0
    assert all(len(r["overall_seeds"]) == 1 == len(r["multi-hop_seeds"]) for r in st["rows"][1:])
    s = memt_summary(st)
    assert s["rollout_tokens_mot"] > 0 and s["rollout_tokens_grpo"] > 0 and s["rollout_tokens_start"] == 0
    # GRPO trains until it has MoT-GRPO's rollout tokens, at most twice MoT-GRPO's steps
    assert s["steps_mot"] == 1 and s["steps_grpo"] in (1, 2)
    assert s["rollout_tokens_grpo"] >= s["rollout_tokens_mot"] or s["steps_grpo"] == 2
    assert all(0.0 <= s[f"f1_{a}"] <= 1.0 for a in ("start", "mot", "grpo"))


def test_run_arm_stops_at_its_rollout_token_budget(kit):
    """``run_arm(max_rollout_tokens=B)`` stops after the step whose rollout tokens bring the run to B: with B = 1
    one step, with B = the first two steps' tokens two steps of the three allowed, without B all three."""
    from memkit.lab.memt.retrieval import MemTLab, built_stores, ensure_memt_clone, run_arm

    lab = MemTLab.smoke()
    start = ensure_memt_clone(kit, lab)
    _, train = built_stores(kit, 4, seed=20_000, size=lab.size)
    _, held = built_stores(kit, 1, seed=30_000, size=lab.size)
    free, _ = run_arm(kit, start, train, held, "GRPO", 3, seed=0, queries=2, chains=2)
    assert len(free) == 3
    one, _ = run_arm(kit, start, train, held, "GRPO", 3, seed=0, queries=2, chains=2, max_rollout_tokens=1)
    two, _ = run_arm(kit, start, train, held, "GRPO", 3, seed=0, queries=2, chains=2,
                     max_rollout_tokens=free[0]["rollout_tokens"] + free[1]["rollout_tokens"])  # fmt: skip
    assert len(one) == 1 and len(two) == 2
    assert [r["rollout_tokens"] for r in two] == [r["rollout_tokens"] for r in free[:2]]  # the same seeded steps
