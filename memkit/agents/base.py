"""The interface every memory format implements.

A trajectory is a sequence of LLM calls (DESIGN.md). A method decides three things here:

* ``next_call(state)``  -> the context of the next call, as a list of :class:`Segment`
  (context building: the axis the papers differ on);
* ``parse(text, role)`` -> a :class:`Parsed` action or a parse error with its reason
  (tolerant: never raises);
* ``apply(state, parsed, env)`` -> executes the action (search, prune&write, answer) and
  returns the observation text that followed the call.

``oracle(state, rng)`` is a scripted policy that writes the text a perfect (or, with the
imperfection knobs, slightly sloppy) agent would write for ``next_call(state)``.

Segments carry ``ref=(call_index, "output"|"observation")`` when they are a verbatim copy of
an earlier call's generated tokens or observation: the rollout engine then reuses those
exact token ids (so MEM1's packed trajectory is exact) instead of re-tokenising the text.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from memkit.core.trajectory import Parsed, Segment
from memkit.metrics import qa as metrics
from memkit.metrics.qa import slot_scores, split_answers
from memkit.world.schema import Task

# Tags used for span colouring and token accounting.
SPAN_TAGS = ("mem", "think", "memory", "search", "tool_call", "answer", "information", "note", "records")


@dataclass
class CallSpec:
    """What the engine needs to run one LLM call."""

    segments: list[Segment]
    role: str = "act"  # "act" | "memory" (MemSearcher's second generation per turn)
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ("</search>", "</answer>")
    #: text the context ends with that the output continues (a forced opening, e.g. MemAct's fixed
    #: memory schedule): the method puts it in ``segments`` and parses ``prefix + output``
    prefix: str = ""

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)


@dataclass
class OracleConfig:
    """Imperfection knobs of the scripted policy (so SFT leaves room for RL)."""

    p_drop_fact: float = 0.0
    """Chance a found fact is left out of memory (forcing a re-search or a wrong answer)."""
    p_wasted_search: float = 0.0
    """Chance of a search with an uninformative query before the right one."""
    p_wrong_answer: float = 0.0
    """Chance an answer slot is replaced by a distractor."""
    flaw: str = field(default="none", metadata={"choices": ("none", "forget_earlier", "overwrite_slot", "stop_early")})
    """A memory flaw the teacher shows as a *habit* (``memkit.agents.oracle.FLAWS``): "forget_earlier"
    (an answered question's answer leaves memory once a later one is answered; MemAct: the next
    prune deletes its record and the note leaves it out), "overwrite_slot" (the later answer is
    written into the earlier question's slot), "stop_early" (a bridge question is answered with its
    first hop), or "none" (the perfect teacher)."""
    flaw_rate: float = 0.65
    """Share of the flaw's decisions at which the teacher shows it, drawn once per task and question.
    Above 0.5 so the flaw is what greedy decoding of a clone does; below 0.8 so sampling still finds
    the right behaviour (measure it with notebook 02's exploration headroom)."""
    memory: str = field(default="found", metadata={"choices": ("found", "ledger")})
    """How the teacher's memory lists the questions (``memkit.agents.oracle.facts_text``): "found" =
    a clause per question with something found ("Q2: 1982."), "ledger" = one entry per question from
    the first turn on, keyed by its first search ("Zazen Harbor produced: open." ... "=> 1982."), so
    that the number of answers could be copied rather than counted. A tiny clone trained on k <= 3
    still wrote at most three entries at k = 4 (measured: docs/findings.md, 'Negative results')."""
    show_comparison: bool = False
    """Write a comparison's two values before its winner, in the turn the second one arrives
    ("A founded: 1989; B founded: 1975, so B"), instead of the winner alone. It did not help the
    tiny MEM1 model (measured: docs/findings.md, 'Negative results')."""
    quote_source: bool = False
    """Mem-T only: the answer turn first quotes the retrieved memory line that shows the answer
    (``<think>[f3] ...</think>`` then ``finish``), so a clone copies the answer from a line it has just
    copied instead of recalling it from its weights."""


@dataclass
class AgentState:
    """Everything a method needs between calls. Methods keep their own keys in ``memory``."""

    task: Task
    max_turns: int
    turn: int = 0  # number of tool-using turns taken so far
    calls: list = field(default_factory=list)  # list[rollout.Call], filled by the engine
    memory: dict = field(default_factory=dict)  # method-specific state (last think, records, ...)
    oracle: dict = field(default_factory=dict)  # scripted-policy progress (never shown to models)
    answer: str | None = None
    done: bool = False
    valid: bool = True
    reason: str | None = None
    sampler: object | None = None  # this trajectory's own random stream (RolloutConfig.sample_seeds), else None

    def fail(self, reason: str) -> None:
        self.done, self.valid, self.reason = True, False, reason


class Env(Protocol):
    def search(self, query: str) -> str:
        """Return the observation text (``<information>...</information>``) for a query."""


#: turns beyond one per retrieval hop in :meth:`Method.suggested_max_turns`: one answer and 3 re-searches
SPARE_TURNS = 4


class Method(ABC):
    """One memory format (ReAct, MEM1, MemSearcher, MemPO, MemAct)."""

    name: str = "base"
    #: reward of an episode that ends in an invalid turn (the paper's format penalty)
    format_penalty: float = 0.0
    #: how RL packs this format's calls (``memkit.rl.packing.MODES``): each call its own row
    default_packing: str = "separate"
    #: the group-relative credit rule RL uses for it (``memkit.rl.credit``); PPO always uses ``gae``
    default_credit: str = "grpo"
    #: how the trainer rolls it out (``memkit.rl.plans.PLANS``): ``chains`` = n independent episodes
    #: per task; ``trees`` = questions over built memory stores, as operation trees or chains
    rollout_plan: str = "chains"

    def new_state(self, task: Task, max_turns: int = 12) -> AgentState:
        return AgentState(task=task, max_turns=max_turns)

    def suggested_max_turns(self, task: Task) -> int:
        """Turns a competent agent needs, with slack: one search per retrieval hop, one answer,
        and 3 spare turns for re-searches (MEM1 trains with a turn limit that grows with the
        number of objectives). MemAct adds its Prune&Write turns."""
        return sum(max(len(q.decomposition), 1) for q in task.questions) + SPARE_TURNS

    @abstractmethod
    def next_call(self, state: AgentState) -> CallSpec: ...

    @abstractmethod
    def parse(self, text: str, role: str = "act") -> Parsed: ...

    @abstractmethod
    def apply(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        """Update ``state`` after a valid call; return the observation text (or None)."""

    @abstractmethod
    def oracle(self, state: AgentState, rng: random.Random, cfg: OracleConfig) -> str: ...

    def reward(self, state: AgentState) -> float:
        """Outcome reward of a finished episode. Default: mean slot EM, ``format_penalty`` if invalid.

        Each method overrides this with its paper's reward (MEM1 summed EM, MemSearcher eq. 9, ...).
        """
        if not state.valid or state.answer is None:
            return self.format_penalty
        em = slot_scores(state.answer, state.task.golds, exact_match)
        return sum(em) / len(em) if em else 0.0

    def trajectory_info(self, state: AgentState) -> dict:
        """Method extras stored in ``Trajectory.info`` (e.g. MemAct's pruned record ids)."""
        return {}

    # ---- shared execution of the two QA actions (every format has them) -------------------
    def search_or_answer(self, state: AgentState, parsed: Parsed, env: Env) -> str | None:
        """``answer``: check the answer count (MEM1 App. B.4: k answers separated by ";",
        otherwise the episode is invalid) and finish; ``search``: return the observation
        wrapped as ``\n<information>...</information>\n`` (Search-R1 / MEM1 Alg. 1)."""
        if parsed.action == "answer":
            k = state.task.k
            slots = split_answers(parsed.argument or "", k)
            state.answer = parsed.argument
            if len(slots) != k:
                state.fail(f"wrong answer count ({len(slots)} answers for {k} questions)")
            else:
                state.done = True
            return None
        return wrap_information(env.search(parsed.argument or ""))


def wrap_information(obs: str, hint: str = "") -> str:
    """``\n<information>{hint}{docs}</information>\n`` whatever the env wrapped it in."""
    body = (obs or "").strip()
    if body.startswith("<information>") and body.endswith("</information>"):
        body = body[len("<information>") : -len("</information>")].strip()
    return f"\n<information>{hint}{body}</information>\n"


# ---- answer scoring: memkit.metrics.qa (SQuAD normalisation; MEM1 App. B.4 EM and F1 per slot) ---
def exact_match(pred: str, golds: list[str]) -> float:
    return metrics.exact_match(pred, golds)


def f1_score(pred: str, golds: list[str]) -> float:
    return metrics.f1(pred, golds)


_COMPOSITE = re.compile(
    r"Answer each of the following questions: (.*?) Organize your final answer in <answer> "
    r"and </answer> and separate the answer to each question with semicolon\.",
    re.S,
)


def numbered_questions(text: str) -> str:
    """MEM1's composite prompt (Prompt 1, quoted questions) -> ``Q1: ... Q2: ...``; any other
    text (a single question) -> ``Q1: <text>``."""
    m = _COMPOSITE.search(text)
    if m is None:
        return f"Q1: {text.strip()}"
    body = m.group(1).strip()
    # compose_prompt joins '"q1" "q2"': split on that separator, so a question that quotes a
    # title ('Who directed "Vokbros Signal"?') stays one question
    questions = body[1:-1].split('" "') if body.startswith('"') and body.endswith('"') else [body]
    listed = " ".join(f"Q{i}: {q}" for i, q in enumerate(questions, 1))
    return text[: m.start()] + listed + text[m.end() :]


#: The instruction choices of a context (``policies.prompt_wrap``): the paper's, the compact one
#: line below, or "auto" (compact for tiny models, paper for chat models and the oracle).
PROMPTS = ("auto", "paper", "compact")


def compact_prompt_wrap(method_name: str):
    """The tiny model's prompt: one short instruction line and numbered questions.

    * The paper's long instruction ("system" segment) becomes one line: the tiny model learns
      each format by behaviour cloning, so the verbatim instruction carries no information
      for it, yet it would be ~55% of every training sequence (MEM1's Prompt 2 is ~315 tokens).
    * The questions of a multi-objective task are numbered, ``Q1: ... Q2: ...``, instead of
      MEM1 Prompt 1's quoted list. Every format's memory says "Q2: ..."; with the label in the
      prompt, finding question 2 is a copy after the same two tokens (what a transformer's
      induction heads do from early in training) rather than counting quoted strings. With the
      quoted list a from-scratch model's memory mixed up which question it was on (measured:
      docs/findings.md, 'Prompt').

    A documented deviation; the oracle and chat models keep the paper's prompt.
    """
    line = f"Format: {method_name}. Search until every question is answered, then answer.\n"

    def wrap(segments: list[Segment]) -> list[Segment]:
        out = []
        for s in segments:
            if s.ref is None and s.kind == "system":
                s = Segment("system", line)
            elif s.ref is None and s.kind == "question":
                s = Segment("question", _number_question_segment(s.text))
            out.append(s)
        return out

    return wrap


def _number_question_segment(text: str) -> str:
    """Number the questions inside a question segment: ``<question>...</question>`` and the
    trailing newline are kept, a ``Question: `` prefix is dropped (the ``Q1:`` labels replace it)."""
    body = text.rstrip("\n")
    newline = text[len(body) :]
    open_tag, close_tag = "<question>", "</question>"
    if body.startswith(open_tag) and body.endswith(close_tag):
        return open_tag + numbered_questions(body[len(open_tag) : -len(close_tag)]) + close_tag + newline
    return numbered_questions(body.removeprefix("Question: ")) + newline
