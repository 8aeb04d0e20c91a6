"""Behaviour cloning (SFT) on oracle trajectories: how the tiny model learns a format.

Every call of an oracle trajectory becomes one training sequence ``context_ids + output_ids``
with the behaviour-cloning loss on the output tokens:

    L_bc(θ) = − (1 / Σ_i |y_i|) Σ_i Σ_t log π_θ(y_{i,t} | x_i, y_{i,<t})

Deviation (tiny model only): a real policy arrives pretrained; the tiny model starts from
random weights and must first learn to read and copy entity names. ``context_weight`` adds a
language-modelling loss on the context tokens (prompt, memory, ``<information>``), a
stand-in for pretraining on the world text: passages repeat each name several times, which
is the signal that grows copying ("induction") heads. It is on by default (w = 1), scored on
a random half of the context tokens each step (``context_fraction``). Measured on MEM1 (hidden
128; 2-objective EM per question on 100 held-out tasks after 3000 steps of 16 calls, GPU sweep):
context fraction 1.0 -> 0.70, 0.5 -> 0.70, 0.25 -> 0.35-0.45, 0.1 -> 0.16; EM jumps between
steps 1500 (0.15) and 2500 (0.55) as the copying heads form, 6000 steps reach 0.85.
A cheaper route to those heads did not work: 200 steps of pure copying first (random token
strings repeated once, 32 x 49 tokens, 43 s; copy accuracy 1.0 after ~150 steps) and then
this recipe, in memkit sft's 10 minutes on a slow AVX2 machine, reached EM 0.01 after 986
steps (0.55 s each that hour), against 0.21 after 1,383 without it. It was no further along at
equal data either (loss 0.93 after 12,000 sequences; 0.82 for a batch-8 run without warm-up):
heads learnt on random strings did not carry over to names in passages, and the warmed model
began SFT at loss 23 instead of 16.
Nor did a different optimizer: Muon (``torch.optim.Muon`` on the 28 attention / MLP matrices,
AdamW on the tied embedding and the norms, the same warmup-stable-decay schedule), run for the
1,383 steps the 10 minutes allow on that machine, reached EM 0.19 at lr 0.02 and 0.005 (97%
invalid) at lr 0.05, against 0.16 for AdamW run the same way (100 held-out tasks, one seed,
``max_seconds=None``; the time-budgeted AdamW run reached 0.21). It would also cost time on a
CPU: torch's Muon orthogonalises in bfloat16, 1.56 s an optimizer step for the tiny model on an
AVX2 core against 0.015 s for AdamW.
On 2 AVX-512 CPU cores a float32 step takes ~0.2 s (0.42-0.55 s on an AVX2-only machine;
``torch.compile`` did not help there: 0.67 vs 0.69 s on unbucketed batches, after a 94 s first
step), so ``memkit sft``'s 10 minutes run ~2,850 of its 4000 MEM1 steps (EM 0.66; with a
3000-step cap: 2,998 steps, 0.635) and ~4,000 MemSearcher steps (shorter contexts: EM 0.715,
against 0.415 with the 3000-step cap). With the bf16 autocast it used to apply on every CPU,
a machine without AMX ran 1,588 MEM1 steps in the same 10 minutes and ended at EM 0.29 (see
``sft_uses_bf16``).
The figures above and below were measured with the earlier ``words4`` tokenizer, in which each
space between two words was a token of its own. The current one (``glue5``: a word carries its
leading space, ``models/tokenizer.py``) cuts MEM1's sequences short enough for ~1.5x more steps a
minute, and the copying comes sooner: on the same AVX2 machine ``memkit sft --method mem1`` ran
2,039 steps in its 10 minutes (0.28 s a step) and reached EM **0.655** (1,376 steps and 0.27 before).
Since the skill arrives late, the learning rate is held at its peak and decayed only over the
last fifth of the run (warmup-stable-decay): measured with ``memkit sft --method mem1`` (10
minutes, 2527 steps) EM **0.76**, against 0.52 with a cosine decay and otherwise the same
settings (lr 4e-3, 200 warmup steps; with lr 3e-3 and 50 warmup steps the cosine gave 0.32).

    L(θ) = L_bc(θ) + w_ctx · (− mean_{context tokens} log π_θ(x_{i,t} | x_{i,<t}))

Set ``context_weight=0`` for the papers' pure output-only SFT. RL never uses this loss: its
loss mask covers generated tokens only.

The oracle's imperfection knobs leave mistakes in the data on purpose, so the SFT'd model is
a reasonable but improvable start for RL (MEM1 App. F.1 compares RL against SFT).
"""
from __future__ import annotations

import math
import random
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from memkit.agents.base import OracleConfig
from memkit.models.loading import decoder_and_head


@dataclass
class SFTConfig:
    method: str = "mem1"
    objectives: tuple[int, ...] = (1, 2)  # k values of the training tasks
    n_tasks: int = 4000  # oracle tasks to clone (~15k calls). Measured (memkit sft, 10 min): 4000 ->
    # EM 0.32, 12000 (~45k calls, each seen about once) -> 0.305 (both at lr 3e-3): more data does not help
    steps: int = 4000  # optimizer steps (~0.2 s each for 16 x ~210 tokens, float32, 2 CPU threads).
    # The 10-minute budget (max_seconds) usually ends the run first: measured, MEM1 2,851 steps ->
    # EM 0.66 and MemSearcher 3,987 -> 0.715, against 0.635 and 0.415 with a 3000-step cap
    batch_size: int = 16  # measured on a slow 2-core AVX2 machine (memkit sft's 10 minutes): batch 8 ran
    # 2,211 steps at 0.26 s and reached EM 0.19, batch 16 1,383 steps at 0.42 s and 0.21. The copying skill
    # comes with sequences seen, not optimizer steps, so smaller batches do not buy it sooner
    lr: float = 4e-3  # measured there: lr 8e-3 -> EM 0.00 (92% invalid) after 1,173 steps; 4e-3 -> 0.21
    warmup: int = 200  # measured (memkit sft, 10 min): lr 3e-3 / warmup 50 -> EM 0.32, 4e-3 / 200 -> 0.52
    schedule: str = "wsd"  # after warmup: "wsd" (warmup-stable-decay: lr held, then a linear decay
    # over the last decay_fraction of the run) or "cosine". Measured (2-objective EM on 100 held-out
    # tasks): memkit sft 10 min, wsd 0.2 -> 0.76 (2527 steps), cosine -> 0.52 (2473 steps); 2400
    # steps on one thread, wsd 0.2 -> 0.655
    decay_fraction: float = 0.2  # wsd only: share of the run (steps or wall time) spent decaying to 0
    max_len: int = 768  # sequences longer than this are dropped (counted in the log)
    context_weight: float = 1.0  # w_ctx: LM loss on context tokens (0 = output-only SFT, see above)
    context_fraction: float = 0.5  # share of context tokens scored by L_ctx each step (a fresh random
    # subset per batch, an unbiased estimate of L_ctx). Measured (3000 steps, 2-objective EM on 100
    # held-out tasks): 1.0 -> 0.70, 0.5 -> 0.70, 0.25 -> 0.35-0.45, 0.1 -> 0.16; 0.5 costs 0.82x a step
    bf16: bool | None = None  # bfloat16 autocast for the forward/backward (weights and AdamW stay
    # float32). None = where it is faster (sft_uses_bf16): GPUs with bf16 and CPUs with AMX
    # tiles. Measured on this machine's AVX512-BF16 CPU *without* AMX (300 real MEM1 steps, 2
    # threads): bf16 370 ms a step, float32 219 ms, so float32 there
    max_seconds: float | None = 600.0  # wall-clock budget (pipeline.train_sft_model: data + training):
    # the schedule runs on max(step/steps, elapsed/budget) and training stops when either ends
    # (machine-dependent; None = by steps). The default is `memkit sft`'s 10 minutes, so a notebook
    # that trains the default model gets the same one as the command line
    k_docs: int = 1  # passages per search in the cloned trajectories (and the model's later rollouts):
    # the papers retrieve 3; one keeps the tiny model's contexts ~1.6x shorter (measured: oracle EM
    # stays 1.00 at 1-4 objectives, it re-searches when the top passage misses)
    seed: int = 0
    world_seed: int = 0
    oracle: OracleConfig = field(default_factory=lambda: OracleConfig(p_wasted_search=0.05, p_drop_fact=0.05))
    log_every: int = 50
    cpu_attention: str = "auto"  # attention kernel of CPU training: "eager", "sdpa" (same numbers,
    # tested to 1e-5) or "auto" = time both on the first steps and keep the faster (AttentionProbe).
    # Which wins depends on the CPU: eager 0.157 vs sdpa 0.205 s a step on an earlier 2-core machine,
    # sdpa 465 vs eager 526 ms on an AVX2-only AMD EPYC (medians of 6 alternating rounds of 20 MEM1
    # batches in one process). There `memkit sft --method mem1` with "auto" picked sdpa and ran 1,376
    # steps in its 10 minutes against 1,343 with eager (EM 0.27 vs 0.195, one seed each: noise-level)

    def __post_init__(self):
        lr_shape(self)  # an unknown schedule fails here, not after the data is built
        if self.cpu_attention not in ("auto", *AttentionProbe.KERNELS):
            raise ValueError(f"cpu_attention={self.cpu_attention!r}; use 'auto', 'eager' or 'sdpa'")


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

    ``output_mask`` is True on output tokens (the behaviour-cloning loss mask); context tokens
    are ``attn & ~output_mask``.
    """
    length = max(len(c) + len(o) for c, o in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    output_mask = torch.zeros_like(ids, dtype=torch.bool)
    attn = torch.zeros_like(ids)
    for i, (c, o) in enumerate(examples):
        seq = c + o
        ids[i, : len(seq)] = torch.tensor(seq)
        output_mask[i, len(c) : len(seq)] = True
        attn[i, : len(seq)] = 1
    return ids, attn, output_mask


def sft_loss(model, ids, attn, output_mask, context_weight: float = 0.0, context_keep=None) -> torch.Tensor:
    """``L_bc + w_ctx · L_ctx`` (the equations above); token ``t`` is predicted from ``< t``.

    ``context_keep`` (bool ``[B, T]``, optional): which context tokens enter ``L_ctx`` (a random
    subset, see ``SFTConfig.context_fraction``); None = all of them. The LM head runs only on
    the positions that are scored: it is ~25% of the tiny model's FLOPs per token at V ~ 3000,
    and the float32 log-softmax over ``[B, T, V]`` costs as much again (measured: a step with
    every context token scored takes 2.1x one that scores outputs only).
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
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()  # e.g. a DDP-wrapped model
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, T-1]
    loss = (nll * out).sum() / out.sum().clamp(min=1)
    if context_weight:
        loss = loss + context_weight * (nll * ctx).sum() / ctx.sum().clamp(min=1)
    return loss


def sft_uses_bf16(bf16: bool | None, device: torch.device) -> bool:
    """Does an SFT step autocast to bfloat16 (True) or run in plain float32 (False)?

    ``bf16=None`` picks bfloat16 only where the hardware has bf16 matrix units: a CUDA device
    that supports it, or a CPU with AMX tiles (not measured here: no AMX machine was at hand).
    AVX512-BF16 alone is not enough for the tiny model: its matmuls are small (hidden 128), so
    the casts around them cost more than the bf16 arithmetic saves (measured on such a CPU: 1.69x
    slower steps than float32). Pass ``bf16=True/False`` to choose yourself.
    """
    if bf16 is None:
        if device.type == "cuda":
            bf16 = torch.cuda.is_bf16_supported()
        elif device.type == "cpu":
            caps = getattr(torch.cpu, "get_capabilities", dict)()
            bf16 = bool(caps.get("amx_bf16") or caps.get("amx_tile"))
        else:
            bf16 = False
    return bool(bf16)


#: Optimizer steps by which the default recipe has learnt to copy names. With the glue5 tokenizer
#: (``models/tokenizer.py``), MEM1 on 2 AVX2 cores: EM 0.51 after 1,383 steps, 0.655 after the 2,039
#: that `memkit sft --method mem1`'s 10 minutes ran. (With the earlier words4 tokenizer the skill came
#: between steps 1500 (EM 0.15) and 2500 (0.55), and those 10 minutes ran 1,376 steps: EM 0.27.)
SKILL_STEPS = 2000


def budget_note(history: list[dict], cfg: SFTConfig, total_seconds: float, method: str) -> str | None:
    """A note naming the fix when the time budget stopped training before :data:`SKILL_STEPS`.

    ``total_seconds``: the whole SFT (oracle data + optimisation); the minutes suggested are the
    data time plus ``SKILL_STEPS`` steps at this run's measured pace, rounded up.
    """
    if not history or not cfg.max_seconds:
        return None
    steps = history[-1]["step"] + 1
    if steps >= min(cfg.steps, SKILL_STEPS):
        return None
    per_step = history[-1]["seconds"] / steps
    minutes = math.ceil((total_seconds - history[-1]["seconds"] + SKILL_STEPS * per_step) / 60)
    return (f"note: the {cfg.max_seconds / 60:g}-minute budget stopped SFT after {steps} of {cfg.steps} steps "
            f"({per_step:.2f} s a step on this machine). The tiny model has learnt to copy names by about step "
            f"{SKILL_STEPS}, so expect a lower EM; run `memkit sft --method {method} --max-minutes {minutes}` "
            f"for {SKILL_STEPS} steps here.")


class AttentionProbe:
    """Times eager against SDPA attention on SFT's first CPU steps and keeps the faster.

    After ``warmup`` steps (allocator and thread-pool start-up), steps alternate between the two
    kernels for ``rounds`` steps each; each step's time is divided by its batch's tokens (the
    length buckets differ), and the kernel with the lower median wins (ties: eager). Both give
    the same numbers, so the probe steps are ordinary training steps: nothing is spent but the
    slower kernel's share of ``2 * rounds`` steps.
    """

    KERNELS = ("eager", "sdpa")

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


def lr_shape(cfg: SFTConfig):
    """The learning-rate factor after warmup as a function of run progress ``f`` in [0, 1].

    * ``cosine``: ``(1 + cos(pi f)) / 2``;
    * ``wsd`` (warmup-stable-decay): 1 until ``f = 1 - d``, then ``(1 - f) / d`` down to 0
      (``d = cfg.decay_fraction``). It keeps the full learning rate for longer, which is what a
      short run needs here: the copying heads form late (see the module doc).
    """
    if cfg.schedule == "cosine":
        return lambda f: 0.5 * (1 + math.cos(math.pi * f))
    if cfg.schedule == "wsd":
        d = cfg.decay_fraction
        if not 0.0 < d <= 1.0:
            raise ValueError(f"decay_fraction={d} must be in (0, 1]; 0.2 decays over the last fifth of the run")
        return lambda f: min(1.0, (1.0 - f) / d)
    raise ValueError(f"unknown SFT schedule {cfg.schedule!r}; use 'wsd' or 'cosine'")


def train_sft(model, tokenizer, examples, cfg: SFTConfig, log=None, progress: bool = True) -> list[dict]:
    """AdamW with linear warmup, then ``cfg.schedule``; batches drawn from length-sorted buckets.

    With ``cfg.max_seconds`` the schedule runs on whichever of steps or wall time is further
    along, so a time-limited run still ends at learning rate 0.
    """
    shape = lr_shape(cfg)
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)  # the context subsets
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
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
            kernel = probe.kernel_for(step) if probe else None
            if kernel:
                model.set_attn_implementation(kernel)
            elif probe and probe.done(step):
                model.set_attn_implementation(probe.faster())
            t_step = time.perf_counter()
            keep = None
            if cfg.context_weight and cfg.context_fraction < 1.0:
                keep = torch.rand(ids.shape, generator=gen) < cfg.context_fraction
                keep = keep.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = sft_loss(model, ids, attn, output_mask, cfg.context_weight, keep)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if kernel:
                probe.record(kernel, time.perf_counter() - t_step, ids.numel())
            out_of_time = bool(cfg.max_seconds) and time.perf_counter() - t0 >= cfg.max_seconds
            if step % cfg.log_every == 0 or step == cfg.steps - 1 or out_of_time:
                row = {"step": step, "loss": loss.item(), "lr": sched.get_last_lr()[0], "seconds": time.perf_counter() - t0,
                       "autocast": "bfloat16" if bf16 else "float32",
                       "attention": getattr(model.config, "_attn_implementation", None)}
                history.append(row)
                if log:
                    log(row)
            if out_of_time:
                break
    finally:  # also on an exception or an interrupted notebook cell
        if attn_impl is not None and model.config._attn_implementation != attn_impl:
            model.set_attn_implementation(attn_impl)  # rollouts keep what the model was built with
        model.eval()
    return history


def save_checkpoint(model, tokenizer, path: Path, meta: dict | None = None) -> Path:
    """save_pretrained into a temp dir, then rename: a crash never leaves half a checkpoint."""
    import json

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if meta is not None:
        (tmp / "memkit.json").write_text(json.dumps(meta, indent=2, default=str))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def sft_config_dict(cfg: SFTConfig) -> dict:
    return asdict(cfg)
