"""Passage retrieval: a ``Retriever`` protocol with BM25 (bm25s) and dense (MiniLM or E5 + faiss
flat / HNSW / IVF) backends, prebuilt indexes named by a spec string (``retriever_from_spec``),
and the Search-R1 observation format every method reads."""

from memkit.retrieval.base import Hit, Retriever, format_observation
from memkit.retrieval.bm25 import BM25Retriever
from memkit.retrieval.spec import retriever_from_spec

__all__ = ["Hit", "Retriever", "format_observation", "BM25Retriever", "DenseRetriever", "retriever_from_spec"]


def __getattr__(name):  # the dense backend imports torch/faiss: load it only when asked for
    if name == "DenseRetriever":
        from memkit.retrieval.dense import DenseRetriever

        return DenseRetriever
    raise AttributeError(f"module 'memkit.retrieval' has no attribute {name!r}")
