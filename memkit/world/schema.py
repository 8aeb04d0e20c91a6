"""Task schema shared by the world generator, loaders, agents and metrics.

A *Task* is what one trajectory solves: ``k`` questions composed into one prompt
(MEM1 §3.3 multi-objective QA; ``k == 1`` is plain QA). Every field is plain data so a
task round-trips through JSONL byte-identically.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Passage:
    """One retrievable document (a wiki-style entity page or a distractor)."""

    id: str
    title: str
    text: str


@dataclass
class SubQuestion:
    """One retrieval hop of a question's decomposition.

    ``query`` is what a scripted (oracle) agent searches for; ``answer`` is the hop's
    result and is guaranteed to appear verbatim in passage ``passage_id``.
    """

    text: str
    query: str
    answer: str
    passage_id: str


@dataclass
class Question:
    id: str
    text: str
    answers: list[str]  # gold aliases, canonical first
    kind: str  # "1hop" | "bridge" | "comparison" | "real"
    supporting_ids: list[str] = field(default_factory=list)
    decomposition: list[SubQuestion] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> "Question":
        d = dict(d)
        d["decomposition"] = [SubQuestion(**s) for s in d.get("decomposition", [])]
        return cls(**d)


MULTI_OBJECTIVE_TEMPLATE = (
    "Answer each of the following questions: {questions} Organize your final answer in "
    "<answer> and </answer> and separate the answer to each question with semicolon."
)


@dataclass
class Task:
    """``k`` questions asked at once. ``prompt`` is the user-facing composite question."""

    id: str
    questions: list[Question]
    prompt: str

    @property
    def k(self) -> int:
        return len(self.questions)

    @property
    def golds(self) -> list[list[str]]:
        return [q.answers for q in self.questions]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        return cls(id=d["id"], questions=[Question.from_dict(q) for q in d["questions"]], prompt=d["prompt"])


def compose_prompt(questions: list[Question]) -> str:
    """MEM1 Prompt 1: quote each question; ``k == 1`` keeps the plain question."""
    if len(questions) == 1:
        return questions[0].text
    quoted = " ".join(f'"{q.text}"' for q in questions)
    return MULTI_OBJECTIVE_TEMPLATE.format(questions=quoted)
