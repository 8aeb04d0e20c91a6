"""memkit.lab.real: real questions over a real corpus through the same rollouts and metrics (the
fixtures in tests/fixtures/real are the real schemas: DPR topics lines, ovos' Wikipedia leads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memkit.lab.evaluation import evaluate
from memkit.lab.kit import load_kit
from memkit.lab.real import REAL_K_DOCS, data_kit, question_set, real_kit
from memkit.rl.groups import DataConfig
from memkit.world import held_out_tasks, make_questions, make_tasks, training_tasks
from memkit.world.composite import QuestionSet
from memkit.world.splits import question_split

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
TOPICS, LEADS = REAL / "topics.dpr.nq.test.txt", REAL / "summaries_en-us.json"


@pytest.fixture(scope="module")
def kit():
    return real_kit(load_kit(), str(LEADS))[0]


def test_real_kit_searches_the_corpus_and_keeps_the_tokenizer(kit, tmp_path):
    base = load_kit()
    assert kit.tokenizer.get_vocab() == base.tokenizer.get_vocab() and kit.env.k == REAL_K_DOCS
    hits = kit.env.retriever.search("capital of Greenland", 1)
    assert hits[0].passage.title == "Greenland"
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no passages"):
        real_kit(base, str(tmp_path / "empty.jsonl"))


def real_sets(kit, n=4):
    """Held-out composites at k = 1, 2 of the fixture's answerable questions (a file: used whole)."""
    return {k: held_out_tasks(kit.world, n, k) for k in (1, 2)}


@pytest.fixture(scope="module")
def qkit():
    return data_kit(load_kit(), DataConfig(tasks=str(TOPICS), corpus=str(LEADS), answerable=True))


def test_answerable_sets_carry_the_hop_the_teacher_follows(qkit):
    kit = qkit
    sets = real_sets(kit)
    assert [len(sets[k]) for k in (1, 2)] == [4, 4]
    for t in sets[2]:
        assert t.k == 2 and t.prompt.startswith("Answer each of the following questions:")
        for q in t.questions:
            (hop,) = q.decomposition  # search the question, read the answer in the evidence lead
            lead = next(p for p in kit.env.retriever.passages if p.id == hop.passage_id)
            assert hop.query == q.text and hop.answer.lower() in lead.text.lower()
    with pytest.raises(ValueError, match="give --corpus too"):
        data_kit(load_kit(), DataConfig(tasks=str(TOPICS), answerable=True))


def test_the_oracle_answers_real_composites_and_mem1_holds_its_context(qkit):
    """The scripted teacher solves every kept question (its evidence is in the first search's top 5);
    MEM1's peak context stays below ReAct's once two questions share an episode. ``evaluate`` draws
    the held-out tasks from the kit's world: the real questions."""
    res = {m: evaluate(m, qkit, objectives=(1, 2), n_tasks=4, policy="oracle") for m in ("mem1", "react")}
    for m in res:
        assert [res[m][k][0]["em"] for k in (1, 2)] == [1.0, 1.0]
    assert res["mem1"][2][0]["peak_tokens"] < res["react"][2][0]["peak_tokens"]


def test_a_question_set_stands_where_a_world_stands():
    """``make_tasks`` on a QuestionSet composes MEM1 tasks of its questions. One pool split by a hash of
    the id ("offline") gives SFT, RL and evaluation disjoint questions; a file is a split already and
    every role draws all of it."""
    pool = tuple(make_questions(load_kit().world, 300, seed=0))  # many questions; the real fixture holds 6
    pooled = QuestionSet("offline-like", pool, hash_splits=True)
    sft = {q.id for t in training_tasks(pooled, (1, 2), 40, seed=0) for q in t.questions}
    rl = {q.id for t in training_tasks(pooled, (2,), 20, seed=0, split="rl") for q in t.questions}
    test = {q.id for t in held_out_tasks(pooled, 20, 2) for q in t.questions}
    assert {question_split(i) for i in sft} == {"sft"} and {question_split(i) for i in rl} == {"rl"}
    assert {question_split(i) for i in test} == {"test"}
    whole = QuestionSet(str(TOPICS), pool, hash_splits=False)
    drawn = {q.id for t in make_tasks(whole, 60, 2, seed=3, split="test") for q in t.questions}
    assert {question_split(i) for i in drawn} >= {"sft", "test"}  # the split is the file's own
    a, b = held_out_tasks(whole, 5, 2), held_out_tasks(whole, 3, 2)
    assert [t.id for t in a[:3]] == [t.id for t in b] and all(t.k == 2 for t in a)


def test_data_kit_keeps_the_synthetic_world_where_data_is_default(tmp_path):
    base = load_kit()
    kit = data_kit(base, DataConfig())
    assert kit.world is base.world and kit.env is base.env
    only_questions = data_kit(base, DataConfig(tasks=str(TOPICS)))
    assert isinstance(only_questions.world, QuestionSet) and only_questions.env is base.env
    (tmp_path / "none.txt").write_text("")
    with pytest.raises(ValueError, match="no usable questions"):
        question_set(str(tmp_path / "none.txt"))
