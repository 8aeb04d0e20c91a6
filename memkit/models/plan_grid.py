"""Which model fits which setup, and the accelerate config to launch it with (``memkit plan --grid``).

For each model x {LoRA, full fine-tuning} x GPU count, the first of the engines memkit knows that fits
``gpu_mem`` GB per GPU with gradient checkpointing (:func:`memkit.models.plan.plan`, the ``checkpointing``
mode), in the order a user should reach for them:

    1 GPU                 one process (``memkit train --device cuda``)
    N GPUs, zero 0        DDP, full copies            configs/accelerate/ddp.yaml
    N GPUs, zero 2        DeepSpeed ZeRO-2            configs/accelerate/deepspeed_zero2.yaml (GRPO-family rules)
    N GPUs, zero 3        FSDP2                       configs/accelerate/fsdp2.yaml (GRPO-family rules; rollouts
                                                       and scoring forwards in lockstep: memkit.rl.engines.
                                                       DeepSpeed ZeRO-3 is refused by ``memkit train``)
"""

from __future__ import annotations

from memkit.models.plan import Setup, plan, resolve_arch

GRID_MODELS = ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b")
#: (several GPUs, zero) -> how to launch it
ENGINES = {
    (False, 0): "memkit train --device cuda",
    (True, 0): "configs/accelerate/ddp.yaml",
    (True, 2): "configs/accelerate/deepspeed_zero2.yaml (GRPO)",
    (True, 3): "configs/accelerate/fsdp2.yaml (GRPO)",
}


def fit_grid(
    models=GRID_MODELS,
    gpus=(1, 8),
    gpu_mem: float = 80.0,
    seq_len: int = 4096,
    rollout_batch: int = 16,
    reserve: float = 1.0,
) -> list[dict]:
    """One row per model x (LoRA, full) x GPU count: the first engine of :data:`ENGINES` whose plan fits with
    checkpointing at micro-batch 1 (``zero`` None: none does), its total GB and largest micro-batch."""
    rows = []
    for name in models:
        arch = resolve_arch(name)
        for lora in (True, False):
            for n in gpus:
                row = {"model": name, "lora": lora, "gpus": n, "zero": None, "engine": "does not fit"}
                for zero in (0,) if n == 1 else (0, 2, 3):
                    p = plan(arch, Setup(lora=lora, gpus=n, zero=zero), seq_len=seq_len, gpu_mem=gpu_mem,
                             rollout_batch=rollout_batch, reserve=reserve, name=name)  # fmt: skip
                    mode = p["modes"]["checkpointing"]
                    row |= {"total_gb": mode["gb"]["total"], "max_micro_batch": mode["max_micro_batch"]}
                    if mode["fits"]:
                        row |= {"zero": zero, "engine": ENGINES[(n > 1, zero)]}
                        break
                rows.append(row)
    return rows


def format_grid(rows: list[dict], gpu_mem: float, seq_len: int) -> str:
    """The grid as a table: what fits ``gpu_mem`` GB per GPU at ``seq_len`` tokens, and how to launch it."""
    lines = [
        f"fits {gpu_mem:g} GB per GPU with gradient checkpointing, micro-batch 1 x {seq_len} tokens (GB: the chosen "
        "engine's per-GPU total, or the last one tried)",
        f"{'model':<14}{'train':<7}{'GPUs':>5}{'GB':>9}{'max mb':>8}  engine",
    ]
    for r in rows:
        train = "LoRA" if r["lora"] else "full"
        lines.append(
            f"{r['model']:<14}{train:<7}{r['gpus']:>5}{r['total_gb']:>9.1f}{r['max_micro_batch']:>8}  {r['engine']}"
        )
    return "\n".join(lines)


__all__ = ["ENGINES", "GRID_MODELS", "fit_grid", "format_grid"]
