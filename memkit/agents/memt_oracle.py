"""Mem-T's scripted teacher: the text a competent (or, with the knobs, flawed) agent writes.

It reads the synthetic stream's annotations (``Conversation.facts``: which turn states which
fact; ``ConvQA.hops``: where each answer lives), never the answers' presence in memory: an
answer is given only when a search result shows it, so what it scores measures the store.

* formation: one ``create_fact`` / ``create_experience`` per stated fact (with its resolved time
  and source id), ``update_persona`` for persona details, ``update_summary`` for the chunk;
* evolution: the related memory with the same slot decides: none -> ADD, same value -> IGNORE,
  a later value -> UPDATE keeping the history ("before: ..."), a correction -> UPDATE, a
  negation -> DELETE;
* retrieval: one search per hop in the hop's store; a miss retries once in the raw turns, then
  answers "not mentioned"; an adversarial question (another speaker's fact) is answered "not
  mentioned" unless a retrieved memory pins that fact on the asked speaker.

Knobs (:class:`~memkit.agents.base.OracleConfig`): ``p_drop_fact`` (a fact never written),
``p_wasted_search`` (a vague search first), ``p_wrong_answer`` (a distractor answer); flaws at
``flaw_rate``, drawn once per slot or question: ``forget_earlier`` (an UPDATE drops the history:
"before" questions fail), ``overwrite_slot`` (a new fact overwrites a related memory of another
slot: the case study's evolution error), ``stop_early`` (a bridge question answered with its first hop).
On a real LoCoMo file (no annotations) it writes LoCoMo's ``observation`` facts and answers with
the top fact found for the question.
"""

from __future__ import annotations

import random
import re

from memkit.agents.base import AgentState, OracleConfig
from memkit.agents.memt_tools import SEARCH_TOOLS, stream_conversation, stream_store, tool_call
from memkit.envs.memory_store import ID_PREFIX
from memkit.metrics.locomo import normalize
from memkit.world.conversation import NOT_MENTIONED, StreamFact

#: how an UPDATE's document states a slot's current value (a slot's kind -> template)
CURRENT = {"city": "{who} lives in {value}", "job": "{who} works at {value}"}


def write(method, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
    o = state.oracle
    o.setdefault("slot_of", {})
    o.setdefault("history", {})
    o.setdefault("flawed", {})
    if method.constructing(state):
        return _evolve(method, state, rng, cfg) if state.memory["pending"] else _form(method, state, rng, cfg)
    return _retrieve(method, state, rng, cfg)


def _flawed(o: dict, key: str, flaw: str, rng: random.Random, cfg: OracleConfig) -> bool:
    """Is ``flaw`` shown for ``key`` (drawn once per key at ``cfg.flaw_rate``)?"""
    if cfg.flaw != flaw:
        return False
    if key not in o["flawed"]:
        o["flawed"][key] = rng.random() < cfg.flaw_rate
    return o["flawed"][key]


def _form(method, state, rng, cfg) -> str:
    conv, o = stream_conversation(state), state.oracle
    date, turns = method.chunk(state)
    ids = {t.dia_id for t in turns}
    facts = [f for f in conv.facts if f.dia_id in ids] or _observed_facts(conv, state.memory["chunk"] + 1)
    calls, queued, personas = [], [], o.setdefault("personas", {})
    for f in facts:
        if f.store == "persona":
            traits = personas.setdefault(f.speaker, [])
            if f.value not in traits:
                traits.append(f.value)
            calls.append(
                tool_call("update_persona", name=f.speaker, profile=f"enjoys {', '.join(traits)}.", source=[f.dia_id])
            )
            continue
        if rng.random() < cfg.p_drop_fact:
            continue
        key = "fact" if f.store == "fact" else "experience"
        calls.append(
            tool_call(
                f"create_{key}",
                **{key: f.text},
                start_time=f.start_time,
                end_time=f.end_time,
                source=[f.dia_id] if f.dia_id in ids else [],
            )
        )
        queued.append(f)
    said = " ".join(f.text for f in facts) or "Small talk only."
    calls.append(tool_call("update_summary", content=f"Session {state.memory['chunk'] + 1} ({date}): {said}"))
    o["queued"] = queued  # one per candidate, in order: what the evolution calls decide on
    return "".join(calls)


def _observed_facts(conv, session: int) -> list[StreamFact]:
    """A real LoCoMo file's ``observation`` entries of one session as facts (no slots)."""
    obs = (conv.extra.get("observation") or {}).get(f"session_{session}_observation") or {}
    out = []
    for speaker, items in obs.items() if isinstance(obs, dict) else ():
        for item in items if isinstance(items, list) else ():
            if isinstance(item, list) and len(item) >= 2 and isinstance(item[0], str) and isinstance(item[1], str):
                out.append(StreamFact(item[1], speaker, f"{speaker}|obs|{len(out)}", item[0], item[0]))
    return out


def _evolve(method, state, rng, cfg) -> str:
    o, store = state.oracle, stream_store(state)
    cand = state.memory["pending"][0]
    f: StreamFact = o["queued"].pop(0)
    related = store.search(cand["type"], cand["text"], method.related_k)  # what the context shows
    match = next((r for r in related if o["slot_of"].get(r.id) == f.slot), None)
    kind = f.slot.split("|")[1] if "|" in f.slot else ""
    history = o["history"].setdefault(f.slot, [])

    def add() -> str:
        o["slot_of"][f"{ID_PREFIX[cand['type']]}{store.counters[cand['type']] + 1}"] = f.slot
        history[:] = [(f.value, f.start_time)]
        return tool_call("add_item", document=cand["text"])

    if match is None:
        if f.change == "negate":
            return tool_call("ignore_item", reason="nothing stored to withdraw")
        others = [r for r in related if o["slot_of"].get(r.id, "").startswith(f"{f.speaker}|")]
        if f.change == "new" and others and _flawed(o, f.slot, "overwrite_slot", rng, cfg):
            o["slot_of"][others[0].id] = f.slot
            return tool_call("update_item", id=others[0].id, document=cand["text"])
        return add()
    if f.change in ("repeat", "new") and history and history[-1][0] == f.value:
        return tool_call("ignore_item", reason=f"same fact and time as {match.id}")
    if f.change == "negate":
        del o["slot_of"][match.id]
        return tool_call("delete_item", id=match.id)
    if f.change == "correct" or kind not in CURRENT:
        history[:] = [(f.value, f.start_time)]
        return tool_call("update_item", id=match.id, document=cand["text"])
    history.append((f.value, f.start_time))
    doc = CURRENT[kind].format(who=f.speaker, value=f.value) + (f" since {f.start_time}." if f.start_time else ".")
    if not _flawed(o, f.slot, "forget_earlier", rng, cfg):
        before = [f"{v} (since {d})" if d else v for v, d in reversed(history[:-1])]
        doc += f" Before: {', then '.join(before)}."
    return tool_call("update_item", id=match.id, document=doc, start_time=f.start_time)


def _shows(obs: str | None, answer: str) -> bool:
    """Does an observation state ``answer`` (whole words, LoCoMo normalisation)?"""
    words = re.sub(r"<[^>]*>|[\[\]\n]", " ", obs or "")  # tags and id brackets are not words
    return bool(answer) and f" {normalize(answer)} " in f" {normalize(words)} "


def _memory_lines(obs: str | None) -> list[str]:
    """The ``[id] text`` lines of a retrieval observation."""
    body = re.sub(r"</?information>", "\n", obs or "")
    return [ln.strip() for ln in body.split("\n") if ln.strip().startswith("[")]


def _finish(answer: str, obs: str | None, cfg) -> str:
    """The answer turn; with ``cfg.quote_source`` it first quotes the line of ``obs`` that shows the
    answer (none shows "Not mentioned": the turn says so)."""
    if not cfg.quote_source:
        return tool_call("finish", answer=answer)
    source = next((ln for ln in _memory_lines(obs) if _shows(ln, answer)), None)
    think = f"{source}" if source else "No memory says."
    return f"<think>{think}</think>{tool_call('finish', answer=answer)}"


def _retrieve(method, state, rng, cfg) -> str:
    o, qa = state.oracle, state.memory["qa"]
    tool_of = {store: name for name, store in SEARCH_TOOLS.items()}
    acts = [c for c in state.calls if c.role == "act"]
    last = acts[-1].observation_text if acts else None
    o.setdefault("hop", 0)
    o.setdefault("misses", 0)
    if not qa.hops:  # a real LoCoMo question: search it, answer with the top fact
        if not acts:
            return tool_call("search_facts", query=qa.question)
        lines = _memory_lines(last)
        return tool_call("finish", answer=lines[0].split("] ", 1)[-1].strip() if lines else NOT_MENTIONED)
    if o.get("searching") is not None:
        hop = qa.hops[o["searching"]]
        o["hop_seen"] = last  # what the last hop search showed (not a wasted search)
        if _shows(last, hop.answer):
            o["hop"], o["misses"] = o["hop"] + 1, 0
        else:
            o["misses"] += 1
        o["searching"] = None
    hops = qa.hops
    if qa.category == 5 and "hop_seen" in o:  # fooled only if the store pins the other speaker's fact on the subject
        subject = hops[0].query.split()[0]
        fooled = [
            ln
            for ln in _memory_lines(o["hop_seen"])
            if subject in ln and qa.adversarial_answer and _shows(ln, qa.adversarial_answer)
        ]
        return _finish(qa.adversarial_answer if fooled else NOT_MENTIONED, o["hop_seen"], cfg)
    if o["hop"] == len(hops):
        answer = hops[-1].answer
        if rng.random() < cfg.p_wrong_answer:
            answer = rng.choice([f.value for f in stream_conversation(state).facts if f.value != answer] or [answer])
        return _finish(answer, last, cfg)
    if o["hop"] == 1 and len(hops) > 1 and _flawed(o, state.task.id, "stop_early", rng, cfg):
        return _finish(hops[0].answer, last, cfg)
    hop = hops[o["hop"]]
    if o["misses"] >= 2 or state.max_turns - state.turn <= 1:
        return _finish(NOT_MENTIONED, last, cfg)
    if not o.get("wasted") and rng.random() < cfg.p_wasted_search:
        o["wasted"] = True
        return f"<think>What do I know about this?</think>{tool_call('search_summary', query=state.task.prompt)}"
    o["searching"] = o["hop"]
    if o["misses"] == 1:  # not in the formed memory: the raw turns
        return f"<think>Look in the raw turns.</think>{tool_call('search_turns', query=hop.query, top_k=5)}"
    args = {"name": hop.query} if hop.store == "persona" else {"query": hop.query}
    return f"<think>Look for: {hop.query}.</think>{tool_call(tool_of[hop.store], **args)}"
