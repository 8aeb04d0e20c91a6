"""What one RL update costs, and what two choices save, measured in one run on the same rollouts.

    python benchmarks/update_cost.py [--method mem1] [--tasks 8] [--n 4] [--repeats 2]

Rolls out one training batch (``--tasks`` x ``--n`` trajectories at T = 1) with the SFT'd tiny
model when ``memkit sft --method M`` has cached one (else a fresh tiny model), then times
``Learner.update`` on exactly those trajectories five ways (best of ``--repeats``, at
``--threads`` torch threads, 1 by default): the four combinations of

* micro-batches cut in rollout order vs. from the length-sorted mini-batch
  (``Learner.sort_micro_batches``): same update, fewer padded token slots. It matters most for
  MEM1's 2D-masked rows, whose dense attention grows with the square of the longest row;
* old log-probs recomputed by a packed forward (``recompute_old_logprobs=True``, verl's
  default) vs. taken from the rollout: one forward pass less, and exact for ``separate`` /
  ``mem1_exact`` packing (their packed log-probs equal the rollout's, tests/rl/test_rl_core.py).

and, fifth, both choices with each micro-batch's rows run as up to ``TrainConfig.runtime.row_groups``
(4) forwards of similar-length rows, each cut to its own longest row (``packing.length_groups``;
the same update, tests/rl/test_trainer.py).

The batches are ``SETUPS``: MEM1 PPO with mem1_exact rows (8 tasks x 4 samples, with a critic)
by default, MemSearcher GRPO with separate rows (4 x 5) under ``--method memsearcher``.

It prints each update's time, tokens and padded token slots, then the speed-ups over "recomputed,
rollout order": sorted, from rollout, both, and rows in length groups (also over "both"). These
ratios are why, by default, the learner sorts micro-batches and ``TrainConfig`` recomputes old
log-probs only where they differ from the rollout's (``recompute_old_logprobs=None``) and groups
rows: the same update with
fewer padded slots and fewer forwards, which RL runs with a wall-clock budget turn into steps.

(measured figures: docs/findings.md, 'Benchmarks')
"""

from __future__ import annotations

import argparse
import time

import torch

from memkit.core.cpu import keep_freed_memory
from memkit.lab.kit import load_kit
from memkit.lab.policies import load_init, prompt_wrap, sft_checkpoint_path
from memkit.rl.config import TrainConfig
from memkit.rl.engines import make_accelerator
from memkit.rl.trainer import Trainer

SETUPS = {  # the notebooks' full-mode batches (TrainConfig fields)
    "mem1": dict(
        algo="ppo",
        packing="mem1_exact",
        agg="token-mean",
        mini_batches=1,
        critic_lr=1e-3,
        tasks_per_step=8,
        n_samples=4,
    ),
    "memsearcher": dict(
        algo="grpo", packing="separate", agg="seq-mean-token-mean", mini_batches=2, tasks_per_step=4, n_samples=5
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="mem1", choices=sorted(SETUPS))
    ap.add_argument("--tasks", type=int, default=None, help="tasks per batch (default: the notebook's)")
    ap.add_argument("--n", type=int, default=None, help="samples per task (default: the notebook's)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the memkit CLI does; MEMKIT_KEEP_FREED_MEMORY=0 to compare
    kit = load_kit(0)
    setup = dict(SETUPS[args.method])
    setup["tasks_per_step"] = args.tasks or setup["tasks_per_step"]
    setup["n_samples"] = n = args.n or setup["n_samples"]
    init = "tiny-sft" if sft_checkpoint_path(args.method, kit.world_seed).exists() else "tiny"

    def trainer_for(recompute: bool, sort: bool, row_groups: int = 1) -> Trainer:  # fresh: each update starts alike
        cfg = TrainConfig.from_flags(
            method=args.method,
            init=init,
            objectives=(2,),
            lr=3e-4,
            eval_every=0,
            save_every=0,
            out_dir="",
            recompute_old_logprobs=recompute,
            row_groups=row_groups,
            **setup,
        )
        model, tok, wrap = load_init(cfg, kit)
        trainer = Trainer(cfg, model, tok, prompt_wrap(cfg.method, tok, wrap, cfg.prompt), kit, make_accelerator(cfg))
        trainer.sort_micro_batches = sort
        return trainer

    first = trainer_for(True, False)
    trajs = first.rollout(first.step_tasks(0), n, 1.0, 0)
    print(
        f"policy={init} method={args.method} algo={first.cfg.algo} packing={first.packing} "
        f"trajectories={len(trajs)} threads={torch.get_num_threads()}"
    )
    rows = []
    groups = TrainConfig().row_groups
    for recompute, sort, row_groups in [
        (True, False, 1),
        (True, True, 1),
        (False, False, 1),
        (False, True, 1),
        (False, True, groups),
    ]:
        best, stats = float("inf"), None
        for _ in range(args.repeats):
            trainer = trainer_for(recompute, sort, row_groups)
            t0 = time.perf_counter()
            stats = trainer.update(trajs)
            best = min(best, time.perf_counter() - t0)
        rows.append(best)
        print(
            f"old log-probs {'recomputed' if recompute else 'from rollout':12}  micro-batches "
            f"{'length-sorted' if sort else 'rollout order':13}  row groups {row_groups}  update {best:6.2f} s   "
            f"tokens {int(stats['tokens_processed'])}  padded slots {int(stats['padded_tokens'])}"
        )
    print(
        f"speed-up over recomputed + rollout order: sorted {rows[0] / rows[1]:.2f}x, "
        f"from rollout {rows[0] / rows[2]:.2f}x, both {rows[0] / rows[3]:.2f}x, "
        f"and rows in {groups} length groups {rows[0] / rows[4]:.2f}x ({rows[3] / rows[4]:.2f}x over both)"
    )


if __name__ == "__main__":
    main()
