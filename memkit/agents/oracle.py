"""The scripted policy every format shares: *what* a competent agent does next.

Each format's ``oracle()`` asks this module what to do (search a query / answer) and what
it knows, and only decides *how to write it* (MEM1 ``<think>``, MemPO ``<mem>``, a
MemSearcher memory, a MemAct note). Behaviour cloning on these outputs is how the tiny
model learns a format before RL (MEM1 App. F.1 compares SFT and RL; MemPO §5.3 and MemAct
SFT-then-RL do the same with GPT-4.1 / expert trajectories).

The script walks ``task.questions[*].decomposition`` in order. A hop's answer becomes a
*fact* only after it was seen in an observation (case-insensitive substring of the
``<information>``), never from the gold labels alone, so the oracle succeeds exactly when
retrieval and memory carried the information. The final answer of a question comes from the
gold labels once all its hops are facts (a comparison's winner is a derived fact).

Imperfection knobs (:class:`~memkit.agents.base.OracleConfig`), so SFT data leaves room for RL:

* ``p_drop_fact``: a found fact is left out of memory; the agent notices the gap and searches
  again (costs turns; with a tight turn limit it costs answers). No-op for ReAct, whose full
  history never loses anything (``forgetful=False``).
* ``p_wasted_search``: an uninformative query before the right one.
* ``p_wrong_answer``: an answer slot replaced by a distractor from the same task.

Memory flaws (``OracleConfig.flaw`` at ``flaw_rate``, :data:`FLAWS`): the teacher's *habit* at one
decision, drawn once per task and question, so a clone's greedy decoding inherits it when the rate
is above one half, while sampling still finds the right behaviour (the imperfect GPT-4o / GPT-4.1
demonstrations the papers clone, which outcome-reward RL then improves on). Random mistakes below
one half (the ``p_*`` knobs) are washed out by greedy decoding and leave RL nothing to find.

Memory layout (``OracleConfig.memory``): "found" lists what was found per question ("Q1: 1982.");
"ledger" writes one entry per question from the first turn on, keyed by the question's first search
(its subject and relation, words the model already writes), "open" until something is found, ":" while
hops are found and "=>" once settled: which question comes next and how many answers to write become
copies from the memory rather than counts. (A tiny clone trained on k <= 3 learnt the list's length,
not the copy: docs/findings.md, 'Negative results'.)

``show_comparison`` (off by default; ``memkit sft --show-comparison``) is not a mistake but a
different trace: in the turn a comparison's second value arrives the state reads "A founded: 1989;
B founded: 1975, so B." instead of "B." alone. It targets the tiny model's weakest questions
(``memkit.metrics.qa.em_by_kind``) and did not help them: the model copied both values but often named a
winner they contradict (measured: docs/findings.md, 'Negative results').

State lives in ``state.oracle`` (never shown to the model): ``known`` (hop key -> answer),
``attempts``, ``pending`` (hop the last search aimed at), ``gave_up``, ``seen``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from memkit.agents.base import AgentState, OracleConfig

#: a hop is retried this many times (first with its keyword query, then its question text)
MAX_ATTEMPTS = 3
VAGUE_QUERIES = ("more information", "general background", "related facts", "other details", "overview")
UNKNOWN = "unknown"
ANSWER_PLAN = "All questions are answered."  # the thought before a final answer (and in mempo.probe_opener)


@dataclass
class Decision:
    kind: str  # "search" | "answer"
    query: str = ""
    plan: str = ""  # one short sentence of reasoning
    qi: int = -1  # question index the search serves


#: flaw -> what the teacher does at the decision (OracleConfig.flaw)
FLAWS = {
    "none": "the perfect teacher",
    "forget_earlier": "once a later question is answered, an earlier question's answer leaves memory "
    "(its slot is answered 'unknown'); MemAct: the note of the next prune leaves it out",
    "overwrite_slot": "once a later question is answered, its answer is written into the earlier "
    "question's slot and the later slot is left empty",
    "stop_early": "a bridge question is answered with its first hop's answer (the bridge entity)",
}


def _key(qi: int, hi: int) -> str:
    return f"{qi}.{hi}"


def _o(state: AgentState) -> dict:
    o = state.oracle
    if "known" not in o:
        o.update(known={}, attempts={}, pending=None, gave_up=[], seen=0, habit={}, believed={})
    return o


def shows_flaw(state: AgentState, rng: random.Random, cfg: OracleConfig, qi: int) -> bool:
    """Whether the teacher shows its flaw on question ``qi`` (drawn once per question)."""
    habit = _o(state)["habit"]
    if qi not in habit:
        habit[qi] = rng.random() < cfg.flaw_rate
    return habit[qi]


def _apply_memory_flaw(state: AgentState, rng: random.Random, cfg: OracleConfig, qi: int) -> None:
    """Question ``qi`` was just answered: forget_earlier / overwrite_slot act on an earlier one."""
    o = _o(state)
    for qe in range(qi):
        if qe in o["believed"] or question_answer(state, qe) is None or not shows_flaw(state, rng, cfg, qe):
            continue
        if cfg.flaw == "forget_earlier":
            o["believed"][qe] = None
        else:  # overwrite_slot
            o["believed"][qe], o["believed"][qi] = question_answer(state, qi), None
        return


def observe(state: AgentState, rng: random.Random, cfg: OracleConfig, forgetful: bool = True) -> None:
    """Turn the newest observation into facts (verified by substring), at most once per call."""
    o = _o(state)
    if o["seen"] >= len(state.calls):
        return
    o["seen"] = len(state.calls)
    o["derived"] = None  # a comparison decided by this observation (OracleConfig.show_comparison)
    pending, o["pending"] = o["pending"], None
    if pending is None:
        return
    obs = (state.calls[-1].observation_text or "").lower()
    qi, hi = (int(x) for x in pending.split("."))
    answer = state.task.questions[qi].decomposition[hi].answer
    if answer.lower() in obs:
        if forgetful and cfg.p_drop_fact > 0 and rng.random() < cfg.p_drop_fact:
            return  # found but not written down: the memory will lack it
        o["known"][pending] = answer
        if cfg.flaw in ("forget_earlier", "overwrite_slot") and question_answer(state, qi) is not None:
            _apply_memory_flaw(state, rng, cfg, qi)
        q = state.task.questions[qi]
        if cfg.show_comparison and q.kind == "comparison" and question_answer(state, qi) is not None:
            o["derived"] = qi


def next_hop(state: AgentState, upto: int | None = None) -> tuple[int, int] | None:
    """First (question, hop) whose answer is not yet a fact (among questions ``0..upto`` when given)."""
    o = _o(state)
    for qi, q in enumerate(state.task.questions):
        if upto is not None and qi > upto:
            break
        if qi in o["gave_up"] or qi in o["believed"]:
            continue
        for hi in range(len(q.decomposition)):
            if _key(qi, hi) not in o["known"]:
                return qi, hi
    return None


def hops_left(state: AgentState) -> int:
    """Hops still to find (questions given up on, or settled by a flaw, excluded)."""
    o = _o(state)
    return sum(
        _key(qi, hi) not in o["known"]
        for qi, q in enumerate(state.task.questions)
        if qi not in o["gave_up"] and qi not in o["believed"]
        for hi in range(len(q.decomposition))
    )


def decide(
    state: AgentState, rng: random.Random, cfg: OracleConfig, upto: int | None = None, remaining: int | None = None
) -> Decision:
    """Search the next missing hop, or answer when nothing is missing or turns run out. ``upto``: only
    questions ``0..upto`` count (answers committed one question at a time: "answer" = question ``upto``'s).
    ``remaining``: the turns left including this one (None: the episode's, ``max_turns - turn``)."""
    o = _o(state)
    remaining = state.max_turns - state.turn if remaining is None else remaining
    while True:
        hop = next_hop(state, upto)
        if hop is None or remaining <= 1:
            done = hop is None
            return Decision("answer", plan=ANSWER_PLAN if done else "Out of turns; answer now.")
        qi, hi = hop
        q = state.task.questions[qi]
        if cfg.flaw == "stop_early" and q.kind == "bridge" and hi >= 1 and shows_flaw(state, rng, cfg, qi):
            o["believed"][qi] = q.decomposition[0].answer  # the bridge entity taken for the answer
            continue
        key = _key(qi, hi)
        if o["attempts"].get(key, 0) >= MAX_ATTEMPTS:
            o["gave_up"].append(qi)
            continue
        break
    sub = state.task.questions[qi].decomposition[hi]
    o["pending"] = key
    if cfg.p_wasted_search > 0 and rng.random() < cfg.p_wasted_search:
        return Decision("search", rng.choice(VAGUE_QUERIES), _plan(cfg, qi, sub.text), qi)
    attempt = o["attempts"].get(key, 0)
    o["attempts"][key] = attempt + 1
    query = sub.text if attempt == 1 else sub.query  # second try rephrases as the question
    return Decision("search", query, _plan(cfg, qi, sub.text), qi)


def _plan(cfg: OracleConfig, qi: int, hop_text: str) -> str:
    """The question a search serves: by label, or (ledger) by the hop's own words."""
    return f"the answer to: {hop_text}" if cfg.memory == "ledger" else f"Q{qi + 1}: {hop_text}"


def question_answer(state: AgentState, qi: int) -> str | None:
    """Gold answer of question ``qi`` once all its hops are facts, else None."""
    q = state.task.questions[qi]
    known = _o(state)["known"]
    if all(_key(qi, hi) in known for hi in range(len(q.decomposition))) and q.answers:
        return q.answers[0]
    return None


def believed_answer(state: AgentState, qi: int) -> str | None:
    """What the teacher's memory holds as question ``qi``'s answer: its flaw's version where one
    acted (None = forgotten / overwritten away), else :func:`question_answer`."""
    believed = _o(state)["believed"]
    return believed[qi] if qi in believed else question_answer(state, qi)


def answer_text(state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
    """The final answer: one slot per question, in order, joined by "; " (MEM1 Prompt 1)."""
    return "; ".join(slot_answer(state, qi, rng, cfg) for qi in range(len(state.task.questions)))


def facts_text(state: AgentState, cfg: OracleConfig | None = None) -> str:
    """Compact memory: one short clause per question (answer, partial hops, or not found).

    This is what keeps the memory formats' context small: facts, never raw passages.
    ``cfg.memory == "ledger"``: :func:`ledger_text` instead.
    """
    if cfg is not None and cfg.memory == "ledger":
        return ledger_text(state)
    o = _o(state)
    parts = []
    for qi, q in enumerate(state.task.questions):
        if qi in o["believed"]:  # a flaw acted: the memory holds the teacher's belief, or nothing
            if o["believed"][qi] is not None:
                parts.append(f"Q{qi + 1}: {o['believed'][qi]}.")
            continue
        final = question_answer(state, qi)
        hops = [
            f"{s.query}: {o['known'][_key(qi, hi)]}"
            for hi, s in enumerate(q.decomposition)
            if _key(qi, hi) in o["known"]
        ]
        if final is not None and o.get("derived") == qi:  # the values once, then the winner
            parts.append(f"Q{qi + 1}: " + "; ".join(hops) + f", so {final}.")
        elif final is not None:
            parts.append(f"Q{qi + 1}: {final}.")
        elif hops:
            parts.append(f"Q{qi + 1}: " + "; ".join(hops) + ".")
        elif qi in o["gave_up"]:
            parts.append(f"Q{qi + 1}: not found.")
    return " ".join(parts) if parts else "Nothing found yet."


def ledger_text(state: AgentState) -> str:
    """One entry per question, in the prompt's order, keyed by its first search::

        The Makthes singer: Tomlo Lilkrutho. Kamith river: open. The Vampams music => reggae.

    "open" = nothing found, ":" = hops found so far, "=>" = settled (the answer slot copies what
    follows; "unknown" where a flaw dropped it or the search gave up)."""
    return " ".join(ledger_entry(state, qi) for qi in range(len(state.task.questions)))


def settled(state: AgentState, qi: int) -> bool:
    """Question ``qi`` has its answer, or the teacher's belief of it, or was given up on."""
    o = _o(state)
    return qi in o["believed"] or qi in o["gave_up"] or question_answer(state, qi) is not None


def ledger_entry(state: AgentState, qi: int) -> str:
    """Question ``qi``'s entry of :func:`ledger_text` (also the whole memory when answers are committed
    one question at a time: MEM1's ``answers="each"``)."""
    o, q = _o(state), state.task.questions[qi]
    key = q.decomposition[0].query if q.decomposition else q.text
    found = [o["known"][_key(qi, hi)] for hi in range(len(q.decomposition)) if _key(qi, hi) in o["known"]]
    if settled(state, qi):
        return f"{key} => {believed_answer(state, qi) or UNKNOWN}."
    if found:
        return f"{key}: {'; '.join(found)}."
    return f"{key}: open."


def slot_answer(state: AgentState, qi: int, rng: random.Random, cfg: OracleConfig) -> str:
    """Question ``qi``'s answer slot: the teacher's belief, or "unknown"; at ``p_wrong_answer`` a
    distractor from the same task (another hop's answer) instead."""
    a = believed_answer(state, qi) or UNKNOWN
    if cfg.p_wrong_answer > 0 and rng.random() < cfg.p_wrong_answer:
        golds = {g.lower() for g in state.task.questions[qi].answers}
        distractors = [s.answer for q in state.task.questions for s in q.decomposition]
        wrong = [d for d in distractors if d.lower() not in golds]
        a = rng.choice(wrong) if wrong else UNKNOWN
    return a


def plan_text(d: Decision) -> str:
    return f"Next I need {d.plan}" if d.kind == "search" else d.plan
