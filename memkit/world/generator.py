"""Seeded synthetic world: fictional entities, wiki-style passages, multi-hop questions.

Why synthetic: every name is made up from syllables, so no model (tiny or 7B) can answer
from pre-training; the only way to a correct answer is to search and *remember* what was
read -- exactly the skill the five papers train. Why these shapes: HotpotQA-like 1-hop,
2-hop bridge and comparison questions give 1-2 retrieval hops per question, and MEM1
Prompt 1 (`compose_prompt`) stacks ``k`` of them into one long-horizon task.

Guarantees (tested): same seed -> identical world and tasks (only ``random.Random``, lists
and sorted iteration; never ``hash()`` or set order), every sub-answer appears verbatim in
its passage, and each sub-question's keyword ``query`` ("<name> <keyword>") puts its passage
in BM25's top 3: the keyword occurs in every sentence template of its attribute.

This module is how a world is drawn; what it is drawn from (the entity types, the attribute
table, name syllables, filler sentences and distractor pages) is :mod:`memkit.world.vocab`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from memkit.world.composite import QuestionSet
from memkit.world.schema import Passage, Question, SubQuestion, Task, compose_prompt
from memkit.world.splits import check_split, in_split, split_share
from memkit.world.vocab import (
    ATTRS,
    CODAS,
    COLOUR,
    COMPANY_SUFFIX,
    DISTRACTORS,
    FILM_NOUNS,
    NUMBERS,
    ONSETS,
    REAL_WORDS,
    SUBJECT,
    TYPES,
    VOWELS,
    WORDS,
    Attr,
)

KINDS = ("1hop", "bridge", "comparison")


@dataclass
class Entity:
    id: str
    type: str
    name: str
    attributes: dict[str, str] = field(default_factory=dict)  # attr name -> surface value


@dataclass
class World:
    """Entities plus their passages. Lookups are rebuilt from the lists, never stored twice."""

    seed: int
    entities: list[Entity]
    passages: list[Passage]
    passage_by_id: dict = field(init=False, repr=False)
    entity_by_name: dict = field(init=False, repr=False)
    entity_by_id: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.passage_by_id = {p.id: p for p in self.passages}
        self.entity_by_name = {e.name: e for e in self.entities}
        self.entity_by_id = {e.id: e for e in self.entities}

    def of_type(self, etype: str) -> list[Entity]:
        return [e for e in self.entities if e.type == etype]


class _Namer:
    """Pronounceable, world-unique fictional words: no word is reused by two names."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self) -> str:
        for _ in range(10000):
            n = 2 if self.rng.random() < 0.75 else 3
            r = self.rng
            w = "".join(r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS) for _ in range(n))
            if 4 <= len(w) <= 10 and w not in self.used and w not in REAL_WORDS:
                self.used.add(w)
                return w.capitalize()
        raise RuntimeError("name space exhausted; lower n_per_type")

    def name(self, etype: str) -> str:
        r, w = self.rng, self.word()
        return {
            "person": lambda: f"{w} {self.word()}",
            "city": lambda: w,
            "company": lambda: f"{w} {r.choice(COMPANY_SUFFIX)}",
            "film": lambda: f"{w} {r.choice(FILM_NOUNS)}",
            "band": lambda: f"The {w}s",
            "university": lambda: f"{w} University" if r.random() < 0.5 else f"University of {w}",
        }[etype]()


def _literal(attr: str, rng: random.Random, countries: list[str], namer: _Namer) -> str:
    if attr in NUMBERS:
        return str(rng.randint(*NUMBERS[attr]))
    if attr == "country":
        return rng.choice(countries)
    if attr == "river":
        return namer.word()
    return rng.choice(WORDS[attr])


def make_world(seed: int = 0, n_per_type: int = 40, n_distractors: int | None = None) -> World:
    """Build a world of ``n_per_type`` entities of each of the 6 types plus distractor pages.

    ``n_distractors`` defaults to ``n_per_type``: noise pages that mention entity names but
    no facts, so retrieval by name alone is not enough to pick the right page.
    """
    if not isinstance(n_per_type, int) or n_per_type < 2:
        raise ValueError(f"n_per_type must be an int >= 2 (comparisons need two entities per type), got {n_per_type!r}")
    n_distractors = n_per_type if n_distractors is None else n_distractors
    if not isinstance(n_distractors, int) or n_distractors < 0:
        raise ValueError(f"n_distractors must be an int >= 0, got {n_distractors!r}")
    rng = random.Random(seed)
    namer = _Namer(rng)
    countries = [namer.word() for _ in range(max(2, n_per_type // 8))]
    entities = [Entity(f"{t}-{i:03d}", t, namer.name(t)) for t in TYPES for i in range(n_per_type)]
    by_type = {t: [e for e in entities if e.type == t] for t in TYPES}
    for e in entities:
        for a in ATTRS:
            if a.etype == e.type:
                e.attributes[a.name] = (
                    rng.choice(by_type[a.target]).name if a.target else _literal(a.name, rng, countries, namer)
                )
    passages = []
    for e in entities:
        subj = SUBJECT.get(e.type, "{n}").format(n=e.name)
        subj = subj[0].upper() + subj[1:]
        sents = [
            rng.choice(a.sentences).format(n=subj if i == 0 else e.name, v=e.attributes[a.name])
            for i, a in enumerate(a for a in ATTRS if a.etype == e.type)
        ]
        first, rest = sents[0], sents[1:] + [rng.choice(COLOUR[e.type]).format(n=e.name)]
        rng.shuffle(rest)
        passages.append(Passage(e.id, e.name, " ".join([first] + rest)))
    for i in range(n_distractors):
        title_t, text_t = DISTRACTORS[i % len(DISTRACTORS)]
        title = title_t.format(W=namer.word())
        e1, e2 = rng.sample(entities, 2)
        passages.append(Passage(f"misc-{i:03d}", title, text_t.format(t=title, e1=e1.name, e2=e2.name)))
    return World(seed=seed, entities=entities, passages=passages)


def aliases(world: World, attr: str, value: str) -> list[str]:
    """Canonical surface form first, then forms a grader should also accept."""
    out = [value]
    ent = world.entity_by_name.get(value)
    if ent is not None:
        words = value.split()
        if ent.type == "person":
            out.append(words[-1])
        elif ent.type in ("company", "university"):
            out.append(next(w for w in words if w not in COMPANY_SUFFIX + ["University", "of"]))
        elif ent.type == "band":
            out.append(value[4:])
    elif value.isdigit() and int(value) >= 10000:
        out.append(f"{int(value):,}")
    if attr == "runtime":
        out.append(f"{value} minutes")
    return out


def _subject(e: Entity) -> str:
    return SUBJECT.get(e.type, "{n}").format(n=e.name)


def _hop(world: World, e: Entity, a: Attr) -> SubQuestion:
    return SubQuestion(
        text=a.question.format(s=_subject(e)), query=f"{e.name} {a.kw}", answer=e.attributes[a.name], passage_id=e.id
    )


def _make_question(world: World, kind: str, rng: random.Random) -> Question | None:
    """One random question of ``kind``; None when the draw is degenerate (caller redraws)."""
    if kind == "1hop":
        a = rng.choice(ATTRS)
        e = rng.choice(world.of_type(a.etype))
        h = _hop(world, e, a)
        return Question(f"1hop:{e.id}.{a.name}", h.text, aliases(world, a.name, h.answer), kind, [e.id], [h])
    if kind == "bridge":
        r1 = rng.choice([a for a in ATTRS if a.target])
        r2 = rng.choice([a for a in ATTRS if a.etype == r1.target])
        e = rng.choice(world.of_type(r1.etype))
        mid = world.entity_by_name[e.attributes[r1.name]]
        h1, h2 = _hop(world, e, r1), _hop(world, mid, r2)
        if h2.answer == e.name:  # "the mayor of the city where X was born" == X: trivial
            return None
        text = r2.question.format(s=r1.phrase.format(s=_subject(e)))
        return Question(
            f"bridge:{e.id}.{r1.name}.{r2.name}",
            text,
            aliases(world, r2.name, h2.answer),
            kind,
            [e.id, mid.id],
            [h1, h2],
        )
    a = rng.choice([a for a in ATTRS if a.compare])
    x, y = rng.sample(world.of_type(a.etype), 2)
    vx, vy = int(x.attributes[a.name]), int(y.attributes[a.name])
    if vx == vy:
        return None
    template, direction = a.compare
    win = x if (vx < vy) == (direction == "min") else y
    text = template.format(a=x.name, b=y.name)
    return Question(
        f"comparison:{x.id}|{y.id}.{a.name}",
        text,
        aliases(world, "", win.name),
        kind,
        [x.id, y.id],
        [_hop(world, x, a), _hop(world, y, a)],
    )


def _draw(
    world: World, kind: str, rng: random.Random, taken: set[str], seen: set[str] | None, split: str | None = None
) -> Question:
    """Draw a question of ``kind`` (and ``split``) not in ``taken``; avoid ``seen`` too unless the
    world runs out."""
    tries = round(400 / split_share(split))  # a split rejects the draws outside it
    for attempt in range(tries):
        q = _make_question(world, kind, rng)
        if q is None or q.id in taken or not in_split(q.id, split):
            continue
        if seen is None or q.id not in seen or attempt >= tries // 2:
            return q
    raise ValueError(
        f"this world holds too few distinct {kind!r} questions{f' in split {split!r}' if split else ''}; "
        "use make_world(n_per_type=...) with more entities"
    )


def _check_kinds(kinds) -> tuple[str, ...]:
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        raise ValueError(f"unknown question kinds {bad or list(kinds)}; choose from {KINDS}")
    return kinds


def make_questions(world: World, n: int, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> list[Question]:
    """``n`` distinct questions, kinds drawn round-robin so every kind is equally frequent."""
    kinds = _check_kinds(kinds)
    rng = random.Random(f"questions-{world.seed}-{seed}")  # str seeds go through sha512: stable
    taken: set[str] = set()
    out = []
    for i in range(n):
        out.append(_draw(world, kinds[i % len(kinds)], rng, taken, None))
        taken.add(out[-1].id)
    return out


def make_tasks(
    world: World | QuestionSet,
    n: int,
    k: int = 1,
    seed: int = 0,
    kinds: tuple[str, ...] = KINDS,
    split: str | None = None,
) -> list[Task]:
    """``n`` tasks of ``k`` distinct questions each, composed with MEM1 Prompt 1.

    Kinds rotate round-robin over all slots (equal mix); a question is reused across tasks
    only once the world runs out of fresh ones of that kind, never twice inside one task.
    ``split``: ``"sft"``, ``"rl"``, ``"test"`` or ``"train"`` (sft + rl) draws only those questions
    of :func:`~memkit.world.splits.question_split` (``task_sets.training_tasks`` and the evaluations
    do); None draws from all questions. A :class:`~memkit.world.composite.QuestionSet` (real
    questions) composes its own (``kinds`` ignored).
    """
    if isinstance(world, QuestionSet):  # real questions: MEM1's composites of them (kinds are the world's)
        return world.tasks(n, k, seed=seed, split=split)
    if not isinstance(n, int) or n < 1 or not isinstance(k, int) or k < 1:
        raise ValueError(f"n and k must be positive ints (n tasks of k questions), got n={n!r}, k={k!r}")
    kinds, split = _check_kinds(kinds), check_split(split)
    rng = random.Random(f"tasks-{world.seed}-{seed}-{k}" + (f"-{split}" if split else ""))
    seen: set[str] = set()
    tasks = []
    for i in range(n):
        qs: list[Question] = []
        for j in range(k):
            qs.append(_draw(world, kinds[(i * k + j) % len(kinds)], rng, {q.id for q in qs}, seen, split))
            seen.add(qs[-1].id)
        rng.shuffle(qs)
        tasks.append(Task(id=f"w{world.seed}-s{seed}-k{k}-{i:05d}", questions=qs, prompt=compose_prompt(qs)))
    return tasks
