"""The RL update on a batch of trajectories: advantages -> pack -> PPO-clip (+KL, +critic).

``Learner.update(trajs)`` is the whole algorithm given trajectories (rewards already set); the
loop around it (rollouts, logs, eval, checkpoints) is :mod:`memkit.rl.trainer`. What each
micro-batch holds fixed (``batch`` to ``ref`` below, and critic values) is computed first, without
gradients, by the Learner's base :class:`memkit.rl.experience.ExperienceMaker`; this module holds
the Learner's set-up, the mini-batch plan and the PPO steps over that experience.

    units  = TrainingUnit.of(traj)         the calls that generated tokens (the rule's ``units``: DCPO segments)
    batch  = pack(units, packing)          input_ids [B, L], attention [B, L] or [B, 1, L, L]
    R_M    = P[ans|q,mem_t] - eps_t        memkit.rl.memory_reward, when the rule needs it (mempo)
    A      = credit rule by name           memkit.rl.credit (grpo, multi_context, gae, mempo, ...)
    old    = log pi_old(x_t)  [B, L]       recomputed with the packed forward (verl) or the rollout's
    ref    = log pi_ref(x_t)  [B, L]       initial policy (LoRA: adapters off; else a copy in runtime.ref_dtype)
    loss   = sum_{b,t} w_bt [ PPO-clip_bt(logp, old, A) + kl_coef * KL_bt - entropy_coef * H_bt ]
    critic = sum_{b,t} w_bt 0.5 max((V - R)^2, (V_clip - R)^2)

with ``w`` from :func:`memkit.rl.critic.loss_weights`, normalised over the *global* mini-batch:
so 1 process x 8 trajectories, 4 micro-batches x 2 and 2 processes x 4 give the same update.
Each mini-batch (``cfg.mini_batches`` per epoch, ``cfg.ppo_epochs`` epochs) is one optimizer
step; every process runs the same number of micro-batches (empty ones do a zero backward so
the DDP all-reduce still meets). Dropout is kept off (eval mode) during RL, as in verl.
"""

from __future__ import annotations

import contextlib
import math
import zlib

import torch

from memkit.core.trajectory import TrainingUnit, Trajectory
from memkit.models.training import checkpointed_training, frozen_copy
from memkit.rl.config import TrainConfig
from memkit.rl.credit import get_credit, record_call_advantages
from memkit.rl.critic import ValueModel, loss_weights
from memkit.rl.engines import (
    check_engine,
    configure_deepspeed,
    deepspeed_backward,
    engine_kind,
    make_accelerator,
    reference_dtype,
    shard_like_policy,
    sharded,
)
from memkit.rl.experience import Experience, ExperienceMaker
from memkit.rl.losses import kl_penalty, ppo_clip_terms, value_terms


def _units_seed(seed: int, trajs: list[Trajectory]) -> int:
    """A seed for sampling this update's units, fixed by the run's seed and the trajectories
    themselves (so a resumed run draws the same segments)."""
    key = "|".join(f"{t.task_id}:{sum(len(c.output_ids) for c in t.calls)}" for t in trajs)
    return seed * 1_000_003 + zlib.crc32(key.encode())


class Learner(ExperienceMaker):
    """Policy, reference, critic and optimizers (prepared by ``accelerate``) and ``update``; the
    forwards and each micro-batch's :class:`~memkit.rl.experience.Experience` come from
    :class:`~memkit.rl.experience.ExperienceMaker`.

    PPO's critic (:class:`~memkit.rl.critic.ValueModel`) on a LoRA policy in one process is a second
    adapter on the policy's own model: the policy optimizer holds the policy adapter, the critic's
    optimizer the critic adapter and the value head, and each gradient-norm clip sees its own. With
    several processes the LoRA critic keeps a copied backbone (one model in two DDP reducers would
    wait for each other's gradients)."""

    def __init__(self, cfg: TrainConfig, model, tokenizer, wrap=None, accelerator=None):
        self.cfg = cfg.validate()
        self.packing = cfg.resolved_packing()
        self.recompute = cfg.resolved_recompute()
        self.credit = get_credit(cfg.resolved_credit())
        self.acc = accelerator or make_accelerator(cfg)
        check_engine(self.acc, critic=self.credit.needs_values, backend=cfg.runtime.backend)
        self.deepspeed = engine_kind(self.acc) == "DEEPSPEED"  # memkit.rl.engines: its backward and step
        self.sharded = sharded(self.acc)  # FSDP: every forward a collective (memkit.rl.engines)
        self._lockstep = None
        if self.deepspeed:
            configure_deepspeed(self.acc, cfg)
        self.tokenizer, self.wrap = tokenizer, wrap
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.is_peft = hasattr(model, "disable_adapter")
        self.keep_grads = False  # leave the last mini-batch's gradients in .grad (for inspection)
        self.sort_micro_batches = True  # cut micro-batches from length-sorted mini-batches (False: rollout order)
        model.eval()  # dropout off for the whole run (rollout and update see the same policy)
        self.ref = None
        if cfg.kl.coef > 0 and not self.is_peft:
            self.ref = frozen_copy(model, reference_dtype(cfg.runtime.ref_dtype, self.acc.device, model))
            self.ref.to(self.acc.device)
        critic = None
        if self.credit.needs_values:  # LoRA: an adapter on the policy's model, one process (ValueModel)
            critic = ValueModel(model, share=self.is_peft and self.world == 1).eval()
        # a shared critic's adapter lives in the policy's model, but is trained by the critic's optimizer only
        self._critic_ids = (
            {id(p) for p in critic.parameters()} if critic is not None and critic.shares_backbone else set()
        )
        self.opt = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad and id(p) not in self._critic_ids],
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._warmup)
        if critic is not None:
            self.copt = torch.optim.AdamW(
                [p for p in critic.parameters() if p.requires_grad], lr=cfg.critic.lr, weight_decay=cfg.weight_decay
            )
            self.csched = torch.optim.lr_scheduler.LambdaLR(self.copt, self._warmup)
            self.model, self.opt, self.critic, self.copt = self.acc.prepare(model, self.opt, critic, self.copt)
            self.acc.register_for_checkpointing(self.sched, self.csched)
        else:
            self.critic = self.copt = self.csched = None
            self.model, self.opt = self.acc.prepare(model, self.opt)
            self.acc.register_for_checkpointing(self.sched)
        if self.sharded and self.ref is not None:
            shard_like_policy(self.ref)
        # schedulers stay unprepared: accelerate would step them once per process

    def _warmup(self, s: int) -> float:
        return min(1.0, (s + 1) / self.cfg.warmup_steps) if self.cfg.warmup_steps else 1.0

    # ------------------------------------------------------------------------- properties
    @property
    def policy(self):
        """The unwrapped policy model (what rollouts, scoring forwards and checkpoints use). Under FSDP,
        the sharded model in a :class:`~memkit.models.lockstep.Lockstep`: each forward outside the
        gradient loop is a round every rank takes part in (:meth:`join_forwards` after each phase)."""
        model = self.acc.unwrap_model(self.model)
        if not self.sharded:
            return model
        if self._lockstep is None or self._lockstep.module is not model:
            from memkit.models.lockstep import Lockstep

            self._lockstep = Lockstep(model)
        return self._lockstep

    def join_forwards(self) -> None:
        """End a phase of forwards whose number differs between ranks (rollouts, memory probes): under
        FSDP, a rank that is done follows the others' forwards until every rank is (``Lockstep.join``);
        elsewhere nothing. Call it on every rank before the next collective."""
        if self.sharded:
            self.policy.join()

    @property
    def rank(self) -> int:
        return self.acc.process_index

    @property
    def world(self) -> int:
        return self.acc.num_processes

    def global_sums(self, values: list[float]) -> list[float]:
        """``values`` summed over every process (a float64 all-reduce; as is on one process)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.acc.device)
        return (self.acc.reduce(t, "sum") if self.world > 1 else t).tolist()

    def _max(self, value: int) -> int:
        t = torch.tensor([value], device=self.acc.device)
        return int(self.acc.gather(t).max()) if self.world > 1 else value

    # ------------------------------------------------------------------------- the update
    def update(self, trajs: list[Trajectory], units: list[TrainingUnit] | None = None) -> dict:
        """PPO/GRPO update on this process's trajectories (all samples of a task must be on
        the same process). ``units``: what to train, each a trajectory of ``trajs`` (the same object)
        and a subset of its calls (DCPO segments, tree paths); default one unit per trajectory with
        every call that generated tokens. Returns global stats: pg_loss, kl, entropy, clip_frac,
        approx_kl, ratio, grad_norm, lr (+ vf_loss, value_mean for ppo), old_logprob_gap,
        trained_tokens, tokens_processed (padding excluded) and padded_tokens (the token slots the
        policy forwards ran: ``B x L`` summed over each micro-batch's row groups)."""
        cfg = self.cfg
        for t in trajs:
            if t.reward is None:
                raise ValueError(
                    f"trajectory {t.task_id!r} has no reward; roll out with memkit.rollout.run_rollouts "
                    "(it sets Trajectory.reward) or set it yourself"
                )
        if units is None and self.credit.units is not None:  # e.g. DCPO's sampled segments
            units = self.credit.units(trajs, cfg, _units_seed(cfg.seed, trajs))
        units = [TrainingUnit.of(t) for t in trajs] if units is None else list(units)
        index = {id(t): i for i, t in enumerate(trajs)}
        if any(id(u.traj) not in index for u in units):
            raise ValueError("every TrainingUnit must hold one of the trajectories passed to update (the same object)")
        unit_traj = [index[id(u.traj)] for u in units]
        trained = torch.zeros(len(trajs), dtype=torch.bool)
        trained[list(set(unit_traj))] = True
        rewards = torch.tensor([float(t.reward) for t in trajs], dtype=torch.float32)
        group_ids = [t.task_id for t in trajs]
        # mini-batches of local units, each cut into the same number of micro-batches on every process.
        # Within a mini-batch, units of similar length share a micro-batch: rows are padded to the
        # longest one and a 2D-masked row costs O(L^2) in attention, so this saves work (``padded_tokens``)
        # without changing the update: its loss weights are normalised over the whole mini-batch however
        # it is cut (tests/rl/test_trainer.py).
        bounds = [round(i * len(units) / cfg.mini_batches) for i in range(cfg.mini_batches + 1)]
        plan = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            n_micro = max(1, self._max(math.ceil((b - a) / cfg.runtime.micro_batch_size)))
            order = list(range(a, b))
            if self.sort_micro_batches:
                order.sort(key=lambda i: units[i].n_tokens)
            plan.append(
                [
                    order[j * cfg.runtime.micro_batch_size : (j + 1) * cfg.runtime.micro_batch_size]
                    for j in range(n_micro)
                ]
            )
        if self.credit.prepare is not None:  # forwards the rule needs first (MemPO's memory probes)
            memory = self.credit.prepare(trajs, self)
        elif cfg.mem_reward.log:  # MemPO's quantity logged under any rule (Fig. 4's baseline curve)
            from memkit.rl.memory_reward import prepare_memory_reward

            memory = prepare_memory_reward(trajs, self)
        else:
            memory = {}
        exps = [
            [
                self._experience([units[i] for i in c], [unit_traj[i] for i in c], rewards, group_ids, trajs, trained)
                for c in mini
            ]
            for mini in plan
        ]
        self.join_forwards()  # (every rank ran the same forwards: _experience's idle ones)
        if self.credit.whiten and cfg.critic.whiten_advantages:
            self._whiten([e for mini in exps for e in mini])
        for e in (e for mini in exps for e in mini if e is not None):
            record_call_advantages(e.credit, e.adv)  # what is trained, after any whitening
        acc = {
            k: 0.0
            for k in (
                "pg_loss",
                "kl",
                "entropy",
                "clip_frac",
                "approx_kl",
                "ratio",
                "vf_loss",
                "vf_clip_frac",
                "tokens",
                "grad_norm",
                "critic_grad_norm",
                "n_opt",
            )
        }
        with checkpointed_training(self.policy, cfg.runtime.gradient_checkpointing):
            for mini in (mini for _ in range(cfg.ppo_epochs) for mini in exps):
                self._minibatch(mini, acc)
        live = [e for mini in exps for e in mini if e is not None]
        first = self.global_sums(
            [
                sum(e.gap for e in live),
                sum(float(e.mask.sum()) for e in live),
                sum(e.batch.n_tokens for e in live),
                sum(float((e.values if e.values is not None else e.mask * 0).sum()) for e in live),
                sum(e.padded for e in live),
            ]
        )
        keys = ("pg_loss", "kl", "entropy", "clip_frac", "approx_kl", "ratio", "vf_loss", "vf_clip_frac", "tokens")
        tot = dict(zip(keys, self.global_sums([acc[k] for k in keys])))
        n_tok, n_opt = max(tot["tokens"], 1.0), max(acc["n_opt"], 1.0)
        stats = {
            "pg_loss": tot["pg_loss"] / n_opt,
            "kl": tot["kl"] / n_tok,
            "entropy": tot["entropy"] / n_tok,
            "clip_frac": tot["clip_frac"] / n_tok,
            "approx_kl": tot["approx_kl"] / n_tok,
            "ratio": tot["ratio"] / n_tok,
            "grad_norm": acc["grad_norm"] / n_opt,
            "lr": self.sched.get_last_lr()[0],
            "old_logprob_gap": first[0] / max(first[1], 1.0),
            "trained_tokens": first[1],
            "tokens_processed": first[2],
            "padded_tokens": first[4],
        }
        stats.update(memory)
        if self.critic is not None:
            stats.update(
                vf_loss=tot["vf_loss"] / n_opt,
                vf_clip_frac=tot["vf_clip_frac"] / n_tok,
                value_mean=first[3] / max(first[1], 1.0),
                critic_grad_norm=acc["critic_grad_norm"] / n_opt,
            )
        return stats

    def memory_rows(self, trajs: list[Trajectory], bias: str, packing: str) -> list[dict]:
        """:func:`memkit.rl.memory_reward.score_memories` under the current policy with the config's
        ``mem_reward_*`` knobs (``bias`` and ``packing`` given: evaluation scores without a bias)."""
        from memkit.rl.memory_reward import score_memories

        cfg = self.cfg
        with self.acc.autocast():
            rows = score_memories(
                self.policy,
                self.tokenizer,
                trajs,
                cfg.mem_reward.context,
                bias,
                cfg.mem_reward.answer_tags,
                cfg.mem_reward.opener,
                packing,
                8 * cfg.runtime.micro_batch_size,
                cfg.runtime.attention,
                cfg.mem_reward.score,
            )
        self.join_forwards()  # ranks score different trajectories
        return rows

    def _minibatch(self, mini: list, acc: dict) -> None:
        """One optimizer step over one mini-batch (a list of micro-batch experiences)."""
        cfg, W = self.cfg, self.world
        live = [e for e in mini if e is not None]
        n_tokens, n_rows = self.global_sums(
            [sum(float(e.mask.sum()) for e in live), sum(int((e.mask.sum(-1) > 0).sum()) for e in live)]
        )
        self.opt.zero_grad(set_to_none=True)
        if self.copt is not None:
            self.copt.zero_grad(set_to_none=True)
        for j, e in enumerate(mini):
            last = j == len(mini) - 1
            with contextlib.ExitStack() as stack:
                if not last and not self.deepspeed:  # sync gradients once, on the last micro-batch
                    stack.enter_context(self.acc.no_sync(self.model))
                    if self.critic is not None:
                        stack.enter_context(self.acc.no_sync(self.critic))
                if e is None:  # an empty micro-batch still joins the gradient all-reduce
                    self._dummy_backward(last)
                    continue
                self._micro(e, loss_weights(e.mask, cfg.agg, n_tokens, n_rows), W, acc, last)
        if self.deepspeed:  # clips at cfg.max_grad_norm (configure_deepspeed), steps AdamW, zeroes the gradients
            self.model.step()
            norm = self.model.get_global_grad_norm()
            acc["grad_norm"] += float(norm) if norm is not None else math.nan
        else:
            actor = [p for p in self.model.parameters() if id(p) not in self._critic_ids]
            acc["grad_norm"] += float(self.acc.clip_grad_norm_(actor, cfg.max_grad_norm))
            self.opt.step()
        self.sched.step()
        if self.critic is not None:
            acc["critic_grad_norm"] += float(self.acc.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm))
            self.copt.step()
            self.csched.step()
        acc["n_opt"] += 1
        if not self.keep_grads:
            self.opt.zero_grad(set_to_none=True)
            if self.copt is not None:
                self.copt.zero_grad(set_to_none=True)

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        """A micro-batch's backward: accelerate's (DDP syncs outside ``no_sync``) or the DeepSpeed engine's
        with the accumulation boundary on ``last`` (:func:`memkit.rl.engines.deepspeed_backward`)."""
        deepspeed_backward(self.model, loss, last) if self.deepspeed else self.acc.backward(loss)

    def _micro(self, e: Experience, w: torch.Tensor, W: int, acc: dict, last: bool = True) -> None:
        cfg, m = self.cfg, e.mask
        want_ent = cfg.runtime.log_entropy or cfg.entropy_coef > 0
        out = self._logprobs(self.model, e.inputs, with_entropy=want_ent, loss_mask=m, groups=e.groups)
        logp, ent = out if want_ent else (out, None)
        pg_tok, pst = ppo_clip_terms(logp, e.old, e.adv, m, cfg.clip.low, cfg.clip.high, cfg.clip.ratio_c)
        pg = (pg_tok * w).sum()  # = PPO-clip aggregated over the global mini-batch (this share: loss_weights)
        loss = pg
        if e.ref is not None:
            kl_tok = kl_penalty(logp, e.ref, cfg.kl.kind)
            loss = loss + cfg.kl.coef * (kl_tok * w).sum()
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * (ent * w).sum()
        self._backward(loss * W, last)  # DDP/ZeRO average gradients over W processes; the weights sum globally
        acc["pg_loss"] += float(pg.detach())
        for k in ("clip_frac", "approx_kl", "ratio", "tokens"):  # sums over the trained tokens
            acc[k] += pst[k]
        with torch.no_grad():
            if e.ref is not None:
                acc["kl"] += float((kl_tok * m).sum())
            if ent is not None:
                acc["entropy"] += float((ent * m).sum())
        if self.critic is not None:
            with self.acc.unwrap_model(self.critic).scope():  # a shared model recomputes (checkpointing) as the critic
                values = self._values(self.critic, e.batch, e.inputs)
                vf_tok, vst = value_terms(values, e.values, e.returns, m, cfg.critic.vf_clip)
                vf = (vf_tok * w).sum()
                self.acc.backward(vf * W)
            acc["vf_loss"] += float(vf.detach())
            acc["vf_clip_frac"] += vst["vf_clip_frac"]

    def _dummy_backward(self, last: bool = True) -> None:
        ids = self._one_token()
        self._backward(self.model(input_ids=ids, use_cache=False).logits.sum() * 0.0, last)
        if self.critic is not None:
            with self.acc.unwrap_model(self.critic).scope():
                self.acc.backward(self.critic(ids).sum() * 0.0)


__all__ = ["Learner"]
