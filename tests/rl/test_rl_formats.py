"""RL on real rollouts of every format: recorded log-probs, credit, every packing, one real update.

Other update tests use synthetic MEM1-shaped calls or the teacher's zero log-probs. Here each
format's trajectories come from the rollout engine (a noisy scripted teacher; Mem-T: operation
trees from ``tests/rl/test_mot.py``) and every call records the log-probs of the tiny Llama that
"sampled" it (one forward per call, as notebook 02 scores the teacher). For every format x packing
the packed forward must give back the recorded log-probs, and one ``Learner.update`` with the
format's credit rule must raise the advantage-weighted log-prob: no-op or mis-aligned updates fail.
"""

from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch

from memkit.agents import ALL_METHODS, get_method
from memkit.agents.base import OracleConfig
from memkit.core.trajectory import TrainingUnit, Trajectory
from memkit.rl.credit import CREDIT_RULES, get_credit
from memkit.rl.packed_forward import packed_token_logprobs
from memkit.rl.packing import MODES, pack
from memkit.rl.rules import DCPOConfig
from tests.fixtures.traces import kit, oracle_tasks

#: format -> (method, credit rule): every method with its own rule, and MEM1's PPO (gae, §3.2)
FORMATS = {
    "react-grpo": ("react", "grpo"),
    "mem1-grpo": ("mem1", "grpo"),
    "mem1-gae": ("mem1", "gae"),
    "memsearcher-multi_context": ("memsearcher", "multi_context"),
    "mempo-mempo": ("mempo", "mempo"),
    "memact-dcpo": ("memact", "dcpo"),
    "memt-mot": ("memt", "mot"),
    "amem-grpo": ("amem", "grpo"),  # the A-MEM baseline
}
CASES = [(f, p) for f in FORMATS for p in MODES]
#: a teacher that wastes searches, answers wrongly and forgets: a task's two samples differ
NOISY = OracleConfig(p_wasted_search=0.5, p_wrong_answer=0.3, flaw="stop_early", flaw_rate=0.5, p_drop_fact=0.2)
MODEL_SEED = 1


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@lru_cache(maxsize=None)
def _policy():
    from memkit.models import build_tiny

    return build_tiny(kit().tokenizer, seed=MODEL_SEED).eval()


@lru_cache(maxsize=None)
def _recorded(method: str) -> tuple:
    """Real trajectories of ``method``, each call's log-probs recorded under :func:`_policy`.

    Wiki formats: one 2-question task, 2 samples of the noisy teacher through the rollout engine,
    rewarded as notebook 02's one-step probe does (R = 1 for the first sample, 0 for the other) so
    the group has spread whatever the teacher's answers scored. Mem-T: the first question's three
    operation trees, scored by MoT's node rewards (``score_query``, eq. 10)."""
    from memkit.lab.evaluation import rollout
    from memkit.models import sequence_logprobs

    if method == "memt":
        from tests.rl.test_mot import _scored_forest

        _, _, _, grown, _, _ = _scored_forest()
        trajs = copy.deepcopy(grown[0][1].trees)
    else:
        trajs = rollout(method, list(oracle_tasks(2, 1, 11)), kit(), policy="oracle", n=2, oracle_cfg=NOISY, seed=5)
        for t in trajs:
            t.reward = float(t.group_index == 0)
    for t in trajs:
        for c in t.calls:  # a tree also holds the conversation's construction calls; MoT trains its nodes
            if c.output_ids and (method != "memt" or c.role == "act"):
                c.logprobs = sequence_logprobs(_policy(), c.context_ids, c.output_ids).tolist()
    return tuple(trajs)


def _trajs(method: str) -> list[Trajectory]:
    """A fresh copy of :func:`_recorded` (updates write rewards and advantages into calls)."""
    return copy.deepcopy(list(_recorded(method)))


def _cfg(fmt: str, packing: str):
    from memkit.rl.config import TrainConfig

    method, credit = FORMATS[fmt]
    return TrainConfig.from_flags(
        method=method,
        credit=credit,
        packing=packing,
        algo="ppo" if get_credit(credit).needs_values else "grpo",
        init="tiny",
        lr=1e-4,
        kl_coef=0.0,
        micro_batch_size=64,
        dcpo=DCPOConfig(segments=4),
        out_dir="",
        seed=0,
    ).validate()


def _units(cfg, trajs) -> list[TrainingUnit]:
    """What the update trains: the rule's units (DCPO's segments, MoT's trees) or whole trajectories."""
    from memkit.rl.update import _units_seed

    rule = get_credit(cfg.resolved_credit())
    return rule.units(trajs, cfg, _units_seed(cfg.seed, trajs)) if rule.units else [TrainingUnit.of(t) for t in trajs]


def _first_calls(batch, n: int) -> torch.Tensor:
    """``[B, L]`` bool: trained tokens of the first ``n`` trained calls of each row."""
    keep = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    for b in range(batch.input_ids.shape[0]):
        calls = sorted(set(batch.call_ids[b][batch.loss_mask[b] > 0].tolist()))[:n]
        keep[b] = torch.isin(batch.call_ids[b], torch.tensor(calls, dtype=torch.long)) & (batch.loss_mask[b] > 0)
    return keep


# ============================================================================ coverage
def test_every_format_and_credit_rule_is_covered():
    """A new memory format or credit rule must join FORMATS (and so every test below)."""
    assert {m for m, _ in FORMATS.values()} == set(ALL_METHODS)
    assert {r for _, r in FORMATS.values()} == set(CREDIT_RULES)
    for name in ALL_METHODS:
        assert (name, get_method(name).default_credit) in FORMATS.values()


# ============================================================================ packed log-probs
@pytest.mark.parametrize("fmt,packing", CASES)
def test_packed_logprobs_equal_the_recorded_ones(fmt, packing):
    """The packed forward of the update's units gives back each token's recorded log-prob, at the
    token's own place (``old_logprobs`` is token aligned). ``mem1_mask`` is App. B.7's approximation:
    exact on each row's first call (MEM1: first two), off by > 1e-4 somewhere later."""
    method, _ = FORMATS[fmt]
    trajs = _trajs(method)
    cfg = _cfg(fmt, packing)
    batch = pack(_units(cfg, trajs), packing)
    m = batch.loss_mask > 0
    assert int(m.sum()) > 100
    with torch.no_grad():
        got = packed_token_logprobs(_policy(), batch)
    gap = (got - batch.old_logprobs).abs() * m
    assert float(batch.old_logprobs[m].max()) < 0  # real log-probs, not the teacher's zeros
    if packing != "mem1_mask" or method == "react":  # ReAct's contexts extend: its masked row is exact too
        assert float(gap.max()) < 1e-4, float(gap.max())
        return
    exact = _first_calls(batch, 2 if method == "mem1" else 1)
    assert float(gap[exact].max()) < 1e-4
    assert float(gap.max()) > 1e-4


# ============================================================================ one update
def _trained_calls(units, exp):
    """``(trajectory, call, advantages of its output tokens)`` for every call a micro-batch trained,
    read from the packed advantages by ``call_ids`` (a call's trained tokens sit in output order)."""
    b = exp.batch
    out = []
    for row in range(b.input_ids.shape[0]):
        unit = units[int(b.unit_index[row])]
        calls = [int(b.call_index[row])] if b.mode == "separate" else list(unit.calls)
        for c in calls:
            sel = (b.call_ids[row] == c) & (exp.mask[row] > 0)
            assert int(sel.sum()) == unit.traj.calls[c].n_output
            out.append((unit.traj, c, exp.adv[row][sel]))
    return out


@pytest.mark.parametrize("fmt,packing", CASES)
def test_one_update_raises_the_advantage_weighted_logprob(fmt, packing, monkeypatch):
    """One ``Learner.update`` with the format's credit rule and this packing (old log-probs as the
    library defaults: the recorded ones for exact packings, recomputed for ``mem1_mask``):

    - the first PPO ratio is 1 (the recorded log-probs sit where the packed forward scores them),
      and ``mem1_mask``'s recomputation reports a small gap to the recorded ones;
    - credit follows the reward: the rewarded sample's tokens get the larger mean advantage;
    - the weights move, and sum_t A_t (log pi_new - log pi_old)(x_t) over the trained tokens, with
      log pi_new from one plain forward per call (no packing), is > 0: the first-order effect of
      one step along the policy gradient, whatever each token's drift. A no-op update, or one
      that trained misplaced tokens or advantages, fails it.
    """
    from accelerate import Accelerator

    from memkit.models import sequence_logprobs
    from memkit.rl.update import Learner

    method, credit = FORMATS[fmt]
    trajs = _trajs(method)
    cfg = _cfg(fmt, packing)
    learner = Learner(cfg, copy.deepcopy(_policy()), kit().tokenizer, accelerator=Accelerator(cpu=True))
    assert learner.recompute == (packing == "mem1_mask")
    before = [p.detach().clone() for p in learner.policy.parameters()]
    seen = []  # what the update trained on: each micro-batch's units and experience (batch, mask, old, adv)
    experience = learner._experience
    monkeypatch.setattr(
        learner, "_experience", lambda units, *a, **k: seen.append((units, experience(units, *a, **k))) or seen[-1][1]
    )
    stats = learner.update(trajs)

    assert stats["trained_tokens"] > 100
    # exact packings train against the recorded log-probs: ratio 1 = they sit where the forward scores them
    assert abs(stats["ratio"] - 1) < 1e-5 and stats["clip_frac"] == 0, stats
    if learner.recompute:  # mem1_mask recomputes them and reports the gap (App. B.7; exact for ReAct)
        lo, hi = (0.0, 1e-5) if method == "react" else (1e-4, 0.02)  # 1e-3..3e-3 here; mis-aligned: ~0.1+
        assert lo <= stats["old_logprob_gap"] < hi, stats["old_logprob_gap"]
    moved = max(float((p.detach() - q).abs().max()) for p, q in zip(learner.policy.parameters(), before))
    assert moved > 0
    trained = [x for units, e in seen if e is not None for x in _trained_calls(units, e)]
    assert sum(len(a) for _, _, a in trained) == stats["trained_tokens"]
    if method != "memt":  # wiki formats: R = 1 for sample 0, 0 for sample 1
        mean_adv = {r: torch.cat([a for t, _, a in trained if t.reward == r]).mean() for r in (0.0, 1.0)}
        assert mean_adv[1.0] > mean_adv[0.0] + 0.1, mean_adv
    gain = 0.0
    with torch.no_grad():
        for t, c, a in trained:
            call = t.calls[c]
            new = sequence_logprobs(learner.policy, call.context_ids, call.output_ids)
            gain += float((a.cpu() * (new - torch.tensor(call.logprobs))).sum())
    assert gain > 0, gain
