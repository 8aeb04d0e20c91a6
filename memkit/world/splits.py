"""The train/test split of a world's questions: which questions evaluations may ask.

``make_tasks`` composes every task from one fixed pool of questions per world, so tasks built with
other seeds are new *combinations* of the same questions. Held-out evaluation therefore needs a
split of the questions themselves, not of the task seeds.
"""
from __future__ import annotations

import hashlib

SPLITS = ("train", "test")
TEST_ONE_IN = 5  # one question in 5 is held out for evaluation


def question_split(question_id: str) -> str:
    """``"test"`` for about one question in :data:`TEST_ONE_IN`, else ``"train"``.

    A stable hash of the id (a comparison's two entities in either order are one question), so
    the split is the same for every seed and process. Training tasks draw only train questions and
    evaluation tasks only test ones: "held-out" means questions never trained on, not only new
    combinations of trained ones (a world has ~1,100 1-hop questions and SFT draws thousands of
    slots). Facts may still be shared — a test bridge question can walk a hop that a train 1-hop
    question asks — as HotpotQA and NQ share Wikipedia.
    """
    key = question_id
    if question_id.startswith("comparison:"):
        pair, attr = question_id[len("comparison:"):].split(".", 1)
        key = "comparison:" + "|".join(sorted(pair.split("|"))) + "." + attr
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "test" if h % TEST_ONE_IN == 0 else "train"


def check_split(split: str | None) -> str | None:
    """``split`` itself when it is one of :data:`SPLITS` or None (all questions), else a clear error."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose 'train', 'test' or None (all questions)")
    return split
