"""A kit: the synthetic world, a search env over its passages, and the world's tokenizer.

Everything a rollout needs besides the policy. ``memkit eval``, ``memkit sft``, ``memkit train``
and the notebooks all start from :func:`load_kit`, so their numbers come from the same world.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memkit.agents import METHODS, get_method
from memkit.core.io import atomic_dir, cache_dir
from memkit.envs import SearchEnv, make_retriever
from memkit.models import train_tokenizer
from memkit.models.tokenizer import DEFAULT_VOCAB, TOKENIZER_SCHEME
from memkit.rollout.engine import OraclePolicy, RolloutConfig, run_rollouts
from memkit.world import make_tasks, make_world, world_texts


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
        if k_docs is None or k_docs == self.env.k:
            return self.env
        if k_docs not in self._envs_by_k:
            self._envs_by_k[k_docs] = SearchEnv(self.env.retriever, k=k_docs)
        return self._envs_by_k[k_docs]


def load_kit(world_seed: int = 0, retriever: str = "bm25", k_docs: int = 3, vocab_size: int | None = None) -> Kit:
    """The default synthetic world, a search env over its passages, and the tiny tokenizer."""
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
    tok, texts = _ByteTokenizer(), []
    tasks = [t for k in (1, 2) for t in make_tasks(world, n=n_tasks, k=k, seed=seed + k)]
    for name in METHODS:
        method = get_method(name)
        trajs = run_rollouts(
            method, tasks, env, OraclePolicy(method, tok, seed=seed), tok, RolloutConfig(max_context_tokens=10**9)
        )
        texts += [c.output_text for t in trajs for c in t.calls if c.output_text]
    return texts


def world_tokenizer(world, world_seed: int, vocab_size: int | None = None):
    """BPE trained on the world's passages, questions, every method's prompts and oracle outputs
    (always rolled out with BM25 top-3, so the cached tokenizer does not depend on which kit
    asked first), so the agents' own phrases ("Nothing found yet. Next I need") are a few ids,
    not a dozen pieces (cached per world seed and vocabulary size)."""
    from transformers import AutoTokenizer

    vocab_size = vocab_size or DEFAULT_VOCAB
    path = cache_dir() / f"tokenizer-w{world_seed}-v{vocab_size}-{TOKENIZER_SCHEME}"
    if (path / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(path)
    tasks = make_tasks(world, n=200, k=2, seed=world_seed + 1)
    prompts = [get_method(m).next_call(get_method(m).new_state(t)).text for m in METHODS for t in tasks[:20]]
    env = SearchEnv(make_retriever("bm25", world.passages), k=3)
    outputs = oracle_transcripts(world, env)
    tok = train_tokenizer(list(world_texts(world, tasks)) + prompts + outputs, vocab_size=vocab_size)
    with atomic_dir(path, keep_existing=True) as tmp:  # a concurrent process wrote it first: keep theirs
        tok.save_pretrained(tmp)
    return AutoTokenizer.from_pretrained(path)
