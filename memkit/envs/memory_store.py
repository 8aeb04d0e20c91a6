"""Mem-T's hierarchical memory store (eq. 1-2) and the operations its tools run (eq. 3-7).

    M_t = <M_work, M_fact, M_exp, M_raw>                      (eq. 1)
    M_fact = {(f_i, t_start, t_end)},  M_exp = {(e_j, t_start, t_end)},  M_raw = {(x_l, t_l)}  (eq. 2)

plus the persona profiles and session summaries of the released tools (``update_persona``,
``update_summary``, ``search_personas``, ``search_summary``). Working memory is the latest
summary. Every memory keeps the dialogue ids it came from (``sources``: Mem-T's X_src, what
hindsight credit and the evidence metric read).

Evolution (eq. 4-5): ``M_{t+1} = (M_t \\ Delta-) U Delta+`` where ADD puts the candidate in
Delta+, UPDATE puts the refined memory in Delta+ and the old one in Delta- (memkit keeps the
id, so later calls can still name it, and merges the sources), DELETE puts its target in
Delta-, IGNORE changes nothing. Ids are never reused, so no sequence of operations loses a
memory it did not name or duplicates one.

Retrieval (eq. 6) goes through memkit's retrieval backends (BM25 by default) over the live
memories of one type, ties broken by age; the index is rebuilt only when that type changed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from memkit.core.trajectory import ModelError
from memkit.world.schema import Passage

#: the stores an agent can search (eq. 6) and the id prefix of each
MEMORY_TYPES = ("fact", "experience", "persona", "summary", "raw")
ID_PREFIX = {"fact": "f", "experience": "e", "persona": "p", "summary": "s", "raw": "t"}
#: the stores the agent writes itself (the evidence metric reads these; raw is archived for it)
FORMED_TYPES = ("fact", "experience", "persona")
#: the stores whose sources are specific turns (a summary's are its whole session)
EVIDENCE_TYPES = (*FORMED_TYPES, "raw")


class StoreError(ModelError):
    """An operation the store cannot run (unknown id or type): the caller's turn is invalid."""


@dataclass(frozen=True)
class Memory:
    id: str
    type: str
    text: str
    sources: tuple[str, ...] = ()  # dialogue ids (X_src)
    turn_time: str = ""  # when the chunk that made it was said
    start_time: str = ""
    end_time: str = ""
    version: int = 1  # 1 + number of UPDATEs

    def render(self) -> str:
        """How a retrieval result shows it to the agent: ``[f3] text (start - end)``."""
        when = " - ".join(str(t) for t in (self.start_time, self.end_time) if t)
        return f"[{self.id}] {self.text}" + (f" ({when})" if when else "")


@dataclass
class MemoryStore:
    retriever: str = "bm25"
    items: dict = field(default_factory=dict)  # id -> Memory, in creation order
    working: str = ""  # M_work: the latest session summary
    personas: dict = field(default_factory=dict)  # normalised name -> id of its persona memory
    log: list = field(default_factory=list)  # (op, id or None, detail) per operation, in order
    counters: dict = field(default_factory=lambda: {t: 0 for t in MEMORY_TYPES})
    _versions: dict = field(default_factory=lambda: {t: 0 for t in MEMORY_TYPES}, repr=False, compare=False)
    _index: dict = field(default_factory=dict, repr=False, compare=False)  # type -> (version, retriever, ids)

    def __deepcopy__(self, memo):  # forks copy the memories (immutable), not the search index
        return MemoryStore(
            self.retriever,
            dict(self.items),
            self.working,
            dict(self.personas),
            list(self.log),
            dict(self.counters),
            dict(self._versions),
            {},
        )

    # ---- eq. 4-5: the four evolution operations, and formation's direct writes ---------------
    def add(
        self, type: str, text: str, sources=(), turn_time: str = "", start_time: str = "", end_time: str = ""
    ) -> str:
        """ADD: a new memory with a fresh id; returns the id."""
        self._check_type(type)
        self.counters[type] += 1
        mid = f"{ID_PREFIX[type]}{self.counters[type]}"
        self.items[mid] = Memory(mid, type, str(text), _uniq(sources), turn_time, start_time, end_time)
        self._touch(type)
        self.log.append(("add", mid, type))
        return mid

    def update(
        self,
        mid: str,
        text: str,
        sources=(),
        turn_time: str | None = None,
        start_time: str | None = None,
        end_time: str | None = None,
    ) -> Memory:
        """UPDATE: replace ``mid``'s text (and the times given), merge ``sources``; the id stays."""
        old = self.get(mid)
        new = replace(
            old,
            text=str(text),
            sources=_uniq((*old.sources, *sources)),
            version=old.version + 1,
            **{
                k: v
                for k, v in (("turn_time", turn_time), ("start_time", start_time), ("end_time", end_time))
                if v is not None
            },
        )
        self.items[mid] = new
        self._touch(old.type)
        self.log.append(("update", mid, old.text))
        return new

    def delete(self, mid: str) -> Memory:
        """DELETE: remove ``mid``; returns what was removed."""
        old = self.get(mid)
        del self.items[mid]
        self.personas = {k: v for k, v in self.personas.items() if v != mid}
        self._touch(old.type)
        self.log.append(("delete", mid, old.text))
        return old

    def ignore(self, reason: str = "") -> None:
        """IGNORE: nothing changes (logged, so a trace shows the decision)."""
        self.log.append(("ignore", None, str(reason)))

    def set_persona(self, name: str, profile: str, sources=(), turn_time: str = "") -> str:
        """``update_persona``: add the profile of ``name`` or rewrite it (one persona per name,
        names compared case- and space-insensitively); an empty ``turn_time`` keeps the old one."""
        found = self.persona(name)
        if found is not None:
            return self.update(found.id, f"{name}: {profile}", sources, turn_time=turn_time or None).id
        mid = self.add("persona", f"{name}: {profile}", sources, turn_time)
        self.personas[_name_key(name)] = mid
        return mid

    def persona(self, name: str) -> Memory | None:
        """The persona memory of ``name`` (``search_personas``' exact lookup), or None."""
        mid = self.personas.get(_name_key(name))
        return self.items.get(mid) if mid else None

    def set_summary(self, content: str, sources=(), turn_time: str = "") -> str:
        """``update_summary``: the working memory becomes ``content``, archived as a summary memory."""
        self.working = str(content)
        return self.add("summary", content, sources, turn_time)

    # ---- reading ------------------------------------------------------------------------
    def get(self, mid: str) -> Memory:
        if mid not in self.items:
            raise StoreError(f"unknown memory id {mid!r}")
        return self.items[mid]

    def of_type(self, type: str) -> list[Memory]:
        self._check_type(type)
        return [m for m in self.items.values() if m.type == type]

    def search(self, type: str, query: str, k: int = 5) -> list[Memory]:
        """Eq. 6's Search(r, key, topk): the ``k`` live memories of ``type`` nearest ``query``."""
        self._check_type(type)
        if not isinstance(query, str) or not query.strip() or k < 1:
            return []
        version = self._versions[type]
        cached = self._index.get(type)
        if cached is None or cached[0] != version:
            mems = self.of_type(type)
            if not mems:
                return []
            from memkit.envs.search import make_retriever

            passages = [Passage(id=m.id, title="", text=m.text) for m in mems]
            kw = {"persist": False} if self.retriever == "dense" else {}  # the store changes every call
            cached = (version, make_retriever(self.retriever, passages, **kw), [m.id for m in mems])
            self._index[type] = cached
        hits = cached[1].search(query.strip(), min(k, len(cached[2])))
        return [self.items[h.passage.id] for h in hits]

    def evidence_ids(self, types=FORMED_TYPES) -> set[str]:
        """Dialogue ids that reached a live memory of ``types``."""
        return {s for m in self.items.values() if m.type in types for s in m.sources}

    def sources_of(self, types=EVIDENCE_TYPES) -> dict[str, tuple[str, ...]]:
        """``{id: sources}`` of the live memories of ``types``."""
        return {m.id: m.sources for m in self.items.values() if m.type in types}

    def snapshot(self) -> dict:
        """Plain data for traces and viewers: ``{"working": str, "items": [memory dicts]}``."""
        return {"working": self.working, "items": [asdict(m) for m in self.items.values()]}

    def _check_type(self, type: str) -> None:
        if type not in MEMORY_TYPES:
            raise StoreError(f"unknown memory type {type!r}; choose one of {', '.join(MEMORY_TYPES)}")

    def _touch(self, type: str) -> None:
        self._versions[type] += 1


def _name_key(name: str) -> str:
    return " ".join(str(name).lower().split())


def _uniq(xs) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(x) for x in xs))
