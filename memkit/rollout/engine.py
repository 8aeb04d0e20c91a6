"""Batched multi-turn rollout engine (Search-R1 / MEM1 ``run_llm_loop`` style).

Each round it builds the context of every active trajectory with the method's context
builder, generates them all in one batched call per (role, stop) group, parses the outputs,
executes tools, and retires finished trajectories. It records for every call the exact
context ids, generated ids and their log-probs, spans by tag, and the observation, so that
packing and credit assignment can be done later without re-running anything.

A model's failure never raises: a malformed output, an output the environment cannot run
(:class:`memkit.core.trajectory.ModelError`), an over-long context or running out of turns ends that
trajectory with a recorded reason and the method's format penalty as reward. Any other exception
while applying an output is memkit's own bug and propagates.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from memkit.agents.base import AgentState, CallSpec, Env, Method, OracleConfig
from memkit.core.trajectory import Call, ModelError, Trajectory
from memkit.models.generation import Generation  # one output type for oracle and model policies
from memkit.models.loading import is_chat
from memkit.rollout.context import BuiltContext, ContextBuilder, char_to_token_spans, tag_char_spans, token_char_ends


class Policy(Protocol):
    """Anything that can write the outputs of a batch of calls."""

    def generate_calls(
        self, states: list[AgentState], specs: list[CallSpec], contexts: list[list[int]]
    ) -> list[Generation]: ...


class OraclePolicy:
    """The method's scripted policy; ids are the tokenised text, log-probs are 0."""

    def __init__(self, method: Method, tokenizer, cfg: OracleConfig | None = None, seed: int = 0):
        self.method, self.tokenizer, self.cfg = method, tokenizer, cfg or OracleConfig()
        self.rng = random.Random(seed)

    def generate_calls(self, states, specs, contexts):
        out = []
        eos = getattr(self.tokenizer, "eos_token_id", None)
        for state, spec in zip(states, specs):
            text = self.method.oracle(state, self.rng, self.cfg)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if not spec.stop and eos is not None:  # a call with no stop string ends on EOS: a clone must learn it
                out.append(Generation(ids=ids + [eos], logprobs=[0.0] * (len(ids) + 1), text=text, finish="eos"))
                continue
            out.append(Generation(ids=ids, logprobs=[0.0] * len(ids), text=text, finish="stop"))
        return out


class ModelPolicy:
    """A language model behind a backend with ``generate(prompts, max_new_tokens, stop, ...)``."""

    def __init__(self, backend, temperature: float = 1.0, top_p: float = 1.0, generator=None):
        self.backend, self.temperature, self.top_p, self.generator = backend, temperature, top_p, generator

    def generate_calls(self, states, specs, contexts):
        spec = specs[0]
        streams = [s.sampler for s in states]  # per-trajectory streams when the rollout was given sample_seeds
        return self.backend.generate(
            contexts,
            max_new_tokens=spec.max_new_tokens,
            stop=list(spec.stop),
            temperature=self.temperature,
            top_p=self.top_p,
            generator=streams if all(g is not None for g in streams) else self.generator,
        )


@dataclass
class RolloutConfig:
    n: int = 1  # trajectories per task (the GRPO group size)
    max_turns: int | None = None  # tool-using ("act") calls per trajectory; None = method.suggested_max_turns(task)
    max_context_tokens: int = 4096  # a call whose context is longer ends the episode as invalid
    seed: int = 0
    # One seed per trajectory (len(tasks) * n, task-major): each trajectory then samples from its own
    # torch.Generator, so its tokens do not depend on which other trajectories share a batch, and
    # one trajectory rolled out alone with its seed repeats what it did in the batch. None: the
    # policy's one shared stream (the default; what training and the notebooks use).
    sample_seeds: Sequence[int] | None = None
    # Every call may write at least this many tokens (a real model reasons before its tags); 0 = the
    # format's own budget (CallSpec.max_new_tokens, sized for the kit's tiny model). output_floor.
    min_new_tokens: int = 0


#: the output floor of a model with its own chat template (``output_floor``): a pretrained model
#: thinks in prose before its tags, and a cut-off turn is invalid with reward 0
REAL_MODEL_MIN_NEW_TOKENS = 512


def output_floor(tokenizer, requested: int | None = None) -> int:
    """``RolloutConfig.min_new_tokens`` for a policy: ``requested`` if given, else 0 for the kit's
    tiny models (no chat template; the formats' budgets fit what they were cloned to write) and
    :data:`REAL_MODEL_MIN_NEW_TOKENS` for a pretrained chat model."""
    if requested is not None:
        if requested < 0:
            raise ValueError(f"min_new_tokens={requested} must be >= 0 (0 = the format's own output budget)")
        return requested
    return REAL_MODEL_MIN_NEW_TOKENS if is_chat(tokenizer) else 0


def start_states(method: Method, tasks, cfg: RolloutConfig | None = None) -> list[AgentState]:
    """Fresh states, ``cfg.n`` per task (task-major), each with its own sampler when
    ``cfg.sample_seeds`` is given."""
    cfg = cfg or RolloutConfig()
    states = [
        method.new_state(task, max_turns=cfg.max_turns or method.suggested_max_turns(task))
        for task in tasks
        for _ in range(cfg.n)
    ]
    if cfg.sample_seeds is not None:
        if len(cfg.sample_seeds) != len(states):
            raise ValueError(
                f"sample_seeds has {len(cfg.sample_seeds)} seeds for {len(states)} trajectories "
                f"({len(tasks)} tasks x n={cfg.n}); give one per trajectory, task-major"
            )
        for state, s in zip(states, cfg.sample_seeds):
            state.sampler = torch.Generator().manual_seed(int(s))
    return states


def fork(state: AgentState, n: int, seeds: Sequence[int] | None = None) -> list[AgentState]:
    """``n`` copies of a state that continue independently from here (a tree's branching point).

    The copies share the Call objects made so far (the common prefix:
    :func:`~memkit.rollout.trees.merge_tree` finds it by identity) and get deep copies of everything a
    later call changes: method memory, scripted-policy progress, answer and status. ``seeds`` gives
    each child its own sampler; otherwise children sample from the policy's shared stream (a copy of
    the parent's own stream would make every child draw the same tokens).
    """
    if n < 1:
        raise ValueError(f"fork needs n >= 1 children, got {n}")
    if state.done:
        raise ValueError(
            f"cannot fork a finished state ({state.reason or 'answered'}); fork before its last call "
            "(advance(..., until_calls=k))"
        )
    if seeds is not None and len(seeds) != n:
        raise ValueError(f"fork got {len(seeds)} seeds for {n} children; give one per child")
    children = []
    for k in range(n):
        child = copy.copy(state)
        child.calls = list(state.calls)
        child.memory = copy.deepcopy(state.memory)
        child.oracle = copy.deepcopy(state.oracle)
        child.sampler = None if seeds is None else torch.Generator().manual_seed(int(seeds[k]))
        children.append(child)
    return children


def run_rollouts(
    method: Method,
    tasks,
    env: Env,
    policy: Policy,
    tokenizer,
    cfg: RolloutConfig | None = None,
    wrap=None,
    progress: bool = False,
) -> list[Trajectory]:
    """Roll out ``cfg.n`` trajectories per task, all active ones batched together each round."""
    cfg = cfg or RolloutConfig()
    states = start_states(method, tasks, cfg)
    group_index = [g for _ in tasks for g in range(cfg.n)]
    return continue_rollouts(method, states, env, policy, tokenizer, cfg, wrap, progress, group_index)


def continue_rollouts(
    method: Method,
    states: list[AgentState],
    env: Env,
    policy: Policy,
    tokenizer,
    cfg: RolloutConfig | None = None,
    wrap=None,
    progress: bool = False,
    group_index: Sequence[int] | None = None,
) -> list[Trajectory]:
    """Run ``states`` (fresh, or forked mid-rollout) until each is done; one trajectory per state."""
    advance(method, states, env, policy, tokenizer, cfg, wrap, progress=progress)
    groups = group_index if group_index is not None else [0] * len(states)
    return [to_trajectory(method, s, g) for s, g in zip(states, groups)]


def advance(
    method: Method,
    states: list[AgentState],
    env: Env,
    policy: Policy,
    tokenizer,
    cfg: RolloutConfig | None = None,
    wrap=None,
    until_calls: int | None = None,
    progress: bool = False,
    until: Callable[[AgentState], bool] | None = None,
) -> list[AgentState]:
    """Step ``states`` in place, all active ones batched each round, until each is done or (with
    ``until_calls``) has made that many calls or (with ``until``) ``until(state)`` holds: the point
    to :func:`fork` a tree from (Mem-T: the end of construction, before the questions).

    ``cfg`` supplies ``max_context_tokens`` here (turn limits live in the states)."""
    cfg = cfg or RolloutConfig()
    builder = ContextBuilder(tokenizer, wrap)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(states), desc=f"rollout {method.name}", leave=False)
    while True:
        active = [
            s
            for s in states
            if not s.done and (until_calls is None or len(s.calls) < until_calls) and (until is None or not until(s))
        ]
        if not active:
            break
        batches: dict[tuple, list] = {}
        for state in active:
            if state.turn >= state.max_turns:
                _record_failure(state, f"max turns ({state.max_turns}) reached without an answer")
                continue
            spec = method.next_call(state)
            if spec.max_new_tokens < cfg.min_new_tokens:
                spec = dataclasses.replace(spec, max_new_tokens=cfg.min_new_tokens)
            ctx = builder.build(state, spec)
            if len(ctx.ids) > cfg.max_context_tokens:
                reason = f"context over the limit ({len(ctx.ids)} > {cfg.max_context_tokens} tokens)"
                _record_failure(state, reason, ctx, spec.role)
                continue
            key = (spec.role, tuple(spec.stop), spec.max_new_tokens)
            batches.setdefault(key, []).append((state, spec, ctx))
        for items in batches.values():
            t0 = time.perf_counter()
            gens = policy.generate_calls([i[0] for i in items], [i[1] for i in items], [i[2].ids for i in items])
            seconds = (time.perf_counter() - t0) / len(items)
            for (state, spec, ctx), gen in zip(items, gens):
                _finish_call(method, env, tokenizer, state, spec, ctx, gen, seconds)
        if bar is not None:
            bar.n = sum(s.done for s in states)
            bar.refresh()
    if bar is not None:
        bar.close()
    return states


def _finish_call(method, env, tokenizer, state, spec, ctx: BuiltContext, gen, seconds):
    out_char = tag_char_spans(gen.text)
    out_tok = char_to_token_spans(out_char, token_char_ends(tokenizer, gen.ids))
    parsed = method.parse(spec.prefix + gen.text, spec.role)  # a forced opening is context, not output
    obs = None
    if not parsed.ok and not parsed.recoverable:
        state.fail(f"invalid {spec.role} output: {parsed.error}")
    else:
        try:
            obs = method.apply(state, parsed, env)  # may mark a recoverable error on ``parsed``
        except ModelError as e:  # the output asked for the impossible: an invalid turn, the batch goes on
            state.fail(f"tool error: {e}")
    call_reason = (
        state.reason if not state.valid else (None if parsed.ok else f"invalid {spec.role} output: {parsed.error}")
    )
    if spec.role == "act":
        state.turn += 1
    state.calls.append(
        Call(
            turn=state.turn,
            role=spec.role,
            context_ids=ctx.ids,
            output_ids=list(gen.ids),
            logprobs=list(gen.logprobs),
            context_text=ctx.text,
            output_text=gen.text,
            context_spans=ctx.token_spans,
            context_char_spans=ctx.char_spans,
            context_refs=ctx.refs,
            output_spans=out_tok,
            output_char_spans=out_char,
            observation_text=obs,
            observation_ids=tokenizer.encode(obs, add_special_tokens=False) if obs else [],
            valid=parsed.ok and state.valid,
            reason=call_reason,
            seconds=seconds,
            parent=len(state.calls) - 1 if state.calls else None,
        )
    )


def _record_failure(state, reason, ctx: BuiltContext | None = None, role="act"):
    ctx = ctx or BuiltContext()
    state.fail(reason)
    state.calls.append(
        Call(
            turn=state.turn,
            role=role,
            context_ids=list(ctx.ids),
            output_ids=[],
            logprobs=[],
            context_text=ctx.text,
            context_spans=ctx.token_spans,
            context_char_spans=ctx.char_spans,
            context_refs=list(ctx.refs),
            valid=False,
            reason=reason,
            parent=len(state.calls) - 1 if state.calls else None,
        )
    )


def to_trajectory(method: Method, state: AgentState, group_index: int) -> Trajectory:
    """The :class:`Trajectory` record of a finished agent ``state``: its calls, answer, reward
    (``method.reward``), validity and the method's ``trajectory_info``."""
    info_fn = getattr(method, "trajectory_info", None)
    return Trajectory(
        task_id=state.task.id,
        method=method.name,
        calls=state.calls,
        group_index=group_index,
        answer=state.answer,
        golds=state.task.golds,
        reward=float(method.reward(state)),
        valid=state.valid,
        reason=state.reason,
        info=info_fn(state) if info_fn else {},
    )
