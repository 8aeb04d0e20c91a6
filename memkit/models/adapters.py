"""LoRA checkpoints that load back: an adapter directory names its base, and loads as base + adapter.

A LoRA run saves only the adapter (``adapter_config.json`` + ``adapter_model.safetensors``, a few MB
instead of the model). To load it again the base must be known, and peft's own
``base_model_name_or_path`` is not enough: it is whatever path the base was read from, which for an
SFT'd model trained *as an adapter* and then merged (``memkit train --init <SFT run> --lora``) is the
original base, not the SFT'd one. So memkit writes :data:`BASE_FILE` beside every adapter it saves:

    {"base": "<the policy spec the adapters were put on>"}

and :func:`load_adapter_dir` loads that spec (recursively: the base of an RL adapter is often an SFT
adapter directory), puts the adapter on it and merges it (``W <- W + (alpha/r) B A``), so ``memkit
eval --policy``, ``memkit rollout`` and ``memkit train --init`` see a plain model. A merged copy for
other tools (vLLM, ``transformers`` alone) is :func:`export_merged`.

PPO's critic on a LoRA policy is a second adapter, :data:`CRITIC_ADAPTER`, on the same peft model
(:class:`memkit.rl.critic.ValueModel`): it is active only inside :func:`adapter_active`, keeps training
through the reference's forwards (:func:`adapters_disabled`), and nothing that saves, merges or exports
the policy takes it (:func:`policy_adapters`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from memkit.core.io import atomic_dir

#: the file beside an adapter naming its base spec
BASE_FILE = "memkit_base.json"
#: model attribute holding the spec a LoRA-wrapped model's base was loaded from (set by ``load_policy``)
BASE_ATTR = "memkit_base_spec"
#: the adapter name of a PPO critic that shares a LoRA policy's model (``memkit.rl.critic.ValueModel``)
CRITIC_ADAPTER = "critic"


def policy_adapters(model, active: bool = False) -> list[str]:
    """The adapters of a peft ``model`` that are the policy's: every one (``active``: the active ones)
    but :data:`CRITIC_ADAPTER`. What checkpoints save, exports merge and the rollout engine syncs."""
    names = model.active_adapters if active else list(model.peft_config)
    return [a for a in names if a != CRITIC_ADAPTER]


@contextlib.contextmanager
def adapter_active(model, name: str):
    """Inside: adapter ``name`` alone is active in every LoRA layer of the peft ``model``; after (also on
    an exception): each layer's own active adapters again.

    peft's ``set_adapter`` would also set ``requires_grad`` (True on the adapter it activates, False on
    every other), which would freeze the policy's adapter while the critic runs; here only the layers'
    active list changes, so each optimizer keeps exactly its own trainable parameters. An inactive
    adapter is skipped by the layer's forward (``h = W x + sum_{a active} s_a B_a A_a x``), so its
    parameters get no gradient."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._active_adapter for m in layers]  # what BaseTunerLayer.set_adapter assigns
    try:
        for m in layers:
            m._active_adapter = [name]
        yield model
    finally:
        for m, b in zip(layers, before):
            m._active_adapter = b


def is_adapter_dir(path: Path) -> bool:
    """A directory holding a LoRA adapter and no full model."""
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def remember_base(model, spec: str) -> None:
    """Record on a LoRA-wrapped ``model`` the spec its base came from (a directory as an absolute path)."""
    path = Path(spec).expanduser()
    setattr(model, BASE_ATTR, str(path.resolve()) if path.is_dir() else spec)


def write_base(model, directory: Path) -> None:
    """Write :data:`BASE_FILE` into ``directory`` when ``model`` is a LoRA model whose base is known."""
    spec = getattr(model, BASE_ATTR, None)
    if spec is not None and hasattr(model, "peft_config"):
        (Path(directory) / BASE_FILE).write_text(json.dumps({"base": spec}) + "\n")


@contextlib.contextmanager
def adapters_disabled(model):
    """peft's ``disable_adapter()`` (the base model alone: LoRA's reference policy), with every
    parameter's ``requires_grad`` as it was afterwards, also on an exception.

    peft re-enables the adapters on exit through ``set_adapter(active adapters)``, which sets
    ``requires_grad=False`` on every inactive adapter: a PPO critic's (:data:`CRITIC_ADAPTER`) would
    stop training after the first reference forward."""
    before = [(p, p.requires_grad) for p in model.parameters()]
    try:
        with model.disable_adapter():
            yield model
    finally:
        for p, flag in before:
            p.requires_grad_(flag)


def save_policy(model, tokenizer, directory: Path, state_dict=None) -> None:
    """``save_pretrained`` of the model (the adapter alone for a LoRA model) and the tokenizer, plus
    :data:`BASE_FILE` for an adapter. Call inside an :func:`~memkit.core.io.atomic_dir`."""
    if hasattr(model, "peft_config"):  # the policy's adapters only, never a PPO critic's (CRITIC_ADAPTER)
        model.save_pretrained(directory, state_dict=state_dict, selected_adapters=policy_adapters(model))
    else:
        model.save_pretrained(directory, state_dict=state_dict)
    tokenizer.save_pretrained(directory)
    write_base(model, directory)


def base_spec(path: Path) -> str:
    """The base an adapter directory was trained on: :data:`BASE_FILE`, else peft's
    ``base_model_name_or_path`` (adapters saved by other tools)."""
    path = Path(path)
    if (path / BASE_FILE).is_file():
        return json.loads((path / BASE_FILE).read_text())["base"]
    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{path} holds a LoRA adapter that names no base model (no {BASE_FILE}, no "
            "base_model_name_or_path in adapter_config.json); write one: "
            f'echo \'{{"base": "<spec or directory>"}}\' > {path / BASE_FILE}'
        )
    return base


def load_adapter_dir(path: Path, load_base):
    """``(merged model, tokenizer)`` of an adapter directory. ``load_base(spec)`` -> ``LoadedModel``
    loads the base (``memkit.models.load_policy`` at the caller's dtype); the tokenizer saved beside
    the adapter wins over the base's (it is the one the adapter was trained with)."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    spec = base_spec(path)
    try:
        base = load_base(spec)
    except (FileNotFoundError, OSError) as e:
        raise FileNotFoundError(
            f"{path} is a LoRA adapter on {spec!r}, which does not load ({e}); "
            f"restore that base or name another in {path / BASE_FILE}"
        ) from None
    model = PeftModel.from_pretrained(base.model, str(path)).merge_and_unload()
    tok = AutoTokenizer.from_pretrained(str(path)) if (path / "tokenizer_config.json").is_file() else base.tokenizer
    return model, tok


def export_merged(policy, out: Path) -> Path:
    """Save ``policy`` (a :class:`~memkit.models.LoadedModel`, its adapters merged by loading) as a plain
    Hugging Face directory: ``config.json``, weights, tokenizer; loadable without memkit or peft.
    A LoRA model's active policy adapters are merged (never a PPO critic's, :data:`CRITIC_ADAPTER`)."""
    model = policy.model
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload(adapter_names=policy_adapters(model, active=True))
    with atomic_dir(Path(out)) as tmp:
        model.save_pretrained(tmp)
        policy.tokenizer.save_pretrained(tmp)
    return Path(out)


__all__ = [
    "BASE_FILE",
    "BASE_ATTR",
    "CRITIC_ADAPTER",
    "policy_adapters",
    "adapter_active",
    "adapters_disabled",
    "is_adapter_dir",
    "remember_base",
    "write_base",
    "save_policy",
    "base_spec",
    "load_adapter_dir",
    "export_merged",
]
