"""``TrainConfig``'s groups of knobs that belong together: LoRA, the data (real questions and corpus),
the PPO clip, the KL term, PPO's critic, evaluation, checkpoints, and the runtime (knobs that change
speed, memory or hardware but not what is learnt). Torch-free like :mod:`memkit.rl.config`.

Each group is a field of ``TrainConfig`` (``cfg.eval.every``, ``cfg.runtime.attention``); its flags
and the flat keys of older checkpoints keep their names: a group's field metadata ``prefix`` is put
before each inner field's name (default: the group's name and ``_``, so ``eval.every`` is
``--eval-every`` / ``eval_every``; ``""`` for the runtime), and an inner field's metadata ``flat``
overrides the whole flat name (``critic.gamma`` is ``--gamma``): :func:`memkit.core.fields.flat_names`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memkit.rl.choices import ATTENTION_PATHS, KL_KINDS

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("no", "bf16", "fp16")
PARAM_DTYPES = ("auto", "float32", "bfloat16")
ROLLOUT_BACKENDS = ("hf", "vllm")  # memkit.models.backend.named_backend
LORA_TARGET_SETS = ("attention", "all-linear")  # the keys of memkit.models.LORA_TARGETS


@dataclass
class LoRAConfig:
    """LoRA adapters (peft) instead of full fine-tuning; flags ``--lora``, ``--lora-r``, ``--lora-alpha``,
    ``--lora-targets``."""

    enabled: bool = field(default=False, metadata={"flat": "lora"})
    """Train LoRA adapters (peft) instead of all weights; the reference policy is then the base
    model with adapters disabled (no second copy in memory)."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scale numerator (update scaled by alpha / r)."""
    targets: str = field(default="attention", metadata={"choices": LORA_TARGET_SETS})
    """Which linear layers get adapters: ``attention`` (q/k/v/o projections) or ``all-linear`` (the
    MLP too; ``memkit.models.LORA_TARGETS``)."""


#: passages per search on a real corpus: the answerable filter's own top k (memkit.world.offline), so a
#: kept question's evidence is in the first search's observation
REAL_K_DOCS = 5


@dataclass
class DataConfig:
    """Where the tasks come from: the synthetic world of ``world_seed``, or real questions over a real
    corpus (:func:`memkit.lab.real.data_kit`); flags ``--world-seed``, ``--tasks``, ``--corpus``,
    ``--answerable``, ``--retriever``, shared by ``memkit sft``, ``train``, ``eval`` and ``rollout``."""

    tasks: str | None = None
    """Questions the tasks are composed of (MEM1 Prompt 1, ``objectives`` questions each): "offline"
    (answerable NQ + TriviaQA, split by a hash of the id into sft / rl / test questions), a FlashRAG /
    Search-R1 ``.jsonl`` / ``.parquet``, a hub id, DPR topics, HotpotQA ``.json`` (a file or hub split
    is used whole: it is a split already), or ``memkit world``'s tasks.jsonl (``eval`` and ``rollout``
    keep its tasks as written). None = the synthetic world's questions."""
    corpus: str | None = None
    """Passages the search tool retrieves from: "offline" (10,033 Wikipedia leads), a wiki-18 style
    ``.jsonl`` or a ``.json`` of leads. None = the synthetic world's passages."""
    answerable: bool = False
    """Keep only the questions the corpus holds evidence for (``memkit.world.answerable``), with the
    one-hop decomposition the scripted oracle follows (needs ``corpus``)."""
    retriever: str = "bm25"
    """bm25, dense, bm25:<saved index dir> or faiss:<index file> (``memkit.retrieval.spec``)."""
    world_seed: int = 0
    """Synthetic world the tasks come from; with real questions and corpus, still the world whose
    tokenizer the tiny models use."""

    def check(self) -> "DataConfig":
        """Self, or one clear error for a combination that cannot work (before anything loads)."""
        if self.answerable and not self.corpus:
            raise ValueError("--answerable keeps the questions the corpus can answer: give --corpus too")
        return self

    @property
    def real(self) -> bool:
        """Whether anything differs from the synthetic world."""
        return bool(self.tasks or self.corpus)


@dataclass
class ClipConfig:
    """The PPO ratio clip of the policy loss (``memkit.rl.losses.ppo_clip_loss``); flags ``--clip-*``."""

    low: float = 0.2
    """PPO clip epsilon (lower, and upper unless ``clip_high`` is set)."""
    high: float | None = None
    """Upper clip epsilon (DAPO clip-higher, e.g. 0.28); None = ``clip_low``."""
    ratio_c: float | None = None
    """Dual-clip bound c > 1 for negative advantages (None = off)."""


@dataclass
class KLConfig:
    """The KL(pi || pi_ref) term of the loss (``memkit.rl.losses.kl_penalty``); flags ``--kl-*``."""

    coef: float = 0.001
    """Weight of KL(pi || pi_ref) in the loss (0 = no reference model is kept)."""
    kind: str = field(default="low_var_kl", metadata={"choices": KL_KINDS})
    """KL estimator: k1 | k2 | k3 (= low_var_kl) | abs ... (``memkit.rl.losses.kl_penalty``)."""


@dataclass
class CriticConfig:
    """PPO's critic and GAE (``algo="ppo"``, credit ``gae``; MEM1 §3.2)."""

    lr: float = 5e-5
    """Critic learning rate (ppo only)."""
    gamma: float = field(default=1.0, metadata={"flat": "gamma"})
    """PPO discount over trained tokens."""
    lam: float = field(default=1.0, metadata={"flat": "lam"})
    """PPO GAE lambda."""
    whiten_advantages: bool = field(default=True, metadata={"flat": "whiten_advantages"})
    """PPO: whiten GAE advantages over the whole rollout batch, all processes (verl)."""
    vf_clip: float | None = field(default=0.5, metadata={"flat": "vf_clip"})
    """PPO value clipping range around the old values (None = off)."""


@dataclass
class EvalConfig:
    """Greedy evaluation on held-out tasks during training; flags ``--eval-*``."""

    every: int = 10
    """Greedy evaluation on held-out tasks every N steps (0 = never); also after the last step."""
    at_start: bool = True
    """Also evaluate before the first step (the step-0 point of learning curves)."""
    tasks: int = 32
    """Held-out tasks per objective count (``memkit.world.held_out_tasks(world, eval_tasks, k, eval_seed)``)."""
    seed: int = 1000
    """Seed base of those tasks. 1000 = ``evaluation.evaluate``'s default test tasks (the first
    ``eval_tasks`` of them: a smaller n gives a prefix of the same list). To keep a *validation*
    set apart from the tasks a final table reports, give it another base (notebook 03 uses 3000:
    other compositions of the same held-out test questions).
    Must lie in ``memkit.world.EVAL_SEEDS`` (1000-9999), which training tasks never use."""
    objectives: tuple[int, ...] = (2,)
    """Objective counts evaluated."""


@dataclass
class BudgetConfig:
    """What stops the loop before ``steps`` (None = no such budget); flags ``--max-seconds`` (``--max-minutes``),
    ``--max-rollout-tokens``. The loop stops before a step would start past either, then evaluates and saves
    where it stopped (``Trainer.run``)."""

    seconds: float | None = None
    """Wall-clock budget of the training loop."""
    rollout_tokens: int | None = None
    """Tokens the policy may generate in training rollouts (:func:`memkit.metrics.efficiency.rollout_tokens` of
    the steps so far): two arms get equal tokens when one runs its steps and the other gets its count."""


@dataclass
class SaveConfig:
    """Checkpoints in ``out_dir/checkpoints``; flags ``--save-every``, ``--keep-checkpoints``."""

    every: int = 10
    """Checkpoint every N steps (0 = only at the end)."""
    keep: int = field(default=2, metadata={"flat": "keep_checkpoints"})
    """Checkpoints kept on disk (older ones are deleted after a new one is complete)."""


@dataclass
class RuntimeConfig:
    """How the update runs: knobs that change speed, memory or hardware, never what is learnt (up
    to float rounding); flags without a prefix (``--micro-batch-size``, ``--attention``, ...)."""

    micro_batch_size: int = 8
    """Trajectories per forward pass per process (gradient accumulation inside a mini-batch;
    the update is the same for any value, up to float rounding)."""
    attention: str = field(default="auto", metadata={"choices": ATTENTION_PATHS})
    """Attention of the update's forwards over 2D-masked rows (``mem1_mask``, ``mem1_exact``):
    ``dense`` (sdpa over the whole [L, L] mask: every masked cell computed, which made packing
    slower than ``separate`` rows), ``blocks`` (only the keys each 64-query block may see, no
    compile) or ``flex`` (``flex_attention`` with a BlockMask; compiled, CUDA only). ``auto`` =
    ``blocks`` on CPU, ``dense`` on a GPU, where the tiny model is launch-bound
    (``packed_forward.resolve_attention``, measured by ``benchmarks/grpo_step.py``). The same
    log-probs to ~1e-6 either way; ``separate`` rows are plain causal and ignore it."""
    row_groups: int = 4
    """A micro-batch's rows run as up to this many forward passes of similar-length rows, each
    padded only to its own longest row (``packing.length_groups``); 1 = one forward padded to the
    longest row. The same log-probs either way: rows never attend to each other. Multi-process
    runs keep one forward per micro-batch (DDP's reducer expects one forward per backward)."""
    recompute_old_logprobs: bool | None = None
    """Recompute old log-probs with the packed forward before updating (verl; the mean gap to the
    rollout's is logged as ``old_logprob_gap``). None = only where they differ from what the rollout
    recorded: ``mem1_mask`` packing (App. B.7's position ids) or mixed precision. ``separate`` and
    ``mem1_exact`` rows reproduce the rollout's log-probs (tested to 1e-4), so their rollout values
    serve as old log-probs and the update saves a forward pass (``benchmarks/update_cost.py``)."""
    log_entropy: bool = True
    """Compute the policy entropy on trained tokens (costs a [B, L, V] softmax)."""
    device: str = field(default="auto", metadata={"choices": DEVICES})
    """``auto`` (GPU if available), ``cpu`` or ``cuda``; multi-GPU via ``accelerate launch``/``torchrun``."""
    mixed_precision: str = field(default="no", metadata={"choices": PRECISIONS})
    """``no`` | ``bf16`` | ``fp16`` (accelerate autocast; bf16 on GPUs)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward of the update instead of keeping
    them (``memkit.models.checkpointed_training``): activation memory ~ layers x tokens x hidden
    instead of every intermediate; ~1/3 more compute. The same log-probs and gradients (tested to
    1e-5 in fp32)."""
    dtype: str = field(default="auto", metadata={"choices": PARAM_DTYPES})
    """Parameter dtype the policy loads in: ``auto`` = bfloat16 for LoRA on a GPU (the frozen base;
    adapters stay float32), float32 otherwise (AdamW's master weights; the CPU's exact log-prob
    checks): ``memkit.lab.policies.param_dtype``. ``float32`` / ``bfloat16`` force it."""
    ref_dtype: str = field(default="auto", metadata={"choices": PARAM_DTYPES})
    """Parameter dtype of the KL reference of full fine-tuning, a frozen copy of the initial policy
    (``memkit.models.frozen_copy``; LoRA's reference is the base with adapters disabled, no copy):
    ``auto`` = bfloat16 on a GPU (half the bytes of a float32 copy: 14 GB instead of 28 for 7B), the
    policy's own dtype on CPU (the exact log-prob checks); ``float32`` / ``bfloat16`` force it. Its
    log-probs and the KL term stay float32 (the head's logits are cast before the log-softmax); log pi_ref
    moves by bf16 rounding of weights and activations: ~1e-3 on the random tiny model
    (``tests/rl/test_reference.py``), ~0.03 nats on average for SmolLM2-135M, which puts a floor of
    ~E[gap^2] / 2 under the k3 KL (measured: docs/findings.md, 'A shared LoRA critic and a bf16 reference')."""
    min_new_tokens: int | None = None
    """Rollouts: every call may write at least this many tokens. None = the format's own budget for
    the kit's tiny models, 512 for a pretrained chat model, which reasons in prose before its tags
    (``memkit.rollout.engine.output_floor``); a cut-off turn is invalid, reward 0. Not speed only:
    a longer budget changes what a real model can finish."""
    backend: str = field(default="hf", metadata={"choices": ROLLOUT_BACKENDS})
    """Rollout engine: ``hf`` (memkit's decode loop over the training model) or ``vllm`` (vLLM with its
    own copy of the weights, reloaded after every optimizer step: ``memkit.models.vllm_backend``; install
    with ``make setup-vllm``). The same samples' law and log-probs (tested to 1e-4); only speed differs."""
    backend_dtype: str = field(default="auto", metadata={"choices": PARAM_DTYPES})
    """The vLLM engine's weight dtype: ``auto`` = the policy's (float32 on CPU: the exact log-prob
    checks); ``bfloat16`` rolls out from a bf16 copy while the trainer keeps its float32 weights (verl's
    split), so the recorded log-probs are not the trainer's and old log-probs are recomputed by a forward
    (``old_logprob_gap`` logs the difference). Faster where the CPU has bf16 matrix units (measured:
    docs/findings.md, 'a bf16 engine beside float32 training'). ``hf`` decodes with the training model
    itself and takes only ``auto``."""


__all__ = [
    "BudgetConfig",
    "LoRAConfig",
    "ClipConfig",
    "KLConfig",
    "CriticConfig",
    "EvalConfig",
    "SaveConfig",
    "RuntimeConfig",
    "DEVICES",
    "PRECISIONS",
    "LORA_TARGET_SETS",
    "PARAM_DTYPES",
    "ROLLOUT_BACKENDS",
]
