"""Accuracy and efficiency metrics on hand-computed cases, hand-built trajectories and, for
the action counts, real oracle rollouts of every method (``fixtures.traces``)."""

import random

import pytest
from fixtures.traces import oracle_traces
from hypothesis import given, settings, strategies as st

from memkit.agents import QA_METHODS, get_method
from memkit.core.trajectory import Call, Trajectory
from memkit.metrics.efficiency import (
    dependency,
    dependency_loop,
    memory_actions,
    peak_tokens,
    step_peak_tokens,
    tool_calls,
    total_tokens,
)
from memkit.metrics.qa import exact_match, f1, format_table, normalize_answer, score_multi, split_answers, summarize


# ---------------------------------------------------------------------------- accuracy
def test_normalize_answer():
    assert normalize_answer("  The  Cat!! ") == "cat"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("Theodore") == "theodore"  # articles only as whole words


def test_exact_match_hand_cases():
    assert exact_match("The Cat", ["cat"]) == 1.0
    assert exact_match("cats", ["cat"]) == 0.0
    assert exact_match("NYC", ["New York City", "nyc"]) == 1.0
    assert exact_match("Paris", "paris.") == 1.0
    assert exact_match(None, ["x"]) == 0.0 and exact_match("", ["x"]) == 0.0 and exact_match("the", ["x"]) == 0.0
    with pytest.raises(ValueError, match="gold"):
        exact_match("x", [])


def test_f1_hand_cases():
    assert f1("x b c", ["b c d"]) == pytest.approx(2 / 3)  # p = r = 2/3
    assert f1("a b c", ["b c d"]) == pytest.approx(0.8)  # 'a' is an article: p = 1, r = 2/3
    assert f1("b b", ["b"]) == pytest.approx(2 / 3)  # multiset: c = 1, p = 1/2, r = 1
    assert f1("new york", ["York", "New York City"]) == pytest.approx(0.8)  # max(2/3, 0.8)
    assert f1("zzz", ["b"]) == 0.0 and f1(None, ["b"]) == 0.0 and f1("  ", ["b"]) == 0.0


def test_split_answers():
    assert split_answers("Paris; 1999 ;Bob") == ["Paris", "1999", "Bob"]
    assert split_answers("a; b;") == ["a", "b"]
    assert split_answers("a;;b") == ["a", "", "b"]
    assert split_answers(None) == [] and split_answers("  ") == []


def test_score_multi_hand_cases():
    golds = [["Paris"], ["1999", "nineteen ninety-nine"], ["Oto Brell"]]
    r = score_multi("paris; Nineteen ninety-nine; Bob", golds, "em")
    assert r["per_question"] == [1.0, 1.0, 0.0] and r["sum"] == 2.0 and r["mean"] == pytest.approx(2 / 3)
    r = score_multi("paris; 1999; Oto", golds, "f1")
    assert r["per_question"] == pytest.approx([1.0, 1.0, 2 / 3])
    # count mismatch: answers cannot be aligned, so every question scores 0
    assert score_multi("paris; 1999", golds, "em") == {"per_question": [0.0, 0.0, 0.0], "sum": 0.0, "mean": 0.0}
    assert score_multi("paris; 1999; Oto Brell; extra", golds, "f1")["sum"] == 0.0
    assert score_multi(None, golds)["sum"] == 0.0
    # k == 1: the whole answer is one slot, a ';' inside it is no separator
    assert score_multi("Smith; John", [["Smith; John"]])["sum"] == 1.0
    with pytest.raises(ValueError, match="em, f1"):
        score_multi("x", [["x"]], metric="bleu")
    with pytest.raises(ValueError, match="alias lists"):
        score_multi("x", ["x"])


# -------------------------------------------------------------------------- efficiency
def call(turn, n_ctx, n_out, system=0, role="act", spans=None, text="", char_spans=None, seconds=0.0):
    return Call(
        turn=turn,
        role=role,
        context_ids=[5] * n_ctx,
        output_ids=[7] * n_out,
        logprobs=[0.0] * n_out,
        context_spans={"system": [(0, system)]} if system else {},
        output_spans=spans or {},
        output_text=text,
        output_char_spans=char_spans or {},
        seconds=seconds,
    )


def traj(calls, answer=None, golds=(("x",),), valid=True):
    return Trajectory(task_id="t", method="m", calls=calls, answer=answer, golds=[list(g) for g in golds], valid=valid)


def test_token_metrics_by_hand():
    # MemSearcher-like: turn 1 = act (ctx 30 incl. 10 system, out 5) + memory update (ctx 20, out 8);
    # turn 2 = act (ctx 25 incl. 10 system, out 4)
    t = traj([call(1, 30, 5, system=10), call(1, 20, 8, role="memory"), call(2, 25, 4, system=10)])
    # per call (system excluded): 20+5=25, 20+8=28, 15+4=19
    assert peak_tokens(t) == 28
    assert peak_tokens(t, exclude=()) == 35
    assert total_tokens(t) == 25 + 28 + 19
    assert step_peak_tokens(t) == 25 + 28  # turn 1 makes two calls
    # paper: sum (2 n_o + n_p) n_o / 2 = (10+20)*5/2 + (16+20)*8/2 + (8+15)*4/2 = 75 + 144 + 46
    assert dependency(t) == 265.0 == dependency_loop(t)
    # causal: sum (2 n_p + n_o - 1) n_o / 2 = (44*5 + 47*8 + 33*4) / 2
    assert dependency(t, formula="causal") == (44 * 5 + 47 * 8 + 33 * 4) / 2 == dependency_loop(t, formula="causal")
    empty = traj([])
    assert peak_tokens(empty) == total_tokens(empty) == step_peak_tokens(empty) == 0 and dependency(empty) == 0.0
    with pytest.raises(ValueError, match="causal"):
        dependency(t, formula="quadratic")


def test_dependency_causal_counts_attended_tokens_one_by_one():
    # 3 prefix tokens, 2 outputs: token 1 sees 3, token 2 sees 4 -> 7
    assert dependency(traj([call(1, 3, 2)]), formula="causal") == 7.0


@st.composite
def random_trajs(draw):
    out = []
    for _ in range(draw(st.integers(0, 4))):
        calls = []
        for i in range(draw(st.integers(0, 5))):
            n_ctx = draw(st.integers(0, 60))
            calls.append(call(i + 1, n_ctx, draw(st.integers(0, 40)), system=draw(st.integers(0, n_ctx))))
        out.append(traj(calls))
    return out


@settings(max_examples=60, deadline=None)
@given(random_trajs(), st.sampled_from(["paper", "causal"]), st.sampled_from([(), ("system",)]))
def test_dependency_vectorised_matches_loop(trajs, formula, exclude):
    vec = dependency(trajs, exclude=exclude, formula=formula)
    assert vec == pytest.approx([dependency_loop(t, exclude=exclude, formula=formula) for t in trajs])
    for t, v in zip(trajs, vec):
        assert dependency(t, exclude=exclude, formula=formula) == pytest.approx(v)


def test_tool_calls_and_memory_actions():
    text = '<tool_call>{"name": "prune_write", "ids": [1]}</tool_call><tool_call>{"name": "search"}</tool_call>'
    memact = call(
        2,
        10,
        10,
        spans={"tool_call": [(0, 5), (5, 10)]},
        text=text,
        char_spans={"tool_call": [(0, 48), (48, len(text))]},
    )
    t = traj(
        [
            call(1, 10, 10, spans={"think": [(0, 3)], "mem": [(3, 6)], "search": [(6, 9)]}),  # MemPO turn
            memact,
            call(2, 10, 5, role="memory"),  # bare memory update (MemSearcher)
            call(3, 10, 5, role="memory", spans={"memory": [(0, 5)]}),
            call(4, 10, 5, spans={"answer": [(0, 5)]}),
        ]
    )
    assert tool_calls(t) == 2  # the search + the non-prune tool_call
    assert memory_actions(t) == 4  # <mem>, the prune_write, the bare update, <memory>


def test_one_prune_write_is_one_memory_action_by_hand():
    text = "<think>t</think><prune>r1, r2</prune><note>facts</note>"
    spans = {"think": [(0, 3)], "prune": [(3, 6)], "note": [(6, 9)]}  # what the engine tags on MemAct's output
    assert memory_actions(traj([call(1, 10, 9, spans=spans, text=text)])) == 1  # a_mem = (I_target, c): one action
    assert memory_actions(traj([call(1, 10, 3, spans={"note": [(0, 3)]})])) == 1  # a write that deletes nothing
    assert memory_actions(traj([call(1, 10, 9, spans=spans), call(2, 10, 9, spans=spans)])) == 2
    assert tool_calls(traj([call(1, 10, 9, spans=spans)])) == 0
    query = '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "prune juice"}}</tool_call>'
    search = call(1, 10, 5, spans={"tool_call": [(0, 5)]}, text=query, char_spans={"tool_call": [(0, len(query))]})
    assert tool_calls(traj([search])) == 1 and memory_actions(traj([search])) == 0  # "prune" in a query is a search


# Real traces: the oracle policy of each method through the rollout engine. What counts as one
# action is read from the trace independently of the metric, with the method's own parser:
# a memory action is a MemAct Prune&Write, a MemSearcher memory update, a MemPO step's <mem>;
# a tool call is a search.
def parsed_actions(t):
    method = get_method(t.method)
    return [method.parse(c.output_text, c.role) for c in t.calls if c.valid and c.output_text]


def real_memory_actions(t) -> int:
    return sum(
        p.action in ("prune_write", "memory") or "mem" in p.fields or "note" in p.fields for p in parsed_actions(t)
    )


@pytest.mark.parametrize("k", [2, 4])
def test_memory_actions_count_each_memact_prune_write_once_on_real_traces(k):
    trajs = oracle_traces("memact", k=k, n_tasks=2)
    for t in trajs:
        n_prune_write = sum(p.action == "prune_write" for p in parsed_actions(t))
        assert n_prune_write >= 1 and (k < 4 or n_prune_write >= 2)
        assert n_prune_write == sum(map(bool, t.info["pruned_ids"]))  # every oracle Prune&Write deletes records
        assert sum("Note saved as" in (c.observation_text or "") for c in t.calls) == n_prune_write
        assert memory_actions(t) == n_prune_write == real_memory_actions(t)
        assert tool_calls(t) == sum(p.action == "search" for p in parsed_actions(t))


@pytest.mark.parametrize("method", QA_METHODS)
def test_action_counts_match_the_parsed_actions_on_real_traces(method):
    for t in oracle_traces(method, k=2):
        assert all(c.valid for c in t.calls)
        acts = [c for c in t.calls if c.role == "act"]
        searches = sum(p.action == "search" for p in parsed_actions(t))
        prune_writes = sum(p.action == "prune_write" for p in parsed_actions(t))
        assert tool_calls(t) == searches == len(acts) - 1 - prune_writes  # the other act calls search
        assert memory_actions(t) == real_memory_actions(t)
        if method == "memsearcher":  # one per memory-update call, its <memory> tag not counted again
            assert memory_actions(t) == sum(c.role == "memory" for c in t.calls) == searches
        elif method == "mempo":  # one <mem> per step, the answering step's too
            assert memory_actions(t) == len(acts)
        elif method == "memact":  # one per Prune&Write, not one per <prune> and one per <note>
            assert memory_actions(t) == prune_writes >= 1
        elif method == "amem":  # one <note> added to the store per call, the answering call's too
            assert memory_actions(t) == len(acts)
        elif method in ("mem1", "react"):  # MEM1's <think> internal state is reasoning, not an action
            assert memory_actions(t) == 0


def test_summarize_and_table():
    good = traj(
        [call(1, 10, 4, seconds=0.5), call(2, 20, 2, seconds=0.25)], answer="Paris; 1999", golds=[["paris"], ["1999"]]
    )
    half = traj([call(1, 40, 6)], answer="Paris; 2000", golds=[["paris"], ["1999"]])
    bad = traj([call(1, 5, 1)], answer=None, golds=[["x"]], valid=False)
    s = summarize([good, half, bad])
    assert s["n"] == 3
    assert s["em"] == pytest.approx(3 / 5)  # per question: 1, 1, 1, 0, 0
    assert s["f1"] == pytest.approx(3 / 5)
    assert s["peak_tokens"] == pytest.approx((22 + 46 + 6) / 3)
    assert s["tt"] == pytest.approx((36 + 46 + 6) / 3)
    assert s["dependency"] == pytest.approx(sum(dependency([good, half, bad])) / 3)
    assert s["seconds"] == pytest.approx(0.75 / 3)
    assert s["invalid_rate"] == pytest.approx(1 / 3)
    table = format_table([{"method": "mem1", "k": 2, **s}])
    head, rule, row = table.splitlines()
    assert head.split()[:4] == ["method", "k", "n", "em"] and row.split()[:4] == ["mem1", "2", "3", "0.600"]
    with pytest.raises(ValueError, match="no trajectories"):
        summarize([])
    with pytest.raises(ValueError, match="golds"):
        summarize([traj([], golds=[])])


def test_em_by_kind_by_hand():
    from dataclasses import replace

    from memkit.metrics.qa import em_by_kind
    from memkit.world.schema import Question, Task

    q = lambda kind, gold: Question(id=gold, text="?", answers=[gold], kind=kind)  # noqa: E731
    t1 = Task(id="a", questions=[q("comparison", "Ann"), q("1hop", "1999")], prompt="")
    t2 = Task(id="b", questions=[q("comparison", "Bob"), q("bridge", "Oslo")], prompt="")
    right = replace(traj([], answer="Ann; 1999", golds=t1.golds), task_id="a")
    half = replace(traj([], answer="Cid; Oslo", golds=t2.golds), task_id="b")
    counted_wrong = replace(traj([], answer="Bob", golds=t2.golds), task_id="b")  # one answer for two questions
    assert em_by_kind([right, half], [t1, t2]) == {"em_1hop": 1.0, "em_bridge": 1.0, "em_comparison": 0.5}
    assert em_by_kind([right, half, counted_wrong], [t1, t2]) == pytest.approx(
        {"em_1hop": 1.0, "em_bridge": 0.5, "em_comparison": 1 / 3}
    )
    with pytest.raises(ValueError, match="answers none of the tasks"):
        em_by_kind([right], [t2])


def test_summarize_round_trips_through_jsonl(tmp_path):
    from memkit.core.trajectory import load_jsonl, save_jsonl

    rng = random.Random(3)
    trajs = [
        traj(
            [call(i + 1, rng.randint(1, 50), rng.randint(1, 20), system=1) for i in range(4)], answer="x", golds=[["x"]]
        )
        for _ in range(3)
    ]
    save_jsonl(trajs, tmp_path / "t.jsonl")
    assert summarize(load_jsonl(tmp_path / "t.jsonl")) == summarize(trajs)


# ------------------------------------------------------------- context tokens per turn (MemSearcher Fig. 3)
def test_context_tokens_per_turn_by_hand():
    from memkit.metrics.efficiency import context_tokens_per_turn

    # MemSearcher-like: act calls (ctx 30, 34) with memory updates between them; a shorter second trajectory
    a = traj([call(1, 30, 5, system=10), call(1, 50, 8, role="memory"), call(2, 34, 4, system=10)])
    b = traj([call(1, 20, 5)])
    mean, count = context_tokens_per_turn([a, b])
    assert mean.tolist() == [25.0, 34.0] and count.tolist() == [2, 1]
    mean, count = context_tokens_per_turn([a, b], exclude=("system",))
    assert mean.tolist() == [20.0, 24.0]
    mean, count = context_tokens_per_turn([a], role="memory")
    assert mean.tolist() == [50.0] and count.tolist() == [1]
    mean, count = context_tokens_per_turn([a], role=None)
    assert mean.tolist() == [30.0, 50.0, 34.0]
    mean, count = context_tokens_per_turn([])
    assert len(mean) == len(count) == 0
    # a turn-limit failure is recorded as a call that was never made (no context): not a turn
    c = traj([call(1, 30, 5), call(2, 0, 0)])
    mean, count = context_tokens_per_turn([c])
    assert mean.tolist() == [30.0] and count.tolist() == [1]


@st.composite
def role_trajs(draw):
    out = []
    for _ in range(draw(st.integers(0, 5))):
        calls = []
        for i in range(draw(st.integers(0, 7))):
            n_ctx = draw(st.integers(0, 80)) * draw(st.sampled_from([0, 1, 1, 1]))
            calls.append(
                call(
                    i + 1,
                    n_ctx,
                    draw(st.integers(0, 9)),
                    system=draw(st.integers(0, n_ctx)),
                    role=draw(st.sampled_from(["act", "memory"])),
                )
            )
        out.append(traj(calls))
    return out


@settings(max_examples=60, deadline=None)
@given(role_trajs(), st.sampled_from(["act", "memory", None]), st.sampled_from([(), ("system",)]))
def test_context_tokens_per_turn_matches_loop(trajs, role, exclude):
    from memkit.metrics.efficiency import context_tokens_per_turn, context_tokens_per_turn_loop

    mean, count = context_tokens_per_turn(trajs, role=role, exclude=exclude)
    ref_mean, ref_count = context_tokens_per_turn_loop(trajs, role=role, exclude=exclude)
    assert count.tolist() == ref_count
    assert mean.tolist() == pytest.approx(ref_mean)
