"""Batched vs one-by-one rollouts with the tiny model, measured in one run.

    python benchmarks/rollout_throughput.py [--n 64] [--method mem1] [--objectives 2] [--device cuda]

Rolls out the same N trajectories (N/4 tasks x 4 samples, temperature 1) twice: all active
trajectories batched into one generate call per round (the engine), and one trajectory at a
time. Each trajectory samples from its own seeded stream (``RolloutConfig.sample_seeds``), so
both paths generate the same tokens and the ratio compares equal work; the script prints how
many trajectories came out identical. The model is the SFT'd tiny model when `memkit sft
--method M` has cached one (realistic turn counts), else a fresh tiny model (its outputs are
mostly invalid after one call). It is loaded once and shared by both paths, so the ratio
measures generation only. Both paths run at 1 thread and at all cores (``--threads`` to
choose), after one untimed batched rollout (the first one also grows the allocator's arena and
builds kernels for its shapes), with ``memkit.core.cpu.keep_freed_memory`` applied as the CLI does
(``MEMKIT_KEEP_FREED_MEMORY=0`` measures without it). ``--device cuda`` runs the model on a GPU.

For each thread count it prints each path's tokens generated, wall time, tokens/s and a
prefill/decode breakdown (us per prompt token; decode steps x rows, ms per row-step), then the
wall-time speed-up of batched over one-by-one; last, the speed-up with each path at its fastest
thread count (target >= 8x at N = 64). The ratio is what batched generation saves every RL step
and evaluation; the breakdown says whether prefill or decode bounds it. The one-row path's cost
is mostly per-step overhead (Python, kernel launches), which differs between machines and
devices, so compare ratios only within one machine.

(measured figures: docs/findings.md, 'Benchmarks')
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from memkit.core.cpu import keep_freed_memory, usable_cores
from memkit.lab.evaluation import rollout
from memkit.lab.kit import load_kit
from memkit.lab.policies import fresh_tiny, sft_checkpoint_path
from memkit.models import load_policy
from memkit.world import make_tasks


def generated_tokens(trajs) -> int:
    return sum(len(c.output_ids) for t in trajs for c in t.calls)


def breakdown(stats) -> str:
    """Prefill vs decode share of one path's generation time (HFBackend.stats)."""
    rows = stats.decode_rows / max(stats.decode_steps, 1)
    return (
        f"prefill {stats.prefill_seconds:5.1f} s ({stats.prefill_tokens} prompt tokens, "
        f"{1e6 * stats.prefill_seconds / max(stats.prefill_tokens, 1):5.1f} us/token) | decode {stats.decode_seconds:5.1f} s "
        f"({stats.decode_steps} steps x {rows:4.1f} rows, {1e3 * stats.decode_seconds / max(stats.decode_rows, 1):5.2f} ms/row-step)"
    )


def trajectory_seeds(n_tasks: int, group: int, base: int) -> list[list[int]]:
    """Per task, the sampling seeds of its ``group`` trajectories (RolloutConfig.sample_seeds)."""
    return [[base + group * j + g for g in range(group)] for j in range(n_tasks)]


def identical(a, b) -> int:
    """How many trajectories of ``a`` and ``b`` (same order) generated exactly the same ids."""
    return sum([c.output_ids for c in x.calls] == [c.output_ids for c in y.calls] for x, y in zip(a, b))


def timed_paths(args, kit, policy, tasks, threads: int) -> dict:
    """Both paths at ``threads`` torch threads: wall time, tokens generated, backend stats, and how many
    trajectories came out identical. Every trajectory samples from its own seeded stream, so the two
    paths generate the same tokens (up to float noise) and the ratio compares equal work."""
    torch.set_num_threads(threads)
    seeds = trajectory_seeds(len(tasks), args.group, base=10_000)
    stats = policy.backend().stats
    stats.reset()
    t0 = time.perf_counter()
    batched = rollout(
        args.method,
        tasks,
        kit,
        policy=policy,
        n=args.group,
        temperature=1.0,
        sample_seeds=[s for task_seeds in seeds for s in task_seeds],
    )
    out = {"batched": (time.perf_counter() - t0, generated_tokens(batched), replace(stats))}
    stats.reset()
    t0 = time.perf_counter()
    single = []
    for task, task_seeds in zip(tasks, seeds):
        for s in task_seeds:
            single += rollout(args.method, [task], kit, policy=policy, n=1, temperature=1.0, sample_seeds=[s])
    out["one-by-one"] = (time.perf_counter() - t0, generated_tokens(single), replace(stats))
    out["identical"] = identical(batched, single)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="trajectories in total")
    ap.add_argument("--group", type=int, default=4, help="samples per task")
    ap.add_argument("--method", default="mem1")
    ap.add_argument("--objectives", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the model runs, e.g. cpu or cuda")
    ap.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=None,
        help="torch thread counts to measure both paths at (default: 1 and all cores)",
    )
    args = ap.parse_args()
    thread_counts = args.threads or sorted({1, usable_cores()})
    kept = keep_freed_memory()  # as the memkit CLI does; MEMKIT_KEEP_FREED_MEMORY=0 to compare
    kit = load_kit(0)
    ckpt = sft_checkpoint_path(args.method, kit.world_seed)
    policy = load_policy(str(ckpt)) if ckpt.exists() else fresh_tiny(kit)
    policy.model.to(args.device)
    tasks = make_tasks(kit.world, n=args.n // args.group, k=args.objectives, seed=4242)
    print(
        f"policy={ckpt if ckpt.exists() else 'tiny (random init)'} method={args.method} k={args.objectives} trajectories={args.n} "
        f"threads={thread_counts} keep_freed_memory={kept} device={args.device}"
    )

    # warm-up, not timed: the first batched rollout also grows the allocator's arena and builds kernels for
    # its shapes (0.3-0.7 s of prefill measured), which would count against whichever path runs first
    torch.set_num_threads(thread_counts[0])
    rollout(args.method, tasks, kit, policy=policy, n=args.group, temperature=1.0, seed=1)
    best = {}
    for threads in thread_counts:
        res = timed_paths(args, kit, policy, tasks, threads)
        same = res.pop("identical")
        print(f"-- {threads} thread(s): {same} of {args.n} trajectories identical on both paths")
        for path, (seconds, tokens, stats) in res.items():
            print(
                f"  {path:10s}: {tokens} tokens generated, {seconds:6.1f} s, {tokens / seconds:7.1f} tok/s | {breakdown(stats)}"
            )
            if path not in best or seconds < best[path][0]:
                best[path] = (seconds, threads)
        print(
            f"  speed-up at {threads} thread(s) (wall, same trajectories): {res['one-by-one'][0] / res['batched'][0]:.1f}x"
        )
    (tb, nb), (ts, ns) = best["batched"], best["one-by-one"]
    print(f"speed-up, each path at its fastest thread count (batched {nb}, one-by-one {ns}): {ts / tb:.1f}x")


if __name__ == "__main__":
    main()
