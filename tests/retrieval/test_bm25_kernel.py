"""The MaxScore top-k kernel (memkit.retrieval.bm25_topk) against its loop reference, on the world
and on random corpora built to prune (Zipf word frequencies) or to tie (tiny vocabularies); the
query tokenizer against bm25s'; the numba backend of BM25Retriever against the full sort."""

import random

import numpy as np
import pytest

pytest.importorskip("numba")

from memkit.retrieval import bm25_topk  # noqa: E402
from memkit.retrieval.bm25 import BM25Retriever  # noqa: E402
from memkit.world import make_questions, make_world  # noqa: E402
from memkit.world.schema import Passage  # noqa: E402


def arrays(r: BM25Retriever):
    s = r._bm25.scores
    return s["data"], s["indptr"], s["indices"]


def kernel(r: BM25Retriever, queries, k, n_threads=1):
    data, indptr, indices = arrays(r)
    colmax = bm25_topk.column_max(data, indptr)
    return bm25_topk.topk_batch(data, indptr, indices, colmax, len(r), queries, k, n_threads)


def loop(r: BM25Retriever, queries, k):
    return [bm25_topk.topk_loop(*arrays(r), q, k) for q in queries]


def ids(hits):
    return [[(h.passage.id, h.score) for h in row] for row in hits]


def zipf_corpus(rng, n_docs, vocab, length):
    """Words drawn with probability ~ 1 / rank: a few in most passages, most in a handful."""
    words = [f"w{i}" for i in range(vocab)]
    weights = [1 / (i + 1) for i in range(vocab)]
    return [Passage(str(i), "", " ".join(rng.choices(words, weights, k=rng.randint(1, length)))) for i in range(n_docs)]


def test_kernel_equals_the_loop_reference_on_the_world():
    world = make_world(0)
    r = BM25Retriever(world.passages, backend="numpy")
    qs = make_questions(world, 80, seed=5)
    queries = [q for q in r.query_ids([q.text for q in qs] + [s.query for q in qs for s in q.decomposition]) if q]
    queries += [q + q[:1] for q in queries[:20]]  # a repeated word counts twice
    for k in (1, 3, 10, bm25_topk.SMALL_K + 1, len(r) + 5):
        found, skipped = kernel(r, queries, k)
        assert found == loop(r, queries, k)
        assert skipped.shape == (len(queries),)
    assert kernel(r, queries, 3)[1].sum() > 0  # MaxScore skipped some common words' postings


@pytest.mark.parametrize("seed", range(4))
def test_kernel_equals_the_loop_reference_on_zipf_corpora(seed):
    """Long common-word postings against short rare ones: terms skipped, candidates looked up in
    long postings and scanned in short ones, candidates re-pruned."""
    rng = random.Random(seed)
    r = BM25Retriever(zipf_corpus(rng, 1500, 300, 30), backend="numpy")
    vocab = sorted(r._tok.get_vocab_dict().values())
    vocab.remove(r._empty_id)
    queries = [rng.choices(vocab[:40], k=2) + rng.choices(vocab, k=rng.randint(1, 6)) for _ in range(150)]
    for k in (1, 2, 5, 30, 200):
        found, skipped = kernel(r, queries, k)
        assert found == loop(r, queries, k)
    assert kernel(r, queries, 1)[1].sum() > 0


def test_kernel_equals_the_loop_reference_with_many_ties():
    rng = random.Random(2)
    for _ in range(10):
        words = [f"w{i}" for i in range(rng.randint(2, 6))]
        r = BM25Retriever([Passage(str(i), "", " ".join(rng.choices(words, k=rng.randint(1, 3)))) for i in range(80)])
        queries = [r.query_ids([" ".join(rng.choices(words, k=rng.randint(1, 3)))])[0] for _ in range(8)]
        for k in (1, 3, 12, 100):
            assert kernel(r, queries, k)[0] == loop(r, queries, k)


def test_threads_give_the_same_hits():
    rng = random.Random(7)
    r = BM25Retriever(zipf_corpus(rng, 800, 200, 20), backend="numpy")
    queries = [r.query_ids([f"w{rng.randrange(200)} w{rng.randrange(20)} w{rng.randrange(5)}"])[0] for _ in range(60)]
    queries = [q for q in queries if q]
    (one, skipped_one), (two, skipped_two) = kernel(r, queries, 3), kernel(r, queries, 3, n_threads=2)
    assert two == one == loop(r, queries, 3)
    np.testing.assert_array_equal(skipped_two, skipped_one)


def test_kernel_inputs():
    r = BM25Retriever([Passage("a", "", "alpha beta"), Passage("b", "", "beta gamma")], backend="numpy")
    assert kernel(r, [], 3)[0] == []
    with pytest.raises(ValueError, match="at least one term"):
        kernel(r, [[0], []], 3)
    data, indptr, _ = arrays(r)
    np.testing.assert_array_equal(
        bm25_topk.column_max(data, indptr),
        [data[indptr[t] : indptr[t + 1]].max(initial=0) for t in range(len(indptr) - 1)],
    )


def test_query_ids_equal_bm25s_tokenizer():
    world = make_world(1)
    r = BM25Retriever(world.passages, backend="numpy")
    queries = [q.text for q in make_questions(world, 40, seed=1)] + [
        "", "the of and", "zzz qqq", "Who's THE Mayor?!", "naïve café 2026 x", "a1 b2 __init__ foo-bar", "\t\n",
    ]  # fmt: skip
    assert r.query_ids(queries) == r.query_ids_bm25s(queries)


def test_numba_backend_equals_the_full_sort_with_ties_and_bad_inputs():
    rng = random.Random(3)
    for _ in range(6):
        words = [f"w{i}" for i in range(rng.randint(2, 5))]
        ps = [Passage(str(i), "", " ".join(rng.choices(words, k=rng.randint(1, 3)))) for i in range(50)]
        r = BM25Retriever(ps, backend="numba")
        queries = [" ".join(rng.choices(words, k=rng.randint(1, 3))) for _ in range(6)] + ["", "the", "zzz"]
        for k in (1, 4, 60):  # 60: k past the corpus
            assert ids(r.search_batch(queries, k)) == ids(r.search_batch_full_sort(queries, k))
    ps = [Passage(str(i), "", "zebra stripes") for i in range(20)] + [Passage("x", "", "zebra zebra")]
    r = BM25Retriever(ps, backend="numba")
    assert [h.passage.id for h in r.search("zebra", k=4)] == ["x", "0", "1", "2"]
    assert r.search("", k=3) == [] and r.search("zzz", k=3) == []
    with pytest.raises(ValueError, match="positive int"):
        r.search("zebra", k=0)
