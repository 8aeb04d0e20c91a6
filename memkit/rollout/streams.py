"""Roll out Mem-T on conversation streams: build each memory once, then answer every question.

Construction is one episode per conversation (formation and evolution calls over its chunks);
at its end the state is :func:`~memkit.rollout.engine.fork`-ed once per question (x ``n``
samples), so the question episodes share the construction calls (the same Call objects) and
each continues with its own retrieval calls. One trajectory per (question, sample), task-major:
its ``calls`` are the construction calls followed by its retrieval calls.
"""

from __future__ import annotations

from typing import Sequence

from memkit.agents.memt_tools import stream_conversation
from memkit.core.trajectory import Trajectory
from memkit.rollout.engine import Policy, RolloutConfig, advance, fork
from memkit.world.conversation import Conversation


def build_memories(
    method,
    conversations: Sequence[Conversation],
    policy: Policy,
    tokenizer,
    cfg: RolloutConfig | None = None,
    wrap=None,
    progress: bool = False,
):
    """One construction episode per conversation, all batched; returns the built states."""
    states = [method.new_stream_state(c) for c in conversations]
    advance(
        method,
        states,
        None,
        policy,
        tokenizer,
        cfg,
        wrap,
        progress=progress,
        until=lambda s: not method.constructing(s),
    )
    return states


def answer_questions(
    method,
    built,
    policy: Policy,
    tokenizer,
    cfg: RolloutConfig | None = None,
    wrap=None,
    questions: Sequence[Sequence[int]] | None = None,
    progress: bool = False,
) -> list[Trajectory]:
    """Fork each built state once per question (``cfg.n`` samples each) and answer them all.

    ``questions[i]``: which question indices of conversation i (default: all). A conversation whose
    construction failed (a context over the limit) gives invalid trajectories, one per question.
    """
    from memkit.rollout.engine import to_trajectory

    cfg = cfg or RolloutConfig()
    children, groups = [], []
    for i, state in enumerate(built):
        conv = stream_conversation(state)
        for qi in questions[i] if questions is not None else range(len(conv.qa)):
            for g in range(cfg.n):
                (child,) = fork(state, 1) if not state.done else [_copy_failed(state)]
                method.start_question(child, qi)
                children.append(child)
                groups.append(g)
    advance(method, children, None, policy, tokenizer, cfg, wrap, progress=progress)
    return [to_trajectory(method, s, g) for s, g in zip(children, groups)]


def stream_rollouts(
    method,
    conversations: Sequence[Conversation],
    policy: Policy,
    tokenizer,
    cfg: RolloutConfig | None = None,
    wrap=None,
    progress: bool = False,
) -> list[Trajectory]:
    """:func:`build_memories` then :func:`answer_questions` for every question."""
    built = build_memories(method, conversations, policy, tokenizer, cfg, wrap, progress)
    return answer_questions(method, built, policy, tokenizer, cfg, wrap, progress=progress)


def teacher_built_stores(method, world, tokenizer, n: int, seed: int, size: str, progress: bool = False):
    """``n`` synthetic conversations (seeds ``seed..``, :func:`memkit.world.streams.make_conversations`)
    and their memories built by the perfect scripted teacher: the stores Mem-T's retrieval phase is
    trained and evaluated on (construction is not what MoT-GRPO's retrieval phase trains, §3.2)."""
    from memkit.rollout.engine import OraclePolicy
    from memkit.world.streams import make_conversations

    convs = make_conversations(world, n, seed=seed, size=size)
    built = build_memories(
        method,
        convs,
        OraclePolicy(method, tokenizer),
        tokenizer,
        RolloutConfig(max_context_tokens=10**9),
        progress=progress,
    )
    return convs, built


def _copy_failed(state):
    import copy

    child = copy.copy(state)
    child.calls, child.memory, child.oracle = list(state.calls), copy.copy(state.memory), {}
    return child
