"""MemSearcher: context = question + memory; the memory is rewritten after every observation.

MemSearcher §3.1, eq. 2: the context of turn i is only ``c_i = (q, m_{i-1})``. Each turn has
two generations (eq. 6, one "conversation" ``(q, m_{i-1}, t_i, a_i, o_i, m_i)``):

1. role ``"act"``: sees ``<question>`` + ``<memory>``, writes ``<think>`` and a
   ``<tool_call>`` (search) or the final answer;
2. role ``"memory"``: sees the same prefix plus its own act output and the observation, and
   writes the new ``<memory>`` that replaces the old one.

The memory is capped (§4.1: 1,024 tokens). memkit measures the cap in *words*
(``memory_budget_words``, tokenizer-free so the rule is the same for every model);
a longer memory is an invalid turn (``on_over_budget="fail"``, reward 0, so RL learns to
stay under it) or is cut to the budget (``"truncate"``, the paper's generation-length cap).

Reward, eq. 9: 0 if the format is wrong; 0.1 if the format is right but F1 = 0; else F1.
With k questions memkit uses the mean slot F1. ``reward_metric="em"`` (a deviation, off by
default) puts exact match where eq. 9 has F1: the world's names share their type words
("... Holdings", "... Systems"), so F1 gives a wrong entity of the right type half the reward
of the right one, where MEM1's EM reward gives it nothing. On the tiny model few wrong answers
earn any F1, and GRPO with EM did no better than with F1 (measured: docs/findings.md, 'Negative
results').

Prompt: the paper prints none; this one paraphrases §3.1. Deviations: the answer goes in
``<answer>`` (``\\boxed{}`` is accepted too) so that a stop string ends the call and k answers
use MEM1's ";" rule; observations are wrapped in ``<information>`` like the other formats,
not ``<tool_response>``.
"""

from __future__ import annotations

import json
import random
import re

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
    f1_score,
    slot_scores,
)
from memkit.agents.tags import extract, parse_action, tag_status, tool_call_query, words

INSTRUCTION = (
    "You are a search agent. You see only the user's question inside <question> </question> and your memory "
    "inside <memory> </memory>: a compact note of all information found so far that helps to answer the "
    "question (empty at the start). Each turn, first reason inside <think> </think>, then either call the "
    'search engine with <tool_call>{{"name": "wikipedia_search", "arguments": {{"query": "..."}}}}</tool_call>, '
    "whose results are returned inside <information> </information>, or, if the memory holds enough "
    "information, give the final answer inside <answer> </answer> (for several questions, separate the answers "
    "with semicolons). After the results are returned, carefully read them and write the updated memory inside "
    "<memory> </memory>: incorporate any new information that helps to answer the question and preserve all "
    "relevant details from the previous memory. The memory must stay under {budget} words.\n"
)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
#: what eq. 9 scores a valid answer with: the paper's F1, or exact match (see the module doc)
REWARD_METRICS = {"f1": f1_score, "em": exact_match}


class MemSearcher(Method):
    name = "memsearcher"
    format_penalty = 0.0
    default_credit = "multi_context"  # one trajectory advantage copied to every call

    def __init__(self, memory_budget_words: int = 256, on_over_budget: str = "fail", reward_metric: str = "f1"):
        if on_over_budget not in ("fail", "truncate"):
            raise ValueError(f"on_over_budget must be 'fail' or 'truncate', got {on_over_budget!r}")
        if reward_metric not in REWARD_METRICS:
            raise ValueError(f"reward_metric must be one of {', '.join(REWARD_METRICS)}, got {reward_metric!r}")
        self.budget, self.on_over_budget = memory_budget_words, on_over_budget
        self.reward_metric = reward_metric

    # ---- context -------------------------------------------------------------------------
    def _prefix(self, state: AgentState) -> list[Segment]:
        # m_{i-1}: a verbatim ref to the memory call when its output is exactly the memory (the
        # engine then reuses its token ids), else the clean (or truncated) memory as text.
        ref, text = state.memory.get("memory_ref"), state.memory.get("memory_text", "<memory></memory>")
        memory = (
            Segment("memory", text, ref=(ref, "output"))
            if ref is not None and ref < len(state.calls) and state.calls[ref].output_text == text
            else Segment("memory", text)
        )
        return [
            Segment("system", INSTRUCTION.format(budget=self.budget)),
            Segment("question", f"<question>{state.task.prompt}</question>\n"),
            memory,
        ]

    def next_call(self, state: AgentState) -> CallSpec:
        last = state.calls[-1] if state.calls else None
        if last is not None and last.role == "act" and last.observation_text:
            i = len(state.calls) - 1  # eq. 6: same conversation, continued by the memory update
            segs = self._prefix(state) + [
                Segment("output", last.output_text, ref=(i, "output")),
                Segment("information", last.observation_text, ref=(i, "observation")),
            ]
            return CallSpec(segs, role="memory", max_new_tokens=2 * self.budget + 16, stop=("</memory>",))
        return CallSpec(self._prefix(state), role="act", max_new_tokens=128, stop=("</tool_call>", "</answer>"))

    # ---- parsing ---------------------------------------------------------------------------
    def parse(self, text: str, role: str = "act") -> Parsed:
        if not isinstance(text, str):
            return Parsed(ok=False, error="empty output")
        if role == "memory":
            status = tag_status(text, "memory")
            if status != "ok":
                return Parsed(ok=False, error=f"{'missing' if status == 'absent' else 'unclosed'} <memory>")
            content = extract(text, "memory") or ""
            return Parsed(ok=True, action="memory", argument=content, fields={"memory": content})
        if "<answer>" not in text and "<tool_call>" not in text and _BOXED.search(text):
            text = _BOXED.sub(lambda m: f"<answer>{m.group(1)}</answer>", text, count=1)  # paper's \boxed{}
        parsed = parse_action(text, ("tool_call", "answer"), required=("think",))
        if parsed.ok and parsed.action == "tool_call":
            query = tool_call_query(parsed.argument or "")
            if not query:
                return Parsed(ok=False, action="search", fields=parsed.fields, error="tool_call without a query")
            return Parsed(ok=True, action="search", argument=query, fields=parsed.fields)
        return parsed

    # ---- execution -------------------------------------------------------------------------
    def apply(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        if parsed.action != "memory":
            return self.search_or_answer(state, parsed, env)
        n = words(parsed.argument or "")
        if n > self.budget and self.on_over_budget == "fail":
            state.fail(f"memory over budget ({n} > {self.budget} words)")
            return None
        content = parsed.argument or ""
        if n > self.budget:  # "truncate": keep the first ``budget`` words
            content = " ".join(content.split()[: self.budget])
        # the engine appends this call after apply(), so its index is len(state.calls)
        state.memory.update(memory_ref=len(state.calls), memory_text=f"<memory>{content}</memory>")
        return None

    def reward(self, state: AgentState) -> float:
        """Eq. 9 (mean slot F1 for k questions; mean slot EM with ``reward_metric="em"``)."""
        if not state.valid or state.answer is None:
            return self.format_penalty
        scores = slot_scores(state.answer, state.task.golds, REWARD_METRICS[self.reward_metric])
        score = sum(scores) / len(scores) if scores else 0.0
        return score if score > 0 else 0.1

    # ---- scripted policy -------------------------------------------------------------------
    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str:
        script.observe(state, rng, cfg)
        last = state.calls[-1] if state.calls else None
        if last is not None and last.role == "act" and last.observation_text:
            return f"<memory>{script.facts_text(state, cfg)}</memory>"
        d = script.decide(state, rng, cfg)
        if d.kind == "answer":
            return f"<think>{d.plan}</think>\n<answer>{script.answer_text(state, rng, cfg)}</answer>"
        call = json.dumps({"name": "wikipedia_search", "arguments": {"query": d.query}})
        return f"<think>{script.plan_text(d)}</think>\n<tool_call>{call}</tool_call>"
