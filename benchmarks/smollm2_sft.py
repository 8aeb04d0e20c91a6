"""Format SFT of a real pretrained model on 2 CPU cores: SmolLM2-135M-Instruct + LoRA on the MEM1 teacher.

    python benchmarks/smollm2_sft.py [--method mem1] [--minutes 12] [--eval-tasks 20] [--lr 5e-4]

What it measures, in one run:

1. **prompt-only**: SmolLM2 as it comes, the paper's prompt in its chat template, greedy, on
   ``--eval-tasks`` held-out tasks at k = 1 and 2: valid-format rate, EM, tokens per call;
2. **format SFT**: ``memkit sft --init smollm2-135m --lora`` (all linear layers, r 32) on the oracle's
   calls re-tokenised in SmolLM2's own tokens and template, for ``--minutes`` of wall time (data
   included), gradient checkpointing on (the default for a pretrained model);
3. the SFT'd model (its adapter loaded back onto SmolLM2 and merged) on the same held-out tasks.

It prints one row per (model, k) and the SFT's steps, sequences and training tokens/s, and writes
them as JSON to ``--out`` (default ``benchmarks/out/smollm2_sft.json``). Figures and what they mean:
docs/findings.md, 'A real model on 2 cores'.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from memkit.core.cpu import keep_freed_memory


def evaluate_rows(label: str, method: str, kit, policy, tasks: int, objectives) -> list[dict]:
    from memkit.lab.evaluation import evaluate

    rows = []
    for k, (summary, trajs) in evaluate(method, kit, objectives=objectives, n_tasks=tasks, policy=policy).items():
        calls = [c for t in trajs for c in t.calls]
        row = {
            "model": label,
            "k": k,
            "valid": 1.0 - summary["invalid_rate"],
            "em": summary["em"],
            "output_tokens_per_call": sum(len(c.output_ids) for c in calls) / max(len(calls), 1),
            "wall_seconds": summary["wall_seconds"],
        }
        print(
            f"{label:>12s} k={k}: valid {row['valid']:.2f}  EM {row['em']:.3f}  "
            f"output tokens/call {row['output_tokens_per_call']:.0f}  ({row['wall_seconds']:.0f} s)",
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="mem1")
    p.add_argument("--minutes", type=float, default=12.0, help="SFT wall-clock budget (data + training)")
    p.add_argument("--eval-tasks", type=int, default=20, help="held-out tasks per k")
    p.add_argument("--objectives", default="1,2")
    p.add_argument("--lr", type=float, default=None, help="default: SFTConfig's for LoRA on a pretrained model")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--n-tasks", type=int, default=400, help="oracle tasks to clone")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (AVX512-BF16 / AMX CPUs run it faster)")
    p.add_argument(
        "--no-checkpointing",
        action="store_true",
        help="keep activations (faster, more memory) instead of the pretrained default",
    )
    p.add_argument("--skip-prompt-only", action="store_true")
    p.add_argument("--out", default="benchmarks/out/smollm2_sft.json")
    args = p.parse_args()
    keep_freed_memory()

    from memkit.lab.kit import load_kit
    from memkit.lab.policies import config_hash, load_spec, sft_output_path, sft_tag
    from memkit.lab.runs import train_sft_model
    from memkit.train.config import SFTConfig

    objectives = [int(k) for k in args.objectives.split(",")]
    kit = load_kit(0)
    rows = []
    if not args.skip_prompt_only:
        rows += evaluate_rows(
            "prompt-only", args.method, kit, load_spec("smollm2-135m", args.method, kit), args.eval_tasks, objectives
        )
    cfg = SFTConfig(
        method=args.method,
        init="smollm2-135m",
        lr=args.lr,
        batch_size=args.batch_size,
        n_tasks=args.n_tasks,
        max_seconds=60 * args.minutes,
        log_every=10,
        bf16=args.bf16 or None,
        gradient_checkpointing=False if args.no_checkpointing else None,
    )
    cfg.lora.enabled = True
    t0 = time.perf_counter()
    tag = f"{sft_tag(cfg)}-bench-{config_hash(vars(args))[:6]}"
    path, history, n_ex = train_sft_model(
        args.method,
        kit,
        cfg,
        path=sft_output_path(cfg, 0, tag),
        log=lambda r: print(f"  sft step {r['step']:4d}  loss {r['loss']:.3f}  {r['seconds']:.0f}s", flush=True),
    )
    sft_seconds = time.perf_counter() - t0
    meta = json.loads((Path(path) / "memkit.json").read_text())
    steps = history[-1]["step"] + 1
    sft = {
        "seconds": sft_seconds,
        "steps": steps,
        "sequences": steps * args.batch_size,
        "examples": n_ex,
        "lr": meta["sft"]["lr"],
        "final_loss": history[-1]["loss"],
        "first_loss": history[0]["loss"],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "path": str(path),
    }
    print(
        f"SFT: {steps} steps x {args.batch_size} sequences in {sft_seconds:.0f} s (data included); "
        f"loss {sft['first_loss']:.2f} -> {sft['final_loss']:.2f}; peak RSS {sft['peak_rss_gb']:.1f} GB",
        flush=True,
    )
    rows += evaluate_rows("SFT+LoRA", args.method, kit, str(path), args.eval_tasks, objectives)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "sft": sft, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
