"""What DCPO's segments cost against the other ways to train a MemAct trajectory.

    python benchmarks/dcpo_cost.py [--objectives 2,4,8] [--tasks 16] [--device cpu|cuda]

On the flawed teacher's MemAct rollouts (the lab's oracle, ``--tasks`` tasks per objective count)
it packs every call of every trajectory three ways and times one no-grad forward of each with
the tiny model:

- ``separate``: one causal row per call (each context recomputed, MemSearcher's units);
- ``segments``: DCPO, one exact ``mem1_exact`` row per segment (cut at each Prune&Write);
- ``trie``: the whole trajectory as one exact prefix-trie row (also exact, one 2D-masked row).

It prints the tokens each forward processes, the padded slots, the seconds (best of ``--repeat``),
the ratios against ``separate``, and the largest log-prob gap to per-call recompute (all three are
exact; ``mem1_mask``, MEM1's approximate row, is printed for contrast).

(measured figures: docs/findings.md, 'MemAct')
"""

from __future__ import annotations

import argparse
import time

import torch

from memkit.core.trajectory import TrainingUnit
from memkit.lab.evaluation import rollout
from memkit.lab.kit import load_kit
from memkit.lab.policies import fresh_tiny
from memkit.lab.recipes import LAB_ORACLE
from memkit.rl.packed_forward import packed_token_logprobs, packing_gap
from memkit.rl.packing import pack
from memkit.rl.segments import segment_units
from memkit.world import make_tasks


def _time(model, batch, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        with torch.no_grad():
            packed_token_logprobs(model, batch)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objectives", default="2,4,8")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kit = load_kit(0)
    model = fresh_tiny(kit, seed=0).model.eval().to(args.device)
    print(
        f"{'k':>2} {'layout':>9} {'rows':>5} {'tokens':>7} {'padded':>7} {'seconds':>8} {'tok ratio':>9} "
        f"{'time ratio':>10} {'max gap':>8}"
    )
    for k in (int(x) for x in args.objectives.split(",")):
        tasks = make_tasks(kit.world, args.tasks, k=k, seed=77)
        trajs = rollout("memact", tasks, kit, policy="oracle", oracle_cfg=LAB_ORACLE)
        layouts = {
            "separate": ([TrainingUnit.of(t) for t in trajs], "separate"),
            "segments": ([u for t in trajs for u in segment_units(t)], "mem1_exact"),
            "trie": ([TrainingUnit.of(t) for t in trajs], "mem1_exact"),
            "mem1_mask": ([TrainingUnit.of(t) for t in trajs], "mem1_mask"),
        }
        base = None
        for name, (units, mode) in layouts.items():
            batch = pack(units, mode)
            sec = _time(model, batch, args.repeat)
            gap = packing_gap(model, units, mode)["max_abs"]
            base = base or (batch.n_tokens, sec)
            print(
                f"{k:>2} {name:>9} {batch.input_ids.shape[0]:>5} {batch.n_tokens:>7} {batch.n_padded_tokens:>7} "
                f"{sec:>8.3f} {batch.n_tokens / base[0]:>9.2f} {sec / base[1]:>10.2f} {gap:>8.1e}"
            )


if __name__ == "__main__":
    main()
