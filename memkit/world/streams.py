"""A seeded generator of conversation streams in the LoCoMo schema (Mem-T's world).

Two speakers (first names of the wiki world's people) talk over dated sessions. What they say
is drawn from the wiki world's names (cities, companies, bands, film words as pet names), so
the world's tokenizer covers it and no model knows it from pre-training. The stream has what
makes LoCoMo hard for a memory:

* facts that change (a move, a new job: the old value becomes history), facts corrected later
  ("the dog is called X, not Y"), facts withdrawn ("not into The Nosvos anymore"), repeats;
* relative times ("two days ago", "last Tuesday") that only the session date resolves;
* persona details (hobbies) and how-to tips (experiential memory), amid small talk.

This module is what is said: the lines, the events that say a fact and record it
(:class:`~memkit.world.conversation.StreamFact`), the sessions. The questions asked of a stream,
in LoCoMo's categories with their evidence turn ids, are :mod:`memkit.world.stream_questions`.
Sizes: :data:`SIZES`.
"""

from __future__ import annotations

import datetime as dt
import random

from memkit.world.conversation import Conversation, Session, StreamFact, Turn
from memkit.world.stream_questions import Speaker, stream_questions

#: sessions and small-talk exchanges per session; "full" is LoCoMo-like (~19 sessions, ~300 turns)
SIZES = {
    "smoke": {"sessions": 4, "small_talk": (1, 2)},
    "medium": {"sessions": 10, "small_talk": (2, 4)},
    "full": {"sessions": 20, "small_talk": (4, 6)},
}
HOBBIES = (
    "painting",
    "hiking",
    "pottery",
    "chess",
    "baking",
    "climbing",
    "gardening",
    "cycling",
    "knitting",
    "fishing",
)
TIPS = {
    "keeping basil alive": "water it every morning",
    "sleeping on a night train": "bring earplugs",
    "learning a new song": "practice the chorus first",
    "packing for a long trip": "roll the clothes",
    "cooking rice": "rinse it three times",
    "running a long race": "start slower than you want",
    "remembering names": "repeat the name once aloud",
    "fixing a flat tyre": "find the leak with soapy water",
}
OPENERS = ("Hi {o}! How have you been?", "Hey {o}, good to hear from you again.", "Hello {o}! It has been a while.")
REPLIES_OPEN = ("I am doing well, thanks for asking.", "Pretty good! Busy week though.", "All good here, thanks.")
REACTIONS = (
    "Wow, that is great news!",
    "Oh nice, tell me more sometime.",
    "That sounds lovely.",
    "Haha, good for you!",
    "Really? I did not expect that.",
    "Thanks for telling me.",
)
SMALL_TALK = (
    ("The weather has been strange lately.", "Yes, rain one day and sun the next."),
    ("Did you sleep well?", "Not really, I stayed up reading."),
    ("I made soup for dinner.", "Soup sounds perfect right now."),
    ("Work was quiet today.", "Quiet days are nice once in a while."),
    ("I need a holiday.", "Me too, maybe next month."),
)
CLOSERS = (("I have to go now, talk soon!", "Bye, take care!"), ("Let us catch up again next week.", "Sure, see you!"))
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def day(d: dt.date) -> str:
    """The answer form of a date: "2 May 2023"."""
    return f"{d.day} {d.strftime('%B')} {d.year}"


def relative(d: dt.date, rng: random.Random) -> tuple[str, dt.date]:
    """A relative time expression said on ``d`` and the date it means."""
    kind = rng.randrange(4)
    if kind == 0:
        return "yesterday", d - dt.timedelta(days=1)
    if kind == 1:
        n = rng.choice((2, 3))
        return f"{('two', 'three')[n - 2]} days ago", d - dt.timedelta(days=n)
    if kind == 2:
        back = rng.randint(2, 6)  # a weekday of the past week, never today or yesterday
        when = d - dt.timedelta(days=back)
        return f"last {_WEEKDAYS[when.weekday()]}", when
    return "today", d


class _Builder:
    def __init__(self, world, rng: random.Random, sample_id: str):
        people = rng.sample([e.name.split()[0] for e in world.of_type("person")], 2)
        self.rng, self.sample_id = rng, sample_id
        self.a, self.b = Speaker(people[0]), Speaker(people[1])
        self.cities = [e.name for e in world.of_type("city")]
        self.companies = [e.name for e in world.of_type("company")]
        self.bands = [e.name for e in world.of_type("band")]
        self.pet_names = list(dict.fromkeys(e.name.split()[0] for e in world.of_type("film")))
        self.sessions: list[Session] = []
        self.facts: list[StreamFact] = []

    # ---- one session ------------------------------------------------------------------
    def session(self, index: int, date: dt.datetime, small_talk: tuple[int, int]) -> None:
        self.index, self.date, self.turns = index, date.date(), []
        first, second = (self.a, self.b) if index % 2 else (self.b, self.a)
        rng = self.rng
        self.say(first, rng.choice(OPENERS).format(o=second.name))
        self.say(second, rng.choice(REPLIES_OPEN))
        events = self.intro() if index == 1 else [rng.choice(self.choices()) for _ in range(rng.randint(1, 3))]
        chat = [rng.choice(SMALL_TALK) for _ in range(rng.randint(*small_talk))]
        slots = sorted(rng.sample(range(len(events) + len(chat)), len(chat)))
        ei = iter(events)
        for i in range(len(events) + len(chat)):
            if i in slots:
                x, y = chat[slots.index(i)]
                self.say(first, x)
                self.say(second, y)
            else:
                who, fn = next(ei)
                if fn(who):
                    self.say(self.other(who), rng.choice(REACTIONS))
        x, y = rng.choice(CLOSERS)
        self.say(second, x)
        self.say(first, y)
        stamp = date.strftime("%I:%M %p").lstrip("0").lower()
        self.sessions.append(Session(index, f"{stamp} on {date.day} {date.strftime('%B')}, {date.year}", self.turns))

    def say(self, who: Speaker, text: str) -> str:
        dia = f"D{self.index}:{len(self.turns) + 1}"
        self.turns.append(Turn(who.name, dia, text))
        return dia

    def fact(self, who, dia, slot, value, text, store="fact", change="new", start=""):
        self.facts.append(StreamFact(dia, who.name, f"{who.name}|{slot}", value, text, store, change, start))

    def other(self, who):
        return self.b if who is self.a else self.a

    def fresh(self, pool, taken) -> str:
        left = [x for x in pool if x not in taken]
        return self.rng.choice(left or pool)

    # ---- events: each says one turn and records the fact; False = nothing said -----------
    def intro(self):
        return [(self.a, self.ev_city), (self.a, self.ev_job), (self.b, self.ev_city), (self.b, self.ev_job)]

    def choices(self):
        a, b = self.a, self.b
        out = [
            (a, self.ev_city),
            (b, self.ev_city),
            (a, self.ev_job),
            (b, self.ev_job),
            (a, self.ev_pet),
            (a, self.ev_band),
            (b, self.ev_band),
            (a, self.ev_hobby),
            (b, self.ev_hobby),
            (b, self.ev_tip),
            (a, self.ev_restate),
            (b, self.ev_restate),
        ]
        if a.pets and not a.pets[-1]["old"] and session_gap(a.pets[-1]["dias"][0], self.index):
            out.append((a, self.ev_correct))
        return out

    def ev_city(self, who) -> bool:
        city = self.fresh(self.cities, {c for s in (self.a, self.b) for c, _, _ in s.city})
        if not who.city:
            dia = self.say(who, f"I live in {city}, by the way.")
            self.fact(who, dia, "city", city, f"{who.name} lives in {city}.")
        else:
            rel, when = self.relative_date(who.city)
            dia = self.say(who, f"Big news: I moved to {city} {rel}!")
            self.fact(
                who,
                dia,
                "city",
                city,
                f"{who.name} lives in {city} since {day(when)}.",
                change="update",
                start=day(when),
            )
        who.city.append((city, day(when) if who.city else "", dia))
        return True

    def ev_job(self, who) -> bool:
        company = self.fresh(self.companies, {c for s in (self.a, self.b) for c, _, _ in s.job})
        if not who.job:
            dia = self.say(who, f"I work at {company}.")
            self.fact(who, dia, "job", company, f"{who.name} works at {company}.")
            when = ""
        else:
            rel, d = self.relative_date(who.job)
            when = day(d)
            dia = self.say(who, f"I started a new job at {company} {rel}.")
            self.fact(
                who, dia, "job", company, f"{who.name} works at {company} since {when}.", change="update", start=when
            )
        who.job.append((company, when, dia))
        return True

    def relative_date(self, history=()):
        """A relative time said today; never before the slot's current version started ("today" then)."""
        rel, d = relative(self.date, self.rng)
        if history and history[-1][1] and d < dt.datetime.strptime(history[-1][1], "%d %B %Y").date():
            return "today", self.date
        return rel, d

    def ev_pet(self, who) -> bool:
        if len(who.pets) >= 2:
            return self.ev_restate(who)
        name = self.fresh(self.pet_names, {n for p in who.pets for n in [p["name"], *p["old"]]})
        rel, d = self.relative_date()
        dia = self.say(who, f"We adopted a dog {rel}! His name is {name}.")
        slot = f"pet{len(who.pets) + 1}"
        self.fact(who, dia, slot, name, f"{who.name} adopted a dog named {name} on {day(d)}.", start=day(d))
        who.pets.append({"name": name, "date": day(d), "dias": [dia], "old": [], "slot": slot})
        return True

    def ev_correct(self, who) -> bool:
        pet = who.pets[-1]
        new = self.fresh(self.pet_names, {n for p in who.pets for n in [p["name"], *p["old"]]})
        dia = self.say(who, f"Oops, I got it wrong before: the dog is called {new}, not {pet['name']}.")
        self.fact(
            who,
            dia,
            pet["slot"],
            new,
            f"{who.name} adopted a dog named {new} on {pet['date']}.",
            change="correct",
            start=pet["date"],
        )
        pet["old"].append(pet["name"])
        pet["name"] = new
        pet["dias"].append(dia)
        return True

    def ev_band(self, who) -> bool:
        if who.band is None:
            band = self.fresh(self.bands, who.band_gone | {s.band[0] for s in (self.a, self.b) if s.band})
            dia = self.say(who, f"I can not stop listening to {band}, they are my favourite band.")
            self.fact(who, dia, "band", band, f"{who.name}'s favourite band is {band}.")
            who.band = (band, dia)
        elif self.rng.random() < 0.5:
            dia = self.say(who, f"{who.band[0]} is still my favourite band.")
            self.fact(who, dia, "band", who.band[0], f"{who.name}'s favourite band is {who.band[0]}.", change="repeat")
        else:
            band = who.band[0]
            dia = self.say(who, f"I am not into {band} anymore.")
            self.fact(who, dia, "band", band, f"{who.name} no longer likes {band}.", change="negate")
            who.band_gone.add(band)
            who.band = None
        return True

    def ev_hobby(self, who) -> bool:
        hobby = who.hobby[0] if who.hobby else self.fresh(HOBBIES, {s.hobby[0] for s in (self.a, self.b) if s.hobby})
        dia = self.say(who, f"I spent the weekend {hobby} again.")
        self.fact(
            who,
            dia,
            "hobby",
            hobby,
            f"{who.name} enjoys {hobby}.",
            store="persona",
            change="repeat" if who.hobby else "new",
        )
        who.hobby = (hobby, [*(who.hobby[1] if who.hobby else []), dia])
        return True

    def ev_tip(self, who) -> bool:
        done = {t for t, _, _ in who.tips}
        if len(done) == len(TIPS):
            return self.ev_restate(who)
        task = self.rng.choice([t for t in TIPS if t not in done])
        dia = self.say(who, f"My trick for {task} is to {TIPS[task]}.")
        self.fact(
            who,
            dia,
            f"tip|{task}",
            TIPS[task],
            f"Trick for {task} (from {who.name}): {TIPS[task]}.",
            store="experience",
        )
        who.tips.append((task, TIPS[task], dia))
        return True

    def ev_restate(self, who) -> bool:
        if not who.city:
            return self.ev_city(who)
        city = who.city[-1][0]
        dia = self.say(who, f"Still loving life in {city}.")
        self.fact(who, dia, "city", city, f"{who.name} lives in {city}.", change="repeat")
        return True


def session_gap(dia_id: str, index: int) -> bool:
    """A correction comes in a later session than what it corrects."""
    return int(dia_id[1:].split(":")[0]) < index


def make_conversation(world, seed: int = 0, size: str = "smoke", sample_id: str | None = None) -> Conversation:
    """One stream of ``SIZES[size]`` sessions; the same seed gives the same conversation."""
    if size not in SIZES:
        raise ValueError(f"unknown conversation size {size!r}; choose one of {', '.join(SIZES)}")
    rng = random.Random(f"stream-{seed}-{size}")
    b = _Builder(world, rng, sample_id or f"memkit-{size}-{seed}")
    when = dt.datetime(2023, 1, 1, 9, 0) + dt.timedelta(days=rng.randint(0, 300), minutes=rng.randint(0, 600))
    for i in range(1, SIZES[size]["sessions"] + 1):
        b.session(i, when, SIZES[size]["small_talk"])
        when += dt.timedelta(days=rng.randint(3, 14), minutes=rng.randint(-120, 120))
    return Conversation(b.sample_id, b.a.name, b.b.name, b.sessions, stream_questions(b.a, b.b), b.facts)


def make_conversations(world, n: int, seed: int = 0, size: str = "smoke") -> list[Conversation]:
    """``n`` streams with seeds ``seed, seed+1, ...``."""
    return [make_conversation(world, seed + i, size) for i in range(n)]
