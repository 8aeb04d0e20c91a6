"""Training runs on a kit: behaviour cloning (``memkit sft``) and RL (``memkit train``).

Each function assembles what its algorithm takes as arguments (tasks, the initial policy, the
prompt wrap) and runs it: the algorithms themselves (:mod:`memkit.train.sft`, :mod:`memkit.rl`) know
nothing of kits, policy specs or caches.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from memkit.agents import STREAM_METHODS
from memkit.core.cpu import all_cores
from memkit.core.io import build_lock
from memkit.lab.evaluation import rollout
from memkit.lab.kit import Kit, load_kit
from memkit.lab.policies import (
    init_spec,
    load_init,
    prompt_wrap,
    sft_cache_key,
    sft_checkpoint_path,
    sft_init,
    sft_output_path,
)
from memkit.models import K_DOCS_ATTR
from memkit.rl.config import TrainConfig
from memkit.rl.engines import make_accelerator
from memkit.rl.trainer import Trainer
from memkit.train.config import resolve_sft
from memkit.train.sft import SFTConfig, collect_examples, save_checkpoint, train_sft
from memkit.world.task_sets import training_tasks


# ---- SFT -------------------------------------------------------------------------------------------
def train_sft_model(
    method_name: str, kit: Kit, cfg: SFTConfig | None = None, progress: bool = True, log=None, path: Path | None = None
):
    """Clone the method's (imperfect) oracle into the model ``cfg.init`` names (a fresh tiny one, the
    pretrained tiny base, a checkpoint to continue, or a pretrained model such as "smollm2-135m":
    :func:`~memkit.lab.policies.sft_init`; with ``cfg.lora`` as adapters); save and return it. A
    pretrained model learns from the oracle's calls in its own tokens: the paper's prompt inside its
    chat template (:func:`~memkit.lab.evaluation.rollout`'s ``as_model``).

    Returns ``(path, history, n_examples)``. ``cfg.max_seconds`` budgets the oracle data and the
    training, not a base that ``init="base"`` has to pretrain first.
    """
    cfg = cfg or SFTConfig(method=method_name)
    policy = sft_init(cfg, kit, progress=progress)
    t0 = time.perf_counter()
    tasks = training_tasks(kit.world, cfg.objectives, cfg.n_tasks, cfg.seed)
    pretrained = policy.chat  # a model with its own tokenizer and chat template: the paper's prompt in it
    cfg = resolve_sft(cfg, pretrained)
    trajs = rollout(
        method_name,
        tasks,
        kit,
        policy="oracle",
        oracle_cfg=cfg.oracle,
        seed=cfg.seed,
        prompt="paper" if pretrained else "compact",
        method_kwargs=cfg.method_kwargs,
        k_docs=cfg.k_docs,
        as_model=policy,
    )
    examples, dropped = collect_examples([t for t in trajs if t.valid], cfg.max_len)
    setattr(policy.model.config, K_DOCS_ATTR, cfg.k_docs)  # its rollouts will search the same way
    opt_cfg = cfg  # max_seconds budgets the whole call: the optimisation gets what the data left
    if cfg.max_seconds:
        opt_cfg = replace(cfg, max_seconds=max(cfg.max_seconds - (time.perf_counter() - t0), 1.0))
    with all_cores() as threads:
        history = train_sft(policy.model, policy.tokenizer, examples, opt_cfg, log=log, progress=progress)
    path = path or sft_checkpoint_path(method_name, kit.world_seed)
    meta = {
        "sft": asdict(cfg),
        "n_examples": len(examples),
        "n_dropped_too_long": dropped,
        "history": history,
        "torch_threads": threads,
    }
    save_checkpoint(policy.model, policy.tokenizer, path, meta)
    return path, history, len(examples)


def ensure_sft(method_name: str, kit: Kit, cfg: SFTConfig | None = None, progress: bool = True) -> Path:
    """The SFT'd model for ``cfg``: the default tiny one from ``memkit sft`` when ``cfg`` is None
    (trained now if missing), else one cached under a hash of ``cfg`` (e.g. a short smoke run, or a
    pretrained model's LoRA SFT)."""
    if cfg is None:
        path = sft_checkpoint_path(method_name, kit.world_seed)
    else:  # a pretrained model's is named after it (sft-<model>-...), as `memkit sft` names it
        path = sft_output_path(cfg, kit.world_seed, "cfg" + sft_cache_key(cfg))
    with build_lock(path):  # a second process waits for this one's model instead of training its own
        if not path.exists():
            train_sft_model(method_name, kit, cfg or SFTConfig(method=method_name), progress=progress, path=path)
    return path


# ---- RL --------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    history: list[dict]  # one row per step (see Trainer.train_step)
    eval_history: list[dict]  # one row per (eval step, k)
    model: torch.nn.Module  # the trained policy (unwrapped; peft model when lora)
    path: Path | None  # last checkpoint directory (policy/ inside loads with load_policy)


def train(
    cfg: TrainConfig, kit: Kit | None = None, progress=True, log=None, resume: bool = False, backend=None
) -> TrainResult:
    """Run ``cfg.steps`` RL steps or until ``cfg.budget`` (continuing ``cfg.out_dir`` when ``resume``).

    ``progress``: a tqdm bar (main process); ``log``: called with every step row; ``backend``: the
    rollout-backend factory (:mod:`memkit.models.backend`; None = memkit's HF loop).
    """
    cfg.validate()
    streams = cfg.method in STREAM_METHODS
    if not (streams and cfg.init == "tiny-sft"):
        init_spec(cfg, kit.world_seed if kit is not None else cfg.data.world_seed)  # fail fast on a missing checkpoint
    acc = make_accelerator(cfg)
    if kit is None:  # the synthetic world, or cfg.data's real questions over a real corpus
        from memkit.lab.real import data_kit

        kit = data_kit(load_kit(cfg.data.world_seed), cfg.data)
    model, tok, wrap = _stream_init(cfg, kit, progress) if streams and cfg.init == "tiny-sft" else load_init(cfg, kit)
    wrap = prompt_wrap(cfg.method, tok, wrap, cfg.prompt)  # the prompt the SFT'd model learned
    trainer = Trainer(cfg, model, tok, wrap, kit, acc, backend=backend)
    if resume:
        trainer.resume()
    trainer.run(progress=progress, log=log)
    return TrainResult(trainer.history, trainer.eval_history, trainer.policy, getattr(trainer, "last_checkpoint", None))


def _stream_init(cfg: TrainConfig, kit: Kit, progress: bool):
    """Mem-T's ``tiny-sft``: the RL lab's retrieval clone (:func:`memkit.lab.memt.retrieval.ensure_memt_clone`,
    cached; trained on first use), LoRA-wrapped if asked -> ``(model, tokenizer, wrap)``."""
    from memkit.lab.memt.retrieval import ensure_memt_clone
    from memkit.models import LoraSpec, apply_lora, identity_wrap

    model = ensure_memt_clone(kit, progress=progress)
    if cfg.lora.enabled:
        model = apply_lora(model, LoraSpec(r=cfg.lora.r, alpha=cfg.lora.alpha, seed=cfg.seed))
    return model, kit.tokenizer, identity_wrap


# ---- arms x seeds ------------------------------------------------------------------------------------
def train_arms(base: TrainConfig, arms: dict[str, dict], seeds, kit: Kit, progress: bool = False) -> dict:
    """Train each arm (``TrainConfig`` fields or flag names that differ from ``base``) once per seed, all from
    ``base.init`` and for the same steps, each in ``base.out_dir/<arm>-s<seed>``.

    Returns ``{(arm, seed): TrainResult}``; :func:`arm_table` turns their last evaluations into a
    mean +- std table. The runs are sequential, in this process.
    """
    out = {}
    for arm, over in arms.items():
        for seed in seeds:
            cfg = base.with_flags(**over, seed=seed, out_dir=str(Path(base.out_dir) / f"{arm}-s{seed}"))
            out[arm, seed] = train(cfg, kit, progress=progress)
    return out


def run_summary(result: TrainResult) -> dict:
    """One run's first and last evaluation per objective count: ``em_k{k}_start`` / ``em_k{k}_end``,
    the same for ``context_tokens``, ``tool_calls`` and ``memory_actions`` (and ``mem_p`` where the
    format writes ``<mem>``), its steps and training seconds."""
    row = {"steps": len(result.history), "seconds": sum(r["seconds"] for r in result.history)}
    for k in sorted({e["k"] for e in result.eval_history}):
        evals = [e for e in result.eval_history if e["k"] == k]
        for key in ("em", "mem_p", "context_tokens", "tool_calls", "memory_actions"):
            if key in evals[0]:
                row[f"{key}_k{k}_start"], row[f"{key}_k{k}_end"] = evals[0][key], evals[-1][key]
    return row


def arm_table(results: dict, metrics) -> list[dict]:
    """Mean and sample std (n - 1; 0 for one seed) over seeds of each of ``metrics`` (keys of
    :func:`run_summary`; nan where a run has none) per arm of :func:`train_arms`' results: one row
    per arm, ``<metric>`` and ``<metric>_std``, plus ``seeds``."""
    rows = []
    for arm in dict.fromkeys(a for a, _ in results):
        runs = [run_summary(r) for (a, _), r in results.items() if a == arm]
        row = {"arm": arm, "seeds": len(runs)}
        for m in metrics:
            x = torch.tensor([float(r.get(m, float("nan"))) for r in runs], dtype=torch.float64)
            row[m], row[m + "_std"] = float(x.mean()), float(x.std()) if len(x) > 1 else 0.0
        rows.append(row)
    return rows
