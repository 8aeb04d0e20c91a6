"""The device check in one call (issues 54 and 57): ``python tests/gpu_check.py OUT_DIR`` on a GPU machine.

1. ``tests/models/test_gpu.py``: the GPU paths against the CPU's numbers, and the bf16 LoRA GRPO step on
   random-init Qwen2.5-0.5B / 7B shapes against ``memkit plan`` (rows to ``OUT_DIR/gpu.jsonl``);
2. FSDP2 (``fully_shard``) GRPO step of the tiny Llama on one GPU (NCCL) against one plain CPU process;
3. memkit's ``Learner`` under accelerate's FSDP2 plugin on one GPU (``check_engine``'s refusal lifted in
   the probe only): GRPO and PPO updates against a plain CPU update;
4. DeepSpeed ZeRO-2 and ZeRO-3, 2 accumulation steps, memkit's loss weights, against one process.

Every comparison is a max |difference| in ``OUT_DIR/compare.json`` (float32, TF32 off); the logs of each
step go to ``OUT_DIR/check.log``. Nothing here runs in CI (no GPU there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]


def run(cmd: list[str], log, timeout: int) -> dict:
    """Run one step of the check, its output appended to the log; ``{rc, seconds}`` (rc "timeout" when killed)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        rc, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:  # what it printed before the kill (str, or bytes on some Pythons)
        out = e.stdout or ""
        rc, text = "timeout", out if isinstance(out, str) else out.decode(errors="replace")
    log.write(f"\n===== {' '.join(cmd)} (rc {rc}, {time.perf_counter() - t0:.1f} s)\n{text[-20000:]}\n")
    log.flush()
    return {"rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


def max_diff(a: dict, b: dict) -> float:
    """max |a - b| over the tensors both name (gradients left out); nan when none."""
    keys = [k for k in a if k in b and not k.endswith(".grad")]
    return (
        max(float((a[k].detach().float().cpu() - b[k].detach().float().cpu()).abs().max()) for k in keys)
        if keys
        else float("nan")
    )


def torchrun(script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", script, *args]


def train_under_deepspeed(work: Path, log) -> dict:
    """``accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml -m memkit.cli train``, one
    process, 2 GRPO steps of the tiny model: what a user runs (bf16, as the config file says)."""
    cfg = TESTS.parent / "configs" / "accelerate" / "deepspeed_zero2.yaml"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg), "--num_processes", "1"]
    flags = [
        "--method",
        "mem1",
        "--algo",
        "grpo",
        "--steps",
        "2",
        "--tasks-per-step",
        "2",
        "--n-samples",
        "2",
        "--init",
        "tiny",
    ]
    out_dir = work / "train-zero2"
    row = run([*launch, "-m", "memkit.cli", "train", *flags, "--out", str(out_dir), "--eval-every", "0"], log, 150)
    metrics = out_dir / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        row["metrics"] = [{k: r.get(k) for k in ("step", "pg_loss", "grad_norm", "processes")} for r in rows]
    return row


def main(out: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    # JAX (in the device image) preallocates 75% of the GPU once anything starts its backend: measured
    # as 105 GiB outside PyTorch's allocator when the 7B case ran out of memory
    os.environ |= {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_PLATFORMS": "cpu"}
    work = Path(tempfile.mkdtemp())
    os.environ["MEMKIT_GPU_REPORT"] = str(out / "gpu.jsonl")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")])
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (a dry run)"
    report: dict = {"gpu": gpu, "torch": torch.__version__}
    for mod in ("transformers", "peft", "accelerate", "deepspeed"):
        try:
            report[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            report[mod] = f"not importable: {e}"
    with open(out / "check.log", "w") as log:
        pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "tests/models/test_gpu.py"]
        report["test_gpu"] = run([*pytest, f"--junitxml={out / 'test_gpu.xml'}"], log, 300)
        report["fsdp2_step"] = run(torchrun(str(TESTS / "fsdp2_worker.py"), str(work)), log, 75)
        report["fsdp2_learner"] = run(torchrun(str(TESTS / "fsdp2_worker.py"), str(work), "learner"), log, 75)
        for stage in (2, 3):
            ds = work / f"zero{stage}"
            ds.mkdir()
            report[f"zero{stage}"] = run(
                torchrun(str(TESTS / "deepspeed_worker.py"), str(ds), str(stage), "2"), log, 75
            )
            worker = str(TESTS / "deepspeed_worker.py")
            report[f"learner_zero{stage}"] = run(torchrun(worker, str(ds), "learner", str(stage)), log, 75)
        report["train_zero2"] = train_under_deepspeed(work, log)
    import dist_worker as dw
    import fsdp2_worker as fw

    if (work / "fsdp2.pt").exists():  # the reference of tests/rl/test_fsdp2.py, on the CPU
        got = torch.load(work / "fsdp2.pt")
        model = dw.tiny_llama()
        fw.grpo_loss(model, range(dw.N_TASKS), fw.total_tokens()).backward()
        grads = {k: p.grad for k, p in model.named_parameters()}
        torch.optim.AdamW(model.parameters(), lr=1e-3).step()
        ref = {k: p.detach() for k, p in model.named_parameters()}
        report["fsdp2_step"] |= {
            "type": got["accelerate_type"],
            "grad_diff": max_diff(got["grads"], grads),
            "param_diff": max_diff(got["params"], ref),
        }
    for algo in dw.CASES:
        path = work / f"learner-{algo}.pt"
        if path.exists():
            got = torch.load(path)
            row = {"type": got["type"]}
            if "error" in got:
                row["error"] = got["error"][-1500:]
            else:
                plain = dw.make_learner(algo, sort_micro_batches=False, ref_dtype="float32")
                stats = plain.update(dw.trajectories())
                ref = dw.params(plain)
                row |= {
                    "param_diff": max_diff(got["params"], ref),
                    "pg_loss": [got["stats"]["pg_loss"], stats["pg_loss"]],
                }
            report[f"fsdp2_learner_{algo}"] = row
    for stage in (2, 3):  # memkit's Learner under DeepSpeed against one plain CPU process
        path = work / f"zero{stage}" / "learner.pt"
        if path.exists():
            got = torch.load(path)
            for algo in dw.CASES:
                row = {k: v for k, v in got[algo].items() if k not in ("params", "stats")}
                if "params" in got[algo]:
                    plain = dw.make_learner(algo, sort_micro_batches=False, ref_dtype="float32")
                    stats = plain.update(dw.trajectories())
                    ref = dw.params(plain)
                    keys = ("pg_loss", "kl", "grad_norm")
                    row |= {
                        "param_diff": max_diff(got[algo]["params"], ref),
                        "stats": {k: [got[algo]["stats"][k], stats[k]] for k in keys},
                    }
                report[f"learner_zero{stage}"] |= {algo: row, "type": got["type"]}
    import deepspeed_worker as dsw

    ref = dsw.reference_params()
    for stage in (2, 3):
        path = work / f"zero{stage}" / "deepspeed.pt"
        if path.exists():
            got = torch.load(path)
            init = {k: p.detach() for k, p in dw.tiny_llama().named_parameters()}
            report[f"zero{stage}"] |= {
                "type": got["accelerate_type"],
                "steps": got["steps"],
                "param_diff": max_diff(got["params"], ref),
                "moved": max_diff(ref, init),
            }
    (out / "compare.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    main(out)
