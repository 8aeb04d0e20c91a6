"""The data model at the bottom of memkit: context pieces, parsed outputs, calls, trajectories,
training units, and their JSONL round trip. Imports nothing from memkit but ``io``.

A trajectory is a set of LLM calls. Each call keeps the *exact* token ids the policy saw and
produced, the log-probs of the produced ids under the sampling policy, and where in the context
and the output each tagged part lies, so any packing and any credit assignment can be computed
later without re-running the rollout. ``Call.parent`` links a call to the one it continues: a
plain rollout is a chain (parent = previous call), a forked rollout (Mem-T's operation trees) is
a tree whose root-to-leaf paths are chains. A :class:`TrainingUnit` (a trajectory and a subset
of its calls: a MEM1 row, a MemSearcher call, a DCPO segment, a tree path) is what ``pack()``
turns into training rows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from memkit.core.io import atomic_write_text, read_jsonl

Span = tuple[int, int]  # [start, end) token indices


class ModelError(ValueError):
    """The model's output asked for something the environment cannot do (an unknown memory id, an
    empty argument): the rollout engine records the call as an invalid turn. Any other exception
    raised while applying an output is memkit's own bug and propagates."""


@dataclass
class Segment:
    """A piece of a call's context.

    ``kind`` names what it is for colouring/accounting: "system", "question", "memory",
    "think", "search", "answer", "information", "record", "hint", "chat"...
    """

    kind: str
    text: str
    ref: tuple[int, str] | None = None  # (call index, "output" | "observation")


@dataclass
class Parsed:
    """A parsed model output. ``ok=False`` means an invalid turn; ``error`` says why."""

    ok: bool
    action: str | None = None  # "search" | "answer" | "prune_write" | "memory"
    argument: str | None = None  # query, answer text, or memory text
    fields: dict[str, str] = field(default_factory=dict)  # tag -> content
    prune_ids: list[str] = field(default_factory=list)
    error: str | None = None
    #: tool calls of an output that may hold several (Mem-T): [{"name": str, "arguments": dict}]
    calls: list[dict] = field(default_factory=list)
    #: an invalid output that ends only its own call, not the episode (Mem-T's construction skips
    #: the bad operation and reads on); the method's ``apply`` still runs and may set it
    recoverable: bool = False


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
    parent: int | None = None  # index (in Trajectory.calls) of the call this one continues; None = a root
    reward: float | None = None  # per-call reward where a paper has one (MemPO R_M, Mem-T node reward)
    advantage: float | None = None  # per-call advantage a credit rule assigned (for inspection)

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


@dataclass(frozen=True)
class LeafOutcome:
    """One chain's outcome in a tree trajectory: ``memkit.rollout.trees.merge_tree`` keeps one per
    leaf (in ``Trajectory.info["leaf_outcomes"]``, as plain dicts so traces stay JSON); read them
    with :meth:`Trajectory.leaf_outcomes`."""

    call: int | None  # index of the chain's last call in the tree
    answer: str | None = None
    reward: float | None = None
    valid: bool = True
    reason: str | None = None
    group_index: int = 0

    @property
    def score(self) -> float:
        """The leaf's reward, 0 when the chain was invalid or unscored (Mem-T's leaf F1)."""
        return float(self.reward or 0.0) if self.valid else 0.0


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

    def path(self, i: int) -> list[int]:
        """Call indices from the root to call ``i`` (inclusive), following ``Call.parent``."""
        out = []
        while i is not None:
            out.append(i)
            i = self.calls[i].parent
        return out[::-1]

    def children(self, i: int | None) -> list[int]:
        """Indices of the calls whose parent is ``i`` (``None``: the roots)."""
        return [j for j, c in enumerate(self.calls) if c.parent == i]

    def leaf_outcomes(self) -> list[LeafOutcome]:
        """A tree's per-leaf outcomes (:class:`LeafOutcome`, in chain order); [] for a chain."""
        return [LeafOutcome(**o) for o in self.info.get("leaf_outcomes", [])]

    def leaves(self) -> list[int]:
        """Calls no other call continues (one for a chain: its last call)."""
        parents = {c.parent for c in self.calls}
        return [j for j in range(len(self.calls)) if j not in parents]

    @property
    def is_tree(self) -> bool:
        """True when two calls share a parent (a forked rollout)."""
        parents = [c.parent for c in self.calls]
        return len(set(parents)) < len(parents)

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        d = dict(d)
        calls = []
        for i, c in enumerate(d.pop("calls", [])):
            c = dict(c)
            c.setdefault("parent", i - 1 if i else None)  # traces written before calls had parents were chains
            c["context_spans"] = {k: [tuple(s) for s in v] for k, v in c.get("context_spans", {}).items()}
            c["output_spans"] = {k: [tuple(s) for s in v] for k, v in c.get("output_spans", {}).items()}
            for key in ("context_char_spans", "output_char_spans"):
                c[key] = {k: [tuple(s) for s in v] for k, v in c.get(key, {}).items()}
            c["context_refs"] = [tuple(r) for r in c.get("context_refs", [])]
            calls.append(Call(**c))
        return cls(calls=calls, **d)


@dataclass(frozen=True, eq=False)
class TrainingUnit:
    """What one packed training row (or group of rows) is made of: a trajectory and the indices
    of the calls to train, ascending. A MEM1 row is every call of a trajectory; a DCPO segment
    a run of calls with a fixed prefix; a Mem-T node path the calls from a root to a leaf.

    Context refs still resolve through the whole ``traj.calls`` (indices are absolute), so a
    unit's first call may read an earlier call's output that the unit does not train. Units
    compare and hash by identity.
    """

    traj: Trajectory
    calls: tuple[int, ...]

    @classmethod
    def of(cls, traj: Trajectory) -> "TrainingUnit":
        """Every call of ``traj`` that generated tokens (a call cut off before generating, e.g.
        over the context limit, has nothing to train and is always the last of its path)."""
        return cls(traj, tuple(i for i, c in enumerate(traj.calls) if c.output_ids))

    def __post_init__(self):
        idx = list(self.calls)
        if idx != sorted(set(idx)) or (idx and not 0 <= idx[0] <= idx[-1] < len(self.traj.calls)):
            raise ValueError(
                f"TrainingUnit.calls {self.calls} must be distinct ascending indices into "
                f"the trajectory's {len(self.traj.calls)} calls"
            )

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self):
        """``(index, call)`` pairs of the unit's calls."""
        return ((i, self.traj.calls[i]) for i in self.calls)

    @property
    def n_tokens(self) -> int:
        """Tokens the unit brings to a forward pass whatever the packing: its first context plus
        every output and observation (a sort key for micro-batches)."""
        if not self.calls:
            return 0
        first = len(self.traj.calls[self.calls[0]].context_ids)
        return first + sum(len(c.output_ids) + len(c.observation_ids) for _, c in self)


def as_unit(item: "Trajectory | TrainingUnit") -> TrainingUnit:
    """A trajectory means all its calls that generated tokens (:meth:`TrainingUnit.of`)."""
    return item if isinstance(item, TrainingUnit) else TrainingUnit.of(item)


def save_jsonl(trajs: Iterable[Trajectory], path: str | Path) -> None:
    atomic_write_text(path, "".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in trajs))


def load_jsonl(path: str | Path) -> list[Trajectory]:
    return read_jsonl(path, Trajectory.from_dict, "trace", f"write one with `memkit rollout --out {path}`")
