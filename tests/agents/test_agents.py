"""Memory formats: parsers, contexts, rewards and the scripted oracle, through the real engine.

A character tokenizer (one id per char) stands in for BPE: refs, spans and peak sizes are
then exact in characters, and the tests need no trained tokenizer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_fuzz import depth

from memkit.agents import METHODS, QA_METHODS, get_method
from memkit.agents.base import SPARE_TURNS, OracleConfig, Parsed
from memkit.agents.mem1 import question_turns
from memkit.agents.memact import parse_ids
from memkit.agents.tags import extract, tool_call_query
from memkit.metrics.qa import exact_match, split_answers
from memkit.rollout.engine import Generation, OraclePolicy, RolloutConfig, run_rollouts
from memkit.world import make_tasks


class CharTok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


TOK = CharTok()
NO_LIMIT = 10**7


def turns_for(method: str, task) -> int:
    return get_method(method).suggested_max_turns(task)


def rollout(method, tasks, env, cfg=None, max_turns=None, seed=0, max_context_tokens=NO_LIMIT):
    m = get_method(method) if isinstance(method, str) else method
    turns = max_turns or max(turns_for(m.name, t) for t in tasks)
    return run_rollouts(
        m,
        tasks,
        env,
        OraclePolicy(m, TOK, cfg or OracleConfig(), seed=seed),
        TOK,
        RolloutConfig(max_turns=turns, max_context_tokens=max_context_tokens),
    )


def slot_em(traj) -> float:
    from memkit.metrics.qa import score_multi

    return score_multi(traj.answer, traj.golds)["mean"] if traj.valid else 0.0


def peak(traj) -> int:
    """Peak context+output characters without the system prompt (MEM1 App. B.4.1)."""
    return max(c.n_total - sum(e - s for s, e in c.context_char_spans.get("system", [])) for c in traj.calls)


class Scripted:
    """A policy that writes fixed texts in order (for invalid-turn cases)."""

    def __init__(self, texts):
        self.texts = list(texts)

    def generate_calls(self, states, specs, contexts):
        out = []
        for _ in states:
            text = self.texts.pop(0)
            out.append(Generation(ids=TOK.encode(text), logprobs=[0.0] * len(text), text=text))
        return out


def run_scripted(method, task, env, texts, max_turns=6):
    m = get_method(method) if isinstance(method, str) else method
    return run_rollouts(
        m, [task], env, Scripted(texts), TOK, RolloutConfig(max_turns=max_turns, max_context_tokens=NO_LIMIT)
    )[0]


# ------------------------------------------------------------------------------ registry
def test_registry():
    assert METHODS == ("react", "mem1", "memsearcher", "mempo", "memact")
    for name in METHODS:
        assert get_method(name).name == name
    assert get_method("MEM1").name == "mem1"
    with pytest.raises(ValueError, match="choose from react, mem1, memsearcher, mempo, memact"):
        get_method("memgpt")
    assert get_method("memsearcher", memory_budget_words=7).budget == 7
    assert get_method("memact").format_penalty == -0.1


# --------------------------------------------------------------------------------- tags
def test_tag_helpers():
    assert extract("a<think> x </think>", "think") == "x"
    assert extract("<think> x", "think") is None
    assert split_answers("a; b;", 2) == ["a", "b"]
    assert split_answers("a; b", 1) == ["a; b"]
    assert tool_call_query('{"name": "wikipedia_search", "arguments": {"query": "X born"}}') == "X born"
    assert tool_call_query('{"name": "s", "arguments": {"query": "a \\"b\\"", }}') == 'a "b"'  # broken JSON
    assert tool_call_query("plain words") == "plain words"
    assert tool_call_query('{"name": "wikipedia_search"}') is None
    assert parse_ids("r1, [r3] r4 r1") == ["r1", "r3", "r4"]


GOOD = {
    "react": [
        ("<think>hm</think><search>X born</search>", "search", "X born"),
        ("<answer>Paris</answer>", "answer", "Paris"),
    ],
    "mem1": [
        ("<think>S</think><search>X born</search>", "search", "X born"),
        ("<think>S</think>\n<answer>a; b</answer>", "answer", "a; b"),
    ],
    "memsearcher": [
        (
            '<think>t</think><tool_call>{"name": "wikipedia_search", "arguments": {"query": "X born"}}</tool_call>',
            "search",
            "X born",
        ),
        ("<think>t</think><answer>Paris</answer>", "answer", "Paris"),
        ("<think>t</think> The answer is \\boxed{Paris}.", "answer", "Paris"),
    ],
    "mempo": [
        ("<mem>\nm\n</mem>\n<think>\nt\n</think>\n<search>\nX born\n</search>", "search", "X born"),
        ("<mem>\nm\n</mem>\n<think>\nt\n</think>\n<answer>\nParis\n</answer>", "answer", "Paris"),
    ],
    "memact": [
        ("<think>t</think><search>X born</search>", "search", "X born"),
        ("<prune>r1, r2</prune><note>[OBJECTIVE] ...</note>", "prune_write", "[OBJECTIVE] ..."),
        ("<answer>Paris</answer>", "answer", "Paris"),
    ],
}
BAD = {
    "react": [
        ("", "empty output"),
        ("hello", "no action tag"),
        ("<search>a</search><answer>b</answer>", "both"),
        ("<search>  </search>", "empty search"),
        ("<answer></answer>", "empty answer"),
        ("<search>a", "unclosed <search>"),
        ("<search>a</search><search>b</search>", "multiple"),
    ],
    "mem1": [
        ("<search>a</search>", "missing <think>"),
        ("<think>s<search>a</search>", "unclosed <think>"),
        ("<search>a</search><think>s</think>", "before"),
        ("<think>s</think><answer> </answer>", "empty answer"),
    ],
    "memsearcher": [
        ('<think>t</think><tool_call>{"name": "wikipedia_search"}</tool_call>', "without a query"),
        ("<tool_call>q</tool_call>", "missing <think>"),
        ("<think>t</think>", "no action tag"),
    ],
    "mempo": [
        ("<think>t</think><search>a</search>", "missing <mem>"),
        ("<mem>m</mem><search>a</search>", "missing <think>"),
        ("<mem>m</mem><think>t</think><answer>", "unclosed <answer>"),
    ],
    "memact": [
        ("<prune>r1</prune>", "missing <note>"),
        ("<prune>r1</prune><note>x", "unclosed <note>"),
        ("<prune>r1</prune><note> </note>", "empty note"),
        ("<prune>r1<note>x</note>", "unclosed <prune>"),
        ("<prune>r1</prune><note>x</note><search>q</search>", "both"),
    ],
}


@pytest.mark.parametrize("method", METHODS)
def test_parse_well_formed(method):
    m = get_method(method)
    for text, action, arg in GOOD[method]:
        p = m.parse(text, "act")
        assert p.ok and p.action == action and p.argument == arg, (text, p)
    if method == "memact":
        assert m.parse(GOOD[method][1][0]).prune_ids == ["r1", "r2"]
    if method == "memsearcher":
        p = m.parse("<memory>Q1: Paris.</memory>", "memory")
        assert p.ok and p.action == "memory" and p.argument == "Q1: Paris."
        assert m.parse("<memory></memory>", "memory").ok  # an empty memory is a valid memory


@pytest.mark.parametrize("method", METHODS)
def test_parse_malformed(method):
    m = get_method(method)
    assert not m.parse(None, "act").ok and not m.parse(None, "memory").ok  # type: ignore[arg-type]
    for text, reason in BAD["react"] + BAD[method]:
        if method in ("mem1", "memsearcher", "mempo") and text.startswith("<answer>"):
            continue  # these formats require <think>/<mem> first: the reason differs
        p = m.parse(text, "act")
        assert not p.ok and p.error, (method, text)
        if method == "react" or (text, reason) in BAD[method]:
            assert reason in p.error, (method, text, p.error)
    if method == "memsearcher":
        assert "missing <memory>" in m.parse("facts", "memory").error
        assert "unclosed <memory>" in m.parse("<memory>facts", "memory").error


TAGGY = st.lists(
    st.sampled_from(
        list('<>/{}":;, \\\nabcr1')
        + [
            "<think>",
            "</think>",
            "<search>",
            "</search>",
            "<answer>",
            "</answer>",
            "<mem>",
            "</mem>",
            "<memory>",
            "</memory>",
            "<tool_call>",
            "</tool_call>",
            "<prune>",
            "</prune>",
            "<note>",
            "</note>",
            "\\boxed{",
            "}",
            '"query"',
            '{"name": "wikipedia_search", "arguments": {"query": ',
        ]
    ),
    max_size=30,
).map("".join)


@pytest.mark.fuzz
@settings(max_examples=depth(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=60), TAGGY))
def test_parsers_never_raise(text):
    for name in METHODS:
        m = get_method(name)
        for role in ("act", "memory"):
            p = m.parse(text, role)
            assert isinstance(p, Parsed) and (p.ok or p.error)
            if p.ok:
                assert p.argument is not None and (p.argument.strip() or p.action == "memory")


class Drawn:
    """A policy whose every output is drawn by hypothesis (the engine's fuzz test)."""

    def __init__(self, draw):
        self.draw = draw

    def generate_calls(self, states, specs, contexts):
        return [
            Generation(ids=TOK.encode(t), logprobs=[0.0] * len(t), text=t)
            for t in (self.draw(st.one_of(TAGGY, RANDOM_CALLS)) for _ in states)
        ]


#: outputs that parse more often than TAGGY: real tags and tool calls around random arguments
RANDOM_CALLS = st.builds(
    lambda tag, arg, ids: {
        "search": f"<think>t</think><search>{arg}</search>",
        "answer": f"<think>t</think><answer>{arg}</answer>",
        "mem": f"<mem>{arg}</mem><think>t</think><search>{arg}</search>",
        "memory": f"<memory>{arg}</memory>",
        "tool": '<tool_call>{"name": "wikipedia_search", "arguments": {"query": "%s"}}</tool_call>' % arg,
        "prune": f"<prune>{ids}</prune><note>{arg}</note>",
    }[tag],
    st.sampled_from(["search", "answer", "mem", "memory", "tool", "prune"]),
    st.lists(st.sampled_from(list('ab1 ,;.?!<>/\\"{}') + ["Q1:", "Q2:"]), max_size=12).map("".join),
    st.lists(st.sampled_from(["r1", "r2", "r9", "x", ""]), max_size=3).map(", ".join),
)


@pytest.mark.fuzz
@settings(
    max_examples=depth(40, fuzz=1000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_engine_turns_any_model_output_into_a_trajectory(data, world, env):
    """Random outputs through the whole engine (parse, apply, search, memory updates): every format
    ends each episode with a trajectory; an invalid one carries its reason; nothing raises (a
    non-ModelError exception while applying an output would: that is a memkit bug)."""
    tasks = make_tasks(world, 2, k=2, seed=data.draw(st.integers(0, 50)))
    for name in METHODS:
        trajs = run_rollouts(
            get_method(name), tasks, env, Drawn(data.draw), TOK, RolloutConfig(max_turns=4, max_context_tokens=NO_LIMIT)
        )
        assert len(trajs) == len(tasks)
        assert all(t.valid or t.reason for t in trajs), [(t.reason, t.calls[-1].output_text) for t in trajs]


def test_engine_keeps_model_errors_apart_from_library_errors(world, env, monkeypatch):
    """A ModelError while applying an output is an invalid "tool error" turn; any other exception is a
    memkit bug and surfaces instead of hiding in the invalid rate."""
    from memkit.core.trajectory import ModelError

    task = make_tasks(world, 1, k=1, seed=5)
    search = "<think>look</think><search>some query</search>"

    def refuse(query, *a, **kw):
        raise ModelError("query names nothing")

    monkeypatch.setattr(env, "search", refuse)
    monkeypatch.setattr(env, "search_batch", lambda queries, *a, **kw: [refuse(q) for q in queries], raising=False)
    [t] = run_rollouts(get_method("mem1"), task, env, Scripted([search]), TOK, RolloutConfig(max_turns=3))
    assert not t.valid and t.reason == "tool error: query names nothing"

    def broken(query, *a, **kw):
        raise KeyError("a memkit bug")

    monkeypatch.setattr(env, "search", broken)
    monkeypatch.setattr(env, "search_batch", lambda queries, *a, **kw: [broken(q) for q in queries], raising=False)
    with pytest.raises(KeyError, match="a memkit bug"):
        run_rollouts(get_method("mem1"), task, env, Scripted([search]), TOK, RolloutConfig(max_turns=3))


# -------------------------------------------------------------------- oracle and contexts
@pytest.fixture(scope="module")
def oracle_runs(world, env):
    """Oracle trajectories for every format and k in {1, 2, 4, 8} (reused by several tests)."""
    runs = {}
    for k, n in ((1, 40), (2, 25), (4, 15), (8, 10)):
        tasks = runs["tasks", k] = make_tasks(world, n, k=k, seed=11)
        for name in METHODS:
            runs[name, k] = rollout(name, tasks, env)
    return runs


@pytest.mark.parametrize("method", METHODS)
def test_oracle_solves_tasks(oracle_runs, method):
    for k in (1, 2, 4, 8):
        trajs = oracle_runs[method, k]
        assert all(t.valid for t in trajs), [t.reason for t in trajs if not t.valid][:3]
        em = sum(slot_em(t) for t in trajs) / len(trajs)
        assert em >= 0.99, (method, k, em)


def test_memact_oracle_skips_pruning_when_turns_are_short(oracle_runs, env):
    tasks = oracle_runs["tasks", 8]
    tight = max(get_method("react").suggested_max_turns(t) for t in tasks)  # no room for every prune
    trajs = rollout("memact", tasks, env, max_turns=tight)
    assert all(t.valid for t in trajs) and sum(map(slot_em, trajs)) / len(trajs) >= 0.99
    assert all(any(t.info["pruned_ids"]) for t in trajs)  # it still prunes while it can afford to


def test_refs_are_verbatim_and_contexts_follow_the_papers(oracle_runs):
    for (name, k), trajs in oracle_runs.items():
        for traj in trajs if name != "tasks" else []:
            for i, call in enumerate(traj.calls):
                assert TOK.decode(call.context_ids) == call.context_text  # ref text == referenced ids
                for s, e, j, what in call.context_refs:
                    assert j < i
                    src = traj.calls[j].output_ids if what == "output" else traj.calls[j].observation_ids
                    assert call.context_ids[s:e] == src
                refs = {j for _, _, j, _ in call.context_refs}
                if name in ("mem1", "mempo"):  # question + previous step only
                    assert refs == ({i - 1} if i else set())
                if name == "react":
                    assert refs == set(range(i))
                if name == "memsearcher":
                    assert call.role == ("memory" if i % 2 else "act") or i == len(traj.calls) - 1
                    assert len(refs) <= 2  # the memory (and, for a memory call, the turn itself)


def test_mem1_hint_counts_turns_left(world, env):
    task = make_tasks(world, 1, k=2, seed=3)[0]
    traj = rollout("mem1", [task], env, max_turns=9)[0]
    for call in traj.calls[:-1]:
        left = 9 - call.turn
        assert call.observation_text.startswith(f"\n<information>You have {left} turn")
    assert "<think>" in traj.calls[1].context_text and traj.calls[1].context_spans["think"]


def test_memory_formats_peak_context_is_small(oracle_runs, world, env):
    def mean_peak(name, k):
        trajs = oracle_runs[name, k]
        return sum(peak(t) for t in trajs) / len(trajs)

    for name in ("mem1", "memsearcher", "mempo", "memact"):
        ratio = mean_peak(name, 8) / mean_peak("react", 8)
        assert ratio <= 0.5, (name, ratio)
    tasks = make_tasks(world, 3, k=16, seed=5)
    react = sum(peak(t) for t in rollout("react", tasks, env)) / 3
    for name in ("mem1", "memsearcher", "mempo", "memact"):
        assert sum(peak(t) for t in rollout(name, tasks, env)) / 3 <= 0.3 * react, name


def test_memact_prunes_and_records_ids(oracle_runs):
    traj = oracle_runs["memact", 4][0]
    pruned = traj.info["pruned_ids"]
    assert any(pruned) and len(pruned) == len(traj.calls)
    made = traj.info["record_ids"]
    for i, ids in enumerate(pruned):
        for rid in ids:  # a pruned record never appears in a later context
            assert all(f"[{rid}] " not in c.context_text for c in traj.calls[i + 1 :])
            assert rid in made[:i]


class NoResults:
    def search(self, query):
        return "<information>No results.</information>"


def test_oracle_knows_only_what_it_saw(world):
    """With a search engine that finds nothing the oracle gives up after MAX_ATTEMPTS per hop
    and answers "unknown": its answers come from observations, never from the gold labels."""
    from memkit.agents.oracle import MAX_ATTEMPTS

    tasks = make_tasks(world, 5, k=2, seed=13)
    for name in QA_METHODS:
        trajs = rollout(name, tasks, NoResults(), max_turns=40)
        assert all(t.valid and t.answer == "unknown; unknown" for t in trajs), name
        n_search = sum(c.role == "act" and "No results" in (c.observation_text or "") for t in trajs for c in t.calls)
        assert n_search == 5 * 2 * MAX_ATTEMPTS, name  # the first hop of each question, retried


# ------------------------------------------------------------------ imperfection knobs
def test_knobs_lower_em(world, env):
    tasks = make_tasks(world, 20, k=2, seed=21)
    base = {n: sum(map(slot_em, rollout(n, tasks, env))) / 20 for n in ("mem1", "memact")}
    for name in ("mem1", "memact"):
        wrong = sum(map(slot_em, rollout(name, tasks, env, OracleConfig(p_wrong_answer=0.3), seed=1))) / 20
        assert wrong < base[name] - 0.1, (name, wrong)
        tight = max(turns_for(name, t) for t in tasks)
        drop = rollout(name, tasks, env, OracleConfig(p_drop_fact=0.6), max_turns=tight, seed=2)
        assert sum(map(slot_em, drop)) / 20 < base[name], name
    calls = lambda trajs: sum(len(t.calls) for t in trajs)  # noqa: E731
    plain = rollout("mem1", tasks, env)
    wasted = rollout("mem1", tasks, env, OracleConfig(p_wasted_search=0.5), max_turns=30, seed=3)
    assert calls(wasted) > calls(plain)
    assert sum(slot_em(t) for t in wasted) / 20 >= 0.95  # wasted searches cost turns, not answers


def test_show_comparison_writes_both_values_once_then_the_winner(world, env):
    """OracleConfig.show_comparison: in the turn a comparison's second value arrives, the oracle's
    state reads "<hop 1>: v1; <hop 2>: v2, so <winner>" (the values seen, in order); the turns
    after keep only the winner, and every format still solves its tasks."""
    tasks = [t for t in make_tasks(world, 40, k=2, seed=31) if any(q.kind == "comparison" for q in t.questions)]
    assert len(tasks) >= 10
    shown = OracleConfig(show_comparison=True)
    for name in METHODS:
        assert sum(map(slot_em, rollout(name, tasks, env, shown))) == len(tasks), name
    for traj, task in zip(rollout("mem1", tasks, env, shown), tasks):
        thinks = [extract(c.output_text, "think") for c in traj.calls]
        plain = [extract(c.output_text, "think") for c in rollout("mem1", [task], env)[0].calls]
        for qi, q in enumerate(task.questions):
            if q.kind != "comparison":
                continue
            a, b = q.decomposition
            derivation = f"Q{qi + 1}: {a.query}: {a.answer}; {b.query}: {b.answer}, so {q.answers[0]}."
            hits = [i for i, t in enumerate(thinks) if derivation in t]
            assert len(hits) == 1, (derivation, thinks)
            later = thinks[hits[0] + 1 :]
            assert all(f"Q{qi + 1}: {q.answers[0]}." in t for t in later) and not any(derivation in t for t in plain)


# ------------------------------------------------------------------------------ memory flaws
def memory_text(method: str, call) -> str:
    """What a format's memory call wrote (MEM1 <think>, MemPO <mem>, MemSearcher <memory>, MemAct <note>)."""
    tag = {"mem1": "think", "mempo": "mem", "memsearcher": "memory", "memact": "note"}[method]
    return extract(call.output_text, tag) or ""


@pytest.mark.parametrize("method", ["mem1", "mempo", "memsearcher", "memact"])
def test_forget_earlier_drops_the_answered_question_from_memory(world, env, method):
    """flaw="forget_earlier" at rate 1: once Q2 is answered, Q1's answer is in no later memory and
    its slot reads "unknown"; at rate 0 the teacher is the perfect one, call for call."""
    tasks = make_tasks(world, 12, k=2, seed=41)
    perfect = rollout(method, tasks, env)
    never = rollout(method, tasks, env, OracleConfig(flaw="forget_earlier", flaw_rate=0.0))
    assert [[c.output_text for c in t.calls] for t in never] == [[c.output_text for c in t.calls] for t in perfect]
    flawed = rollout(method, tasks, env, OracleConfig(flaw="forget_earlier", flaw_rate=1.0))
    for traj, ref, task in zip(flawed, perfect, tasks):
        q1, q2 = (q.answers[0] for q in task.questions)
        assert traj.valid and traj.answer == f"unknown; {q2}", (traj.answer, ref.answer)
        # the memory written after Q2's answer arrived no longer holds Q1's answer (MemAct writes its
        # note at a prune, which may come before Q2 is answered: its slot is the check there)
        last_mem = [memory_text(method, c) for c in traj.calls if memory_text(method, c)][-1]
        assert method == "memact" or q1 not in last_mem or q1 in q2, last_mem
        assert len(traj.calls) <= len(ref.calls)  # forgetting never costs extra searches


def test_flaws_are_habits_at_their_rate(world, env):
    """Each flaw acts on ~flaw_rate of its decisions (drawn once per task and question), lowers the
    teacher's EM by what it breaks, and stop_early answers a bridge with its first hop."""
    tasks = make_tasks(world, 60, k=2, seed=43)
    em = lambda cfg: sum(map(slot_em, rollout("mem1", tasks, env, cfg, seed=5))) / len(tasks)  # noqa: E731
    perfect = em(OracleConfig())
    assert perfect == 1.0
    forget = em(OracleConfig(flaw="forget_earlier", flaw_rate=0.65))
    assert 1 - 0.5 * 0.8 < forget < 1 - 0.5 * 0.5, forget  # ~65% of the Q1 slots lost
    assert em(OracleConfig(flaw="overwrite_slot", flaw_rate=0.65)) < forget  # two slots wrong, not one
    bridges = [t for t in make_tasks(world, 40, k=1, seed=45) if t.questions[0].kind == "bridge"]
    early = rollout("mem1", bridges, env, OracleConfig(flaw="stop_early", flaw_rate=1.0))
    for traj, task in zip(early, bridges):
        assert traj.answer == task.questions[0].decomposition[0].answer
        assert len(traj.calls) == 2  # one search, then the answer


@pytest.mark.parametrize("method", ["mem1", "mempo", "memsearcher"])
def test_ledger_memory_has_one_entry_per_question_from_the_first_turn(world, env, method):
    """memory="ledger": every memory lists every question by its first search, in order, "open" until
    something is found; the answer slots are the settled entries' values, in order, at any k; the
    flaw's forgotten answer reads "=> unknown"."""
    for k, seed in ((1, 51), (3, 52), (8, 53)):
        tasks = make_tasks(world, 6, k=k, seed=seed)
        for flaw in ("none", "forget_earlier"):
            for traj, task in zip(rollout(method, tasks, env, OracleConfig(memory="ledger", flaw=flaw)), tasks):
                keys = [q.decomposition[0].query for q in task.questions]
                mems = [memory_text(method, c) for c in traj.calls if memory_text(method, c)]
                assert mems and all(m.count(" => ") + m.count(": ") >= len(keys) for m in mems), mems[0]
                for m in mems:  # the keys in the prompt's order (two questions may share a first search)
                    at = 0
                    for key in keys:
                        at = m.find(key, at)
                        assert at >= 0, (keys, m)
                        at += len(key)
                assert all(f"{key}: open." in mems[0] for key in keys[1:])  # the first turn lists them all
                last, at, values = mems[-1], 0, []
                for key in keys:
                    at = last.find(key, at) + len(key)
                    values.append(last[at:].split(" => ", 1)[1].split(".", 1)[0])
                assert traj.valid and traj.answer == "; ".join(values), (traj.answer, last)
                if flaw == "none":
                    assert slot_em(traj) == 1.0
    # at rate 1 every answer but the last is forgotten; its entry says so
    tasks = make_tasks(world, 6, k=3, seed=54)
    for traj in rollout("mem1", tasks, env, OracleConfig(memory="ledger", flaw="forget_earlier", flaw_rate=1.0)):
        assert traj.answer.split("; ")[:2] == ["unknown", "unknown"]


def test_mem1_answers_each_question_in_turn_at_any_k(world, env):
    """MEM1 ``answers="each"`` (issue 58): the teacher answers the current question in its own <answer>,
    the environment shows the next question, the k answers joined are the final answer: EM 1.0 and
    valid at k = 1 to 16, every memory the current question's entry alone (no "Q<n>"), and no output
    longer at k = 16 than the longest at k = 2 plus a margin for longer entity names."""
    m = get_method("mem1", answers="each")
    longest = {}
    for k in (1, 2, 4, 8, 16):
        tasks = make_tasks(world, 6, k=k, seed=60 + k)
        trajs = rollout(m, tasks, env, OracleConfig(), max_turns=max(m.suggested_max_turns(t) for t in tasks))
        for traj, task in zip(trajs, tasks):
            assert traj.valid and slot_em(traj) == 1.0, (k, traj.reason, traj.answer)
            answers = [extract(c.output_text, "answer") for c in traj.calls if "<answer>" in c.output_text]
            assert len(answers) == k and traj.answer == "; ".join(answers)
            for c, q in zip([c for c in traj.calls if "<answer>" in c.output_text][:-1], task.questions[1:]):
                assert f"Next question: {q.text}" in c.observation_text  # the next question, from the env
            current = 0
            for c in traj.calls:  # the memory: the current question's entry, keyed by its first search
                assert memory_text("mem1", c).startswith(task.questions[current].decomposition[0].query)
                assert not re.search(r"\bQ\d", memory_text("mem1", c)), c.output_text
                current += "<answer>" in c.output_text
            current, start = 0, 0  # the hint counts the current question's turns, as at k = 1
            for c in traj.calls:
                q = task.questions[min(current, k - 1)]
                if "<answer>" in c.output_text:
                    current, start = current + 1, c.turn
                    if current < k:
                        assert f"You have {question_turns(task.questions[current])} turns left" in c.observation_text
                elif c.observation_text:
                    left = question_turns(q) - (c.turn - start)
                    assert f"You have {left} turn{'s' if left != 1 else ''} left" in c.observation_text
        longest[k] = max(len(c.output_text) for t in trajs for c in t.calls)
    assert longest[16] <= longest[2] + 60, longest
    assert get_method("mem1").suggested_max_turns(tasks[0]) + SPARE_TURNS * 15 == m.suggested_max_turns(tasks[0])
    with pytest.raises(ValueError, match="answers mode"):
        get_method("mem1", answers="all")


def test_mem1_answers_each_refuses_two_answers_in_one(world, env):
    """Under ``answers="each"`` one <answer> holds one answer: two (";") or none is an invalid turn
    with its reason, and the episode ends with MEM1's format penalty."""
    task = make_tasks(world, 1, k=3, seed=7)[0]
    m = get_method("mem1", answers="each")
    for text, reason in (("<think>s</think><answer>a; b</answer>", "one answer per question"),
                         ("<think>s</think><answer> </answer>", "empty answer")):  # fmt: skip
        traj = run_scripted(m, task, env, [text])
        assert not traj.valid and reason in traj.reason and traj.reward == m.format_penalty
    traj = run_scripted(m, task, env, ["<think>s</think><answer>x</answer>"] * 3)
    assert traj.valid and traj.answer == "x; x; x" and len(traj.calls) == 3


def test_mem1_answers_each_has_a_turn_limit_per_question(world, env):
    """Under ``answers="each"`` every question has a 1-question task's turn limit (``question_turns``):
    a search that leaves the current question no turn for its answer ends the episode as invalid, with
    MEM1's format penalty, however many turns the episode has left."""
    task = make_tasks(world, 1, k=3, seed=7)[0]
    m = get_method("mem1", answers="each")
    q1, q2 = (question_turns(q) for q in task.questions[:2])
    search, answer = "<think>s</think><search>a</search>", "<think>s</think><answer>x</answer>"
    traj = run_scripted(m, task, env, [search] * 20, max_turns=m.suggested_max_turns(task))
    assert not traj.valid and "of question 1 reached without an answer" in traj.reason and len(traj.calls) == q1
    assert traj.reward == m.format_penalty and q1 < m.suggested_max_turns(task)
    # answering on the last turn is in time; the next question starts with its own count
    texts = [search] * (q1 - 1) + [answer] + [search] * 20
    traj = run_scripted(m, task, env, texts, max_turns=m.suggested_max_turns(task))
    assert "of question 2 reached without an answer" in traj.reason and len(traj.calls) == q1 + q2
    assert "You have 1 turn left" in traj.calls[q1 - 2].observation_text


def test_mem1_repeat_penalty_costs_each_verbatim_repeat(world, env):
    """``repeat_penalty`` (issue 58): each search repeating the previous search's query verbatim costs
    that much reward; another query, or a committed answer in between, does not count; 0 is the paper's
    reward, and a negative cost is refused."""
    task = make_tasks(world, 1, k=2, seed=7)[0]
    gold = [q.answers[0] for q in task.questions]
    s = lambda q: f"<think>s</think><search>{q}</search>"  # noqa: E731
    a = lambda x: f"<think>s</think><answer>{x}</answer>"  # noqa: E731
    # q1: "a", "a" (1 repeat), "b", " a " (not the previous one); q2: "b" after an answer (no repeat), "b" (1)
    texts = [s("a"), s("a"), s("b"), s(" a "), a(gold[0]), s("b"), s("b"), a(gold[1])]
    for lam, want in ((0.0, 2.0), (0.25, 1.5)):
        m = get_method("mem1", answers="each", repeat_penalty=lam)
        traj = run_scripted(m, task, env, list(texts), max_turns=m.suggested_max_turns(task))
        assert traj.valid and traj.reward == pytest.approx(want)
    m = get_method("mem1", answers="each", repeat_penalty=0.5)  # an invalid episode pays its repeats too
    traj = run_scripted(m, task, env, [s("a")] * 20, max_turns=m.suggested_max_turns(task))
    assert not traj.valid and traj.reward == pytest.approx(-0.5 * (question_turns(task.questions[0]) - 1))
    final = get_method("mem1", repeat_penalty=1.0)  # the paper's one final answer: the same count
    traj = run_scripted(final, task, env, [s("a"), s("a"), a("; ".join(gold))])
    assert traj.valid and traj.reward == pytest.approx(1.0)
    with pytest.raises(ValueError, match="reward cost >= 0"):
        get_method("mem1", repeat_penalty=-1)


# ---------------------------------------------------------------------- invalid turns
@dataclass
class Case:
    method: str
    texts: list
    reason: str


def test_invalid_turns_end_with_the_format_penalty(world, env):
    task = make_tasks(world, 1, k=2, seed=7)[0]
    cases = [
        Case("mem1", ["<think>s</think><answer>only one</answer>"], "wrong answer count"),
        Case("react", ["<answer>a; b; c</answer>"], "wrong answer count"),
        Case("mempo", ["<mem>m</mem><think>t</think><answer> </answer>"], "empty answer"),
        Case("memsearcher", ["<think>t</think><answer></answer>"], "empty answer"),
        Case("memact", ["<search>x</search>", "<prune>r1, r7</prune><note>facts</note>"], "unknown prune id"),
        Case("memact", ["<prune>[r1]</prune><note>facts</note>"], "unknown prune id"),
        Case("react", ["I think the answer is Paris."], "no action tag"),
        Case("mem1", ["<think>s</think><search>a</search>"] * 3, "max turns"),
    ]
    for c in cases:
        m = get_method(c.method)
        traj = run_scripted(m, task, env, c.texts, max_turns=3)
        assert not traj.valid and c.reason in traj.reason, (c, traj.reason)
        assert traj.reward == m.format_penalty
        assert not traj.calls[-1].valid


@pytest.mark.parametrize("method", QA_METHODS)
def test_context_over_the_limit_is_an_invalid_turn(world, env, method):
    """A call whose context outgrows RolloutConfig.max_context_tokens ends the episode as invalid
    with the format penalty, before the policy is asked; the calls before it are unchanged."""
    m = get_method(method)
    task = make_tasks(world, 1, k=2, seed=7)[0]
    free = rollout(m, [task], env)[0]
    sizes = [len(c.context_ids) for c in free.calls]
    limit = max(sizes) - 1
    first_over = next(i for i, n in enumerate(sizes) if n > limit)
    capped = rollout(m, [task], env, max_context_tokens=limit)[0]
    assert free.valid and not capped.valid
    assert "context over the limit" in capped.reason and f"> {limit} tokens" in capped.reason
    assert capped.reward == m.format_penalty
    assert len(capped.calls) == first_over + 1
    last = capped.calls[-1]
    assert not last.valid and last.output_ids == [] and len(last.context_ids) == sizes[first_over]
    assert [c.output_ids for c in capped.calls[:-1]] == [c.output_ids for c in free.calls[:first_over]]


def test_memsearcher_memory_budget(world, env):
    task = make_tasks(world, 1, k=1, seed=7)[0]
    search = '<think>t</think><tool_call>{"name": "wikipedia_search", "arguments": {"query": "x"}}</tool_call>'
    traj = run_scripted(
        get_method("memsearcher", memory_budget_words=3), task, env, [search, "<memory>one two three four</memory>"]
    )
    assert not traj.valid and "memory over budget (4 > 3 words)" in traj.reason and traj.reward == 0.0
    m = get_method("memsearcher", memory_budget_words=3, on_over_budget="truncate")
    traj = run_scripted(
        m, task, env, [search, "<memory>one two three four</memory>", "<think>t</think><answer>z</answer>"]
    )
    assert traj.valid and "<memory>one two three</memory>" in traj.calls[2].context_text
    assert not any(j == 1 for _, _, j, _ in traj.calls[2].context_refs)  # truncated: not a verbatim copy


def test_rewards_follow_the_papers(world, env):
    task = make_tasks(world, 1, k=2, seed=7)[0]
    gold = [q.answers[0] for q in task.questions]
    half = f"{gold[0]}; wrong"
    r = lambda name, text: run_scripted(name, task, env, [text]).reward  # noqa: E731
    assert r("mem1", f"<think>s</think><answer>{gold[0]}; {gold[1]}</answer>") == 2.0  # 1 point per answer
    assert r("mem1", f"<think>s</think><answer>{half}</answer>") == 1.0
    assert r("react", f"<answer>{half}</answer>") == 1.0
    assert r("mempo", f"<mem>m</mem><think>t</think><answer>{half}</answer>") == 0.0  # §4.1: 1 iff correct
    assert r("mempo", f"<mem>m</mem><think>t</think><answer>{gold[0]}; {gold[1]}</answer>") == 1.0
    assert (
        run_scripted(
            get_method("mempo", reward="fraction"), task, env, [f"<mem>m</mem><think>t</think><answer>{half}</answer>"]
        ).reward
        == 0.5
    )
    assert r("memact", f"<answer>{half}</answer>") == 0.5
    assert r("memact", "<answer>x; y</answer>") == 0.0
    assert r("memsearcher", "<think>t</think><answer>x; y</answer>") == 0.1  # eq. 9: format ok, F1 = 0
    assert r("memsearcher", f"<think>t</think><answer>{half}</answer>") == pytest.approx(0.5)
    assert exact_match(gold[0], task.questions[0].answers) == 1.0


def test_memsearcher_em_reward_gives_no_credit_to_a_near_miss(world, env):
    """``reward_metric="em"``: eq. 9 with exact match, so a name that shares words with the gold
    (F1 > 0) earns only the format's 0.1, while the paper's F1 pays part of it."""
    task = make_tasks(world, 1, k=2, seed=7)[0]
    gold = [q.answers[0] for q in task.questions]
    near = f"<think>t</think><answer>Zorvex {gold[0]}; wrong</answer>"  # slot 1: the gold plus a word
    right = f"<think>t</think><answer>{gold[0]}; {gold[1]}</answer>"
    f1, em = get_method("memsearcher"), get_method("memsearcher", reward_metric="em")
    assert 0.1 < run_scripted(f1, task, env, [near]).reward < 0.5
    assert run_scripted(em, task, env, [near]).reward == 0.1
    assert run_scripted(em, task, env, [right]).reward == run_scripted(f1, task, env, [right]).reward == 1.0
    assert run_scripted(em, task, env, [f"<think>t</think><answer>{gold[0]}; wrong</answer>"]).reward == 0.5
    with pytest.raises(ValueError, match="reward_metric must be one of f1, em"):
        get_method("memsearcher", reward_metric="bleu")


def test_oracle_text_parses_in_its_own_format(world, env):
    rng = random.Random(0)
    task = make_tasks(world, 1, k=4, seed=9)[0]
    for name in QA_METHODS:
        m = get_method(name)
        state = m.new_state(task, max_turns=30)
        spec = m.next_call(state)
        text = m.oracle(state, rng, OracleConfig())
        assert m.parse(text, spec.role).ok, (name, text)
        assert any(text.endswith(s) for s in spec.stop), (name, text)  # generation would stop exactly there
        assert re.search(r"\S", spec.text)


def test_numbered_questions_splits_the_composite_prompt():
    from memkit.agents.base import numbered_questions
    from memkit.world.schema import Question, compose_prompt

    qs = [
        Question(id=f"q{i}", kind="1hop", text=t, answers=["x"])
        for i, t in enumerate(['Who directed "Vokbros Signal"?', "In which year was Shorpi Vepo born?"])
    ]
    out = numbered_questions(compose_prompt(qs))
    assert out == 'Q1: Who directed "Vokbros Signal"? Q2: In which year was Shorpi Vepo born?'
    assert numbered_questions("Which river flows through Kulshos?") == "Q1: Which river flows through Kulshos?"
