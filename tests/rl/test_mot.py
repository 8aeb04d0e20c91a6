"""MoT-GRPO (Mem-T §3.2-3.3) on real memory operation trees grown by the teacher's policy.

Trees come from :func:`memkit.rollout.trees.grow_trees` on a built conversation, with a noisy
teacher (wasted searches, wrong answers, bridge questions cut short) so branches differ.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from memkit.agents.base import OracleConfig
from memkit.agents.memt import MemT
from memkit.rl.config import TrainConfig
from memkit.rl.credit import CreditBatch, get_credit
from memkit.rl.mot import (
    MoTConfig,
    construction_ops,
    hindsight_filter,
    hindsight_scores,
    mot_units,
    node_rewards,
    node_rewards_loop,
    score_query,
    tree_advantages,
    tree_advantages_loop,
    tree_nodes,
)
from memkit.rl.packed_forward import packing_gap
from memkit.rl.packing import pack
from memkit.rollout.engine import OraclePolicy, RolloutConfig, to_trajectory
from memkit.rollout.streams import build_memories
from memkit.rollout.trees import TreeConfig, grow_trees
from memkit.world.streams import make_conversation
from tests.fixtures.traces import kit

NOISY = OracleConfig(p_wasted_search=0.5, p_wrong_answer=0.3, flaw="stop_early", flaw_rate=0.5, p_drop_fact=0.2)
CFG = RolloutConfig(max_context_tokens=10**9)


@lru_cache(maxsize=None)
def forest(seed: int = 0, trees: int = 3, rounds: int = 2, pivots: int = 2):
    """(built state, conversation, store sources, [(qa, QueryTrees)]) for every question of one stream."""
    method, tok = MemT(), kit().tokenizer
    conv = make_conversation(kit().world, seed, "smoke")
    policy = OraclePolicy(method, tok, NOISY, seed=seed)
    (built,) = build_memories(method, [conv], policy, tok, CFG)
    sources = built.memory["store"].sources_of()
    grown = [
        (qa, grow_trees(method, built, qi, policy, tok, TreeConfig(trees, rounds, pivots, seed), CFG))
        for qi, qa in enumerate(conv.qa)
    ]
    return built, conv, sources, grown


def test_trees_have_the_shape_of_eq_8_9():
    built, conv, _, grown = forest()
    n_build = len(built.calls)
    for qa, qt in grown:
        assert len(qt.trees) == 3 and all(1 <= len(ch) <= 1 + 2 * 2 for ch in qt.chains)  # seed + N_v per round
        for tree, chains in zip(qt.trees, qt.chains):
            nodes, children = tree_nodes(tree)
            assert all(tree.calls[i].parent is not None for i in nodes)
            roots = [i for i in nodes if tree.calls[i].role == "act" and tree.calls[tree.calls[i].parent].role != "act"]
            assert roots and len(tree.info["leaf_outcomes"]) == len(chains)
            assert all(c.role != "act" for c in tree.calls[:n_build])  # the shared construction comes first
    branching = [len(k) for _, qt in grown for t in qt.trees for k in tree_nodes(t)[1].values()]
    assert max(branching) >= 2  # some node was a pivot


def test_node_rewards_equal_their_loop_reference_and_back_up_the_mean():
    _, _, sources, grown = forest()
    for qa, qt in grown:
        for tree in qt.trees:
            fast, slow = (
                node_rewards(tree, qa.evidence, sources, 0.5),
                node_rewards_loop(tree, qa.evidence, sources, 0.5),
            )
            assert fast.keys() == slow.keys()
            for i in fast:
                assert fast[i] == pytest.approx(slow[i], abs=1e-12)
            nodes, children = tree_nodes(tree)
            for i in nodes:  # Perform(v) = mean over children; a leaf's is its F1
                r, perform, evid = fast[i]
                if children[i]:
                    assert perform == pytest.approx(sum(fast[k][1] for k in children[i]) / len(children[i]))
                assert 0.0 <= evid <= 1.0
                assert r == pytest.approx((0.5 * evid + perform) if tree.calls[i].valid else 0.0)


@pytest.mark.parametrize(
    "cfg",
    [MoTConfig(), MoTConfig(combine="sequential"), MoTConfig(intra=False), MoTConfig(inter=False)],
    ids=["sum", "sequential", "no-intra", "no-inter"],
)
def test_tree_advantages_equal_their_loop_reference(cfg):
    _, _, sources, grown = forest()
    for qa, qt in grown:
        flat, trees = [], []
        for t, tree in enumerate(qt.trees):
            for i, (r, _, _) in node_rewards(tree, qa.evidence, sources).items():
                flat.append(r)
                trees.append(t)
        fast = tree_advantages(torch.tensor(flat), trees, [0] * len(flat), cfg)
        assert fast.tolist() == pytest.approx(tree_advantages_loop(flat, trees, [0] * len(flat), cfg), abs=1e-5)


def test_eq_13_adds_the_two_scales():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 1.0])
    trees, q = [0, 0, 0, 1, 1], [0] * 5
    both = tree_advantages(r, trees, q)
    intra = tree_advantages(r, trees, q, MoTConfig(inter=False))
    inter = tree_advantages(r, trees, q, MoTConfig(intra=False))
    assert torch.allclose(both, intra + inter)
    assert inter.tolist() == pytest.approx(((r - r.mean()) / (r.std() + 1e-6)).tolist())


def _scored_forest():
    built, conv, sources, grown = forest()
    trees, groups = [], []
    for qa, qt in grown:
        score_query(qt.trees, qa.evidence, sources)
        trees += qt.trees
        groups += [qt.task_id] * len(qt.trees)
    return built, conv, sources, grown, trees, groups


@pytest.mark.parametrize("mode", ["mem1_exact", "separate", "mem1_mask"])
def test_mot_credit_rule_equals_its_loop_reference_on_packed_trees(mode):
    _, _, _, _, trees, groups = _scored_forest()
    units = mot_units(trees, None, 0)
    cb = CreditBatch(
        batch=pack(units, mode),
        units=units,
        unit_traj=torch.arange(len(trees)),
        rewards=torch.zeros(len(trees)),
        group_ids=groups,
        trajectories=trees,
    )
    rule = get_credit("mot")
    cfg = TrainConfig(method="memt", credit="mot")
    adv, _ = rule.fn(cb, cfg)
    assert torch.allclose(adv, torch.tensor(rule.loop(cb, cfg), dtype=adv.dtype), atol=1e-5)
    assert float(adv.abs().sum()) > 0  # the trees disagree somewhere
    for row in range(adv.shape[0]):  # every node's tokens carry its Call.advantage from score_query
        tree = trees[int(cb.batch.unit_index[row])]
        for c in set(cb.batch.call_ids[row].tolist()) - {-1}:
            sel = (cb.batch.call_ids[row] == c) & (cb.batch.loss_mask[row] > 0)
            assert torch.allclose(adv[row][sel], torch.tensor(tree.calls[c].advantage), atol=1e-5)


def test_packed_tree_logprobs_equal_per_node_recompute():
    """One exact prefix-trie row per tree (shared ancestors once) against one forward per node."""
    from memkit.lab.policies import fresh_tiny

    model = fresh_tiny(kit(), seed=3).model.eval()
    _, _, _, grown = forest()
    trees = [t for _, qt in grown[:3] for t in qt.trees]
    units = mot_units(trees, None, 0)
    gap = packing_gap(model, units, "mem1_exact")
    assert gap["max_abs"] <= 1e-4
    per_node = sum(len(c.context_ids) + len(c.output_ids) for u in units for c in (u.traj.calls[i] for i in u.calls))
    assert gap["n_tokens"] < per_node  # ancestors are computed once, not once per node


def test_hindsight_scores_and_filter_on_a_hand_checkable_case():
    built, conv, sources, grown = forest()
    ops = construction_ops(to_trajectory(MemT(), built, 0))
    assert ops and all(set(op) >= {"call", "op", "memory", "sources", "valid"} for op in ops)
    qa, qt = grown[0]
    for tree in qt.trees:  # every leaf advantage 1: S(a) = gate + lambda * (share of leaves that retrieved m)
        for o in tree.info["leaf_outcomes"]:
            tree.calls[o["call"]].advantage = 1.0
    scores = hindsight_scores(ops, [(qa.evidence, qt.trees)], lam=0.1)
    from memkit.rl.mot import retrieved_ids

    leaves = [(t, o["call"]) for t in qt.trees for o in t.info["leaf_outcomes"]]
    for op, s in zip(ops, scores):
        gate = float(bool(set(qa.evidence) & set(op["sources"])))
        hit = 0
        for t, leaf in leaves:
            j, seen = leaf, set()
            while j is not None and t.calls[j].role == "act":
                seen |= set(retrieved_ids(t.calls[j].observation_text))
                j = t.calls[j].parent
            hit += op["memory"] in seen
        assert s == pytest.approx(gate + 0.1 * hit / len(leaves))
    # the filter: top 50% per op type by score, invalid ops never kept
    fake = [
        {"op": "add_item", "valid": True},
        {"op": "add_item", "valid": True},
        {"op": "add_item", "valid": False},
        {"op": "add_item", "valid": True},
        {"op": "ignore_item", "valid": True},
        {"op": "ignore_item", "valid": True},
    ]
    assert hindsight_filter(fake, [0.1, 0.9, 5.0, 0.5, -1.0, 2.0]) == [1, 3, 5] or hindsight_filter(
        fake, [0.1, 0.9, 5.0, 0.5, -1.0, 2.0]
    ) == [1, 5]
    assert hindsight_filter(fake, [0.1, 0.9, 5.0, 0.5, -1.0, 2.0], keep=1.0) == [0, 1, 3, 4, 5]


def test_tree_viewer_shows_a_clicked_node_with_both_advantages():
    from memkit.viz import TreeViewer

    _, _, _, grown, trees, _ = _scored_forest()
    qa, qt = next((qa, qt) for qa, qt in grown if max(len(tree_nodes(t)[0]) for t in qt.trees) > 2)
    view = TreeViewer(qt.trees)
    k = max(range(len(qt.trees)), key=lambda j: len(tree_nodes(qt.trees[j])[0]))
    view.selector.value = k  # the dropdown switches trees
    nodes = tree_nodes(qt.trees[k])[0]
    assert [b.description for b in view.buttons] == [f"node {i}" for i in nodes]
    view.buttons[2].click()  # what a click in the browser runs
    i = nodes[2]
    assert view.node == i and view.buttons[2].button_style == "info"
    assert f"node {i} &middot; R(v) = {qt.trees[k].calls[i].reward:+.3f}" in view.detail.value
    intra, inter = view._intra[(k, i)], view._inter[(k, i)]
    assert intra + inter == pytest.approx(qt.trees[k].calls[i].advantage, abs=1e-5)  # eq. 13, as score_query wrote
    assert f"A_intra = {intra:+.3f}" in view.detail.value and f"A_inter = {inter:+.3f}" in view.detail.value
    assert view.drawing.value.count("<circle") == len(nodes) and 'stroke-width="3"' in view.drawing.value
    assert html_escaped(qt.trees[k].calls[i].output_text) in view.detail.value


def html_escaped(text: str) -> str:
    import html

    return html.escape(text)[:40]


def test_a_learner_update_on_scored_trees_moves_the_policy():
    """The `mot` rule through the real update: MemT's defaults (credit mot, one exact trie row per
    tree), trees of the teacher, the tiny model; A_total = 0 everywhere would leave only the KL."""
    from memkit.lab.policies import fresh_tiny
    from memkit.rl.config import TrainConfig
    from memkit.rl.update import Learner

    _, _, _, _, trees, _ = _scored_forest()
    model = fresh_tiny(kit(), seed=1).model
    cfg = TrainConfig.from_flags(
        method="memt", lr=1e-3, warmup_steps=0, kl_coef=0.0, mini_batches=1, micro_batch_size=3, seed=0
    ).validate()
    assert (cfg.resolved_credit(), cfg.resolved_packing()) == ("mot", "mem1_exact")
    learner = Learner(cfg, model, kit().tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    stats = learner.update(trees[:3])
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(model.parameters(), before))
    assert moved > 0 and stats["trained_tokens"] > 0
    assert all(t.reward is not None for t in trees)


def test_a_forest_of_queries_grows_the_trees_each_query_grows_alone():
    from memkit.rollout.trees import grow_forest

    method, tok = MemT(), kit().tokenizer
    built, conv, _, _ = forest()
    steady = OraclePolicy(method, tok, OracleConfig(), seed=0)  # no noise: a batch does not change the text
    alone = [grow_trees(method, built, qi, steady, tok, TreeConfig(3, 2, 2, 0), CFG) for qi in (0, 3)]
    together = grow_forest(method, [(built, 0), (built, 3)], steady, tok, TreeConfig(3, 2, 2, 0), CFG)
    for a, b in zip(alone, together):
        assert a.task_id == b.task_id
        assert [[(c.output_text, c.parent) for c in t.calls] for t in a.trees] == [
            [(c.output_text, c.parent) for c in t.calls] for t in b.trees
        ]
        assert [len(c) for c in a.chains] == [len(c) for c in b.chains]
