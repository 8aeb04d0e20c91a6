"""Property tests of Mem-T's hierarchical memory store (memkit.envs.memory_store).

Random sequences of ADD / UPDATE / DELETE / IGNORE / set_persona / set_summary / search run
against a ``MemoryStore`` and, in parallel, against a plain-dict model kept here. After every
operation the store must agree with the model: no memory lost or duplicated, ids never reused,
UPDATE and DELETE touch only what they name, sources merge as an order-preserving union,
failed operations change nothing, search returns what a freshly built BM25 index returns (so
a stale index can't leak a deleted or outdated memory), and evolution is deterministic.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memkit.envs.memory_store import FORMED_TYPES, MEMORY_TYPES, Memory, MemoryStore, StoreError
from memkit.envs.search import make_retriever
from memkit.world.schema import Passage

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- strategies ---------------------------------------------------------------------------
WORDS = [
    "kofak",
    "puksek",
    "lives",
    "in",
    "the",
    "river",
    "blue",
    "moon",
    "train",
    "alice",
    "bob",
    "paints",
    "a",
    "of",
    "music",
    "garden",
    "Kofak",
    "LIVES",
    "dog",
    "cat",
]
NAMES = ["Alice", "alice", " Bob ", "bob", "Carol", "Kofak", ""]

word_text = st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join)
text = st.one_of(word_text, word_text, word_text, st.text(max_size=8))
source = st.one_of(st.sampled_from([f"d{i}" for i in range(8)]), st.integers(0, 3))
sources = st.lists(source, max_size=4)
mtype = st.sampled_from(MEMORY_TYPES)
opt_time = st.one_of(st.none(), st.sampled_from(["", "t1", "t2", "2023-05-01"]))
# a memory reference: an existing id (by index into the live ids), a previously deleted id,
# or a made-up id (possibly the id a future ADD will get)
ref = st.one_of(
    st.tuples(st.just("live"), st.integers(0, 50)),
    st.tuples(st.just("deleted"), st.integers(0, 50)),
    st.tuples(st.just("made_up"), st.sampled_from(["f1", "e2", "p1", "s1", "t1", "x9", "", "f999", "F1"])),
)
query = st.one_of(word_text, st.sampled_from(["", "   ", "kofak lives", "blue moon", "the"]))

op = st.one_of(
    st.tuples(
        st.just("add"),
        mtype,
        text,
        sources,
        st.sampled_from(["", "t1"]),
        st.sampled_from(["", "s"]),
        st.sampled_from(["", "e"]),
    ),
    st.tuples(st.just("update"), ref, text, sources, opt_time, opt_time, opt_time),
    st.tuples(st.just("delete"), ref),
    st.tuples(st.just("ignore"), st.text(max_size=5)),
    st.tuples(st.just("persona"), st.sampled_from(NAMES), word_text, sources, st.sampled_from(["", "t1"])),
    st.tuples(st.just("summary"), text, sources, st.sampled_from(["", "t2"])),
    st.tuples(st.just("search"), mtype, query, st.integers(-1, 6)),
)
ops = st.lists(op, max_size=25)


def _uniq(xs):
    return tuple(dict.fromkeys(str(x) for x in xs))


# ---- the model ----------------------------------------------------------------------------
class Model:
    """What the store should hold: id -> Memory built by hand, in creation order."""

    PREFIX = {"fact": "f", "experience": "e", "persona": "p", "summary": "s", "raw": "t"}

    def __init__(self):
        self.items: dict[str, Memory] = {}
        self.counters = {t: 0 for t in MEMORY_TYPES}
        self.issued: list[str] = []  # every id ever returned by an ADD
        self.deleted: list[str] = []
        self.working = ""
        self.log_len = 0
        self.persona_ids: dict[str, str] = {}  # normalised name -> persona id

    def resolve(self, r) -> str:
        kind, x = r
        if kind == "live":
            live = list(self.items)
            return live[x % len(live)] if live else "f999"
        if kind == "deleted":
            return self.deleted[x % len(self.deleted)] if self.deleted else "x9"
        return x

    def add(self, type, text, srcs, turn_time="", start_time="", end_time="") -> str:
        self.counters[type] += 1
        mid = f"{self.PREFIX[type]}{self.counters[type]}"
        self.items[mid] = Memory(mid, type, str(text), _uniq(srcs), turn_time, start_time, end_time, 1)
        self.issued.append(mid)
        self.log_len += 1
        return mid

    def update(self, mid, text, srcs, turn_time=None, start_time=None, end_time=None) -> Memory:
        old = self.items[mid]
        new = Memory(
            mid,
            old.type,
            str(text),
            _uniq((*old.sources, *srcs)),
            old.turn_time if turn_time is None else turn_time,
            old.start_time if start_time is None else start_time,
            old.end_time if end_time is None else end_time,
            old.version + 1,
        )
        self.items[mid] = new
        self.log_len += 1
        return new

    def delete(self, mid) -> Memory:
        self.persona_ids = {k: v for k, v in self.persona_ids.items() if v != mid}
        old = self.items.pop(mid)
        self.deleted.append(mid)
        self.log_len += 1
        return old

    def persona_target(self, name):
        return self.persona_ids.get(" ".join(name.lower().split()))


def reference_search(store: MemoryStore, type: str, q: str, k: int) -> list[str]:
    """Search over a freshly built BM25 index of the live memories of ``type`` (no cache)."""
    if not q.strip() or k < 1:
        return []
    mems = [m for m in store.items.values() if m.type == type]
    if not mems:
        return []
    r = make_retriever("bm25", [Passage(id=m.id, title="", text=m.text) for m in mems])
    return [h.passage.id for h in r.search(q.strip(), min(k, len(mems)))]


def check_search(store: MemoryStore, type: str, q: str, k: int) -> list[Memory]:
    got = store.search(type, q, k)
    assert len(got) <= max(k, 0)
    ids = [m.id for m in got]
    assert len(set(ids)) == len(ids), ids
    for m in got:  # only live memories of that type, exactly as stored
        assert m.type == type
        assert store.items.get(m.id) is m
    assert ids == reference_search(store, type, q, k), (type, q, k)
    return got


def check_agrees(store: MemoryStore, model: Model):
    assert list(store.items) == list(model.items)  # same live ids, same (creation) order
    for mid, m in model.items.items():
        assert store.items[mid] == m
    assert len(model.issued) == len(set(model.issued))  # ids never reused
    assert not set(model.deleted) & set(store.items)
    assert store.working == model.working
    assert len(store.log) == model.log_len
    assert store.evidence_ids() == {s for m in model.items.values() if m.type in FORMED_TYPES for s in m.sources}
    assert store.snapshot()["items"] == [vars_of(m) for m in model.items.values()]


def vars_of(m: Memory) -> dict:
    return {
        f: getattr(m, f) for f in ("id", "type", "text", "sources", "turn_time", "start_time", "end_time", "version")
    }


def run_ops(store: MemoryStore, model: Model, seq, calls: list | None = None):
    """Apply ``seq`` to ``store`` and ``model``, checking each step; ``calls`` records the
    concrete (method, args, kwargs) for a replay."""
    for o in seq:
        before = dict(store.items)
        log_before = list(store.log)
        state_before = (store.working, dict(store.counters))
        kind = o[0]
        if kind == "add":
            _, type, txt, srcs, tt, st_, et = o
            call = ("add", (type, txt, srcs), dict(turn_time=tt, start_time=st_, end_time=et))
            mid = store.add(type, txt, srcs, turn_time=tt, start_time=st_, end_time=et)
            assert mid not in model.issued and mid not in before  # a new id, every time
            assert mid == model.add(type, txt, srcs, tt, st_, et)
            assert {k: v for k, v in store.items.items() if k != mid} == before
        elif kind in ("update", "delete"):
            mid = model.resolve(o[1])
            if kind == "update":
                _, _, txt, srcs, tt, st_, et = o
                call = ("update", (mid, txt, srcs), dict(turn_time=tt, start_time=st_, end_time=et))
            else:
                call = ("delete", (mid,), {})
            if mid not in model.items:  # unknown or deleted id: StoreError, nothing changes
                with pytest.raises(StoreError):
                    getattr(store, kind)(*call[1], **call[2])
                assert store.items == before
                assert store.log == log_before
                assert (store.working, store.counters) == state_before
            elif kind == "update":
                old = before[mid]
                new = store.update(*call[1], **call[2])
                assert new == model.update(mid, txt, srcs, tt, st_, et)
                assert (new.id, new.type, new.version) == (mid, old.type, old.version + 1)
                assert new.sources[: len(old.sources)] == old.sources  # order-preserving union
                assert set(new.sources) == set(old.sources) | {str(s) for s in srcs}
                assert len(set(new.sources)) == len(new.sources)
                assert list(store.items) == list(before)  # keeps its place
                assert {k: v for k, v in store.items.items() if k != mid} == {
                    k: v for k, v in before.items() if k != mid
                }
            else:
                gone = store.delete(mid)
                assert gone == model.delete(mid) == before[mid]
                assert store.items == {k: v for k, v in before.items() if k != mid}
        elif kind == "ignore":
            call = ("ignore", (o[1],), {})
            store.ignore(o[1])
            model.log_len += 1
            assert store.items == before and store.log[-1] == ("ignore", None, o[1])
        elif kind == "persona":
            _, name, profile, srcs, tt = o
            call = ("set_persona", (name, profile, srcs), dict(turn_time=tt))
            target = model.persona_target(name)
            mid = store.set_persona(name, profile, srcs, turn_time=tt)
            if target is None:
                assert mid == model.add("persona", f"{name}: {profile}", srcs, tt)
                model.persona_ids[" ".join(name.lower().split())] = mid
                assert {k: v for k, v in store.items.items() if k != mid} == before
            else:
                assert mid == target
                model.update(mid, f"{name}: {profile}", srcs, turn_time=tt or None)  # "" keeps the old time
                assert {k: v for k, v in store.items.items() if k != mid} == {
                    k: v for k, v in before.items() if k != mid
                }
        elif kind == "summary":
            _, content, srcs, tt = o
            call = ("set_summary", (content, srcs), dict(turn_time=tt))
            mid = store.set_summary(content, srcs, turn_time=tt)
            model.working = str(content)
            assert mid == model.add("summary", content, srcs, tt)
        elif kind == "search":
            _, type, q, k = o
            call = ("search", (type, q, k), {})
            check_search(store, type, q, k)
            assert store.items == before and store.log == log_before  # reading changes nothing
        else:  # pragma: no cover
            raise AssertionError(o)
        if calls is not None:
            calls.append(call)
        check_agrees(store, model)


def replay(calls) -> MemoryStore:
    s = MemoryStore()
    for name, args, kwargs in calls:
        try:
            getattr(s, name)(*args, **kwargs)
        except StoreError:
            pass
    return s


PROBES = [
    (t, q, k)
    for t in ("fact", "persona", "summary")
    for q, k in (("kofak lives", 3), ("blue moon", 5), ("the river", 1))
]


# ---- property tests -----------------------------------------------------------------------
@settings(max_examples=300, **SETTINGS)
@given(ops)
def test_random_sequences_agree_with_model(seq):
    """No memory lost or duplicated; ids unique and never reused; UPDATE/DELETE only touch what
    they name; unknown ids raise and change nothing; search == a fresh index; evidence_ids."""
    store, model = MemoryStore(), Model()
    run_ops(store, model, seq)
    for t in MEMORY_TYPES:  # at the end, search each live memory's own text
        assert store.of_type(t) == [x for x in model.items.values() if x.type == t]
        for m in store.of_type(t):
            if any(w.isalnum() and len(w) > 1 for w in m.text.split()):
                check_search(store, t, m.text, 50)


@settings(max_examples=100, **SETTINGS)
@given(ops)
def test_evolution_is_deterministic(seq):
    """Replaying the same operations on a fresh store gives the same snapshot, log and search results."""
    store, calls = MemoryStore(), []
    run_ops(store, Model(), seq, calls)
    again = replay(calls)
    assert again.snapshot() == store.snapshot()
    assert again.log == store.log and again.counters == store.counters
    assert again == store
    for t, q, k in PROBES:
        assert again.search(t, q, k) == store.search(t, q, k)


@settings(max_examples=100, **SETTINGS)
@given(ops, ops, ops, st.lists(st.tuples(mtype, query, st.integers(1, 6)), max_size=3))
def test_deepcopy_forks_independently(before, on_copy, on_original, probes):
    store, model = MemoryStore(), Model()
    run_ops(store, model, before)
    for t, q, k in PROBES + probes:  # build the original's indexes before forking
        check_search(store, t, q, k)
    fork = copy.deepcopy(store)
    assert fork == store and fork.snapshot() == store.snapshot()
    frozen = (dict(store.items), list(store.log), store.working, dict(store.counters), store.snapshot())

    fork_model = copy.deepcopy(model)
    run_ops(fork, fork_model, on_copy)  # mutating the copy ...
    assert (dict(store.items), list(store.log), store.working, dict(store.counters), store.snapshot()) == frozen
    check_agrees(store, model)  # ... leaves the original unchanged
    for t, q, k in PROBES + probes:  # and both still search correctly
        check_search(store, t, q, k)
        check_search(fork, t, q, k)

    fork_frozen = (dict(fork.items), list(fork.log), fork.working, dict(fork.counters))
    run_ops(store, model, on_original)  # and the other way round
    assert (dict(fork.items), list(fork.log), fork.working, dict(fork.counters)) == fork_frozen
    for t, q, k in PROBES + probes:
        check_search(store, t, q, k)
        check_search(fork, t, q, k)


@settings(max_examples=100, **SETTINGS)
@given(st.lists(word_text, min_size=1, max_size=6), st.data())
def test_deleted_or_updated_memory_never_comes_back_from_search(texts, data):
    """The index is invalidated on change: search right after a search built the index."""
    store = MemoryStore()
    ids = [store.add("fact", t) for t in texts]
    ids.append(store.add("fact", "kofak lives in puksek"))
    q = "kofak lives"
    assert ids[-1] in [m.id for m in check_search(store, "fact", q, 10)]  # index built
    victim = data.draw(st.sampled_from(ids))
    if data.draw(st.booleans()):
        store.delete(victim)
        got = check_search(store, "fact", q, 10)
        assert victim not in [m.id for m in got]
        assert all(m.id != victim for t in ("moon", "river blue", "garden") for m in store.search("fact", t, 10))
    else:
        store.update(victim, "zzzunique words only")
        assert [m.id for m in store.search("fact", "zzzunique", 10)] == [victim]
        assert victim not in [m.id for m in check_search(store, "fact", q, 10)]
    store.add("experience", "kofak lives")  # another type's change doesn't disturb this one
    check_search(store, "fact", q, 10)


# ---- examples -----------------------------------------------------------------------------
def test_bm25_finds_kofak():
    store = MemoryStore()
    store.add("fact", "Alice paints the garden blue.")
    kid = store.add("fact", "Kofak lives in Puksek.", ["d3"])
    store.add("fact", "The river floods every spring.")
    store.add("experience", "Kofak lives far away.")  # another type: not searched
    store.add("fact", "Bob keeps a cat named Moon.")
    hits = store.search("fact", "Kofak lives", 2)
    assert hits[0].id == kid and hits[0].text == "Kofak lives in Puksek."
    assert all(m.type == "fact" for m in hits)
    assert hits[0].render() == f"[{kid}] Kofak lives in Puksek."
    assert store.search("fact", "   ", 3) == [] and store.search("fact", "Kofak", 0) == []


def test_unknown_type_raises_store_error_naming_the_choices():
    store = MemoryStore()
    for call in (lambda: store.add("facts", "x"), lambda: store.search("memo", "x"), lambda: store.of_type("")):
        with pytest.raises(StoreError) as e:
            call()
        assert isinstance(e.value, ValueError)
        assert all(t in str(e.value) for t in MEMORY_TYPES)
    assert store.items == {} and store.log == []
    with pytest.raises(StoreError, match="unknown memory id"):
        store.update("f1", "x")


def test_set_persona_twice_keeps_one_persona():
    store = MemoryStore()
    store.add("fact", "Alice: not a persona")
    pid = store.set_persona("Alice", "likes tea", ["d1", "d2"])
    assert store.set_persona("alice ", "likes coffee", ["d2", "d3"]) == pid  # same name, any case/space
    personas = store.of_type("persona")
    assert len(personas) == 1
    p = personas[0]
    assert (p.id, p.text, p.sources, p.version) == (pid, "alice : likes coffee", ("d1", "d2", "d3"), 2)
    assert store.set_persona("Bob", "rides trains") != pid and len(store.of_type("persona")) == 2
    assert store.evidence_ids() == {"d1", "d2", "d3"}


def test_set_summary_sets_working_memory_and_archives():
    store = MemoryStore()
    a = store.set_summary("first session", ["d1"])
    b = store.set_summary("second session", ["d2"])
    assert store.working == "second session" and a != b
    assert [m.text for m in store.of_type("summary")] == ["first session", "second session"]
    assert store.evidence_ids() == set()  # summaries are not formed memories


def test_set_persona_name_with_colon_keeps_one_persona():  # names were once matched on text.split(":")
    store = MemoryStore()
    pid = store.set_persona("Dr: Who", "a time traveller")
    assert store.set_persona("Dr: Who", "has a blue box") == pid
    assert len(store.of_type("persona")) == 1
