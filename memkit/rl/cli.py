"""``memkit train``: RL (GRPO or PPO) on a method's synthetic tasks.

    memkit train --algo grpo --method memsearcher --steps 100
    memkit train --algo ppo --method mem1 --packing mem1_mask --lora --out runs/mem1-ppo
    memkit train ... --out runs/mem1-ppo --resume          # continue from the latest checkpoint

Multi-GPU: ``accelerate launch -m memkit.cli train ...`` or ``torchrun --nproc_per_node N -m memkit.cli train ...``.
"""
from __future__ import annotations

import argparse
import json

from memkit.rl.config import ALGOS, TrainConfig
from memkit.rl.losses import AGG_MODES
from memkit.rl.packing import MODES
from memkit.world.splits import TRAINING_SPLITS


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    from memkit.agents import METHODS
    from memkit.cli import _ints

    d = TrainConfig()
    sp = subparsers.add_parser("train", help="RL-train a policy (GRPO or PPO) on a method's tasks",
                               description=__doc__.splitlines()[0])
    sp.add_argument("--algo", choices=ALGOS, default=d.algo, help="grpo (MemSearcher) or ppo (MEM1, with a critic)")
    sp.add_argument("--method", choices=METHODS, required=True, help="memory format to train")
    sp.add_argument("--method-kwargs", type=_json_object, default={},
                    help='keyword arguments of the memory format as JSON, e.g. \'{"reward_metric": "em"}\' (memsearcher)')
    sp.add_argument("--init", default=d.init, help="tiny-sft (default; `memkit sft` first), tiny, smollm2-135m, "
                                                   "a checkpoint dir or a hub id")
    sp.add_argument("--packing", choices=("auto",) + MODES, default=d.packing,
                    help="auto = mem1_mask for mem1, separate otherwise")
    sp.add_argument("--steps", type=int, default=d.steps)
    sp.add_argument("--max-minutes", type=float, default=None,
                    help="wall-clock budget: stop (evaluate, save) before a step would start past it")
    sp.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    sp.add_argument("--out", default=None, help="run directory (default runs/<method>-<algo>)")
    sp.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    sp.add_argument("--tasks-per-step", type=int, default=d.tasks_per_step)
    sp.add_argument("--n", type=int, default=d.n_samples, help="samples per task (group size)")
    sp.add_argument("--objectives", type=_ints, default=list(d.objectives), help="questions per training task, e.g. 2")
    sp.add_argument("--lr", type=float, default=d.lr)
    sp.add_argument("--critic-lr", type=float, default=d.critic_lr)
    sp.add_argument("--kl-coef", type=float, default=d.kl_coef)
    sp.add_argument("--agg", choices=AGG_MODES, default=d.agg)
    sp.add_argument("--ppo-epochs", type=int, default=d.ppo_epochs)
    sp.add_argument("--mini-batches", type=int, default=d.mini_batches, help="optimizer steps per epoch")
    sp.add_argument("--temperature", type=float, default=d.temperature,
                    help="sampling temperature of training rollouts (the notebooks use 0.5 for the tiny model)")
    sp.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size, help="trajectories per forward")
    sp.add_argument("--eval-every", type=int, default=d.eval_every)
    sp.add_argument("--eval-tasks", type=int, default=d.eval_tasks)
    sp.add_argument("--eval-seed", type=int, default=d.eval_seed,
                    help="seed base of the periodic evaluation's tasks: 1000 = memkit eval's test tasks, "
                         "3000 = a validation set (notebook 03); 1000-9999")
    sp.add_argument("--eval-objectives", type=_ints, default=list(d.eval_objectives),
                    help="objective counts evaluated, e.g. 1,2,4,8")
    sp.add_argument("--question-split", choices=TRAINING_SPLITS, default=d.question_split,
                    help="questions the training tasks ask: rl = the tenth SFT never saw (default), "
                         "sft = the ones SFT cloned, train = both")
    sp.add_argument("--save-every", type=int, default=d.save_every)
    sp.add_argument("--seed", type=int, default=d.seed)
    sp.add_argument("--world-seed", type=int, default=d.world_seed)
    sp.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    sp.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default=d.mixed_precision)
    sp.set_defaults(func=cmd_train)
    return sp


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"reward_metric\": \"em\"}}', got {text!r}")
    return value


def config_from_args(args) -> TrainConfig:
    return TrainConfig(
        algo=args.algo, method=args.method, method_kwargs=args.method_kwargs, init=args.init, packing=args.packing,
        steps=args.steps, lora=args.lora,
        max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
        out_dir=args.out or f"runs/{args.method}-{args.algo}", tasks_per_step=args.tasks_per_step,
        n_samples=args.n, objectives=tuple(args.objectives), lr=args.lr, critic_lr=args.critic_lr,
        kl_coef=args.kl_coef, agg=args.agg, ppo_epochs=args.ppo_epochs, mini_batches=args.mini_batches,
        temperature=args.temperature, micro_batch_size=args.micro_batch_size,
        eval_every=args.eval_every, eval_tasks=args.eval_tasks, eval_seed=args.eval_seed,
        eval_objectives=tuple(args.eval_objectives), question_split=args.question_split,
        save_every=args.save_every, seed=args.seed,
        world_seed=args.world_seed, device=args.device, mixed_precision=args.mixed_precision,
    ).validate()


def cmd_train(args) -> int:
    from memkit.rl.trainer import train

    cfg = config_from_args(args)

    def log(r):
        print(f"step {r['step']:4d}  reward {r['reward_mean']:.3f}  EM {r['em']:.3f}  kl {r['kl']:.4f}  "
              f"entropy {r['entropy']:.3f}  clip {r['clip_frac']:.3f}  peak {r['peak_tokens']:.0f}  "
              f"{r['seconds']:.1f}s", flush=True)

    result = train(cfg, progress=False, log=log, resume=args.resume)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # torchrun / accelerate launch: tear the process
        dist.destroy_process_group()  # group down now; gloo's threads can abort a rank at interpreter exit
    for e in result.eval_history[-len(cfg.eval_objectives):]:
        print(f"eval step {e['step']} k={e['k']}: EM {e['em']:.3f}  F1 {e['f1']:.3f}  invalid {e['invalid_rate']:.2f}")
    print(f"logs in {cfg.out_dir}/metrics.csv; checkpoint {result.path}")
    return 0
