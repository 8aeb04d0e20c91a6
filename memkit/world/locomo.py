"""Reading and writing the real LoCoMo benchmark file (``locomo10.json``) as :class:`Conversation`.

:meth:`Conversation.from_locomo` trusts its input, so every sample is checked here first and a
bad file fails with one ``ValueError`` naming the field path (``conversation.session_2[4].dia_id``)
and what was expected, instead of a ``KeyError`` deep inside a rollout. The check is strict where
nothing could work (missing or ill-typed required fields) and lenient where the real data varies:
answers may be numbers (kept as ``str``), evidence strings are kept verbatim, session numbers
may have gaps, extra keys anywhere are fine (``img_url``, ``query``, ``observation``, ...).

Image turns: LoCoMo's own prompts render a shared photo as ``... and shared <blip_caption>``. A
turn with a ``text`` keeps it verbatim (the caption is dropped, like every other extra turn key);
a turn with no ``text`` (absent or null) but a string ``blip_caption`` gets the text
``"[shared <caption>]"``, so the photo still reaches the memory. Only the dict handed to
``from_locomo`` is normalised; the caller's data is never mutated.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from memkit.core.io import atomic_write_text
from memkit.world.conversation import CATEGORIES, Conversation
from memkit.world.loaders import _limit, _read_json

LOCOMO_URL = "https://github.com/snap-research/locomo"
LOCOMO_GET = f"download data/locomo10.json from {LOCOMO_URL}"
LOCOMO_SCHEMA = (
    'a JSON list of LoCoMo samples {"sample_id": str, "conversation": {"speaker_a", "speaker_b", '
    '"session_N": [{"speaker", "dia_id", "text"}], "session_N_date_time"}, "qa": [{"question", '
    '"answer", "evidence": [str], "category": 1..5}]}'
)
_SESSION_RE = re.compile(r"session_(\d+)")
_CATEGORY_HELP = "an int in 1..5 (" + ", ".join(f"{k} {v}" for k, v in CATEGORIES.items()) + ")"
_MISSING = object()


def _got(v) -> str:
    if v is _MISSING:
        return "nothing (key missing)"
    r = repr(v)
    return f"{r[:60] + '...' if len(r) > 60 else r} ({type(v).__name__})"


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _caption_text(t: dict) -> str | None:
    """The text of an image-only turn (see the module docstring), else None."""
    cap = t.get("blip_caption")
    return f"[shared {cap}]" if t.get("text") is None and isinstance(cap, str) and cap.strip() else None


def check_locomo_sample(d, where: str) -> None:
    """Raise one ``ValueError`` "``where``: <field path>: expected ..., got ..." if ``d`` is not a
    LoCoMo sample :meth:`Conversation.from_locomo` can read; return None if it is."""

    def bad(field: str, expected: str, value) -> ValueError:
        return ValueError(f"{where}: {field}: expected {expected}, got {_got(value)}")

    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a LoCoMo sample object, got {_got(d)}")
    if not isinstance(d.get("sample_id", _MISSING), str):
        raise bad("sample_id", "a string", d.get("sample_id", _MISSING))
    conv = d.get("conversation", _MISSING)
    if not isinstance(conv, dict):
        raise bad("conversation", 'an object {"speaker_a", "speaker_b", "session_N", ...}', conv)
    for k in ("speaker_a", "speaker_b"):
        v = conv.get(k, _MISSING)
        if not isinstance(v, str) or not v.strip():
            raise bad(f"conversation.{k}", "a non-empty string", v)
    sessions = sorted((int(m.group(1)), k) for k in conv if (m := _SESSION_RE.fullmatch(k)))
    if not sessions:
        raise ValueError(
            f'{where}: conversation: expected at least one "session_N" list of turns, got keys {sorted(conv)}'
        )
    for n, key in sessions:
        if not isinstance(conv[key], list):
            raise bad(f"conversation.{key}", "a list of turns", conv[key])
        dt = conv.get(f"{key}_date_time", _MISSING)
        if not isinstance(dt, str):
            raise bad(f"conversation.{key}_date_time", 'a string like "1:56 pm on 8 May, 2023"', dt)
        for j, t in enumerate(conv[key]):
            path = f"conversation.{key}[{j}]"
            if not isinstance(t, dict):
                raise bad(path, 'a turn {"speaker", "dia_id", "text"}', t)
            for f, expected in (("speaker", "a string"), ("dia_id", f'a string like "D{n}:{j + 1}"')):
                if not isinstance(t.get(f, _MISSING), str):
                    raise bad(f"{path}.{f}", expected, t.get(f, _MISSING))
            if not isinstance(t.get("text", _MISSING), str) and _caption_text(t) is None:
                raise bad(
                    f"{path}.text",
                    'a string (or a "blip_caption" string for an image-only turn)',
                    t.get("text", _MISSING),
                )
    qa = d.get("qa", _MISSING)
    if not isinstance(qa, list):
        raise bad("qa", "a list of questions", qa)
    for i, q in enumerate(qa):
        if not isinstance(q, dict):
            raise bad(f"qa[{i}]", 'a question {"question", "answer", "evidence", "category"}', q)
        if not isinstance(q.get("question", _MISSING), str):
            raise bad(f"qa[{i}].question", "a string", q.get("question", _MISSING))
        cat = q.get("category", _MISSING)
        if not (isinstance(cat, int) and not isinstance(cat, bool) and cat in CATEGORIES):
            raise bad(f"qa[{i}].category", _CATEGORY_HELP, cat)
        ev = q.get("evidence", _MISSING)
        if not isinstance(ev, list):
            raise bad(f"qa[{i}].evidence", 'a list of dia_id strings like ["D1:3"]', ev)
        for e, x in enumerate(ev):
            if not isinstance(x, str):
                raise bad(f"qa[{i}].evidence[{e}]", 'a dia_id string like "D1:3"', x)
        keys = ("answer", "adversarial_answer") if cat == 5 else ("answer",)
        present = [k for k in keys if k in q]
        if not present:
            raise bad(
                f"qa[{i}].answer",
                "a string or number" + (' (or an "adversarial_answer")' if cat == 5 else ""),
                _MISSING,
            )
        for k in present:
            if not (isinstance(q[k], str) or _is_num(q[k])):
                raise bad(f"qa[{i}].{k}", "a string or number", q[k])
    if "memkit" in d:
        _check_extension(d["memkit"], len(qa), bad)


def _check_extension(ext, n_qa: int, bad) -> None:
    """memkit's own key of a synthetic stream: facts with every StreamFact field, one qa entry per question."""
    import dataclasses

    from memkit.world.conversation import Hop, StreamFact

    if not isinstance(ext, dict):
        raise bad("memkit", 'an object {"facts": [...], "qa": [...]}', ext)
    fields = {f.name for f in dataclasses.fields(StreamFact)}
    for j, f in enumerate(ext.get("facts", [])):
        if not isinstance(f, dict) or set(f) != fields or not all(isinstance(v, str) for v in f.values()):
            raise bad(f"memkit.facts[{j}]", f"an object of strings with exactly the keys {sorted(fields)}", f)
    ext_qa = ext.get("qa", [])
    if not isinstance(ext_qa, list) or len(ext_qa) != n_qa:
        raise bad("memkit.qa", f"a list with one entry per question ({n_qa})", ext_qa)
    hop_fields = {f.name for f in dataclasses.fields(Hop)}
    for j, e in enumerate(ext_qa):
        hops = e.get("hops") if isinstance(e, dict) else None
        if (
            not isinstance(e, dict)
            or not isinstance(e.get("answer"), str)
            or not isinstance(hops, list)
            or any(not isinstance(h, dict) or set(h) != hop_fields for h in hops)
        ):
            raise bad(f"memkit.qa[{j}]", f'{{"answer": str, "hops": [objects with the keys {sorted(hop_fields)}]}}', e)


def _normalised(d: dict) -> dict:
    """A shallow copy of a checked sample with image-only turns given a text and numeric
    adversarial answers made strings (``from_locomo`` already ``str``-s the answer)."""
    conv = dict(d["conversation"])
    for k in conv:
        if _SESSION_RE.fullmatch(k):
            conv[k] = [{**t, "text": c} if (c := _caption_text(t)) is not None else t for t in conv[k]]
    qa = [
        {**q, "adversarial_answer": str(q["adversarial_answer"])} if _is_num(q.get("adversarial_answer")) else q
        for q in d["qa"]
    ]
    return {**d, "conversation": conv, "qa": qa}


def load_locomo(path, limit: int | None = None) -> list[Conversation]:
    """The first ``limit`` (all if None) samples of a LoCoMo file as conversations; a file holding
    one sample object instead of a list is read as a list of one."""
    path, limit = Path(path), _limit(limit)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; to get it, {LOCOMO_GET}")
    data = _read_json(path, LOCOMO_SCHEMA)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected {LOCOMO_SCHEMA}, got a JSON {type(data).__name__}")
    out = []
    for i, d in enumerate(data[:limit]):
        sid = d.get("sample_id") if isinstance(d, dict) else None
        check_locomo_sample(d, f"{path}: sample {i}" + (f" ({sid!r})" if isinstance(sid, str) else ""))
        out.append(Conversation.from_locomo(_normalised(d)))
    return out


def save_locomo(conversations: Iterable[Conversation], path) -> None:
    """Write conversations as a LoCoMo JSON list (atomic; parent directories are created)."""
    text = json.dumps([c.to_locomo() for c in conversations], indent=1, ensure_ascii=False)
    atomic_write_text(path, text + "\n")
