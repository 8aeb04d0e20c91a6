"""How the trainer rolls out one step: each method declares a plan (``Method.rollout_plan``) and
:class:`~memkit.rl.trainer.Trainer` runs it, so one loop trains all five papers.

    plan.tasks(trainer, step) -> list                 # the step's global work, a function of (seed, step)
    plan.rollout(trainer, local, step) -> (trajectories, training units or None)
    plan.evaluate(trainer) -> list[dict]              # greedy held-out rows
    plan.distributed_eval: bool                       # evaluate on every process (a share each), or the main one

* :class:`ChainPlan` (``chains``): wiki tasks, ``n_samples`` independent episodes per task (a GRPO
  group; PPO's trajectories). ReAct, MEM1, MemSearcher, MemPO, MemAct.
* :class:`TreePlan` (``trees``): Mem-T's retrieval phase (§3.2). Questions over memory stores the
  scripted teacher built once; with credit ``mot`` every question grows G = ``n_samples`` operation
  trees (eq. 8-9: a seed chain, then ``mot.rounds`` rounds of ``mot.pivots`` branches), scored by
  node rewards (eq. 10-13); with another rule (the paper's GRPO baseline) ``n_samples`` chains.

Every plan samples through the trainer's rollout backend (:mod:`memkit.models.backend`).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from memkit.agents.memt_tools import stream_conversation, stream_store
from memkit.rl.mot import mot_units, score_query
from memkit.rollout.engine import ModelPolicy, RolloutConfig
from memkit.rollout.streams import answer_questions, teacher_built_stores
from memkit.rollout.trees import TreeConfig, grow_forest
from memkit.world.conversation import CATEGORIES
from memkit.world.task_sets import held_out_tasks


class ChainPlan:
    """Wiki tasks (:meth:`Trainer.step_tasks`), ``n_samples`` chains each; held-out tasks at every
    ``eval_objectives`` count for evaluation, rolled out a share per process (the rows from all
    of them: :meth:`Trainer.rollout_shared`)."""

    distributed_eval = True

    def tasks(self, trainer, step: int) -> list:
        return trainer.step_tasks(step)

    def rollout(self, trainer, local: list, step: int):
        cfg = trainer.cfg
        seed = (cfg.seed * 1_000_003 + step) * 64 + trainer.rank
        return trainer.rollout(local, cfg.n_samples, cfg.temperature, seed), None

    def stats(self, trajs) -> dict:
        return {}

    def evaluate(self, trainer) -> list[dict]:
        from memkit.metrics.qa import em_by_kind, summarize

        cfg, rows = trainer.cfg, []
        for k in cfg.eval.objectives:
            tasks = held_out_tasks(trainer.kit.world, cfg.eval.tasks, k, cfg.eval.seed)
            # every process gets all trajectories and computes the same rows (mem_p's forwards included:
            # repeated per rank, cheap next to the rollouts, and the lockstep a sharded model would need)
            trajs = trainer.rollout_shared(tasks, 1, 0.0, cfg.eval.seed + k)
            s = summarize(trajs)
            rows.append(
                {
                    "step": trainer.step,
                    "k": k,
                    "reward_mean": sum(t.reward for t in trajs) / len(trajs),
                    **{
                        key: s[key]
                        for key in (
                            "em",
                            "f1",
                            "peak_tokens",
                            "context_tokens",
                            "invalid_rate",
                            "tool_calls",
                            "memory_actions",
                        )
                    },
                    **em_by_kind(trajs, tasks),
                    **trainer.memory_probability(trajs),
                }
            )
        return rows


#: the context limit of Mem-T's rollouts on the tiny model (its 4,096 positions, less room to answer)
MAX_CONTEXT_TOKENS = 3800


@dataclass
class TreePlan:
    """Mem-T's retrieval phase over teacher-built stores (module doc).

    ``built`` / ``eval_built``: the training and held-out stores (built states of
    :func:`memkit.rollout.streams.build_memories`); None = built by the teacher on first use from
    the trainer's kit: ``n_train_tasks`` conversations (seeds 20,000 + seed ..) and ``eval_tasks``
    (seeds 30,000 + seed ..) of ``size``. A step draws ``tasks_per_step`` questions (seeded by
    (seed, step)); evaluation answers every held-out question greedily, each process the questions
    of its share of the stores (:meth:`answer_shared`).
    """

    distributed_eval = True

    built: list | None = None
    eval_built: list | None = None
    size: str = "smoke"
    max_context_tokens: int = MAX_CONTEXT_TOKENS
    categories: tuple[str, ...] | None = None  # LoCoMo categories a step's questions come from (None: all)

    def _stores(self, trainer) -> None:
        cfg, kit = trainer.cfg, trainer.kit
        if self.built is None:
            self.built = teacher_built_stores(
                trainer.method, kit.world, kit.tokenizer, cfg.n_train_tasks, 20_000 + cfg.seed, self.size
            )[1]
        if self.eval_built is None:
            self.eval_built = teacher_built_stores(
                trainer.method, kit.world, kit.tokenizer, cfg.eval.tasks, 30_000 + cfg.seed, self.size
            )[1]

    def tasks(self, trainer, step: int) -> list:
        """``(built state, question index)`` pairs drawn without replacement from every stored question (of
        :attr:`categories`)."""
        self._stores(trainer)
        pool = [(b, qi) for b in self.built for qi, q in enumerate(stream_conversation(b).qa)
                if self.categories is None or CATEGORIES[q.category] in self.categories]  # fmt: skip
        if not pool:
            raise ValueError(f"no training question of categories {self.categories} in the stores")
        return random.Random(f"{trainer.cfg.seed}-{step}").sample(pool, min(trainer.cfg.tasks_per_step, len(pool)))

    def _policy(self, trainer, temperature: float, seed: int) -> ModelPolicy:
        trainer.model.eval()
        return ModelPolicy(
            trainer.backend, temperature=temperature, top_p=1.0, generator=torch.Generator().manual_seed(seed)
        )

    def rollout(self, trainer, local: list, step: int):
        cfg, method = trainer.cfg, trainer.method
        # (seed, step) as the lab's loop always seeded it; another process of a DDP run gets its own stream
        policy = self._policy(trainer, cfg.temperature, cfg.seed * 100_003 + step + 999_983 * trainer.rank)
        rc = RolloutConfig(max_context_tokens=self.max_context_tokens)
        if cfg.resolved_credit() == "mot":
            tree_cfg = TreeConfig(
                trees=cfg.n_samples, rounds=cfg.mot.rounds, pivots=cfg.mot.pivots, seed=cfg.seed * 1000 + step
            )
            trajs, mot = [], cfg.mot
            for (b, qi), qt in zip(
                local, grow_forest(method, local, policy, trainer.tokenizer, tree_cfg, rc, trainer.wrap)
            ):
                score_query(qt.trees, stream_conversation(b).qa[qi].evidence, stream_store(b).sources_of(), mot)
                trajs += qt.trees
        else:  # the paper's GRPO baseline: independent chains per question
            by_state: dict[int, list[int]] = defaultdict(list)
            for b, qi in local:
                by_state[id(b)].append(qi)
            states = [b for b in self.built if id(b) in by_state]
            trajs = answer_questions(
                method,
                states,
                policy,
                trainer.tokenizer,
                replace(rc, n=cfg.n_samples),
                trainer.wrap,
                questions=[by_state[id(b)] for b in states],
            )
        return trajs, mot_units(trajs, None, 0)  # each tree's or chain's retrieval calls

    def stats(self, trajs) -> dict:
        """``leaf_reward``: the mean reward of every leaf (a chain is its own leaf), the training signal
        of Fig. 5; ``rollout_tokens``: the retrieval tokens sampled (the equal-tokens comparison);
        ``mixed_groups``: the share of the step's questions (a group: one ``task_id``) whose leaves, over all
        its trees or chains, do not all score alike. Only those carry an advantage: equal leaves give equal
        node rewards (eq. 10), so MoT-GRPO's eq. 11-13 and GRPO's group-normalised rewards are all zero."""
        leaves, groups = [], defaultdict(set)
        for t in trajs:
            rs = [r or 0.0 for r in ([o.reward for o in t.leaf_outcomes()] or [t.reward])]
            leaves += rs
            groups[t.task_id].update(rs)
        return {
            "leaf_reward": sum(leaves) / max(len(leaves), 1),
            "rollout_tokens": sum(c.n_output for t in trajs for c in t.calls if c.role == "act"),
            "mixed_groups": sum(len(g) > 1 for g in groups.values()) / max(len(groups), 1),
        }

    def evaluate(self, trainer) -> list[dict]:
        self._stores(trainer)
        trajs = self.answer_shared(trainer, self.eval_built)
        n = max(len(trajs), 1)
        row = {
            "step": trainer.step,
            "f1": sum(float(t.reward or 0.0) for t in trajs) / n,
            "invalid_rate": sum(not t.valid for t in trajs) / n,
            "questions": len(trajs),
        }
        for cat in sorted({t.info["category"] for t in trajs}):
            scores = [float(t.reward or 0.0) for t in trajs if t.info["category"] == cat]
            row[f"f1_{cat}"] = sum(scores) / len(scores)
        return [row]

    def answer_shared(self, trainer, built) -> list:
        """Every question of ``built`` answered greedily, each process the stores ``built[rank::world]``;
        all of them back on every rank, in the order one process answering ``built`` lists them."""
        local = self.answer(trainer, built[trainer.rank :: trainer.world])
        # one trajectory per question, also for a failed store
        return trainer.gather_shared(local, [len(stream_conversation(state).qa) for state in built])

    def answer(self, trainer, built, temperature: float = 0.0, seed: int = 0) -> list:
        """Every question of ``built`` answered by the trainer's policy (greedy by default)."""
        policy = self._policy(trainer, temperature, seed)
        return answer_questions(
            trainer.method,
            built,
            policy,
            trainer.tokenizer,
            RolloutConfig(max_context_tokens=self.max_context_tokens),
            trainer.wrap,
        )


#: ``Method.rollout_plan`` -> the plan the Trainer builds for it
PLANS = {"chains": ChainPlan, "trees": TreePlan}

__all__ = ["ChainPlan", "TreePlan", "PLANS", "MAX_CONTEXT_TOKENS"]
