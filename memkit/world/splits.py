"""The three-way split of a world's questions: which questions SFT, RL and evaluation may ask.

``make_tasks`` composes every task from one fixed pool of questions per world, so tasks built with
other seeds are new *combinations* of the same questions. Held-out evaluation therefore needs a
split of the questions themselves, not of the task seeds; and RL that is to learn to *search*
(rather than to recall what behaviour cloning memorised) needs questions SFT never saw.
"""

from __future__ import annotations

import hashlib

#: A question's split by its hash mod 10: test keeps the two-way split's ``h % 5 == 0`` (the same
#: held-out tasks as before), rl takes one more bucket, sft the other seven.
_BUCKETS = tuple("test" if h % 5 == 0 else "rl" if h == 1 else "sft" for h in range(10))
#: The buckets :func:`question_split` returns, and the share of questions each holds.
SPLIT_SHARES = {side: _BUCKETS.count(side) / len(_BUCKETS) for side in ("sft", "rl", "test")}
SPLITS = tuple(SPLIT_SHARES)
#: ``make_tasks(split="train")``: every question an evaluation never asks (sft + rl).
TRAIN = "train"
#: The splits training tasks may draw (``task_sets.training_tasks``, ``TrainConfig.question_split``).
TRAINING_SPLITS = ("rl", "sft", TRAIN)
#: In the SFT cache name, so a model cloned under an older split is never reused.
SPLIT_SCHEME = "q3"


def question_split(question_id: str) -> str:
    """``"test"`` for 2 questions in 10, ``"rl"`` for 1 in 10, ``"sft"`` for the other 7.

    A stable hash of the id (a comparison's two entities in either order are one question), so
    the split is the same for every seed and process. Behaviour cloning draws only sft questions
    (``task_sets.training_tasks``), RL only rl ones (``TrainConfig.question_split``) and evaluation
    only test ones: "held-out" means questions never trained on, not only new combinations of
    trained ones (a world has ~1,100 1-hop questions and SFT draws thousands of slots). The test
    bucket is the one-in-five of the earlier two-way split, unchanged, so held-out tasks are too.
    Facts may still be shared — a test bridge question can walk a hop that an sft 1-hop question
    asks — as HotpotQA and NQ share Wikipedia.
    """
    key = question_id
    if question_id.startswith("comparison:"):
        pair, attr = question_id[len("comparison:") :].split(".", 1)
        key = "comparison:" + "|".join(sorted(pair.split("|"))) + "." + attr
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return _BUCKETS[h % len(_BUCKETS)]


def in_split(question_id: str, split: str | None) -> bool:
    """Whether a question belongs to ``split`` (None: every question; ``"train"``: sft or rl)."""
    if split is None:
        return True
    side = question_split(question_id)
    return side != "test" if split == TRAIN else side == split


def split_share(split: str | None) -> float:
    """The share of a world's questions ``split`` holds (1.0 for None)."""
    if split is None:
        return 1.0
    return 1.0 - SPLIT_SHARES["test"] if split == TRAIN else SPLIT_SHARES[split]


def check_split(split: str | None) -> str | None:
    """``split`` itself when it is one of :data:`SPLITS`, ``"train"`` or None (all questions), else a clear error."""
    if split is not None and split not in SPLITS + (TRAIN,):
        raise ValueError(
            f"unknown split {split!r}; choose 'sft', 'rl', 'test', 'train' (sft + rl) or None (all questions)"
        )
    return split
