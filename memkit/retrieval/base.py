"""What every retriever returns, and how hits become the observation an agent reads.

All five papers put retrieved passages into the agent's context in the same textual form,
inherited from Search-R1 (``_passages2string`` in ``search_r1/llm_agent/generation.py``)::

    <information>Doc 1(Title: Paris) Paris is the capital of France.
    Doc 2(Title: Lyon) Lyon is a city ...</information>

Search-R1 writes one line ``f"Doc {i+1}(Title: {title}) {text}\\n"`` per passage, strips the
concatenation and wraps it in ``<information>...</information>``. MEM1 reuses that code. We
copy the format exactly so a model trained here reads observations laid out as in the papers.
(Search-R1 also pads the block with ``"\\n\\n"`` on each side when it appends it to the
rollout; in memkit that whitespace belongs to the method's context builder, not to the env.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from memkit.world.schema import Passage

NO_RESULTS = "No documents matched the query."


@dataclass(frozen=True)
class Hit:
    """One retrieved passage and its score (higher is better; scales differ per backend)."""

    passage: Passage
    score: float


@runtime_checkable
class Retriever(Protocol):
    """A top-k passage search. ``search_batch`` exists so backends can batch (dense: one
    encoder forward and one faiss call for all queries of a rollout round)."""

    def search(self, query: str, k: int) -> list[Hit]: ...

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...


def format_observation(hits: Sequence[Hit]) -> str:
    """Search-R1 / MEM1 observation text for ``hits`` (see the module docstring).

    An empty hit list yields an ``<information>`` block that says nothing matched, so the
    agent still gets a well-formed observation.
    """
    body = "".join(f"Doc {i + 1}(Title: {h.passage.title}) {h.passage.text}\n" for i, h in enumerate(hits))
    return f"<information>{body.strip() or NO_RESULTS}</information>"


def check_passages(passages) -> list[Passage]:
    """Validate the corpus once, with an error that says how to fix it."""
    if isinstance(passages, (str, bytes)) or not hasattr(passages, "__iter__"):
        raise TypeError(f"passages must be a list of memkit.world.schema.Passage, got {type(passages).__name__}")
    passages = list(passages)
    if not passages:
        raise ValueError(
            "no passages to index: pass a non-empty list of Passage(id, title, text), e.g. make_world(seed).passages"
        )
    for p in passages:
        if not all(isinstance(getattr(p, a, None), str) for a in ("id", "title", "text")):
            raise TypeError(
                f"passages must be Passage(id, title, text) objects with str fields, got {p!r:.80}; "
                "wrap raw texts as Passage(id=str(i), title='', text=t)"
            )
    return passages


def check_query(query) -> str:
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    return query


def check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (number of passages to return), got {k!r}")
    return k


def passage_text(p: Passage) -> str:
    """What gets indexed: title and body (titles carry the entity name, often the query key)."""
    return f"{p.title}\n{p.text}" if p.title else p.text
