"""BM25 at corpus scale: bm25s' batched top-k against the full-sort reference, the tie rule,
the backend knob, and an index saved to a directory and loaded back."""

import random

import numpy as np
import pytest

from memkit.retrieval import bm25
from memkit.retrieval.bm25 import TIE_SLACK, BM25Retriever, pick_backend
from memkit.world import make_questions, make_world
from memkit.world.schema import Passage

needs_numba = pytest.mark.skipif(not bm25.numba_available(), reason="numba not installed (pip install numba)")


def ids(hits):
    return [[(h.passage.id, h.score) for h in row] for row in hits]


def world_queries(world, n=120):
    qs = make_questions(world, n, seed=3)
    return [q.text for q in qs] + [s.query for q in qs for s in q.decomposition] + ["", "the of", "zzz qqq"]


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=needs_numba)])
def test_topk_equals_the_full_sort_on_the_world(backend):
    """Same ids, same order, same float32 scores as memkit's former per-query full sort."""
    world = make_world(0)
    r = BM25Retriever(world.passages, backend=backend)
    assert r.backend == backend
    queries = world_queries(world)
    for k in (1, 3, 5, 20):
        assert ids(r.search_batch(queries, k)) == ids(r.search_batch_full_sort(queries, k))


def test_topk_equals_the_full_sort_with_many_ties():
    """Tiny vocabularies make long runs of equal scores: some straddle rank k past the fetched
    k + TIE_SLACK rows (the fallback), others sit inside them (re-ordered by row)."""
    rng = random.Random(1)
    fallbacks = seen = 0
    for trial in range(8):
        words = [f"w{i}" for i in range(rng.randint(2, 6))]
        ps = [Passage(str(i), "", " ".join(rng.choices(words, k=rng.randint(1, 3)))) for i in range(60)]
        r = BM25Retriever(ps)
        for _ in range(6):
            q = " ".join(rng.choices(words, k=rng.randint(1, 3)))
            k = rng.randint(1, 12)
            s, fetch = np.sort(r.scores(q))[::-1], min(k + TIE_SLACK, len(ps))
            fallbacks += int(fetch < len(ps) and s[k - 1] > 0 and s[fetch - 1] == s[k - 1])
            assert ids(r.search_batch([q], k)) == ids(r.search_batch_full_sort([q], k))
        seen += r.n_fallbacks
    assert seen == fallbacks > 0  # the fallback path ran, exactly when a tie reached past the slack


def test_ties_break_by_corpus_order_past_the_slack():
    ps = [Passage(str(i), "", "zebra stripes") for i in range(3 * TIE_SLACK)] + [Passage("x", "", "zebra zebra")]
    r = BM25Retriever(ps)
    assert [h.passage.id for h in r.search("zebra", k=4)] == ["x", "0", "1", "2"]
    assert [h.passage.id for h in r.search("stripes", k=3)] == ["0", "1", "2"]


def test_backend_knob():
    assert pick_backend("auto", 10) == "numpy"
    assert pick_backend("numpy", 10**6) == "numpy"
    with pytest.raises(ValueError, match="auto, numpy, numba"):
        pick_backend("jax", 10)
    with pytest.raises(ValueError, match="n_threads"):
        BM25Retriever([Passage("a", "", "x y")], n_threads=0)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("numba", marks=needs_numba)])
def test_save_and_load_give_the_same_results(tmp_path, backend):
    world = make_world(1)
    r = BM25Retriever(world.passages)
    assert r.save(tmp_path / "idx") == tmp_path / "idx"
    back = BM25Retriever.load(tmp_path / "idx", backend=backend)
    assert len(back) == len(r) and back.backend == backend
    assert back.passages[5] == world.passages[5] and back.passages[-1] == world.passages[-1]
    queries = world_queries(world, 40)
    assert ids(back.search_batch(queries, 5)) == ids(r.search_batch(queries, 5))
    np.testing.assert_array_equal(back.scores(queries[0]), r.scores(queries[0]))
    r.save(tmp_path / "idx")  # overwriting an index replaces it whole
    assert not [p for p in tmp_path.iterdir() if p.name != "idx"]


def test_load_errors_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="save"):
        BM25Retriever.load(tmp_path)
    r = BM25Retriever([Passage("a", "T", "alpha beta"), Passage("b", "", "gamma")])
    r.save(tmp_path / "idx")
    (tmp_path / "idx" / "passages.jsonl").write_text('{"id": "a", "title": "T", "text": "alpha beta"}\n')
    with pytest.raises(ValueError, match="rebuild"):
        BM25Retriever.load(tmp_path / "idx")
