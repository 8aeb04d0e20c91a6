"""The credit rules' own knobs, one dataclass per paper's rule, nested in ``TrainConfig``
(``cfg.mem_reward``, ``cfg.dcpo``, ``cfg.mot``). Torch-free like :mod:`memkit.rl.config`, so the
command line parses without it; each flag keeps its name (``--mem-reward-bias``, ``--dcpo-segments``,
``--mot-alpha``: the nested field's name is the prefix).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memkit.rl.choices import MEM_BIASES, MEM_CONTEXTS, MEM_NORMS, MEM_OPENERS, MEM_SCORES, MOT_COMBINES, PROBE_PACKINGS

DCPO_GROUP_STATS = ("all", "sampled")


@dataclass(frozen=True)
class MemPOConfig:
    """MemPO's memory reward R_M (credit ``mempo``, :mod:`memkit.rl.memory_reward`; eq. 4-9)."""

    context: str = field(default="question", metadata={"choices": MEM_CONTEXTS})
    """MemPO (credit ``mempo``) eq. 5: what conditions P[ans | ., mem_t]: ``question`` (the question
    context + mem_t, as eq. 5 writes it) or ``call`` (call t's whole context + mem_t)."""
    bias: str = field(default="previous", metadata={"choices": MEM_BIASES})
    """MemPO eq. 4's bias epsilon_t = P[ans | prefix before t]: ``previous`` = P[ans | q, mem_{t-1}] (an
    empty memory before the first: R_M is what the memory update added), ``call`` = P[ans | the context
    call t saw, an empty memory], ``none`` = 0 (the Fig. 3 ablation)."""
    opener: str = field(default="think", metadata={"choices": MEM_OPENERS})
    """MemPO eq. 5: what follows ``</mem>`` before the scored answer: ``think`` (the format's answering
    step, ``<think>`` + the teacher's answering thought + ``<answer>``) or ``answer`` (``<answer>`` at
    once, eq. 5 literally; out of format for a cloned tiny model: docs/findings.md, 'MemPO')."""
    score: str = field(default="joint", metadata={"choices": MEM_SCORES})
    """MemPO eq. 5 over a k-question gold: ``joint`` (the geometric mean over every answer token, the
    paper's) or ``per_slot`` (eq. 5 within each question's answer tokens, then their mean: a memory
    holding one of two answers scores ~1/2, not ~0)."""
    norm: str = field(default="pooled", metadata={"choices": MEM_NORMS})
    """MemPO eq. 6-8: normalise R_M over every memory of a task's N samples (``pooled``) or only
    over those written at the same turn (``per_step``; the 'without pooling' ablation)."""
    answer_tags: bool = False
    """MemPO eq. 5: also score the closing ``</answer>`` after the gold answer tokens."""
    log: bool = False
    """Score every ``<mem>`` (and log ``mem_p``, the mean P[ans | q, mem_t], per step) under a credit
    rule that does not use it, e.g. GRPO, to compare with MemPO's curve; costs the probes' forwards."""
    packing: str = field(default="separate", metadata={"choices": PROBE_PACKINGS})
    """Layout of the probe rows: ``separate`` (one row per probe) or ``mem1_exact`` (one prefix-trie
    row per trajectory, the question once); the same P either way (``benchmarks/mempo_cost.py``)."""


@dataclass(frozen=True)
class DCPOConfig:
    """MemAct's DCPO (credit ``dcpo``, :mod:`memkit.rl.segments`; eq. 4-6, Algorithm 1)."""

    segments: int = 12
    """DCPO (credit ``dcpo``): N_seg, the segments drawn round-robin per prompt (MemAct §4.3.1: 12 from
    N_traj = 5); 0 = every segment of every sample once (``memkit.rl.segments.dcpo_units``)."""
    group_stats: str = field(default="all", metadata={"choices": DCPO_GROUP_STATS})
    """DCPO eq. 4's group: ``all`` N_traj samples of the prompt (the paper) or ``sampled``, only those
    with a drawn segment (the authors' code)."""


@dataclass(frozen=True)
class MoTConfig:
    """Mem-T's MoT-GRPO (credit ``mot``, :mod:`memkit.rl.mot`; eq. 9-13): node rewards, advantages, trees."""

    alpha: float = 0.5
    """MoT-GRPO (credit ``mot``): eq. 10's weight of the evidence share Evid(v) in a node's reward."""
    combine: str = field(default="sum", metadata={"choices": MOT_COMBINES})
    """MoT-GRPO's advantage: ``sum`` = A_intra + A_inter (Mem-T eq. 13) or ``sequential`` = Tree-GRPO's
    normalisation over the query's trees, then again within each tree (``memkit.rl.mot``)."""
    intra: bool = True
    """Keep A_intra (eq. 11); False is the paper's "w/o A_intra" ablation."""
    inter: bool = True
    """Keep A_inter (eq. 12); False is the paper's "w/o A_inter" ablation."""
    rounds: int = 1
    """MoT-GRPO's trees (``memkit.rl.plans.TreePlan``): M expansion rounds after each tree's seed chain
    (eq. 9); the trees per question are ``n_samples`` (G)."""
    pivots: int = 2
    """N_v pivot nodes per tree and round (Mem-T §4.1: 3; the lab: 2)."""
    eps: float = 1e-6
    """Added to a group's std before dividing (eq. 11-12)."""


__all__ = ["MemPOConfig", "DCPOConfig", "MoTConfig", "DCPO_GROUP_STATS"]
