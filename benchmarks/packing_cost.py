"""What packing costs: MEM1's masked trajectory (mem1_mask, mem1_exact) vs one row per call.

    python benchmarks/packing_cost.py [--objectives 8] [--n-trajs 2] [--micro 1] [--backward]

Rolls out N MEM1 oracle trajectories at k objectives (valid multi-turn trajectories, no model
needed), packs them three ways (``separate``, ``mem1_mask``, ``mem1_exact``) and times the
forward of the packed log-probs on a fresh tiny model (timing does not depend on weights),
``--micro`` trajectories per forward pass as the trainer's micro-batches do; ``--backward`` also
times forward + backward. All modes run in one process on the same trajectories.

Per mode it prints ``tokens`` (real), ``padded`` (B * L: what the forward runs), ``pairs``
(what the mask allows: a sparse kernel's work), ``cells`` (B * L * L: a dense kernel's work),
wall times and ``max|dlogp|`` against ``separate``, the exact reference (mem1_exact ~1e-6;
mem1_mask shows App. B.7's position-id approximation), then ratios to ``separate``. They matter
because a stitched trajectory has fewer tokens than its calls' contexts, but under a 2D mask it
is one long row whose dense attention grows with the square of the trajectory's length (a
separate row: one call's), so fewer tokens need not mean less time.

(measured figures: docs/findings.md, 'Benchmarks')
"""

from __future__ import annotations

import argparse
import time

import torch

from memkit.core.cpu import keep_freed_memory
from memkit.lab.evaluation import rollout
from memkit.lab.kit import load_kit
from memkit.lab.policies import fresh_tiny
from memkit.rl.packed_forward import packed_token_logprobs
from memkit.rl.packing import MODES, pack
from memkit.world import make_tasks


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objectives", type=int, default=8, help="questions per task (k)")
    ap.add_argument("--n-trajs", type=int, default=2, help="trajectories (one task each)")
    ap.add_argument("--micro", type=int, default=1, help="trajectories per forward pass")
    ap.add_argument("--backward", action="store_true", help="also time forward + backward (~3x the forward)")
    ap.add_argument("--repeats", type=int, default=1, help="timing repeats (best is kept)")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest for tiny on a shared 2-core box)"
    )
    ap.add_argument("--seed", type=int, default=4242)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the memkit CLI does; MEMKIT_KEEP_FREED_MEMORY=0 to compare

    kit = load_kit(0)
    tasks = make_tasks(kit.world, n=args.n_trajs, k=args.objectives, seed=args.seed)
    trajs = [t for t in rollout("mem1", tasks, kit, policy="oracle", prompt="compact") if t.valid]
    model = fresh_tiny(kit, 0).model
    pad = kit.tokenizer.pad_token_id or 0
    micro = [trajs[i : i + args.micro] for i in range(0, len(trajs), args.micro)]
    calls = sum(len(t.calls) for t in trajs)
    print(
        f"mem1 oracle, k={args.objectives}: {len(trajs)} trajectories, {calls} calls "
        f"({calls / max(len(trajs), 1):.1f} per trajectory); tiny model, {args.micro} trajectories per forward, "
        f"threads={torch.get_num_threads()}, attn={model.config._attn_implementation}"
    )

    res, ref = {}, None
    for mode in MODES:
        batches = [pack(m, mode, pad) for m in micro]

        def forward(batches=batches):
            with torch.no_grad():
                return [packed_token_logprobs(model, b) for b in batches]

        def forward_backward(batches=batches):
            for b in batches:
                logp = packed_token_logprobs(model, b)
                (logp * b.loss_mask).sum().backward()
            model.zero_grad(set_to_none=True)

        logps = forward()
        # trained-token log-probs in (trajectory, call, token) order, comparable across modes
        flat = []
        for b, lp in zip(batches, logps):
            order = sorted(range(b.input_ids.shape[0]), key=lambda r: (int(b.unit_index[r]), int(b.call_index[r])))
            for r in order:
                for t in sorted(set(b.call_ids[r][b.loss_mask[r] > 0].tolist())):
                    flat.append(lp[r][(b.call_ids[r] == t) & (b.loss_mask[r] > 0)])
        flat = torch.cat(flat)
        if ref is None:
            ref = flat
        res[mode] = {
            "shape": f"{batches[-1].input_ids.shape[0]}x{batches[-1].input_ids.shape[1]}",
            "tokens": sum(b.n_tokens for b in batches),
            "padded": sum(b.n_padded_tokens for b in batches),
            "pairs": sum(b.n_attention_pairs for b in batches),
            "cells": sum(b.n_attention_cells for b in batches),
            "fwd": timed(forward, args.repeats),
            "fwd_bwd": None if not args.backward else timed(forward_backward, args.repeats),
            "gap": float((flat - ref).abs().max()),
        }

    sep = res["separate"]
    head = f"{'mode':<11} {'rows x L':>9} {'tokens':>8} {'padded':>8} {'pairs':>11} {'cells':>12} {'fwd s':>7} {'fwd+bwd s':>9} {'max|dlogp|':>10}"
    print(head)
    for mode, r in res.items():
        fb = "-" if r["fwd_bwd"] is None else f"{r['fwd_bwd']:.2f}"
        print(
            f"{mode:<11} {r['shape']:>9} {r['tokens']:>8} {r['padded']:>8} {r['pairs']:>11} {r['cells']:>12} "
            f"{r['fwd']:>7.2f} {fb:>9} {r['gap']:>10.2g}"
        )
    print("ratios to separate (<1 = packing is cheaper):")
    for mode in ("mem1_mask", "mem1_exact"):
        r = res[mode]
        fb = "" if r["fwd_bwd"] is None else f"  fwd+bwd {r['fwd_bwd'] / sep['fwd_bwd']:.2f}x"
        print(
            f"  {mode:<11} tokens {r['tokens'] / sep['tokens']:.2f}x  padded {r['padded'] / sep['padded']:.2f}x  "
            f"pairs {r['pairs'] / sep['pairs']:.2f}x  cells {r['cells'] / sep['cells']:.2f}x  "
            f"fwd {r['fwd'] / sep['fwd']:.2f}x{fb}"
        )
    ex, mk = res["mem1_exact"], res["mem1_mask"]
    print(
        f"  mem1_exact / mem1_mask: tokens {ex['tokens'] / mk['tokens']:.2f}x, fwd {ex['fwd'] / mk['fwd']:.2f}x "
        "(the price of exact position ids, App. B.7)"
    )


if __name__ == "__main__":
    main()
