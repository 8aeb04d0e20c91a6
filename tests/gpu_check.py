"""The device check in one call (issues 54 and 57): ``python tests/gpu_check.py OUT_DIR`` on a GPU machine.

1. ``tests/models/test_gpu.py``: the GPU paths against the CPU's numbers, and the bf16 LoRA GRPO step on
   random-init Qwen2.5-0.5B / 7B shapes against ``memkit plan`` (rows to ``OUT_DIR/gpu.jsonl``);
2. FSDP2 (``fully_shard``) GRPO step of the tiny Llama on one GPU (NCCL) against one plain CPU process;
3. memkit's ``Learner`` under accelerate's FSDP2 plugin on one GPU (``check_engine`` lifted in the probe,
   so PPO meets accelerate's own limit): GRPO and PPO updates against a plain CPU update;
4. DeepSpeed ZeRO-2 and ZeRO-3, 2 accumulation steps, memkit's loss weights, against one process;
5. ``memkit train`` as a user launches it (:func:`training_runs`): plain, FSDP2, FSDP2 + LoRA, ZeRO-2, resumes.

``python tests/gpu_check.py OUT_DIR [test_gpu] [probes] [fsdp2_learner] [train]`` runs those parts only (default
all but ``fsdp2_learner``, which ``probes`` holds).

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


TRAIN = ["--method", "mem1", "--algo", "grpo", "--tasks-per-step", "4", "--n-samples", "4", "--kl-coef", "0.01"]
KEYS = ("step", "reward_mean", "pg_loss", "kl", "grad_norm", "trained_tokens", "processes", "seconds")


def train(work: Path, log, name: str, config: str | None, flags: list[str], timeout: int = 150) -> dict:
    """``memkit train`` as a user runs it: ``accelerate launch --config_file configs/accelerate/<config>.yaml
    --num_processes 1 -m memkit.cli train ...`` (``config`` None: plain ``python -m memkit.cli train``),
    into ``work/<name>``; ``{rc, seconds, metrics, eval, checkpoints}``."""
    if config is None:
        head = [sys.executable, "-m", "memkit.cli"]
    else:
        cfg = TESTS.parent / "configs" / "accelerate" / f"{config}.yaml"
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg), "--num_processes"]
        head = [*launch, "1", "-m", "memkit.cli"]
    out_dir = work / name.split("+")[0]  # a resume ("x+resume") continues x's directory
    row = run([*head, "train", *TRAIN, *flags, "--out-dir", str(out_dir)], log, timeout)
    for file, key in (("metrics.jsonl", "metrics"), ("eval.jsonl", "eval")):
        if (out_dir / file).exists():
            rows = [json.loads(line) for line in (out_dir / file).read_text().splitlines()]
            row[key] = [{k: r.get(k) for k in (*KEYS, "k", "em", "invalid_rate") if k in r} for r in rows]
    if (out_dir / "checkpoints").exists():
        row["checkpoints"] = sorted(p.name for p in (out_dir / "checkpoints").iterdir())
    return row


def training_runs(work: Path, log, report: dict, save) -> None:
    """The tiny SFT'd MEM1 model (``tiny-sft:gpu``: ``memkit sft --method mem1 --steps 1200 --max-minutes 0
    --tag gpu`` on the CPU, carried in $MEMKIT_CACHE), GRPO with a KL reference: a plain one-GPU
    run; the same under accelerate's FSDP2 plugin (float32: memkit's ``--mixed-precision`` owns the
    precision, not the config file; its step-1 row should equal the plain one's: same rollouts, one
    shard) and in bf16, then resumed for a third step; LoRA under FSDP2; DeepSpeed ZeRO-2 and its resume;
    ZeRO-3 (refused, with its message)."""
    init = ["--init", "tiny-sft:gpu"]
    steps = [*init, "--steps", "2", "--eval-every", "2", "--eval-tasks", "8", "--eval-objectives", "1,2"]
    resume = [*init, "--steps", "3", "--eval-every", "0", "--resume"]
    runs = {
        "train_plain": ("plain", None, [*steps, "--device", "cuda"]),
        "train_fsdp2_fp32": ("fsdp2-fp32", "fsdp2", steps),
        "train_fsdp2": ("fsdp2", "fsdp2", [*steps, "--mixed-precision", "bf16"]),
        "train_fsdp2_resume": ("fsdp2+resume", "fsdp2", [*resume, "--mixed-precision", "bf16"]),
        "train_fsdp2_lora": ("fsdp2-lora", "fsdp2", [*steps, "--lora"]),
        "train_zero2": ("zero2", "deepspeed_zero2", steps),
        "train_zero2_resume": ("zero2+resume", "deepspeed_zero2", resume),
        "train_zero3": ("zero3", "deepspeed_zero3", steps),
    }
    for key, (name, config, flags) in runs.items():
        report[key] = train(work, log, name, config, flags, timeout=100)
        save()  # what ran survives a kill of the whole check


def main(out: Path, parts: set[str]) -> None:
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

    def save() -> None:
        (out / "compare.json").write_text(json.dumps(report, indent=1, default=str))

    with open(out / "check.log", "w") as log:
        if "test_gpu" in parts:
            pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "tests/models/test_gpu.py"]
            report["test_gpu"] = run([*pytest, f"--junitxml={out / 'test_gpu.xml'}"], log, 300)
        if "fsdp2_learner" in parts:
            report["fsdp2_learner"] = run(torchrun(str(TESTS / "fsdp2_worker.py"), str(work), "learner"), log, 75)
        if "probes" in parts:
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
    save()
    if "train" in parts:  # last: each run's row is saved as it ends, so a kill keeps the comparisons above
        with open(out / "check.log", "a") as log:
            training_runs(work, log, report, save)
    print(json.dumps(report, indent=1, default=str))


PARTS = ("test_gpu", "probes", "train")  # probes include fsdp2_learner, a part of its own too

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    main(out, set(sys.argv[2:]) or set(PARTS))
