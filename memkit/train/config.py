"""The configs of supervised training: behaviour cloning (:class:`SFTConfig`, ``memkit sft``) and the
tiny base's pretraining (:class:`PretrainConfig`, ``memkit pretrain``), one documented field per knob.

They import no torch, so the command line builds its flags and reports a bad value in well under a
second; the training that reads them lives in :mod:`memkit.train.sft` and :mod:`memkit.train.pretrain`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from memkit.agents import QA_METHODS
from memkit.agents.base import OracleConfig
from memkit.rl.groups import REAL_K_DOCS, DataConfig, LoRAConfig

#: learning-rate shapes after warmup (:func:`lr_shape`)
SCHEDULES = ("wsd", "cosine")
#: CPU attention kernels training can time and pick between (:class:`memkit.train.sft.AttentionProbe`)
ATTENTION_KERNELS = ("eager", "sdpa")


@dataclass
class SFTConfig:
    """Every knob of behaviour cloning (``memkit sft`` has one flag per field)."""

    method: str = field(default="mem1", metadata={"choices": QA_METHODS})
    """Memory format whose oracle is cloned (``memkit.agents.QA_METHODS``)."""
    method_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the format (``get_method``), e.g. memact ``{"schedule": "window"}``."""
    objectives: tuple[int, ...] = (1, 2)
    """Questions per training task (k values)."""
    n_tasks: int = 4000
    """Oracle tasks to clone (~15k calls); more data does not help in the 10-minute budget
    (measured: docs/findings.md, 'SFT recipe')."""
    steps: int = 4000
    """Optimizer steps, a cap: the 10-minute budget (``max_seconds``) usually ends the run first."""
    batch_size: int = 16
    """Sequences per optimizer step. The copying skill comes with sequences seen, not optimizer
    steps, so smaller batches do not buy it sooner (measured: docs/findings.md, 'SFT recipe')."""
    lr: float | None = None
    """Peak learning rate (AdamW). None = :func:`resolve_sft`: 4e-3 for the tiny model (twice as high
    diverges; measured: docs/findings.md, 'SFT recipe'), 1e-3 for LoRA adapters on a pretrained
    model (SmolLM2's format in 19 steps: docs/findings.md, 'A real model on 2 cores'), 1e-5 for a
    pretrained model trained in full."""
    warmup: int | None = None
    """Linear warmup steps. None = 200 for the tiny model; 5 for a pretrained one, whose 2-core SFT
    is tens of steps (a 200-step warmup kept its lr under 1.5e-5 for a whole 12-minute run:
    docs/findings.md, 'A real model on 2 cores')."""
    schedule: str = field(default="wsd", metadata={"choices": SCHEDULES})
    """After warmup: "wsd" (warmup-stable-decay: lr held, then a linear decay over the last
    decay_fraction of the run) or "cosine". wsd keeps the peak rate until the late-arriving
    copying skill has formed (measured: docs/findings.md, 'SFT recipe')."""
    decay_fraction: float = 0.2
    """wsd only: share of the run (steps or wall time) spent decaying to 0."""
    max_len: int | None = None
    """Sequences longer than this are dropped (counted in the log). None = 768 tokens for the tiny
    model (its compact prompt), 2048 for a pretrained model (the paper's prompt in its chat template)."""
    context_weight: float | None = None
    """w_ctx: LM loss on context tokens (0 = output-only SFT, see the module doc). None = 1 for the tiny
    model, which learns the language of the world from its contexts too; 0 for a pretrained model,
    which only has the format to learn (and the [T, vocab] logits of its contexts would cost GBs)."""
    context_fraction: float = 0.5
    """Share of context tokens scored by L_ctx each step (a fresh random subset per batch, an
    unbiased estimate of L_ctx). Half is as good as all of them and cheaper; a quarter is worse
    (measured: docs/findings.md, 'SFT recipe')."""
    bf16: bool | None = None
    """bfloat16 autocast for the forward/backward (weights and AdamW stay float32). None = GPUs
    with bf16, float32 on CPUs (:func:`sft_uses_bf16`; measured: docs/findings.md, 'SFT recipe')."""
    max_seconds: float | None = 600.0
    """Wall-clock budget (``memkit.lab.runs.train_sft_model``: data + training): the schedule runs on
    max(step/steps, elapsed/budget) and training stops when either ends (machine-dependent; None =
    by steps). The default is `memkit sft`'s 10 minutes, so a notebook that trains the default
    model gets the same one as the command line."""
    k_docs: int | None = None
    """Passages per search in the cloned trajectories (and the model's later rollouts). None = 1 on
    the synthetic world: the papers retrieve 3; one keeps the tiny model's contexts ~1.6x shorter at
    unchanged oracle EM (the oracle re-searches when the top passage misses); on a real corpus
    (``data.corpus``) ``REAL_K_DOCS`` = 5, the answerable filter's own top k, so the evidence of a
    kept question is in the first search's passages."""
    init: str = "scratch"
    """Where SFT starts: "scratch" (a fresh random tiny model seeded by seed), "base" (the pretrained
    tiny base of `memkit pretrain` with its default flags, trained first if missing: SFT then only
    learns the format), or a policy spec / checkpoint directory to continue from, e.g. tiny-sft:TAG
    (the same minutes of more SFT, RL's baseline), or a pretrained model: "smollm2-135m", a hub id
    (its own tokenizer and chat template; usually with ``lora``)."""
    seed: int = 0
    """Seeds the training tasks, the oracle's imperfections and the model's init ("scratch")."""
    data: DataConfig = field(default_factory=DataConfig, metadata={"prefix": ""})
    """The synthetic world of ``world_seed``, or real questions over a real corpus (``--world-seed``,
    ``--tasks``, ``--corpus``, ``--answerable``, ``--retriever``; :class:`memkit.rl.groups.DataConfig`): the
    oracle's tasks are composed of the source's sft questions (``memkit.world.training_tasks``)."""
    lora: LoRAConfig = field(default_factory=lambda: LoRAConfig(r=32, alpha=64, targets="all-linear"))
    """LoRA adapters instead of all weights (``--lora``, ``--lora-r``, ``--lora-alpha``, ``--lora-targets``):
    what format SFT of a pretrained model uses; saved as the adapter plus the base it loads onto
    (:mod:`memkit.models.adapters`)."""
    oracle: OracleConfig = field(default_factory=lambda: OracleConfig(p_wasted_search=0.05, p_drop_fact=0.05))
    """Imperfection knobs of the cloned oracle (mistakes left in the data so RL has room)."""
    log_every: int = 50
    """Log a row every N steps."""
    gradient_checkpointing: bool | None = None
    """Recompute each layer's activations in the backward instead of keeping them (one hidden state
    per layer kept: :func:`memkit.models.set_gradient_checkpointing`). None = on for a pretrained
    model (SmolLM2's batch of 16 calls held ~18 GB without it), off for the tiny one."""
    cpu_attention: str = field(default="auto", metadata={"choices": ("auto", *ATTENTION_KERNELS)})
    """Attention kernel of CPU training: "eager", "sdpa" (same numbers, tested to 1e-5) or "auto" =
    time both on the first steps and keep the faster (:class:`AttentionProbe`). Which wins depends
    on the CPU (measured: docs/findings.md, 'SFT recipe')."""

    def __post_init__(self):
        lr_shape(self)  # an unknown schedule fails here, not after the data is built
        if self.cpu_attention not in ("auto", *ATTENTION_KERNELS):
            raise ValueError(f"cpu_attention={self.cpu_attention!r}; use 'auto', 'eager' or 'sdpa'")


@dataclass
class PretrainConfig:
    """Every knob of the tiny base's pretraining (``memkit pretrain`` has one flag per field)."""

    seq_len: int = 256
    """Tokens per packed training sequence (documents are cut at row ends)."""
    batch_size: int = 16
    """Sequences per optimizer step."""
    steps: int = 20000
    """Optimizer steps, a cap: the time budget (``max_seconds``) usually ends the run first."""
    lr: float = 4e-3
    """Peak learning rate (AdamW), SFT's measured peak for this model."""
    warmup: int = 200
    """Linear warmup steps."""
    schedule: str = field(default="wsd", metadata={"choices": SCHEDULES})
    """After warmup: "wsd" (held, then a linear decay over the last decay_fraction of the run) or
    "cosine" (:func:`lr_shape`)."""
    decay_fraction: float = 0.2
    """wsd only: share of the run (steps or wall time) spent decaying to 0."""
    max_seconds: float | None = 480.0
    """Wall-clock budget of the training (all sessions of a resumed run together): the schedule
    runs on max(step/steps, elapsed/budget) and training stops when either ends (None = by steps)."""
    copy_fraction: float = 0.7
    """Share of documents that are copy/extract text; the rest are world passages."""
    heldout_passages: int = 16
    """Passages of the task world (never trained on) for the held-out perplexity."""
    seed: int = 0
    """Seeds the model's init and the data stream."""
    world_seed: int = 0
    """The task world: its tokenizer is used; its text is not (see TEXT_WORLD_OFFSET)."""
    bf16: bool | None = None
    """bfloat16 autocast (weights and AdamW stay float32); None = CUDA with bf16, float32 on CPUs
    (:func:`memkit.train.sft.sft_uses_bf16`)."""
    cpu_attention: str = field(default="auto", metadata={"choices": ("auto", *ATTENTION_KERNELS)})
    """Attention kernel of CPU training: "eager", "sdpa" or "auto" = time both on the first steps of
    each session and keep the faster (:class:`memkit.train.sft.AttentionProbe`). Same numbers to ~1e-5;
    an exact resume needs a fixed kernel."""
    log_every: int = 50
    """Log a row (mean loss since the last row) every N steps."""
    checkpoint_every_seconds: float = 60.0
    """Save a resumable checkpoint this often (an interrupted run loses at most this much)."""

    def __post_init__(self):
        lr_shape(self)  # an unknown schedule fails here
        if not 0.0 <= self.copy_fraction <= 1.0:
            raise ValueError(f"copy_fraction={self.copy_fraction} must be in [0, 1]")
        if self.cpu_attention not in ("auto", *ATTENTION_KERNELS):
            raise ValueError(f"cpu_attention={self.cpu_attention!r}; use 'auto', 'eager' or 'sdpa'")
        if self.seq_len < 8 or min(self.batch_size, self.warmup, self.steps, self.log_every) < 1:
            raise ValueError("seq_len must be >= 8; batch_size, warmup, steps and log_every >= 1")
        if self.heldout_passages < 0:
            raise ValueError(f"heldout_passages={self.heldout_passages} must be >= 0")


def resolve_sft(cfg: SFTConfig, pretrained: bool) -> SFTConfig:
    """``cfg`` with its model-dependent defaults (the fields left at None) filled in for a tiny model
    or a ``pretrained`` one (a model with its own chat template): ``lr``, ``max_len``, ``warmup``,
    ``context_weight`` and ``gradient_checkpointing`` (see each field), and ``k_docs`` for the corpus."""
    return replace(
        cfg,
        lr=cfg.lr if cfg.lr is not None else (1e-3 if cfg.lora.enabled else 1e-5) if pretrained else 4e-3,
        max_len=cfg.max_len if cfg.max_len is not None else 2048 if pretrained else 768,
        warmup=cfg.warmup if cfg.warmup is not None else 5 if pretrained else 200,
        context_weight=cfg.context_weight if cfg.context_weight is not None else 0.0 if pretrained else 1.0,
        gradient_checkpointing=(cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else pretrained),
        k_docs=cfg.k_docs if cfg.k_docs is not None else REAL_K_DOCS if cfg.data.corpus else 1,
    )


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
