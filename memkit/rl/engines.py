"""The accelerate engines memkit's ``Learner`` trains under, and the ones it refuses.

    one process, DDP          ``accelerator.backward`` per micro-batch, ``no_sync`` on all but the last,
                              clip, ``optimizer.step``
    DeepSpeed ZeRO-0/1/2      the engine's own ``backward`` per micro-batch with the accumulation
      (GRPO-family rules)     boundary set on the last one only (:func:`deepspeed_backward`), then
                              ``engine.step()`` (clips at ``cfg.max_grad_norm``, steps, zeroes)
    FSDP2                     accelerate's backward per micro-batch, as under DDP; every forward outside
      (GRPO-family rules,     the gradient loop runs on every rank in step: rollouts, old / reference
      the HF loop)            log-probs and memory probes through :class:`~memkit.models.lockstep.Lockstep`
                              (a rank out of work follows the others' forwards), a rank with an empty
                              micro-batch runs the same forwards on one token; the KL reference sharded
                              like the policy (:func:`shard_like_policy`)
    refused                   FSDP with a critic (accelerate prepares one model under FSDP2) or another
                              rollout backend (vLLM would need the gathered weights each step), DeepSpeed
                              ZeRO-3 (its partitioned weights under the HF loop: not run yet), DeepSpeed
                              with a critic (PPO: accelerate prepares one model per DeepSpeed engine)

memkit's loss weights (:func:`memkit.rl.critic.loss_weights`) are normalised over the *global*
mini-batch, so the micro-batch losses already sum to the mini-batch's loss and only the average
over W processes is undone (``loss * W``). DeepSpeed would also divide each ``backward`` by its
``gradient_accumulation_steps``: :func:`configure_deepspeed` sets that to 1 and marks the boundary
per micro-batch instead, so a mini-batch of any number of micro-batches is one exact step.
accelerate's default (a step at every ``backward``) steps more often than is due; the boundary set per
micro-batch gives one process's update (``tests/gpu_check.py``; figures: docs/findings.md, the device
check's DeepSpeed entries).
"""

from __future__ import annotations

import os

import torch

from memkit.rl.config import TrainConfig


def make_accelerator(cfg: TrainConfig):
    """The run's ``Accelerator`` on ``cfg.runtime.device`` with ``cfg.runtime.mixed_precision``.

    accelerate keeps one device/precision state per process: after a CPU run,
    ``Accelerator(cpu=False)`` silently stays on the CPU (found by ``tests/models/test_gpu.py``), and
    another precision raises "cannot be changed, restart your runtime". A notebook or test that
    trains twice in one process needs neither, so a single-process run that asks for other
    settings resets that state (an Accelerator made before then follows the new settings); a
    distributed run keeps the launcher's.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    cpu = cfg.runtime.device == "cpu" or (cfg.runtime.device == "auto" and not torch.cuda.is_available())
    if cfg.runtime.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("TrainConfig.runtime.device='cuda' but no GPU is visible; use device='auto' or 'cpu'")
    state = AcceleratorState._shared_state
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if (
        state
        and not distributed
        and (
            (state["device"].type == "cpu") != cpu or str(state.get("_mixed_precision")) != cfg.runtime.mixed_precision
        )
    ):
        AcceleratorState._reset_state(reset_partial_state=True)
    return Accelerator(cpu=cpu, mixed_precision=cfg.runtime.mixed_precision)


def engine_kind(acc) -> str:
    """accelerate's distributed type by name: ``NO``, ``MULTI_CPU``, ``MULTI_GPU``, ``FSDP``, ``DEEPSPEED``..."""
    return str(getattr(acc, "distributed_type", "")).rsplit(".", 1)[-1]


def zero_stage(acc) -> int:
    """The DeepSpeed plugin's ZeRO stage (0 when accelerate has no plugin)."""
    plugin = getattr(getattr(acc, "state", None), "deepspeed_plugin", None)
    return int(getattr(plugin, "zero_stage", 0) or 0)


def check_engine(acc, critic: bool = False, backend: str = "hf") -> None:
    """Refuse, with the config that works, the engines memkit cannot train with (issue 57), instead
    of a hang or a wrong update. One process, DDP, FSDP2 and DeepSpeed ZeRO-0/1/2 for critic-free
    rules are tested (module doc)."""
    kind = engine_kind(acc)
    if kind == "FSDP" and critic:
        raise ValueError(
            "a credit rule with a critic (PPO/GAE) trains two models, and accelerate prepares one under FSDP2; "
            "use a critic-free rule (grpo, ...) under FSDP, or launch with configs/accelerate/ddp.yaml"
        )
    if kind == "FSDP" and backend != "hf":
        raise ValueError(
            f"--backend {backend} under FSDP would need the sharded weights gathered into the engine at every "
            "sync (not built); train with --backend hf under FSDP, or launch with configs/accelerate/ddp.yaml"
        )
    if kind == "DEEPSPEED" and zero_stage(acc) >= 3:
        raise ValueError(
            "memkit trains under DeepSpeed ZeRO-0/1/2, not ZeRO-3 yet (issue 57: rollouts over partitioned "
            "weights); launch with configs/accelerate/fsdp2.yaml (sharded weights) or deepspeed_zero2.yaml"
        )
    if kind == "DEEPSPEED" and critic:
        raise ValueError(
            "a credit rule with a critic (PPO/GAE) trains two models, and accelerate prepares one per DeepSpeed "
            "engine; use a critic-free rule (grpo, ...) under DeepSpeed, or launch with configs/accelerate/ddp.yaml"
        )


def sharded(acc) -> bool:
    """Whether the policy's parameters are sharded between the processes (FSDP), so that every
    forward is a collective: all ranks must run it (module doc)."""
    return engine_kind(acc) == "FSDP"


def shard_like_policy(ref) -> None:
    """Shard the frozen KL reference as accelerate's FSDP2 plugin shards the policy: ``fully_shard`` on
    each block the model names unsplittable (``_no_split_modules``: its decoder layers), then on the
    root. Each rank keeps 1/W of it; its forwards all-gather a layer at a time, so they too run on every
    rank in step (the Learner's one-token forwards for an empty micro-batch)."""
    from torch.distributed.fsdp import fully_shard

    names = set(getattr(ref, "_no_split_modules", None) or ())
    for module in ref.modules():
        if type(module).__name__ in names:
            fully_shard(module)
    fully_shard(ref)


def configure_deepspeed(acc, cfg: TrainConfig) -> None:
    """Fill the DeepSpeed config before ``accelerator.prepare``: the micro-batch, accumulation 1 (memkit
    marks each mini-batch's boundary itself: :func:`deepspeed_backward`), clipping at ``cfg.max_grad_norm``,
    and memkit's own AdamW accepted under ZeRO. A value the launcher's config file set otherwise is
    overridden: one knob, one place (``TrainConfig``)."""
    ds = acc.state.deepspeed_plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = cfg.runtime.micro_batch_size
    ds["gradient_accumulation_steps"] = 1
    ds["train_batch_size"] = cfg.runtime.micro_batch_size * acc.num_processes
    ds["gradient_clipping"] = cfg.max_grad_norm
    ds["zero_allow_untested_optimizer"] = True


def deepspeed_backward(engine, loss: torch.Tensor, last: bool) -> None:
    """One micro-batch's backward in a DeepSpeed engine: gradients accumulate until ``last``, whose
    backward reduces them (ZeRO: into each rank's partition) for the ``engine.step()`` that follows."""
    engine.set_gradient_accumulation_boundary(last)
    engine.backward(loss)


def reference_dtype(name: str, device, model) -> torch.dtype:
    """The KL reference's parameter dtype (``RuntimeConfig.ref_dtype``): ``auto`` = bfloat16 on a GPU,
    the policy's own dtype elsewhere."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else next(model.parameters()).dtype
    return getattr(torch, name)


__all__ = [
    "check_engine",
    "configure_deepspeed",
    "deepspeed_backward",
    "engine_kind",
    "make_accelerator",
    "reference_dtype",
    "shard_like_policy",
    "sharded",
    "zero_stage",
]
