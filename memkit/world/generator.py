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
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from memkit.world.schema import Passage, Question, SubQuestion, Task, compose_prompt
from memkit.world.splits import check_split, in_split, split_share

TYPES = ("person", "city", "company", "film", "band", "university")
KINDS = ("1hop", "bridge", "comparison")


@dataclass(frozen=True)
class Attr:
    """One attribute or relation kind.

    ``target`` is an entity type for relations (value = that entity's name) or None for
    literals. ``kw`` occurs in every sentence template, so "<name> <kw>" retrieves the
    page. ``phrase`` (relations only) describes the value for bridge questions, e.g.
    "the director of {s}"; ``compare`` = (question template, "min" | "max") for numbers.
    """

    name: str
    etype: str
    target: str | None
    kw: str
    question: str
    sentences: tuple[str, ...]
    phrase: str = ""
    compare: tuple[str, str] | None = None


A = Attr
ATTRS: tuple[Attr, ...] = (
    A(
        "birth_year",
        "person",
        None,
        "born",
        "In which year was {s} born?",
        ("{n} was born in {v}.", "{n} was born in the year {v}."),
        compare=("Who was born earlier, {a} or {b}?", "min"),
    ),
    A(
        "birth_city",
        "person",
        "city",
        "birthplace",
        "In which city was {s} born?",
        ("The birthplace of {n} is {v}.", "{n} has {v} as birthplace."),
        phrase="the city where {s} was born",
    ),
    A(
        "employer",
        "person",
        "company",
        "works",
        "Which company does {s} work for?",
        ("{n} works for {v}.", "{n} works at {v}."),
        phrase="the employer of {s}",
    ),
    A(
        "alma_mater",
        "person",
        "university",
        "studied",
        "Where did {s} study?",
        ("{n} studied at {v}.", "As a student, {n} studied at {v}."),
        phrase="the university where {s} studied",
    ),
    A(
        "occupation",
        "person",
        None,
        "profession",
        "What is the profession of {s}?",
        ("By profession, {n} is a {v}.", "{n} is a {v} by profession."),
    ),
    A(
        "population",
        "city",
        None,
        "population",
        "What is the population of {s}?",
        ("{n} has a population of {v}.", "The population of {n} is {v}."),
        compare=("Which city has a larger population, {a} or {b}?", "max"),
    ),
    A(
        "mayor",
        "city",
        "person",
        "mayor",
        "Who is the mayor of {s}?",
        ("The mayor of {n} is {v}.", "{v} serves as the mayor of {n}."),
        phrase="the mayor of {s}",
    ),
    A(
        "country",
        "city",
        None,
        "country",
        "In which country is {s}?",
        ("{n} is a city in the country of {v}.", "{n} lies in {v}, a small country."),
    ),
    A(
        "river",
        "city",
        None,
        "river",
        "Which river flows through {s}?",
        ("The {v} river flows through {n}.", "{n} was built on the banks of the {v} river."),
    ),
    A(
        "founded_year",
        "company",
        None,
        "founded",
        "In which year was {s} founded?",
        ("{n} was founded in {v}.", "{n} has been in business since it was founded in {v}."),
        compare=("Which company was founded earlier, {a} or {b}?", "min"),
    ),
    A(
        "founder",
        "company",
        "person",
        "founder",
        "Who is the founder of {s}?",
        ("The founder of {n} is {v}.", "{v} is the founder of {n}."),
        phrase="the founder of {s}",
    ),
    A(
        "headquarters",
        "company",
        "city",
        "headquarters",
        "In which city is {s} headquartered?",
        ("{n} has its headquarters in {v}.", "The headquarters of {n} are in {v}."),
        phrase="the city where {s} has its headquarters",
    ),
    A(
        "industry",
        "company",
        None,
        "industry",
        "In which industry does {s} operate?",
        ("{n} works in the {v} industry.", "{n} is a company in the {v} industry."),
    ),
    A(
        "employees",
        "company",
        None,
        "employees",
        "How many employees does {s} have?",
        ("{n} has {v} employees.", "About {v} employees work at {n}."),
        compare=("Which company has more employees, {a} or {b}?", "max"),
    ),
    A(
        "release_year",
        "film",
        None,
        "released",
        "In which year was {s} released?",
        ("{n} was released in {v}.", "{n} was released in cinemas in {v}."),
        compare=("Which film was released earlier, {a} or {b}?", "min"),
    ),
    A(
        "director",
        "film",
        "person",
        "directed",
        "Who directed {s}?",
        ("{n} was directed by {v}.", "{v} directed {n}."),
        phrase="the director of {s}",
    ),
    A(
        "film_genre",
        "film",
        None,
        "genre",
        "What is the genre of {s}?",
        ("The genre of {n} is {v}.", "By genre, {n} is a {v}."),
    ),
    A(
        "studio",
        "film",
        "company",
        "produced",
        "Which company produced {s}?",
        ("{n} was produced by {v}.", "{v} produced {n}."),
        phrase="the company that produced {s}",
    ),
    A(
        "runtime",
        "film",
        None,
        "minutes",
        "How many minutes long is {s}?",
        ("{n} runs for {v} minutes.", "{n} is {v} minutes long."),
        compare=("Which film is longer, {a} or {b}?", "max"),
    ),
    A(
        "formed_year",
        "band",
        None,
        "formed",
        "In which year was {s} formed?",
        ("{n} was formed in {v}.", "{n} formed in {v}."),
        compare=("Which band was formed earlier, {a} or {b}?", "min"),
    ),
    A(
        "hometown",
        "band",
        "city",
        "hometown",
        "Which city is the hometown of {s}?",
        ("The hometown of {n} is {v}.", "{n} calls {v} its hometown."),
        phrase="the hometown of {s}",
    ),
    A(
        "lead_singer",
        "band",
        "person",
        "singer",
        "Who is the lead singer of {s}?",
        ("The lead singer of {n} is {v}.", "{v} is the lead singer of {n}."),
        phrase="the lead singer of {s}",
    ),
    A(
        "music_genre",
        "band",
        None,
        "music",
        "What kind of music does {s} play?",
        ("{n} plays {v} music.", "{n} is known for playing {v} music."),
    ),
    A(
        "established_year",
        "university",
        None,
        "established",
        "In which year was {s} established?",
        ("{n} was established in {v}.", "{n} was first established in {v}."),
        compare=("Which university was established earlier, {a} or {b}?", "min"),
    ),
    A(
        "campus_city",
        "university",
        "city",
        "campus",
        "In which city is the campus of {s}?",
        ("The campus of {n} is in {v}.", "{n} has its campus in {v}."),
        phrase="the city where {s} has its campus",
    ),
    A(
        "president",
        "university",
        "person",
        "president",
        "Who is the president of {s}?",
        ("The president of {n} is {v}.", "{v} is the president of {n}."),
        phrase="the president of {s}",
    ),
    A(
        "students",
        "university",
        None,
        "students",
        "How many students attend {s}?",
        ("{n} has {v} students.", "About {v} students attend {n}."),
        compare=("Which university has more students, {a} or {b}?", "max"),
    ),
)
ATTR_BY_NAME = {a.name: a for a in ATTRS}
SUBJECT = {"film": "the film {n}"}  # how a question names an entity

NUMBERS = {
    "birth_year": (1900, 1995),
    "population": (2000, 2000000),
    "founded_year": (1850, 2010),
    "employees": (20, 50000),
    "release_year": (1950, 2020),
    "runtime": (75, 190),
    "formed_year": (1960, 2015),
    "established_year": (1500, 1990),
    "students": (500, 40000),
}
WORDS = {
    "occupation": [
        "painter",
        "chemist",
        "lawyer",
        "sailor",
        "teacher",
        "baker",
        "pilot",
        "surgeon",
        "poet",
        "farmer",
        "banker",
        "journalist",
    ],
    "industry": ["shipping", "textile", "mining", "software", "banking", "railway", "tea", "glass"],
    "film_genre": ["comedy", "drama", "western", "thriller", "musical", "documentary", "romance"],
    "music_genre": ["jazz", "folk", "rock", "blues", "punk", "soul", "reggae", "disco"],
}
FILM_NOUNS = ["Hours", "Tide", "Garden", "Letter", "Winter", "Road", "Mirror", "Harbor", "Signal", "Orchard"]
COMPANY_SUFFIX = ["Works", "Group", "Industries", "Labs", "Holdings", "Systems"]

# Generated words are rejected if they are common English words or real names, so every
# name stays obviously fictional (a model cannot "know" it).
_REAL = set(
    """a an and are as at be but by for from had has have he her his i in is it its me my no not of on
or our she so that the them they this to was we were with you about after again also back been before big
came can come could day did down each even first good great here how into just know like little long made
make man many more most much must name new now old one only other over people said same see some still
such take than then there these thing think those time two under very well went what when where which who
will work would year your ball band bank bar base bat bear bed bell bird boat body bone book box boy bread
cake call car care cat city coat cold cook corn cow dark date deer door dog dove fire fish gold hand hat
home king lake land life lime line lion love mark mile milk mine moon note park pine rain rice ring road
rose salt sand sea seed ship shop sing sun tale tea tent tide tin toe tone town tree vote wall water wine
wood zone rome paris london tokyo berlin milan oslo lima cairo delhi john mary anna sara tom bob kim lee
ali omar maria elena peter paul mark luke adam eve noah liam emma olivia mia lena nora ivan igor sven
tina rita dora vera rosa bella luna stella mona lisa nina dana tara kara mara sami rami""".split()
)
_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "st",
    "tr",
    "th",
    "sh",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "k", "m"]

# Fact-free colour sentences (no attribute keyword, no values): they make pages read like
# short wiki leads (~40-60 words) and give BM25 realistic non-matching text.
COLOUR = {
    "person": (
        "{n} is often mentioned in local records.",
        "Friends describe {n} as patient and curious.",
        "Little is known about the early life of {n}.",
    ),
    "city": (
        "{n} is a busy place with markets, bridges and old stone houses.",
        "Visitors to {n} remember its narrow streets and quiet squares.",
    ),
    "company": (
        "{n} is known for its plain logo and long annual reports.",
        "Critics and admirers alike write about {n} in trade papers.",
    ),
    "film": (
        "Reviews of {n} praised its music and its slow opening scenes.",
        "{n} is still shown at small cinemas on rainy evenings.",
    ),
    "band": (
        "{n} are known for long concerts and handmade posters.",
        "Fans of {n} often trade old recordings at fairs.",
    ),
    "university": ("{n} is known for its library and its gardens.", "Many visitors walk through the old halls of {n}."),
}

DISTRACTORS = (
    (
        "{W} Festival",
        "The {t} is an old celebration held each spring in the hills. People bring bread, "
        "lanterns and painted boats. Stories say that {e1} once danced there until dawn, and that {e2} lost a "
        "hat in the crowd. Nobody agrees on where the celebration began, and each village tells its own tale.",
    ),
    (
        "{W} Pass",
        "The {t} is a mountain road known for cold winds and narrow paths. Travellers leave small "
        "stones at the top for luck. A diary attributed to {e1} describes the view, and a letter signed by {e2} "
        "complains about the weather. The road is closed for most of the winter.",
    ),
    (
        "{W}",
        "{t} is a board game played with black and white tokens on a square grid. Players take turns and "
        "try to surround the tokens of the other side. {e1} is said to have played it often, and {e2} wrote a "
        "short note on its rules. The game has many local variants.",
    ),
    (
        "{W} Pie",
        "{t} is a sweet dish made from oats, honey and baked apples, served warm on holidays. An old "
        "cookbook says that {e1} liked it with cream, while {e2} preferred it cold. Recipes differ from one "
        "kitchen to the next, and every family claims its own is the best.",
    ),
    (
        "The {W}",
        "{t} was a wooden sailing ship with three masts and a red flag. Sailors told many stories "
        "about it. One such story claims that {e1} travelled on board and that {e2} painted its figurehead. "
        "The ship is now remembered mainly in sea songs.",
    ),
    (
        "Legend of {W}",
        "The {t} tells of a fox who stole the moon and hid it in a well. Children hear it on "
        "long nights. Some tellers add that {e1} found the well, others that {e2} lowered a bucket and brought "
        "the moon back. The ending changes with every telling.",
    ),
)


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
            w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS) for _ in range(n))
            if 4 <= len(w) <= 10 and w not in self.used and w not in _REAL:
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
    world: World, n: int, k: int = 1, seed: int = 0, kinds: tuple[str, ...] = KINDS, split: str | None = None
) -> list[Task]:
    """``n`` tasks of ``k`` distinct questions each, composed with MEM1 Prompt 1.

    Kinds rotate round-robin over all slots (equal mix); a question is reused across tasks
    only once the world runs out of fresh ones of that kind, never twice inside one task.
    ``split``: ``"sft"``, ``"rl"``, ``"test"`` or ``"train"`` (sft + rl) draws only those questions
    of :func:`~memkit.world.splits.question_split` (``task_sets.training_tasks`` and the evaluations
    do); None draws from all questions.
    """
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
