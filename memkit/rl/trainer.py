"""One RL loop for every method: rollout -> reward -> advantages -> pack -> update.

    for step in range(cfg.steps):
        trajs  = rollout(policy, tasks(step), n=cfg.n_samples, T=1)     # memkit.rollout
        R_i    = traj.reward                                            # the method's outcome reward
        A      = grpo: (R_i - mean_g R) / std_g R, copied to every call  (MemSearcher eq. 5-8)
                 ppo:  GAE(critic values, R on the last trained token)  (MEM1 §3.2)
        batch  = pack(trajs, cfg.packing)                               # separate | mem1_mask | mem1_exact
        loss   = PPO-clip(logp, old_logp, A) + kl_coef * KL(pi || pi_ref) [- entropy_coef * H]
        for epoch, mini-batch, micro-batch: accumulate, clip, AdamW step

It runs on ``accelerate``: the same code on CPU, one GPU (full or LoRA) and many GPUs (DDP;
``torchrun --nproc_per_node N`` or ``accelerate launch``). Each process rolls out its share of
the step's tasks (all samples of a task on the same process, so GRPO groups are local) and the
loss is normalised over the *global* mini-batch (:func:`memkit.rl.critic.loss_weights`), so
1 process x 8 trajectories, 4 micro-batches x 2 and 2 processes x 4 give the same update.

Rollouts go through a rollout backend (:mod:`memkit.models.backend`; memkit's HF loop by default)
that the loop hands the new weights after every update and after a resume (``sync_weights``), so an
engine with its own copy of the weights samples from the policy being trained.

Determinism: the step's tasks and the rollout sampler are seeded from (seed, step, process),
so a resumed run continues exactly. Dropout is kept off (eval mode) during RL, as in verl.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch

from memkit.core.trajectory import Trajectory
from memkit.models.loading import trained_k_docs
from memkit.rl.checkpoint import RunFiles
from memkit.rl.config import RESUME_KEYS, TrainConfig
from memkit.rl.plans import PLANS
from memkit.rl.update import Learner
from memkit.world.task_sets import training_tasks


class Trainer(Learner):
    """:class:`~memkit.rl.update.Learner` + the loop: tasks, rollouts, logs, eval, checkpoints.

    ``kit``: anything with ``world`` (the tasks' world) and ``env_for(k_docs)`` (the search env),
    e.g. :func:`memkit.lab.kit.load_kit`'s. ``task_pool``: the training tasks (default below).
    ``backend``: the rollout-backend factory ``(model, tokenizer) -> RolloutBackend``; None = memkit's
    HF decode loop (:func:`memkit.models.backend.hf_backend`). ``plan``: how a step rolls out
    (:mod:`memkit.rl.plans`); None = the one the method declares (``Method.rollout_plan``: chains of
    wiki tasks, or Mem-T's trees over teacher-built stores)."""

    def __init__(
        self,
        cfg: TrainConfig,
        model,
        tokenizer,
        wrap=None,
        kit=None,
        accelerator=None,
        task_pool: list | None = None,
        backend=None,
        plan=None,
    ):
        super().__init__(cfg, model, tokenizer, wrap, accelerator)
        if backend is None and cfg.runtime.backend != "hf":
            from memkit.models.backend import named_backend

            backend = named_backend(cfg.runtime.backend, cfg.runtime.backend_dtype)
        self.backend_factory, self._backend = backend, None
        self.kit, self.method, self.plan = kit, None, plan
        if kit is not None:
            from memkit.agents import get_method

            self.method = get_method(cfg.method, **cfg.method_kwargs)
            self.plan = plan or PLANS[self.method.rollout_plan]()
        self.step, self.history, self.eval_history = 0, [], []
        self.files = RunFiles(cfg.out_dir, self.acc) if cfg.out_dir else None
        self.last_checkpoint: Path | None = None
        # The training tasks; None = ``memkit.world.training_tasks(kit.world, cfg.objectives,
        # cfg.n_train_tasks, cfg.seed, split=cfg.question_split)`` on first use. Set it to train on other
        # tasks (e.g. the evaluation tasks, to test whether RL can fit what it fails to generalise); a
        # resumed run must set it again.
        self.task_pool: list | None = task_pool

    def step_tasks(self, step: int) -> list:
        """The global task list of ``step`` (a function of (seed, step): resumable)."""
        if self.kit is None:
            raise ValueError("this Trainer has no kit; pass kit=memkit.lab.kit.load_kit() to roll out")
        if self.task_pool is None:
            self.task_pool = training_tasks(
                self.kit.world,
                self.cfg.objectives,
                self.cfg.n_train_tasks,
                self.cfg.seed,
                split=self.cfg.question_split,
            )
        if not self.task_pool:
            raise ValueError("Trainer.task_pool is empty; give it tasks (memkit.world.make_tasks) or leave it None")
        rng = random.Random(self.cfg.seed * 1_000_003 + step)
        n = self.cfg.tasks_per_step
        pool = self.task_pool
        return rng.sample(pool, n) if n <= len(pool) else rng.choices(pool, k=n)

    @property
    def backend(self):
        """This process's rollout backend over the policy (built on first use by the factory)."""
        if self._backend is None:
            from memkit.models.backend import check_backend, hf_backend

            self._backend = check_backend((self.backend_factory or hf_backend)(self.policy, self.tokenizer))
            match = getattr(self._backend, "logprobs_match", None)  # e.g. vLLM renormalising over a nucleus
            if (
                match
                and self.cfg.runtime.recompute_old_logprobs is None
                and not match(self.cfg.temperature, self.cfg.top_p)
            ):
                self.recompute = True  # the rollout's log-probs are not the trainer's: old log-probs from a forward
        return self._backend

    def sync_backend(self) -> None:
        """Hand the policy's current weights to the rollout backend (after an update, after a resume)."""
        if self._backend is not None:
            self._backend.sync_weights(self.policy)

    def rollout(self, tasks, n: int, temperature: float, seed: int) -> list[Trajectory]:
        """Roll out ``n`` samples of each task with the current policy on this process."""
        from memkit.rollout.engine import ModelPolicy, RolloutConfig, output_floor, run_rollouts

        if not tasks:
            return []
        gen = torch.Generator().manual_seed(seed)
        policy = ModelPolicy(
            self.backend, temperature=temperature, top_p=self.cfg.top_p if temperature > 0 else 1.0, generator=gen
        )
        rc = RolloutConfig(
            n=n,
            max_turns=self.cfg.max_turns,  # None: the method's per-task limit
            max_context_tokens=self.cfg.max_context_tokens,
            seed=seed,
            min_new_tokens=output_floor(self.tokenizer, self.cfg.runtime.min_new_tokens),
        )
        return run_rollouts(self.method, tasks, self.env, policy, self.tokenizer, rc, wrap=self.wrap)

    def rollout_shared(self, tasks, n: int, temperature: float, seed: int) -> list[Trajectory]:
        """Every process rolls out its share of ``tasks`` (``tasks[rank::world]``) and gets all of
        them back, in ``tasks``' order, as one process rolling out ``tasks`` would list them: a
        distributed evaluation costs 1/world of the rollout time, and no rank idles at a barrier
        (a 7B evaluation on one rank can outlast NCCL's timeout)."""
        local = self.rollout(tasks[self.rank :: self.world], n, temperature, seed)
        return self.gather_shared(local, [n] * len(tasks))

    def gather_shared(self, local: list, sizes: list[int]) -> list:
        """Every rank's ``local`` results back on every rank, in one process's order: work unit ``i``
        (``sizes[i]`` results) was done by rank ``i % world``, its units in order. As is on one process."""
        self.join_forwards()  # under FSDP: every rank done with its forwards before the gather
        if self.world == 1:
            return local
        from accelerate.utils import gather_object

        parts, taken, out = gather_object([local]), [0] * self.world, []  # one list per rank
        for i, size in enumerate(sizes):
            rank = i % self.world
            out += parts[rank][taken[rank] : taken[rank] + size]
            taken[rank] += size
        assert len(out) == sum(sizes), (len(out), sizes)
        return out

    @property
    def env(self):
        """The search env the policy was trained with (:func:`memkit.models.trained_k_docs`: 1
        passage per search for the SFT'd tiny model), else the kit's."""
        return self.kit.env_for(trained_k_docs(self.policy))

    def train_step(self) -> dict:
        """Rollout + update + log (+ eval / checkpoint when due). Returns the step's row."""
        cfg = self.cfg
        if self.step == 0 and cfg.eval.every and cfg.eval.at_start and not self.eval_history:
            self.evaluate()
        t0 = time.perf_counter()
        if self.plan is None:
            raise ValueError("this Trainer has no kit; pass kit=memkit.lab.kit.load_kit() to roll out")
        local = self.plan.tasks(self, self.step)[self.rank :: self.world]
        trajs, units = self.plan.rollout(self, local, self.step)
        self.join_forwards()  # under FSDP: ranks rolled out different numbers of forwards
        t1 = time.perf_counter()
        stats = self.update(trajs, units)
        t_update = time.perf_counter()
        self.sync_backend()  # the next rollout (this step's eval included) samples from the updated policy
        t2 = time.perf_counter()
        self.step += 1
        row = {
            "step": self.step,
            **self._rollout_stats(trajs),
            **self.plan.stats(trajs),
            **stats,
            "seconds_rollout": t1 - t0,
            "seconds_update": t_update - t1,
            "seconds_sync": t2 - t_update,  # weights to the rollout backend (0 for the HF loop: the same model)
            "seconds": t2 - t0,
        }
        self.history.append(row)
        if self.files:
            self.files.log_step(row, self.history)
        last = self.step == cfg.steps
        if cfg.eval.every and (self.step % cfg.eval.every == 0 or last):
            self.evaluate()
        if self.files and ((cfg.save.every and self.step % cfg.save.every == 0) or last):
            self.save()
        return row

    def run(self, progress: bool = True, log=None, desc: str | None = None) -> None:
        """Train until ``cfg.steps`` or a ``cfg.budget`` (wall-clock seconds, rollout tokens), whichever comes
        first.

        A budget stop still ends like a full run: a final evaluation (unless this step was just
        evaluated) and a checkpoint. Every process takes the same decision (the slowest one's
        clock), so DDP ranks never wait on each other at different steps.
        """
        cfg, t0 = self.cfg, time.perf_counter()
        bar = None
        if progress and self.acc.is_main_process:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.steps, initial=self.step, desc=desc or f"{cfg.algo} {cfg.method}")
        while self.step < cfg.steps and not self._out_of_time(t0) and not self._out_of_tokens():
            row = self.train_step()
            if log and self.acc.is_main_process:
                log(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{row['reward_mean']:.3f}", em=f"{row['em']:.3f}", valid=f"{row['valid_rate']:.2f}"
                )
        if bar is not None:
            bar.close()
        if self.step < cfg.steps:  # stopped by the budget: train_step's "last step" work was not done
            if cfg.eval.every and (not self.eval_history or self.eval_history[-1]["step"] != self.step):
                self.evaluate()
            if self.files and getattr(self.last_checkpoint, "name", None) != f"step-{self.step:06d}":
                self.save()

    def _out_of_tokens(self) -> bool:
        """The token budget is spent (every rank decides alike: the history's rows are global sums)."""
        budget = self.cfg.budget.rollout_tokens
        from memkit.metrics.efficiency import rollout_tokens

        return budget is not None and rollout_tokens(self.history) >= budget

    def _out_of_time(self, t0: float) -> bool:
        if self.cfg.budget.seconds is None:
            return False
        return self.global_sums([float(time.perf_counter() - t0 >= self.cfg.budget.seconds)])[0] > 0

    def _rollout_stats(self, trajs) -> dict:
        from memkit.metrics.efficiency import peak_tokens
        from memkit.metrics.qa import summarize

        n = len(trajs)
        s = summarize(trajs) if n else {"em": 0.0, "f1": 0.0}
        r = [float(t.reward) for t in trajs]
        tot = self.global_sums(
            [
                n,
                sum(r),
                sum(x * x for x in r),
                s["em"] * n,
                s["f1"] * n,
                sum(t.valid for t in trajs),
                sum(peak_tokens(t) for t in trajs),
                sum(len(t.calls) for t in trajs),
                sum(c.n_output for t in trajs for c in t.calls),
                sum(c.n_context for t in trajs for c in t.calls),
            ]
        )
        N = max(tot[0], 1.0)
        mean = tot[1] / N
        return {
            "reward_mean": mean,
            "reward_std": math.sqrt(max(tot[2] / N - mean**2, 0.0)),
            "em": tot[3] / N,
            "f1": tot[4] / N,
            "valid_rate": tot[5] / N,
            "peak_tokens": tot[6] / N,
            "calls": tot[7] / N,
            "response_tokens": tot[8] / N,
            "context_tokens": tot[9] / max(tot[7], 1.0),
            "n_trajectories": int(tot[0]),
            "processes": self.world,  # the ranks that rolled out and trained (accelerate / torchrun)
        }

    def evaluate(self) -> list[dict]:
        """The plan's greedy held-out evaluation: for wiki tasks, :func:`memkit.world.held_out_tasks`
        of seed base ``cfg.eval.seed`` at each ``eval_objectives``.

        A plan with ``distributed_eval`` (chains; Mem-T's trees) runs on every process: each rolls out
        a share of the tasks (stores) and computes the rows from all of them (:meth:`rollout_shared`),
        so every rank holds the same ``eval_history``; a plan without it evaluates on the main process
        while the others wait. The main process writes the rows."""
        rows = []
        shared = getattr(self.plan, "distributed_eval", False)
        if self.cfg.eval.tasks and (shared or self.acc.is_main_process):
            rows = self.plan.evaluate(self)
            self.eval_history += rows
            if self.files:
                self.files.log_eval(rows)
        if not shared:
            self.acc.wait_for_everyone()
        return rows

    def memory_probability(self, trajs) -> dict:
        """``mem_p``: mean P[ans | q, mem_t] over the ``<mem>`` of greedy held-out trajectories (MemPO
        Fig. 4's quantity, for any credit rule); {} when the format writes none."""
        rows = self.memory_rows(trajs, "none", "separate")
        return {"mem_p": sum(r["p_mem"] for r in rows) / len(rows)} if rows else {}

    def save(self) -> Path:
        meta = {
            "step": self.step,
            "history": self.history,
            "eval_history": self.eval_history,
            "config": self.cfg.to_dict(),
        }
        self.last_checkpoint = self.files.save(self.step, meta, self.model, self.tokenizer, self.cfg.save.keep)
        return self.last_checkpoint

    def resume(self, path: Path | None = None) -> Path:
        """Continue from ``path`` (default: ``out_dir/checkpoints/latest``); the run-defining
        config fields must match."""
        if self.files is None:
            raise ValueError("resume needs TrainConfig.out_dir (the run directory to continue)")
        path, meta = self.files.meta(path)
        saved = TrainConfig.from_dict({**TrainConfig(method=self.cfg.method).to_dict(), **meta["config"]})
        diff = {
            k: (getattr(saved, k), getattr(self.cfg, k))
            for k in RESUME_KEYS
            if _norm(getattr(saved, k)) != _norm(getattr(self.cfg, k))
        }
        if saved.resolved_credit() != self.cfg.resolved_credit():
            diff["credit"] = (saved.resolved_credit(), self.cfg.resolved_credit())
        if diff:
            raise ValueError(
                f"cannot resume {path}: config differs in {diff} (checkpoint, now); use the "
                "checkpoint's values or a new out_dir"
            )
        self.files.load(path)
        self.sync_backend()  # the loaded weights, for a backend built before the resume
        self.step, self.history, self.eval_history = meta["step"], meta["history"], meta["eval_history"]
        self.files.rewrite_logs(self.history, self.eval_history)
        self.last_checkpoint = path
        return path


def _norm(v):
    return list(v) if isinstance(v, (tuple, list)) else v


__all__ = ["Trainer", "TrainConfig"]
