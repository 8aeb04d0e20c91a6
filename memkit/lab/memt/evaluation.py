"""Evaluate Mem-T on conversation streams: F1 / BLEU-1 per LoCoMo category, evidence, tokens.

Per question, with ``T(x)`` the number of tokens of x under the policy's tokenizer:

* Mem-T: tokens per answer = sum over its retrieval calls of T(context) + T(output); the
  construction tokens (formation + evolution calls) are reported per conversation and, shared
  by its questions, amortised per answer;
* full context: T(instruction + every session with its date + question) + T(gold answer);
* raw-chunk RAG: T(instruction + top-``k`` BM25 turns for the question + question) + T(gold answer).

The two baselines are scored as contexts (no reader runs): "answer in context" is the share of
questions whose gold answer appears in the context verbatim (whole words), "evidence" the
share of evidence turns it holds. Mem-T's "evidence in memory" is the share of evidence ids
that reached a formed memory (fact, experience, persona), "evidence retrieved" the share its
searches brought back (eq. 10's Evid).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from statistics import mean

from memkit.agents.memt import RETRIEVAL_INSTRUCTION
from memkit.metrics.locomo import bleu1, locomo_f1, normalize
from memkit.world.conversation import CATEGORIES, Conversation
from memkit.world.schema import Passage

#: the order rows are printed in (Mem-T Table 2's, then adversarial)
CATEGORY_ORDER = ("single-hop", "multi-hop", "temporal", "open-domain", "adversarial")


def transcript(conv: Conversation) -> str:
    """The whole conversation as the full-context baseline reads it."""
    return "".join(
        f"Session on {s.date_time}:\n" + "".join(f"{t.dia_id} {t.speaker}: {t.text}\n" for t in s.turns)
        for s in conv.sessions
    )


def in_context(context: str, answer: str) -> bool:
    words = re.sub(r"<[^>]*>|[\[\]\n]", " ", context)
    return bool(answer) and f" {normalize(answer)} " in f" {normalize(words)} "


def baseline_rows(conv: Conversation, tokenizer, k: int = 5) -> list[dict]:
    """Per question: full-context and raw-chunk RAG tokens, answer-in-context, evidence held."""
    from memkit.envs.search import make_retriever

    def n(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    full = transcript(conv)
    n_full = n(RETRIEVAL_INSTRUCTION + full)
    turns = {t.dia_id: (s.date_time, t) for s in conv.sessions for t in s.turns}
    rag = make_retriever("bm25", [Passage(d, "", f"{d} {t.speaker}: {t.text}") for d, (_, t) in turns.items()])
    rows = []
    for qa in conv.qa:
        hits = rag.search(qa.question, k)
        chunks = "".join(f"[{turns[h.passage.id][0]}] {h.passage.text}\n" for h in hits)
        got = {h.passage.id for h in hits}
        answerable = qa.category != 5
        rows.append(
            {
                "full_tokens": n_full + n(f"Question: {qa.question}\n") + n(qa.answer),
                "full_answer_in_context": float(in_context(full, qa.answer)) if answerable else None,
                "rag_tokens": n(RETRIEVAL_INSTRUCTION + chunks + f"Question: {qa.question}\n") + n(qa.answer),
                "rag_answer_in_context": float(in_context(chunks, qa.answer)) if answerable else None,
                "rag_evidence": mean(e in got for e in qa.evidence) if qa.evidence else None,
            }
        )
    return rows


def question_rows(trajs, conversations, tokenizer, k: int = 5) -> list[dict]:
    """One row per trajectory: category, F1, BLEU-1, evidence, Mem-T and baseline tokens."""
    by_id = {c.sample_id: c for c in conversations}
    base = {c.sample_id: baseline_rows(c, tokenizer, k) for c in conversations}
    rows = []
    for tr in trajs:
        sample, qi = tr.task_id.rsplit("-q", 1)
        qa, b = by_id[sample].qa[int(qi)], base[sample][int(qi)]
        acts = [c for c in tr.calls if c.role == "act"]
        build = [c for c in tr.calls if c.role != "act"]
        gold = qa.answer
        rows.append(
            {
                "conversation": sample,
                "question": int(qi),
                "category": qa.category_name,
                "valid": tr.valid,
                "f1": float(tr.reward or 0.0) if tr.valid else 0.0,
                "bleu1": bleu1(tr.answer or "", gold)
                if tr.valid and qa.category != 5
                else float(locomo_f1(tr.answer or "", gold, 5))
                if tr.valid
                else 0.0,
                "evidence_in_memory": mean(tr.info.get("evidence_in_memory") or [0.0]),
                "evidence_retrieved": mean(tr.info.get("evidence_retrieved") or [0.0]),
                "answer_tokens": sum(c.n_context + c.n_output for c in acts),
                "steps": len(acts),
                "build_tokens": sum(c.n_context + c.n_output for c in build),
                **b,
            }
        )
    n_q = defaultdict(int)
    for r in rows:
        n_q[r["conversation"]] += 1
    for r in rows:
        r["amortised_tokens"] = r["answer_tokens"] + r["build_tokens"] / n_q[r["conversation"]]
    return rows


def summarize_streams(rows: list[dict]) -> list[dict]:
    """Mean of every numeric column per category, plus "overall" (categories 1-4, as Mem-T reports)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["category"]].append(r)
        if r["category"] != CATEGORIES[5]:
            groups["overall"].append(r)
    out = []
    for cat in (*CATEGORY_ORDER, "overall"):
        rs = groups.get(cat)
        if not rs:
            continue
        row = {"category": cat, "n": len(rs), "invalid": mean(not r["valid"] for r in rs)}
        for key in (
            "f1",
            "bleu1",
            "evidence_in_memory",
            "evidence_retrieved",
            "steps",
            "answer_tokens",
            "amortised_tokens",
            "full_tokens",
            "rag_tokens",
            "full_answer_in_context",
            "rag_answer_in_context",
            "rag_evidence",
        ):
            vals = [r[key] for r in rs if r.get(key) is not None]
            row[key] = mean(vals) if vals else None
        out.append(row)
    return out


def format_stream_table(summary: list[dict]) -> str:
    """The printed table: one row per category."""
    cols = [
        ("category", "category", "{}"),
        ("n", "n", "{}"),
        ("F1", "f1", "{:.3f}"),
        ("BLEU-1", "bleu1", "{:.3f}"),
        ("evid.mem", "evidence_in_memory", "{:.2f}"),
        ("evid.ret", "evidence_retrieved", "{:.2f}"),
        ("tok/ans", "answer_tokens", "{:.0f}"),
        ("+build", "amortised_tokens", "{:.0f}"),
        ("full tok", "full_tokens", "{:.0f}"),
        ("RAG tok", "rag_tokens", "{:.0f}"),
        ("full ans", "full_answer_in_context", "{:.2f}"),
        ("RAG ans", "rag_answer_in_context", "{:.2f}"),
        ("invalid", "invalid", "{:.2f}"),
    ]
    cells = [[h for h, _, _ in cols]] + [
        [("-" if r.get(k) is None else f.format(r[k])) for _, k, f in cols] for r in summary
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells
    )


def evaluate_streams(
    kit,
    conversations,
    policy: str = "oracle",
    temperature: float = 0.0,
    seed: int = 0,
    oracle_cfg=None,
    n: int = 1,
    method_kwargs: dict | None = None,
    progress: bool = False,
    max_context_tokens: int | None = None,
):
    """Build and answer with a policy spec; returns ``(summary rows, question rows, trajectories)``."""
    from memkit.agents import get_method
    from memkit.lab.policies import resolve_policy
    from memkit.rollout.engine import RolloutConfig
    from memkit.rollout.streams import stream_rollouts

    method = get_method("memt", **(method_kwargs or {}))
    engine_policy, tok, wrap, _ = resolve_policy(policy, method, kit, temperature, seed, oracle_cfg)
    if max_context_tokens is None:
        model = getattr(getattr(engine_policy, "backend", None), "model", None)
        max_context_tokens = model.config.max_position_embeddings - 256 if model is not None else 10**9
    t0 = time.perf_counter()
    trajs = stream_rollouts(
        method,
        conversations,
        engine_policy,
        tok,
        RolloutConfig(n=n, max_context_tokens=max_context_tokens, seed=seed),
        wrap,
        progress,
    )
    rows = question_rows(trajs, conversations, tok, method.top_k)
    summary = summarize_streams(rows)
    for s in summary:
        s["wall_seconds"] = time.perf_counter() - t0
    return summary, rows, trajs
