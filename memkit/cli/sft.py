"""``memkit sft``: behaviour-clone a method's oracle into a model (a cached checkpoint): the tiny model, or
a pretrained one (``--init smollm2-135m --lora``, a hub id) in its own tokens and chat template, on the
synthetic world or on real questions over a real corpus (``--tasks offline --corpus offline``).

Every :class:`~memkit.train.sft.SFTConfig` field is a flag (``--batch-size``, ``--oracle-p-drop-fact``, ...).
"""

from __future__ import annotations

import sys
import time

from memkit.cli.args import add_config_flags, add_max_minutes, config_from_args, ints

HELP = "behaviour-clone the oracle into the tiny model or a pretrained one (cached checkpoint)"


def add_arguments(sp) -> None:
    from memkit.train.config import SFTConfig

    sp.description = __doc__.splitlines()[0]
    add_config_flags(sp, SFTConfig, required={"method"}, aliases={"oracle.show_comparison": ["--show-comparison"]})
    add_max_minutes(sp, SFTConfig.max_seconds, zero="no budget: exactly --steps, reproducible")
    sp.add_argument("--eval-tasks", type=int, default=100, help="held-out tasks to evaluate after training (0 = skip)")
    sp.add_argument("--eval-objectives", type=ints, default=[2])
    sp.add_argument(
        "--tag",
        default=None,
        help="cache tag of the checkpoint (default: 'default' for the default --objectives / --n-tasks / "
        "--seed, else one naming them, e.g. k1-2-3-n4000-s0); load it as --policy tiny-sft:TAG",
    )


def check_tag(tag: str | None) -> str | None:
    """A cache tag becomes part of a directory name: letters, digits, '-', '_' and '.' only."""
    if tag is not None and not all(c.isalnum() or c in "-_." for c in tag):
        raise ValueError(f"--tag {tag!r}: use letters, digits, '-', '_' or '.' (it becomes part of a directory name)")
    return tag


def run(args) -> int:
    from memkit.train.config import SFTConfig

    cfg = config_from_args(SFTConfig, args)  # a bad value is named before torch loads
    check_tag(args.tag)
    cfg.data.check()
    from memkit.core.cpu import busy_cpu_note
    from memkit.lab.evaluation import evaluate
    from memkit.lab.kit import load_kit
    from memkit.lab.policies import pretrained_init, sft_output_path, sft_tag
    from memkit.lab.real import data_kit
    from memkit.lab.runs import train_sft_model
    from memkit.train.sft import budget_note

    tag = check_tag(args.tag or sft_tag(cfg))
    kit = data_kit(load_kit(cfg.data.world_seed), cfg.data)  # --tasks / --corpus: real questions over a real corpus
    note = busy_cpu_note() if cfg.max_seconds else None
    if note:
        print(note, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    path, history, n_ex = train_sft_model(
        cfg.method,
        kit,
        cfg,
        log=lambda r: print(
            f"step {r['step']:5d}  loss {r['loss']:.4f}  lr {r['lr']:.2e}  {r['seconds']:.0f}s  attention {r['attention']}",
            flush=True,
        ),
        path=sft_output_path(cfg, cfg.data.world_seed, tag),
    )
    spec = str(path) if pretrained_init(cfg.init) else "tiny-sft" if tag == "default" else f"tiny-sft:{tag}"
    print(
        f"trained on {n_ex} calls in {time.perf_counter() - t0:.0f}s; checkpoint: {path}\n"
        f"use it as --policy {spec} (memkit eval / rollout) or --init {spec} (memkit train)"
    )
    note = budget_note(history, cfg, time.perf_counter() - t0, cfg.method)
    if note:
        print(note, file=sys.stderr, flush=True)
    if args.eval_tasks:
        results = evaluate(
            cfg.method,
            kit,
            objectives=args.eval_objectives,
            n_tasks=args.eval_tasks,
            policy=spec,
            method_kwargs=cfg.method_kwargs,  # the format the model was cloned in (MemAct's window, MEM1's answers)
        )
        for k, (summary, _) in results.items():
            kinds = ", ".join(f"{c[3:]} {v:.2f}" for c, v in summary.items() if c.startswith("em_"))
            print(
                f"{spec} {cfg.method} k={k}: EM per question {summary['em']:.3f} ({kinds})  F1 {summary['f1']:.3f}  "
                f"invalid {summary['invalid_rate']:.2f}  peak tokens {summary['peak_tokens']:.0f}"
            )
    print(f"total wall time {time.perf_counter() - t0:.0f}s")
    return 0
