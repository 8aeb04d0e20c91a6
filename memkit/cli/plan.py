"""``memkit plan``: per-GPU memory of RL / SFT training of a causal LM, and the largest micro-batch that fits.

    memkit plan --model qwen2.5-7b --lora                      # 1 GPU of 80 GB, micro-batch 1 x 4096 tokens
    memkit plan --model qwen2.5-3b --gpus 8 --zero 3 --seq-len 8192
    memkit plan --model smollm2-135m --dtype fp32 --json
    memkit plan --grid                                         # 0.5B-14B x LoRA/full x 1/8 GPUs: what fits, which config

Terms (weights, gradients, AdamW state, reference model, activations with and without gradient
checkpointing, logits, rollout KV cache) and their equations: :mod:`memkit.models.plan`. Nothing is
downloaded: presets carry the Qwen2.5 configs; tiny / smollm2-135m load offline; a directory is read
for its config.json.
"""

from __future__ import annotations

import json

HELP = "GPU memory plan of a training run: weights, grads, AdamW, reference, activations, KV cache"
#: the rows of the table: plan key -> label
ROWS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer (AdamW)",
    "reference": "reference model",
    "activations": "activations (layers)",
    "logits": "logits (fp32 log-softmax)",
    "activation_peak": "activation peak",
    "kv_cache": "KV cache (rollouts)",
    "total": "total",
}
#: what to change when even micro-batch 1 does not fit, by the largest term
LEVERS = {
    "weights": "--gpus N --zero 3 (shard the weights), or a smaller model",
    "gradients": "--lora (gradients of the adapters only), or --gpus N --zero 3",
    "optimizer": "--lora (AdamW state of the adapters only), or --gpus N --zero 3",
    "reference": "--lora (the base without adapters is the reference), --no-reference, or --gpus N --zero 3",
    "activations": "gradient checkpointing (the ckpt column), or a shorter --seq-len",
    "logits": "a shorter --seq-len, or log-probs of the response tokens only / a chunked loss",
    "kv_cache": "a smaller --rollout-batch or --rollout-len",
}


def add_arguments(sp) -> None:
    sp.description = __doc__.splitlines()[0]
    sp.add_argument(
        "--model",
        metavar="SPEC",
        help="a preset (qwen2.5-0.5b, qwen2.5-3b, qwen2.5-7b, qwen2.5-14b), tiny, smollm2-135m, or a checkpoint "
        "directory with config.json (Llama / Mistral / Qwen2 decoders)",
    )
    sp.add_argument(
        "--grid",
        action="store_true",
        help="instead of one plan: which of Qwen2.5-0.5B/3B/7B/14B x {LoRA, full} x {1 GPU, --gpus (8 if 1)} "
        "fit --gpu-mem with checkpointing, and the accelerate config to launch each with",
    )
    sp.add_argument(
        "--dtype",
        default="bf16",
        choices=("bf16", "fp16", "fp32"),
        help="parameter and activation dtype (default: bf16; fp32: memkit's fp32 weights under autocast, "
        "activations counted in fp32, an upper bound)",
    )
    sp.add_argument("--lora", action="store_true", help="train LoRA adapters (fp32), base frozen, no reference copy")
    sp.add_argument("--lora-r", type=int, default=None, metavar="R", help="LoRA rank (default: memkit's LoraSpec r)")
    sp.add_argument(
        "--lora-targets",
        choices=("attention", "all-linear"),
        default=None,
        help="adapted modules (default: memkit's LoraSpec target_modules, the attention projections)",
    )
    sp.add_argument("--micro-batch", type=int, default=1, metavar="N", help="sequences per micro-batch (default: 1)")
    sp.add_argument("--seq-len", type=int, default=4096, metavar="N", help="training sequence length (default: 4096)")
    sp.add_argument(
        "--rollout-batch",
        type=int,
        default=16,
        metavar="N",
        help="sequences generated at once per GPU, for the KV cache (default: 16)",
    )
    sp.add_argument(
        "--rollout-len",
        type=int,
        default=None,
        metavar="N",
        help="prompt + generated tokens per rollout sequence (default: --seq-len)",
    )
    sp.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs (default: 1)")
    sp.add_argument(
        "--gpu-mem",
        type=float,
        default=80.0,
        metavar="GB",
        help="memory per GPU, GB = 2^30 bytes (default: 80, an A100 / H100 80GB)",
    )
    sp.add_argument(
        "--reserve",
        type=float,
        default=1.0,
        metavar="GB",
        help="kept free for the CUDA context and fragmentation (default: 1)",
    )
    sp.add_argument(
        "--zero",
        type=int,
        default=0,
        choices=(0, 2, 3),
        help="0: every GPU holds full copies (DDP); 2: gradients and AdamW state sharded over --gpus "
        "(DeepSpeed ZeRO-2); 3: weights, gradients, AdamW state and reference sharded (FSDP full shard / "
        "ZeRO-3) (default: 0)",
    )
    sp.add_argument(
        "--no-reference", dest="reference", action="store_false", help="no KL term, so no reference model (kl coef 0)"
    )
    sp.add_argument("--json", action="store_true", help="print the plan as JSON (bytes and GB per term)")


def make_plan(args) -> dict:
    """The :func:`memkit.models.plan.plan` dict of parsed ``memkit plan`` arguments."""
    from memkit.models.loading import LORA_TARGETS
    from memkit.models.plan import Setup, plan, resolve_arch

    if args.lora_targets and not args.lora or args.lora_r is not None and not args.lora:
        raise ValueError("--lora-r and --lora-targets set up LoRA adapters: add --lora")
    setup = Setup(
        dtype=args.dtype,
        lora=args.lora,
        lora_r=args.lora_r,
        gpus=args.gpus,
        zero=args.zero,
        lora_targets=LORA_TARGETS[args.lora_targets] if args.lora_targets else None,
        reference=args.reference,
    )
    if args.zero and args.gpus == 1:
        raise ValueError(f"--zero {args.zero} shards over --gpus; with 1 GPU there is nothing to shard: add --gpus N")
    return plan(
        resolve_arch(args.model),
        setup,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        rollout_batch=args.rollout_batch,
        rollout_len=args.rollout_len,
        gpu_mem=args.gpu_mem,
        reserve=args.reserve,
        name=args.model,
    )


def format_plan(p: dict) -> str:
    """The table ``memkit plan`` prints (GB with 2 decimals)."""
    s, a, modes = p["setup"], p["arch"], p["modes"]
    how = (
        f"LoRA r={s['lora_r']} on {','.join(s['lora_targets'])}: {p['trainable'] / 1e6:.2f}M trainable"
        if s["lora"]
        else "full fine-tuning"
    )
    lines = [
        f"{p['model']} ({a['model_type']}, {p['params'] / 1e9:.3f}B params; {how}), {s['dtype']}",
        f"{s['gpus']} GPU{'s' if s['gpus'] > 1 else ''} x {p['gpu_mem_gb']:g} GB ({p['reserve_gb']:g} reserved), "
        f"zero {s['zero']}; "
        f"micro-batch {p['micro_batch']} x {p['seq_len']} tokens; rollouts {p['rollout_batch']} x "
        f"{p['rollout_len']} tokens",
        f"{'GB':<28}{'no ckpt':>10}{'ckpt':>10}",
    ]
    for key, label in ROWS.items():
        lines.append(f"{label:<28}" + "".join(f"{modes[m]['gb'][key]:>10.2f}" for m in modes))
    lines.append(
        f"{'fits ' + format(p['gpu_mem_gb'] - p['reserve_gb'], 'g') + ' GB':<28}"
        + "".join(f"{'yes' if modes[m]['fits'] else 'no':>10}" for m in modes)
    )
    lines.append(f"{'largest micro-batch':<28}" + "".join(f"{modes[m]['max_micro_batch']:>10}" for m in modes))
    for mode, m in modes.items():
        if m["max_micro_batch"] == 0:
            lines.append(
                f"{mode.replace('_', ' ')}: even micro-batch 1 does not fit; {m['dominant']} "
                f"({m['gb'][m['dominant']]:.2f} GB) dominates: try {LEVERS[m['dominant']]}"
            )
    lines.append(
        "total = weights + gradients + optimizer + reference + max(activation peak, KV cache); GB = 2^30 bytes"
    )
    return "\n".join(lines)


def run(args) -> int:
    if args.grid:
        from memkit.models.plan_grid import fit_grid, format_grid

        gpus = (1, args.gpus if args.gpus > 1 else 8)
        rows = fit_grid(
            gpus=gpus,
            gpu_mem=args.gpu_mem,
            seq_len=args.seq_len,
            rollout_batch=args.rollout_batch,
            reserve=args.reserve,
        )
        print(json.dumps(rows, indent=1) if args.json else format_grid(rows, args.gpu_mem, args.seq_len))
        return 0
    if not args.model:
        raise ValueError("memkit plan needs --model SPEC (a preset, tiny, smollm2-135m or a directory), or --grid")
    p = make_plan(args)
    print(json.dumps(p, indent=1) if args.json else format_plan(p))
    return 0
