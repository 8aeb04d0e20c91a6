"""A call's context as token ids, and the tag spans of a text: what the rollout engine records.

:class:`ContextBuilder` turns a method's :class:`~memkit.agents.base.Segment` list into the exact
token ids the policy sees, reusing the ids of earlier calls that a segment references (an output or
an observation is never re-tokenised, so packing and credit assignment see what was generated). It
returns a :class:`BuiltContext`: the ids, the text, the token and character spans of each segment
kind, and the references. The span helpers map ``<tag>...</tag>`` character spans of a text (a
generated output) to the token spans that cover them.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from memkit.agents.base import AgentState, CallSpec, Segment

_TAG_RE = re.compile(r"<(/?)([a-z_]+)>")

Spans = dict[str, list[tuple[int, int]]]


def tag_char_spans(text: str) -> dict[str, list[tuple[int, int]]]:
    """Char spans ``[start, end)`` of every ``<tag>...</tag>`` (tags included) in ``text``."""
    spans: dict[str, list[tuple[int, int]]] = {}
    open_at: dict[str, int] = {}
    for m in _TAG_RE.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if not closing:
            open_at[tag] = m.start()
        elif tag in open_at:
            spans.setdefault(tag, []).append((open_at.pop(tag), m.end()))
    for tag, start in open_at.items():  # unclosed: runs to the end (still worth colouring)
        spans.setdefault(tag, []).append((start, len(text)))
    return spans


def token_char_ends(tokenizer, ids: Sequence[int]) -> list[int]:
    """End character offset of each token in ``decode(ids)``."""
    ends, total = [], 0
    for t in ids:
        total += len(tokenizer.decode([t]))
        ends.append(total)
    if ids and total != len(tokenizer.decode(list(ids))):  # multi-byte pieces: slow exact path
        ends = [len(tokenizer.decode(list(ids[: i + 1]))) for i in range(len(ids))]
    return ends


def char_to_token_spans(char_spans, ends: list[int]) -> dict[str, list[tuple[int, int]]]:
    """Map char spans to the token spans that cover them."""
    out: dict[str, list[tuple[int, int]]] = {}
    for tag, spans in char_spans.items():
        for s, e in spans:
            ts = bisect.bisect_right(ends, s)
            te = bisect.bisect_left(ends, e) + 1
            out.setdefault(tag, []).append((ts, min(te, len(ends))))
    return out


@dataclass
class BuiltContext:
    """One call's context as :meth:`ContextBuilder.build` made it; the ``context_*`` fields of its
    :class:`~memkit.core.trajectory.Call`."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    token_spans: Spans = field(default_factory=dict)  # segment kind -> token spans [start, end)
    char_spans: Spans = field(default_factory=dict)  # segment kind -> char spans in ``text``
    refs: list[tuple[int, int, int, str]] = field(
        default_factory=list
    )  # (start, end, call index, "output" | "observation")


class ContextBuilder:
    """Turns a method's Segments into token ids, reusing the exact ids of referenced calls."""

    def __init__(self, tokenizer, wrap: Callable[[list[Segment]], list[Segment]] | None = None):
        self.tokenizer, self.wrap = tokenizer, wrap or (lambda segs: segs)
        self._cache: dict[str, list[int]] = {}

    def encode_text(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(text) < 4000:
                self._cache[text] = ids
        return list(ids)

    def build(self, state: AgentState, spec: CallSpec) -> BuiltContext:
        ids: list[int] = []
        token_spans: Spans = {}
        char_spans: Spans = {}
        refs: list[tuple[int, int, int, str]] = []
        text_parts: list[str] = []
        n_chars = 0
        for seg in self.wrap(spec.segments):
            if seg.ref is not None:
                call = state.calls[seg.ref[0]]
                piece = list(call.output_ids if seg.ref[1] == "output" else call.observation_ids)
                refs.append((len(ids), len(ids) + len(piece), seg.ref[0], seg.ref[1]))
            else:
                piece = self.encode_text(seg.text)
            token_spans.setdefault(seg.kind, []).append((len(ids), len(ids) + len(piece)))
            char_spans.setdefault(seg.kind, []).append((n_chars, n_chars + len(seg.text)))
            ids.extend(piece)
            text_parts.append(seg.text)
            n_chars += len(seg.text)
        return BuiltContext(ids, "".join(text_parts), token_spans, char_spans, refs)
