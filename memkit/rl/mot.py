"""MoT-GRPO (Mem-T §3.2-3.3): node rewards backed up a tree, two-scale advantages, hindsight credit.

On a merged tree trajectory (:mod:`memkit.rollout.trees`) the nodes are the retrieval calls.

    R(v)        = 1_fmt(v) * (alpha * Evid(v) + Perform(v))                         (eq. 10)
    Perform(v)  = F1(v) at a leaf, the mean of Perform over v's children inside
    A_intra(v)  = (R(v) - mean_tree R) / (std_tree R + eps)                          (eq. 11)
    A_inter(v)  = (R(v) - mean_query R) / (std_query R + eps), over all G trees       (eq. 12)
    A_total(v)  = A_intra(v) + A_inter(v)                                            (eq. 13)

``combine="sequential"`` is Tree-GRPO's rule instead (normalise over the query's trees, then that
again within each tree); ``intra`` / ``inter`` switch a term off (the paper's ablations). std is
the unbiased sample std and a one-node group gets mean 0, std 1, as in
:func:`memkit.rl.advantages.grpo_advantages`. Evid(v) is the share of the question's evidence
turns behind the memories retrieved on the path from the root to v (inclusive).

Hindsight credit for construction (eq. 16-17): an operation a_mem that made memory m from source
turns X_src scores

    S(a_mem) = 1/|leaves| sum_leaves A_total(v_L) * (1[X_src & X_evi != {}] + lambda 1[m in M_{v_L}])

per query, summed over the queries of its conversation; :func:`hindsight_filter` keeps the top 50%
per operation type among valid calls (eq. 18's D*_mem).
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch

from memkit.core.trajectory import TrainingUnit, Trajectory
from memkit.rl.advantages import grpo_advantages_loop
from memkit.rl.choices import MOT_COMBINES as COMBINES  # noqa: F401  A_intra + A_inter, or sequential
from memkit.rl.credit.registry import call_values_to_tokens, register_credit, scored_calls
from memkit.rl.rules import MoTConfig  # noqa: F401  re-exported: the notebooks and the viewers import it from here

_RETRIEVED = re.compile(r"^\[([A-Za-z]+\d+)\] ", re.M)


def retrieved_ids(observation: str | None) -> list[str]:
    """Memory ids a retrieval observation showed (``[f3] ...`` lines written by the store)."""
    return _RETRIEVED.findall((observation or "").replace("<information>", "\n"))


def tree_nodes(tree: Trajectory) -> tuple[list[int], dict[int, list[int]]]:
    """``(nodes, children)``: the retrieval calls of ``tree`` in order, and each node's node children."""
    nodes = [i for i, c in enumerate(tree.calls) if c.role == "act"]
    is_node = set(nodes)
    children: dict[int, list[int]] = {i: [] for i in nodes}
    for i in nodes:
        p = tree.calls[i].parent
        if p in is_node:
            children[p].append(i)
    return nodes, children


def _leaf_f1(tree: Trajectory) -> dict[int, float]:
    return {o.call: o.score for o in tree.leaf_outcomes()}


def _evidence(tree: Trajectory, nodes: list[int], store_sources: dict, evidence: list[str]) -> dict[int, float]:
    """Evid(v): share of ``evidence`` covered by the memories retrieved from the root to v."""
    covered: dict[int, set] = {}
    for i in nodes:  # parents come first (merge_tree's order)
        p = tree.calls[i].parent
        seen = set(covered.get(p, set()))
        for mid in retrieved_ids(tree.calls[i].observation_text):
            seen.update(store_sources.get(mid, ()))
        covered[i] = seen
    return {i: (sum(e in covered[i] for e in evidence) / len(evidence) if evidence else 0.0) for i in nodes}


def node_rewards(tree: Trajectory, evidence: list[str], store_sources: dict, alpha: float = 0.5):
    """Eq. 10 for every node: ``{call index: (R, Perform, Evid)}``. Perform is backed up from the
    leaves (children after parents in ``tree.calls``, so one reverse pass)."""
    nodes, children = tree_nodes(tree)
    f1 = _leaf_f1(tree)
    perform: dict[int, float] = {}
    for i in reversed(nodes):
        kids = children[i]
        perform[i] = sum(perform[k] for k in kids) / len(kids) if kids else f1.get(i, 0.0)
    evid = _evidence(tree, nodes, store_sources, evidence)
    return {i: (float(tree.calls[i].valid) * (alpha * evid[i] + perform[i]), perform[i], evid[i]) for i in nodes}


def node_rewards_loop(tree: Trajectory, evidence: list[str], store_sources: dict, alpha: float = 0.5):
    """Loop reference for :func:`node_rewards`: Perform by recursion over explicit children,
    Evid by walking each node's path to the root."""
    calls = tree.calls
    leaves = {o.call: o.score for o in tree.leaf_outcomes()}

    def kids(i):
        return [j for j, c in enumerate(calls) if c.role == "act" and c.parent == i]

    def perform(i):
        ks = kids(i)
        return sum(perform(k) for k in ks) / len(ks) if ks else float(leaves.get(i, 0.0))

    out = {}
    for i, c in enumerate(calls):
        if c.role != "act":
            continue
        seen, j = set(), i
        while j is not None and calls[j].role == "act":
            for mid in retrieved_ids(calls[j].observation_text):
                seen |= set(store_sources.get(mid, ()))
            j = calls[j].parent
        ev = len([e for e in evidence if e in seen]) / len(evidence) if evidence else 0.0
        p = perform(i)
        out[i] = ((alpha * ev + p) if c.valid else 0.0, p, ev)
    return out


def tree_advantages(rewards: torch.Tensor, tree_ids, query_ids, cfg: MoTConfig = MoTConfig()) -> torch.Tensor:
    """Eq. 11-13 (or Tree-GRPO's sequential rule) for a flat batch of nodes.

    shape: rewards ``[V]`` node rewards; tree_ids, query_ids ``[V]`` hashables -> ``[V]`` A_total.
    """
    if cfg.combine not in COMBINES:
        raise ValueError(f"unknown combine {cfg.combine!r}; choose one of {COMBINES}")
    # float64: the sequential rule normalises twice, and a tree of equal float32 values would leave
    # (x - mean) at float32 rounding, which / eps turns into advantages of ~0.05 for equal rewards
    r = rewards.to(torch.float64)
    if cfg.combine == "sequential":
        return _normalise(_normalise(r, query_ids, cfg.eps), tree_ids, cfg.eps).float()
    out = torch.zeros_like(r)
    if cfg.intra:
        out = out + _normalise(r, tree_ids, cfg.eps)
    if cfg.inter:
        out = out + _normalise(r, query_ids, cfg.eps)
    return out.float()


def _normalise(r: torch.Tensor, ids, eps: float) -> torch.Tensor:
    """:func:`memkit.rl.advantages.grpo_advantages` in the dtype of ``r`` (unbiased std; a group of
    one: mean 0, std 1). shape: ``[V]`` -> ``[V]``."""
    codes = {}
    g = torch.tensor([codes.setdefault(i, len(codes)) for i in ids], dtype=torch.long)
    n = torch.zeros(len(codes), dtype=r.dtype).index_add_(0, g, torch.ones_like(r))
    mean = torch.zeros(len(codes), dtype=r.dtype).index_add_(0, g, r) / n
    std = torch.sqrt(torch.zeros(len(codes), dtype=r.dtype).index_add_(0, g, (r - mean[g]) ** 2) / (n - 1).clamp(min=1))
    mean, std = torch.where(n == 1, torch.zeros_like(mean), mean), torch.where(n == 1, torch.ones_like(std), std)
    return (r - mean[g]) / (std[g] + eps)


def tree_advantages_loop(rewards, tree_ids, query_ids, cfg: MoTConfig = MoTConfig()) -> list[float]:
    """Loop reference for :func:`tree_advantages` (python floats, dict groups)."""
    r = [float(x) for x in rewards]
    if cfg.combine == "sequential":
        return grpo_advantages_loop(grpo_advantages_loop(r, list(query_ids), cfg.eps), list(tree_ids), cfg.eps)
    intra = grpo_advantages_loop(r, list(tree_ids), cfg.eps) if cfg.intra else [0.0] * len(r)
    inter = grpo_advantages_loop(r, list(query_ids), cfg.eps) if cfg.inter else [0.0] * len(r)
    return [a + b for a, b in zip(intra, inter)]


def score_query(trees: list[Trajectory], evidence: list[str], store_sources: dict, cfg: MoTConfig = MoTConfig()):
    """Node rewards and advantages of one query's trees, written into ``Call.reward`` /
    ``Call.advantage`` of each tree's nodes; returns ``{tree index: {call: (R, A_total)}}``."""
    flat, where = [], []
    for t, tree in enumerate(trees):
        for i, (r, _, _) in node_rewards(tree, evidence, store_sources, cfg.alpha).items():
            flat.append(r)
            where.append((t, i))
    adv = tree_advantages(torch.tensor(flat), [t for t, _ in where], [0] * len(where), cfg)
    out: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for (t, i), r, a in zip(where, flat, adv.tolist()):
        trees[t].calls[i].reward, trees[t].calls[i].advantage = r, a
        out[t][i] = (r, a)
    for tree in trees:  # the tree's outcome for logs and the update: the mean of its leaves' F1
        leaves = [o.score for o in tree.leaf_outcomes()]
        tree.reward = sum(leaves) / len(leaves) if leaves else 0.0
    return dict(out)


# ---- hindsight credit for construction (eq. 16-18) ------------------------------------------
def construction_ops(traj: Trajectory) -> list[dict]:
    """The memory operations of a Mem-T trajectory's construction calls
    (``info["memory_ops"]``), each with ``valid`` = its call's validity (eq. 18 drops invalid ones)."""
    from memkit.agents.memt import INFO_MEMORY_OPS

    return [{**op, "valid": traj.calls[op["call"]].valid} for op in traj.info.get(INFO_MEMORY_OPS, [])]


def hindsight_scores(
    ops: list[dict], queries: list[tuple[list[str], list[Trajectory]]], lam: float = 0.1
) -> list[float]:
    """Eq. 16-17 per op, summed over ``queries`` = ``[(evidence ids, scored trees)]`` (trees after
    :func:`score_query`, whose leaves carry ``Call.advantage``)."""
    scores = [0.0] * len(ops)
    for evidence, trees in queries:
        leaves = [(tree, o.call) for tree in trees for o in tree.leaf_outcomes() if o.call is not None]
        if not leaves:
            continue
        used = []
        for tree, leaf in leaves:
            seen, j = set(), leaf
            while j is not None and tree.calls[j].role == "act":
                seen.update(retrieved_ids(tree.calls[j].observation_text))
                j = tree.calls[j].parent
            used.append(seen)
        ev = set(evidence)
        for k, op in enumerate(ops):
            gate = float(bool(ev & set(op["sources"])))
            scores[k] += sum(
                (tree.calls[leaf].advantage or 0.0) * (gate + lam * float(op["memory"] in seen))
                for (tree, leaf), seen in zip(leaves, used)
            ) / len(leaves)
    return scores


def hindsight_filter(ops: list[dict], scores: list[float], keep: float = 0.5) -> list[int]:
    """Eq. 18's D*_mem: indices of the valid ops in the top ``keep`` share of their op type by score
    (ties keep the earlier op; at least one per type that has a valid op)."""
    by_type: dict[str, list[int]] = defaultdict(list)
    for k, op in enumerate(ops):
        if op["valid"]:
            by_type[op["op"]].append(k)
    kept = []
    for idx in by_type.values():
        ranked = sorted(idx, key=lambda k: (-scores[k], k))
        kept += ranked[: max(1, round(keep * len(ranked)))]
    return sorted(kept)


# ---- the `mot` credit rule (the registry of memkit.rl.credit) ---------------------------------
def _node_table(cb, cfg, loop: bool = False) -> dict[tuple[int, int], float]:
    """A_total of every node of the update's tree trajectories: ``{(trajectory, call): A}``. Trees
    are the trajectories, queries their ``group_ids``; node rewards are read from ``Call.reward``."""
    where, r = scored_calls(
        cb,
        lambda call: call.role == "act",
        "a tree node needs its node reward: score the trees with memkit.rl.mot.score_query before the update",
    )
    mot_cfg = cfg.mot
    trees, queries = [i for i, _ in where], [cb.group_ids[i] for i, _ in where]
    a = (
        tree_advantages_loop(r, trees, queries, mot_cfg)
        if loop
        else tree_advantages(torch.tensor(r), trees, queries, mot_cfg).tolist()
    )
    return dict(zip(where, a))


def mot_loop(cb, cfg) -> list[list[float]]:
    """Loop reference for :func:`mot`: python group statistics, each token looked up by its call."""
    a = _node_table(cb, cfg, loop=True)
    b = cb.batch
    B, L = b.loss_mask.shape
    return [
        [a[(int(cb.row_traj[row]), int(b.call_ids[row, t]))] if b.loss_mask[row, t] > 0 else 0.0 for t in range(L)]
        for row in range(B)
    ]


def mot_units(trajs, cfg, seed: int):
    """One unit per tree: its nodes (the retrieval calls that generated tokens). Packed ``mem1_exact``
    the tree is one prefix-trie row, each shared ancestor computed once."""
    return [TrainingUnit(t, tuple(i for i, c in enumerate(t.calls) if c.role == "act" and c.output_ids)) for t in trajs]


@register_credit("mot", mot_loop, units=mot_units, paper="Mem-T eq. 10-15 (MoT-GRPO)")
def mot(cb, cfg):
    """MoT-GRPO: every token of node v gets A_total(v) = A_intra(v) + A_inter(v) (eq. 11-13).

    Trees are the update's trajectories, a query's trees share a group id; node rewards R(v)
    (eq. 10) come from ``Call.reward`` (:func:`score_query`). shape: node rewards -> ``[B, L]``
    advantages (0 off ``loss_mask``).
    """
    return call_values_to_tokens(cb, _node_table(cb, cfg)), None
