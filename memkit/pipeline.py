"""The kit's glue: world + retrieval env + tokenizer + policy -> rollouts and tables.

The CLI and the notebooks both call these functions, so a number printed by ``memkit eval``
and a number recorded by a notebook come from the same code.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memkit.agents import METHODS, get_method
from memkit.agents.base import OracleConfig, compact_prompt_wrap
from memkit.rollout.engine import ModelPolicy, OraclePolicy, RolloutConfig, run_rollouts

POLICY_SPECS = ("oracle", "tiny", "tiny-sft", "tiny-sft:<tag>", "smollm2-135m", "<local checkpoint dir or memkit train run dir>", "<HF model id>")


def cache_dir() -> Path:
    path = Path(os.environ.get("MEMKIT_CACHE", Path.home() / ".cache" / "memkit"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Kit:
    """Everything a rollout needs besides the policy."""

    world: object
    env: object
    tokenizer: object
    world_seed: int
    _envs_by_k: dict = field(default_factory=dict, repr=False, compare=False)  # env_for's cache

    def env_for(self, k_docs: int | None):
        """The search env returning ``k_docs`` passages per query (same retriever), or ``env``."""
        from memkit.envs import SearchEnv

        if k_docs is None or k_docs == self.env.k:
            return self.env
        if k_docs not in self._envs_by_k:
            self._envs_by_k[k_docs] = SearchEnv(self.env.retriever, k=k_docs)
        return self._envs_by_k[k_docs]


#: ``model.config`` attribute naming the passages per search a model was trained with (set by
#: ``memkit sft``; RL checkpoints keep it): rollouts of that model use the same environment.
K_DOCS_ATTR = "memkit_k_docs"


def trained_k_docs(model) -> int | None:
    """Passages per search ``model`` was trained with, or None (any pretrained model)."""
    value = getattr(getattr(model, "config", None), K_DOCS_ATTR, None)
    return int(value) if value else None


def load_kit(world_seed: int = 0, retriever: str = "bm25", k_docs: int = 3, vocab_size: int | None = None) -> Kit:
    """The default synthetic world, a search env over its passages, and the tiny tokenizer."""
    from memkit.envs import SearchEnv, make_retriever
    from memkit.world import make_world

    world = make_world(seed=world_seed)
    env = SearchEnv(make_retriever(retriever, world.passages), k=k_docs)
    return Kit(world=world, env=env, tokenizer=world_tokenizer(world, world_seed, vocab_size), world_seed=world_seed)


class _ByteTokenizer:
    """UTF-8 bytes as ids: lets the engine run the oracle before the real tokenizer exists."""

    pad_token_id, eos_token_id, chat_template = 0, None, None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def oracle_transcripts(world, env, n_tasks: int = 20, seed: int = 1) -> list[str]:
    """What every method's oracle writes on ``n_tasks`` tasks (k = 1, 2): outputs and memories."""
    from memkit.rollout.engine import OraclePolicy, RolloutConfig, run_rollouts
    from memkit.world import make_tasks

    tok, texts = _ByteTokenizer(), []
    tasks = [t for k in (1, 2) for t in make_tasks(world, n=n_tasks, k=k, seed=seed + k)]
    for name in METHODS:
        method = get_method(name)
        trajs = run_rollouts(method, tasks, env, OraclePolicy(method, tok, seed=seed), tok, RolloutConfig(max_context_tokens=10**9))
        texts += [c.output_text for t in trajs for c in t.calls if c.output_text]
    return texts


def world_tokenizer(world, world_seed: int, vocab_size: int | None = None):
    """BPE trained on the world's passages, questions, every method's prompts and oracle outputs
    (always rolled out with BM25 top-3, so the cached tokenizer does not depend on which kit
    asked first), so the agents' own phrases ("Nothing found yet. Next I need") are a few ids,
    not a dozen pieces (cached per world seed and vocabulary size)."""
    from transformers import AutoTokenizer

    from memkit.envs import SearchEnv, make_retriever
    from memkit.models import train_tokenizer
    from memkit.models.tokenizer import DEFAULT_VOCAB, TOKENIZER_SCHEME
    from memkit.world import make_tasks, world_texts

    vocab_size = vocab_size or DEFAULT_VOCAB
    path = cache_dir() / f"tokenizer-w{world_seed}-v{vocab_size}-{TOKENIZER_SCHEME}"
    if (path / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(path)
    tasks = make_tasks(world, n=200, k=2, seed=world_seed + 1)
    prompts = [get_method(m).next_call(get_method(m).new_state(t)).text for m in METHODS for t in tasks[:20]]
    env = SearchEnv(make_retriever("bm25", world.passages), k=3)
    outputs = oracle_transcripts(world, env)
    tok = train_tokenizer(list(world_texts(world, tasks)) + prompts + outputs, vocab_size=vocab_size)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    os.replace(tmp, path) if not path.exists() else None
    return AutoTokenizer.from_pretrained(path)


def sft_checkpoint_path(method: str, world_seed: int = 0, tag: str = "default") -> Path:
    """Where ``memkit sft`` caches a method's tiny model (``tag`` tells variants apart; the
    tokenizer scheme and the question split are in the name so a model trained on an older
    tokenizer, or on questions that are now RL's or test ones, is never reused)."""
    from memkit.models.tokenizer import TOKENIZER_SCHEME
    from memkit.world.splits import SPLIT_SCHEME

    return cache_dir() / f"tiny-sft-{method}-w{world_seed}-{TOKENIZER_SCHEME}-{SPLIT_SCHEME}-{tag}"


def sft_tag(cfg) -> str:
    """The cache tag ``memkit sft`` saves an :class:`~memkit.sft.SFTConfig` under: ``default`` for
    the default recipe (objectives, tasks and seed; the step count or time budget only says how long
    it trained), else one naming the recipe, e.g. ``k1-2-3-n4000-s0``, ``k1-2-n4000-s0-cmp`` for the oracle's
    ``show_comparison`` data (load it as ``tiny-sft:<tag>``).
    So a variant never overwrites the default model the notebooks and ``memkit train`` start from."""
    from dataclasses import replace

    from memkit.sft import SFTConfig

    d = SFTConfig()
    same_tasks = (tuple(cfg.objectives), cfg.n_tasks, cfg.seed) == (tuple(d.objectives), d.n_tasks, d.seed)
    if same_tasks and cfg.oracle == d.oracle:
        return "default"
    tag = f"k{'-'.join(map(str, cfg.objectives))}-n{cfg.n_tasks}-s{cfg.seed}"
    if cfg.oracle == replace(d.oracle, show_comparison=True):
        tag += "-cmp"  # memkit sft --show-comparison
    elif cfg.oracle != d.oracle:  # other imperfection knobs (Python API): name them by hash
        tag += f"-o{config_hash(cfg.oracle)[:6]}"
    return tag


def sft_spec_path(spec: str, method: str, world_seed: int = 0) -> Path:
    """The checkpoint of policy spec ``tiny-sft`` (the default SFT model) or ``tiny-sft:<tag>``;
    a missing one is a :class:`FileNotFoundError` naming the command that makes it."""
    tag = spec.split(":", 1)[1] if ":" in spec else "default"
    path = sft_checkpoint_path(method, world_seed, tag)
    if not path.exists():
        how = f"`memkit sft --method {method}`" + ("" if tag == "default" else f" with the flags that give tag {tag!r}")
        raise FileNotFoundError(f"no SFT'd tiny model for method {method!r} at {path}; train it first with {how}")
    return path


def ensure_sft(method_name: str, kit: "Kit", cfg=None, progress: bool = True) -> Path:
    """The SFT'd tiny model for ``cfg``: the default one from ``memkit sft`` when ``cfg`` is None
    (trained now if missing), else one cached under a hash of ``cfg`` (e.g. a short smoke run)."""
    from memkit.sft import SFTConfig

    path = sft_checkpoint_path(method_name, kit.world_seed,
                               "default" if cfg is None else "cfg" + config_hash(cfg))
    if not path.exists():
        train_sft_model(method_name, kit, cfg or SFTConfig(method=method_name), progress=progress, path=path)
    return path


def load_spec(spec, method_name: str, kit: Kit, seed: int = 0):
    """A policy spec as a loaded :class:`memkit.models.Policy`, to load a model once for many
    rollouts ("tiny" builds a new random model, seeded by ``seed``, on every load). "oracle" and
    already loaded policies pass through unchanged."""
    if not isinstance(spec, str) or spec == "oracle":
        return spec
    from memkit.models import load_policy

    if spec == "tiny-sft" or spec.startswith("tiny-sft:"):
        spec = str(sft_spec_path(spec, method_name, kit.world_seed))
    return fresh_tiny(kit, seed) if spec == "tiny" else load_policy(spec)


def resolve_policy(spec: str, method, kit: Kit, temperature: float = 0.0, seed: int = 0,
                   oracle_cfg: OracleConfig | None = None):
    """Return ``(engine_policy, tokenizer, wrap, loaded)``; ``loaded`` is the models.Policy or None.

    ``spec`` is a policy spec string or an already loaded :class:`memkit.models.Policy` (reused
    as is, e.g. to roll out many batches without reloading the model: :func:`load_spec`)."""
    if spec == "oracle":  # a loaded Policy never equals the string
        return OraclePolicy(method, kit.tokenizer, oracle_cfg, seed=seed), kit.tokenizer, None, None
    return _model_policy(load_spec(spec, method.name, kit, seed), temperature, seed)


def _model_policy(loaded, temperature: float, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return ModelPolicy(loaded.backend(), temperature=temperature, generator=gen), loaded.tokenizer, loaded.wrap, loaded


def fresh_tiny(kit: Kit, seed: int = 0):
    """A randomly initialised tiny Llama on the kit's world tokenizer."""
    from memkit.models.loading import Policy, identity_wrap
    from memkit.models.tiny import build_tiny

    return Policy(model=build_tiny(kit.tokenizer, seed=seed), tokenizer=kit.tokenizer, spec="tiny", wrap=identity_wrap)


PROMPTS = ("auto", "paper", "compact")


def prompt_wrap(method_name: str, tokenizer, wrap=None, prompt: str = "auto", oracle: bool = False):
    """The context wrap for a policy: ``prompt`` "paper" keeps the paper's instruction,
    "compact" swaps it for one short line (:func:`memkit.agents.base.compact_prompt_wrap`),
    "auto" = paper for the oracle and chat models, compact for tiny models (what SFT trains on).
    Rollouts, SFT and RL must use the same choice, or the model sees a prompt it never learned."""
    if prompt == "auto":
        prompt = "paper" if oracle or getattr(tokenizer, "chat_template", None) else "compact"
    if prompt == "paper":
        return wrap
    if prompt != "compact":
        raise ValueError(f"prompt must be one of {PROMPTS}, got {prompt!r}")
    inner, compact = wrap or (lambda segs: segs), compact_prompt_wrap(method_name)
    return lambda segs: inner(compact(segs))


def rollout(method_name: str, tasks, kit: Kit, policy: str = "oracle", n: int = 1, max_turns: int | None = None,
            temperature: float = 0.0, seed: int = 0, oracle_cfg: OracleConfig | None = None,
            max_context_tokens: int | None = None, progress: bool = False, method_kwargs: dict | None = None,
            prompt: str = "auto", k_docs: int | None = None, sample_seeds=None):
    """Roll out ``n`` trajectories per task with a policy spec; returns trajectories.

    ``sample_seeds``: one seed per trajectory (task-major) for batch-invariant sampling
    (:class:`RolloutConfig`); None = one stream seeded by ``seed``.

    ``prompt``: "paper" (the paper's instruction verbatim), "compact" (one short line and
    numbered questions, see :func:`memkit.agents.base.compact_prompt_wrap`) or "auto" =
    compact for tiny models. ``k_docs``: passages per search; None = what the model was
    trained with (:func:`trained_k_docs`, e.g. 1 for the SFT'd tiny model), else the kit's.
    """
    method = get_method(method_name, **(method_kwargs or {}))
    engine_policy, tok, wrap, loaded = resolve_policy(policy, method, kit, temperature, seed, oracle_cfg)
    env = kit.env_for(k_docs if k_docs is not None else trained_k_docs(getattr(loaded, "model", None)))
    wrap = prompt_wrap(method.name, tok, wrap, prompt, oracle=isinstance(policy, str) and policy == "oracle")
    if max_context_tokens is None:  # the model's window; the oracle has none
        model = getattr(getattr(engine_policy, "backend", None), "model", None)
        max_context_tokens = model.config.max_position_embeddings - 256 if model is not None else 10**9
    cfg = RolloutConfig(n=n, max_turns=max_turns, max_context_tokens=max_context_tokens, seed=seed,
                        sample_seeds=sample_seeds)
    return run_rollouts(method, tasks, env, engine_policy, tok, cfg, wrap=wrap, progress=progress)


def held_out_tasks(kit: Kit, n: int, k: int, seed: int = 1000, kinds=("1hop", "bridge", "comparison")):
    """The held-out ``k``-question tasks of seed base ``seed`` (:data:`EVAL_SEEDS`): test questions
    only (``memkit.world.question_split``), which neither SFT nor RL asks, composed with seed
    ``seed + k``. A smaller ``n`` gives a prefix of the same list. :func:`evaluate`, the trainer's
    periodic evaluation and ``rl.headroom`` all draw these."""
    from memkit.world import make_tasks

    return make_tasks(kit.world, n=n, k=k, seed=seed + k, kinds=kinds, split="test")


def evaluate(method_name: str, kit: Kit, objectives=(1, 2, 4, 8), n_tasks: int = 50, policy: str = "oracle",
             seed: int = 1000, kinds=("1hop", "bridge", "comparison"), **rollout_kw):
    """Run :func:`held_out_tasks` at each objective count; returns ``{k: (summary_dict, trajectories)}``.

    The summary is :func:`memkit.metrics.summarize`'s plus EM by question kind (``em_by_kind``)."""
    from memkit.metrics import em_by_kind, summarize

    results = {}
    policy = load_spec(policy, method_name, kit, seed)  # once for every k
    for k in objectives:
        tasks = held_out_tasks(kit, n_tasks, k, seed, kinds)
        t0 = time.perf_counter()
        trajs = rollout(method_name, tasks, kit, policy=policy, seed=seed, **rollout_kw)
        summary = {**summarize(trajs), **em_by_kind(trajs, tasks)}
        summary["wall_seconds"] = time.perf_counter() - t0
        results[k] = (summary, trajs)
    return results


def config_hash(obj) -> str:
    blob = json.dumps(asdict(obj) if hasattr(obj, "__dataclass_fields__") else obj, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


#: Task seeds reserved for evaluation: :func:`evaluate`'s test tasks (1000 + k, or 1000 + seed + k
#: in the notebooks) and validation sets (``TrainConfig.eval_seed``). Training never uses them.
EVAL_SEEDS = range(1000, 10_000)


def training_seed(seed: int, k: int) -> int:
    """The task seed of training run ``seed`` at ``k`` questions: ``100 seed + k``, moved past
    :data:`EVAL_SEEDS` when it lands there (seed >= 10), so no seed trains on held-out tasks.
    Seeds 0-9 keep their values, which the cached SFT models were trained on."""
    base = seed * 100 + k
    return base + 10_000 if base in EVAL_SEEDS else base


def training_tasks(kit: Kit, objectives, n_tasks: int, seed: int, kinds=("1hop", "bridge", "comparison"),
                   split: str = "sft"):
    """Training tasks of question ``split`` (``memkit.world.question_split``: "sft" for behaviour
    cloning, "rl" for RL, never "test"), composed with seeds apart from the held-out ones
    (:func:`training_seed`)."""
    from memkit.world import make_tasks
    from memkit.world.splits import TRAINING_SPLITS

    if split not in TRAINING_SPLITS:
        raise ValueError(f"training tasks never draw test questions (split={split!r}); use one of {TRAINING_SPLITS}")
    per_k = max(1, n_tasks // len(objectives))
    return [t for k in objectives
            for t in make_tasks(kit.world, n=per_k, k=k, seed=training_seed(seed, k), kinds=kinds, split=split)]


def train_sft_model(method_name: str, kit: Kit, cfg=None, progress: bool = True, log=None, path: Path | None = None):
    """Clone the method's (imperfect) oracle into a fresh tiny model; save and return it.

    Returns ``(path, history, n_examples)``.
    """
    from memkit.cpu import all_cores
    from memkit.sft import SFTConfig, collect_examples, save_checkpoint, train_sft

    t0 = time.perf_counter()
    cfg = cfg or SFTConfig(method=method_name)
    tasks = training_tasks(kit, cfg.objectives, cfg.n_tasks, cfg.seed)
    trajs = rollout(method_name, tasks, kit, policy="oracle", oracle_cfg=cfg.oracle, seed=cfg.seed, prompt="compact",
                    k_docs=cfg.k_docs)
    examples, dropped = collect_examples([t for t in trajs if t.valid], cfg.max_len)
    policy = fresh_tiny(kit, cfg.seed)
    setattr(policy.model.config, K_DOCS_ATTR, cfg.k_docs)  # its rollouts will search the same way
    opt_cfg = cfg  # max_seconds budgets the whole call: the optimisation gets what the data left
    if cfg.max_seconds:
        from dataclasses import replace

        opt_cfg = replace(cfg, max_seconds=max(cfg.max_seconds - (time.perf_counter() - t0), 1.0))
    with all_cores() as threads:
        history = train_sft(policy.model, kit.tokenizer, examples, opt_cfg, log=log, progress=progress)
    path = path or sft_checkpoint_path(method_name, kit.world_seed)
    meta = {"sft": asdict(cfg), "n_examples": len(examples), "n_dropped_too_long": dropped, "history": history,
            "torch_threads": threads}
    save_checkpoint(policy.model, kit.tokenizer, path, meta)
    return path, history, len(examples)
