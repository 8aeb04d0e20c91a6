"""Mem-T construction in the RL lab: a clone of the teacher's memory construction, then hindsight SFT.

The construction policy pi_cons (formation and evolution calls, §3.1) builds the stores of
training conversations by sampling; the retrieval policy grows MoT trees on their questions
(:func:`memkit.rollout.trees.grow_forest`); every memory operation a_mem gets its hindsight score
S(a_mem) (eq. 16-17, :func:`memkit.rl.mot.hindsight_scores`); the valid operations in the top 50%
of their type, ranked over the whole pool, are D*_mem, and SFT maximises their log-likelihood
(eq. 18) on exactly their tokens (one formation call writes several operations: the loss covers
the kept ``<tool_call>`` spans only, conditioned on the whole output before them):

    L(theta) = - sum_{a_mem in D*_mem} log pi_theta(a_mem | x_{a_mem})                      (eq. 18)

"w/o hindsight" (the ablation) keeps as many operations per type drawn at random and trains the
same steps. The teacher's flaw is ``forget_earlier`` in half of its slots: an UPDATE that drops the
"Before: ..." history that a "where did X live before" question needs, so the clone's construction
has a flaw hindsight can see (a memory retrieved on leaves that fail).
"""

from __future__ import annotations

import copy
import random
from dataclasses import asdict, dataclass, field

from memkit.agents import get_method
from memkit.agents.base import OracleConfig
from memkit.agents.memt import INFO_STORE_OPS
from memkit.agents.memt_tools import stream_conversation, stream_store
from memkit.lab.memt.retrieval import (
    MAX_CONTEXT_TOKENS,
    cached_clone,
    clone_examples,
    f1_by_category,
    memt_wrap,
    sampler,
)
from memkit.lab.policies import sft_init
from memkit.rl.mot import MoTConfig, construction_ops, hindsight_filter, hindsight_scores, score_query
from memkit.rollout.engine import OraclePolicy, RolloutConfig, to_trajectory
from memkit.rollout.streams import answer_questions, build_memories
from memkit.rollout.trees import TreeConfig, grow_forest
from memkit.train.config import resolve_sft
from memkit.train.sft import SFTConfig, train_sft
from memkit.world.streams import make_conversations

CONSTRUCTION_ROLES = ("form", "evolve")
#: queries whose trees grow in one batch (:func:`memkit.rollout.trees.grow_forest`)
QUERIES_PER_BATCH = 32
#: the word an UPDATE's document uses for a slot's earlier values (the teacher's template)
HISTORY_MARK = "Before:"


@dataclass(frozen=True)
class ConstructionLab:
    """The construction clone's recipe (SMOKE shrinks it)."""

    size: str = "smoke"
    train_conversations: int = 300  # ~1,200 formation and ~2,700 evolution calls to clone
    teacher: OracleConfig = field(default_factory=lambda: OracleConfig(flaw="forget_earlier", flaw_rate=0.5))
    sft_steps: int = 6000
    sft_seconds: float | None = 360.0  # formation calls are long (~520 tokens): ~600 steps on one core
    seed: int = 0
    init: str = "base"


def construction_examples(built, max_len: int) -> list[tuple[list[int], list[int]]]:
    """SFT examples ``(context_ids, output_ids)`` from the valid construction calls of built states."""
    return clone_examples((c for b in built for c in b.calls if c.valid), CONSTRUCTION_ROLES, max_len)


def clone_construction(kit, lab: ConstructionLab | None = None, progress: bool = True, log=None):
    """SFT the tiny model on the flawed teacher's construction calls. Returns ``(model, history, n)``."""
    lab = lab or ConstructionLab()
    method = get_method("memt")
    cfg = SFTConfig(init=lab.init, steps=lab.sft_steps, max_seconds=lab.sft_seconds, seed=lab.seed, warmup=100)
    policy = sft_init(cfg, kit, progress=progress)
    convs = make_conversations(kit.world, lab.train_conversations, seed=40_000 + lab.seed, size=lab.size)
    built = build_memories(
        method,
        convs,
        OraclePolicy(method, kit.tokenizer, lab.teacher, seed=lab.seed),
        kit.tokenizer,
        RolloutConfig(max_context_tokens=10**9),
        wrap=memt_wrap(kit),
    )
    examples = construction_examples(built, resolve_sft(cfg, pretrained=False).max_len)
    history = train_sft(policy.model, kit.tokenizer, examples, cfg, log=log, progress=progress)
    return policy.model, history, len(examples)


def ensure_construction_clone(kit, lab: ConstructionLab | None = None, progress: bool = True):
    """The construction clone of ``lab`` (:func:`clone_construction`), cached by its recipe and the
    tokenizer scheme; returns the model."""
    lab = lab or ConstructionLab()
    return cached_clone(
        kit,
        construction_clone_path(kit, lab),
        "construction_lab",
        lab,
        lambda: clone_construction(kit, lab, progress=progress),
    )


def construction_clone_path(kit, lab: ConstructionLab):
    """Where :func:`ensure_construction_clone` caches the construction clone of ``lab``."""
    from memkit.core.io import cache_dir
    from memkit.lab.policies import config_hash
    from memkit.models.tokenizer import TOKENIZER_SCHEME

    return cache_dir() / f"tiny-sft-memt-cons-w{kit.world_seed}-{TOKENIZER_SCHEME}-cfg{config_hash(asdict(lab))}"


def build_with(model, kit, convs, temperature: float = 0.0, seed: int = 0):
    """The stores of ``convs`` built by construction policy ``model`` (greedy by default)."""
    policy, wrap = sampler(model, kit, temperature, seed)
    return build_memories(
        get_method("memt"),
        convs,
        policy,
        kit.tokenizer,
        RolloutConfig(max_context_tokens=MAX_CONTEXT_TOKENS),
        wrap=wrap,
    )


# ---- hindsight pool and D*_mem ------------------------------------------------------------
@dataclass
class OpPool:
    """Every memory operation of a set of built conversations with its hindsight score.

    ``ops[k]`` (:func:`memkit.rl.mot.construction_ops`) + ``"conv"`` (index into ``trajs``);
    ``scores[k]`` = S(ops[k]) (eq. 16-17)."""

    trajs: list
    ops: list[dict]
    scores: list[float]


def score_pool(
    kit,
    cons_model,
    retr_model,
    convs,
    seed: int = 0,
    temperature: float = 1.0,
    tree_cfg: TreeConfig = TreeConfig(3, 1, 2),
    questions: int | None = None,
    mot: MoTConfig = MoTConfig(),
    lam: float = 0.1,
    teacher: OracleConfig | None = None,
    reader: OracleConfig | None = None,
) -> OpPool:
    """Build ``convs`` with ``cons_model`` (sampled at ``temperature``; or by the scripted teacher
    with ``teacher``'s knobs, an off-policy pool), grow the retrieval policy's trees on (up to
    ``questions`` of) each conversation's questions (or the teacher's, with ``reader``'s knobs: a
    reader that can use every memory, to tell the credit rule's limits from the reader's), score
    every op."""
    method = get_method("memt")
    if teacher is None:
        built = build_with(cons_model, kit, convs, temperature, seed)
    else:
        built = build_memories(
            method,
            convs,
            OraclePolicy(method, kit.tokenizer, teacher, seed=seed),
            kit.tokenizer,
            RolloutConfig(max_context_tokens=10**9),
            wrap=memt_wrap(kit),
        )
    if reader is None:
        policy, wrap = sampler(retr_model, kit, temperature, seed + 7)
    else:
        policy, wrap = OraclePolicy(method, kit.tokenizer, reader, seed=seed + 7), None
    cfg = RolloutConfig(max_context_tokens=MAX_CONTEXT_TOKENS)
    rng = random.Random(f"pool-{seed}")
    jobs = []
    for b in built:
        n = len(stream_conversation(b).qa)
        jobs += [(b, qi) for qi in sorted(rng.sample(range(n), min(questions or n, n)))]
    grown = []
    for at in range(0, len(jobs), QUERIES_PER_BATCH):
        grown += grow_forest(
            method,
            jobs[at : at + QUERIES_PER_BATCH],
            policy,
            kit.tokenizer,
            TreeConfig(tree_cfg.trees, tree_cfg.rounds, tree_cfg.pivots, seed),
            cfg,
            wrap,
        )
    trajs, ops, scores = [], [], []
    for i, b in enumerate(built):
        qa, sources = stream_conversation(b).qa, stream_store(b).sources_of()
        queries = []
        for (bj, qi), qt in zip(jobs, grown):
            if bj is b:
                score_query(qt.trees, qa[qi].evidence, sources, mot)
                queries.append((list(qa[qi].evidence), qt.trees))
        traj = to_trajectory(method, b, 0)
        conv_ops = construction_ops(traj)
        trajs.append(traj)
        ops += [{**op, "conv": i} for op in conv_ops]
        scores += hindsight_scores(conv_ops, queries, lam)
    return OpPool(trajs, ops, scores)


def random_filter(ops: list[dict], keep: float = 0.5, seed: int = 0) -> list[int]:
    """The ablation's D_mem: as many valid ops per type as :func:`memkit.rl.mot.hindsight_filter`
    keeps, drawn at random."""
    rng = random.Random(f"random-filter-{seed}")
    return hindsight_filter(ops, [rng.random() for _ in ops], keep)


def tool_call_token_spans(tokenizer, output_ids: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` token ranges of each ``<tool_call>...</tool_call>`` in ``output_ids``, in
    order: a token belongs to a call if any of its characters does."""
    ends = [len(tokenizer.decode(output_ids[: i + 1])) for i in range(len(output_ids))]  # char end of token i
    text = tokenizer.decode(output_ids)
    spans, at = [], 0
    while (start := text.find("<tool_call>", at)) >= 0:
        stop = text.find("</tool_call>", start)
        end = len(text) if stop < 0 else stop + len("</tool_call>")
        first = next(i for i, e in enumerate(ends) if e > start)
        last = next((i for i, e in enumerate(ends) if e >= end), len(ends) - 1)
        spans.append((first, last + 1))
        at = end
    return spans


def op_examples(pool: OpPool, kept: list[int], tokenizer) -> list[tuple[list[int], list[int], list[bool]]]:
    """Eq. 18's training set: one ``(context_ids, output_ids, target_mask)`` per construction call
    with a kept op; ``target_mask`` marks the kept ops' tool-call tokens (an evolution call is one op:
    its whole output)."""
    by_call: dict[tuple[int, int], list[int]] = {}
    for k in kept:
        op = pool.ops[k]
        by_call.setdefault((op["conv"], op["call"]), []).append(op["tool_index"])
    out = []
    for (conv, call), tools in sorted(by_call.items()):
        c = pool.trajs[conv].calls[call]
        if c.role == "evolve":
            mask = [True] * len(c.output_ids)
        else:
            spans = tool_call_token_spans(tokenizer, c.output_ids)
            mask = [
                any(spans[t][0] <= i < spans[t][1] for t in tools if t < len(spans)) for i in range(len(c.output_ids))
            ]
        out.append((c.context_ids, c.output_ids, mask))
    return out


def hindsight_sft(model, kit, examples, seconds: float | None, steps: int, lr: float = 1e-3, seed: int = 0):
    """A copy of ``model`` trained by eq. 18 on ``examples`` (output-only loss on the masked tokens);
    no examples (no valid operation in the pool) leave the copy as it was, with an empty history."""
    model = copy.deepcopy(model)
    if not examples:
        return model.eval(), []
    cfg = SFTConfig(
        init="scratch",
        steps=steps,
        max_seconds=seconds,
        lr=lr,
        warmup=10,
        seed=seed,
        context_weight=0.0,
        batch_size=8,
        log_every=10**9,
    )
    history = train_sft(model, kit.tokenizer, examples, cfg, progress=False)
    return model.eval(), history


# ---- what a construction policy's stores are worth ----------------------------------------
def _update_docs(traj, calls=None) -> list[str]:
    """The documents the UPDATEs of ``traj``'s construction calls wrote (of ``calls`` only, if given)."""
    ops = traj.info.get(INFO_STORE_OPS, {})
    return [op[2] for k in (ops if calls is None else map(str, calls)) for op in ops.get(k, []) if op[0] == "update"]


def _history_share(docs: list[str]) -> float:
    return sum(HISTORY_MARK in d for d in docs) / len(docs) if docs else 0.0


def update_history_rate(trajs) -> tuple[float, int]:
    """Share of valid ``update_item`` calls whose document keeps earlier values (:data:`HISTORY_MARK`),
    and how many there were."""
    docs = [d for t in trajs for d in _update_docs(t)]
    return _history_share(docs), len(docs)


def store_quality(kit, cons_model, retr_model, convs, seed: int = 0) -> dict:
    """Greedy construction of ``convs`` by ``cons_model``, then every question answered by the
    retrieval clone (``f1``) and by the teacher's exact reader (``reader_f1``: what the store holds,
    without a learned reader's errors); plus the UPDATE history rate and invalid construction calls."""
    method = get_method("memt")
    built = build_with(cons_model, kit, convs, 0.0, seed)
    trajs = [to_trajectory(method, b, 0) for b in built]
    rate, n_updates = update_history_rate(trajs)
    calls = [c for t in trajs for c in t.calls if c.role in CONSTRUCTION_ROLES]
    policy, wrap = sampler(retr_model, kit, 0.0, seed)
    cfg = RolloutConfig(max_context_tokens=MAX_CONTEXT_TOKENS)
    learned = f1_by_category(answer_questions(method, built, policy, kit.tokenizer, cfg, wrap))
    reader = f1_by_category(
        answer_questions(
            method, built, OraclePolicy(method, kit.tokenizer), kit.tokenizer, RolloutConfig(max_context_tokens=10**9)
        )
    )
    return {
        "f1": learned["overall"],
        "f1_multi_hop": learned.get("multi-hop", 0.0),
        "reader_f1": reader["overall"],
        "reader_multi_hop": reader.get("multi-hop", 0.0),
        "history_rate": rate,
        "updates": n_updates,
        "invalid_construction": sum(not c.valid for c in calls) / max(len(calls), 1),
    }


#: the construction arms of notebook 06: name -> the filter that picks D_mem
CONSTRUCTION_ARMS = {"hindsight SFT": "hindsight", "w/o hindsight": "random"}


def run_construction_arms(
    kit,
    cons_model,
    retr_model,
    train_convs,
    eval_convs,
    seed: int,
    seconds: float | None,
    steps: int,
    questions: int | None = None,
    keep: float = 0.5,
    teacher: OracleConfig | None = None,
) -> tuple[dict, OpPool]:
    """One seed of the construction ablation: score a pool (:func:`score_pool`), then per arm of
    :data:`CONSTRUCTION_ARMS` SFT on its D_mem and measure :func:`store_quality` on ``eval_convs``.
    Returns ``(rows, pool)``."""
    pool = score_pool(kit, cons_model, retr_model, train_convs, seed=seed, questions=questions, teacher=teacher)
    rows = {}
    for arm, rule in CONSTRUCTION_ARMS.items():
        kept = (
            hindsight_filter(pool.ops, pool.scores, keep)
            if rule == "hindsight"
            else random_filter(pool.ops, keep, seed)
        )
        model, history = hindsight_sft(
            cons_model, kit, op_examples(pool, kept, kit.tokenizer), seconds, steps, seed=seed
        )
        rows[arm] = {
            **store_quality(kit, model, retr_model, eval_convs, seed),
            "kept_ops": len(kept),
            "kept_updates_with_history": _kept_history(pool, kept),
            "sft_loss": history[-1]["loss"] if history else None,
        }
    return rows, pool


def _kept_history(pool: OpPool, kept: list[int]) -> float:
    """Share of the kept ``update_item`` ops whose document keeps the history."""
    ops = [pool.ops[k] for k in kept if pool.ops[k]["op"] == "update_item"]
    return _history_share([d for op in ops for d in _update_docs(pool.trajs[op["conv"]], [op["call"]])])
