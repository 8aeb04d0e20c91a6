"""Conversation streams (Mem-T, LoCoMo): sessions of dialogue turns, QA with evidence turn ids.

The data model follows the LoCoMo JSON schema (Maharana et al. 2024, ``locomo10.json``) so the
synthetic streams and the real file go through the same code::

    {"sample_id": "conv-26",
     "conversation": {"speaker_a": "Caroline", "speaker_b": "Melanie",
                      "session_1_date_time": "1:56 pm on 8 May, 2023",
                      "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "..."}, ...], ...},
     "qa": [{"question": "...", "answer": "...", "evidence": ["D1:3"], "category": 2}, ...],
     "observation": {...}, "session_summary": {...}, "event_summary": {...}}

Categories are LoCoMo's numbers as its evaluation code reads them (:data:`CATEGORIES`).
What a synthetic stream knows beyond the schema (which turn states which fact, a question's
hops) lives under the extra key ``"memkit"`` that LoCoMo readers ignore; the scripted teacher
reads it, a model never sees it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

#: LoCoMo's category ids as its ``task_eval/evaluation.py`` scores them (1 multi-answer F1, 3 first
#: ';' part, 5 'not mentioned'); Mem-T's Table 2 reports 4 / 1 / 2 / 3 and leaves 5 out.
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
CATEGORY_IDS = {name: cid for cid, name in CATEGORIES.items()}
#: what an agent answers when the conversation never said it (LoCoMo's category-5 check looks
#: for "not mentioned" or "no information available")
NOT_MENTIONED = "Not mentioned in the conversation."
_DIA_RE = re.compile(r"^D(\d+):(\d+)$")


@dataclass
class Turn:
    speaker: str
    dia_id: str  # "D<session>:<turn>", LoCoMo's evidence key
    text: str


@dataclass
class Session:
    index: int  # 1-based, as in "session_3"
    date_time: str  # LoCoMo's "1:56 pm on 8 May, 2023"
    turns: list[Turn]


@dataclass
class Hop:
    """One retrieval step of the scripted teacher (memkit extension): search ``store`` for
    ``query``; the memory that answers contains ``answer``."""

    store: str  # "fact" | "experience" | "persona" | "summary" | "raw"
    query: str
    answer: str


@dataclass
class ConvQA:
    question: str
    answer: str
    evidence: list[str]  # dia_ids
    category: int
    adversarial_answer: str | None = None  # category 5: the tempting wrong answer
    hops: list[Hop] = field(default_factory=list)  # memkit extension (teacher only)

    def __deepcopy__(self, memo):  # read-only once made: forked episodes share it
        return self

    @property
    def category_name(self) -> str:
        return CATEGORIES.get(self.category, f"category-{self.category}")


@dataclass
class StreamFact:
    """What one turn states (memkit extension), for the scripted teacher.

    ``slot`` names what the fact is about ("Kofak|city", "Kofak|pet|Rex"): two facts with one
    slot are versions of each other. ``change`` says how it relates to the slot's earlier
    versions: "new", "repeat" (same value again: IGNORE), "update" (a later value; the old one
    stays as history), "correct" (the earlier value was wrong) or "negate" (no longer true: DELETE).
    ``store`` is the memory type it belongs in: "fact", "experience" or "persona".
    """

    dia_id: str
    speaker: str
    slot: str
    value: str
    text: str  # the standalone statement with times resolved ("Kofak moved to Puksek on 2 May 2023.")
    store: str = "fact"
    change: str = "new"
    start_time: str = ""
    end_time: str = ""


@dataclass
class Conversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: list[Session]
    qa: list[ConvQA]
    facts: list[StreamFact] = field(default_factory=list)  # memkit extension; empty for real LoCoMo
    extra: dict = field(default_factory=dict)  # other LoCoMo keys, kept verbatim (observation, summaries)

    def __deepcopy__(self, memo):  # read-only once made: forked episodes share it
        return self

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]

    def turn(self, dia_id: str) -> Turn:
        for t in self.turns:
            if t.dia_id == dia_id:
                return t
        raise KeyError(f"{self.sample_id} has no turn {dia_id!r}")

    def to_locomo(self) -> dict:
        """The LoCoMo JSON object (plus ``"memkit"`` when the stream is synthetic)."""
        conv: dict = {"speaker_a": self.speaker_a, "speaker_b": self.speaker_b}
        for s in self.sessions:
            conv[f"session_{s.index}_date_time"] = s.date_time
            conv[f"session_{s.index}"] = [asdict(t) for t in s.turns]
        qa = []
        for q in self.qa:
            d = {"question": q.question, "evidence": list(q.evidence), "category": q.category}
            if q.category != 5:
                d["answer"] = q.answer
            elif q.adversarial_answer is not None:  # category 5's gold is "not mentioned" (NOT_MENTIONED)
                d["adversarial_answer"] = q.adversarial_answer
            qa.append(d)
        out = {"sample_id": self.sample_id, "conversation": conv, "qa": qa, **self.extra}
        if self.facts or any(q.hops for q in self.qa):
            out["memkit"] = {
                "facts": [asdict(f) for f in self.facts],
                "qa": [{"answer": q.answer, "hops": [asdict(h) for h in q.hops]} for q in self.qa],
            }
        return out

    @classmethod
    def from_locomo(cls, d: dict) -> "Conversation":
        """Inverse of :meth:`to_locomo` for a dict already checked by
        :func:`memkit.world.locomo.check_locomo_sample` (no checks here)."""
        conv = d["conversation"]
        idx = sorted(int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)))
        sessions = [
            Session(
                i,
                str(conv.get(f"session_{i}_date_time", "")),
                [Turn(str(t["speaker"]), str(t["dia_id"]), str(t.get("text", ""))) for t in conv[f"session_{i}"]],
            )
            for i in idx
        ]
        ext = d.get("memkit") or {}
        ext_qa = ext.get("qa") or [{} for _ in d["qa"]]
        qa = []
        for q, e in zip(d["qa"], ext_qa):
            cat = int(q["category"])
            answer = e.get("answer", NOT_MENTIONED if cat == 5 else q.get("answer", ""))
            qa.append(
                ConvQA(
                    question=str(q["question"]),
                    answer=str(answer),
                    evidence=[str(x) for x in q.get("evidence", [])],
                    category=cat,
                    adversarial_answer=q.get("adversarial_answer"),
                    hops=[Hop(**h) for h in e.get("hops", [])],
                )
            )
        facts = [StreamFact(**f) for f in ext.get("facts", [])]
        extra = {k: v for k, v in d.items() if k not in ("sample_id", "conversation", "qa", "memkit")}
        return cls(
            sample_id=str(d.get("sample_id", "")),
            speaker_a=str(conv["speaker_a"]),
            speaker_b=str(conv["speaker_b"]),
            sessions=sessions,
            qa=qa,
            facts=facts,
            extra=extra,
        )


def session_of(dia_id: str) -> int | None:
    """ "D3:7" -> 3 (None when the id is not LoCoMo-shaped)."""
    m = _DIA_RE.match(dia_id or "")
    return int(m.group(1)) if m else None
