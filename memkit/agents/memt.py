"""Mem-T: build a hierarchical memory while reading a conversation, answer by searching it.

One episode per conversation, in two phases (§3.1), every step a :class:`~memkit.core.trajectory.Call`:

* **construction**, one *formation* call per incoming chunk x_t (a session):
  ``a_form ~ pi_form(. | x_t, M_work)`` (eq. 3) writes candidate facts and experiences, the
  persona profile and the working summary; then one *evolution* call per candidate m:
  ``a_evol ~ pi_evol(. | m, related(m))`` with ADD / UPDATE / DELETE / IGNORE against the top-k
  related memories (eq. 4-5). Raw memory archives every turn of the chunk (eq. 2's M_raw).
* **retrieval**, after :func:`memkit.rollout.streams.stream_rollouts` forks the built episode
  once per question: ``a_k ~ pi_retr(. | q, M, h_{k-1})`` (eq. 7) searches one memory type per
  step (eq. 6) until ``finish`` gives the answer; at most ``max_steps`` steps (the paper: 6).

Calls are JSON tool calls as in the released prompts (App. C), one per ``<tool_call>`` tag.
Reward: the answer's LoCoMo F1 for its category (``memkit.metrics.locomo``), times the format
indicator of eq. 10 (an invalid retrieval output scores 0). A malformed construction output
ends only its own call (recorded invalid with its reason); the stream reads on.

Deviations (beside the tags-free JSON format, which is the released one):

* ``create_fact`` / ``create_experience`` / ``update_persona`` take an optional ``source``: the
  dialogue ids the memory states. A memory's sources are what it names (none if it names none);
  that is what "evidence in memory" and Evid(v) count. Hindsight's X_src is the named ids, else
  the whole chunk. Raw archiving is automatic (eq. 2 keeps every chunk) rather than ``CrtRaw``.
* Chunks are sessions. A formation output with no tool call writes nothing (a_form may be empty).
* Persona and summary writes go straight to the store (the released tools rewrite the profile or
  summary); facts and experiences go through evolution. ``add_item`` keeps the candidate's times;
  ``update_item`` / ``delete_item`` may name only a memory of the candidate's type.
* Every search accepts ``top_k`` (1-20, default 5; the paper gives it to ``search_turns`` only);
  ``search_personas`` looks ``name`` up exactly, else searches personas for it.
"""

from __future__ import annotations

import random

from memkit.agents import memt_oracle
from memkit.agents.base import AgentState, CallSpec, Env, Method, OracleConfig, Parsed, Segment
from memkit.agents.memt_tools import (
    EVOLUTION_TOOLS,
    FORMATION_TOOLS,
    RETRIEVAL_TOOLS,
    SEARCH_TOOLS,
    parse_tool_calls,
    text_arg,
)
from memkit.envs.memory_store import MEMORY_TYPES, MemoryStore, StoreError
from memkit.metrics.locomo import locomo_f1
from memkit.world.conversation import Conversation, Turn
from memkit.world.schema import Question, Task

FORMATION_INSTRUCTION = (
    "You are a memory agent reading a conversation chunk by chunk. Extract what is worth remembering with tool "
    'calls, one <tool_call>{"name": ..., "arguments": {...}}</tool_call> each:\n'
    "- create_fact(fact, start_time, end_time, source): concrete, verifiable statements about WHAT happened; "
    "resolve relative times ('yesterday') into dates; source = the dialogue ids it comes from.\n"
    "- create_experience(experience, start_time, end_time, source): actionable lessons, tips, HOW-TO.\n"
    "- update_persona(name, profile, source): the full, updated profile of a person (hobbies, traits).\n"
    "- update_summary(content): the updated summary of the sessions so far.\n"
)
EVOLUTION_INSTRUCTION = (
    "You maintain a memory store. Decide what to do with the new memory given the related memories, with one "
    "tool call:\n- add_item(document): a new memory.\n- update_item(id, document): enrich or change an existing "
    "memory; keep the time information of the earlier versions in the document.\n- delete_item(id): an existing "
    "memory is explicitly negated or wrong.\n- ignore_item(reason): the new memory is redundant in both meaning "
    "and time.\n"
)
RETRIEVAL_INSTRUCTION = (
    "Answer the question from your memory. Search it with one tool call per step: search_facts(query), "
    "search_experiences(query), search_personas(name, query), search_turns(query, top_k), search_summary(query); "
    "call finish(answer) with a short answer when you are confident, or answer 'Not mentioned in the "
    "conversation.' if the memory does not say.\n"
)
#: ``Trajectory.info`` keys the trace viewer reads: per construction call (str index), the store
#: operations it ran ``[op, id, text]`` (raw archiving left out) and the live memories per type after it
INFO_STORE_OPS, INFO_STORE_SIZES = "store_ops", "store_sizes"
#: ``Trajectory.info`` key: every memory operation of construction, ``{"call", "op" (the tool),
#: "memory" (the id it made or touched, None for IGNORE and unevolved candidates), "sources",
#: "tool_index" (which tool call of the call's output it is)}``: what hindsight credit scores (eq. 16-17)
INFO_MEMORY_OPS = "memory_ops"


def conversation_task(conv: Conversation) -> Task:
    """The construction phase's task: the conversation, no question yet."""
    return Task(id=conv.sample_id, questions=[], prompt="")


def question_task(conv: Conversation, i: int) -> Task:
    """Question ``i`` of ``conv`` as a one-question task (kind = the LoCoMo category name)."""
    qa = conv.qa[i]
    q = Question(
        id=f"{conv.sample_id}-q{i}",
        text=qa.question,
        answers=[qa.answer],
        kind=qa.category_name,
        supporting_ids=list(qa.evidence),
    )
    return Task(id=q.id, questions=[q], prompt=qa.question)


class MemT(Method):
    name = "memt"
    format_penalty = 0.0  # eq. 10: the format indicator zeroes the reward
    default_credit = "mot"  # MoT-GRPO: node rewards and tree advantages (memkit.rl.mot)
    default_packing = "mem1_exact"  # a tree's retrieval calls extend their parent's: one exact trie row per tree
    rollout_plan = "trees"  # questions over teacher-built stores, grown as operation trees (memkit.rl.plans)

    def __init__(self, retriever: str = "bm25", top_k: int = 5, related_k: int = 5, max_steps: int = 6):
        if top_k < 1 or related_k < 1 or max_steps < 1:
            raise ValueError(f"MemT needs top_k, related_k, max_steps >= 1 (got {top_k}, {related_k}, {max_steps})")
        self.retriever, self.top_k, self.related_k, self.max_steps = retriever, top_k, related_k, max_steps

    # ---- states ---------------------------------------------------------------------
    def new_stream_state(self, conv: Conversation) -> AgentState:
        state = AgentState(task=conversation_task(conv), max_turns=self.max_steps)
        state.memory.update(
            conversation=conv,
            store=MemoryStore(self.retriever),
            chunk=0,
            pending=[],
            phase="construct" if conv.sessions else "answer",
            retrieved={},
            related={},
            qa=None,
            ops={},
            sizes={},
            mem_ops=[],
        )
        return state

    def start_question(self, state: AgentState, i: int) -> None:
        """Turn a built (forked) episode into the answering of question ``i``."""
        conv = state.memory["conversation"]
        state.task, state.memory["qa"], state.memory["phase"] = question_task(conv, i), conv.qa[i], "answer"
        state.turn, state.max_turns = 0, self.max_steps

    def new_state(self, task: Task, max_turns: int = 12) -> AgentState:
        raise TypeError(
            "Mem-T episodes start from a conversation: use memkit.rollout.streams.stream_rollouts "
            "(or MemT().new_stream_state(conversation))"
        )

    def suggested_max_turns(self, task) -> int:
        return self.max_steps

    @staticmethod
    def constructing(state: AgentState) -> bool:
        return state.memory["phase"] == "construct"

    def chunk(self, state: AgentState) -> tuple[str, list[Turn]]:
        session = state.memory["conversation"].sessions[state.memory["chunk"]]
        return session.date_time, session.turns

    # ---- context building -------------------------------------------------------------
    def next_call(self, state: AgentState) -> CallSpec:
        m = state.memory
        store: MemoryStore = m["store"]
        if self.constructing(state) and m["pending"]:
            cand = m["pending"][0]
            related = store.search(cand["type"], cand["text"], self.related_k)
            m["related"][len(state.calls)] = [r.id for r in related]
            shown = "\n".join(r.render() for r in related) or "(none)"
            when = " - ".join(t for t in (cand["start_time"], cand["end_time"]) if t)
            return CallSpec(
                [
                    Segment("system", EVOLUTION_INSTRUCTION),
                    Segment(
                        "question", f"New {cand['type']} memory: {cand['text']}" + (f" ({when})" if when else "") + "\n"
                    ),
                    Segment("memory", f"Related memories:\n{shown}\n"),
                ],
                role="evolve",
                max_new_tokens=160,
                stop=("</tool_call>",),
            )
        if self.constructing(state):
            date, turns = self.chunk(state)
            lines = "".join(f"{t.dia_id} {t.speaker}: {t.text}\n" for t in turns)
            return CallSpec(
                [
                    Segment("system", FORMATION_INSTRUCTION),
                    Segment("memory", f"Summary so far: {store.working or '(empty)'}\n"),
                    Segment("information", f"Session on {date}:\n{lines}"),
                ],
                role="form",
                max_new_tokens=512,
                stop=(),
            )
        segs = [Segment("system", RETRIEVAL_INSTRUCTION), Segment("question", f"Question: {state.task.prompt}\n")]
        for i, call in enumerate(state.calls):
            if call.role == "act":
                segs.append(Segment("output", call.output_text, ref=(i, "output")))
                if call.observation_text:
                    segs.append(Segment("information", call.observation_text, ref=(i, "observation")))
        return CallSpec(segs, role="act", max_new_tokens=96, stop=("</tool_call>",))

    # ---- parsing --------------------------------------------------------------------
    def parse(self, text: str, role: str = "act") -> Parsed:
        allowed, at_most = {
            "form": (FORMATION_TOOLS, None),
            "evolve": (EVOLUTION_TOOLS, 1),
            "act": (RETRIEVAL_TOOLS, 1),
        }.get(role, ((), 0))
        calls, error = parse_tool_calls(text, allowed, at_most)
        if role == "form" and error == "no <tool_call>":  # a_form may be empty (small talk): nothing to write
            return Parsed(ok=True, action="form", calls=[])
        if error:
            return Parsed(ok=False, error=error, recoverable=role != "act")
        return Parsed(ok=True, action=calls[0]["name"] if role != "form" else "form", calls=calls)

    # ---- acting ---------------------------------------------------------------------
    def apply(self, state: AgentState, parsed: Parsed, env: Env | None = None) -> str | None:
        m = state.memory
        if not self.constructing(state):
            return self._retrieve(state, parsed)
        store: MemoryStore = m["store"]
        before = len(store.log)
        try:
            if m["pending"]:
                obs = self._evolve(state, parsed)
            else:
                obs = self._form(state, parsed)
        except StoreError as e:  # a bad id or argument: this call is invalid, the stream reads on
            parsed.ok, parsed.error, parsed.recoverable = False, str(e), True
            obs = None
        ops = [
            [op, mid, store.items[mid].text if op in ("add", "update") else detail]
            for op, mid, detail in store.log[before:]
            if not (op == "add" and detail == "raw")
        ]
        m["ops"][len(state.calls)] = ops
        m["sizes"][len(state.calls)] = {t: len(store.of_type(t)) for t in MEMORY_TYPES}
        if not m["pending"] and m["chunk"] >= len(m["conversation"].sessions):
            m["phase"] = "built"
        return obs

    def _form(self, state: AgentState, parsed: Parsed) -> str:
        m, store = state.memory, state.memory["store"]
        date, turns = self.chunk(state)
        m["chunk"] += 1
        for t in turns:  # eq. 2: M_raw archives every chunk
            store.add("raw", f"{t.dia_id} {t.speaker}: {t.text}", [t.dia_id], turn_time=date)
        if not parsed.ok:
            return None
        chunk_ids = [t.dia_id for t in turns]
        cands, writes = [], []  # checked first, written after: an invalid output writes nothing
        for index, call in enumerate(parsed.calls):
            name, args = call["name"], call["arguments"]
            named = named_sources(args, chunk_ids, name)
            if name in ("create_fact", "create_experience"):
                key = "fact" if name == "create_fact" else "experience"
                cands.append(
                    {
                        "type": key,
                        "text": text_arg(args, key),
                        "sources": named,
                        "start_time": text_arg(args, "start_time", False),
                        "end_time": text_arg(args, "end_time", False),
                        "turn_time": date,
                        "op": name,
                        "x_src": named or chunk_ids,
                        "tool_index": index,
                    }
                )
            elif name == "update_persona":
                writes.append(
                    (name, index, named, store.set_persona, text_arg(args, "name"), text_arg(args, "profile"))
                )
            else:
                writes.append((name, index, chunk_ids, store.set_summary, text_arg(args, "content")))
        call = len(state.calls)
        made = []
        for name, index, sources, fn, *a in writes:
            made.append(fn(*a, sources, date))
            m["mem_ops"].append(
                {"call": call, "op": name, "memory": made[-1], "sources": sources or chunk_ids, "tool_index": index}
            )
        for cand in cands:  # the memory it becomes is filled in by the evolution call that decides on it
            cand["mem_op"] = len(m["mem_ops"])
            m["mem_ops"].append(
                {
                    "call": call,
                    "op": cand.pop("op"),
                    "memory": None,
                    "sources": cand.pop("x_src"),
                    "tool_index": cand.pop("tool_index"),
                }
            )
        m["pending"].extend(cands)
        return f"\n<information>{len(cands)} candidate memories; wrote {', '.join(made) or 'nothing else'}.</information>\n"

    def _evolve(self, state: AgentState, parsed: Parsed) -> str | None:
        m, store = state.memory, state.memory["store"]
        cand = m["pending"].pop(0)
        if not parsed.ok:
            return None
        name, args = parsed.calls[0]["name"], parsed.calls[0]["arguments"]
        mid = None
        if name in ("update_item", "delete_item"):
            mid = text_arg(args, "id")
            if store.get(mid).type != cand["type"]:
                raise StoreError(f"{name}: {mid} is a {store.get(mid).type} memory, the new one a {cand['type']}")
        if name == "add_item":
            doc = text_arg(args, "document", False) or cand["text"]
            mid = store.add(cand["type"], doc, cand["sources"], cand["turn_time"], cand["start_time"], cand["end_time"])
            obs = f"Added {mid}."
        elif name == "update_item":
            store.update(
                mid,
                text_arg(args, "document"),
                cand["sources"],
                cand["turn_time"],
                text_arg(args, "start_time", False) or None,
                text_arg(args, "end_time", False) or None,
            )
            obs = f"Updated {mid}."
        elif name == "delete_item":
            store.delete(mid)
            obs = f"Deleted {mid}."
        else:
            store.ignore(str(args.get("reason", "")))
            obs = "Ignored."
        if name in ("add_item", "update_item"):  # the candidate's formation op made this memory
            m["mem_ops"][cand["mem_op"]]["memory"] = mid
        x_src = m["mem_ops"][cand["mem_op"]]["sources"]  # what its formation op processed
        m["mem_ops"].append({"call": len(state.calls), "op": name, "memory": mid, "sources": x_src, "tool_index": 0})
        return f"\n<information>{obs}</information>\n"

    def _retrieve(self, state: AgentState, parsed: Parsed) -> str | None:
        call = parsed.calls[0]
        name, args = call["name"], call["arguments"]
        if name == "finish":
            state.answer = str(args.get("answer", "")).strip()
            state.done = True
            return None
        store: MemoryStore = state.memory["store"]
        k = args.get("top_k", self.top_k)
        k = k if isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 20 else self.top_k
        query = str(args.get("query") or "")
        if name == "search_personas" and isinstance(args.get("name"), str) and args["name"].strip():
            found = store.persona(args["name"])
            hits = [found] if found is not None else store.search("persona", args["name"], k)
        else:
            hits = store.search(SEARCH_TOOLS[name], query, k)
        state.memory["retrieved"][len(state.calls)] = [h.id for h in hits]
        body = "\n".join(h.render() for h in hits) or "No memories matched the query."
        return f"\n<information>{body}</information>\n"

    # ---- outcome --------------------------------------------------------------------
    def reward(self, state: AgentState) -> float:
        qa = state.memory.get("qa")
        if qa is None or not state.valid or state.answer is None:
            return self.format_penalty
        return locomo_f1(state.answer, qa.answer, qa.category)

    def trajectory_info(self, state: AgentState) -> dict:
        m, store = state.memory, state.memory["store"]
        qa = m.get("qa")
        info = {
            INFO_STORE_OPS: {str(k): v for k, v in m["ops"].items()},
            INFO_MEMORY_OPS: list(m["mem_ops"]),
            INFO_STORE_SIZES: {str(k): v for k, v in m["sizes"].items()},
            "retrieved_ids": {str(k): v for k, v in m["retrieved"].items()},
            "related_ids": {str(k): v for k, v in m["related"].items()},
            "store": store.snapshot(),
            "store_log": [list(x) for x in store.log],
        }
        if qa is not None:
            info.update(
                category=qa.category_name,
                evidence=list(qa.evidence),
                evidence_in_memory=[e in store.evidence_ids() for e in qa.evidence],
                evidence_retrieved=_evidence_retrieved(store, m["retrieved"], qa.evidence),
            )
        return info

    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        return memt_oracle.write(self, state, rng, cfg)


def named_sources(args: dict, chunk_ids: list[str], tool: str) -> list[str]:
    """The dialogue ids a formation call names in ``source`` (one id or a list; [] if absent).
    An id outside the chunk is the caller's error (:class:`StoreError`: the call is invalid)."""
    source = args.get("source", [])
    source = [source] if isinstance(source, str) else source
    if not isinstance(source, list) or any(not isinstance(x, str) or x not in chunk_ids for x in source):
        raise StoreError(f"{tool}: source {source!r:.80} names dialogue ids outside this chunk")
    return list(dict.fromkeys(source))


def _evidence_retrieved(store: MemoryStore, retrieved: dict, evidence: list[str]) -> list[bool]:
    """Per evidence id: did a memory retrieved in this episode name it as a source (Evid(v) of
    eq. 10; summaries, which stand for a whole session, do not count)?"""
    sources = store.sources_of()
    seen = {x for ids in retrieved.values() for i in ids for x in sources.get(i, ())}
    return [e in seen for e in evidence]
