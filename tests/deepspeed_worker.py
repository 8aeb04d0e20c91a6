"""DeepSpeed ZeRO-2 / ZeRO-3 GRPO step with memkit's loss weights, for tests/rl/test_deepspeed.py
and the device check (issue 57).

memkit normalises each micro-batch's loss by the *global* batch (:func:`~memkit.rl.critic.loss_weights`
with the whole batch's token count), so the micro-batch losses already sum to the batch's loss.
DeepSpeed's engine divides every ``backward`` by its ``gradient_accumulation_steps`` (G) and averages
gradients over the W processes, so each micro-batch loss is multiplied by ``G * W`` before
``accelerator.backward``; the engine steps once, at its accumulation boundary. Plain SGD (lr 1)
makes the parameter change equal the gradient, so a wrong scale cannot hide behind Adam's
scale-free first step.

As a script (``torchrun --nproc_per_node W tests/deepspeed_worker.py OUT_DIR STAGE G``) every process
takes its share of :mod:`dist_worker`'s tasks, in G micro-batches, and rank 0 saves the updated
parameters (gathered under ZeRO-3) to ``OUT_DIR/deepspeed.pt``; with ``OUT_DIR learner STAGE``,
memkit's own ``Learner`` runs instead (:func:`learner`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import dist_worker as dw
import fsdp2_worker as fw
import torch

LR = 1.0


def reference_params() -> dict[str, torch.Tensor]:
    """One process, all tasks in one backward, one SGD step: what every engine must reproduce."""
    model = dw.tiny_llama()
    fw.grpo_loss(model, range(dw.N_TASKS), fw.total_tokens()).backward()
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return {k: p.detach().clone() for k, p in model.named_parameters()}


def main(out_dir: str, stage: int, accumulation: int) -> None:
    import os

    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import DistributedType

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # what `accelerate launch --config_file ...` sets
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), cpu=not torch.cuda.is_available())
    rank, world = acc.process_index, acc.num_processes
    model = dw.tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    engine, opt = acc.prepare(model, opt)
    mine = list(range(rank, dw.N_TASKS, world))
    shares = [mine[i::accumulation] for i in range(accumulation)]
    n_tokens, engaged = fw.total_tokens(), acc.distributed_type == DistributedType.DEEPSPEED
    scale = world * (accumulation if engaged else 1)  # on CPU accelerate runs DDP, which divides by W only
    for share in shares:  # an empty share still takes part: every micro-batch is a collective step
        # accumulate(): accelerate marks only the G-th backward a boundary; without it every
        # ``backward`` steps the engine (measured on an H200: 2 steps, a 5.5e-3 parameter gap)
        with acc.accumulate(engine):
            loss = fw.grpo_loss(engine, share or mine[:1], n_tokens) * (1.0 if share else 0.0)
            acc.backward(loss * scale)  # DeepSpeed: the engine steps at its accumulation boundary
    opt.step()  # DDP's step; accelerate's DeepSpeed optimizer wrapper leaves it to the engine
    module = engine.module
    if engaged:
        from deepspeed.runtime.zero import GatheredParameters

        with GatheredParameters(list(module.parameters())):  # ZeRO-3's shards; a no-op otherwise
            params = {k: p.detach().float().cpu().clone() for k, p in module.named_parameters()}
    else:
        params = {k: p.detach().float().cpu().clone() for k, p in module.named_parameters()}
    if rank == 0:
        out = {
            "params": params,
            "accelerate_type": str(acc.distributed_type),
            "steps": getattr(engine, "global_steps", None),
        }
        torch.save(out, Path(out_dir) / "deepspeed.pt")
    acc.wait_for_everyone()


def learner(out_dir: str, stage: int) -> None:
    """memkit's ``Learner`` under DeepSpeed ZeRO-``stage``: one GRPO ``update`` of :mod:`dist_worker`'s
    batch (several micro-batches per mini-batch, 2 epochs), this process's share; rank 0 saves the
    parameters and stats to ``OUT_DIR/learner.pt`` (tests/gpu_check.py compares them with one plain
    process). ZeRO-3 or PPO: the refusal's message is saved instead."""
    import os

    from accelerate import Accelerator, DeepSpeedPlugin

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    config = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": stage}}
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), cpu=not torch.cuda.is_available())
    out = {"type": str(acc.distributed_type)}
    for algo in dw.CASES:
        try:
            learn = dw.make_learner(algo, sort_micro_batches=False, accelerator=acc, ref_dtype="float32")
        except ValueError as e:
            out[algo] = {"refused": str(e)}
            continue
        stats = learn.update(dw.trajectories(range(acc.process_index, dw.N_TASKS, acc.num_processes)))
        params = {f"policy.{k}": p.detach().float().cpu().clone() for k, p in learn.policy.named_parameters()}
        out[algo] = {"params": params, "stats": stats, "steps": getattr(learn.model, "global_steps", None)}
    if acc.is_main_process:
        torch.save(out, Path(out_dir) / "learner.pt")
    acc.wait_for_everyone()


if __name__ == "__main__":
    if sys.argv[2] == "learner":
        learner(sys.argv[1], int(sys.argv[3]))
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
