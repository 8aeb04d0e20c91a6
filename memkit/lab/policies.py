"""Policy specs -> loaded policies, where ``memkit sft`` caches its models, and the prompt each
policy is rolled out with.

A spec is "oracle", "tiny" (a fresh random tiny Llama), "tiny-sft[:<tag>]" (``memkit sft``'s
cached model), "smollm2-135m", a checkpoint or run directory, or a hub id. The CLI, the
evaluation and the training runs resolve specs here, so they all load the same model. The
pretrained tiny base (``memkit pretrain``) is cached here too, and SFT's starting model
(``SFTConfig.init``) is resolved by :func:`sft_init`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from memkit.agents.base import PROMPTS, OracleConfig, compact_prompt_wrap
from memkit.core.io import build_lock, cache_dir
from memkit.models import LORA_TARGETS, LoadedModel, LoraSpec, apply_lora, build_tiny, identity_wrap, load_policy
from memkit.models.loading import is_chat
from memkit.models.tokenizer import TOKENIZER_SCHEME
from memkit.rollout.engine import ModelPolicy, OraclePolicy
from memkit.train.config import resolve_sft
from memkit.train.pretrain import PretrainConfig, cache_key, train_base
from memkit.train.sft import SFTConfig
from memkit.world.splits import SPLIT_SCHEME


# ---- where `memkit sft` caches its models -------------------------------------------------------
def config_hash(obj) -> str:
    """10 hex digits naming a dataclass's (or a JSON value's) contents."""
    blob = json.dumps(asdict(obj) if hasattr(obj, "__dataclass_fields__") else obj, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def sft_checkpoint_path(method: str, world_seed: int = 0, tag: str = "default") -> Path:
    """Where ``memkit sft`` caches a method's tiny model (``tag`` tells variants apart; the
    tokenizer scheme and the question split are in the name so a model trained on an older
    tokenizer, or on questions that are now RL's or test ones, is never reused)."""
    return cache_dir() / f"tiny-sft-{method}-w{world_seed}-{TOKENIZER_SCHEME}-{SPLIT_SCHEME}-{tag}"


def sft_tag(cfg: SFTConfig) -> str:
    """The cache tag ``memkit sft`` saves ``cfg`` under: ``default`` for the default recipe
    (objectives, tasks and seed; the step count or time budget only says how long it trained),
    else one naming the recipe, e.g. ``k1-2-3-n4000-s0``, ``k1-2-n4000-s0-cmp`` for the oracle's
    ``show_comparison`` data (load it as ``tiny-sft:<tag>``).
    So a variant never overwrites the default model the notebooks and ``memkit train`` start from.
    Real data (``cfg.data``) adds ``-data<hash>``. An SFT that does not start from scratch gets a suffix (:func:`init_tag`): ``default-base``,
    ``k1-2-3-n4000-s0-base``, ``default-cont1a2b3c``."""
    d = SFTConfig()
    same_tasks = (tuple(cfg.objectives), cfg.n_tasks, cfg.seed) == (tuple(d.objectives), d.n_tasks, d.seed)
    if same_tasks and cfg.oracle == d.oracle:
        tag = "default"
    else:
        tag = f"k{'-'.join(map(str, cfg.objectives))}-n{cfg.n_tasks}-s{cfg.seed}"
        if cfg.oracle == replace(d.oracle, show_comparison=True):
            tag += "-cmp"  # memkit sft --show-comparison
        elif cfg.oracle != d.oracle:  # other imperfection knobs: name them by hash
            tag += f"-o{config_hash(cfg.oracle)[:6]}"
    tag += "-lora" if cfg.lora.enabled else ""
    tag += f"-data{config_hash(cfg.data)[:6]}" if cfg.data.real else ""  # real questions / corpus
    if cfg.init == "scratch" or pretrained_init(cfg.init):  # a pretrained model is named in the directory
        return tag
    return f"{tag}-{init_tag(cfg.init)}"


def pretrained_init(init: str) -> bool:
    """Whether an ``SFTConfig.init`` names a pretrained model ("smollm2-135m", a hub id, a directory whose
    tokenizer has a chat template), not the kit's tiny family (scratch, the base, ``tiny-sft``, a tiny
    checkpoint directory)."""
    if init in ("scratch", "base") or init.startswith("tiny-sft"):
        return False
    path = Path(init).expanduser()
    if not path.is_dir():
        return True
    config = path / "tokenizer_config.json"
    return (path / "chat_template.jinja").is_file() or (config.is_file() and "chat_template" in config.read_text())


def sft_output_path(cfg: SFTConfig, world_seed: int, tag: str) -> Path:
    """Where ``memkit sft`` saves ``cfg``'s model: :func:`sft_checkpoint_path` for the tiny family
    (loadable as ``tiny-sft:<tag>``), ``sft-<model>-<method>-...`` for a pretrained model (load it
    by this path)."""
    if not pretrained_init(cfg.init):
        return sft_checkpoint_path(cfg.method, world_seed, tag)
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in cfg.init.split("/")[-1].lower())
    return cache_dir() / f"sft-{slug}-{cfg.method}-w{world_seed}-{SPLIT_SCHEME}-{tag}"


def init_tag(init: str) -> str:
    """The tag suffix of an SFT that does not start from scratch: ``base``, or ``cont<hash>`` naming
    the checkpoint it continues (a directory by its absolute path)."""
    if init == "base":
        return "base"
    return "cont" + config_hash(str(Path(init).resolve()) if Path(init).is_dir() else init)[:6]


def sft_cache_key(cfg: SFTConfig) -> str:
    """``config_hash`` of ``cfg``, with ``init`` left out when it is "scratch", ``method_kwargs`` when
    empty, ``lora`` when off, ``data`` when synthetic, and ``lr`` / ``max_len`` / ``warmup`` /
    ``context_weight`` keyed by their tiny-model values and ``k_docs`` by its resolved value when left
    at None (so the SFT caches made before those fields existed keep their names)."""
    key = asdict(cfg)
    key["world_seed"] = key["data"].pop("world_seed")  # keyed at the top, where it was before the data group
    defaults = (
        ("init", "scratch"),
        ("method_kwargs", {}),
        ("lora", asdict(SFTConfig().lora)),
        ("data", {k: v for k, v in asdict(SFTConfig().data).items() if k != "world_seed"}),
    )
    for name, default in defaults:
        if key[name] == default:
            del key[name]
    if not pretrained_init(
        cfg.init
    ):  # the tiny's defaults of the fields that became model-dependent, as keyed before they were
        key.update(
            {
                k: v
                for k, v in asdict(resolve_sft(cfg, pretrained=False)).items()
                if k in ("lr", "max_len", "warmup", "context_weight") and key[k] is None
            }
        )
        if cfg.gradient_checkpointing is None:
            del key["gradient_checkpointing"]
    if key["k_docs"] is None:  # by the passages it resolves to (the field's default was 1)
        key["k_docs"] = resolve_sft(cfg, pretrained=False).k_docs
    return config_hash(key)


# ---- the pretrained tiny base (`memkit pretrain`) --------------------------------------------------
def base_checkpoint_path(cfg: PretrainConfig | None = None) -> Path:
    """Where ``memkit pretrain`` caches the tiny base of ``cfg`` (default: the default config):
    world, tokenizer scheme and a hash of the fields that shape the base are in the name. An
    unfinished run keeps its resumable state beside it (``memkit.train.pretrain.partial_path``)."""
    cfg = cfg or PretrainConfig()
    return cache_dir() / f"tiny-base-w{cfg.world_seed}-{TOKENIZER_SCHEME}-{config_hash(cache_key(cfg))}"


def ensure_base(kit, cfg: PretrainConfig | None = None, progress: bool = True, log=None):
    """The pretrained base of ``cfg`` (default: the default config on the kit's world) as a
    :class:`memkit.train.pretrain.BaseRun`: reused when finished, else trained now (continuing an
    interrupted run)."""
    cfg = cfg or PretrainConfig(world_seed=kit.world_seed)
    path = base_checkpoint_path(cfg)
    with build_lock(path):  # one process trains (or continues) it; another waits and reuses it
        return train_base(kit, cfg, path, progress=progress, log=log)


def sft_init(cfg: SFTConfig, kit, progress: bool = True) -> LoadedModel:
    """The model an SFT of ``cfg`` starts from (``cfg.init``): a fresh tiny model ("scratch"), the
    pretrained base ("base", trained first if missing), or any model a spec names: a checkpoint to
    continue, "smollm2-135m", a hub id. A model with its own tokenizer keeps it and its chat template
    (the oracle's calls are tokenised with them); ``cfg.lora`` puts LoRA adapters on it."""
    if cfg.init == "scratch":
        tiny = fresh_tiny(kit, cfg.seed)
        return replace(tiny, model=apply_lora(tiny.model, lora_spec(cfg.lora, cfg.seed))) if cfg.lora.enabled else tiny
    if cfg.init == "base":
        spec = str(ensure_base(kit, progress=progress).path)
    elif cfg.init == "tiny-sft" or cfg.init.startswith("tiny-sft:"):
        spec = str(sft_spec_path(cfg.init, cfg.method, kit.world_seed))
    elif cfg.init in ("tiny", "oracle"):
        raise ValueError(
            f"SFTConfig.init={cfg.init!r}: use 'scratch' for a fresh tiny model, 'base' for the "
            "pretrained base, or a checkpoint to continue"
        )
    else:
        spec = cfg.init
    loaded = load_policy(spec, lora=lora_spec(cfg.lora, cfg.seed))
    if loaded.tokenizer.get_vocab() == kit.tokenizer.get_vocab():  # a tiny model: the kit's tokenizer, no template
        return LoadedModel(model=loaded.model, tokenizer=kit.tokenizer, spec=spec, wrap=identity_wrap)
    return loaded  # a pretrained model: its own tokenizer and chat template (the SFT data is made with them)


def sft_spec_path(spec: str, method: str, world_seed: int = 0) -> Path:
    """The checkpoint of policy spec ``tiny-sft`` (the default SFT model) or ``tiny-sft:<tag>``;
    a missing one is a :class:`FileNotFoundError` naming the command that makes it."""
    tag = spec.split(":", 1)[1] if ":" in spec else "default"
    path = sft_checkpoint_path(method, world_seed, tag)
    if not path.exists():
        how = f"`memkit sft --method {method}`" + ("" if tag == "default" else f" with the flags that give tag {tag!r}")
        raise FileNotFoundError(f"no SFT'd tiny model for method {method!r} at {path}; train it first with {how}")
    return path


def load_spec(spec, method_name: str, kit, seed: int = 0, backend=None):
    """A policy spec as a loaded :class:`memkit.models.LoadedModel`, to load a model once for many
    rollouts ("tiny" builds a new random model, seeded by ``seed``, on every load). "oracle" passes
    through unchanged; an already loaded policy too, unless ``backend`` (a factory,
    :mod:`memkit.models.backend`) differs from its own: then a copy that rolls out with it."""
    if not isinstance(spec, str):
        if backend is not None and spec is not None and spec.backend_factory is not backend:
            return replace(spec, backend_factory=backend)
        return spec
    if spec == "oracle":
        return spec
    if spec == "tiny-sft" or spec.startswith("tiny-sft:"):
        spec = str(sft_spec_path(spec, method_name, kit.world_seed))
    loaded = fresh_tiny(kit, seed) if spec == "tiny" else load_policy(spec)
    loaded.backend_factory = backend
    return loaded


def resolve_policy(
    spec: str,
    method,
    kit,
    temperature: float = 0.0,
    seed: int = 0,
    oracle_cfg: OracleConfig | None = None,
    backend=None,
    as_model: LoadedModel | None = None,
):
    """Return ``(engine_policy, tokenizer, wrap, loaded)``; ``loaded`` is the models.LoadedModel or None.

    ``spec`` is a policy spec string or an already loaded :class:`memkit.models.LoadedModel` (reused
    as is, e.g. to roll out many batches without reloading the model: :func:`load_spec`).
    ``backend``: the rollout-backend factory of a model policy (None: the loaded model's own, by
    default memkit's HF loop). ``as_model``: the oracle only: tokenise and wrap its calls as this
    model sees its contexts (its tokenizer and chat template: SFT data for a pretrained model)."""
    if spec == "oracle":  # a loaded LoadedModel never equals the string
        tok, wrap = (as_model.tokenizer, as_model.wrap) if as_model is not None else (kit.tokenizer, None)
        return OraclePolicy(method, tok, oracle_cfg, seed=seed), tok, wrap, None
    return _model_policy(load_spec(spec, method.name, kit, seed, backend), temperature, seed)


def _model_policy(loaded, temperature: float, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return ModelPolicy(loaded.backend(), temperature=temperature, generator=gen), loaded.tokenizer, loaded.wrap, loaded


def fresh_tiny(kit, seed: int = 0) -> LoadedModel:
    """A randomly initialised tiny Llama on the kit's world tokenizer."""
    return LoadedModel(
        model=build_tiny(kit.tokenizer, seed=seed), tokenizer=kit.tokenizer, spec="tiny", wrap=identity_wrap
    )


def prompt_wrap(method_name: str, tokenizer, wrap=None, prompt: str = "auto", oracle: bool = False):
    """The context wrap for a policy: ``prompt`` "paper" keeps the paper's instruction,
    "compact" swaps it for one short line (:func:`memkit.agents.base.compact_prompt_wrap`),
    "auto" = paper for the oracle and chat models, compact for tiny models (what SFT trains on).
    Rollouts, SFT and RL must use the same choice, or the model sees a prompt it never learned."""
    if prompt == "auto":
        prompt = "paper" if oracle or is_chat(tokenizer) else "compact"
    if prompt == "paper":
        return wrap
    if prompt != "compact":
        raise ValueError(f"prompt must be one of {PROMPTS}, got {prompt!r}")
    inner, compact = wrap or (lambda segs: segs), compact_prompt_wrap(method_name)
    return lambda segs: inner(compact(segs))


def init_spec(cfg, world_seed: int) -> str:
    """``cfg.init`` (a :class:`~memkit.rl.config.TrainConfig`'s) with ``tiny-sft`` /
    ``tiny-sft:<tag>`` resolved to its cached checkpoint (checked before any work)."""
    if cfg.init != "tiny-sft" and not cfg.init.startswith("tiny-sft:"):
        return cfg.init
    try:
        return str(sft_spec_path(cfg.init, cfg.method, world_seed))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (or use --init tiny for a random policy)") from None


def lora_spec(cfg, seed: int) -> LoraSpec | None:
    """The :class:`~memkit.models.LoraSpec` of a ``LoRAConfig`` group (None when LoRA is off)."""
    if not cfg.enabled:
        return None
    return LoraSpec(r=cfg.r, alpha=cfg.alpha, seed=seed, target_modules=LORA_TARGETS[cfg.targets])


def param_dtype(cfg) -> str:
    """The parameter dtype of ``cfg.runtime.dtype``: ``auto`` = bfloat16 for a LoRA run on a GPU
    (``device`` cuda, or auto with one present; the frozen base in bf16, peft keeps the adapters in
    float32), float32 otherwise (full fine-tuning keeps float32 master weights for AdamW; bf16 compute
    is ``--mixed-precision bf16``)."""
    runtime = cfg.runtime
    if runtime.dtype != "auto":
        return runtime.dtype
    if not cfg.lora.enabled:
        return "float32"
    gpu = runtime.device == "cuda" or (runtime.device == "auto" and torch.cuda.is_available())
    return "bfloat16" if gpu else "float32"


def load_init(cfg, kit):
    """The initial policy of ``cfg.init`` -> ``(model, tokenizer, wrap)`` (LoRA applied if asked)."""
    lora = lora_spec(cfg.lora, cfg.seed)
    spec = init_spec(cfg, kit.world_seed)
    dtype = param_dtype(cfg)
    if spec == "tiny":  # random init with the kit's world tokenizer
        model = build_tiny(kit.tokenizer, seed=cfg.seed).to(dtype=getattr(torch, dtype))
        return (apply_lora(model, lora) if lora else model), kit.tokenizer, identity_wrap
    p = load_policy(spec, lora=lora, dtype=dtype)
    return p.model, p.tokenizer, p.wrap
