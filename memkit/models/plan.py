"""GPU memory plan for RL / SFT of a causal LM: what a training step holds per GPU, term by term, and
the largest micro-batch that fits (``memkit plan``).

Why: whether a 7B GRPO run fits an 80 GB GPU (LoRA? how many sequences per micro-batch?) is otherwise
learnt from out-of-memory errors minutes into a run. Each term is a function of the architecture (:class:`Arch`:
an HF config or a preset, nothing downloaded), its equation in its docstring, checked on CPU against real
tensors by tests/models/test_plan.py (parameters, gradients, AdamW state, saved activations, KV cache).

Notation: T tokens of a micro-batch (micro_batch x seq_len), L layers, h hidden, i intermediate,
a / g query / key-value heads of size d, V vocab, b bytes of the parameter dtype (2 for bf16),
f = 4 (fp32), N GPUs. Conventions:

* Full fine-tuning is mixed precision: b-byte weights and gradients, fp32 master weights (when b < 4)
  and two fp32 AdamW moments: 2 + 2 + 4 + 8 = 16 bytes per parameter in bf16 (the ZeRO paper's count).
  memkit's trainers keep fp32 weights under bf16 autocast: ``dtype="fp32"`` plans that, activations
  counted in fp32 (an upper bound: autocast runs most of them in bf16).
* LoRA: peft keeps the adapters in fp32 (its default), so their gradients and moments are fp32; the
  base is frozen and, with adapters disabled, is the reference policy: no second copy.
* ``zero=3`` (FSDP full shard / ZeRO-3) divides weights, gradients, AdamW state and reference by N, plus
  two unsharded layers (gathered, prefetched); ``zero=2`` (DeepSpeed ZeRO-2) divides gradients and AdamW
  state only; ``zero=0`` (DDP) keeps full copies. Batches are per GPU.
* Activations are in the parameter dtype, attention is a fused SDPA kernel (flash / memory-efficient:
  the s^2 scores are never stored). A padding mask with grouped-query attention makes transformers
  repeat k and v to all heads (+2*b*a*d per token per layer) and may pick the math kernel (s^2).
* Rollouts and training steps alternate on a GPU (memkit's HF loop): the KV cache and the activations
  are never live together, the total counts the larger.
* GB = 2^30 bytes. Not counted: the CUDA context and allocator fragmentation (``reserve``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

GB, F32 = 2**30, 4  # bytes of a GB (2^30) and of an fp32 number
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
SUPPORTED = ("llama", "mistral", "qwen2")
#: the linear layers of a decoder layer, LoRA's possible targets
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """The numbers of a Llama / Qwen2-shaped decoder that memory depends on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int = 0
    """0 = hidden // heads."""
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def shape(self, module: str) -> tuple[int, int]:
        """(in, out) features of a linear layer: q / k / v / o, gate / up / down."""
        h, i, q, g = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, g),
            "v_proj": (h, g),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }[module]


#: configs that need no download (the models' config.json numbers)
PRESETS = {
    "qwen2.5-0.5b": Arch(896, 4864, 24, 14, 2, 151936, True, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-3b": Arch(2048, 11008, 36, 16, 2, 151936, True, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-7b": Arch(3584, 18944, 28, 28, 4, 152064, False, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-14b": Arch(5120, 13824, 48, 40, 8, 152064, False, qkv_bias=True, model_type="qwen2"),
}


def arch_from_config(cfg) -> Arch:
    """The :class:`Arch` of a transformers config (Llama, Mistral, Qwen2)."""
    if cfg.model_type not in SUPPORTED:
        raise ValueError(
            f"memkit plan counts {', '.join(SUPPORTED)} decoders; model_type {cfg.model_type!r} is "
            f"not one; use a preset ({', '.join(PRESETS)}) of similar size"
        )
    bias = bool(getattr(cfg, "attention_bias", False))
    return Arch(
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads or cfg.num_attention_heads,
        cfg.vocab_size,
        bool(cfg.tie_word_embeddings),
        getattr(cfg, "head_dim", None) or 0,
        qkv_bias=bias or cfg.model_type == "qwen2",
        o_bias=bias,
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        model_type=cfg.model_type,
    )


def resolve_arch(spec: str) -> Arch:
    """A preset, ``tiny`` / ``smollm2-135m`` (loaded, ~1 s / ~20 s the first time), a local checkpoint
    directory or a hub id (their config.json only)."""
    if spec in PRESETS:
        return PRESETS[spec]
    from memkit.models.loading import _HF_ID, run_policy_dir

    choices = f"a preset ({', '.join(PRESETS)}), tiny, smollm2-135m or a directory with config.json"
    if spec in ("tiny", "smollm2-135m", "smollm2", "SmolLM2-135M-Instruct"):
        from memkit.models.loading import load_policy

        return arch_from_config(load_policy(spec).model.config)
    path = Path(spec).expanduser()
    if not path.is_dir() and (spec.startswith(("/", ".", "~")) or not _HF_ID.match(spec)):
        raise ValueError(f"unknown model {spec!r} (not a preset, nor a directory); use {choices}")
    from transformers import AutoConfig

    try:
        return arch_from_config(AutoConfig.from_pretrained(str(run_policy_dir(path) if path.is_dir() else spec)))
    except OSError as e:
        raise ValueError(
            f"could not read the config of {spec!r} ({str(e).splitlines()[0][:160]}); offline, use {choices}"
        ) from None


@dataclass(frozen=True)
class Setup:
    """How the model is trained. ``lora_r`` / ``lora_targets`` None = :class:`~memkit.models.LoraSpec`'s."""

    dtype: str = "bf16"
    lora: bool = False
    lora_r: int | None = None
    lora_targets: tuple[str, ...] | None = None
    gpus: int = 1
    zero: int = 0
    reference: bool = True
    """Keep a reference policy (KL term); False = no KL (kl_coef 0)."""
    b: int = field(init=False)

    def __post_init__(self):
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {self.dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
        if self.gpus < 1 or self.zero not in (0, 2, 3):
            raise ValueError(
                f"--gpus {self.gpus} --zero {self.zero}: need gpus >= 1, zero 0 (DDP), 2 (gradients and AdamW "
                "sharded) or 3 (full shard)"
            )
        if self.lora and (self.lora_r is None or self.lora_targets is None):
            from memkit.models.loading import LoraSpec

            object.__setattr__(self, "lora_r", self.lora_r or LoraSpec.r)
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets or LoraSpec.target_modules))
        if self.lora and (self.lora_r < 1 or set(self.lora_targets) - set(MODULES)):
            raise ValueError(
                f"--lora-r {self.lora_r}, targets {self.lora_targets}: need r >= 1 and targets among "
                f"{', '.join(MODULES)}"
            )
        object.__setattr__(self, "b", DTYPE_BYTES[self.dtype])

    @property
    def shard(self) -> float:
        """The share of the weights and the reference each GPU holds (1/N under zero 3)."""
        return 1 / self.gpus if self.zero == 3 else 1.0

    @property
    def state_shard(self) -> float:
        """The share of the gradients and AdamW state each GPU holds (1/N under zero 2 and 3)."""
        return 1 / self.gpus if self.zero >= 2 else 1.0


def layer_params(a: Arch) -> int:
    """One decoder layer: q, k, v, o (h*a*d + 2*h*g*d + a*d*h, + (a+2g)*d biases in Qwen2), MLP 3*h*i, norms 2*h."""
    attn = sum(math.prod(a.shape(m)) for m in MODULES[:4])
    attn += a.qkv_bias * (a.heads + 2 * a.kv_heads) * a.head_dim + a.o_bias * a.hidden
    return attn + 3 * a.hidden * a.intermediate + a.mlp_bias * (2 * a.intermediate + a.hidden) + 2 * a.hidden


def param_count(a: Arch) -> int:
    """n = V*h (embeddings) + L * layer_params + h (final norm) + V*h (LM head, 0 if tied)."""
    return a.vocab * a.hidden * (1 if a.tied else 2) + a.layers * layer_params(a) + a.hidden


def lora_param_count(a: Arch, s: Setup) -> int:
    """L * sum over target modules of r * (in + out) (A: in x r, B: r x out)."""
    return a.layers * sum(s.lora_r * sum(a.shape(m)) for m in s.lora_targets) if s.lora else 0


def trainable_count(a: Arch, s: Setup) -> int:
    return lora_param_count(a, s) if s.lora else param_count(a)


def weight_bytes(a: Arch, s: Setup) -> float:
    """(n*b + n_lora*f) / N' (N' = N under zero 3, else 1), + 2 * layer_params * b under zero 3 (gathered)."""
    gathered = 2 * layer_params(a) * s.b if s.zero == 3 and s.gpus > 1 else 0
    return (param_count(a) * s.b + lora_param_count(a, s) * F32) * s.shard + gathered


def gradient_bytes(a: Arch, s: Setup) -> float:
    """LoRA: n_lora * f (fp32 adapters); full: n * b (gradients in the parameter dtype); / N (zero 2, 3)."""
    return (lora_param_count(a, s) * F32 if s.lora else param_count(a) * s.b) * s.state_shard


def optimizer_bytes(a: Arch, s: Setup) -> float:
    """AdamW: 2 * f per trainable parameter (exp_avg, exp_avg_sq), + f * n fp32 master weights for full
    fine-tuning with b < 4; / N (zero 2, 3)."""
    master = param_count(a) * F32 if not s.lora and s.b < F32 else 0
    return (2 * F32 * trainable_count(a, s) + master) * s.state_shard


def reference_bytes(a: Arch, s: Setup) -> float:
    """0 under LoRA (the base with adapters disabled) or without KL; else n * b / N' (a frozen copy)."""
    return 0.0 if s.lora or not s.reference else param_count(a) * s.b * s.shard


def layer_activation_bytes(a: Arch, s: Setup) -> int:
    """Bytes one decoder layer saves for backward, per token (measured tensor by tensor on the tiny model):

    * each RMSNorm: its fp32 input f*h and 1/rms f; in full FT also the normalised b*h (the weight trains)
      and the output b*h that q/k/v (norm 1) or gate/up (norm 2) save;
    * SDPA: rotated q b*a*d, rotated k b*g*d, v b*g*d, output b*a*d (= o_proj's input), logsumexp f*a;
    * MLP: gate, silu(gate), up (3*b*i), and in full FT the product b*i that down_proj saves;
    * LoRA: per adapted module its fp32 A output f*r and, unless fp32, its input cast to fp32 f*in.

    Full FT: 8h + 8 + 4a + b*(4h + 2ad + 2gd + 4i)  (= 4*(8h + 2gd + 4i + a + 2) in fp32 when ad = h).
    """
    b, h, full, t = s.b, a.hidden, not s.lora, set(s.lora_targets or ()) if s.lora else set()
    reuse = b == F32  # peft casts an adapter's input to fp32: the same tensor in an fp32 model, else a copy
    norms = 2 * (F32 * h + F32) + (2 * b * h if full else 0)
    y1 = b * h if full or (reuse and t & {"q_proj", "k_proj", "v_proj"}) else 0
    attn = b * (2 * a.heads + 2 * a.kv_heads) * a.head_dim + F32 * a.heads
    y2 = b * h if full or (reuse and t & {"gate_proj", "up_proj"}) else 0
    mlp = 3 * b * a.intermediate + (b * a.intermediate if full or (reuse and "down_proj" in t) else 0)
    adapters = sum(F32 * s.lora_r + (0 if reuse else F32 * a.shape(m)[0]) for m in t)
    return norms + y1 + attn + y2 + mlp + adapters


def head_activation_bytes(a: Arch, s: Setup) -> int:
    """The final norm (f*h + f, + 2*b*h in full FT: normalised, and the LM head's input) and the fp32
    log-softmax the loss saves, f*V per token: for a 150k vocabulary ~0.6 MB a token, more than a layer."""
    return F32 * a.hidden + F32 + (0 if s.lora else 2 * s.b * a.hidden) + F32 * a.vocab


def logits_transient_bytes(a: Arch, s: Setup) -> int:
    """Per token, live at the start of backward but not saved: the b-dtype logits the head returned and the
    two fp32 gradients the log-softmax backward holds at once, V*(b + 2f). Log-probs of response tokens
    only (memkit's ``decoder_and_head``) or a chunked loss shrink this and the log-softmax term."""
    return a.vocab * (s.b + 2 * F32)


def activation_bytes(
    a: Arch, s: Setup, tokens: int, checkpointing: bool, transient: bool = True, head_tokens: int | None = None
) -> float:
    """Peak activation memory of a micro-batch of T tokens (layer = :func:`layer_activation_bytes`,
    head = :func:`head_activation_bytes`, tr = :func:`logits_transient_bytes` if ``transient``):

    * no checkpointing:  T * (L * layer + head + tr)   (all saved, at the start of backward);
    * checkpointing:     T * (L * b*h + max(layer, head + tr))   (each layer keeps its input b*h; the
      backward recomputes one layer at a time, after the logits are freed).

    ``transient=False`` gives the peak of the tensors autograd saves (what the tests measure);
    ``head_tokens``: the tokens the LM head runs on (memkit's RL update: the response tokens only,
    ``decoder_and_head``), default all T."""
    layer, head = layer_activation_bytes(a, s), head_activation_bytes(a, s)
    head += logits_transient_bytes(a, s) if transient else 0
    head_share = (tokens if head_tokens is None else head_tokens) / tokens
    if checkpointing:
        return tokens * (a.layers * s.b * a.hidden + max(layer, head * head_share))
    return tokens * (a.layers * layer + head * head_share)


def kv_cache_bytes(a: Arch, s: Setup, batch: int, length: int) -> int:
    """Rollout KV cache: 2 (k and v) * L * g * d * b * batch * length."""
    return 2 * a.layers * a.kv_heads * a.head_dim * s.b * batch * length


def terms(
    a: Arch, s: Setup, micro_batch: int, seq_len: int, kv: float, checkpointing: bool, head_tokens: int | None = None
) -> dict:
    """Every term in bytes, and ``total`` = weights + gradients + optimizer + reference + max(activations, kv).
    ``head_tokens``: the micro-batch's tokens the LM head runs on (default all)."""
    tokens, layer = micro_batch * seq_len, layer_activation_bytes(a, s)
    head_tokens = tokens if head_tokens is None else head_tokens
    out = {
        "weights": weight_bytes(a, s),
        "gradients": gradient_bytes(a, s),
        "optimizer": optimizer_bytes(a, s),
        "reference": reference_bytes(a, s),
        "activations": tokens * (a.layers * s.b * a.hidden + layer if checkpointing else a.layers * layer),
        "logits": head_tokens * (head_activation_bytes(a, s) + logits_transient_bytes(a, s)),
        "activation_peak": activation_bytes(a, s, tokens, checkpointing, head_tokens=head_tokens),
        "kv_cache": kv,
    }
    out["total"] = sum(out[k] for k in ("weights", "gradients", "optimizer", "reference"))
    out["total"] += max(out["activation_peak"], kv)
    return out


def max_micro_batch(a: Arch, s: Setup, seq_len: int, kv: float, checkpointing: bool, budget: float) -> int:
    """The largest micro-batch of ``seq_len``-token sequences whose total is <= ``budget`` bytes (0: none):
    floor((budget - static) / activation_bytes(one sequence)), static = weights + gradients + optimizer +
    reference, when static + max(activations of one sequence, kv) fits (activations are linear in T)."""
    one = terms(a, s, 1, seq_len, kv, checkpointing)
    static = one["total"] - max(one["activation_peak"], kv)
    return 0 if one["total"] > budget else math.floor((budget - static) / one["activation_peak"])


def plan(
    a: Arch,
    s: Setup,
    *,
    micro_batch: int = 1,
    seq_len: int = 4096,
    rollout_batch: int = 16,
    rollout_len: int | None = None,
    gpu_mem: float = 80.0,
    reserve: float = 1.0,
    name: str = "",
) -> dict:
    """The plan as a dict: inputs, bytes per term with and without checkpointing, whether ``micro_batch``
    fits ``gpu_mem - reserve`` GB, the largest micro-batch that does, and (when none) the largest term
    the total counts at micro-batch 1 (``dominant``)."""
    rollout_len = seq_len if rollout_len is None else rollout_len
    for flag, value in (
        ("--micro-batch", micro_batch),
        ("--seq-len", seq_len),
        ("--rollout-batch", rollout_batch),
        ("--rollout-len", rollout_len),
    ):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")
    if not gpu_mem > 0 or not 0 <= reserve < gpu_mem:
        raise ValueError(
            f"--gpu-mem {gpu_mem}, --reserve {reserve}: need gpu-mem > 0 GB (an H100 has 80) and 0 <= reserve < gpu-mem"
        )
    kv, budget = kv_cache_bytes(a, s, rollout_batch, rollout_len), (gpu_mem - reserve) * GB
    out = {
        "model": name,
        "arch": asdict(a),
        "setup": {k: v for k, v in asdict(s).items() if k != "b"},
        "params": param_count(a),
        "trainable": trainable_count(a, s),
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "rollout_batch": rollout_batch,
        "rollout_len": rollout_len,
        "gpu_mem_gb": gpu_mem,
        "reserve_gb": reserve,
        "modes": {},
    }
    for mode, ckpt in (("no_checkpointing", False), ("checkpointing", True)):
        t = terms(a, s, micro_batch, seq_len, kv, ckpt)
        best = max_micro_batch(a, s, seq_len, kv, ckpt, budget)
        m = {
            "bytes": t,
            "gb": {k: round(v / GB, 3) for k, v in t.items()},
            "fits": t["total"] <= budget,
            "max_micro_batch": best,
        }
        if best == 0:
            one = terms(a, s, 1, seq_len, kv, ckpt)
            counted = ["weights", "gradients", "optimizer", "reference"]
            counted += ["kv_cache"] if kv >= one["activation_peak"] else ["activations", "logits"]
            m["dominant"] = max(counted, key=one.get)
        out["modes"][mode] = m
    return out
