"""ReAct / Search-R1: the full-history baseline every memory paper compares against.

Context of call t = instruction + question + every earlier output and observation, verbatim
(Yao et al. 2023; the Search-R1 prompt of Jin et al. 2025 that MEM1 §4 and MemSearcher §2.1
use for their ReAct baselines). The context grows linearly with turns: this is the
"unbounded memory growth" the other four formats remove.

Reward: exact match, as Search-R1 (MEM1 App. B.4.2); with k questions, the number of
correct slots (MEM1's multi-objective scoring), 0 on a format error (no format penalty).
"""

from __future__ import annotations

import random

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
)
from memkit.agents.tags import parse_action

# Search-R1 (Jin et al., 2025) prompt, with the multi-objective answer rule of MEM1 Prompt 1.
INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. If there are several questions, separate "
    "their answers with semicolons.\n"
)


def question_segments(instruction: str, state: AgentState, prefix: str = "Question: ") -> list[Segment]:
    return [Segment("system", instruction), Segment("question", f"{prefix}{state.task.prompt}\n")]


def history_segments(state: AgentState, start: int = 0) -> list[Segment]:
    """Every call's output and observation from ``start`` on, as verbatim refs."""
    segs = []
    for i, call in enumerate(state.calls[start:], start):
        segs.append(Segment("output", call.output_text, ref=(i, "output")))
        if call.observation_text:
            segs.append(Segment("information", call.observation_text, ref=(i, "observation")))
    return segs


class ReAct(Method):
    name = "react"
    format_penalty = 0.0

    def next_call(self, state: AgentState) -> CallSpec:
        return CallSpec(
            question_segments(INSTRUCTION, state) + history_segments(state),
            max_new_tokens=128,
            stop=("</search>", "</answer>"),
        )

    def parse(self, text: str, role: str = "act") -> Parsed:
        return parse_action(text, ("search", "answer"), optional=("think",))

    def apply(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        return self.search_or_answer(state, parsed, env)

    def reward(self, state: AgentState) -> float:
        return (
            float(sum(slot_scores(state.answer, state.task.golds, exact_match)))
            if state.valid and state.answer is not None
            else self.format_penalty
        )

    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        script.observe(state, rng, cfg, forgetful=False)  # the full history never forgets
        d = script.decide(state, rng, cfg)
        if d.kind == "answer":
            return f"<think>{d.plan}</think>\n<answer>{script.answer_text(state, rng, cfg)}</answer>"
        return f"<think>{script.plan_text(d)}</think>\n<search>{d.query}</search>"
