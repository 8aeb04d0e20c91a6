"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on CPU over gloo, for tests/rl/test_fsdp2.py.

accelerate's FSDP plugin does not engage on CPU (measured with accelerate 1.16, torch 2.13 CPU):
``Accelerator(cpu=True, fsdp_plugin=...)`` under torchrun is ``MULTI_CPU`` (DDP, the plugin
silently unused) and ``Accelerator(cpu=False, ...)`` without a GPU is ``NO`` (every rank a separate
single process), because accelerate turns FSDP on only for its ``MULTI_<accelerator>`` types. So
memkit's ``Learner`` (which prepares through accelerate) cannot be tested under FSDP2 here. What
does run is torch's FSDP2 itself: this script shards memkit's tiny test Llama per decoder layer
on every process and takes one GRPO gradient step with memkit's loss pieces
(:func:`~memkit.rl.losses.ppo_clip_terms` weighted by :func:`~memkit.rl.critic.loss_weights`,
normalised over the global batch) on the process's share of :mod:`dist_worker`'s trajectories.

As a script (``torchrun --nproc_per_node 2 tests/fsdp2_worker.py OUT_DIR``) rank 0 saves the full
(unsharded) gradients and updated parameters, and the distributed type accelerate chose for an FSDP
plugin on CPU, to ``OUT_DIR/fsdp2.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dist_worker as dw
import torch


def batch(tasks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every call of the tasks' trajectories as one right-padded row: ids, the mask of the output
    tokens' next-token positions, and each row's advantage (its trajectory's reward - 0.5)."""
    rows, spans, adv = [], [], []
    for t in dw.trajectories(tasks):
        for c in t.calls:
            rows.append(c.context_ids + c.output_ids)
            spans.append((len(c.context_ids) - 1, len(c.context_ids) - 1 + len(c.output_ids)))
            adv.append(float(t.reward) - 0.5)
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.zeros(len(rows), width - 1)
    for i, (a, b) in enumerate(spans):
        mask[i, a:b] = 1.0
    return ids, mask, torch.tensor(adv)[:, None].expand_as(mask)


def grpo_loss(model, tasks, n_tokens: float) -> torch.Tensor:
    """GRPO's clipped surrogate (old log-probs = the current ones: the first epoch) over ``tasks``,
    token-mean over ``n_tokens`` trained tokens of the whole batch."""
    from memkit.rl.critic import loss_weights
    from memkit.rl.losses import ppo_clip_terms

    device = next(model.parameters()).device
    ids, mask, adv = (t.to(device) for t in batch(tasks))
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    loss_tok, _ = ppo_clip_terms(logp, logp.detach(), adv, mask)
    return (loss_tok * loss_weights(mask, "token-mean", n_tokens, 0)).sum()


def total_tokens() -> float:
    """The trained tokens of the whole batch (every process's share)."""
    return float(batch(range(dw.N_TASKS))[1].sum())


def main(out_dir: str) -> None:
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import fully_shard

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["LlamaDecoderLayer"]
    )
    # on CPU: starts the gloo group, the plugin unused (above); on a GPU (the device check): NCCL
    acc = Accelerator(cpu=not torch.cuda.is_available(), fsdp_plugin=plugin)
    rank, world = acc.process_index, acc.num_processes
    model = dw.tiny_llama().to(acc.device)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    loss = grpo_loss(model, range(rank, dw.N_TASKS, world), total_tokens())
    # FSDP2 averages gradients over the processes; the weights already sum over the whole batch
    (loss * world).backward()
    grads = {k: p.grad.full_tensor().cpu() for k, p in model.named_parameters()}
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    state = {k: p.full_tensor().cpu() for k, p in model.named_parameters()}
    if rank == 0:
        out = {"grads": grads, "params": state, "accelerate_type": str(acc.distributed_type)}
        torch.save(out, Path(out_dir) / "fsdp2.pt")
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()


def learner_probe(out_dir: str) -> None:
    """The device check's probe of what stands between memkit's ``Learner`` and FSDP2: accelerate's
    FSDP2 plugin on a GPU, ``check_engine``'s refusal lifted *in this probe only*, one GRPO and one
    PPO ``update`` of :mod:`dist_worker`'s batch; rank 0 saves parameters and stats, or the error,
    to ``OUT_DIR/learner-<algo>.pt`` (compared with one plain process by tests/gpu_check.sh)."""
    import os
    import traceback

    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    import memkit.rl.update as up

    os.environ["ACCELERATE_USE_FSDP"] = "true"  # what `accelerate launch --config_file fsdp2.yaml` sets
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["LlamaDecoderLayer"]
    )
    acc = Accelerator(fsdp_plugin=plugin)
    up.check_engine = lambda *_a, **_k: None
    for algo in dw.CASES:
        try:
            learner = dw.make_learner(algo, sort_micro_batches=False, accelerator=acc, ref_dtype="float32")
            stats = learner.update(dw.trajectories(range(acc.process_index, dw.N_TASKS, acc.num_processes)))
            full = {
                f"{name}.{k}": getattr(p.detach(), "full_tensor", p.detach)().float().cpu()
                for name, model in dw.models(learner).items()
                for k, p in model.named_parameters()
            }
            out = {"params": full, "stats": stats, "type": str(acc.distributed_type)}
        except Exception:  # noqa: BLE001 - the probe reports what breaks
            out = {"error": traceback.format_exc()[-3000:], "type": str(acc.distributed_type)}
        if acc.is_main_process:
            torch.save(out, Path(out_dir) / f"learner-{algo}.pt")
    acc.wait_for_everyone()


def rank_work(rank: int, model, kit) -> dict:
    """Rank ``rank``'s rollouts, different on each rank: rank 0 three MEM1 tasks at k = 1, rank 1 one
    at k = 2 and then one more ``generate`` of its own (so the ranks run different numbers of
    ``generate`` calls and forwards). Greedy; returns every call's output ids and the extra ids."""
    from memkit.agents import get_method
    from memkit.models import HFBackend
    from memkit.rollout.engine import ModelPolicy, RolloutConfig, run_rollouts
    from memkit.world import make_tasks

    method, backend = get_method("mem1"), HFBackend(model, kit.tokenizer)
    tasks = make_tasks(kit.world, n=3, k=1, seed=5) if rank == 0 else make_tasks(kit.world, n=1, k=2, seed=6)
    policy = ModelPolicy(backend, temperature=0.0)
    trajs = run_rollouts(method, tasks, kit.env, policy, kit.tokenizer, RolloutConfig(max_turns=3))
    out = {"calls": [[c.output_ids for c in t.calls] for t in trajs]}
    if rank == 1:
        out["extra"] = backend.generate([kit.tokenizer.encode("alice was born in")], 24, temperature=0.0)[0].ids
    return out


def rollout(out_dir: str) -> None:
    """FSDP2-sharded tiny model (the course tokenizer, random init), each rank its own rollouts through
    memkit's HF loop wrapped in :class:`~memkit.models.lockstep.Lockstep`, then ``join()``; every rank
    saves what it wrote and its forward counts to ``OUT_DIR/rollout-<rank>.pt``."""
    from accelerate import Accelerator
    from torch.distributed.fsdp import fully_shard

    from memkit.lab.kit import load_kit
    from memkit.models.lockstep import Lockstep
    from memkit.models.tiny import build_tiny

    acc = Accelerator(cpu=True)  # the gloo group
    kit = load_kit(0)
    model = build_tiny(kit.tokenizer, seed=0).eval()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    stepped = Lockstep(model)
    out = rank_work(acc.process_index, stepped, kit)
    out |= {"rounds": stepped.rounds, "dummies": stepped.join()}
    torch.save(out, Path(out_dir) / f"rollout-{acc.process_index}.pt")
    torch.distributed.destroy_process_group()


def fsdp2_on_cpu():
    """An ``Accelerator`` whose ``prepare`` shards the model as accelerate's FSDP2 plugin does on a GPU
    (``fully_shard`` per decoder layer, then the root; the optimizer's parameters rebound to the sharded
    ones), with memkit's :func:`~memkit.rl.engines.sharded` reading True for it: the plugin itself
    engages only on a GPU (module doc), so this is how memkit's side of FSDP (lockstep rollouts and
    scoring forwards, idle micro-batches, the sharded reference) runs on CPU over gloo. The rest of
    accelerate sees ``MULTI_CPU``: ``backward`` is the loss's, ``no_sync`` absent (gradients are
    reduce-scattered every micro-batch, which sums them the same), ``clip_grad_norm_`` torch's over
    DTensors, as accelerate's FSDP2 path calls it."""
    from accelerate import Accelerator

    import memkit.rl.update as up
    from memkit.rl.engines import shard_like_policy

    class FSDP2OnCPU(Accelerator):
        def prepare(self, model, opt):
            shard_like_policy(model)
            opt.param_groups[0]["params"] = [p for p in model.parameters() if p.requires_grad]
            return model, opt

    up.sharded = lambda acc: isinstance(acc, FSDP2OnCPU)
    return FSDP2OnCPU(cpu=True)


def trainer_probe(out_dir: str) -> None:
    """memkit's Learner and Trainer over FSDP2-sharded weights on 2 CPU ranks (:func:`fsdp2_on_cpu`):
    (1) one GRPO update of :mod:`dist_worker`'s batch split 3/2 (one rank has an empty micro-batch),
    old log-probs recomputed and a sharded KL reference; (2) the trainer's held-out evaluation
    (lockstep rollouts of 3 + 2 tasks at k = 1, 2, then ``mem_p``'s probes); (3) two training steps of the
    tiny model with an evaluation. Rank 0 saves the full parameters, the rows and forward counts to
    ``OUT_DIR/trainer-<rank>.pt``."""
    import dist_worker as dw

    from memkit.lab.kit import load_kit
    from memkit.models.tiny import build_tiny
    from memkit.rl.config import TrainConfig
    from memkit.rl.trainer import Trainer

    acc = fsdp2_on_cpu()
    learner = dw.make_learner("grpo", sort_micro_batches=False, accelerator=acc, recompute_old_logprobs=True)
    stats = learner.update(dw.trajectories(range(acc.process_index, dw.N_TASKS, acc.num_processes)))
    full = {f"policy.{k}": p.detach().full_tensor().clone() for k, p in learner.policy.named_parameters()}
    out = {"params": full, "stats": stats, "sharded_ref": type(learner.ref).__name__}
    kit = load_kit(0)
    cfg = TrainConfig.from_flags(algo="grpo", method="mem1", init="tiny", out_dir="", **dw.EVAL).validate()
    trainer = Trainer(cfg, build_tiny(kit.tokenizer, seed=0), kit.tokenizer, kit=kit, accelerator=acc)
    out["eval"] = trainer.evaluate()
    cfg = TrainConfig.from_flags(
        algo="grpo", method="mem1", init="tiny", out_dir="", steps=2, tasks_per_step=3, n_samples=2,
        eval_every=2, eval_tasks=3, eval_objectives=(1,), max_turns=3, kl_coef=0.01,
    ).validate()  # fmt: skip
    trainer = Trainer(cfg, build_tiny(kit.tokenizer, seed=0), kit.tokenizer, kit=kit, accelerator=acc)
    trainer.run(progress=False)
    out |= {"history": trainer.history, "eval_history": trainer.eval_history}
    out |= {"rounds": trainer.policy.rounds, "dummies": trainer.policy.dummies}
    torch.save(out, Path(out_dir) / f"trainer-{acc.process_index}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    mode = {"rollout": rollout, "trainer": trainer_probe, "learner": learner_probe}
    mode[sys.argv[2]](sys.argv[1]) if sys.argv[2:] else main(sys.argv[1])
    dw.exit_now()
