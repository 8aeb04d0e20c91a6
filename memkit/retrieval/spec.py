"""One string names a retriever, so a command line can pick one: ``"bm25"``, ``"dense"``,
``"bm25:<index dir>"`` (a saved BM25 index) or ``"faiss:<index file>"`` (a prebuilt dense index,
e.g. Search-R1's wiki-18 E5 index, with its JSONL corpus)."""

from __future__ import annotations

from pathlib import Path

from memkit.retrieval.base import Retriever
from memkit.retrieval.corpus import as_passages

NAMES = ("bm25", "dense")
SPECS = ("bm25", "dense", "bm25:<index dir>", "faiss:<index file>")


def retriever_from_spec(spec: str, corpus=None, **kwargs) -> Retriever:
    """The retriever ``spec`` names, over ``corpus`` (a list of Passages or a JSONL path).

    ``"bm25"`` / ``"dense"`` build an index over ``corpus``; ``"bm25:DIR"`` loads one written by
    :meth:`BM25Retriever.save` (its passages are inside it: ``corpus`` must be None);
    ``"faiss:FILE"`` loads a prebuilt faiss index whose rows are ``corpus``'s passages in order
    (:meth:`DenseRetriever.from_prebuilt`; default encoder E5). ``kwargs`` go to the backend.
    """
    if not isinstance(spec, str):
        raise ValueError(f"unknown retriever {spec!r}; choose one of {', '.join(SPECS)}")
    kind, sep, path = spec.strip().partition(":")
    kind = kind.strip().lower()
    if sep and kind in ("bm25", "faiss") and path.strip():
        path = Path(path.strip()).expanduser()
        if kind == "bm25":
            if corpus is not None:
                raise ValueError(f"{spec!r} loads its passages from the index; pass no corpus")
            from memkit.retrieval.bm25 import BM25Retriever

            return BM25Retriever.load(path, **kwargs)
        if corpus is None:
            raise ValueError(f"{spec!r} needs the corpus its rows index: a JSONL path or a list of Passages")
        from memkit.retrieval.dense import DenseRetriever

        return DenseRetriever.from_prebuilt(path, corpus, **kwargs)
    if sep or kind not in NAMES:
        raise ValueError(f"unknown retriever {spec!r}; choose one of {', '.join(SPECS)}")
    if corpus is None:
        raise ValueError(f"retriever {spec!r} indexes a corpus: pass a list of Passages or a JSONL path")
    if kind == "bm25":
        from memkit.retrieval.bm25 import BM25Retriever

        return BM25Retriever(as_passages(corpus), **kwargs)
    from memkit.retrieval.dense import DenseRetriever

    return DenseRetriever(as_passages(corpus), **kwargs)
