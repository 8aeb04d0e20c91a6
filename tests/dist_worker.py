"""Fixtures shared by tests/rl/test_trainer.py and its 2-process run.

As a script (``torchrun --nproc_per_node 2 tests/dist_worker.py OUT_DIR``) every process runs
``Learner.update`` on its share of a fixed synthetic batch (tasks ``rank::world``) and rank 0
saves the updated parameters to ``OUT_DIR/<algo>.pt``; the test compares them with one process
updating on the whole batch. With ``eval`` after OUT_DIR the processes run the trainer's periodic
evaluation instead (:func:`eval_rows`: a share of the held-out tasks each) and every rank saves
its rows to ``OUT_DIR/eval-<rank>.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from memkit.core.trajectory import Call, Trajectory

N_TASKS, N_SAMPLES = 5, 2  # 10 trajectories; 2 processes get 6 and 4 (uneven on purpose)
CASES = {  # algo -> config overrides used by both the 1- and the 2-process run
    "grpo": dict(algo="grpo", packing="mem1_mask", agg="token-mean", ppo_epochs=2, micro_batch_size=2),
    "ppo": dict(algo="ppo", packing="separate", agg="seq-mean-token-mean", ppo_epochs=2, micro_batch_size=2),
}


class Tok:
    """The only tokenizer attribute the update needs."""

    pad_token_id = 0


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def mem1_traj(task: int, sample: int, n_calls: int) -> Trajectory:
    """MEM1-shaped calls: ctx_t = prompt + out_{t-1} + obs_{t-1}, with refs; fixed by (task, sample)."""
    g = torch.Generator().manual_seed(1000 * task + sample)
    take = lambda n: (torch.randint(3, 100, (n,), generator=g)).tolist()  # noqa: E731
    prompt, calls = take(6), []
    for t in range(n_calls):
        ctx, refs = list(prompt), []
        if t:
            p = calls[-1]
            refs.append((len(ctx), len(ctx) + p.n_output, t - 1, "output"))
            ctx += p.output_ids
            refs.append((len(ctx), len(ctx) + len(p.observation_ids), t - 1, "observation"))
            ctx += p.observation_ids
        out = take(2 + (task + sample + t) % 5)
        calls.append(
            Call(
                turn=t,
                role="act",
                context_ids=ctx,
                output_ids=out,
                logprobs=[-2.0] * len(out),
                context_refs=refs,
                observation_ids=take(3) if t < n_calls - 1 else [],
            )
        )
    reward = float((task + 2 * sample) % 3) / 2  # varies inside each group
    return Trajectory(task_id=f"task{task}", method="mem1", calls=calls, group_index=sample, reward=reward)


def trajectories(tasks=None) -> list[Trajectory]:
    tasks = range(N_TASKS) if tasks is None else tasks
    return [mem1_traj(k, s, 1 + (k + s) % 4) for k in tasks for s in range(N_SAMPLES)]


def make_learner(algo: str, sort_micro_batches: bool = True, accelerator=None, model=None, **over):
    """A Learner of ``CASES[algo]`` with ``over`` on ``model`` (default: a fresh :func:`tiny_llama`)."""
    from memkit.rl.config import TrainConfig
    from memkit.rl.update import Learner

    kw = dict(CASES[algo], lr=1e-3, kl_coef=0.01, critic_lr=1e-3, out_dir="")
    kw.update(over)
    cfg = TrainConfig.from_flags(method="mem1", init="tiny", **kw)
    from accelerate import Accelerator

    model = tiny_llama() if model is None else model
    learner = Learner(cfg, model, Tok(), accelerator=accelerator or Accelerator(cpu=True))
    learner.sort_micro_batches = sort_micro_batches
    return learner


def models(learner) -> dict:
    """The trained modules by name: the policy and, for PPO, the critic."""
    out = {"policy": learner.policy}
    if learner.critic is not None:
        out["critic"] = learner.acc.unwrap_model(learner.critic)
    return out


def params(learner) -> dict:
    """Parameters and (with ``keep_grads``) the last mini-batch's gradients of policy and critic."""
    out = {}
    for name, model in models(learner).items():
        for k, p in model.named_parameters():
            out[f"{name}.{k}"] = p.detach().cpu().clone()
            if p.grad is not None:
                out[f"{name}.{k}.grad"] = p.grad.detach().cpu().clone()
    return out


EVAL = dict(eval_tasks=5, eval_objectives=(1, 2), max_turns=2)  # 5 tasks: 3 + 2 per process


def eval_rows(accelerator=None) -> list[dict]:
    """``Trainer.evaluate`` of the untrained tiny model (seed 0) on ``load_kit(0)``'s world."""
    from accelerate import Accelerator

    from memkit.lab.kit import load_kit
    from memkit.models.tiny import build_tiny
    from memkit.rl.config import TrainConfig
    from memkit.rl.trainer import Trainer

    kit = load_kit(0)
    cfg = TrainConfig.from_flags(algo="grpo", method="mem1", init="tiny", out_dir="", **EVAL).validate()
    model = build_tiny(kit.tokenizer, seed=0)
    trainer = Trainer(cfg, model, kit.tokenizer, kit=kit, accelerator=accelerator or Accelerator(cpu=True))
    rows = trainer.evaluate()
    assert trainer.eval_history == rows  # every rank holds the rows
    return rows


def memt_eval_rows(accelerator=None) -> list[dict]:
    """``Trainer.evaluate`` of Mem-T's tree plan: the untrained tiny model answers every question of 3
    teacher-built held-out stores (2 + 1 per process)."""
    from accelerate import Accelerator

    from memkit.lab.kit import load_kit
    from memkit.lab.memt.retrieval import memt_wrap
    from memkit.models.tiny import build_tiny
    from memkit.rl.config import TrainConfig
    from memkit.rl.trainer import Trainer

    kit = load_kit(0)
    cfg = TrainConfig.from_flags(method="memt", init="tiny", out_dir="", n_train_tasks=1, eval_tasks=3, max_turns=2)
    trainer = Trainer(
        cfg.validate(), build_tiny(kit.tokenizer, seed=0), kit.tokenizer, memt_wrap(kit), kit,
        accelerator=accelerator or Accelerator(cpu=True),
    )  # fmt: skip
    rows = trainer.evaluate()
    assert trainer.eval_history == rows
    # the answers themselves, in order (the rows of an untrained model are all zeros)
    trajs = trainer.plan.answer_shared(trainer, trainer.plan.eval_built)
    return rows + [{"answers": [(t.task_id, [c.output_ids for c in t.calls]) for t in trajs]}]


def main(out_dir: str) -> None:
    for algo in CASES:
        # micro-batches in rollout order, so both runs sum the same pairs of trajectories: the
        # comparison is about DDP; length-sorting cuts them differently per process, which changes
        # only float rounding (~3e-6 after 2 epochs of Adam), tested on one process instead
        learner = make_learner(algo, sort_micro_batches=False)
        learner.keep_grads = True
        local = trajectories(range(learner.rank, N_TASKS, learner.world))
        stats = learner.update(local)
        if learner.acc.is_main_process:
            torch.save({"params": params(learner), "stats": stats}, Path(out_dir) / f"{algo}.pt")
        learner.acc.wait_for_everyone()
    # an explicit teardown: left to interpreter exit, gloo's threads can abort a rank
    # ("terminate called without an active exception", seen once in CI)
    torch.distributed.destroy_process_group()


def worker_error(stderr: str) -> str:
    """What a failed torchrun launch says: the ranks' own error lines (a C++ ``terminate called ...`` /
    ``what():`` of a rank that aborted is printed long before the launcher's summary), then the summary's tail."""
    cause = [ln for ln in stderr.splitlines() if any(m in ln for m in ("terminate called", "what()", "Error:", "gloo"))]
    return "\n".join(cause[:20]) + "\n...\n" + stderr[-1500:]


def exit_now() -> None:
    """End a worker whose results are written without the interpreter's teardown: objects that still
    hold gloo work (FSDP2's hooks, autograd's graph) freed during finalisation can take the GIL from a
    gloo thread and abort the rank (SIGABRT) after the work is done (pytorch/pytorch#179291 describes
    it; seen once in CI each for this worker and the FSDP2 one)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[2:] in (["eval"], ["eval-memt"]):
        rows = eval_rows() if sys.argv[2] == "eval" else memt_eval_rows()
        torch.save(rows, Path(sys.argv[1]) / f"{sys.argv[2]}-{torch.distributed.get_rank()}.pt")
        torch.distributed.destroy_process_group()
    else:
        main(sys.argv[1])
    exit_now()
