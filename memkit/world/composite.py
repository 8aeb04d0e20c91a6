"""MEM1's multi-objective tasks from real questions (MEM1 §3.3, Prompt 1).

MEM1 interleaves ``k`` questions of the QA corpus (Search-R1's NQ + HotpotQA training file) into
one composite query: "Answer each of the following questions: "q1" "q2" ... Organize your final
answer in <answer> and </answer> and separate the answer to each question with semicolon." The
result is the same :class:`~memkit.world.schema.Task` the synthetic generator makes
(:func:`~memkit.world.generator.make_tasks`): ``questions[j]`` is answer slot ``j`` and
``golds[j]`` its aliases, so every agent, rollout and slot-wise EM metric runs on it unchanged.

Drawing follows ``make_tasks``: one seeded shuffle of the pool after another, so a question comes
back only once the pool is used up, never twice in one task; ``split`` keeps only the questions
:func:`~memkit.world.splits.question_split` puts there (a hash of the id), so held-out tasks ask
questions no training task asks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from memkit.world.schema import Question, Task, compose_prompt
from memkit.world.splits import check_split, in_split


def question_pool(items) -> list[Question]:
    """Every question of ``items`` (tasks or questions), first occurrence of each id kept.

    An alias holding ``;`` is dropped (the answer separator would split it across two slots); a
    question left with no alias is dropped."""
    out: dict[str, Question] = {}
    for item in items:
        for q in item.questions if isinstance(item, Task) else [item]:
            aliases = [a for a in q.answers if ";" not in a and a.strip()]
            if aliases and q.id not in out:
                out[q.id] = q if aliases == q.answers else replace(q, answers=aliases)
    return list(out.values())


def compose_multi_objective(
    pool, n: int, k: int, seed: int = 0, split: str | None = None, prefix: str = "real"
) -> list[Task]:
    """``n`` tasks of ``k`` distinct questions drawn from ``pool`` (tasks or questions), composed
    with MEM1 Prompt 1 (:func:`~memkit.world.schema.compose_prompt`; ``k == 1`` keeps the question).

    Deterministic in (pool order, ``n``, ``k``, ``seed``, ``split``); a smaller ``n`` gives a prefix
    of the same list. Ids are ``<prefix>-s<seed>-k<k>[-<split>]-00000``...
    """
    if not isinstance(n, int) or n < 1 or not isinstance(k, int) or k < 1:
        raise ValueError(f"n and k must be positive ints (n tasks of k questions), got n={n!r}, k={k!r}")
    split = check_split(split)
    questions = [q for q in question_pool(pool) if in_split(q.id, split)]
    if len(questions) < k:
        where = f" in split {split!r}" if split else ""
        raise ValueError(f"the pool holds {len(questions)} usable questions{where}, fewer than k={k}")
    tag = f"-{split}" if split else ""
    rng = random.Random(f"real-{prefix}-{seed}-{k}{tag}")  # str seeds go through sha512: stable
    deck: list[Question] = []
    tasks = []
    for i in range(n):
        qs: list[Question] = []
        while len(qs) < k:
            taken = {q.id for q in qs}
            j = next((j for j in range(len(deck) - 1, -1, -1) if deck[j].id not in taken), None)
            if j is None:  # the pool is used up (or holds only this task's questions): reshuffle it
                deck = rng.sample(questions, len(questions)) + deck
                continue
            qs.append(deck.pop(j))
        tasks.append(Task(id=f"{prefix}-s{seed}-k{k}{tag}-{i:05d}", questions=qs, prompt=compose_prompt(qs)))
    return tasks


@dataclass(frozen=True)
class QuestionSet:
    """Real questions standing where a synthetic world stands: ``make_tasks(qs, n, k, seed, split=...)``
    (and so ``training_tasks``, ``held_out_tasks``, the trainer and ``evaluate``) composes MEM1 tasks
    from them with :func:`compose_multi_objective` instead of drawing a world's questions.

    ``hash_splits``: whether ``split`` ("sft", "rl", "test") picks questions by
    :func:`~memkit.world.splits.question_split` -- one pool serving behaviour cloning, RL and
    evaluation (the offline set) -- or is ignored because the source is a split already (a
    training file, a test file: Search-R1 and MEM1 train on one file and test on others).
    ``name``: the source, for task ids and messages."""

    name: str
    questions: tuple
    hash_splits: bool = True

    def tasks(self, n: int, k: int, seed: int = 0, split: str | None = None) -> list[Task]:
        """``n`` composites of ``k`` questions (``split`` as the class doc says)."""
        split = split if self.hash_splits else None
        return compose_multi_objective(self.questions, n, k, seed=seed, split=split, prefix=_slug(self.name))


def _slug(name: str) -> str:
    tail = str(name).replace("\\", "/").rstrip("/").split("/")[-1]
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in tail)[:40] or "real"
