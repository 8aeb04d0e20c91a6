"""Roll out a method with a policy spec, evaluate it on held-out tasks, measure RL's headroom, and
compare two rollout engines on the same tasks (:func:`compare_engines`).

``memkit rollout``, ``memkit eval`` and the notebooks' tables all call these, so a number printed
by the CLI and a number recorded by a notebook come from the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from memkit.agents import get_method
from memkit.agents.base import OracleConfig
from memkit.lab.policies import load_spec, prompt_wrap, resolve_policy
from memkit.metrics.qa import em_by_kind, summarize
from memkit.models import sequence_logprobs, trained_k_docs
from memkit.rl.headroom import exploration_headroom
from memkit.rollout.engine import RolloutConfig, output_floor, run_rollouts
from memkit.world.task_sets import DEFAULT_KINDS, held_out_tasks


def rollout(
    method_name: str,
    tasks,
    kit,
    policy: str = "oracle",
    n: int = 1,
    max_turns: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    oracle_cfg: OracleConfig | None = None,
    max_context_tokens: int | None = None,
    progress: bool = False,
    method_kwargs: dict | None = None,
    prompt: str = "auto",
    k_docs: int | None = None,
    sample_seeds=None,
    backend=None,
    as_model=None,
    min_new_tokens: int | None = None,
):
    """Roll out ``n`` trajectories per task with a policy spec; returns trajectories.

    ``backend``: a rollout-backend factory (:mod:`memkit.models.backend`) for a model policy; None
    = the loaded model's own (memkit's HF loop unless it was given another).

    ``as_model``: with ``policy="oracle"``, a :class:`memkit.models.LoadedModel` whose tokenizer and
    chat template the oracle's calls are written in (SFT data for a pretrained model).
    ``min_new_tokens``: every call may write at least this many tokens (None: the format's own budget
    for the kit's tiny models, :data:`memkit.rollout.engine.REAL_MODEL_MIN_NEW_TOKENS` for a model
    with its own chat template: :func:`memkit.rollout.engine.output_floor`).

    ``sample_seeds``: one seed per trajectory (task-major) for batch-invariant sampling
    (:class:`RolloutConfig`); None = one stream seeded by ``seed``.

    ``prompt``: "paper" (the paper's instruction verbatim), "compact" (one short line and
    numbered questions, see :func:`memkit.agents.base.compact_prompt_wrap`) or "auto" =
    compact for tiny models. ``k_docs``: passages per search; None = what the model was
    trained with (:func:`memkit.models.trained_k_docs`, e.g. 1 for the SFT'd tiny model), else the kit's.
    """
    method = get_method(method_name, **(method_kwargs or {}))
    engine_policy, tok, wrap, loaded = resolve_policy(
        policy, method, kit, temperature, seed, oracle_cfg, backend, as_model
    )
    env = kit.env_for(k_docs if k_docs is not None else trained_k_docs(getattr(loaded, "model", None)))
    wrap = prompt_wrap(method.name, tok, wrap, prompt, oracle=isinstance(policy, str) and policy == "oracle")
    if max_context_tokens is None:  # the model's window; the oracle has none
        model = getattr(loaded, "model", None)
        max_context_tokens = model.config.max_position_embeddings - 256 if model is not None else 10**9
    cfg = RolloutConfig(
        n=n,
        max_turns=max_turns,
        max_context_tokens=max_context_tokens,
        seed=seed,
        sample_seeds=sample_seeds,
        min_new_tokens=output_floor(tok, min_new_tokens),
    )
    return run_rollouts(method, tasks, env, engine_policy, tok, cfg, wrap=wrap, progress=progress)


def evaluate(
    method_name: str,
    kit,
    objectives=(1, 2, 4, 8),
    n_tasks: int = 50,
    policy: str = "oracle",
    seed: int = 1000,
    kinds=DEFAULT_KINDS,
    backend=None,
    task_sets: dict | None = None,
    **rollout_kw,
):
    """Run :func:`memkit.world.held_out_tasks` at each objective count; returns
    ``{k: (summary_dict, trajectories)}``.

    The summary is :func:`memkit.metrics.qa.summarize`'s plus EM by question kind (``em_by_kind``).
    ``backend``: the rollout-backend factory of a model policy (:func:`rollout`). ``task_sets``:
    ``{k: tasks}`` to evaluate instead of the world's (real questions: :func:`memkit.lab.real.real_task_sets`)."""
    results = {}
    policy = load_spec(policy, method_name, kit, seed, backend)  # once for every k
    for k in task_sets or objectives:
        tasks = task_sets[k] if task_sets else held_out_tasks(kit.world, n_tasks, k, seed, kinds)
        t0 = time.perf_counter()
        trajs = rollout(method_name, tasks, kit, policy=policy, seed=seed, **rollout_kw)
        summary = {**summarize(trajs), **em_by_kind(trajs, tasks)}
        summary["wall_seconds"] = time.perf_counter() - t0
        results[k] = (summary, trajs)
    return results


def measure_headroom(
    method: str,
    kit,
    policy,
    k: int = 2,
    n_tasks: int = 50,
    n_samples: int = 8,
    temperature: float = 1.0,
    seed: int = 1000,
    **rollout_kw,
) -> dict:
    """Roll out ``n_tasks`` held-out ``k``-question tasks (the tasks :func:`evaluate` uses) once
    greedily and ``n_samples`` times at ``temperature``; return
    :func:`memkit.rl.headroom.exploration_headroom`. ``policy``: a spec as in :func:`rollout`
    (checkpoint dir, "tiny-sft", "oracle") or a loaded :class:`memkit.models.LoadedModel`."""
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: the samples must be sampled (e.g. 1.0, as RL rollouts)")
    if n_samples < 1:
        raise ValueError(f"n_samples={n_samples} must be >= 1")
    policy = load_spec(policy, method, kit, seed)  # once: greedy and samples score the same model
    tasks = held_out_tasks(kit.world, n_tasks, k, seed)
    greedy = rollout(method, tasks, kit, policy=policy, n=1, temperature=0.0, seed=seed, **rollout_kw)
    samples = rollout(
        method, tasks, kit, policy=policy, n=n_samples, temperature=temperature, seed=seed + 1, **rollout_kw
    )
    return exploration_headroom(greedy, samples)


@dataclass
class EngineRun:
    """One engine's rollouts in :func:`compare_engines`: the same tasks greedily and sampled."""

    name: str
    start_seconds: float  # building the backend (vLLM: saving the weights and starting its engine)
    greedy: list  # Trajectory per task, temperature 0
    sampled: list  # Trajectory per task, at the comparison's temperature, one seed per trajectory
    logprob_gap: float  # max |recorded log-prob - a fresh forward's| over the sampled tokens

    @property
    def tokens(self) -> int:
        """Tokens generated, greedy and sampled."""
        return sum(c.n_output for t in self.greedy + self.sampled for c in t.calls)

    @property
    def generate_seconds(self) -> float:
        """Seconds spent in the backend's ``generate`` (each call records its share of its batch's)."""
        return sum(c.seconds for t in self.greedy + self.sampled for c in t.calls)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.generate_seconds, 1e-9)


def same_ids(a, b) -> int:
    """How many of the paired trajectories ``a[i]``, ``b[i]`` generated the same ids in every call."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} trajectories against {len(b)}: compare rollouts of the same tasks")
    return sum([c.output_ids for c in x.calls] == [c.output_ids for c in y.calls] for x, y in zip(a, b))


def logprob_gap(model, trajs, temperature: float = 1.0) -> float:
    """max over every generated token of ``trajs`` of |recorded log-prob - ``sequence_logprobs``|: how
    far the engine's old log-probs are from what the trainer's fresh forward of ``model`` gives."""
    worst = 0.0
    with torch.no_grad():
        for t in trajs:
            for c in t.calls:
                if c.output_ids:
                    fresh = sequence_logprobs(model, c.context_ids, c.output_ids, temperature)
                    worst = max(worst, (torch.tensor(c.logprobs) - fresh).abs().max().item())
    return worst


def compare_engines(
    method_name: str, tasks, kit, policy, engines: dict, temperature: float = 1.0, seed: int = 1000, **rollout_kw
) -> dict[str, EngineRun]:
    """Roll out ``tasks`` with one policy through each engine of ``engines`` (name -> backend factory,
    :mod:`memkit.models.backend`; None = memkit's HF loop), in order: greedily, then sampled at
    ``temperature`` with one seed per trajectory (the same seeds for every engine).

    Each engine gets its own backend over the same model, timed while it is built and closed (its
    memory given back) before the next starts. ``policy``: a model spec or a loaded
    :class:`memkit.models.LoadedModel` (:func:`load_spec`). Compare the runs with :func:`same_ids`.
    """
    loaded = load_spec(policy, method_name, kit, seed)
    if isinstance(loaded, str):
        raise ValueError("compare_engines needs a model policy; the oracle has no engine")
    runs = {}
    for name, factory in engines.items():
        engine = replace(loaded, backend_factory=factory)  # a backend of its own (built on first use)
        t0 = time.perf_counter()
        backend = engine.backend()
        start = time.perf_counter() - t0
        greedy = rollout(method_name, tasks, kit, policy=engine, temperature=0.0, seed=seed, **rollout_kw)
        seeds = [seed + i for i in range(len(tasks))]
        sampled = rollout(
            method_name, tasks, kit, policy=engine, temperature=temperature, seed=seed, sample_seeds=seeds, **rollout_kw
        )
        runs[name] = EngineRun(name, start, greedy, sampled, logprob_gap(loaded.model, sampled, temperature))
        if callable(getattr(backend, "close", None)):
            backend.close()
    return runs
