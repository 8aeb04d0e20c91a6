"""``memkit pretrain``: train the tiny base every format's SFT can start from (cached, resumable).

Every :class:`~memkit.train.pretrain.PretrainConfig` field is a flag (``--seq-len``, ``--copy-fraction``, ...).
Run it again after an interruption to continue; a finished base is reused. Start SFT from the
default base with ``memkit sft --method M --init base``.
"""

from __future__ import annotations

import sys
import time

from memkit.cli.args import add_config_flags, add_max_minutes, config_from_args

HELP = "pretrain the tiny base (world passages + copy/extract text; cached, resumable)"


def add_arguments(sp) -> None:
    from memkit.train.config import PretrainConfig

    sp.description = __doc__.splitlines()[0]
    add_config_flags(sp, PretrainConfig)
    add_max_minutes(sp, PretrainConfig.max_seconds, zero="no budget: exactly --steps, reproducible")


def run(args) -> int:
    from memkit.train.config import PretrainConfig

    cfg = config_from_args(PretrainConfig, args)  # a bad value is named before torch loads
    from memkit.core.cpu import busy_cpu_note
    from memkit.lab.kit import load_kit
    from memkit.lab.policies import base_checkpoint_path, ensure_base
    from memkit.train.pretrain import partial_path

    path = base_checkpoint_path(cfg)
    t0 = time.perf_counter()
    if (path / "memkit.json").is_file():
        print(f"reusing the finished base at {path}")
    else:
        if (partial_path(path) / "state.pt").is_file():
            print(f"continuing the interrupted run in {partial_path(path)}", flush=True)
        note = busy_cpu_note() if cfg.max_seconds else None
        if note:
            print(note.replace("SFT", "pretraining"), file=sys.stderr, flush=True)
    kit = load_kit(cfg.world_seed)
    try:
        run_ = ensure_base(
            kit,
            cfg,
            log=lambda r: print(
                f"step {r['step']:6d}  loss {r['loss']:.4f}  lr {r['lr']:.2e}  {r['seconds']:.0f}s  "
                f"{r['tokens'] / 1e6:.2f}M tokens  attention {r['attention']}",
                flush=True,
            ),
        )
    except KeyboardInterrupt as e:  # the first Ctrl-C saved the step it finished (memkit.train.pretrain)
        saved = (partial_path(path) / "state.pt").is_file()
        print(
            f"\n{e or 'interrupted'}; "
            + (
                "state saved in " + str(partial_path(path)) + ": run the same command again to continue"
                if saved
                else "nothing saved yet"
            ),
            file=sys.stderr,
        )
        return 130
    m = run_.metrics
    copy = ", ".join(f"{k} {v:.2f}" for k, v in m["copy_accuracy"].items())
    ppl = "n/a (no held-out passages)" if m["heldout_ppl"] is None else f"{m['heldout_ppl']:.2f}"
    print(
        f"base: {run_.path}\n"
        f"trained {m['steps']} steps in {m['seconds']:.0f}s; final loss {m['final_loss']:.4f}; "
        f"held-out perplexity {ppl} on {len(m['heldout_passages'])} world passages not trained on; "
        f"copy accuracy {copy}"
    )
    init = "base" if path == base_checkpoint_path(PretrainConfig(world_seed=cfg.world_seed)) else str(run_.path)
    print(
        f"start SFT from it with: memkit sft --method METHOD --init {init}"
        + ("" if init == "base" else " (--init base means the base of the default flags)")
        + f"\ntotal wall time {time.perf_counter() - t0:.0f}s"
    )
    return 0
