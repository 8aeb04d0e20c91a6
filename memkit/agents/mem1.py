"""MEM1: the internal state ``<think>`` *is* the memory (MEM1 §3.1, App. B.3, Alg. 1).

Context of call t (Alg. 1 line 14 "all previous context removed", line 19):

    instruction + questions  |  S_{t-1} A_{t-1}  (last output, verbatim)  |  O_{t-1}

where ``O_{t-1} = <information>You have N turns left.\\n docs</information>`` carries the hint
of Alg. 1 line 18. The agent must copy everything it still needs into the new ``<think>``,
because the old one disappears with the next turn: "at most two S's, two A's and one O"
(§3.1). Both earlier pieces are ``ref`` segments, so the engine reuses their exact token ids
and the packed trajectory ``(q, S1 A1 O1, S2 A2 O2, ...)`` with the 2D mask of §3.2 sees
exactly the tokens each call saw.

Prompts: App. B.3 Prompt 1 (k > 1) and Prompt 2 (k = 1), verbatim.
Reward (App. B.4.1): 1 point per correct answer (EM), 0 if tags are broken or the number of
answers differs from the number of questions; no format penalty (§4.4, App. F.2).

Deviation: Alg. 1 writes ``T - t`` turns left before incrementing t, which counts the turn
just taken; memkit writes the number of calls the agent really has left.

``answers="each"`` (a protocol deviation for long horizons, issue 58; ``docs/deviations.md``): the agent
sees and answers the questions one at a time, in order, each in its own ``<answer>``; the environment
records it and shows the next question, in ``<information>`` and in place of the question list; after
the k-th the episode ends with the k answers joined by ";" (the same reward). No context or output
depends on k: the agent never counts questions or writes a k-slot answer, and its ``<think>`` holds the
current question's entry only (the teacher's :func:`~memkit.agents.oracle.ledger_entry`, keyed by
words, no number), so a clone trained on small k is asked nothing at k = 16 that it did not do at k = 2.
The turn limit is per question too (:func:`question_turns`, a 1-question task's), and the hint counts the
current question's turns left: a shared limit would print numbers that grow with k, and a question that
loops would spend the turns of the questions after it.

``repeat_penalty`` (a reward deviation for RL, issue 58; 0 = the paper): each search whose query repeats
the previous search's verbatim (no answer committed in between) costs that much reward,
``r = r_EM - lambda * n_repeat``. Greedy decoding of a memory agent whose context is its last output and
observation is at a fixed point once it repeats a call: the clones' long-horizon failures are such loops.
"""

from __future__ import annotations

import random
from dataclasses import replace

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
    wrap_information,
)
from memkit.agents.react import question_segments
from memkit.agents.tags import parse_action

PROMPT_MULTI = (
    "You will answer multiple complex questions using iterative reasoning, summarization, and web search.\n\n"
    "At each step, you will see the questions, a cumulative summary of relevant information, the current "
    "search query, and search results (except in the first step, where only the questions are provided). "
    "Your task is to:\n\n"
    "1. Perform reasoning and update a cumulative, concise summary within <think> ... </think>. This acts as "
    "persistent memory and must include all essential information from previous <think> and <information> tags.\n\n"
    "2. Then choose one of the following actions:\n\n"
    "- If any question remains unanswered, issue a single query for one question inside <search> ... </search>. "
    "The query should consist of keywords or a short phrase. Only search one question at a time.\n\n"
    "- If all questions are answered, provide the final answers--separated by semicolons--within "
    "<answer> answer1; answer2; ... </answer>. The answers must be concise, contain only essential words, "
    "and avoid any explanations.\n\n"
    "Important:\n\n"
    "- Always follow this structure after <information> or the initial questions: <think> ... </think><search> "
    "... </search> or <think> ... </think><answer> ... </answer>.\n"
    "- Do not search multiple queries or questions simultaneously.\n\n"
)
#: ``answers="each"``: PROMPT_MULTI's answer rule, one question at a time (the deviation above)
PROMPT_EACH = PROMPT_MULTI.replace(
    "- If all questions are answered, provide the final answers--separated by semicolons--within "
    "<answer> answer1; answer2; ... </answer>.",
    "- If the current question is answered, provide its answer within <answer> ... </answer>; the next "
    "question then follows in <information>. Answer the questions one at a time, in order.",
)
ANSWERS = ("final", "each")
PROMPT_SINGLE = (
    "You will answer a complex question through iterative reasoning, summarization, and web searches.\n\n"
    "At each step, you can see the question, previous summary in <think> ... </think>, search query in "
    "<search> ... </search>, and the returned information in <information> ... </information> (except the "
    "first step where you will be given only the question). Then, you should:\n\n"
    "1. Conduct reasoning, and then update a concise, cumulative summary with essential information inside "
    "<think> </think>. This is your persistent memory and should include all important information from "
    "previous <think> </think> and <information> </information> (i.e. information and answers already found "
    "for questions).\n\n"
    "2. Then choose one:\n\n"
    "- Issue a query (i.e., key words / phrases for search) inside <search> </search> (you may search "
    "repeatedly until the answer is clear). This query will be used to conduct search and return the "
    "results in <information> results </information>\n"
    "- Provide the final concise answer (no explanations) if no additional information is needed inside "
    "<answer> </answer>. The answer should be concise and only contain the words necessary to answer the "
    "question.\n\n"
    "After <information> </information> (or question at the beginning), you should always follow the order: "
    "<think> ... </think><search> ... </search> or <think> ... </think><answer> ... </answer>.\n\n"
)


def last_step_segments(state: AgentState, output_kind: str) -> list[Segment]:
    """The previous call's output and observation, verbatim (MEM1 Alg. 1 line 14/19; MemPO §4.4)."""
    if not state.calls:
        return []
    i = len(state.calls) - 1
    call = state.calls[i]
    segs = [Segment(output_kind, call.output_text, ref=(i, "output"))]
    if call.observation_text:
        segs.append(Segment("information", call.observation_text, ref=(i, "observation")))
    return segs


def turns_left_hint(state: AgentState, left: int | None = None) -> str:
    """Alg. 1 line 18's hint, written after turn ``state.turn`` (counted from 0, as Alg. 1's t).

    Alg. 1 prints "You have {T - t} turns left"; this returns the turns left *after* the current
    one, ``T - t - 1``, as MEM1's released rollout does (``num_turns_left = max_turns - step - 1``
    in ``Mem1/train/rollout/llm_agent/generation_think.py``). A declared deviation
    (``docs/deviations.md``, 'Notebook 02', item 8). ``left``: another count to print (the current
    question's turns under ``answers="each"``, :func:`question_turns_left`)."""
    left = max(state.max_turns - state.turn - 1 if left is None else left, 0)
    return f"You have {left} turn{'s' if left != 1 else ''} left.\n"


def question_turns(question) -> int:
    """``answers="each"``: one question's turn limit, a 1-question task's (one turn per hop + the spare
    ones, :meth:`Method.suggested_max_turns`), so a question at k = 16 has the turns it had at k = 1."""
    return max(len(question.decomposition), 1) + SPARE_TURNS


def question_turns_left(state: AgentState) -> int:
    """``answers="each"``: the current question's turns left after turn ``state.turn``,
    ``T_q - t_q - 1`` with ``t_q`` counted from the turn the question was shown."""
    q = state.task.questions[len(_committed(state))]
    return question_turns(q) - (state.turn - state.memory.get("question_start", 0)) - 1


def count_repeat(state: AgentState, parsed: Parsed) -> None:
    """Count a search whose query is the previous search's, verbatim (``state.memory["repeats"]``); an
    answer in between resets the comparison."""
    query = (parsed.argument or "").strip() if parsed.action == "search" else None
    if query and query == state.memory.get("last_query"):
        state.memory["repeats"] = state.memory.get("repeats", 0) + 1
    state.memory["last_query"] = query


def _committed(state: AgentState) -> list[str]:
    """``answers="each"``: the answers committed so far, in question order (their count is the index of
    the current question)."""
    return state.memory.setdefault("answers", [])


class MEM1(Method):
    """``answers``: "final" (the paper: one ``<answer>`` with every question's answer) or "each"
    (module doc: one question at a time)."""

    name = "mem1"
    format_penalty = 0.0
    default_packing = "mem1_mask"  # one row per trajectory with a 2D mask (§3.2)

    def __init__(self, answers: str = "final", repeat_penalty: float = 0.0):
        if answers not in ANSWERS:
            raise ValueError(f"unknown MEM1 answers mode {answers!r}; choose one of {ANSWERS}")
        if not repeat_penalty >= 0:
            raise ValueError(f"repeat_penalty {repeat_penalty!r}: give a reward cost >= 0 per repeated query")
        self.answers, self.repeat_penalty = answers, float(repeat_penalty)

    def suggested_max_turns(self, task) -> int:
        """The base's; under ``answers="each"`` the sum of the questions' own limits (:func:`question_turns`)."""
        if self.answers == "each":
            return sum(question_turns(q) for q in task.questions)
        return super().suggested_max_turns(task)

    def next_call(self, state: AgentState) -> CallSpec:
        k = state.task.k
        # k > 1: task.prompt is already the §3.3 composite ("Answer each of the following questions: ...")
        if k > 1 and self.answers == "each":  # the current question alone (its text, as at k = 1)
            current = state.task.questions[len(_committed(state))].text
            question = [Segment("system", PROMPT_EACH), Segment("question", f"Question: {current}\n")]
        else:
            instruction, prefix = (PROMPT_MULTI, "") if k > 1 else (PROMPT_SINGLE, "Question: ")
            question = question_segments(instruction, state, prefix)
        return CallSpec(
            question + last_step_segments(state, "think"),
            max_new_tokens=96 + 32 * (1 if self.answers == "each" else k),
            stop=("</search>", "</answer>"),
        )

    def parse(self, text: str, role: str = "act") -> Parsed:
        return parse_action(text, ("search", "answer"), required=("think",))

    def apply(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        count_repeat(state, parsed)
        if self.answers != "each":
            obs = self.search_or_answer(state, parsed, env)
            return None if obs is None else wrap_information(obs, hint=turns_left_hint(state))
        if parsed.action == "answer":
            return self._commit(state, (parsed.argument or "").strip())
        left = question_turns_left(state)
        if left <= 0:  # the paper's turn limit, per question: no turn is left for this question's answer
            qi = len(_committed(state))
            state.fail(
                f"max turns ({question_turns(state.task.questions[qi])}) of question {qi + 1} reached without an answer"
            )
            return None
        return wrap_information(env.search(parsed.argument or ""), hint=turns_left_hint(state, left))

    def _commit(self, state: AgentState, answer: str) -> str | None:
        """``answers="each"``: record the current question's answer; the next question, or the end with
        the k answers joined as the final answer. An empty answer or one with ";" (two answers) is an
        invalid turn."""
        if not answer or ";" in answer:
            state.answer = answer
            state.fail("one answer per question expected" if answer else "empty answer")
            return None
        done = _committed(state)
        done.append(answer)
        if len(done) == state.task.k:
            state.answer, state.done = "; ".join(done), True
            return None
        nxt = state.task.questions[len(done)]
        state.memory["question_start"] = state.turn + 1  # the next call is the next question's first turn
        return wrap_information(
            f"Answer recorded. Next question: {nxt.text}", hint=turns_left_hint(state, question_turns(nxt))
        )

    def reward(self, state: AgentState) -> float:
        """App. B.4.1: one point per correct answer, 0 for broken tags or a wrong answer count; less
        ``repeat_penalty`` per repeated query (module doc)."""
        cost = self.repeat_penalty * state.memory.get("repeats", 0)
        if not state.valid or state.answer is None:
            return self.format_penalty - cost
        return float(sum(slot_scores(state.answer, state.task.golds, exact_match))) - cost

    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        script.observe(state, rng, cfg)
        if self.answers == "each":
            return self._oracle_each(state, rng, cfg)
        d = script.decide(state, rng, cfg)
        state_text = f"{script.facts_text(state, cfg)} {script.plan_text(d)}"
        if d.kind == "answer":
            return f"<think>{state_text}</think><answer>{script.answer_text(state, rng, cfg)}</answer>"
        return f"<think>{state_text}</think><search>{d.query}</search>"

    def _oracle_each(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        """The teacher under ``answers="each"``: the current question's ledger entry as the memory; its
        next hop's search, or its answer once settled (or out of turns)."""
        qi = len(_committed(state))
        cfg = replace(cfg, memory="ledger")  # plans name a hop by its words, never "Q<n>"
        d = script.decide(state, rng, cfg, upto=qi, remaining=question_turns_left(state) + 1)
        entry = script.ledger_entry(state, qi)
        if d.kind == "answer":
            answer = script.slot_answer(state, qi, rng, cfg)
            plan = "This question is answered." if d.plan == script.ANSWER_PLAN else d.plan
            return f"<think>{entry} {plan}</think><answer>{answer}</answer>"
        return f"<think>{entry} {script.plan_text(d)}</think><search>{d.query}</search>"
