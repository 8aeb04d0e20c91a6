"""memkit.lab.real: real questions over a real corpus through the same rollouts and metrics (the
fixtures in tests/fixtures/real are the real schemas: DPR topics lines, ovos' Wikipedia leads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memkit.lab.evaluation import evaluate
from memkit.lab.kit import load_kit
from memkit.lab.real import REAL_K_DOCS, real_kit, real_task_sets

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


def test_answerable_sets_carry_the_hop_the_teacher_follows(kit):
    sets = real_task_sets(str(TOPICS), (1, 2), 4, retriever=kit.env.retriever, answerable=True)
    assert sorted(sets) == [1, 2] and [len(sets[k]) for k in (1, 2)] == [4, 4]
    for t in sets[2]:
        assert t.k == 2 and t.prompt.startswith("Answer each of the following questions:")
        for q in t.questions:
            (hop,) = q.decomposition  # search the question, read the answer in the evidence lead
            lead = next(p for p in kit.env.retriever.passages if p.id == hop.passage_id)
            assert hop.query == q.text and hop.answer.lower() in lead.text.lower()
    with pytest.raises(ValueError, match="needs the corpus's retriever"):
        real_task_sets(str(TOPICS), (1,), 2, answerable=True)


def test_the_oracle_answers_real_composites_and_mem1_holds_its_context(kit):
    """The scripted teacher solves every kept question (its evidence is in the first search's top 5);
    MEM1's peak context stays below ReAct's once two questions share an episode."""
    sets = real_task_sets(str(TOPICS), (1, 2), 4, retriever=kit.env.retriever, answerable=True)
    res = {m: evaluate(m, kit, policy="oracle", task_sets=sets) for m in ("mem1", "react")}
    for m in res:
        assert [res[m][k][0]["em"] for k in (1, 2)] == [1.0, 1.0]
    assert res["mem1"][2][0]["peak_tokens"] < res["react"][2][0]["peak_tokens"]
