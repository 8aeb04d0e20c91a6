"""LoCoMo's answer scores (Mem-T Table 2: F1 and BLEU-1 per category).

F1 follows LoCoMo's ``task_eval/evaluation.py``: lower-case, drop punctuation, commas and the
words a/an/the/and, Porter-stem each word, then token F1

    P = |pred & gold| / |pred|,  R = |pred & gold| / |gold|,  F1 = 2PR / (P + R)

with its per-category rules: category 1 (multi-hop) splits both sides at commas and averages,
over gold parts, the best F1 of any predicted part; category 3 scores against the gold's first
';' part; category 5 (adversarial) is 1 when the answer says "not mentioned" or "no information
available", else 0. BLEU-1 is NLTK's ``sentence_bleu`` with weights (1, 0, 0, 0) and smoothing
method 1 on the same normalised words (unstemmed), as the Mem0 / A-Mem evaluation scripts do.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """LoCoMo's ``normalize_answer``: commas out, lower case, punctuation out, a/an/the/and out."""
    s = str(text).replace(",", "").lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _stem(words: list[str]) -> list[str]:
    from nltk.stem import PorterStemmer

    stem = PorterStemmer().stem
    return [stem(w) for w in words]


def token_f1(pred: str, gold: str) -> float:
    """Stemmed token F1 of one prediction against one gold string."""
    p, g = _stem(normalize(pred).split()), _stem(normalize(gold).split())
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def locomo_f1(pred: str, gold: str, category: int) -> float:
    """F1 with LoCoMo's rule for ``category`` (module docstring)."""
    pred, gold = str(pred or ""), str(gold)
    if category == 5:
        low = pred.lower()
        return float("not mentioned" in low or "no information available" in low)
    if category == 1:
        preds = [p.strip() for p in pred.split(",")]
        golds = [g.strip() for g in gold.split(",")]
        return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return token_f1(pred, gold)


def bleu1(pred: str, gold: str) -> float:
    """Sentence BLEU-1 (NLTK, smoothing method 1) of normalised words; 0 for an empty side."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    p, g = normalize(pred).split(), normalize(gold).split()
    if not p or not g:
        return 0.0
    return float(sentence_bleu([g], p, weights=(1, 0, 0, 0), smoothing_function=SmoothingFunction().method1))
