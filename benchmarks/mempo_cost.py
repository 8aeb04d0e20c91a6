"""What MemPO's memory reward costs: the probe forwards as a share of a training step.

    python benchmarks/mempo_cost.py [--init PATH|tiny] [--steps 3] [--device cpu|cuda]

Runs ``--steps`` GRPO steps with credit ``mempo`` (MemPO format, 8 tasks x 4 samples of 2
questions, the lab's sizes) from ``--init`` (default: the lab's MemPO SFT checkpoint, trained when
missing; ``tiny`` = a random policy, which writes few memories) and prints, per step, the rollout,
the update and, inside the update, the memory-reward probes (every ``<mem>`` scored twice: with
mem_t and with the bias context), then the probes' share of the step. On the last step's
trajectories it also times the two probe layouts (``separate`` rows vs one ``mem1_exact`` prefix
trie per trajectory) and checks they give the same P.

(measured figures: docs/findings.md, 'Benchmarks')
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from memkit.core.cpu import keep_freed_memory
from memkit.lab.kit import load_kit
from memkit.rl.config import TrainConfig
from memkit.rl.memory_reward import PROBE_PACKINGS, answer_probability, memory_probes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="lab", help="'lab' (the lab's MemPO SFT), 'tiny' or a checkpoint dir")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    from memkit.lab.policies import load_init, prompt_wrap
    from memkit.lab.recipes import ensure_lab_sft
    from memkit.rl.engines import make_accelerator
    from memkit.rl.trainer import Trainer

    kit = load_kit(0)
    init = str(ensure_lab_sft("mempo", kit)) if args.init == "lab" else args.init
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig.from_flags(
            method="mempo",
            init=init,
            credit="mempo",
            objectives=(2,),
            lr=3e-4,
            temperature=0.5,
            steps=args.steps,
            tasks_per_step=8,
            n_samples=4,
            eval_every=0,
            save_every=0,
            device=args.device,
            out_dir=out,
        )
        model, tok, wrap = load_init(cfg, kit)
        trainer = Trainer(cfg, model, tok, prompt_wrap("mempo", tok, wrap, cfg.prompt), kit, make_accelerator(cfg))
        print(f"{'step':>4} {'rollout s':>9} {'update s':>8} {'probes s':>8} {'memories':>8} {'probe share':>11}")
        shares = []
        for _ in range(args.steps):
            row = trainer.train_step()
            share = row["mem_reward_seconds"] / row["seconds"]
            shares.append(share)
            print(
                f"{row['step']:>4} {row['seconds_rollout']:>9.2f} {row['seconds_update']:>8.2f} "
                f"{row['mem_reward_seconds']:>8.2f} {row['memories']:>8.0f} {share:>11.1%}"
            )
        print(f"probe share of a training step: mean {sum(shares) / len(shares):.1%}, max {max(shares):.1%}")

        tasks = trainer.step_tasks(trainer.step)
        trajs = trainer.rollout(tasks, cfg.n_samples, cfg.temperature, 0)
        probes = memory_probes(trajs, tok)
        results = {}
        for packing in PROBE_PACKINGS:
            t0 = time.perf_counter()
            results[packing] = answer_probability(
                trainer.policy, probes, packing, 8 * cfg.runtime.micro_batch_size, tok.pad_token_id or 0
            )
            print(f"{packing:>10}: {len(probes)} probes in {time.perf_counter() - t0:.2f} s")
        gap = float((results["separate"] - results["mem1_exact"]).abs().max()) if probes else 0.0
        print(f"max |P separate - P mem1_exact| = {gap:.2e}")


if __name__ == "__main__":
    main()
