"""``memkit train``: RL (GRPO or PPO) on a method's synthetic tasks, or on real ones (``--tasks --corpus``).

    memkit train --algo grpo --method memsearcher --steps 100
    memkit train --method memt --steps 20 --tasks-per-step 4 --n 3   # MoT-GRPO trees over teacher-built stores
    memkit train --algo ppo --method mem1 --packing mem1_mask --lora --out runs/mem1-ppo
    memkit train ... --out runs/mem1-ppo --resume          # continue from the latest checkpoint
    memkit train --method mem1 --init <sft dir> --tasks offline --corpus offline --lora   # real NQ + TriviaQA

Every :class:`~memkit.rl.config.TrainConfig` field is a flag (``--clip-high``, ``--gamma``, ...).
Multi-GPU: ``accelerate launch -m memkit.cli train ...`` or ``torchrun --nproc_per_node N -m memkit.cli train ...``.
"""

from __future__ import annotations

from memkit.cli.args import Computed, add_config_flags, add_max_minutes, config_from_args

#: the command's short spellings of TrainConfig fields (the README's commands use them)
ALIASES = {"n_samples": ["--n"], "out_dir": ["--out"]}


HELP = "RL-train a policy (GRPO or PPO) on a method's tasks"


def add_arguments(sp) -> None:
    from memkit.rl.config import TrainConfig

    sp.description = __doc__.splitlines()[0]
    add_config_flags(
        sp, TrainConfig, required={"method"}, aliases=ALIASES, defaults={"out_dir": Computed("runs/<method>-<algo>")}
    )
    add_max_minutes(sp, TrainConfig().budget.seconds, dest="budget.seconds")
    sp.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")


def train_config(args):
    """The :class:`~memkit.rl.config.TrainConfig` of parsed ``memkit train`` arguments (validated);
    no ``--out`` = ``runs/<method>-<algo>``."""
    from memkit.rl.config import TrainConfig

    cfg = config_from_args(TrainConfig, args)
    if cfg.out_dir is None:
        cfg.out_dir = f"runs/{cfg.method}-{cfg.algo}"
    return cfg.validate()


def run(args) -> int:
    cfg = train_config(args)  # a bad value is named before the trainer (torch) loads
    from memkit.lab.runs import train

    def log(r):
        print(
            f"step {r['step']:4d}  reward {r['reward_mean']:.3f}  EM {r['em']:.3f}  kl {r['kl']:.4f}  "
            f"entropy {r['entropy']:.3f}  clip {r['clip_frac']:.3f}  peak {r['peak_tokens']:.0f}  "
            f"{r['seconds']:.1f}s",
            flush=True,
        )

    result = train(cfg, progress=False, log=log, resume=args.resume)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # torchrun / accelerate launch: tear the process
        dist.destroy_process_group()  # group down now; gloo's threads can abort a rank at interpreter exit
    last = (
        [e for e in result.eval_history if e["step"] == result.eval_history[-1]["step"]] if result.eval_history else []
    )
    for e in last:  # wiki tasks: a row per objective count; Mem-T: one row over every held-out question
        where = f" k={e['k']}" if "k" in e else f" ({e['questions']} questions)" if "questions" in e else ""
        em = f"EM {e['em']:.3f}  " if "em" in e else ""
        print(f"eval step {e['step']}{where}: {em}F1 {e['f1']:.3f}  invalid {e['invalid_rate']:.2f}")
    print(f"logs in {cfg.out_dir}/metrics.csv; checkpoint {result.path}")
    return 0
