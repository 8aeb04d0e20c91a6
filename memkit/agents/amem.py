"""A-MEM-style retrieval memory: the agent writes notes into an external store; the context retrieves them.

A baseline format (issue 59, for notebook 08), not one of the five papers' own methods: MEM1's Table 1 row
"(A-MEM)" ("MEM1's prompt and rollout pipeline with A-Mem's external memory module"; A-MEM, Xu et al.
2025, "augments an Instruct model with a vector database for memory retrieval"), which MemPO and MemAct
also compare against. Its contrast with MEM1: the memory is *retrieved* from everything written, not a
state the agent rewrites each turn, so what the agent sees of its memory is decided by similarity.

Each call writes one note of what it learnt from the last results, then an action::

    <note>Drokthosal Kumkem works: Trekshes Industries.</note><search>Trekshes Industries founder</search>
    <note>Drokthosal Kumkem works => Shorpi Vepo.</note><answer>Shorpi Vepo; 1931</answer>

The environment adds every note to the episode's store n_1, n_2, ... (outside the context). Context of
call t (MEM1 Alg. 1's pipeline with the memory retrieved instead of carried):

    c_t = instruction + q_1..q_k  |  <memory> N_t </memory>  |  S_{t-1} A_{t-1}  |  O_{t-1}
    N_t = U_{i=1..k} TopR(q_i; n_1 .. n_{t-2}),  r notes per question (``r``, default 3)

``TopR`` ranks notes by BM25 against question i's text (:func:`memkit.retrieval.bm25.bm25_scores_loop`,
the kit's passage-retriever formula scored directly: a store of a few dozen notes that changes every
call is cheaper to score than to index); notes with no word in common are never shown, ties go to the
older note, and the union is shown in the order written, a repeated text once. ``S_{t-1} A_{t-1}`` (the
last output, holding the newest note n_{t-1}) and ``O_{t-1}`` (its observation with MEM1's turns-left
hint) are verbatim refs, so the context is bounded by k * r notes and one step, whatever the turns.

Reward: MEM1's (App. B.4.1): one point per correct answer slot (EM), 0 for broken tags or a wrong answer
count; an empty note is an invalid turn. Packing ``mem1_exact`` (the calls share the prompt, a prefix
trie row is exact), credit ``grpo``.

The teacher (:meth:`AMem.oracle`) walks :mod:`memkit.agents.oracle`'s script and notes, each call, the
ledger entry (:func:`~memkit.agents.oracle.ledger_entry`: keyed by a question's first search, so the note
shares words with its question and comes back for it) of every question whose entry changed since its
last note (a flaw's forgotten answer too: "=> unknown"), else of the question the last search served, or
"Nothing found yet." on the first call. ``OracleConfig.memory`` and ``show_comparison`` are not used
(the notes are always keyed entries); the other knobs and flaws act as in every format.

Deviations from A-MEM: no LLM-written note attributes (keywords, tags, context), no links between notes
and no memory evolution (each is an extra LLM call in A-MEM; here a note is stored as the agent wrote
it); BM25 over the note text instead of embeddings (all-MiniLM-L6-v2); the retrieval key is each
question's text, r notes per question (A-MEM: the current query, top-k overall); the acting model writes
the note inline in its own output (A-MEM: a separate memory module).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from memkit.agents import oracle as script
from memkit.agents.base import (
    AgentState,
    CallSpec,
    Env,
    Method,
    OracleConfig,
    Parsed,
    Segment,
    exact_match,
    slot_scores,
    wrap_information,
)
from memkit.agents.mem1 import last_step_segments, turns_left_hint
from memkit.agents.react import question_segments
from memkit.agents.tags import parse_action
from memkit.retrieval.bm25 import bm25_scores_loop, topk_full_sort
from memkit.world.schema import Passage

INSTRUCTION = (
    "You will answer one or more complex questions using web search and an external note store.\n\n"
    "At each step you see the questions, the notes retrieved from your store for them inside <memory> ... "
    "</memory>, your previous step, and its search results inside <information> ... </information> (except "
    "in the first step, where only the questions are provided). Your task is to:\n\n"
    "1. Write one short note of what you learnt from the search results inside <note> ... </note>. Every note "
    "is saved in the store, but only the notes that share words with a question come back, so name what each "
    "fact is about.\n\n"
    "2. Then choose one of the following actions:\n\n"
    "- If any question remains unanswered, issue a single query for one question inside <search> ... "
    "</search>.\n"
    "- If all questions are answered, provide the final answers--separated by semicolons--within "
    "<answer> answer1; answer2; ... </answer>, without explanations.\n\n"
    "Always follow the structure <note> ... </note><search> ... </search> or <note> ... </note><answer> ... "
    "</answer>.\n\n"
)
#: the teacher's note before anything was found (also facts_text's words, so the tokenizer knows them)
NOTHING_YET = "Nothing found yet."
#: ``Trajectory.info`` keys: every note in the order written, the call that wrote each, and per call the
#: indices (into the notes) its context showed in ``<memory>``
INFO_NOTES, INFO_NOTE_CALLS, INFO_SHOWN = "notes", "note_calls", "shown_notes"
_WRITTEN, _SERVED = "amem_written", "amem_served"  # the teacher's keys in ``state.oracle``


@dataclass
class NoteStore:
    """The episode's external memory: every note written, in order, with the call that wrote it."""

    texts: list[str] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    shown: dict[int, list[int]] = field(default_factory=dict)  # call index -> note indices in its context

    def add(self, text: str, call: int) -> None:
        self.texts.append(text)
        self.calls.append(call)

    def top(self, query: str, r: int, upto: int) -> list[int]:
        """Indices of the ``r`` notes among the first ``upto`` that BM25 ranks highest for ``query``
        (score > 0 only; ties to the older note)."""
        if upto <= 0 or r <= 0:
            return []
        passages = [Passage(id=str(i), title="", text=t) for i, t in enumerate(self.texts[:upto])]
        return [i for i, _ in topk_full_sort(np.asarray(bm25_scores_loop(query, passages)), r)]

    def retrieve(self, questions: list[str], r: int, upto: int) -> list[int]:
        """``N_t``: the union of each question's top ``r`` notes, in the order written, a repeated text once."""
        chosen = sorted({i for q in questions for i in self.top(q, r, upto)})
        seen, out = set(), []
        for i in chosen:
            if self.texts[i] not in seen:
                seen.add(self.texts[i])
                out.append(i)
        return out


class AMem(Method):
    """``r``: notes retrieved per question (the module doc's ``TopR``)."""

    name = "amem"
    format_penalty = 0.0
    default_packing = "mem1_exact"  # contexts share the prompt, then differ: one exact prefix-trie row
    default_credit = "grpo"

    def __init__(self, r: int = 3):
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise ValueError(f"amem needs r >= 1 notes per question, got {r!r}")
        self.r = r

    def notes(self, state: AgentState) -> NoteStore:
        return state.memory.setdefault("notes", NoteStore())

    # ---- context -------------------------------------------------------------------------
    def next_call(self, state: AgentState) -> CallSpec:
        k = state.task.k
        # k > 1: task.prompt is MEM1's composite ("Answer each of the following questions: ...")
        question = question_segments(INSTRUCTION, state, "" if k > 1 else "Question: ")
        store = self.notes(state)
        # the newest note is in the last output (a ref below): retrieval ranks the older ones
        upto = max(len(store.texts) - 1, 0)
        shown = store.retrieve([q.text for q in state.task.questions], self.r, upto)
        store.shown[len(state.calls)] = shown
        memory = Segment("memory", f"<memory>{' '.join(store.texts[i] for i in shown)}</memory>\n")
        return CallSpec(
            question + [memory] + last_step_segments(state, "output"),
            max_new_tokens=96 + 32 * k,
            stop=("</search>", "</answer>"),
        )

    # ---- parsing and execution -------------------------------------------------------------
    def parse(self, text: str, role: str = "act") -> Parsed:
        parsed = parse_action(text, ("search", "answer"), required=("note",))
        if parsed.ok and not parsed.fields.get("note"):
            return Parsed(ok=False, action=parsed.action, fields=parsed.fields, error="empty note")
        return parsed

    def apply(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        self.notes(state).add(parsed.fields["note"], call=len(state.calls))  # this call's index
        obs = self.search_or_answer(state, parsed, env)
        return None if obs is None else wrap_information(obs, hint=turns_left_hint(state))

    def reward(self, state: AgentState) -> float:
        """MEM1 App. B.4.1: one point per correct answer, 0 for broken tags or a wrong answer count."""
        if not state.valid or state.answer is None:
            return self.format_penalty
        return float(sum(slot_scores(state.answer, state.task.golds, exact_match)))

    def trajectory_info(self, state: AgentState) -> dict:
        store = self.notes(state)
        return {
            INFO_NOTES: list(store.texts),
            INFO_NOTE_CALLS: list(store.calls),
            INFO_SHOWN: [list(store.shown.get(i, [])) for i in range(len(state.calls))],
        }

    # ---- scripted policy -------------------------------------------------------------------
    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        script.observe(state, rng, cfg)
        if _WRITTEN not in state.oracle:  # what the notes say of each question: "open" before any note
            state.oracle[_WRITTEN] = {qi: script.ledger_entry(state, qi) for qi in range(state.task.k)}
        written = state.oracle[_WRITTEN]
        d = script.decide(state, rng, cfg)  # before the note: a stop_early belief settles an entry here
        note = self._teacher_note(state, written)
        if d.kind == "answer":
            return f"<note>{note}</note><answer>{script.answer_text(state, rng, cfg)}</answer>"
        state.oracle[_SERVED] = d.qi
        return f"<note>{note}</note><search>{d.query}</search>"

    def _teacher_note(self, state: AgentState, written: dict) -> str:
        """The ledger entries that changed since the teacher last noted them; else the entry of the question
        the last search served (nothing new found); else :data:`NOTHING_YET`."""
        entries = {qi: script.ledger_entry(state, qi) for qi in written}
        changed = [qi for qi in entries if entries[qi] != written[qi]]
        written.update(entries)
        if changed:
            return " ".join(entries[qi] for qi in changed)
        served = state.oracle.get(_SERVED)
        return entries[served] if served is not None else NOTHING_YET
