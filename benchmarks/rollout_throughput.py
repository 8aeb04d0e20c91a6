"""Batched vs one-by-one rollouts with the tiny model, measured in one run.

    python benchmarks/rollout_throughput.py [--n 64] [--method mem1] [--objectives 2] [--device cuda]

Rolls out the same N trajectories (N/4 tasks x 4 samples, temperature 1) twice: all active
trajectories batched into one generate call per round (the engine), and one trajectory at a
time. Prints tokens generated, wall time and the speed-up ratio (target >= 8x at N = 64).
Each trajectory samples from its own seeded stream (``RolloutConfig.sample_seeds``), so both
paths generate the same tokens and the ratio compares equal work; the script prints how many
trajectories came out identical. (Before, the two paths drew from one shared stream each and
sampled different trajectories: on this machine the batched path generated 9,649 tokens and the
one-by-one path 8,369, which made the wall-time ratio 6.9x where tokens per second said 7.9x.)
The model is the SFT'd tiny model when `memkit sft --method M` has cached one (realistic
turn counts), else a fresh tiny model (its outputs are mostly invalid after one call).
The model is loaded once and shared by both paths, so the ratio measures generation only.

Measured on this 2-core machine (SFT'd MEM1 tiny model, 1 thread): 4.6x wall before shared-
prefix prefill, 5.2-5.4x after (28,826 instead of 35,373 prompt tokens), 5.6x with 2 threads;
run-to-run spread on the shared machine is ~15%. The breakdown lines say why it stops there:
decoding batches well (~2 ms per token one by one, ~0.27 ms per row in batches of ~30: ~8x),
but the batched decode step is memory-bound (each step reads every row's KV cache: ~0.7 ms of
attention per layer at 30 rows x 250 tokens), and prefill costs ~45-60 us per prompt token
either way (deduplication and prefix sharing save tokens, 1.7x, not time per token).

Measured again on a fresh machine of the same kind (1 thread): 3.7x (5.1 s batched: prefill 1.7 s,
decode 3.2 s = 486 steps x 25.9 rows; 18.7 s one by one: 1.56 ms per single-row step). One decode
forward of the SFT'd model costs 1.59 ms at 1 row and 4.41 ms at 26 rows x 300 cached tokens, of
which sdpa reads the KV cache for 0.46 ms per layer (8 MB at ~17 GB/s). With all of that attention
free the batched run would still take ~4.2 s (4.5x): 8x needs fewer decode steps (continuous
batching across turns, so finished rows make room for the next call) rather than cheaper ones.

Measured on the next fresh machine (1 thread; the float32-SFT'd MEM1 model, 349 batched decode
steps x 28.8 rows): 5.1-5.7x (mean 5.4x, 8 runs) with glibc's default malloc, 5.5-6.1x (mean
5.8x, 10 runs) with `memkit.cpu.keep_freed_memory`, which the script applies as the CLI does
(batched 3.2-3.5 s instead of 3.4-3.8 s: fewer page faults on the KV-cache buffers and prefill
activations; one by one ~19.6 s either way). `MEMKIT_KEEP_FREED_MEMORY=0` measures without it.

Both paths are measured at 1 thread and at all cores (`--threads` to choose), after one untimed
batched rollout: without it the first batched run paid 0.3-0.7 s more prefill (allocator arena
and kernels for new shapes), and the 1-thread ratio read 4.2x or 5.1x depending on which thread
count ran first. Measured on the next fresh machine (its 10-minute SFT'd MEM1 model, 340 batched
decode steps x 28.3 rows): 1 thread 4.8x (3.6 s vs 17.4 s), 2 threads 6.8x (2.4 s vs 16.2 s).
Two threads speed the batched prefill 1.8x (41.9 -> 23.7 us/token) and its decode 1.4x (0.25 ->
0.17 ms/row-step), the one-row path only 1.07x: batching is what lets a 1.2M-parameter model use
the second core. Still short of 8x.

On a GPU (`--device cuda`; an H100, 1 CPU thread, the MEM1 model SFT'd on the sft questions): 13.7x
(3.6 s batched: prefill 0.3 s for 25,857 prompt tokens, decode 3.2 s = 513 steps x 20.8 rows at
0.30 ms/row-step; 49.7 s one by one: 8,987 single-row decode steps at 5.28 ms each). There a decode
step costs the same at 1 row or 21 (kernel launches and Python, not arithmetic), so batching pays
~the number of rows; on this CPU a row costs ~0.2 ms of real work either way. The same run on this
2-core CPU right after (identical trajectories, 10,288 tokens): 6.3x at 2 threads, batched 2.5 s,
one by one 15.7 s (1.56 ms a single-row step). So the H100's ratio is higher because its one-row
baseline is 3x slower, not because its batched run is faster: for a 1.2M-parameter model the GPU
buys nothing but the ratio.

Measured on a slower machine of this kind (AVX2 only, no AVX-512, 2.45 GHz; SFT steps take 0.42 s
there instead of ~0.2 s), with identical trajectories on both paths (64 of 64, 9,423 tokens), two
runs: 1 thread 5.6x / 6.4x (batched 9.1 / 7.4 s, one by one 50.9 / 47.1 s), 2 threads 8.3x / 8.3x
(6.9 / 6.0 s against 57.2 / 50.0 s); each path at its fastest thread count 7.4x / 7.8x. A single-row
decode step costs 4.7-5.7 ms there (1.56 ms on the machines above), mostly Python and kernel-launch
overhead of the 4-layer forward, which is what batching amortises.

Continuous batching (a call joins the decode batch in the slot a finished row left, instead of
waiting for its round; commit aa08a15, reverted) was tried on that machine: the same trajectories,
320 decode steps x 37 rows instead of 395 x 27, but 7.7 s against 6.7 s, since each step then
reads a wider KV window (rows of different ages) and prefills run in smaller batches. On this CPU
the per-row cost bounds the ratio, not the number of steps.

On an H200 (1 CPU thread; MEM1 model SFT'd 18 minutes on the slow machine above, the same seeds
and tasks as this script, every schedule 64 of 64 trajectories identical): rounds 1.34 / 1.51 s
(prefill 0.1 s for 23,725 prompt tokens, decode 1.1 s = 328 steps x 33 rows), one by one 30.2 s:
**20-22.5x**. Continuous batching (aa08a15 cherry-picked onto this code) did not pay there either:
1.50 / 1.49 s with admissions of >= 4 calls (288 steps x 40 rows, but prefill 0.3 s for 25,652
tokens in smaller batches), 1.60 s admitting every call at once, 1.61 s in groups of 8; at 256
trajectories rounds 3.13 / 3.38 s against 3.08 / 3.25 s (562 -> 350 decode steps, prefill 0.5 ->
1.0 s). The steps it saves are paid back in prefills and per-step bookkeeping, so rounds stay the
one schedule on both kinds of machine.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from memkit.cpu import keep_freed_memory, usable_cores
from memkit.models import load_policy
from memkit.pipeline import fresh_tiny, load_kit, rollout, sft_checkpoint_path
from memkit.world import make_tasks


def generated_tokens(trajs) -> int:
    return sum(len(c.output_ids) for t in trajs for c in t.calls)


def breakdown(stats) -> str:
    """Prefill vs decode share of one path's generation time (HFBackend.stats)."""
    rows = stats.decode_rows / max(stats.decode_steps, 1)
    return (f"prefill {stats.prefill_seconds:5.1f} s ({stats.prefill_tokens} prompt tokens, "
            f"{1e6 * stats.prefill_seconds / max(stats.prefill_tokens, 1):5.1f} us/token) | decode {stats.decode_seconds:5.1f} s "
            f"({stats.decode_steps} steps x {rows:4.1f} rows, {1e3 * stats.decode_seconds / max(stats.decode_rows, 1):5.2f} ms/row-step)")


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
    batched = rollout(args.method, tasks, kit, policy=policy, n=args.group, temperature=1.0,
                      sample_seeds=[s for task_seeds in seeds for s in task_seeds])
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
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="torch thread counts to measure both paths at (default: 1 and all cores)")
    args = ap.parse_args()
    thread_counts = args.threads or sorted({1, usable_cores()})
    kept = keep_freed_memory()  # as the memkit CLI does; MEMKIT_KEEP_FREED_MEMORY=0 to compare
    kit = load_kit(0)
    ckpt = sft_checkpoint_path(args.method, kit.world_seed)
    policy = load_policy(str(ckpt)) if ckpt.exists() else fresh_tiny(kit)
    policy.model.to(args.device)
    tasks = make_tasks(kit.world, n=args.n // args.group, k=args.objectives, seed=4242)
    print(f"policy={ckpt if ckpt.exists() else 'tiny (random init)'} method={args.method} k={args.objectives} trajectories={args.n} "
          f"threads={thread_counts} keep_freed_memory={kept} device={args.device}")

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
            print(f"  {path:10s}: {tokens} tokens generated, {seconds:6.1f} s, {tokens / seconds:7.1f} tok/s | {breakdown(stats)}")
            if path not in best or seconds < best[path][0]:
                best[path] = (seconds, threads)
        print(f"  speed-up at {threads} thread(s) (wall, same trajectories): {res['one-by-one'][0] / res['batched'][0]:.1f}x")
    (tb, nb), (ts, ns) = best["batched"], best["one-by-one"]
    print(f"speed-up, each path at its fastest thread count (batched {nb}, one-by-one {ns}): {ts / tb:.1f}x")


if __name__ == "__main__":
    main()
