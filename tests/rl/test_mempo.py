"""MemPO's memory reward and credit (eq. 4-9) on real rollouts.

Trajectories are the scripted oracle's through the rollout engine (``tests/fixtures/traces.py``),
so the ``<mem>`` spans, contexts and golds are what a training run holds; the model scoring them is
the tiny Llama on the kit's tokenizer. Batched P equals one forward per probe; the credit rule
equals its loop reference; pooling and the bias term are checked on hand-computed numbers.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from memkit.core.trajectory import TrainingUnit, Trajectory
from memkit.rl.config import TrainConfig
from memkit.rl.credit import CreditBatch, get_credit
from memkit.rl.memory_reward import (
    BIASES,
    CONTEXTS,
    answer_probability,
    answer_probability_loop,
    memory_probes,
    memory_span,
    previous_memory,
    score_memories,
)
from memkit.rl.packing import MODES, pack
from memkit.rl.rules import MemPOConfig
from tests.fixtures.traces import kit, oracle_traces

#: a real trainer config (the rules read its fields; no stand-in with defaults of its own)
KNOBS = TrainConfig(credit="mempo", mem_reward=MemPOConfig(norm="pooled"))


@pytest.fixture(scope="module")
def model():
    from memkit.lab.policies import fresh_tiny

    return fresh_tiny(kit(), seed=3).model.eval()


def _copies(n_copies: int = 2, seed: int = 0) -> list[Trajectory]:
    """Real MemPO trajectories, 3 tasks x ``n_copies`` (a group per task), seeded rewards and R_M."""
    rng = random.Random(seed)
    out = []
    for copy_ in range(n_copies):
        for t in oracle_traces("mempo", 2, 3, 11):
            t = Trajectory.from_dict(t.to_dict())
            t.reward, t.group_index = rng.choice([0.0, 1.0]), copy_
            for c in t.calls:
                c.reward = rng.uniform(-0.5, 0.5) if memory_span(c) else None
            out.append(t)
    return out


def _cb(trajs, mode="separate") -> CreditBatch:
    units = [TrainingUnit.of(t) for t in trajs]
    return CreditBatch(
        batch=pack(units, mode),
        units=units,
        unit_traj=torch.arange(len(trajs)),
        rewards=torch.tensor([t.reward for t in trajs]),
        group_ids=[t.task_id for t in trajs],
        trajectories=trajs,
    )


# ------------------------------------------------------------------------------ P[ans | .] (eq. 5)
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("bias", BIASES)
@pytest.mark.parametrize("packing", ["separate", "mem1_exact"])
def test_batched_answer_probability_equals_one_forward_per_probe(model, context, bias, packing):
    trajs = list(oracle_traces("mempo", 2, 3, 11))
    opener = "think" if packing == "separate" else "answer"
    probes = memory_probes(trajs, kit().tokenizer, context, bias, answer_tags=packing == "separate", opener=opener)
    n_mem = sum(memory_span(c) is not None for t in trajs for c in t.calls)
    n_bias = {"call": n_mem, "previous": len(trajs), "none": 0}[bias]  # previous: one empty-memory probe per chain
    assert len(probes) == n_mem + n_bias
    score = "per_slot" if context == "call" else "joint"
    got = answer_probability(model, probes, packing, rows_per_forward=5, score=score)
    ref = torch.tensor(answer_probability_loop(model, probes, score))
    assert float((got - ref).abs().max()) <= 1e-5
    assert float((got.log() - ref.log()).abs().max()) <= 1e-4  # P is ~1e-4 for a random model: compare logs too
    assert len(set(got.tolist())) > 1  # the probes differ


def test_probe_contexts_are_the_policys_own_tokens():
    tok = kit().tokenizer
    traj = oracle_traces("mempo", 2, 3, 11)[0]
    gold = "; ".join(g[0] for g in traj.golds)
    opener = "\n<think>\nAll questions are answered.\n</think>\n<answer>\n"  # the teacher's answering step
    for bias in ("previous", "call"):
        for p in memory_probes([traj], tok, "question", bias):
            call = traj.calls[p.call]
            assert tok.decode(p.answer_ids) == gold
            for q, g in enumerate(traj.golds):  # each question's tokens decode to its gold
                assert tok.decode([a for a, s in zip(p.answer_ids, p.answer_slots) if s == q]).replace(" ", "") == g[
                    0
                ].replace(" ", "")
            if p.kind == "mem":  # the question context, then exactly the <mem> tokens the call wrote
                s, e = memory_span(call)
                n = traj.calls[0].n_context
                assert p.context_ids[:n] == traj.calls[0].context_ids
                assert p.context_ids[n : n + e - s] == call.output_ids[s:e]
                assert tok.decode(p.context_ids[n : n + e - s]).startswith("<mem>")
                assert tok.decode(p.context_ids[n + e - s :]) == opener
            else:  # the bias: an empty memory after the call's context (call) or the question (previous)
                head = call if bias == "call" else traj.calls[0]
                assert bias == "call" or p.call == 0
                assert p.context_ids[: head.n_context] == head.context_ids
                assert tok.decode(p.context_ids[head.n_context :]) == "<mem>\n</mem>" + opener
    literal = memory_probes([traj], tok, opener="answer", answer_tags=True)[0]
    assert tok.decode(literal.context_ids).endswith("</mem>\n<answer>\n")
    assert tok.decode(literal.answer_ids) == gold + "\n</answer>"
    unlabelled = Trajectory.from_dict({**traj.to_dict(), "golds": []})
    assert memory_probes([unlabelled], tok) == []
    with pytest.raises(ValueError, match="bias one of"):
        memory_probes([traj], tok, bias="history")


def test_per_slot_score_is_the_mean_of_each_questions_geometric_mean(model):
    """A hand check of ``score='per_slot'``: token log-probs of one probe, grouped by question."""
    probe = memory_probes(list(oracle_traces("mempo", 2, 3, 11)), kit().tokenizer, answer_tags=True)[-1]
    ids = torch.tensor([probe.context_ids + probe.answer_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(probe.context_ids) - 1 : -1], -1)
    lp = logp[torch.arange(len(probe.answer_ids)), torch.tensor(probe.answer_ids)]
    slots = torch.tensor(probe.answer_slots)
    by_hand = (lp[slots == 0].mean().exp() + lp[slots == 1].mean().exp()) / 2
    assert (slots == -1).sum() >= 2  # the "; " and the closing tag count for no question
    assert float(answer_probability(model, [probe], score="per_slot")[0]) == pytest.approx(float(by_hand), rel=1e-4)
    assert float(answer_probability(model, [probe])[0]) == pytest.approx(float(lp.mean().exp()), rel=1e-4)


@pytest.mark.parametrize("bias", BIASES)
def test_score_memories_sets_r_m_as_the_bias_corrected_probability(model, bias):
    trajs = [Trajectory.from_dict(t.to_dict()) for t in oracle_traces("mempo", 2, 3, 11)]
    rows = score_memories(model, kit().tokenizer, trajs, bias=bias)
    probes = memory_probes(trajs, kit().tokenizer, bias=bias)
    ref = {(p.traj, p.call, p.kind): v for p, v in zip(probes, answer_probability_loop(model, probes))}
    assert len(rows) == sum(memory_span(c) is not None for t in trajs for c in t.calls)
    for r in rows:
        i, t = r["traj"], r["call"]
        assert r["p_mem"] == pytest.approx(ref[i, t, "mem"], abs=1e-6)
        prev = previous_memory(trajs[i], t)
        bias_ref = {
            "none": 0.0,
            "call": ref.get((i, t, "bias")),
            "previous": ref[i, prev, "mem"] if prev is not None else ref.get((i, t, "bias")),
        }[bias]
        assert r["p_bias"] == pytest.approx(bias_ref, abs=1e-6)
        assert trajs[i].calls[t].reward == pytest.approx(r["p_mem"] - r["p_bias"])
    if bias == "previous":  # R_M telescopes: the memories of a chain add up to P[last] - P[empty memory]
        for i, traj in enumerate(trajs):
            mine = [r for r in rows if r["traj"] == i]
            first = ref[i, min(r["call"] for r in mine), "bias"]
            assert sum(r["r_m"] for r in mine) == pytest.approx(mine[-1]["p_mem"] - first, abs=1e-6)


# ------------------------------------------------------------------------------ credit (eq. 6-9)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm", ["pooled", "per_step"])
def test_mempo_credit_matches_its_loop_reference(mode, norm):
    K = replace(KNOBS, mem_reward=MemPOConfig(norm=norm))

    rule = get_credit("mempo")
    for seed in range(3):
        cb = _cb(_copies(2, seed), mode)
        adv, _ = rule.fn(cb, K)
        assert torch.allclose(adv, torch.tensor(rule.loop(cb, K)), atol=1e-5)
        grpo, _ = get_credit("grpo").fn(cb, K)
        assert float((adv - grpo).abs().max()) > 0.1  # the memory advantage is there


def _hand_case():
    """Two samples of one task, two memories each, R_M set by hand: (0.1, 0.5) and (0.3, 0.7)."""
    base = oracle_traces("mempo", 2, 3, 11)[0]
    trajs = []
    for r_t, r_m in ((1.0, (0.1, 0.5)), (0.0, (0.3, 0.7))):
        t = Trajectory.from_dict(base.to_dict())
        t.reward = r_t
        mems = [c for c in t.calls if memory_span(c)]
        for c in mems:
            c.reward = None
        t.calls = t.calls[:2]  # two calls, each with one <mem>
        for c, r in zip(t.calls, r_m):
            c.reward = r
        trajs.append(t)
    return trajs


@pytest.mark.parametrize(
    "norm,expected",
    [
        (
            "pooled",
            (-0.3 / math.sqrt(0.2 / 3), 0.1 / math.sqrt(0.2 / 3), -0.1 / math.sqrt(0.2 / 3), 0.3 / math.sqrt(0.2 / 3)),
        ),
        ("per_step", (-1 / math.sqrt(2), -1 / math.sqrt(2), 1 / math.sqrt(2), 1 / math.sqrt(2))),
    ],
)
def test_pooling_on_a_hand_checked_case(norm, expected):
    """Pooled (eq. 6-8): mean 0.4 and std sqrt(0.2/3) over all four memories. Per step: turn 1
    is (0.1, 0.3), turn 2 (0.5, 0.7), each mean +- 0.1 with std sqrt(0.02)."""
    K = replace(KNOBS, mem_reward=MemPOConfig(norm=norm))

    trajs = _hand_case()
    assert all(memory_span(c) for t in trajs for c in t.calls)
    cb = _cb(trajs)
    adv, _ = get_credit("mempo").fn(cb, K)
    a_t = (0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5))  # rewards (1, 0): mean 0.5, std sqrt(0.5)
    b = cb.batch
    for row in range(b.input_ids.shape[0]):
        i, c = int(b.unit_index[row]), int(b.call_index[row])
        s, e = memory_span(trajs[i].calls[c])
        n_ctx = trajs[i].calls[c].n_context
        out = adv[row, n_ctx : n_ctx + trajs[i].calls[c].n_output]
        assert torch.allclose(out[s:e], torch.full((e - s,), a_t[i] + expected[2 * i + c]), atol=1e-4)
        rest = torch.cat([out[:s], out[e:]])
        assert torch.allclose(rest, torch.full_like(rest, a_t[i]), atol=1e-5)


def test_equal_memory_rewards_make_mempo_grpo():
    """The exercise's answer: when every memory is equally good (e.g. each already holds the answer)
    A_M = 0 and MemPO's update is GRPO's."""
    trajs = _copies(2, 0)
    for t in trajs:
        for c in t.calls:
            if c.reward is not None:
                c.reward = 0.5  # exactly representable: the group mean is exact, the std 0
    cb = _cb(trajs)
    assert torch.allclose(get_credit("mempo").fn(cb, KNOBS)[0], get_credit("grpo").fn(cb, KNOBS)[0], atol=1e-6)


def test_an_unscored_memory_is_an_error_not_a_silent_zero():
    trajs = _copies(2, 0)
    next(c for c in trajs[0].calls if memory_span(c)).reward = None
    with pytest.raises(ValueError, match="score_memories"):
        get_credit("mempo").fn(_cb(trajs), KNOBS)


def test_learner_scores_memories_and_trains_them(model):
    """One update with credit ``mempo`` on real trajectories: every memory is scored under the
    policy, the stats report it, and the update differs from GRPO's on the same batch."""
    from accelerate import Accelerator

    from memkit.lab.policies import fresh_tiny
    from memkit.rl.config import TrainConfig
    from memkit.rl.update import Learner

    def run(credit):
        trajs = _copies(2, 1)
        cfg = TrainConfig.from_flags(
            method="mempo", init="tiny", credit=credit, lr=1e-3, kl_coef=0.0, out_dir="", recompute_old_logprobs=True
        )
        learner = Learner(cfg, fresh_tiny(kit(), seed=3).model, kit().tokenizer, accelerator=Accelerator(cpu=True))
        stats = learner.update(trajs)
        return stats, {k: v.detach().clone() for k, v in learner.policy.state_dict().items()}, trajs

    stats, after, trajs = run("mempo")
    n_mem = sum(memory_span(c) is not None for t in trajs for c in t.calls)
    assert stats["memories"] == n_mem and 0 < stats["mem_p"] < 1 and stats["mem_reward_seconds"] > 0
    assert all(c.reward is not None for t in trajs for c in t.calls if memory_span(c))
    g_stats, g_after, _ = run("grpo")
    assert "mem_p" not in g_stats
    assert max(float((after[k] - g_after[k]).abs().max()) for k in after) > 1e-5
