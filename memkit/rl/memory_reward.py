"""MemPO's memory reward: how much more likely the gold answer became once ``<mem>`` was written.

    P[ans | c]   = ( prod_l pi(a_l | c, a_<l) )^(1/L)                      (eq. 5, geometric mean)
    R_M(i, t)    = P[ans | q, mem_t] - epsilon_t                           (eq. 4, the bias term)

``q`` is the question context as the policy saw it (call 0's context, the prompt wrap included),
``mem_t`` the exact ``<mem>...</mem>`` tokens call t wrote. The answer (every slot's gold,
``"; "``-joined) is scored by teacher forcing after an *opener* that ends the format's answering
step: ``think`` = ``<think>`` with the teacher's answering thought, then ``<answer>``; ``answer`` =
``<answer>`` right after ``</mem>`` (eq. 5 read literally; out of format for a cloned tiny model,
whose P is then ~1e-3 everywhere: docs/findings.md, 'MemPO'); the format owns that text
(:func:`memkit.agents.mempo.probe_opener`). Knobs (``TrainConfig.mem_reward_*``):

- ``context``: ``question`` (q + mem_t, eq. 5) | ``call`` (call t's context + mem_t)
- ``bias`` epsilon_t = P[ans | prefix before t]: ``previous`` = the same probe with the previous
  memory (an empty ``<mem>`` before the first), so R_M is what this memory update added; ``call`` =
  call t's own context with an empty ``<mem>``; ``none`` = 0 (the Fig. 3 ablation)
- ``opener``: ``think`` | ``answer`` (above); ``answer_tags``: also score the closing ``</answer>``
- ``score``: ``joint`` (eq. 5 over all answer tokens) | ``per_slot`` (eq. 5 per question, then the mean)

Every probe of a batch of trajectories is one row ``probe context + answer``; the rows are packed
(:func:`memkit.rl.packing.pack`, ``separate`` rows or ``mem1_exact``'s prefix trie, where probes of
one trajectory share the question once) and scored in a few batched forwards, not one per memory.
:func:`answer_probability_loop` is the one-forward-per-probe reference the tests compare with.

The ``mempo`` credit rule (eq. 3, 6-9) that turns R_M into advantages is
:mod:`memkit.rl.credit.mempo`; it runs :func:`prepare_memory_reward` before its advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from memkit.agents.mempo import probe_opener
from memkit.core.trajectory import Call, TrainingUnit, Trajectory
from memkit.rl.choices import (
    MEM_BIASES as BIASES,  # noqa: F401
    MEM_CONTEXTS as CONTEXTS,
    MEM_NORMS as NORMS,
    MEM_OPENERS as OPENERS,
    MEM_SCORES as ANSWER_SCORES,
    PROBE_PACKINGS,
)
from memkit.rl.losses import token_logprobs
from memkit.rl.packed_forward import packed_attention
from memkit.rl.packing import pack
from memkit.rollout.context import token_char_ends

MEM_TAG = "mem"
EMPTY_MEMORY = "<mem>\n</mem>"


@dataclass(frozen=True)
class Probe:
    """One P[ans | context] to compute: call ``call`` of trajectory ``traj`` (indices into the
    scored list), ``kind`` "mem" (with mem_t) or "bias" (the prefix before t)."""

    traj: int
    call: int
    kind: str
    context_ids: list[int]
    answer_ids: list[int]
    answer_slots: tuple[int, ...] = ()  # per answer token: its question (0..k-1), -1 for "; " and tags


def gold_text(traj: Trajectory) -> str:
    """The gold answer as the format writes it: every slot's first gold, ``"; "``-joined."""
    return "; ".join(g[0] for g in traj.golds if g)


def memory_span(call: Call) -> tuple[int, int] | None:
    """``[start, end)`` output-token span of the call's first ``<mem>...</mem>`` (tags included)."""
    spans = call.output_spans.get(MEM_TAG) or []
    return tuple(spans[0]) if spans else None


def previous_memory(traj: Trajectory, t: int) -> int | None:
    """The nearest earlier call on call t's chain (``Trajectory.path``) that wrote a ``<mem>``, or None."""
    return next((j for j in reversed(traj.path(t)[:-1]) if memory_span(traj.calls[j]) is not None), None)


def _answer_slots(tokenizer, answer: list[int], golds: list[str]) -> tuple[int, ...]:
    """Per answer token, the question whose gold its last character belongs to (golds are joined by
    ``"; "``); -1 for the separators and tags."""
    owner, start = [], 0
    for q, g in enumerate(golds):
        owner += [-1] * (start - len(owner)) + [q] * len(g)
        start = len(owner) + 2
    ends = token_char_ends(tokenizer, answer)
    return tuple(owner[e - 1] if 0 < e <= len(owner) else -1 for e in ends)


def memory_probes(
    trajs: list[Trajectory],
    tokenizer,
    context: str = "question",
    bias: str = "previous",
    answer_tags: bool = False,
    opener: str = "think",
) -> list[Probe]:
    """The probes of eq. 4 for every call that wrote a ``<mem>`` span (a trajectory without gold
    answers, e.g. an unlabelled rollout, gets none): a "mem" probe per memory and, for ``bias``
    ``call`` every memory / ``previous`` only the first of a chain, a "bias" probe with an empty
    memory (``previous`` reuses the previous memory's "mem" probe, :func:`score_memories`)."""
    if context not in CONTEXTS or bias not in BIASES or opener not in OPENERS:
        raise ValueError(
            f"mem_reward context must be one of {CONTEXTS}, bias one of {BIASES} and opener one of "
            f"{OPENERS}; got {context!r}, {bias!r}, {opener!r}"
        )
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    after, empty = enc(probe_opener(opener)), enc(EMPTY_MEMORY)
    probes = []
    for i, traj in enumerate(trajs):
        gold = gold_text(traj)
        if not gold:
            continue
        answer = enc(gold + ("\n</answer>" if answer_tags else ""))
        slots = _answer_slots(tokenizer, answer, [g[0] for g in traj.golds if g])
        for t, call in enumerate(traj.calls):
            span = memory_span(call)
            if span is None:
                continue
            head = list(traj.calls[traj.path(t)[0]].context_ids if context == "question" else call.context_ids)
            probes.append(Probe(i, t, "mem", head + list(call.output_ids[span[0] : span[1]]) + after, answer, slots))
            if bias == "call" or (bias == "previous" and previous_memory(traj, t) is None):
                prefix = list(call.context_ids) if bias == "call" else head
                probes.append(Probe(i, t, "bias", prefix + empty + after, answer, slots))
    return probes


def _probe_units(probes: list[Probe]) -> tuple[list[TrainingUnit], list[tuple[int, int]]]:
    """One pseudo-trajectory per scored trajectory whose calls are its probes (context = probe
    context, output = answer): ``pack`` then lays them out like training calls. Returns the units
    and, per probe, (unit, call) in them."""
    by_traj: dict[int, list[int]] = {}
    for k, p in enumerate(probes):
        by_traj.setdefault(p.traj, []).append(k)
    units, where = [], [None] * len(probes)
    for u, ks in enumerate(by_traj.values()):
        calls = [
            Call(
                turn=0,
                role="probe",
                context_ids=probes[k].context_ids,
                output_ids=probes[k].answer_ids,
                logprobs=[0.0] * len(probes[k].answer_ids),
            )
            for k in ks
        ]
        units.append(TrainingUnit(Trajectory(task_id=f"probe-{u}", method="probe", calls=calls), tuple(range(len(ks)))))
        for c, k in enumerate(ks):
            where[k] = (u, c)
    return units, where


@torch.no_grad()
def answer_probability(
    model,
    probes: list[Probe],
    packing: str = "separate",
    rows_per_forward: int = 64,
    pad_id: int = 0,
    attention: str = "auto",
    score: str = "joint",
) -> torch.Tensor:
    """P[ans | context] of every probe (eq. 5) in batched forwards. shape: ``[len(probes)]`` float32.

    ``score``: ``joint`` = eq. 5 over every answer token; ``per_slot`` = eq. 5 within each question's
    answer tokens (the same teacher-forced row), then the mean over questions, so a memory holding
    one of two answers scores about 1/2 instead of the ~0 of a product over both.

    The probes are packed (``packing``: ``separate`` = one row each, ``mem1_exact`` = one prefix-trie
    row per trajectory) and the rows scored ``rows_per_forward`` at a time, length-sorted so each
    forward pads only to its own longest row; log P = mean over the answer tokens of their log-probs.
    """
    if not probes:
        return torch.zeros(0)
    units, where = _probe_units(probes)
    batch = pack(units, packing, pad_id)
    device = next(model.parameters()).device
    logp = torch.zeros(batch.input_ids.shape)
    lengths = batch.lengths.tolist()
    order = sorted(range(len(lengths)), key=lengths.__getitem__)  # short rows first
    for s in range(0, len(order), rows_per_forward):
        rows = torch.tensor(order[s : s + rows_per_forward])
        width = max(lengths[r] for r in rows.tolist())
        cut = lambda x: x[rows][..., :width] if x.dim() == 2 else x[rows][..., :width, :width]  # noqa: E731
        m = cut(batch.loss_mask).to(device)
        with packed_attention(model, cut(batch.attention_mask).to(device), attention) as mask:
            lp = token_logprobs(
                model,
                cut(batch.input_ids).to(device),
                mask,
                cut(batch.position_ids).to(device),
                cut(batch.pred_index).to(device),
                loss_mask=m,
            )
        logp[rows, :width] = lp.float().cpu() * m.cpu()
    # each answer token's probe: table[unit, call] -> probe index; then one index_add per batch
    table = torch.full((len(units), max(len(u.calls) for u in units)), -1, dtype=torch.long)
    for k, (u, c) in enumerate(where):
        table[u, c] = k
    sel = batch.loss_mask > 0
    k = table[batch.unit_index[:, None].expand_as(batch.call_ids)[sel], batch.call_ids[sel]]
    lp = logp[sel]
    if score == "joint":
        n_answer = torch.tensor([len(p.answer_ids) for p in probes], dtype=torch.float32)
        return (torch.zeros(len(probes)).index_add_(0, k, lp) / n_answer).exp()
    # per_slot: the j-th answer token of probe k (tokens of a probe appear in answer order) -> its slot
    order = torch.argsort(k, stable=True)
    counts = torch.bincount(k, minlength=len(probes))
    j = torch.empty_like(k)
    j[order] = torch.arange(len(k)) - (counts.cumsum(0) - counts)[k[order]]
    width = max(len(p.answer_slots) for p in probes)
    slot_table = torch.tensor([list(p.answer_slots) + [-1] * (width - len(p.answer_slots)) for p in probes])
    slot = slot_table[k, j]
    n_slots = int(slot_table.max()) + 1
    keep = slot >= 0
    group = k[keep] * n_slots + slot[keep]
    sums = torch.zeros(len(probes) * n_slots).index_add_(0, group, lp[keep])
    n = torch.zeros(len(probes) * n_slots).index_add_(0, group, torch.ones(int(keep.sum())))
    p_slot = torch.where(n > 0, (sums / n.clamp(min=1)).exp(), torch.zeros(())).view(len(probes), n_slots)
    return p_slot.sum(-1) / (n.view(len(probes), n_slots) > 0).sum(-1).clamp(min=1)


@torch.no_grad()
def answer_probability_loop(model, probes: list[Probe], score: str = "joint") -> list[float]:
    """Loop reference for :func:`answer_probability`: one unbatched forward per probe."""
    device = next(model.parameters()).device
    out = []
    for p in probes:
        ids = torch.tensor([p.context_ids + p.answer_ids], device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        n = len(p.context_ids)
        lp = [torch.log_softmax(logits[n - 1 + i], -1)[a].item() for i, a in enumerate(p.answer_ids)]
        if score == "joint":
            out.append(math.exp(sum(lp) / len(lp)))
            continue
        per_slot = {}
        for x, q in zip(lp, p.answer_slots):
            if q >= 0:
                per_slot.setdefault(q, []).append(x)
        out.append(sum(math.exp(sum(v) / len(v)) for v in per_slot.values()) / max(len(per_slot), 1))
    return out


@torch.no_grad()
def score_memories(
    model,
    tokenizer,
    trajs: list[Trajectory],
    context: str = "question",
    bias: str = "previous",
    answer_tags: bool = False,
    opener: str = "think",
    packing: str = "separate",
    rows_per_forward: int = 64,
    attention: str = "auto",
    score: str = "joint",
) -> list[dict]:
    """Eq. 4 for every memory of ``trajs``: sets ``Call.reward = R_M`` on each call that wrote a
    ``<mem>`` span and returns one row per memory: ``traj``, ``call``, ``turn``, ``p_mem``
    (P[ans | q, mem_t]), ``p_bias`` (epsilon_t; 0 when ``bias='none'``), ``r_m``."""
    probes = memory_probes(trajs, tokenizer, context, bias, answer_tags, opener)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    p = answer_probability(model, probes, packing, rows_per_forward, pad, attention, score).tolist()
    rows: dict[tuple[int, int], dict] = {}
    for probe, value in zip(probes, p):
        row = rows.setdefault(
            (probe.traj, probe.call),
            {
                "traj": probe.traj,
                "call": probe.call,
                "turn": trajs[probe.traj].calls[probe.call].turn,
                "p_mem": 0.0,
                "p_bias": 0.0,
            },
        )
        row["p_" + probe.kind] = value
    for (i, t), row in rows.items():
        prev = previous_memory(trajs[i], t) if bias == "previous" else None
        if prev is not None:
            row["p_bias"] = rows[i, prev]["p_mem"]
        row["r_m"] = row["p_mem"] - row["p_bias"]
        trajs[i].calls[t].reward = row["r_m"]
    return list(rows.values())


@torch.no_grad()
def prepare_memory_reward(trajs: list[Trajectory], learner) -> dict:
    """The ``mempo`` rule's prepare hook (:func:`memkit.rl.credit.register_credit`): R_M of every
    ``<mem>`` of ``trajs`` under the learner's current policy, with its ``TrainConfig``'s
    ``mem_reward_*`` knobs (sets ``Call.reward``). Returns global stats: mem_p (mean P[ans | q, mem_t]),
    mem_bias_p, mem_r, memories, and mem_reward_seconds (the probes' forward time, this process)."""
    import time

    t0 = time.perf_counter()
    rows = learner.memory_rows(trajs, learner.cfg.mem_reward.bias, learner.cfg.mem_reward.packing)
    seconds = time.perf_counter() - t0
    n, p, b, r = learner.global_sums(
        [len(rows), sum(x["p_mem"] for x in rows), sum(x["p_bias"] for x in rows), sum(x["r_m"] for x in rows)]
    )
    d = max(n, 1.0)
    return {"mem_p": p / d, "mem_bias_p": b / d, "mem_r": r / d, "memories": n, "mem_reward_seconds": seconds}


__all__ = [
    "Probe",
    "CONTEXTS",
    "BIASES",
    "OPENERS",
    "NORMS",
    "PROBE_PACKINGS",
    "gold_text",
    "memory_span",
    "previous_memory",
    "ANSWER_SCORES",
    "memory_probes",
    "answer_probability",
    "answer_probability_loop",
    "score_memories",
    "prepare_memory_reward",
]
