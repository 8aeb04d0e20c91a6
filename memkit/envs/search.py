"""The wiki-search tool: a query in, a Search-R1 ``<information>`` observation out.

This is the environment of the QA tasks in MEM1, MemSearcher, MemPO and MemAct: the agent
writes ``<search>query</search>`` and the next context contains the top-k passages in the
format of :func:`memkit.retrieval.format_observation`. A malformed (empty) query is an
agent mistake, not an environment failure: it gets an observation that says so, and the
rollout goes on.
"""

from __future__ import annotations

from typing import Sequence

from memkit.retrieval.base import Retriever, check_k, format_observation
from memkit.world.schema import Passage

RETRIEVERS = ("bm25", "dense")
EMPTY_QUERY = "<information>The search query was empty. Put the query between <search> and </search>.</information>"


def make_retriever(name: str, passages: Sequence[Passage] | None, **kwargs) -> Retriever:
    """``"bm25"`` -> :class:`BM25Retriever`, ``"dense"`` -> :class:`DenseRetriever` over ``passages``;
    also ``"bm25:<index dir>"`` and ``"faiss:<index file>"`` (prebuilt indexes:
    :func:`memkit.retrieval.spec.retriever_from_spec`).

    ``kwargs`` go to the backend (e.g. ``cache_dir=`` / ``batch_size=`` / ``index="hnsw"`` for dense).
    """
    from memkit.retrieval.spec import retriever_from_spec

    return retriever_from_spec(name, passages, **kwargs)


class SearchEnv:
    """Top-``k`` passage search behind the ``Env`` protocol of :mod:`memkit.agents.base`."""

    def __init__(self, retriever: Retriever, k: int = 3):
        if not (hasattr(retriever, "search") and hasattr(retriever, "search_batch")):
            raise TypeError(
                f"SearchEnv needs a Retriever (search/search_batch), got {type(retriever).__name__}; "
                "build one with make_retriever('bm25', passages)"
            )
        self.retriever = retriever
        self.k = check_k(k)
        self.n_searches = 0

    def search(self, query: str) -> str:
        """Observation text for one query (empty/whitespace query -> an explanatory observation)."""
        return self.search_batch([query])[0]

    def search_batch(self, queries: Sequence[str]) -> list[str]:
        """Observations for many queries, with one batched retriever call for the real ones."""
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; for one query call search(query)")
        queries = [q if isinstance(q, str) else "" for q in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        out = [EMPTY_QUERY] * len(queries)
        if live:
            hits = self.retriever.search_batch([queries[i].strip() for i in live], self.k)
            for i, h in zip(live, hits):
                out[i] = format_observation(h)
        self.n_searches += len(queries)
        return out
