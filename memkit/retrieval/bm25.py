"""BM25 sparse retrieval on ``bm25s`` (the papers' local-wiki baseline retriever family).

Score of passage d for query q (Lucene variant, bm25s' default; k1 = 1.5, b = 0.75):

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

where tokens are lower-cased ``\\w\\w+`` words with English stop-words removed (bm25s'
``Tokenizer(lower=True, splitter=r"(?u)\\b\\w\\w+\\b", stopwords="english")``, no stemming;
query words the corpus never uses are dropped), the sum runs over query tokens *with
repetition*, |d| is d's token count and avgdl the corpus mean. ``bm25_scores_loop`` evaluates
this formula with plain Python loops; the test suite checks that the sparse bm25s index gives
the same numbers.

Top-k (``search_batch``), exactly the hits of ``topk_full_sort`` (the per-query full sort memkit
used before, kept as the reference and the benchmark's baseline): passages ordered by
``(-score, corpus row)``, so ties go to the earlier passage, and passages with score 0 (no query
word in common) are never returned, so results are deterministic and never pure noise.

- numba backend: :mod:`memkit.retrieval.bm25_topk`'s MaxScore kernel over bm25s' inverted index
  (only the query terms' postings, most of the common words' skipped; exact float32 scores);
- numpy backend: one ``bm25s.BM25.retrieve(..., k=k + TIE_SLACK)`` call (``argpartition`` per
  query), the fetched rows re-ordered by ``(-score, row)``; if the tie at rank k could reach past
  them (the last fetched score equals the k-th), that query falls back to the full sort.

numba compiles the kernel on its first use (~10-30 s on 2 busy cores) and caches it on disk
(``cache=True``: later processes load it in under a second); a small corpus never earns back that
first compile: ``backend="auto"`` takes numba from ``NUMBA_MIN_DOCS`` passages
on (when numba is installed), bm25s' numpy backend below. An index is saved to a directory
(bm25s' arrays, the tokenizer's vocabulary, the passages as JSONL) and loaded without
re-tokenising the corpus (:meth:`BM25Retriever.save` / :meth:`BM25Retriever.load`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from memkit.core.io import atomic_dir
from memkit.retrieval.base import Hit, check_k, check_passages, check_query, passage_text
from memkit.retrieval.corpus import JsonlPassages, write_passages_jsonl
from memkit.world.schema import Passage

K1, B = 1.5, 0.75
_SPLIT = r"(?u)\b\w\w+\b"  # bm25s' default splitter
TIE_SLACK = 8  # rows fetched past k, so ties at rank k rarely need the full-sort fallback
NUMBA_MIN_DOCS = 20_000  # "auto" compiles numba's kernel only for corpora at least this big
BACKENDS = ("auto", "numpy", "numba")
FORMAT = "memkit-bm25/1"


def numba_available() -> bool:
    import bm25s

    return bool(getattr(bm25s, "NUMBA_AVAILABLE", False))


def pick_backend(backend: str, n_docs: int) -> str:
    """``"auto"`` -> numba for corpora of ``NUMBA_MIN_DOCS`` or more when installed, else numpy."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "numba" if n_docs >= NUMBA_MIN_DOCS and numba_available() else "numpy"
    if backend == "numba" and not numba_available():
        raise ImportError("backend='numba' needs numba: pip install numba (or use backend='numpy')")
    return backend


def _tokenizer(stopwords="english"):
    from bm25s.tokenization import Tokenizer

    return Tokenizer(lower=True, splitter=_SPLIT, stopwords=stopwords)


class BM25Retriever:
    """BM25 over ``title + text`` of each passage (see the module docstring for score and top-k).

    ``backend``: ``"auto"`` | ``"numpy"`` | ``"numba"`` (the top-k paths above);
    ``n_threads``: queries scored in parallel by the numba backend (1: serial).
    """

    name = "bm25"

    def __init__(
        self,
        passages: Sequence[Passage],
        k1: float = K1,
        b: float = B,
        backend: str = "auto",
        n_threads: int = 1,
        _index=None,
    ):
        import bm25s

        self.passages = passages if _index is not None else check_passages(passages)
        self.k1, self.b = k1, b
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise ValueError(f"n_threads must be a positive int, got {n_threads!r}")
        self.n_threads = n_threads
        self.backend = pick_backend(backend, len(self.passages))
        if _index is None:
            self._tok = _tokenizer()
            ids = self._tok.tokenize(
                [passage_text(p) for p in self.passages], update_vocab=True, return_as="ids", show_progress=False
            )
            self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene", backend=self.backend)
            self._bm25.index(ids, show_progress=False)
        else:
            self._tok, self._bm25 = _index
            self._bm25.backend = self.backend
        self._empty_id = self._tok.get_vocab_dict().get("")  # bm25s' placeholder for empty docs/queries
        self._colmax = None  # each term's largest contribution (the kernel's bounds), on first use
        self.n_fallbacks = 0  # numpy backend: queries whose tie at rank k went past the fetched rows
        self.n_skipped_terms = 0  # numba backend: query terms MaxScore never scanned for new passages

    def __len__(self) -> int:
        return len(self.passages)

    def query_ids(self, queries: Sequence[str]) -> list[list[int]]:
        """Token ids of each query; words outside the vocabulary (stop-words among them) are dropped.

        The ids bm25s' tokenizer gives (``query_ids_bm25s``, checked equal by the tests) without its
        per-word branches: its vocabulary never holds a stop-word (indexing drops them first) and the
        splitter never yields its empty-document placeholder ``""``."""
        vocab, split = self._tok.get_vocab_dict(), self._tok.splitter
        return [[i for w in split(q.lower()) if (i := vocab.get(w)) is not None] for q in queries]

    def query_ids_bm25s(self, queries: Sequence[str]) -> list[list[int]]:
        """Reference for :meth:`query_ids`: one bm25s tokenizer call, its placeholder id removed."""
        ids = self._tok.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        return [[i for i in q if i != self._empty_id] for q in ids]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (float32, corpus order)."""
        ids = self.query_ids([check_query(query)])[0]
        if not ids:
            return np.zeros(len(self.passages), dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_batch([check_query(query)], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Top-``k`` hits per query, without scoring or sorting the whole corpus (module docstring)."""
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; for one query call search(query, k)")
        queries = [check_query(q) for q in queries]
        check_k(k)
        ids = self.query_ids(queries)
        out: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(ids) if q]  # no known word: nothing scores above 0
        if not live:
            return out
        if self.backend == "numba":
            rows = self._topk_kernel([ids[i] for i in live], k)
        else:
            rows = self._topk_retrieve([ids[i] for i in live], k)
        for i, hits in zip(live, rows):
            out[i] = [Hit(self.passages[j], s) for j, s in hits]
        return out

    def _topk_kernel(self, ids: list[list[int]], k: int) -> list[list[tuple[int, float]]]:
        from memkit.retrieval.bm25_topk import column_max, topk_batch

        s = self._bm25.scores
        if self._colmax is None:
            self._colmax = column_max(s["data"], s["indptr"])
        found, skipped = topk_batch(
            s["data"], s["indptr"], s["indices"], self._colmax, len(self), ids, k, self.n_threads
        )
        self.n_skipped_terms += int(skipped.sum())
        return found

    def _topk_retrieve(self, ids: list[list[int]], k: int) -> list[list[tuple[int, float]]]:
        n = len(self.passages)
        fetch = min(k + TIE_SLACK, n)
        docs, scores = self._bm25.retrieve(ids, k=fetch, sorted=True, show_progress=False, n_threads=self.n_threads)
        return [self._topk_rows(q, np.asarray(d), np.asarray(s), k, fetch < n) for q, d, s in zip(ids, docs, scores)]

    def _topk_rows(self, ids, docs, scores, k: int, truncated: bool) -> list[tuple[int, float]]:
        """Re-order fetched ``(docs, scores)`` by ``(-score, row)``, drop zeros, keep ``k``; fall back
        to the full sort when a tie at rank k may continue past the fetched rows."""
        order = np.lexsort((docs, -scores))
        docs, scores = docs[order], scores[order]
        if truncated and len(scores) > k and scores[k - 1] > 0 and scores[-1] == scores[k - 1]:
            self.n_fallbacks += 1
            return topk_full_sort(self._bm25.get_scores_from_ids(ids), k)
        return [(int(j), float(s)) for j, s in zip(docs[:k], scores[:k]) if s > 0]

    def search_batch_full_sort(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """The reference: every passage scored and the whole corpus sorted, one query at a time
        (memkit's ``search_batch`` before bm25s' top-k; the benchmark's baseline)."""
        check_k(k)
        return [[Hit(self.passages[j], s) for j, s in topk_full_sort(self.scores(q), k)] for q in queries]

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path) -> Path:
        """Write the index to directory ``path`` (atomically: a crash leaves the old one or none)."""
        path = Path(path)
        with atomic_dir(path) as tmp:
            self._bm25.save(tmp, show_progress=False)
            self._tok.save_vocab(tmp)
            self._tok.save_stopwords(tmp)
            write_passages_jsonl(self.passages, tmp / "passages.jsonl")
            meta = {"format": FORMAT, "k1": self.k1, "b": self.b, "splitter": _SPLIT, "n": len(self.passages)}
            (tmp / "memkit.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path, backend: str = "auto", n_threads: int = 1) -> "BM25Retriever":
        """An index written by :meth:`save`; passages are read from its JSONL on demand."""
        import bm25s

        path = Path(path)
        meta_path = path / "memkit.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{path} is not a saved BM25 index (no memkit.json); write one with .save(path)")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT or meta.get("splitter") != _SPLIT:
            raise ValueError(f"{path} holds {meta.get('format')!r}, this memkit reads {FORMAT!r}: rebuild the index")
        tok = _tokenizer()
        tok.load_vocab(path)
        tok.load_stopwords(path)
        chosen = pick_backend(backend, meta["n"])  # before bm25s.load, which checks the saved one
        index = bm25s.BM25.load(path, override_params={"backend": chosen}, show_progress=False, verbosity=0)
        passages = JsonlPassages(path / "passages.jsonl")
        if len(passages) != meta["n"] or index.scores["num_docs"] != meta["n"]:
            raise ValueError(f"{path}: {len(passages)} passages for an index of {meta['n']}: rebuild the index")
        return cls(passages, meta["k1"], meta["b"], chosen, n_threads, _index=(tok, index))


def topk_full_sort(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Reference top-k: a stable sort of the whole score vector (ties by corpus order), zeros dropped."""
    order = np.argsort(-scores, kind="stable")[:k]
    return [(int(i), float(scores[i])) for i in order if scores[i] > 0]


def tokenize(text: str) -> list[str]:
    """Reference tokeniser: lower-case ``\\w\\w+`` words minus bm25s' English stop-words."""
    from bm25s.stopwords import STOPWORDS_EN

    stop = set(STOPWORDS_EN)
    return [w for w in re.findall(_SPLIT, text.lower()) if w not in stop]


def bm25_scores_loop(query: str, passages: Sequence[Passage], k1: float = K1, b: float = B) -> list[float]:
    """Naive reference for :meth:`BM25Retriever.scores`: the module-docstring formula, one
    passage and one query token at a time."""
    docs = [tokenize(passage_text(p)) for p in passages]
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    df: Counter = Counter()
    for d in docs:
        df.update(set(d))
    out = []
    for d in docs:
        tf = Counter(d)
        s = 0.0
        for t in tokenize(query):
            if tf[t] == 0:
                continue
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            s += idf * tf[t] / (tf[t] + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out
