"""BM25 sparse retrieval on ``bm25s`` (the papers' local-wiki baseline retriever family).

Score of passage d for query q (Lucene variant, bm25s' default; k1 = 1.5, b = 0.75):

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

where tokens are lower-cased ``\\w\\w+`` words with English stop-words removed, the sum runs
over query tokens *with repetition*, |d| is d's token count and avgdl the corpus mean.
``bm25_scores_loop`` evaluates this formula with plain Python loops; the test suite checks
that the sparse bm25s index gives the same numbers.

Ties (equal scores) are broken by corpus order, and passages with score 0 (no query word
in common) are never returned, so results are deterministic and never pure noise.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence

import numpy as np

from memkit.retrieval.base import Hit, check_k, check_passages, check_query, passage_text
from memkit.world.schema import Passage

K1, B = 1.5, 0.75
_SPLIT = r"(?u)\b\w\w+\b"  # bm25s' default splitter


class BM25Retriever:
    """BM25 over ``title + text`` of each passage (see the module docstring for the score)."""

    name = "bm25"

    def __init__(self, passages: Sequence[Passage], k1: float = K1, b: float = B):
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.passages = check_passages(passages)
        self.k1, self.b = k1, b
        self._tok = Tokenizer(lower=True, splitter=_SPLIT, stopwords="english")
        ids = self._tok.tokenize(
            [passage_text(p) for p in self.passages], update_vocab=True, return_as="ids", show_progress=False
        )
        self._empty_id = self._tok.get_vocab_dict().get("")  # bm25s' placeholder for empty docs/queries
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        self._bm25.index(ids, show_progress=False)

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (float32, corpus order)."""
        check_query(query)
        ids = self._tok.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)[0]
        ids = [i for i in ids if i != self._empty_id]
        if not ids:
            return np.zeros(len(self.passages), dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        check_k(k)
        s = self.scores(query)
        order = np.argsort(-s, kind="stable")[:k]
        return [Hit(self.passages[i], float(s[i])) for i in order if s[i] > 0]

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; for one query call search(query, k)")
        return [self.search(q, k) for q in queries]


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
