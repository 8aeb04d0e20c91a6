"""Behaviour cloning (SFT) on oracle trajectories: how the tiny model learns a format.

Every call of an oracle trajectory becomes one training sequence ``context_ids + output_ids``
with the behaviour-cloning loss on the output tokens:

    L_bc(θ) = − (1 / Σ_i |y_i|) Σ_i Σ_t log π_θ(y_{i,t} | x_i, y_{i,<t})

Deviation (tiny model only): a real policy arrives pretrained; the tiny model starts from
random weights and must first learn to read and copy entity names. ``context_weight`` adds a
language-modelling loss on the context tokens (prompt, memory, ``<information>``), a
stand-in for pretraining on the world text: passages repeat each name several times, which
is the signal that grows copying ("induction") heads. It is on by default (w = 1) and scored on
a random half of the context tokens each step (``context_fraction``):

    L(θ) = L_bc(θ) + w_ctx · (− mean_{context tokens} log π_θ(x_{i,t} | x_{i,<t}))

Set ``context_weight=0`` for the papers' pure output-only SFT. RL never uses this loss: its
loss mask covers generated tokens only.

The copying skill arrives late (after about :data:`SKILL_STEPS` steps), so the learning rate is
held at its peak and decayed only over the last fifth of the run (warmup-stable-decay), and the
run is budgeted in wall-clock time (``max_seconds``): a slower machine trains fewer steps.
Measured effects of each choice, and what was tried and dropped: docs/findings.md, 'SFT recipe'
and 'Negative results'.

The oracle's imperfection knobs leave mistakes in the data on purpose, so the SFT'd model is
a reasonable but improvable start for RL (MEM1 App. F.1 compares RL against SFT).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path

import torch

from memkit.core.io import atomic_dir
from memkit.models.adapters import save_policy
from memkit.models.loading import is_chat
from memkit.models.training import decoder_and_head, set_gradient_checkpointing
from memkit.train.config import ATTENTION_KERNELS, SFTConfig, lr_shape, resolve_sft


def collect_examples(trajectories, max_len: int) -> tuple[list[tuple[list[int], list[int]]], int]:
    """One ``(context_ids, output_ids)`` example per valid call; returns (examples, n_dropped)."""
    examples, dropped = [], 0
    for traj in trajectories:
        for call in traj.calls:
            if not call.output_ids:
                continue
            if len(call.context_ids) + len(call.output_ids) > max_len:
                dropped += 1
                continue
            examples.append((call.context_ids, call.output_ids))
    return examples, dropped


def make_batch(examples, pad_id: int):
    """Right-padded batch ``(ids, attn, output_mask)``, all ``[B, T]``.

    An example is ``(context_ids, output_ids)`` or ``(context_ids, output_ids, target_mask)`` with
    one bool per output token (only those are cloned, e.g. Mem-T's kept operations of a formation
    call; the others count as context). ``output_mask`` is True on the cloned output tokens (the
    behaviour-cloning loss mask); context tokens are ``attn & ~output_mask``.
    """
    length = max(len(ex[0]) + len(ex[1]) for ex in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    output_mask = torch.zeros_like(ids, dtype=torch.bool)
    attn = torch.zeros_like(ids)
    for i, (c, o, *target) in enumerate(examples):
        seq = c + o
        ids[i, : len(seq)] = torch.tensor(seq)
        if target:
            if len(target[0]) != len(o):
                raise ValueError(f"example {i}: target_mask has {len(target[0])} entries for {len(o)} output tokens")
            output_mask[i, len(c) : len(seq)] = torch.tensor(target[0], dtype=torch.bool)
        else:
            output_mask[i, len(c) : len(seq)] = True
        attn[i, : len(seq)] = 1
    return ids, attn, output_mask


def sft_loss(model, ids, attn, output_mask, context_weight: float = 0.0, context_keep=None) -> torch.Tensor:
    """``L_bc + w_ctx · L_ctx`` (the equations above); token ``t`` is predicted from ``< t``.

    ``context_keep`` (bool ``[B, T]``, optional): which context tokens enter ``L_ctx`` (a random
    subset, see ``SFTConfig.context_fraction``); None = all of them. The LM head runs only on
    the positions that are scored: it is ~25% of the tiny model's FLOPs per token at V ~ 3000,
    and the float32 log-softmax over ``[B, T, V]`` costs as much again (measured:
    docs/findings.md, 'SFT recipe').
    """
    out = output_mask[:, 1:]  # [B, T-1]: position t-1 predicts token t
    ctx = attn[:, 1:].bool() & ~out if context_weight else torch.zeros_like(out)
    if context_keep is not None:
        ctx = ctx & context_keep[:, 1:]
    scored = out | ctx
    parts = decoder_and_head(model)
    if parts is not None:
        decoder, head = parts
        hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state[:, :-1]  # [B, T-1, H]
        nll = torch.nn.functional.cross_entropy(head(hidden[scored]).float(), ids[:, 1:][scored], reduction="none")
        is_out = out[scored]  # [N_scored]
        loss = nll[is_out].sum() / is_out.sum().clamp(min=1)
        if context_weight:
            loss = loss + context_weight * nll[~is_out].sum() / (~is_out).sum().clamp(min=1)
        return loss
    logits = (
        model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    )  # e.g. a DDP-wrapped model
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, T-1]
    loss = (nll * out).sum() / out.sum().clamp(min=1)
    if context_weight:
        loss = loss + context_weight * (nll * ctx).sum() / ctx.sum().clamp(min=1)
    return loss


def sft_uses_bf16(bf16: bool | None, device: torch.device) -> bool:
    """Does an SFT step autocast to bfloat16 (True) or run in plain float32 (False)?

    ``bf16=None`` picks bfloat16 on a CUDA device that supports it and float32 elsewhere. On
    CPUs without bf16 matrix units the tiny model's matmuls are too small (hidden 128) for bf16
    to pay for the casts around them (measured: docs/findings.md, 'SFT recipe'); no CPU with
    such units was at hand to measure, so they keep float32 unless asked: pass ``bf16=True``
    (``memkit sft --bf16``) or ``False`` to choose yourself.
    """
    if bf16 is None:
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return bool(bf16)


#: Optimizer steps by which the default recipe (glue5 tokenizer) has learnt to copy names;
#: :func:`budget_note` warns when the time budget ends a run sooner (measured: docs/findings.md,
#: 'SFT recipe').
SKILL_STEPS = 2000


def budget_note(history: list[dict], cfg: SFTConfig, total_seconds: float, method: str) -> str | None:
    """A note naming the fix when the time budget stopped training before :data:`SKILL_STEPS`.

    ``total_seconds``: the whole SFT (oracle data + optimisation); the minutes suggested are the
    data time plus ``SKILL_STEPS`` steps at this run's measured pace, rounded up. Only for SFT from
    scratch: ``SKILL_STEPS`` was measured there, not from a base or a continued model.
    """
    if not history or not cfg.max_seconds or cfg.init != "scratch":
        return None
    steps = history[-1]["step"] + 1
    if steps >= min(cfg.steps, SKILL_STEPS):
        return None
    per_step = history[-1]["seconds"] / steps
    minutes = math.ceil((total_seconds - history[-1]["seconds"] + SKILL_STEPS * per_step) / 60)
    return (
        f"note: the {cfg.max_seconds / 60:g}-minute budget stopped SFT after {steps} of {cfg.steps} steps "
        f"({per_step:.2f} s a step on this machine). The tiny model has learnt to copy names by about step "
        f"{SKILL_STEPS}, so expect a lower EM; run `memkit sft --method {method} --max-minutes {minutes}` "
        f"for {SKILL_STEPS} steps here."
    )


class AttentionProbe:
    """Times eager against SDPA attention on SFT's first CPU steps and keeps the faster.

    After ``warmup`` steps (allocator and thread-pool start-up), steps alternate between the two
    kernels for ``rounds`` steps each; each step's time is divided by its batch's tokens (the
    length buckets differ), and the kernel with the lower median wins (ties: eager). Both give
    the same numbers, so the probe steps are ordinary training steps: nothing is spent but the
    slower kernel's share of ``2 * rounds`` steps.
    """

    KERNELS = ATTENTION_KERNELS

    def __init__(self, warmup: int = 2, rounds: int = 4):
        self.warmup, self.rounds = warmup, rounds
        self.seconds_per_token: dict[str, list[float]] = {k: [] for k in self.KERNELS}

    def kernel_for(self, step: int) -> str | None:
        """The kernel to time at ``step``, or None outside the probe window."""
        i = step - self.warmup
        return self.KERNELS[i % 2] if 0 <= i < 2 * self.rounds else None

    def record(self, kernel: str, seconds: float, tokens: int) -> None:
        self.seconds_per_token[kernel].append(seconds / max(tokens, 1))

    def done(self, step: int) -> bool:
        return step == self.warmup + 2 * self.rounds

    def faster(self) -> str:
        med = {k: statistics.median(v) for k, v in self.seconds_per_token.items() if v}
        if len(med) < 2:
            return "eager"
        return "sdpa" if med["sdpa"] < med["eager"] else "eager"

    def before_step(self, model, step: int) -> str | None:
        """Set ``model``'s kernel for ``step`` (a probe kernel, then the faster one once the window
        closes); returns the kernel being timed (pass it to :meth:`record`), else None."""
        kernel = self.kernel_for(step)
        if kernel:
            model.set_attn_implementation(kernel)
        elif self.done(step):
            model.set_attn_implementation(self.faster())
        return kernel


def train_sft(model, tokenizer, examples, cfg: SFTConfig, log=None, progress: bool = True) -> list[dict]:
    """AdamW with linear warmup, then ``cfg.schedule``; batches drawn from length-sorted buckets.

    With ``cfg.max_seconds`` the schedule runs on whichever of steps or wall time is further
    along, so a time-limited run still ends at learning rate 0.
    """
    cfg = resolve_sft(cfg, pretrained=is_chat(tokenizer))
    shape = lr_shape(cfg)
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)  # the context subsets
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
    t0 = time.perf_counter()

    def progress_frac(s: int) -> float:
        frac = s / cfg.steps
        if cfg.max_seconds:
            frac = max(frac, (time.perf_counter() - t0) / cfg.max_seconds)
        return min(1.0, frac)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * shape(progress_frac(s)))
    # Bucket by length so a batch pads little: sort, chunk, shuffle chunks each epoch.
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]) + len(examples[i][1]))
    chunks = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    history, queue = [], []
    device = next(model.parameters()).device
    attn_impl = getattr(model.config, "_attn_implementation", None)
    probe = None
    if device.type == "cpu" and attn_impl in AttentionProbe.KERNELS and hasattr(model, "set_attn_implementation"):
        # CPU training: which attention kernel is faster at head_dim 32, T ~ 200 depends on the CPU
        # (SFTConfig.cpu_attention); a GPU keeps what the model was built with.
        probe = AttentionProbe() if cfg.cpu_attention == "auto" else None
        model.set_attn_implementation("eager" if probe else cfg.cpu_attention)
    bf16 = sft_uses_bf16(cfg.bf16, device)
    set_gradient_checkpointing(model, cfg.gradient_checkpointing)
    model.train()
    steps = range(cfg.steps)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="sft", leave=False)
    try:
        for step in steps:
            if not queue:
                queue = chunks[:]
                rng.shuffle(queue)
            ids, attn, output_mask = make_batch([examples[i] for i in queue.pop()], pad_id)
            ids, attn, output_mask = ids.to(device), attn.to(device), output_mask.to(device)
            kernel = probe.before_step(model, step) if probe else None
            t_step = time.perf_counter()
            keep = None
            if cfg.context_weight and cfg.context_fraction < 1.0:
                keep = torch.rand(ids.shape, generator=gen) < cfg.context_fraction
                keep = keep.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = sft_loss(model, ids, attn, output_mask, cfg.context_weight, keep)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            sched.step()
            if kernel:
                probe.record(kernel, time.perf_counter() - t_step, ids.numel())
            out_of_time = bool(cfg.max_seconds) and time.perf_counter() - t0 >= cfg.max_seconds
            if step % cfg.log_every == 0 or step == cfg.steps - 1 or out_of_time:
                row = {
                    "step": step,
                    "loss": loss.item(),
                    "lr": sched.get_last_lr()[0],
                    "seconds": time.perf_counter() - t0,
                    "autocast": "bfloat16" if bf16 else "float32",
                    "attention": getattr(model.config, "_attn_implementation", None),
                }
                history.append(row)
                if log:
                    log(row)
            if out_of_time:
                break
    finally:  # also on an exception or an interrupted notebook cell
        if attn_impl is not None and model.config._attn_implementation != attn_impl:
            model.set_attn_implementation(attn_impl)  # rollouts keep what the model was built with
        set_gradient_checkpointing(model, False)
        model.eval()
    return history


def save_checkpoint(model, tokenizer, path: Path, meta: dict | None = None) -> Path:
    """save_pretrained into a temp dir, then rename: a crash never leaves half a checkpoint."""
    with atomic_dir(path) as tmp:
        save_policy(model, tokenizer, tmp)  # a LoRA model: the adapter and the base it loads onto
        if meta is not None:
            (tmp / "memkit.json").write_text(json.dumps(meta, indent=2, default=str))
    return Path(path)
