"""Trajectory / Call data model and its JSONL round trip.

A trajectory is a list of LLM calls. Each call keeps the *exact* token ids the policy saw
and produced, the log-probs of the produced ids under the sampling policy, and where in the
context and the output each tagged part lies, so any packing (separate, MEM1 mask, DCPO
segments) and any credit assignment can be computed later without re-running the rollout.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

Span = tuple[int, int]  # [start, end) token indices


@dataclass
class Call:
    turn: int
    role: str  # "act" | "memory"
    context_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]  # one per output id, under the sampling policy (None-free; 0.0 for scripted)
    context_text: str = ""
    output_text: str = ""
    # kind -> token spans in the context (from the method's Segments), e.g. {"memory": [(12, 40)]}
    context_spans: dict[str, list[Span]] = field(default_factory=dict)
    # the same spans in characters of context_text / output_text (for viewers without a tokenizer)
    context_char_spans: dict[str, list[Span]] = field(default_factory=dict)
    output_char_spans: dict[str, list[Span]] = field(default_factory=dict)
    # context segments that copy an earlier call: [(start, end, call_index, "output"|"observation")]
    context_refs: list[tuple[int, int, int, str]] = field(default_factory=list)
    # tag -> token spans in the output, e.g. {"think": [(0, 15)], "search": [(15, 22)]}
    output_spans: dict[str, list[Span]] = field(default_factory=dict)
    observation_text: str | None = None
    observation_ids: list[int] = field(default_factory=list)
    valid: bool = True
    reason: str | None = None
    seconds: float = 0.0

    @property
    def n_context(self) -> int:
        return len(self.context_ids)

    @property
    def n_output(self) -> int:
        return len(self.output_ids)

    @property
    def n_total(self) -> int:
        """Tokens held in context while this call generates (its peak)."""
        return len(self.context_ids) + len(self.output_ids)


@dataclass
class Trajectory:
    task_id: str
    method: str
    calls: list[Call] = field(default_factory=list)
    group_index: int = 0  # index among the N samples of the same task
    answer: str | None = None
    golds: list[list[str]] = field(default_factory=list)
    reward: float | None = None
    valid: bool = True
    reason: str | None = None
    info: dict = field(default_factory=dict)  # metrics and method extras (e.g. pruned record ids)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        d = dict(d)
        calls = []
        for c in d.pop("calls", []):
            c = dict(c)
            c["context_spans"] = {k: [tuple(s) for s in v] for k, v in c.get("context_spans", {}).items()}
            c["output_spans"] = {k: [tuple(s) for s in v] for k, v in c.get("output_spans", {}).items()}
            for key in ("context_char_spans", "output_char_spans"):
                c[key] = {k: [tuple(s) for s in v] for k, v in c.get(key, {}).items()}
            c["context_refs"] = [tuple(r) for r in c.get("context_refs", [])]
            calls.append(Call(**c))
        return cls(calls=calls, **d)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file + rename so a crash never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_jsonl(trajs: Iterable[Trajectory], path: str | Path) -> None:
    atomic_write_text(path, "".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in trajs))


def load_jsonl(path: str | Path) -> list[Trajectory]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file {path} does not exist; write one with `memkit rollout --out {path}`")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise ValueError(f"{path}:{i} is not a memkit trajectory ({e}); traces come from `memkit rollout --out`") from None
    return out
