"""MemPO: a ``<mem>`` action every step; the context is the question + the previous step only.

MemPO §3.1: each step writes ``<mem>`` (a summary of everything useful so far), ``<think>``,
then a tool call or ``<answer>``. §4.4 (Inference): the context of step t is the question and
the previous step, ``π_θ(s_t | q, s_{t-1}^{mem} ...)``; Fig. 1 "only uses the previous step
interaction for next step input". So the context builder is MEM1's (last output + last
observation, verbatim refs); the difference is that memory and reasoning are separate tags,
which lets MemPO give ``<mem>`` tokens their own advantage (eq. 4-9, in ``memkit.rl``).
The memory reward of eq. 4-5 (probe contexts, batched P[ans | ·]) is :mod:`memkit.rl.memory_reward`;
what its probes write after ``</mem>`` is this format's answering step (:func:`probe_opener`).

Prompt: Table 6 verbatim (``<search>`` action, newline-separated tags).
Reward (§4.1): 1 iff the answer is correct and the format proper, else 0; with k questions
"correct" means every slot (``reward="all"``, the default); ``reward="fraction"`` gives the
fraction of correct slots instead (memkit's reward for MemAct; equal at k = 1).
"""

from __future__ import annotations

import random

from memkit.agents import oracle as script
from memkit.agents.base import AgentState, CallSpec, Env, Method, OracleConfig, Parsed, exact_match, slot_scores
from memkit.agents.mem1 import last_step_segments
from memkit.agents.react import question_segments
from memkit.agents.tags import parse_action

PROMPT = (
    "You will answer multiple complex questions using iterative reasoning, summarization, and web search. At "
    "each step, you will see the questions, a cumulative summary of relevant information, the current search "
    "query, and search results (except in the first step, where only the questions are provided). Your task "
    "is to:\n\n"
    "1. Update a cumulative, concise summary and perform reasoning within <mem>\\n...\\n</mem>\\n<think>\\n..."
    "\\n</think>, respectively. <mem>\\n...\\n</mem> must include all essential information from previous "
    "<think> and <tool_response> tags.\n\n"
    "2. Then choose one of the following actions:\n\n"
    "- If any question remains unanswered, issue a single query for one question inside <search>\\n...\\n</search>.\n"
    "- If all questions are answered, provide the final answers separated by semicolons within <answer>\\n "
    "answer1; answer2; ... \\n</answer>. The answers must be concise, usually short phrases or words, and "
    "avoid any explanations.\n\n"
    "Important:\n\n"
    "- The summaries only contain concise and essential information related to the user questions from "
    "previous trajectories, but do not include any your own internal knowledge or reasoning content.\n"
    "- Must strictly follow one of these two structures: <mem>\\n...\\n</mem>\\n<think>\\n...\\n</think>\\n"
    "<search>\\n...\\n</search> or <mem>\\n...\\n</mem>\\n<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>.\n"
    "- Do not search multiple queries or questions simultaneously. Don't give up searching for information "
    "until you find clear information that provides the answer.\n\n"
)


REWARDS = ("all", "fraction")


def probe_opener(opener: str) -> str:
    """What follows ``</mem>`` in a MemPO probe (eq. 5, :func:`memkit.rl.memory_reward.memory_probes`), up
    to where the scored answer starts (``MemPOConfig.opener``): ``think`` = this format's answering step
    as :meth:`MemPO.oracle` writes it, ``<think>`` with the teacher's thought before a final answer, then
    ``<answer>`` (what a cloned model writes there); ``answer`` = ``<answer>`` at once (eq. 5 literally)."""
    return f"\n<think>\n{script.ANSWER_PLAN}\n</think>\n<answer>\n" if opener == "think" else "\n<answer>\n"


class MemPO(Method):
    name = "mempo"
    format_penalty = 0.0
    default_credit = "mempo"  # A_T everywhere + the memory advantage on <mem> tokens (eq. 9)

    def __init__(self, reward: str = "all"):
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        self.reward_kind = reward

    def next_call(self, state: AgentState) -> CallSpec:
        prefix = "" if state.task.k > 1 else "Question: "  # k > 1: task.prompt is MEM1's composite
        segs = question_segments(PROMPT, state, prefix) + last_step_segments(state, "mem")
        return CallSpec(segs, max_new_tokens=96 + 32 * state.task.k, stop=("</search>", "</answer>"))

    def parse(self, text: str, role: str = "act") -> Parsed:
        return parse_action(text, ("search", "answer"), required=("mem", "think"))

    def apply(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        return self.search_or_answer(state, parsed, env)

    def reward(self, state: AgentState) -> float:
        if not state.valid or state.answer is None:
            return self.format_penalty
        em = slot_scores(state.answer, state.task.golds, exact_match)
        if not em:
            return 0.0
        return float(all(em)) if self.reward_kind == "all" else sum(em) / len(em)

    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        script.observe(state, rng, cfg)
        d = script.decide(state, rng, cfg)
        head = f"<mem>\n{script.facts_text(state, cfg)}\n</mem>\n<think>\n{script.plan_text(d)}\n</think>\n"
        if d.kind == "answer":
            return f"{head}<answer>\n{script.answer_text(state, rng, cfg)}\n</answer>"
        return f"{head}<search>\n{d.query}\n</search>"
