"""Tree trajectories: chains forked from a common prefix merged into one tree (:func:`merge_tree`),
and Mem-T's memory operation trees (§3.2, eq. 8-9), iterative branching rollouts for one query.

For a query, ``G`` trees; each starts as one full seed chain from the root state (the built
memory with the question, no retrieval yet) (eq. 8). Then ``M`` expansion rounds: in each tree,
``N_v`` pivot nodes are drawn uniformly from the root and the tree's non-terminal nodes, and the
policy rolls a new branch from each pivot's state; ``Path(v*) + branch`` is grafted on (eq. 9).

Every chain is an ordinary trajectory whose calls are shared by identity with the chains it
branched from (:func:`~memkit.rollout.engine.fork`), so :func:`merge_tree` makes one tree
trajectory per tree: its retrieval calls are the nodes, ``Call.parent`` the edges.
A node's state is kept (a fork) after every call that did not end its chain, so any node can be a
pivot. As in Tree-GRPO, pivots are drawn without replacement within a round and a node may be
drawn again in a later round.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from memkit.core.trajectory import Call, LeafOutcome, Trajectory
from memkit.rollout.engine import Policy, RolloutConfig, advance, fork, to_trajectory


def merge_tree(trajs: list[Trajectory]) -> Trajectory:
    """One tree trajectory from chains that :func:`fork` split from a common prefix.

    Calls shared by several chains (the same Call objects, as :func:`fork` leaves them) appear once; ``parent`` and the call
    indices in ``context_refs`` are renumbered into the merged list, where every call comes after
    its ancestors. Outcome fields (answer, reward, validity, info) stay on the chains: a tree has
    one per leaf, so the merged trajectory keeps ``info["leaf_outcomes"]`` (per chain, in order,
    with the index of its last call) and leaves the scalar fields empty.
    """
    if not trajs:
        raise ValueError("merge_tree needs at least one trajectory")
    if len({t.task_id for t in trajs}) != 1:
        raise ValueError("merge_tree: chains of one tree must share a task")
    shared = {id(c) for c in trajs[0].calls}
    if len(trajs) > 1 and any(not shared & {id(c) for c in t.calls} for t in trajs[1:]):
        raise ValueError(
            "merge_tree: some chains share no call with the first; chains of one tree come from fork() "
            "in this process (calls are matched by identity, so copies or reloaded traces do not merge)"
        )
    index: dict[int, int] = {}
    calls: list[Call] = []
    leaves = []
    for t in trajs:
        local = []  # index in this chain -> index in the merged list
        for c in t.calls:
            if id(c) not in index:
                index[id(c)] = len(calls)
                calls.append(
                    dataclasses.replace(
                        c,
                        parent=None if c.parent is None else local[c.parent],
                        context_refs=[(s, e, local[j], kind) for s, e, j, kind in c.context_refs],
                    )
                )
            local.append(index[id(c)])
        leaves.append(
            dataclasses.asdict(
                LeafOutcome(local[-1] if local else None, t.answer, t.reward, t.valid, t.reason, t.group_index)
            )
        )
    first = trajs[0]
    return Trajectory(
        task_id=first.task_id,
        method=first.method,
        calls=calls,
        group_index=first.group_index,
        golds=first.golds,
        reward=None,
        valid=all(t.valid for t in trajs),
        info={"leaf_outcomes": leaves},
    )


@dataclass(frozen=True)
class TreeConfig:
    """Mem-T §4.1: G = 3 trees per query, N_v = 3 pivots per round, depth <= 4 expansions."""

    trees: int = 3  # G
    rounds: int = 1  # M expansion rounds
    pivots: int = 3  # N_v per tree and round
    seed: int = 0


@dataclass
class QueryTrees:
    """The trees of one query: ``trees[i]`` the merged tree trajectory of tree i, ``chains[i]`` its
    chains (root-to-leaf trajectories, seed first)."""

    task_id: str
    trees: list
    chains: list


def _step_all(method, states, policy, tokenizer, cfg, wrap, snapshots: dict) -> None:
    """Advance every unfinished state one call at a time to its end, keeping a fork of the state
    after each call that did not end the chain (``snapshots[id(call)]``)."""
    while True:
        active = [s for s in states if not s.done]
        if not active:
            return
        target = {id(s): len(s.calls) + 1 for s in active}
        advance(method, active, None, policy, tokenizer, cfg, wrap, until=lambda s: len(s.calls) >= target[id(s)])
        for s in active:
            if not s.done and s.calls:
                snapshots[id(s.calls[-1])] = fork(s, 1)[0]


def grow_trees(
    method,
    built,
    question: int,
    policy: Policy,
    tokenizer,
    tree_cfg: TreeConfig | None = None,
    cfg: RolloutConfig | None = None,
    wrap=None,
) -> QueryTrees:
    """The ``G`` trees of question ``question`` of a built Mem-T state (eq. 8-9)."""
    return grow_forest(method, [(built, question)], policy, tokenizer, tree_cfg, cfg, wrap)[0]


def grow_forest(
    method,
    jobs,
    policy: Policy,
    tokenizer,
    tree_cfg: TreeConfig | None = None,
    cfg: RolloutConfig | None = None,
    wrap=None,
) -> list[QueryTrees]:
    """:func:`grow_trees` for every ``(built state, question)`` of ``jobs`` at once: each round's
    calls of all queries go to the policy as one batch. Pivots are drawn per query as there."""
    tree_cfg, cfg = tree_cfg or TreeConfig(), cfg or RolloutConfig()
    if tree_cfg.trees < 1 or tree_cfg.rounds < 0 or tree_cfg.pivots < 1:
        raise ValueError(f"TreeConfig needs trees >= 1, rounds >= 0, pivots >= 1 (got {tree_cfg})")
    rngs = [random.Random(f"trees-{tree_cfg.seed}-{question}") for _, question in jobs]
    roots, root_snaps, chains = [], [], []  # per job: its trees' roots, root forks, chains (seed first)
    for built, question in jobs:
        r = fork(built, tree_cfg.trees)
        for s in r:
            method.start_question(s, question)
        roots.append(r)
        root_snaps.append([fork(s, 1)[0] for s in r])
        chains.append([[s] for s in r])
    snapshots: dict = {}
    _step_all(method, [s for r in roots for s in r], policy, tokenizer, cfg, wrap, snapshots)
    for _ in range(tree_cfg.rounds):
        branches = []  # (job, tree, child)
        for j, (built, _) in enumerate(jobs):
            n_build = len(built.calls)
            for i, tree in enumerate(chains[j]):
                nodes = list(dict.fromkeys(id(c) for s in tree for c in s.calls[n_build:] if id(c) in snapshots))
                pool = [None, *nodes]  # None = the root
                for pivot in rngs[j].sample(pool, min(tree_cfg.pivots, len(pool))):
                    (child,) = fork(root_snaps[j][i] if pivot is None else snapshots[pivot], 1)
                    branches.append((j, i, child))
        _step_all(method, [c for _, _, c in branches], policy, tokenizer, cfg, wrap, snapshots)
        for j, i, child in branches:
            chains[j][i].append(child)
    out = []
    for job_chains in chains:
        trajs = [[to_trajectory(method, s, g) for g, s in enumerate(tree)] for tree in job_chains]
        out.append(QueryTrees(task_id=trajs[0][0].task_id, trees=[merge_tree(t) for t in trajs], chains=trajs))
    return out
