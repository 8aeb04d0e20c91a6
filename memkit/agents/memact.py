"""MemAct: the history is a list of ID-addressed records; a Prune&Write action edits it.

MemAct §3.2: the state is ``H_t = [z_1, ..., z_k]``, each record ``z_i = (a_i, o_i, id_i)``.
A task action (search) appends a record; the memory action ``a_mem = (I_target, c)`` removes
the records whose ids are in ``I_target`` and appends itself, with its note ``c``, as a new
record (eq. 1), so later notes can prune earlier ones. The context of call t is the
instruction + question + the live records, each ``[id] output observation`` with the output
and observation as verbatim refs. ``state.memory["pruned"]`` keeps, per call, the ids that
call deleted; ``trajectory_info`` exports it as ``Trajectory.info[INFO_PRUNED_IDS]`` (the key
the viewers read). A Prune&Write naming an id that is not live is an invalid turn ("unknown
prune id").

Because contexts are no longer prefixes of each other after an edit, DCPO (§3.3,
:mod:`memkit.rl.segments` and the ``dcpo`` credit rule) trains on segments cut at each memory action.

Reward, eq. 3 with §4 (App.) values: +1 if the task succeeds, -0.1 if a constraint is
violated (invalid output, context or step limit), 0 otherwise; with k questions memkit gives
+1 x the fraction of correct slots (the paper's reward at k = 1).

Who decides when to prune (``schedule``): ``agent`` (the paper: the policy); ``fixed`` (Table 1's
dagger row: a Prune&Write is forced every ``interval`` calls by ending the context with the
teacher's prune opening, :data:`PRUNE_OPENER`, and one at any other call is an invalid turn);
``window`` (Table 1's sliding window: no prune tool, the context keeps the last ``window``
records; a Prune&Write is an invalid turn); ``summary`` (Table 1's summarisation: the window plus a
summary of the discarded content, written by the model itself; once more than ``window`` records are
live, the call's context ends with the prune opening *and the ids of every record but the newest*, so
the model writes only the note that replaces them; a Prune&Write anywhere else is an invalid turn).

Prompt: the system instruction of App. A.4.2 verbatim, with the ``prune_context`` tool
(A.4.1) written as tags. Deviations: ids are short sequential ``r1, r2, ...`` (the paper's
are random strings such as ``4sNKcUV``); the tool call is ``<prune>ids</prune><note>...</note>``
rather than a JSON function call, so a small model learns it quickly.
"""

from __future__ import annotations

import random
import re

from memkit.agents import oracle as script
from memkit.agents.base import (
    SPARE_TURNS,
    AgentState,
    CallSpec,
    Env,
    Method,
    OracleConfig,
    Parsed,
    Segment,
    exact_match,
    slot_scores,
)
from memkit.agents.react import question_segments
from memkit.agents.tags import extract, parse_action, tag_status

INSTRUCTION = (
    "You are an Information Seeking Master. Your task is to thoroughly seek the internet for information and "
    "provide accurate answers to questions. You will not give up until you find the corresponding information.\n"
    "As you proceed, adhere to the following principles:\n"
    "1. Persistent Actions for Answers: You will engage in many interactions, delving deeply into the topic to "
    "explore all possible aspects.\n"
    "2. Repeated Verification: Before presenting a Final Answer, you will cross-check the information you have "
    "gathered to confirm its reliability.\n"
    "3. Attention to Detail: You will carefully analyze each information source to ensure that all data is "
    "current and relevant.\n"
    "Tools: search with <search> query </search> (results come back in <information> </information>); give the "
    "final answer in <answer> </answer> (separate the answers to several questions with semicolons).\n"
    "Core Tool: prune_context\n"
    "- You have access to prune_context for active context management. Its function is to summarize specific "
    "tool calls into memory paragraphs and delete them after execution. Call it as <prune> ids </prune>"
    "<note> memory </note>: the note is a detailed summary of key facts and current status from the tool calls "
    "being removed and must contain sufficient information to continue reasoning; the ids are the [id] labels "
    "of the records to delete.\n"
    "- Treat this as a core reasoning tool. Use it throughout every step of your reasoning process to maintain "
    "focus and clarity.\n"
    "Context Management Policy\n"
    "- Keep the active context logically consistent.\n"
    "- Continuously summarize outcomes and prune superseded steps to maintain a high signal-to-noise ratio.\n"
    "Memory Structure:\n"
    "- [OBJECTIVE] The ultimate goal of the user.\n"
    "- [CONCLUSIONS/FACTS] Verifiably true information gathered.\n"
    "- [STATUS] The specific and actionable next step.\n"
    "- [ASSUMPTIONS] Optional unverified premises used to proceed.\n"
)
_ID_RE = re.compile(r"[A-Za-z0-9_-]+")
#: ``Trajectory.info`` keys MemAct writes, one entry per call: the record id the call made
#: (None for the answer) and the record ids its Prune&Write deleted ([] for other calls).
INFO_RECORD_IDS, INFO_PRUNED_IDS = "record_ids", "pruned_ids"
#: who decides when to prune (the module docstring)
SCHEDULES = ("agent", "fixed", "window", "summary")
#: how the teacher opens a Prune&Write; the ``fixed`` schedule ends a due call's context with it
PRUNE_OPENER = "<think>Let me prune the context and keep the facts.</think><prune>"


def parse_ids(text: str) -> list[str]:
    """ "r1, [r3] r4" -> ["r1", "r3", "r4"] (order kept, duplicates dropped)."""
    out: list[str] = []
    for tok in _ID_RE.findall(text or ""):
        if tok not in out:
            out.append(tok)
    return out


class MemAct(Method):
    name = "memact"
    format_penalty = -0.1
    default_credit = "dcpo"  # segments at memory edits inherit the trajectory advantage (§3.3)
    default_packing = "mem1_exact"  # a segment's calls share their prefix: one exact prefix-trie row

    def __init__(self, prune_after: int = 2, schedule: str = "agent", interval: int = 3, window: int = 3):
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown MemAct schedule {schedule!r}; choose one of {SCHEDULES}")
        if interval < 2 or window < 1:
            raise ValueError(f"MemAct needs interval >= 2 and window >= 1 (got interval={interval}, window={window})")
        self.prune_after = prune_after  # the oracle prunes once this many search records are live
        self.schedule, self.interval, self.window = schedule, interval, window

    def prune_due(self, state: AgentState) -> bool:
        """This call must be a Prune&Write: ``fixed``, every ``interval``-th call (3rd, 6th, ...);
        ``summary``, once more than ``window`` records are live."""
        if self.schedule == "summary":
            return len(self._mem(state)["records"]) > self.window
        return self.schedule == "fixed" and (state.turn + 1) % self.interval == 0

    def forced_prefix(self, state: AgentState) -> str:
        """How a due call's context ends: the prune opening (``fixed``: the model picks the ids), or the
        opening, the ids of every live record but the newest and ``<note>`` (``summary``: it writes the note)."""
        if self.schedule != "summary":
            return PRUNE_OPENER
        return f"{PRUNE_OPENER}{', '.join(r['id'] for r in self._mem(state)['records'][:-1])}</prune><note>"

    def suggested_max_turns(self, task) -> int:
        """Search turns + one Prune&Write per ``prune_after`` searches (memory actions are turns, §3.2)."""
        hops = super().suggested_max_turns(task) - SPARE_TURNS
        if self.schedule == "window":
            return hops + SPARE_TURNS
        every = {"agent": self.prune_after, "fixed": self.interval - 1}.get(self.schedule, self.window)
        return hops + -(-hops // max(every, 1)) + SPARE_TURNS

    def _mem(self, state: AgentState) -> dict:
        m = state.memory
        if "records" not in m:
            m.update(records=[], next_id=1, pruned={}, made={})  # made: call index -> record id
        return m

    def next_call(self, state: AgentState) -> CallSpec:
        segs = question_segments(INSTRUCTION, state)
        records = self._mem(state)["records"]
        for rec in records[-self.window :] if self.schedule == "window" else records:
            call = state.calls[rec["call"]]
            segs.append(Segment("record", f"[{rec['id']}] "))
            segs.append(
                Segment("note" if rec["kind"] == "note" else "output", call.output_text, ref=(rec["call"], "output"))
            )
            if call.observation_text:
                segs.append(Segment("information", call.observation_text, ref=(rec["call"], "observation")))
        prefix = self.forced_prefix(state) if self.prune_due(state) else ""
        if prefix:
            segs.append(Segment("hint", prefix))
        return CallSpec(
            segs, max_new_tokens=96 + 32 * state.task.k, stop=("</search>", "</answer>", "</note>"), prefix=prefix
        )

    def parse(self, text: str, role: str = "act") -> Parsed:
        if not isinstance(text, str):
            return Parsed(ok=False, error="empty output")
        if "<prune>" not in text and "<note>" not in text:
            return parse_action(text, ("search", "answer"), optional=("think",))
        others = [t for t in ("search", "answer") if f"<{t}>" in text]
        if others:
            return Parsed(ok=False, error=f"both prune_write and {others[0]} in one output")
        if tag_status(text, "prune") == "unclosed":
            return Parsed(ok=False, error="unclosed <prune>")
        status = tag_status(text, "note")
        if status != "ok":
            return Parsed(ok=False, error=f"{'missing' if status == 'absent' else 'unclosed'} <note>")
        note = extract(text, "note") or ""
        if not note:
            return Parsed(ok=False, error="empty note")
        ids = parse_ids(extract(text, "prune") or "")
        fields = {"note": note, "prune": extract(text, "prune") or ""}
        if extract(text, "think") is not None:
            fields["think"] = extract(text, "think")
        return Parsed(ok=True, action="prune_write", argument=note, prune_ids=ids, fields=fields)

    def apply(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        m = self._mem(state)
        if parsed.action == "answer":
            return self.search_or_answer(state, parsed, env)
        due = self.prune_due(state)
        if due and parsed.action != "prune_write":  # unreachable through parse (the opening is forced)
            state.fail("fixed schedule: a Prune&Write was due")
            return None
        if parsed.action == "prune_write" and self.schedule != "agent" and not due:
            state.fail(
                {
                    "window": "no prune tool under the sliding window",
                    "summary": f"memory action before the window is full (more than {self.window} records)",
                }.get(self.schedule, f"memory action off the fixed schedule (every {self.interval} calls)")
            )
            return None
        if parsed.action == "prune_write":
            live = [r["id"] for r in m["records"]]
            unknown = [i for i in parsed.prune_ids if i not in live]
            if unknown:
                state.fail(f"unknown prune id(s) {', '.join(unknown)} (live: {', '.join(live) or 'none'})")
                return None
            m["records"] = [r for r in m["records"] if r["id"] not in parsed.prune_ids]  # eq. 1
            m["pruned"][len(state.calls)] = list(parsed.prune_ids)
        obs = self.search_or_answer(state, parsed, env) if parsed.action == "search" else None
        rid = f"r{m['next_id']}"
        m["next_id"] += 1
        m["records"].append({"id": rid, "call": len(state.calls), "kind": "search" if obs else "note"})
        m["made"][len(state.calls)] = rid
        if obs is None:
            deleted = ", ".join(parsed.prune_ids) or "nothing"
            obs = f"\n<information>Deleted {deleted}. Note saved as {rid}.</information>\n"
        return obs

    def reward(self, state: AgentState) -> float:
        if not state.valid or state.answer is None:
            return self.format_penalty
        em = slot_scores(state.answer, state.task.golds, exact_match)
        return sum(em) / len(em) if em else 0.0

    def trajectory_info(self, state: AgentState) -> dict:
        m = self._mem(state)
        n = len(state.calls)
        return {
            INFO_RECORD_IDS: [m["made"].get(i) for i in range(n)],
            INFO_PRUNED_IDS: [list(m["pruned"].get(i, [])) for i in range(n)],
            "live_records": [r["id"] for r in m["records"]],
        }

    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        script.observe(state, rng, cfg)
        m = self._mem(state)
        n_search = sum(r["kind"] == "search" for r in m["records"])
        hop = script.next_hop(state)
        # agent: prune when enough records piled up, unless the turns left are needed for searching;
        # fixed, summary: exactly when due (the context already ends with the opening); window: never
        due = self.prune_due(state)
        wants = (
            self.schedule == "agent"
            and hop is not None
            and n_search >= self.prune_after
            and state.max_turns - state.turn > script.hops_left(state) + 2
        )
        if due or wants:
            k = state.task.k
            status = (
                "Next: answer."
                if hop is None
                else f"Next: Q{hop[0] + 1}: {state.task.questions[hop[0]].decomposition[hop[1]].text}"
            )
            note = (
                f"[OBJECTIVE] Answer {k} question{'s' if k > 1 else ''}. [CONCLUSIONS/FACTS] "
                f"{script.facts_text(state, cfg)} [STATUS] {status}"
            )
            kept = 1 if self.schedule == "summary" else 0  # summary: the newest record stays
            ids = ", ".join(r["id"] for r in m["records"][: len(m["records"]) - kept])
            text = f"{PRUNE_OPENER}{ids}</prune><note>{note}</note>"
            return text[len(self.forced_prefix(state)) :] if due else text
        d = script.decide(state, rng, cfg)
        if d.kind == "answer":
            return f"<think>{d.plan}</think><answer>{script.answer_text(state, rng, cfg)}</answer>"
        return f"<think>{script.plan_text(d)}</think><search>{d.query}</search>"
