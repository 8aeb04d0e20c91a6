"""The A-MEM-style baseline format (``memkit.agents.amem``), through the real rollout engine.

Teacher trajectories come from :class:`~memkit.rollout.engine.OraclePolicy` over the kit's BM25 search, with
test_agents.py's character tokenizer (refs and peak sizes exact in characters, no trained tokenizer).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_agents import NO_LIMIT, RANDOM_CALLS, TAGGY, TOK, Drawn, peak, rollout, run_scripted, slot_em
from test_fuzz import depth

from memkit.agents import BASELINE_METHODS, METHODS, STREAM_METHODS, get_method
from memkit.agents.amem import INFO_NOTE_CALLS, INFO_NOTES, INFO_SHOWN, NOTHING_YET, AMem, NoteStore
from memkit.agents.base import OracleConfig, Parsed
from memkit.agents.oracle import FLAWS
from memkit.agents.tags import extract
from memkit.envs import make_retriever
from memkit.rollout.engine import RolloutConfig, run_rollouts
from memkit.world import make_tasks
from memkit.world.schema import Passage


@pytest.fixture(scope="module")
def runs(world, env):
    """The perfect teacher's amem and ReAct trajectories on the same tasks, k = 1, 2, 4."""
    out = {}
    for k, n in ((1, 30), (2, 20), (4, 12)):
        tasks = out["tasks", k] = make_tasks(world, n, k=k, seed=11)
        for name in ("amem", "react"):
            out[name, k] = rollout(name, tasks, env)
    return out


# ------------------------------------------------------------------------------ registry
def test_amem_is_built_by_name_but_stays_out_of_the_tokenizer_corpus():
    """``get_method("amem")`` builds the format; ``METHODS`` (whose prompts and teachers train the kit's
    tokenizer, ``memkit.lab.kit.world_tokenizer``) is unchanged; the CLI and configs accept it."""
    from memkit.cli.args import methods
    from memkit.rl.config import TrainConfig
    from memkit.train.config import SFTConfig

    assert METHODS == ("react", "mem1", "memsearcher", "mempo", "memact") and BASELINE_METHODS == ("amem",)
    assert "amem" not in METHODS + STREAM_METHODS
    m = get_method("AMEM", r=2)
    assert isinstance(m, AMem) and m.name == "amem" and m.r == 2 and get_method("amem").r == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="r >= 1"):
            get_method("amem", r=bad)
    assert methods("amem,mem1", streams=False) == ["amem", "mem1"]
    SFTConfig(method="amem")  # a choice of its method field
    cfg = TrainConfig(method="amem").validate()
    assert (cfg.resolved_packing(), cfg.resolved_credit()) == ("mem1_exact", "grpo")
    with pytest.raises(ValueError, match="method_kwargs"):
        TrainConfig(method="amem", method_kwargs={"r": 0}).validate()


# ------------------------------------------------------------------------------ teacher
def test_teacher_solves_tasks_with_a_context_far_below_reacts(runs):
    """The flawless teacher: valid, EM 1.0 at k = 1, 2, 4; its peak context (system prompt excluded) at
    k = 4 is under 0.4 x ReAct's on the same tasks, and grows with k far slower."""
    mean_peak = {}
    for k in (1, 2, 4):
        for name in ("amem", "react"):
            trajs = runs[name, k]
            assert all(t.valid for t in trajs), [t.reason for t in trajs if not t.valid][:3]
            assert sum(map(slot_em, trajs)) / len(trajs) == 1.0, (name, k)
            mean_peak[name, k] = sum(map(peak, trajs)) / len(trajs)
    assert mean_peak["amem", 4] < 0.4 * mean_peak["react", 4], mean_peak
    assert mean_peak["amem", 4] - mean_peak["amem", 1] < 0.25 * (mean_peak["react", 4] - mean_peak["react", 1])


def test_context_is_the_questions_retrieved_notes_and_the_last_step(runs):
    """c_t = instruction + questions | <memory> N_t </memory> | S_{t-1} A_{t-1} | O_{t-1}: the only refs are
    the previous call's output and observation, verbatim; N_t holds at most r notes per question, all
    written before the previous call, each shown once and in the order written, and they are the
    notes of ``Trajectory.info``."""
    for k in (1, 2, 4):
        for traj in runs["amem", k]:
            notes, shown = traj.info[INFO_NOTES], traj.info[INFO_SHOWN]
            assert traj.info[INFO_NOTE_CALLS] == list(range(len(traj.calls)))  # one note per call
            assert notes[0] == NOTHING_YET and len(shown) == len(traj.calls)
            for i, call in enumerate(traj.calls):
                assert TOK.decode(call.context_ids) == call.context_text
                assert {(j, what) for _, _, j, what in call.context_refs} == (
                    {(i - 1, "output"), (i - 1, "observation")} if i else set()
                )
                for s, e, j, what in call.context_refs:
                    src = traj.calls[j].output_ids if what == "output" else traj.calls[j].observation_ids
                    assert call.context_ids[s:e] == src
                assert extract(call.output_text, "note") == notes[i]
                [(s, e)] = call.context_char_spans["memory"]
                assert call.context_text[s:e] == f"<memory>{' '.join(notes[j] for j in shown[i])}</memory>\n"
                assert shown[i] == sorted(shown[i]) and all(j < i - 1 for j in shown[i])
                assert len(shown[i]) <= 3 * k and len({notes[j] for j in shown[i]}) == len(shown[i])


def test_teacher_answers_from_what_its_context_shows(runs, world, env):
    """Every answer slot the teacher writes is in its answer call's context: the retrieved notes, the
    previous note or the last results (not only in the teacher's private state), at k up to 8; with
    r = 1 note per question some are not."""

    def hidden(trajs):
        n = 0
        for t in trajs:
            last, prev = t.calls[-1], t.calls[-2]
            [(s, e)] = last.context_char_spans["memory"]
            seen = last.context_text[s:e] + extract(prev.output_text, "note") + prev.observation_text
            n += sum(a not in seen for a in t.answer.split("; "))
        return n

    for k in (1, 2, 4):
        assert hidden(runs["amem", k]) == 0, k
    tasks = make_tasks(world, 8, k=8, seed=11)
    assert hidden(rollout("amem", tasks, env)) == 0
    assert hidden(rollout(get_method("amem", r=1), tasks, env)) > 0


def test_note_store_ranks_as_the_kits_bm25_retriever():
    """NoteStore.top scores notes with the kit's BM25 formula: the same ranking as ``BM25Retriever``
    indexing the same notes (score > 0 only, ties to the older note); ``upto`` hides the newest."""
    texts = [
        NOTHING_YET,
        "Drokthosal Kumkem works: Trekshes Industries.",
        "Berpal Group founder => Nolthul Shirve.",
        "Drokthosal Kumkem works => Shorpi Vepo.",
        "Poge population: 627453; 411116.",
        "Poge population => Poge.",
    ]
    store = NoteStore()
    for i, t in enumerate(texts):
        store.add(t, call=i)
    index = make_retriever("bm25", [Passage(id=str(i), title="", text=t) for i, t in enumerate(texts)])
    for q in (
        "Who is the founder of the employer of Drokthosal Kumkem?",
        "Which city has a larger population, Poge or Beval?",
        "Who is the founder of Berpal Group?",
    ):
        want = [int(h.passage.id) for h in index.search(q, 3)]
        assert store.top(q, 3, len(texts)) == want and want, q
    assert store.top("Drokthosal Kumkem employer", 5, 3) == [1]  # note 3 is past ``upto``
    assert store.top("no shared words", 3, 6) == [] and store.top("Poge", 3, 0) == []
    store.add("Poge population => Poge.", call=6)  # a repeated text is shown once
    assert store.retrieve(["Which city, Poge or Beval?", "Poge?"], 3, 7) == [4, 5]


# ------------------------------------------------------------------------------ parser and rewards
GOOD = [
    ("<note>Kumkem works: Trekshes.</note><search>Trekshes founder</search>", "search", "Trekshes founder"),
    ("<note>a => b.</note>\n<answer>b; c</answer>", "answer", "b; c"),
]
BAD = [
    ("", "empty output"),
    ("<search>q</search>", "missing <note>"),
    ("<search>q</search><note>n</note>", "<note> must come before <search>"),
    ("<note>n<search>q</search>", "unclosed <note>"),
    ("<note> </note><search>q</search>", "empty note"),
    ("<note>n</note>", "no action tag"),
    ("<note>n</note><search>q</search><answer>a</answer>", "both"),
    ("<note>n</note><answer> </answer>", "empty answer"),
]


def test_parse():
    m = get_method("amem")
    for text, action, arg in GOOD:
        p = m.parse(text)
        assert p.ok and p.action == action and p.argument == arg and p.fields["note"], (text, p)
    for text, reason in BAD:
        p = m.parse(text)
        assert not p.ok and reason in p.error, (text, p.error)
    assert not m.parse(None).ok  # type: ignore[arg-type]


def test_rewards_and_invalid_turns_follow_mem1(world, env):
    """MEM1's reward (one point per correct slot); a malformed output, an empty note or a wrong answer
    count is an invalid turn with its reason and reward 0."""
    task = make_tasks(world, 1, k=2, seed=7)[0]
    gold = [q.answers[0] for q in task.questions]
    r = lambda text: run_scripted("amem", task, env, [text]).reward  # noqa: E731
    assert r(f"<note>n</note><answer>{gold[0]}; {gold[1]}</answer>") == 2.0
    assert r(f"<note>n</note><answer>{gold[0]}; wrong</answer>") == 1.0
    for texts, reason in (
        (["<note>n</note><answer>only one</answer>"], "wrong answer count"),
        (["<note></note><answer>a; b</answer>"], "empty note"),
        (["<note>n</note><search>x</search>", "<search>y</search>"], "missing <note>"),
        (["I think it is Paris."], "no action tag"),
        (["<note>n</note><search>x</search>"] * 3, "max turns"),
    ):
        traj = run_scripted("amem", task, env, texts, max_turns=3)
        assert not traj.valid and reason in traj.reason and traj.reward == 0.0, (texts, traj.reason)
        assert not traj.calls[-1].valid


@pytest.mark.fuzz
@settings(max_examples=depth(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=60), TAGGY))
def test_parser_never_raises(text):
    p = get_method("amem").parse(text)
    assert isinstance(p, Parsed) and (p.ok or p.error)
    if p.ok:
        assert p.argument.strip() and p.fields["note"].strip()


NOTED = st.builds(lambda note, call: f"<note>{note}</note>{call}", st.text(max_size=12), RANDOM_CALLS)


@pytest.mark.fuzz
@settings(
    max_examples=depth(40, fuzz=1000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_engine_turns_any_output_into_a_trajectory(data, world, env):
    """Random outputs (test_agents.py's, and the same with a random note in front) through the engine:
    each episode ends with a trajectory, an invalid one with its reason; storing and retrieving any note
    text never raises."""
    tasks = make_tasks(world, 2, k=2, seed=data.draw(st.integers(0, 50)))

    def draw(strategy):
        return data.draw(st.one_of(strategy, NOTED))

    trajs = run_rollouts(
        get_method("amem"), tasks, env, Drawn(draw), TOK, RolloutConfig(max_turns=4, max_context_tokens=NO_LIMIT)
    )
    assert len(trajs) == len(tasks)
    assert all(t.valid or t.reason for t in trajs), [(t.reason, t.calls[-1].output_text) for t in trajs]


# ------------------------------------------------------------------------------ the teacher's flaws
def test_teacher_takes_every_knob_and_flaw(world, env):
    """Every OracleConfig flaw and knob runs (valid episodes); flaws lower EM; "forget_earlier" at rate 1
    answers the earlier slot "unknown" and notes it ("=> unknown."), and at rate 0 is the perfect teacher."""
    tasks = make_tasks(world, 12, k=2, seed=41)
    perfect = rollout("amem", tasks, env)
    for flaw in FLAWS:
        for knobs in ({}, dict(p_drop_fact=0.3, p_wasted_search=0.3, p_wrong_answer=0.2, memory="ledger")):
            trajs = rollout(
                "amem", tasks, env, OracleConfig(flaw=flaw, show_comparison=True, **knobs), max_turns=30, seed=3
            )
            assert all(t.valid for t in trajs), (flaw, [t.reason for t in trajs if not t.valid])
            em = sum(map(slot_em, trajs)) / len(trajs)
            assert em == 1.0 if flaw == "none" and not knobs else em < 1.0, (flaw, knobs, em)
    never = rollout("amem", tasks, env, OracleConfig(flaw="forget_earlier", flaw_rate=0.0))
    assert [[c.output_text for c in t.calls] for t in never] == [[c.output_text for c in t.calls] for t in perfect]
    for traj, task in zip(rollout("amem", tasks, env, OracleConfig(flaw="forget_earlier", flaw_rate=1.0)), tasks):
        key = task.questions[0].decomposition[0].query
        assert traj.answer == f"unknown; {task.questions[1].answers[0]}", traj.answer
        assert f"{key} => unknown." in " ".join(traj.info[INFO_NOTES])
