"""Hindsight SFT of Mem-T construction (eq. 18) on real construction calls and real trees.

The pool is one conversation built by the teacher with noise and the questions' trees grown by
the noisy teacher (as in tests/rl/test_mot.py); the SFT runs start from a fresh tiny model.
"""

from __future__ import annotations

import pytest
import torch

from memkit.agents.base import OracleConfig
from memkit.agents.memt import MemT
from memkit.lab.memt.construction import (
    OpPool,
    hindsight_sft,
    op_examples,
    random_filter,
    tool_call_token_spans,
    update_history_rate,
)
from memkit.rl.mot import construction_ops, hindsight_filter, hindsight_scores, score_query
from memkit.rollout.engine import OraclePolicy, RolloutConfig, to_trajectory
from memkit.rollout.streams import build_memories
from memkit.train.sft import make_batch, sft_loss
from memkit.world.streams import make_conversations
from tests.fixtures.traces import kit
from tests.rl.test_mot import forest

pytestmark = pytest.mark.usefixtures("one_thread")


def _pool() -> OpPool:
    built, conv, sources, grown = forest()
    for qa, qt in grown:
        score_query(qt.trees, qa.evidence, sources)
    traj = to_trajectory(MemT(), built, 0)
    ops = construction_ops(traj)
    scores = hindsight_scores(ops, [(qa.evidence, qt.trees) for qa, qt in grown])
    return OpPool([traj], [{**op, "conv": 0} for op in ops], scores)


def test_each_memory_op_names_its_tool_call_and_the_spans_cover_exactly_those_calls():
    pool = _pool()
    tok = kit().tokenizer
    calls = pool.trajs[0].calls
    for op in pool.ops:
        call = calls[op["call"]]
        spans = tool_call_token_spans(tok, call.output_ids)
        assert len(spans) == call.output_text.count("<tool_call>")
        assert all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:]))  # in order, disjoint
        piece = tok.decode(call.output_ids[slice(*spans[op["tool_index"]])])
        assert piece.strip().startswith("<tool_call>") and piece.strip().endswith("</tool_call>")
        assert f'"name": "{op["op"]}"' in piece and piece.count("<tool_call>") == 1


def test_op_examples_clone_the_kept_operations_only():
    pool = _pool()
    tok = kit().tokenizer
    kept = hindsight_filter(pool.ops, pool.scores)
    examples = op_examples(pool, kept, tok)
    kept_calls = {pool.ops[k]["call"] for k in kept}
    assert len(examples) == len(kept_calls) and 0 < len(kept) < len(pool.ops)
    calls = {i: pool.trajs[0].calls[i] for i in kept_calls}
    by_output = {tuple(c.output_ids): i for i, c in calls.items()}
    for ctx, out, mask in examples:
        i = by_output[tuple(out)]
        wanted = [op["tool_index"] for k, op in enumerate(pool.ops) if op["call"] == i and k in kept]
        dropped = [op["tool_index"] for k, op in enumerate(pool.ops) if op["call"] == i and k not in kept]
        spans = tool_call_token_spans(tok, out)
        for t in wanted:
            assert all(mask[slice(*spans[t])])
        for t in dropped:
            if pool.trajs[0].calls[i].role == "form":
                assert not any(mask[slice(*spans[t])])
    assert any(not all(m) for _, _, m in examples)  # some formation call keeps part of its output
    # the ablation keeps as many ops per type, other ones
    rnd = random_filter(pool.ops, seed=1)
    count = lambda ks: sorted(pool.ops[k]["op"] for k in ks)  # noqa: E731
    assert count(rnd) == count(kept) and rnd != kept


def test_a_target_mask_equals_moving_the_unmasked_prefix_into_the_context():
    pool = _pool()
    call = next(c for c in pool.trajs[0].calls if c.role == "form" and c.output_text.count("<tool_call>") >= 2)
    spans = tool_call_token_spans(kit().tokenizer, call.output_ids)
    j = spans[1][0]  # clone only from the second tool call on
    mask = [i >= j for i in range(len(call.output_ids))]
    from memkit.lab.policies import fresh_tiny

    model = fresh_tiny(kit(), seed=0).model.eval()
    with torch.no_grad():
        masked = sft_loss(model, *make_batch([(call.context_ids, call.output_ids, mask)], 0))
        moved = sft_loss(model, *make_batch([(call.context_ids + call.output_ids[:j], call.output_ids[j:])], 0))
    assert float(masked) == pytest.approx(float(moved), abs=1e-5)
    with pytest.raises(ValueError, match="target_mask has"):
        make_batch([(call.context_ids, call.output_ids, mask[:-1])], 0)


def test_hindsight_sft_raises_the_likelihood_of_the_kept_operations():
    pool = _pool()
    tok = kit().tokenizer
    examples = op_examples(pool, hindsight_filter(pool.ops, pool.scores), tok)
    from memkit.lab.policies import fresh_tiny

    start = fresh_tiny(kit(), seed=0).model.eval()
    batch = make_batch(examples, 0)
    with torch.no_grad():
        before = float(sft_loss(start, *batch))
    trained, history = hindsight_sft(start, kit(), examples, seconds=None, steps=30, lr=3e-3)
    with torch.no_grad():
        after = float(sft_loss(trained, *batch))
        assert float(sft_loss(start, *batch)) == before  # a copy was trained, not the start
    assert after < 0.8 * before, (before, after)


def test_the_update_history_rate_sees_the_teachers_forgetting():
    method, tok = MemT(), kit().tokenizer
    convs = make_conversations(kit().world, 6, seed=3, size="smoke")
    cfg = RolloutConfig(max_context_tokens=10**9)
    rates = {}
    for rate in (0.0, 1.0):
        teacher = OraclePolicy(method, tok, OracleConfig(flaw="forget_earlier", flaw_rate=rate), seed=0)
        built = build_memories(method, convs, teacher, tok, cfg)
        rates[rate] = update_history_rate([to_trajectory(method, b, 0) for b in built])
    assert rates[1.0] == (0.0, rates[0.0][1]) and rates[0.0][0] > 0.5, rates


def test_a_pool_scores_every_operation_of_every_conversation():
    from memkit.lab.memt.construction import score_pool

    convs = make_conversations(kit().world, 2, seed=5, size="smoke")
    noisy = OracleConfig(p_wasted_search=0.5, p_wrong_answer=0.3)
    pool = score_pool(kit(), None, None, convs, seed=0, questions=3, teacher=noisy, reader=noisy)
    assert len(pool.trajs) == 2 and len(pool.scores) == len(pool.ops)
    assert {op["conv"] for op in pool.ops} == {0, 1}
    for i, traj in enumerate(pool.trajs):  # each conversation's ops, in order, with its own calls
        assert [{k: v for k, v in op.items() if k != "conv"} for op in pool.ops if op["conv"] == i] == construction_ops(
            traj
        )
    assert any(s != 0 for s in pool.scores)
    assert op_examples(pool, hindsight_filter(pool.ops, pool.scores), kit().tokenizer)
