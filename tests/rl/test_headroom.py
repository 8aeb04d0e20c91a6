"""Exploration headroom (memkit.rl.headroom): hand-counted slots, bad input, the oracle's zero."""

from __future__ import annotations

import math

import pytest

from memkit.core.trajectory import Trajectory
from memkit.lab.evaluation import measure_headroom
from memkit.rl.headroom import exploration_headroom, slot_em


def _t(task, answer, golds, valid=True):
    return Trajectory(task_id=task, method="mem1", answer=answer, golds=golds, valid=valid)


A, B = [["x"], ["y"]], [["p"], ["r"]]


def test_headroom_hand_counted():
    greedy = [_t("A", "x; z", A), _t("B", "p; r", B, valid=False)]  # A: slot 1 right; B: invalid
    samples = [
        _t("A", "x; y", A),
        _t("A", "q; z", A),  # A slot 1: 1/2, slot 2: 1/2
        _t("B", "p; r", B),
        _t("B", "p; q", B),
    ]  # B slot 1: 2/2, slot 2: 1/2
    h = exploration_headroom(greedy, samples)
    assert (h["slots"], h["greedy_wrong"], h["wrong_reachable"], h["n_samples"]) == (4, 3, 3, 2)
    assert h["greedy_em"] == pytest.approx(0.25)
    assert h["headroom"] == pytest.approx(0.75) and h["em_bound"] == pytest.approx(1.0)
    assert h["sample_em"] == pytest.approx((0.5 + 0.5 + 1.0 + 0.5) / 4)
    assert h["sample_em_greedy_right"] == pytest.approx(0.5)
    assert h["sample_em_greedy_wrong"] == pytest.approx(2.0 / 3)
    # the samples are matched to their task by id, not by position (engines group or interleave)
    assert exploration_headroom(greedy, samples[::2] + samples[1::2]) == h


def test_unreachable_slot_and_miscount():
    greedy = [_t("A", "x; z", A)]
    samples = [_t("A", "x", A), _t("A", "x; q", A)]  # one answer for two questions scores 0 everywhere
    h = exploration_headroom(greedy, samples)
    assert h["wrong_reachable"] == 0 and h["headroom"] == 0.0 and h["em_bound"] == pytest.approx(0.5)
    assert slot_em(samples[0]) == [0.0, 0.0]


def test_headroom_bad_input():
    with pytest.raises(ValueError, match="no greedy"):
        exploration_headroom([], [])
    with pytest.raises(ValueError, match="same number"):
        exploration_headroom([_t("A", "x; y", A), _t("B", "p; r", B)], [_t("A", "x; y", A)])
    with pytest.raises(ValueError, match="several trajectories"):
        exploration_headroom([_t("A", "x; y", A), _t("A", "x; z", A)], [_t("A", "x; y", A)])
    with pytest.raises(ValueError, match="without a greedy"):
        exploration_headroom([_t("A", "x; y", A)], [_t("A", "x; y", A), _t("B", "p; r", B)])
    with pytest.raises(ValueError, match="no golds"):
        slot_em(Trajectory(task_id="C", method="mem1", answer="x"))


def test_oracle_has_no_headroom():
    from memkit.lab.kit import load_kit

    h = measure_headroom("mem1", load_kit(0), "oracle", k=2, n_tasks=3, n_samples=2)
    assert h["slots"] == 6 and h["greedy_em"] == 1.0 and h["headroom"] == 0.0 and h["em_bound"] == 1.0
    assert math.isnan(h["sample_em_greedy_wrong"])  # no greedy-wrong slot: undefined, not 0
    with pytest.raises(ValueError, match="temperature"):
        measure_headroom("mem1", load_kit(0), "oracle", temperature=0.0)


def test_policy_spec_is_loaded_once(monkeypatch):
    """Greedy and samples must score one model: "tiny" builds a random model per call."""
    import memkit.lab.policies as policies
    from memkit.lab.kit import load_kit

    built = []
    real = policies.fresh_tiny
    monkeypatch.setattr(policies, "fresh_tiny", lambda kit, seed=0: built.append(seed) or real(kit, seed))
    h = measure_headroom("mem1", load_kit(0), "tiny", k=1, n_tasks=2, n_samples=1, max_turns=1)
    assert h["slots"] == 2 and len(built) == 1
