"""RL trainer: exact gradient accumulation, 2 processes == 1 process, exact resume, GAE over
any packing, loop and CLI smoke runs on a random-init tiny policy (no learning asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dist_worker as dw
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from memkit.rl.advantages import gae_loop
from memkit.rl.config import TrainConfig
from memkit.rl.credit import trajectory_gae
from memkit.rl.critic import loss_weights
from memkit.rl.losses import aggregate
from memkit.rl.packing import pack

# |g| above 10x AdamW's eps (1e-8): there its step lr * m / (sqrt(v) + eps) barely depends on
# float rounding in g (the first step's sensitivity is lr * eps / g^2). Where an entry of g is
# itself ~eps, the first step lr * g / (|g| + eps) turns that rounding into weight changes of up
# to ~lr / 4: a 2.8e-6 gap once failed CI. Measured here (lr = 1e-3): every gap above 1e-7 sat
# on an entry with |g| < 1e-7; on the entries kept (over 98% of all) gaps are <= 4e-8.
CONDITIONED_GRAD = 1e-7


def _assert_same_update(a: dict, b: dict, conditioned: dict, grad_rel: float = 1e-5, weight_abs: float = 1e-6) -> None:
    """Gradients agree to ``grad_rel`` of their own scale (float32 rounding); weights agree to
    ``weight_abs`` (lr / 1000) on every entry that each optimizer step saw well-conditioned
    (``conditioned[name]``, from ``_run``)."""
    assert a.keys() == b.keys()
    for k in a:
        gap = (a[k] - b[k]).abs()
        if k.endswith(".grad"):
            assert float(gap.max()) <= grad_rel * float(a[k].abs().max()) + 1e-9, (k, float(gap.max()))
        elif conditioned[k].any():
            assert float(gap[conditioned[k]].max()) < weight_abs, (k, float(gap[conditioned[k]].max()))
    kept = sum(int(m.sum()) for m in conditioned.values()) / sum(m.numel() for m in conditioned.values())
    assert kept > 0.9, kept  # the weight check covers nearly every entry, or it checks nothing


def _run(algo, trajs, conditioned: dict | None = None, **over) -> dict:
    """Update a fresh learner on ``trajs``; its parameters and last gradients."""
    return _run_with_stats(algo, trajs, conditioned, **over)[0]


def _run_with_stats(algo, trajs, conditioned: dict | None = None, **over) -> tuple[dict, dict]:
    """:func:`_run`, and the update's stats."""
    learner = dw.make_learner(algo, **over)
    learner.keep_grads = True
    return _update(learner, trajs, conditioned)


def _update(learner, trajs, conditioned: dict | None = None) -> tuple[dict, dict]:
    """``learner.update(trajs)`` -> (parameters [and gradients, with keep_grads], update stats).
    ``conditioned``, if given, is filled with each parameter's mask of entries whose gradient, at
    every optimizer step, was exactly 0 or above ``CONDITIONED_GRAD``."""
    by_name = {f"{name}.{k}": p for name, model in dw.models(learner).items() for k, p in model.named_parameters()}
    names = {id(p): k for k, p in by_name.items()}
    lo = {}  # per entry: the smallest nonzero |g| any optimizer step saw

    def record(opt, *_):
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None and id(p) in names:
                    g, k = p.grad.detach().abs(), names[id(p)]
                    g = g.masked_fill(g == 0, float("inf"))  # an exact 0 (e.g. behind a zero head) adds no noise
                    lo[k] = torch.minimum(lo[k], g) if k in lo else g

    handle = register_optimizer_step_pre_hook(record)
    try:
        stats = learner.update(trajs)
    finally:
        handle.remove()
    if conditioned is not None:
        for k, p in by_name.items():  # a parameter no step saw a gradient for must not move at all
            conditioned[k] = lo[k] > CONDITIONED_GRAD if k in lo else torch.ones_like(p, dtype=torch.bool)
    return dw.params(learner), stats


# ============================================================================ exactness of the update
@pytest.mark.parametrize(
    "algo,packing,agg",
    [
        ("grpo", "mem1_mask", "token-mean"),
        ("grpo", "separate", "seq-mean-token-mean"),
        ("ppo", "mem1_exact", "token-mean"),
        ("ppo", "separate", "seq-mean-token-sum"),
    ],
)
def test_gradient_accumulation_is_exact(algo, packing, agg):
    """4 micro-batches x 2 trajectories == 1 batch of 8: same gradients and same update."""
    trajs = dw.trajectories(range(4))  # 4 tasks x 2 samples, 1-4 calls each: uneven token counts
    conditioned = {}
    one = _run(algo, trajs, conditioned, packing=packing, agg=agg, micro_batch_size=8, ppo_epochs=1)
    four = _run(algo, trajs, packing=packing, agg=agg, micro_batch_size=2, ppo_epochs=1)
    init = dw.params(dw.make_learner(algo, packing=packing))
    assert sum(k.endswith(".grad") for k in one) >= 10
    assert max(float(one[k].abs().max()) for k in one if k.endswith(".grad")) > 1e-3  # real gradients
    _assert_same_update(one, four, conditioned)
    assert max(float((one[k] - init[k]).abs().max()) for k in init) > 1e-4  # the update moved the weights


@pytest.mark.parametrize(
    "algo,packing", [("grpo", "separate"), ("ppo", "separate"), ("ppo", "mem1_exact"), ("grpo", "mem1_mask")]
)
def test_row_groups_give_the_same_update(algo, packing):
    """Each micro-batch's rows forwarded in length groups (``TrainConfig.runtime.row_groups``), each cut to
    its longest row: fewer padded slots, and the update of one forward padded to the longest row."""
    trajs = dw.trajectories(range(4))
    conditioned = {}
    one, one_stats = _run_with_stats(algo, trajs, conditioned, packing=packing, micro_batch_size=8, row_groups=1)
    grouped, grouped_stats = _run_with_stats(algo, trajs, packing=packing, micro_batch_size=8, row_groups=4)
    _assert_same_update(one, grouped, conditioned)
    assert grouped_stats["tokens_processed"] == one_stats["tokens_processed"]
    assert grouped_stats["padded_tokens"] < one_stats["padded_tokens"]
    for k in ("pg_loss", "entropy", "kl", "clip_frac"):
        assert abs(grouped_stats[k] - one_stats[k]) < 1e-5, k


def test_naive_micro_batch_mean_would_not_be_exact(monkeypatch):
    """The check above can fail: normalising each micro-batch by its own token count (then
    averaging micro-batches) changes the gradient."""
    import memkit.rl.update as U

    trajs = dw.trajectories(range(4))
    one = _run("grpo", trajs, micro_batch_size=8, ppo_epochs=1)
    monkeypatch.setattr(U, "loss_weights", lambda m, agg, n_tok, n_rows: m / (m.sum() * 4))
    naive = _run("grpo", trajs, micro_batch_size=2, ppo_epochs=1)
    grads = [k for k in one if k.endswith(".grad")]
    assert max(float((one[k] - naive[k]).abs().max()) for k in grads) > 1e-4


def test_micro_batches_group_similar_lengths():
    """Micro-batches are cut from a mini-batch sorted by trajectory length: fewer padded token slots
    than cutting it in rollout order, and (test above) the same update."""
    from memkit.core.trajectory import TrainingUnit

    trajs = dw.trajectories(range(4))
    assert len({TrainingUnit.of(t).n_tokens for t in trajs}) > 2  # uneven lengths, or there is nothing to sort
    # one forward per micro-batch (row_groups=1): grouping rows by length would hide what sorting saves
    sorted_stats = dw.make_learner("ppo", packing="mem1_exact", micro_batch_size=2, row_groups=1).update(trajs)
    plain = dw.make_learner("ppo", packing="mem1_exact", micro_batch_size=2, row_groups=1)
    plain.sort_micro_batches = False
    plain_stats = plain.update(trajs)
    assert sorted_stats["tokens_processed"] == plain_stats["tokens_processed"]
    assert sorted_stats["padded_tokens"] < plain_stats["padded_tokens"]
    assert abs(sorted_stats["pg_loss"] - plain_stats["pg_loss"]) < 1e-5


@pytest.mark.parametrize("packing", ["separate", "mem1_exact"])
def test_update_scores_the_policy_at_the_sampling_temperature(packing):
    """Rollouts at T = 0.6 record log_softmax(logits / 0.6); the update recomputes the same numbers
    (old-log-prob gap ~ 0, first PPO ratio 1). Scoring at T = 1 instead would be off by far more."""
    from memkit.models import HFBackend

    class Tok(dw.Tok):
        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    learner = dw.make_learner("grpo", packing=packing, temperature=0.6, ppo_epochs=1, recompute_old_logprobs=True)
    backend = HFBackend(learner.policy, Tok())
    backend.eos_ids = set()  # no EOS: every output keeps its length, so the calls' context_refs stay right
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for task in range(3):
        for sample in range(2):
            t = dw.mem1_traj(task, sample, 1 + (task + sample) % 3)
            for i, call in enumerate(t.calls):  # regenerate each output from its (rebuilt) context
                if i:
                    prev = t.calls[i - 1]
                    call.context_ids = t.calls[0].context_ids + prev.output_ids + prev.observation_ids
                out = backend.generate(
                    [call.context_ids], max_new_tokens=call.n_output, temperature=0.6, generator=gen
                )[0]
                call.output_ids, call.logprobs = out.ids, out.logprobs
            trajs.append(t)
    conditioned = {}
    recomputed, stats = _update(learner, trajs, conditioned)
    assert stats["old_logprob_gap"] < 1e-5, stats["old_logprob_gap"]
    assert abs(stats["ratio"] - 1.0) < 1e-4  # one mini-batch, one epoch: the policy scored is the one sampled
    at_t1 = dw.make_learner("grpo", packing=packing, temperature=1.0, recompute_old_logprobs=True).update(trajs)
    assert at_t1["old_logprob_gap"] > 100 * max(stats["old_logprob_gap"], 1e-6)
    # so for these exact packings the default (None) skips the recompute and gets the same update
    auto = dw.make_learner("grpo", packing=packing, temperature=0.6, ppo_epochs=1)
    assert auto.recompute is False
    _assert_same_update(recomputed, _update(auto, trajs)[0], conditioned)


def test_a_second_run_in_one_process_gets_its_own_precision_and_device():
    """accelerate keeps one state per process and raises when a later Accelerator asks for another
    precision (a notebook training twice), or silently keeps a GPU run on the CPU after a CPU run
    (seen on an H100; tests/models/test_gpu.py checks that side). `make_accelerator` resets it."""
    from accelerate import Accelerator

    from memkit.rl.engines import make_accelerator

    Accelerator(cpu=True)
    try:
        assert make_accelerator(TrainConfig.from_flags(device="cpu", mixed_precision="bf16")).mixed_precision == "bf16"
        with pytest.raises(ValueError, match="cannot be changed"):  # what it resets
            Accelerator(cpu=True, mixed_precision="no")
    finally:
        acc = make_accelerator(TrainConfig.from_flags(device="cpu"))  # back to the state the other tests expect
    assert acc.mixed_precision == "no" and acc.device.type == "cpu"


def test_old_logprobs_are_recomputed_only_where_they_differ():
    from memkit.rl.config import TrainConfig

    def resolved(**kw):
        return TrainConfig.from_flags(method="mem1", **kw).resolved_recompute()

    assert resolved(packing="mem1_mask") and resolved(packing="auto")  # mem1 -> mem1_mask: App. B.7's gap
    assert not resolved(packing="mem1_exact") and not resolved(packing="separate")
    assert resolved(packing="separate", mixed_precision="bf16")  # rollout fp32, update bf16
    assert not resolved(packing="mem1_mask", recompute_old_logprobs=False)  # an explicit choice wins


def test_loss_weights_reproduce_aggregate_over_split_rows():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(6, 9, generator=g, dtype=torch.float64)
    m = (torch.rand(6, 9, generator=g) < 0.6).double()
    m[2] = 0  # a row with nothing trained
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        n_tok, n_rows = float(m.sum()), float((m.sum(-1) > 0).sum())
        split = sum(
            float((loss_weights(m[a:b], agg, n_tok, n_rows) * v[a:b]).sum()) for a, b in ((0, 1), (1, 4), (4, 6))
        )
        assert split == pytest.approx(float(aggregate(v, m, agg)), abs=1e-12)


@pytest.mark.slow  # two torchrun processes (gloo): make test runs it, make test-fast does not
def test_two_processes_match_one_process(tmp_path):
    """torchrun 2 x gloo (Accelerator(cpu=True)), tasks split 3/2 between processes (one empty
    micro-batch), 2 PPO epochs: same parameters and gradients as one process on all of it."""
    worker = Path(__file__).parents[1] / "dist_worker.py"
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(worker.parent.parent), str(worker.parent)])
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(worker),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:  # one retry for the launcher, not the numbers: a rank once aborted in gloo's
        first = dw.worker_error(proc.stderr)  # thread teardown in CI ("terminate called without an active exception")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, f"failed twice; first:\n{first}\nsecond:\n{dw.worker_error(proc.stderr)}"
    for algo in dw.CASES:
        two = torch.load(tmp_path / f"{algo}.pt")
        conditioned = {}
        one = _run(algo, dw.trajectories(), conditioned, sort_micro_batches=False)  # as the workers (dist_worker.main)
        _assert_same_update(one, two["params"], conditioned)
        assert two["stats"]["trained_tokens"] == sum(c.n_output for t in dw.trajectories() for c in t.calls)


@pytest.mark.slow  # two torchrun processes roll out the held-out tasks (gloo)
@pytest.mark.parametrize("mode", ["eval", "eval-memt"])
def test_two_processes_evaluate_as_one_process(tmp_path, mode):
    """The periodic evaluation split between 2 processes gives every rank the rows one process
    computes: chains (3 + 2 held-out tasks at each count) and Mem-T's trees (2 + 1 held-out stores,
    every question of each)."""
    worker = Path(__file__).parents[1] / "dist_worker.py"
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(worker.parent.parent), str(worker.parent)])
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(worker), str(tmp_path), mode], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, dw.worker_error(proc.stderr)
    one = dw.eval_rows() if mode == "eval" else dw.memt_eval_rows()
    assert [r.get("k") for r in one] == ([1, 2] if mode == "eval" else [None, None])
    for rank in (0, 1):
        two = torch.load(tmp_path / f"{mode}-{rank}.pt")
        assert [sorted(r) for r in two] == [sorted(r) for r in one]
        for a, b in zip(one, two):
            if "answers" in a:  # Mem-T: the same answers, question by question, in one process's order
                assert a["answers"] == [(tid, ids) for tid, ids in b["answers"]] and len(a["answers"]) > 3
            else:
                assert {key: pytest.approx(v, abs=1e-9) for key, v in a.items()} == b


# ============================================================================ PPO credit assignment
def test_trajectory_gae_is_the_same_for_every_packing():
    """GAE runs over each trajectory's trained tokens in call order, whatever the packing: the
    value after a call's last token is the next call's first (MEM1 §3.2)."""
    trajs = dw.trajectories(range(3))
    rewards = torch.tensor([float(i % 3) for i in range(len(trajs))])
    per_mode = {}
    for mode in ("separate", "mem1_mask", "mem1_exact"):
        b = pack(trajs, mode)
        values = torch.sin(b.input_ids.float()) * b.loss_mask  # V depends on the token only
        adv, ret = trajectory_gae(b, values, rewards, gamma=0.9, lam=0.8)
        rows = b.unit_index[:, None].expand_as(b.input_ids)
        keep = b.loss_mask > 0
        order = sorted(zip(rows[keep].tolist(), b.call_ids[keep].tolist(), range(int(keep.sum()))))
        per_mode[mode] = [adv[keep][k].item() for *_, k in order]
        if mode == "separate":  # loop reference: concatenate each trajectory's output tokens
            for i, tr in enumerate(trajs):
                toks = [x for c in tr.calls for x in c.output_ids]
                v = torch.sin(torch.tensor(toks, dtype=torch.float32))[None]
                r = torch.zeros_like(v)
                r[0, -1] = rewards[i]
                ref_adv, _ = gae_loop(r, v, torch.ones_like(v), 0.9, 0.8)
                got = [a for (row, _, _), a in zip(order, per_mode[mode]) if row == i]
                assert got == pytest.approx(ref_adv[0], abs=1e-5)
    assert per_mode["mem1_mask"] == pytest.approx(per_mode["separate"], abs=1e-6)
    assert per_mode["mem1_exact"] == pytest.approx(per_mode["separate"], abs=1e-6)


# ============================================================================ the loop
def _loop_cfg(out: Path, steps: int, **over) -> TrainConfig:
    kw = dict(
        algo="ppo",
        method="mem1",
        init="tiny",
        steps=steps,
        tasks_per_step=2,
        n_samples=2,
        micro_batch_size=2,
        lr=1e-3,
        entropy_coef=0.01,
        warmup_steps=3,
        save_every=2,
        eval_every=2,
        eval_tasks=2,
        keep_checkpoints=1,
        max_turns=2,
        objectives=(1,),
        eval_objectives=(1,),
        n_train_tasks=64,
        out_dir=str(out),
    )  # short episodes from a small pool: what the loop does, not what it learns
    kw.update(over)
    return TrainConfig.from_flags(**kw)


def test_resume_continues_exactly(kit, tmp_path):
    """4 steps straight == 2 steps, a fresh process state resumed from the checkpoint, 2 more:
    identical parameters and history. PPO (critic, two optimizers, warmup schedulers); the
    random policy earns no reward, so the entropy bonus and KL are what move it."""
    from memkit.lab.runs import train
    from memkit.models import load_policy

    a = train(_loop_cfg(tmp_path / "a", 4), kit, progress=False)
    train(_loop_cfg(tmp_path / "b", 2), kit, progress=False)
    with pytest.raises(ValueError, match="config differs"):
        train(_loop_cfg(tmp_path / "b", 4, algo="grpo"), kit, progress=False, resume=True)
    # a checkpoint written before TrainConfig had `credit` resumes as credit="auto" (here: gae)
    meta_path = next((tmp_path / "b" / "checkpoints").glob("step-*")) / "memkit.json"
    meta = json.loads(meta_path.read_text())
    del meta["config"]["credit"]
    meta_path.write_text(json.dumps(meta))
    b = train(_loop_cfg(tmp_path / "b", 4), kit, progress=False, resume=True)

    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    init = dw_params_tiny(kit)
    assert max(float((sa[k].cpu() - init[k]).abs().max()) for k in init) > 1e-4  # .cpu(): on a GPU too
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]  # noqa: E731
    assert strip(a.history) == strip(b.history) and len(a.history) == 4
    assert a.eval_history == b.eval_history and [e["step"] for e in a.eval_history] == [0, 2, 4]
    by_kind = [{k: v for k, v in e.items() if k.startswith("em_")} for e in a.eval_history]  # metrics.em_by_kind
    assert all(row and all(0.0 <= v <= 1.0 for v in row.values()) for row in by_kind)
    # run files: logs, one kept checkpoint named by `latest`, no temp dirs, a loadable policy
    run = tmp_path / "b"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4
    assert len((run / "metrics.csv").read_text().splitlines()) == 5
    assert {
        "reward_mean",
        "em",
        "kl",
        "entropy",
        "clip_frac",
        "peak_tokens",
        "tokens_processed",
        "seconds",
        "vf_loss",
    } <= set(json.loads((run / "metrics.jsonl").read_text().splitlines()[-1]))
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["latest", "step-000004"] and b.path == run / "checkpoints" / "step-000004"
    # the policy loads from its own dir, the checkpoint, the run's checkpoints/ or the run itself
    for where in (b.path / "policy", b.path, run / "checkpoints", run):
        loaded = load_policy(str(where))
        assert torch.equal(loaded.model.state_dict()["model.embed_tokens.weight"], sa["model.embed_tokens.weight"])


def test_wall_clock_budget_stops_evaluates_and_saves(kit, tmp_path):
    """`max_seconds`: the loop stops before a step would start past the budget, and the stop
    ends like a finished run (a final eval at the stop step, a checkpoint of it)."""
    from memkit.lab.runs import train

    res = train(_loop_cfg(tmp_path / "r", 50, max_seconds=1e-3, eval_every=10, save_every=10), kit, progress=False)
    assert len(res.history) == 1  # the first step starts inside the budget and overruns it
    assert [e["step"] for e in res.eval_history] == [0, 1]
    assert res.path == tmp_path / "r" / "checkpoints" / "step-000001" and (res.path / "policy").is_dir()
    with pytest.raises(ValueError, match="--max-seconds"):
        TrainConfig.from_flags(max_seconds=0).validate()


def test_rollout_token_budget_stops_evaluates_and_saves(kit, tmp_path):
    """`max_rollout_tokens`: the loop stops before a step would start once the tokens generated in training
    rollouts reach the budget (the equal-tokens comparison of two arms), and ends like a finished run."""
    from memkit.lab.runs import train
    from memkit.metrics.efficiency import rollout_tokens

    first = rollout_tokens(train(_loop_cfg(tmp_path / "a", 1, eval_every=0), kit, progress=False).history)
    assert first > 0
    res = train(_loop_cfg(tmp_path / "b", 50, max_rollout_tokens=first + 1, eval_every=10, save_every=10), kit,
                progress=False)  # fmt: skip
    assert len(res.history) == 2  # step 1 (the same rollouts) leaves the budget unspent by one token, step 2 spends it
    assert rollout_tokens(res.history) >= first + 1 and rollout_tokens(res.history[:1]) == first
    assert [e["step"] for e in res.eval_history] == [0, 2]
    assert res.path == tmp_path / "b" / "checkpoints" / "step-000002"
    assert rollout_tokens([{"seconds": 1.0}]) == 0  # a row without rollout stats counts nothing
    with pytest.raises(ValueError, match="--max-rollout-tokens"):
        TrainConfig.from_flags(max_rollout_tokens=0).validate()


def test_task_pool_replaces_the_training_tasks(kit, tmp_path):
    """`Trainer.task_pool`: every step draws its tasks from it (the overfitting diagnostic trains
    on the evaluation tasks this way); the default pool asks only RL questions (none SFT cloned,
    none evaluated), `question_split` picks another side; empty refuses."""
    from memkit.models.tiny import build_tiny
    from memkit.rl.trainer import Trainer
    from memkit.world import make_tasks, question_split

    tr = Trainer(_loop_cfg(tmp_path / "p", 1).validate(), build_tiny(kit.tokenizer, seed=0), kit.tokenizer, kit=kit)
    held_out = {t.prompt for t in make_tasks(kit.world, n=32, k=2, seed=1002)}
    assert not held_out & {t.prompt for s in range(20) for t in tr.step_tasks(s)}
    sides = lambda trainer: {question_split(q.id) for s in range(5) for t in trainer.step_tasks(s) for q in t.questions}  # noqa: E731
    assert sides(tr) == {"rl"}
    cfg = _loop_cfg(tmp_path / "q", 1, question_split="sft").validate()
    assert sides(Trainer(cfg, build_tiny(kit.tokenizer, seed=0), kit.tokenizer, kit=kit)) == {"sft"}
    with pytest.raises(ValueError, match="question_split"):
        TrainConfig(question_split="test").validate()
    tr.task_pool = make_tasks(kit.world, n=3, k=2, seed=1002)
    drawn = {t.prompt for s in range(20) for t in tr.step_tasks(s)}
    assert drawn == {t.prompt for t in tr.task_pool}
    tr.task_pool = []
    with pytest.raises(ValueError, match="task_pool is empty"):
        tr.step_tasks(0)


def test_training_tasks_never_use_evaluation_seeds(kit):
    """Seed 10 used to draw its 2-question training tasks from seed 1002, the test tasks of
    `evaluation.evaluate` and of every notebook's final table. No training seed lands in
    EVAL_SEEDS now, seeds 0-9 keep the values the cached SFT models were trained on, and
    TrainConfig.eval.seed refuses seeds outside EVAL_SEEDS."""
    from memkit.world import EVAL_SEEDS, make_tasks, training_seed, training_tasks

    assert not {training_seed(s, k) for s in range(-3, 200) for k in range(1, 17)} & set(EVAL_SEEDS)
    assert [training_seed(s, 2) for s in (0, 1, 9)] == [2, 102, 902]
    test = {t.prompt for t in make_tasks(kit.world, n=50, k=2, seed=1002, split="test")}
    assert not test & {t.prompt for t in training_tasks(kit.world, (2,), 200, seed=10)}
    for bad in (0, 902, 9_998):  # a training seed, one more, and a base whose k = 2 leaves the range
        with pytest.raises(ValueError, match="eval.seed=.*--eval-seed"):
            TrainConfig.from_flags(eval_seed=bad).validate()
    TrainConfig.from_flags(eval_seed=3000, eval_objectives=(1, 2, 8)).validate()


def test_eval_seed_picks_the_evaluation_tasks(kit, tmp_path, monkeypatch):
    """The periodic evaluation rolls out make_tasks(seed=eval_seed + k): the default is the test
    tasks (a prefix of evaluation.evaluate's), another base a disjoint validation set."""
    from memkit.models.tiny import build_tiny
    from memkit.rl.trainer import Trainer
    from memkit.world import make_tasks

    seen, rollout = [], Trainer.rollout
    monkeypatch.setattr(Trainer, "rollout", lambda self, tasks, *a: seen.append(tasks) or rollout(self, tasks, *a))
    for eval_seed in (1000, 3000):
        cfg = _loop_cfg(
            tmp_path / str(eval_seed), 1, eval_tasks=2, eval_seed=eval_seed, eval_objectives=(2,)
        ).validate()
        Trainer(cfg, build_tiny(kit.tokenizer, seed=0), kit.tokenizer, kit=kit).evaluate()
    test = [t.prompt for t in make_tasks(kit.world, n=50, k=2, seed=1002, split="test")]
    assert [t.prompt for t in seen[0]] == test[:2]
    assert not {t.prompt for t in seen[1]} & set(test)


def dw_params_tiny(kit):
    from memkit.models import build_tiny

    return build_tiny(kit.tokenizer, seed=0).state_dict()


def test_cli_train_lora_grpo_smoke(kit, tmp_path, capsys):
    """`memkit train` end to end: GRPO, MemSearcher (memory calls, separate packing), LoRA."""
    from memkit.cli import main

    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "--algo",
            "grpo",
            "--method",
            "memsearcher",
            "--init",
            "tiny",
            "--lora",
            "--steps",
            "1",
            "--tasks-per-step",
            "2",
            "--n",
            "2",
            "--eval-every",
            "1",
            "--eval-tasks",
            "2",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--temperature",
            "0.5",
            "--mini-batches",
            "2",
            "--method-kwargs",
            '{"reward_metric": "em"}',
            "--max-turns",
            "2",
            "--objectives",
            "1",
            "--eval-objectives",
            "1",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "step    1" in text and (out / "metrics.csv").is_file() and (out / "eval.jsonl").is_file()
    ckpt = out / "checkpoints" / "step-000001"
    assert (ckpt / "policy" / "adapter_config.json").is_file()
    config = json.loads((ckpt / "memkit.json").read_text())["config"]
    assert (config["temperature"], config["mini_batches"], config["max_turns"]) == (
        0.5,
        2,
        2,
    )  # the flags reach the run
    assert config["method_kwargs"] == {"reward_metric": "em"}


def test_validate_checks_every_field_with_choices_from_its_metadata():
    """One rule for every ``field(metadata={"choices": ...})``: a value outside them is named with the
    choices (the same list the CLI's flag offers), whichever field it is."""
    import dataclasses
    import re
    from dataclasses import fields, replace

    base, checked = TrainConfig(), []
    for f in fields(TrainConfig):  # top-level fields, and the nested rule configs' (mem_reward, dcpo, mot)
        if "choices" in f.metadata:
            checked.append((f.name, replace(base, **{f.name: "nope"})))
        elif dataclasses.is_dataclass(inner := getattr(base, f.name)):
            checked += [
                (f"{f.name}.{g.name}", replace(base, **{f.name: replace(inner, **{g.name: "nope"})}))
                for g in fields(inner)
                if "choices" in g.metadata
            ]
    assert len(checked) >= 18
    for name, cfg in checked:
        with pytest.raises(
            ValueError, match=rf"TrainConfig\.{re.escape(name)}='nope'( \(flag --[a-z-]+\))?: choose one of "
        ):
            cfg.validate()
    with pytest.raises(ValueError, match="test is evaluation's"):  # a field's hint rides along
        TrainConfig(question_split="test").validate()


def test_bad_inputs_name_the_fix(tmp_path, capsys, monkeypatch):
    from memkit.cli import main

    monkeypatch.setenv(
        "MEMKIT_CACHE", str(tmp_path / "empty-cache")
    )  # no SFT'd model, whatever the caller's cache holds
    with pytest.raises(ValueError, match="choose one of"):
        TrainConfig(algo="dpo").validate()
    with pytest.raises(ValueError, match="n_samples"):
        TrainConfig(n_samples=1).validate()
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({"algo": "grpo", "lr_actor": 1.0})
    with pytest.raises(
        ValueError, match=r"method_kwargs.*unexpected keyword argument 'reward'.*memkit.agents.memsearcher"
    ):
        TrainConfig(method="memsearcher", method_kwargs={"reward": "em"}).validate()
    with pytest.raises(ValueError, match="method_kwargs.*reward_metric must be one of"):
        TrainConfig(method="memsearcher", method_kwargs={"reward_metric": "bleu"}).validate()
    with pytest.raises(SystemExit):  # argparse: one usage line and the reason, exit status 2
        main(["train", "--method", "memsearcher", "--method-kwargs", "{reward_metric: em}"])
    assert "expected a JSON object" in capsys.readouterr().err
    rc = main(["train", "--method", "mem1", "--init", "tiny-sft", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "memkit sft --method mem1" in err and len(err.strip().splitlines()) == 1
    rc = main(["train", "--method", "mem1", "--init", "tiny", "--max-minutes", "0", "--out", str(tmp_path / "y")])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-seconds" in err and len(err.strip().splitlines()) == 1


def test_train_rolls_out_with_the_prompt_sft_used(kit, tmp_path, monkeypatch):
    """The tiny model is SFT'd on the compact instruction; `train()` must roll it out with that
    prompt (TrainConfig.prompt="auto"), not the paper's, which the model has never seen."""
    from memkit.agents import get_method
    from memkit.lab import runs as tr
    from memkit.lab.policies import prompt_wrap
    from memkit.world import make_tasks

    method = get_method("mem1")
    segs = method.next_call(method.new_state(make_tasks(kit.world, n=1, k=2, seed=3)[0])).segments
    text = lambda wrap: "".join(s.text for s in (wrap(segs) if wrap else segs))  # noqa: E731
    compact, paper = (
        text(prompt_wrap("mem1", kit.tokenizer, None, "auto")),
        text(prompt_wrap("mem1", kit.tokenizer, None, "paper")),
    )
    assert compact.startswith("Format: mem1") and len(compact) < len(paper) / 2
    with pytest.raises(ValueError, match="prompt must be one of"):
        prompt_wrap("mem1", kit.tokenizer, None, "short")

    seen = {}

    class Stop(Exception):
        pass

    class Probe(tr.Trainer):
        def train_step(self):
            seen["context"] = text(self.wrap)
            raise Stop

    monkeypatch.setattr(tr, "Trainer", Probe)
    with pytest.raises(Stop):
        tr.train(_loop_cfg(tmp_path / "p", 1), kit, progress=False)
    assert seen["context"] == compact
    with pytest.raises(ValueError, match="TrainConfig.prompt"):
        _loop_cfg(tmp_path / "q", 1, prompt="short").validate()


def test_readme_train_commands_parse_to_the_notebooks_settings():
    """The `memkit train` lines of the README and docs/reference.md are what a reader copies to
    redo notebooks 02-05 from the shell: they must parse, validate, and carry the notebooks' settings, not the library's
    large-model defaults (lr 1e-5, T = 1) under which the tiny model barely moves."""
    import ast
    import re
    import shlex
    from pathlib import Path

    from memkit.cli import build_parser
    from memkit.cli.train import train_config
    from memkit.course.nb import declared_parameters

    root = Path(__file__).resolve().parents[2]
    readme = "\n".join((root / p).read_text() for p in ("README.md", "docs/reference.md")).replace("\\\n", " ")
    lines = [ln.split("#")[0] for ln in readme.splitlines() if re.match(r"memkit train --algo", ln)]
    cfgs = {c.method: c for c in (train_config(build_parser().parse_args(shlex.split(ln)[1:])) for ln in lines)}
    assert set(cfgs) == {"mem1", "memsearcher", "mempo", "memact"}
    mem1, ms, mp, ma = cfgs["mem1"], cfgs["memsearcher"], cfgs["mempo"], cfgs["memact"]
    # notebook 02's default RL_ALGO (its deviation 4) and full-mode sizes, read from the notebook itself
    nb_path = Path(__file__).resolve().parents[2] / "notebooks" / "02_mem1_masked_trajectories.ipynb"
    nb02 = "".join("".join(c["source"]) for c in json.loads(nb_path.read_text())["cells"] if c["cell_type"] == "code")
    assert mem1.algo == ast.literal_eval(declared_parameters(nb_path)["RL_ALGO"]) == "grpo"
    assert f"n_samples={mem1.n_samples}, mini_batches={mem1.mini_batches}," in nb02
    assert (mem1.packing, mem1.tasks_per_step, mem1.n_samples, mem1.mini_batches) == ("mem1_exact", 8, 4, 1)
    assert (mem1.lr, mem1.temperature, mem1.eval.objectives) == (3e-4, 0.5, (1, 2, 4, 8, 16))
    assert "EVAL_KS = (1, 2, 4, 8, 16)" in nb02 and mem1.eval.every >= mem1.steps  # evaluated at the start and end
    assert (ms.algo, ms.packing, ms.agg, ms.tasks_per_step, ms.n_samples) == (
        "grpo",
        "separate",
        "seq-mean-token-mean",
        8,
        5,
    )
    assert (ms.lr, ms.temperature, ms.eval.seed, ms.eval.every) == (3e-4, 0.5, 3000, 10)
    # the lab's minutes of RL from the lab's SFT recipe (memkit.lab.recipes), which tiny-sft:flaw-fe names
    from memkit.lab.recipes import LAB_RL_MINUTES, lab_sft_config

    assert mem1.steps == ms.steps == 300 and mem1.budget.seconds == ms.budget.seconds == LAB_RL_MINUTES * 60
    assert mem1.init == ms.init == mp.init == "tiny-sft:flaw-fe"
    # notebook 04's arms: MemPO's own credit rule (the baseline is --credit grpo), its per-step sizes
    nb04 = "".join(
        "".join(c["source"])
        for c in json.loads((nb_path.parent / "04_mempo_memory_reward.ipynb").read_text())["cells"]
        if c["cell_type"] == "code"
    )
    assert mp.resolved_credit() == "mempo" and 'dict(credit="grpo"' in nb04 and 'dict(credit="mempo")' in nb04
    assert (mp.tasks_per_step, mp.n_samples, mp.lr, mp.temperature, mp.objectives) == (8, 4, 3e-4, 0.5, (2,))
    assert "tasks_per_step=mnb.smoke_scale(SMOKE, 2, 8)" in nb04 and "n_samples=mnb.smoke_scale(SMOKE, 2, 4)" in nb04
    # notebook 05's arms: DCPO's credit and packing, eq. 5-6's per-segment aggregation, 2-question evals
    nb05 = "".join(
        "".join(c["source"])
        for c in json.loads((nb_path.parent / "05_memact_dcpo.ipynb").read_text())["cells"]
        if c["cell_type"] == "code"
    )
    assert (ma.resolved_credit(), ma.resolved_packing(), ma.agg, ma.eval.objectives) == (
        "dcpo",
        "mem1_exact",
        "seq-mean-token-mean",
        (2,),
    )
    assert (ma.tasks_per_step, ma.n_samples, ma.lr, ma.temperature, ma.objectives) == (8, 4, 3e-4, 0.5, (2,))
    assert 'agg="seq-mean-token-mean"' in nb05 and "KS = (2,)" in nb05 and ma.init == "tiny-sft:flaw-fe"
    for method in ("mem1", "memsearcher", "mempo", "memact", "react", "amem"):  # the head-to-head's clones too
        lab = lab_sft_config(method)
        assert (lab.oracle.flaw, lab.steps, lab.objectives, lab.max_seconds, lab.init) == (
            "forget_earlier",
            1500,
            (1, 2),
            None,
            "base",
        )


def test_objectives_take_one_count_or_several():
    """``objectives=1`` (one count, as a script writes it) and ``objectives=[1, 2]`` both give a tuple,
    for the run and for its evaluation group."""
    one = TrainConfig.from_flags(method="mem1", objectives=1, eval_objectives=2)
    assert one.objectives == (1,) and one.eval.objectives == (2,)
    assert TrainConfig.from_flags(method="mem1", objectives=[1, 2]).objectives == (1, 2)


def test_from_dict_folds_the_flat_knobs_of_older_checkpoints():
    """Checkpoints written before the groups were nested hold every knob flat (``mem_reward_bias``,
    ``eval_every``, ``kl_coef``, ``attention``, ``lora``, ``gamma``...): they load into ``cfg.mem_reward.bias``,
    ``cfg.eval.every`` and so on, under the same names as the flags; a round trip is exact."""
    from dataclasses import replace

    from memkit.core.fields import flat_names

    old = {flat: path for path, flat, _ in flat_names(TrainConfig)}  # an older checkpoint's keys  (one knob per name)
    assert len(old) == len(list(flat_names(TrainConfig))) and {
        "eval_every",
        "kl_coef",
        "attention",
        "lora",
        "lora_r",
        "gamma",
        "critic_lr",
        "keep_checkpoints",
        "mem_reward_bias",
        "mot_alpha",
        "dcpo_segments",
    } <= set(old)
    flat = {k: v for k, v in TrainConfig().to_dict().items() if not isinstance(v, dict) or k == "method_kwargs"}
    cfg = TrainConfig.from_dict(
        {
            **flat,
            "mem_reward_bias": "none",
            "dcpo_segments": 3,
            "mot_alpha": 0.8,
            "eval_every": 5,
            "kl_coef": 0.0,
            "attention": "dense",
            "lora": True,
            "lora_r": 4,
            "gamma": 0.9,
            "keep_checkpoints": 3,
            "eval_objectives": [1, 2],
        }
    )
    assert (cfg.mem_reward.bias, cfg.dcpo.segments, cfg.mot.alpha, cfg.eval.every, cfg.kl.coef) == (
        "none",
        3,
        0.8,
        5,
        0.0,
    )
    assert (cfg.runtime.attention, cfg.lora.enabled, cfg.lora.r, cfg.critic.gamma, cfg.save.keep) == (
        "dense",
        True,
        4,
        0.9,
        3,
    )
    assert (
        cfg.eval.objectives == (1, 2) and cfg.mem_reward.norm == "pooled" and cfg.lora.alpha == 32
    )  # the rest: defaults
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.with_flags(kl_coef=0.01).kl == replace(cfg.kl, coef=0.01) and cfg.kl.coef == 0.0  # a copy
    assert TrainConfig.from_flags(eval_every=0, micro_batch_size=2) == replace(
        TrainConfig(),
        eval=replace(TrainConfig().eval, every=0),
        runtime=replace(TrainConfig().runtime, micro_batch_size=2),
    )
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields \['mot_beta'\]"):
        TrainConfig.from_dict({"mot_beta": 1.0})


def test_train_config_groups_its_knobs_and_keeps_every_flag():
    """``TrainConfig`` has at most 40 top-level fields (the knobs of one concern live in its group: LoRA,
    clip, KL, critic, the rules, eval, checkpoints, runtime), and ``memkit train`` offers every leaf
    knob under its flat name, the flag it had before the groups (``--kl-coef``, ``--attention``, ``--lora``)."""
    import dataclasses

    from memkit.cli import build_parser
    from memkit.cli.train import train_config
    from memkit.core.fields import flat_names

    assert len(dataclasses.fields(TrainConfig)) <= 40
    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith(" train"))
    offered = {s for a in train._actions for s in a.option_strings}
    assert {"--" + flat.replace("_", "-") for _, flat, _ in flat_names(TrainConfig)} <= offered
    cfg = train_config(
        parser.parse_args(
            [
                "train",
                "--method",
                "mem1",
                "--kl-coef",
                "0",
                "--attention",
                "dense",
                "--lora",
                "--gamma",
                "0.9",
                "--eval-every",
                "3",
                "--keep-checkpoints",
                "4",
            ]
        )
    )
    assert (cfg.kl.coef, cfg.runtime.attention, cfg.lora.enabled, cfg.critic.gamma, cfg.eval.every, cfg.save.keep) == (
        0.0,
        "dense",
        True,
        0.9,
        3,
        4,
    )
