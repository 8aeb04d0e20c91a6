"""Exact BM25 top-k from the inverted index alone: a MaxScore kernel (numba) and its loop reference.

bm25s stores each term's BM25 contribution per passage as a CSC matrix (one column per vocabulary
term): column t's postings are ``indices[indptr[t]:indptr[t+1]]`` (passage rows, ascending) with
contributions ``data[...]`` (float32, > 0). A passage's score for a query is the float32 sum of its
postings' contributions over the query's term ids *in query order* (bm25s' ``get_scores_from_ids``:
a zeroed vector of the corpus, then ``scores[indices[p]] += data[p]`` term by term).

The top-k rule (``topk_loop``, the reference): passages ordered by ``(-score, row)`` (ties go to the
earlier passage, as a stable sort of the whole score vector does), score-0 passages never returned.

The kernel touches only postings, never the whole corpus, and skips most of the long ones (common
words) by MaxScore (Turtle & Flood 1995) run term-at-a-time:

1. the query's distinct terms are ordered by their upper bound ``ub(t) = count(t) * max(column t)``;
   ``rest[j]`` is the sum of the bounds from term j on;
2. OR phase: terms are added in that order into a dense per-thread accumulator (only touched entries
   are remembered, and reset afterwards), keeping the k best partial scores; theta, the k-th of them,
   is a lower bound of the final k-th score. Once ``rest[j] < theta`` no passage unseen so far can
   reach the top k, and the remaining terms are not scanned for new passages;
3. the remaining terms update only passages already touched: by binary-search look-ups of the
   candidates (touched passages with ``partial + rest >= theta``, re-pruned after each term as theta
   rises) in the sorted postings, or, when candidates are many against a term's postings, by a scan
   that skips untouched passages;
4. the survivors are re-scored exactly, in query order in float32 (so scores equal bm25s' to the
   bit), and the k best by ``(-score, row)`` are returned.

Partial sums run in a different order than bm25s', so every bound comparison keeps a relative
margin (``SLACK`` plus 4 float32 roundings per query token, far above the rounding of a query's
sum): pruning only drops passages certainly below the k-th score; the final order uses the exact
scores. For ``k > SMALL_K`` keeping the k best per posting would cost O(k) a step, so the kernel
instead sums every posting in query order and sorts the touched passages at or above the k-th
score (still no pass over the corpus).
"""

from __future__ import annotations

from itertools import chain

import numpy as np
from numba import njit, prange

SLACK = 1e-3  # relative margin on bound comparisons (float32 sums of a query: ~1e-7 x its length)
LOOKUP_COST = 16  # a binary-search look-up costs about this many scanned postings
SMALL_K = 64  # above this k, every posting is summed and the touched passages sorted


def topk_loop(data, indptr, indices, query_ids, k: int) -> list[tuple[int, float]]:
    """Reference: every posting of every query term added into a dict in query order (float32),
    then sorted by ``(-score, row)``; zeros dropped. ``query_ids``: term ids, repeats counted."""
    acc: dict[int, np.float32] = {}
    for t in query_ids:
        for p in range(indptr[t], indptr[t + 1]):
            d = int(indices[p])
            acc[d] = acc.get(d, np.float32(0)) + data[p]
    ranked = sorted(acc.items(), key=lambda ds: (-ds[1], ds[0]))
    return [(d, float(s)) for d, s in ranked[:k] if s > 0]


def column_max(data: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Largest contribution of each term (0 for a term without postings). shape: (vocab,) float32."""
    out = np.zeros(len(indptr) - 1, dtype=np.float32)
    nonempty = np.diff(indptr) > 0
    if nonempty.any():
        out[nonempty] = np.maximum.reduceat(data, indptr[:-1][nonempty])
    return out


@njit(nogil=True, inline="always")
def _better(s, d, s2, d2):
    return s > s2 or (s == s2 and d < d2)


@njit(nogil=True, cache=True)
def _bisect(indices, lo, hi, d):
    """First position in ``[lo, hi)`` whose row is ``>= d`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if indices[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(nogil=True, cache=True)
def _kth(top_s, n):
    """Index of the smallest of ``top_s[:n]``."""
    j = 0
    for i in range(1, n):
        if top_s[i] < top_s[j]:
            j = i
    return j


@njit(nogil=True, cache=True)
def _distinct_by_bound(q, colmax, terms, cnt, ub, rest):
    """Distinct terms of ``q`` with their counts, ordered by upper bound (descending); ``rest[j]`` =
    sum of ``ub[j:]``. Returns the number of distinct terms."""
    n = 0
    for t in q:
        j = 0
        while j < n and terms[j] != t:
            j += 1
        if j == n:
            terms[n] = t
            cnt[n] = 0
            n += 1
        cnt[j] += 1
    for j in range(n):
        ub[j] = cnt[j] * np.float64(colmax[terms[j]])
    for i in range(1, n):  # insertion sort: queries are short
        j = i
        while j > 0 and ub[j - 1] < ub[j]:
            ub[j - 1], ub[j] = ub[j], ub[j - 1]
            terms[j - 1], terms[j] = terms[j], terms[j - 1]
            cnt[j - 1], cnt[j] = cnt[j], cnt[j - 1]
            j -= 1
    rest[n] = 0.0
    for j in range(n - 1, -1, -1):
        rest[j] = rest[j + 1] + ub[j]
    return n


@njit(nogil=True, cache=True)
def _offer(d, v, top_d, top_s, n_top, k, imin):
    """Keep the k best partial scores of distinct passages after passage d's rose to v; returns
    ``(n_top, imin)`` (``top_s[imin]`` is the k-th best once ``n_top == k``)."""
    i = 0
    while i < n_top and top_d[i] != d:
        i += 1
    if i == n_top:
        if n_top < k:
            n_top += 1
        else:
            i = imin
    top_d[i], top_s[i] = d, v
    if n_top == k:
        imin = _kth(top_s, n_top)
    return n_top, imin


@njit(nogil=True, cache=True)
def _exact_topk(data, indptr, indices, q, k, final, n_f, out_d, out_s):
    """Exact float32 scores of passages ``final[:n_f]`` (summed in query order, as bm25s does) and
    their ``(-score, row)`` top-k into ``out_d, out_s``; returns how many (zeros dropped)."""
    m = 0
    for i in range(n_f):
        d = final[i]
        s = np.float32(0)
        for t in q:
            p = _bisect(indices, indptr[t], indptr[t + 1], d)
            if p < indptr[t + 1] and indices[p] == d:
                s += data[p]
        if s > 0 and (m < k or _better(s, d, out_s[m - 1], out_d[m - 1])):
            j = min(m, k - 1)
            while j > 0 and _better(s, d, out_s[j - 1], out_d[j - 1]):
                out_s[j], out_d[j] = out_s[j - 1], out_d[j - 1]
                j -= 1
            out_s[j], out_d[j] = s, d
            m = min(m + 1, k)
    return m


@njit(nogil=True, cache=True)
def _query_topk_all(data, indptr, indices, q, k, buf, touched, out_d, out_s):
    """Top-k of one query for large k: every posting summed in query order (float32, bm25s' sums);
    the touched passages at or above the k-th score sorted by row, then stably by score. Returns
    ``(m, 0)``."""
    n_t = 0
    for t in q:
        for p in range(indptr[t], indptr[t + 1]):
            d = indices[p]
            if buf[d] == 0:
                touched[n_t] = d
                n_t += 1
            buf[d] += data[p]
    scores = np.empty(n_t, dtype=np.float32)
    for i in range(n_t):
        scores[i] = buf[touched[i]]
        buf[touched[i]] = 0
    if n_t > k:  # only passages at or above the k-th score (ties included) are sorted
        kth = np.partition(scores, n_t - k)[n_t - k]
        n_c = 0
        for i in range(n_t):
            if scores[i] >= kth:
                touched[n_c], scores[n_c] = touched[i], scores[i]
                n_c += 1
        n_t = n_c
    rows = touched[:n_t]
    by_row = np.argsort(rows)
    rows, scores = rows[by_row], scores[:n_t][by_row]
    order = np.argsort(-scores, kind="mergesort")  # stable: equal scores keep row order
    m = min(k, n_t)
    for i in range(m):
        out_d[i], out_s[i] = rows[order[i]], scores[order[i]]
    return m, 0


@njit(nogil=True, cache=True)
def _query_topk(
    data, indptr, indices, colmax, q, k, buf, touched, cand, terms, cnt, ub, rest, top_d, top_s, out_d, out_s
):
    """Top-k of one query (steps 1-4 of the module docstring) into ``out_d[:m], out_s[:m]``; returns
    ``(m, distinct terms never scanned for new passages)``. ``buf`` (shape: (n_docs,) float32) must be
    all zeros and is left so."""
    if k > SMALL_K:
        return _query_topk_all(data, indptr, indices, q, k, buf, touched, out_d, out_s)
    n_u = _distinct_by_bound(q, colmax, terms, cnt, ub, rest)
    keep = 1.0 - SLACK - 4.0 * len(q) * 2.0**-24
    n_top, imin, theta = 0, 0, np.float32(0)
    n_t, e = 0, n_u
    for j in range(n_u):  # OR phase: every posting, new passages join the touched list
        if j > 0 and rest[j] < theta * keep:
            e = j
            break
        t, c = terms[j], np.float32(cnt[j])
        for p in range(indptr[t], indptr[t + 1]):
            d = indices[p]
            v = buf[d]
            if v == 0:
                touched[n_t] = d
                n_t += 1
            v += c * data[p]
            buf[d] = v
            if v > theta or n_top < k:
                n_top, imin = _offer(d, v, top_d, top_s, n_top, k, imin)
                theta = top_s[imin] if n_top == k else np.float32(0)
    left = 0
    for j in range(e, n_u):
        left += indptr[terms[j] + 1] - indptr[terms[j]]
    listed = left > n_t  # a candidate list (one pass over the touched) costs less than the scans
    n_c = 0
    if listed:
        for i in range(n_t):
            d = touched[i]
            if buf[d] + rest[e] >= theta * keep:
                cand[n_c] = d
                n_c += 1
    for j in range(e, n_u):  # the remaining terms: touched passages only
        t, c = terms[j], np.float32(cnt[j])
        lo, hi = indptr[t], indptr[t + 1]
        if listed and n_c * LOOKUP_COST < hi - lo:
            for i in range(n_c):
                d = cand[i]
                p = _bisect(indices, lo, hi, d)
                if p < hi and indices[p] == d:
                    v = buf[d] + c * data[p]
                    buf[d] = v
                    if v > theta:
                        n_top, imin = _offer(d, v, top_d, top_s, n_top, k, imin)
                        theta = top_s[imin]
        else:
            for p in range(lo, hi):
                d = indices[p]
                v = buf[d]
                if v != 0:  # touched (pruned candidates too: a partial score is still a lower bound)
                    v += c * data[p]
                    buf[d] = v
                    if v > theta:
                        n_top, imin = _offer(d, v, top_d, top_s, n_top, k, imin)
                        theta = top_s[imin]
        if listed:
            n_new = 0
            for i in range(n_c):
                d = cand[i]
                if buf[d] + rest[j + 1] >= theta * keep:
                    cand[n_new] = d
                    n_new += 1
            n_c = n_new
    n_f = 0  # survivors (complete partial sums within the margin of theta) into cand; buf reset
    if listed:
        for i in range(n_c):
            d = cand[i]
            if buf[d] >= theta * keep:
                cand[n_f] = d
                n_f += 1
        for i in range(n_t):
            buf[touched[i]] = 0
    else:
        for i in range(n_t):
            d = touched[i]
            if buf[d] >= theta * keep:
                cand[n_f] = d
                n_f += 1
            buf[d] = 0
    return _exact_topk(data, indptr, indices, q, k, cand, n_f, out_d, out_s), n_u - e


def _batch(data, indptr, indices, colmax, n_docs, flat, ptr, k, n_chunks, cap):
    """Queries ``flat[ptr[i]:ptr[i+1]]`` split over ``n_chunks`` workers, each with its own buffers."""
    nq = len(ptr) - 1
    out_d = np.zeros((nq, k), dtype=np.int32)
    out_s = np.zeros((nq, k), dtype=np.float32)
    counts, skipped = np.zeros(nq, dtype=np.int32), np.zeros(nq, dtype=np.int32)
    longest = np.max(ptr[1:] - ptr[:-1])
    for c in prange(n_chunks):
        buf = np.zeros(n_docs, dtype=np.float32)
        touched, cand = np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int32)
        terms, cnt = np.empty(longest, dtype=np.int64), np.empty(longest, dtype=np.int64)
        ub, rest = np.empty(longest, dtype=np.float64), np.empty(longest + 1, dtype=np.float64)
        top_d, top_s = np.empty(k, dtype=np.int32), np.empty(k, dtype=np.float32)
        for i in range(c, nq, n_chunks):
            q = flat[ptr[i] : ptr[i + 1]]
            counts[i], skipped[i] = _query_topk(
                data, indptr, indices, colmax, q, k, buf, touched, cand, terms, cnt, ub, rest, top_d, top_s,
                out_d[i], out_s[i],
            )  # fmt: skip
    return out_d, out_s, counts, skipped


_batch_serial = njit(nogil=True, cache=True)(_batch)
_batch_parallel = njit(parallel=True, nogil=True, cache=True)(_batch)


def topk_batch(data, indptr, indices, colmax, n_docs: int, queries, k: int, n_threads: int = 1):
    """Top-``k`` hits of each query (a list of term ids, at least one each): ``found[i]`` is the list
    of ``(row, score)`` pairs :func:`topk_loop` gives (at most k), ``skipped[i]`` how many of the
    query's distinct terms MaxScore never scanned for new passages. ``n_threads`` > 1 splits the
    queries over that many numba threads.

    shape: ``data`` (nnz,) float32, ``indices`` (nnz,) int, ``indptr`` (vocab + 1,), ``colmax``
    (vocab,) float32 (:func:`column_max`); ``skipped`` (n_queries,) int32."""
    import numba

    if any(len(q) == 0 for q in queries):
        raise ValueError("every query needs at least one term id (a query without one scores 0 everywhere)")
    if not len(queries):
        return [], np.zeros(0, dtype=np.int32)
    k = min(k, n_docs)
    flat = np.array(list(chain.from_iterable(queries)), dtype=np.int64)
    ptr = np.zeros(len(queries) + 1, dtype=np.int64)
    np.cumsum([len(q) for q in queries], out=ptr[1:])
    cap = int(np.add.reduceat(np.diff(indptr)[flat], ptr[:-1]).max())  # most postings of one query
    if n_threads == 1:
        rows, scores, counts, skipped = _batch_serial(data, indptr, indices, colmax, n_docs, flat, ptr, k, 1, cap)
    else:
        before = numba.get_num_threads()
        numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
        try:
            rows, scores, counts, skipped = _batch_parallel(
                data, indptr, indices, colmax, n_docs, flat, ptr, k, numba.get_num_threads(), cap
            )
        finally:
            numba.set_num_threads(before)
    rows, scores = rows.tolist(), scores.tolist()
    return [list(zip(r[:m], s[:m])) for r, s, m in zip(rows, scores, counts.tolist())], skipped
