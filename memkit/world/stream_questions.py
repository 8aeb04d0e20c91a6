"""The questions asked of a conversation stream (:mod:`memkit.world.streams`), with their evidence.

:class:`Speaker` is what the stream has had one speaker say, each fact with the dialogue ids that
said it (the stream's builder fills it session by session); :func:`stream_questions` turns the two
speakers' records into questions in LoCoMo's categories, each with its evidence turn ids and the
memory hops that answer it: single-hop (current value), multi-hop (the value before a change; a
bridge from a pet to its owner's employer), temporal (the resolved date), open-domain (a hobby or a
tip told in passing; LoCoMo's category 3 needs world knowledge, ours asks what the persona and
experience memories hold), adversarial (the other speaker's fact, answer "not mentioned").
"""

from __future__ import annotations

from memkit.world.conversation import CATEGORY_IDS, NOT_MENTIONED, ConvQA, Hop


class Speaker:
    """One speaker's facts so far, as the stream said them (histories newest last)."""

    def __init__(self, name: str):
        self.name = name
        self.city: list[tuple[str, str, str]] = []  # (value, date or "", dia_id) history, newest last
        self.job: list[tuple[str, str, str]] = []
        self.pets: list[dict] = []  # {"name", "date", "dias": [dia_ids], "old": [names]}
        self.band: tuple[str, str] | None = None  # (band, dia_id) while liked
        self.band_gone: set[str] = set()
        self.hobby: tuple[str, list[str]] | None = None
        self.tips: list[tuple[str, str, str]] = []  # (task, method, dia_id)


def stream_questions(a: Speaker, b: Speaker) -> list[ConvQA]:
    """The questions the two speakers' records support: each speaker's own, then the adversarial ones."""
    qs: list[ConvQA] = []

    def add(cat, question, answer, evidence, hops, adversarial=None):
        qs.append(ConvQA(question, answer, list(dict.fromkeys(evidence)), CATEGORY_IDS[cat], adversarial, hops))

    for s in (a, b):
        n = s.name
        city, _, dia = s.city[-1]
        add("single-hop", f"Where does {n} live now?", city, [dia], [Hop("fact", f"{n} lives in", city)])
        job, _, jdia = s.job[-1]
        add("single-hop", f"Where does {n} work now?", job, [jdia], [Hop("fact", f"{n} works at", job)])
        if s.band:
            add(
                "single-hop",
                f"What is {n}'s favourite band?",
                s.band[0],
                [s.band[1]],
                [Hop("fact", f"{n} favourite band", s.band[0])],
            )
        for (prev, _, pdia), (cur, when, cdia) in zip(s.city, s.city[1:]):
            add(
                "temporal",
                f"When did {n} move to {cur}?",
                when,
                [cdia],
                [Hop("fact", f"{n} lives in {cur} since", when)],
            )
            add(
                "multi-hop",
                f"Where did {n} live before moving to {cur}?",
                prev,
                [pdia, cdia],
                [Hop("fact", f"{n} lives in {cur}", prev)],
            )
        for (_, _, _), (cur, when, cdia) in zip(s.job, s.job[1:]):
            add(
                "temporal",
                f"When did {n} start working at {cur}?",
                when,
                [cdia],
                [Hop("fact", f"{n} works at {cur} since", when)],
            )
        for p in s.pets:
            add(
                "single-hop",
                f"What is the name of the dog {n} adopted on {p['date']}?",
                p["name"],
                p["dias"],
                [Hop("fact", f"{n} adopted a dog on {p['date']}", p["name"])],
            )
            add(
                "temporal",
                f"When did {n} adopt {p['name']}?",
                p["date"],
                p["dias"],
                [Hop("fact", f"{n} adopted a dog named {p['name']}", p["date"])],
            )
            add(
                "multi-hop",
                f"Where does the owner of the dog named {p['name']} work now?",
                job,
                [*p["dias"], jdia],
                [Hop("fact", f"adopted a dog named {p['name']}", n), Hop("fact", f"{n} works at", job)],
            )
        if s.hobby:
            add(
                "open-domain",
                f"What does {n} like to do at the weekend?",
                s.hobby[0],
                s.hobby[1],
                [Hop("persona", n, s.hobby[0])],
            )
        for task, method, tdia in s.tips:
            add(
                "open-domain",
                f"What is {n}'s trick for {task}?",
                method,
                [tdia],
                [Hop("experience", f"trick for {task}", method)],
            )
    for s in (a, b):  # adversarial: what the *other* speaker said, asked of this one
        o = b if s is a else a
        if o.pets and not s.pets:
            add(
                "adversarial",
                f"What is the name of the dog {s.name} adopted?",
                NOT_MENTIONED,
                [o.pets[0]["dias"][0]],
                [Hop("fact", f"{s.name} adopted a dog", "")],
                adversarial=o.pets[0]["name"],
            )
        if o.tips and not s.tips:
            task, method, tdia = o.tips[0]
            add(
                "adversarial",
                f"What is {s.name}'s trick for {task}?",
                NOT_MENTIONED,
                [tdia],
                [Hop("experience", f"{s.name} trick for {task}", "")],
                adversarial=method,
            )
    return qs
