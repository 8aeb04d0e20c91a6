"""Credit registry, training units and forked (tree) rollouts, on real rollouts.

Trajectories come from the rollout engine (the scripted oracle through the real context builder
and tokenizer: ``tests/fixtures/traces.py``); only their rewards are re-drawn, so groups have
spread. Every registered rule is checked against its loop reference on every packing.
"""

from __future__ import annotations

import random

import pytest
import torch

from memkit.core.trajectory import TrainingUnit, Trajectory
from memkit.rl.advantages import masked_moments, masked_whiten, moments_to_mean_var
from memkit.rl.config import TrainConfig
from memkit.rl.credit import CREDIT_RULES, CreditBatch, get_credit, register_credit
from memkit.rl.packing import MODES, pack
from memkit.rl.row_pieces import row_pieces
from tests.fixtures.traces import kit, oracle_tasks, oracle_traces

#: a real trainer config (the rules read its fields; no stand-in with defaults of its own)
KNOBS = TrainConfig.from_flags(gamma=0.9, lam=0.8)


def _trajs(method: str, seed: int) -> list[Trajectory]:
    """Real trajectories, 3 tasks x 2 copies (a group of 2 per task), with seeded rewards."""
    base = list(oracle_traces(method, 2, 3, 11))
    rng = random.Random(seed)
    out = []
    for copy_ in range(2):
        for t in base:
            t = Trajectory.from_dict(t.to_dict())
            t.reward = rng.choice([0.0, 0.1, 0.5, 1.0, -0.1])
            t.group_index = copy_
            out.append(t)
    return out


def _credit_batch(trajs, mode, units=None, seed=0, with_values=False) -> CreditBatch:
    units = units if units is not None else [TrainingUnit.of(t) for t in trajs]
    index = {id(t): i for i, t in enumerate(trajs)}
    unit_traj = [index[id(u.traj)] for u in units]
    batch = pack(units, mode)
    values = None
    if with_values:
        g = torch.Generator().manual_seed(seed)
        values = torch.randn(batch.input_ids.shape, generator=g) * batch.loss_mask
    return CreditBatch(
        batch=batch,
        units=units,
        unit_traj=torch.tensor(unit_traj),
        rewards=torch.tensor([t.reward for t in trajs]),
        group_ids=[t.task_id for t in trajs],
        values=values,
        trajectories=trajs,
    )


@pytest.mark.parametrize("method", ["mem1", "memsearcher"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CREDIT_RULES))
def test_every_rule_matches_its_loop_reference_on_real_rollouts(name, mode, method):
    rule = get_credit(name)
    if mode != "separate" and method != "mem1":
        pytest.skip("2D packings are MEM1's")
    if name == "mot":
        pytest.skip("MoT-GRPO needs node rewards on tree trajectories: tests/rl/test_mot.py checks it on real trees")
    for seed in range(3):
        cb = _credit_batch(_trajs(method, seed), mode, seed=seed, with_values=rule.needs_values)
        adv, ret = rule.fn(cb, KNOBS)
        ref = rule.loop(cb, KNOBS)
        ref_adv, ref_ret = ref if isinstance(ref, tuple) else (ref, None)
        assert adv.shape == cb.batch.loss_mask.shape
        assert torch.allclose(adv, torch.tensor(ref_adv, dtype=adv.dtype), atol=1e-5)
        assert float((adv * (1 - cb.batch.loss_mask)).abs().max()) == 0  # credit only on trained tokens
        if ret is not None:
            assert torch.allclose(ret, torch.tensor(ref_ret, dtype=ret.dtype), atol=1e-5)
        assert float(adv.abs().max()) > 0  # the rewards differ within groups: something was assigned


@pytest.mark.parametrize("mode", MODES)
def test_multi_context_equals_grpo_when_units_are_whole_trajectories(mode):
    cb = _credit_batch(_trajs("mem1", 1), mode)
    assert torch.allclose(get_credit("grpo").fn(cb, KNOBS)[0], get_credit("multi_context").fn(cb, KNOBS)[0])


def test_multi_context_gives_each_segment_its_trajectorys_advantage():
    """Units that are call subsets (DCPO-style segments): every call of a segment carries the
    advantage of the trajectory it came from (eq. 8 applied per unit)."""
    trajs = _trajs("memsearcher", 2)
    units = []
    for t in trajs:
        idx = TrainingUnit.of(t).calls
        half = max(1, len(idx) // 2)
        units += [TrainingUnit(t, idx[:half]), TrainingUnit(t, idx[half:])] if len(idx) > 1 else [TrainingUnit(t, idx)]
    cb = _credit_batch(trajs, "separate", units)
    adv, _ = get_credit("multi_context").fn(cb, KNOBS)
    from memkit.rl.advantages import grpo_advantages

    a = grpo_advantages(cb.rewards, cb.group_ids)
    for r in range(adv.shape[0]):
        trained = cb.batch.loss_mask[r] > 0
        assert torch.allclose(adv[r][trained], a[cb.row_traj[r]].expand(int(trained.sum())))


def test_whitening_over_micro_batches_equals_whitening_the_whole_batch():
    cb = _credit_batch(_trajs("mem1", 0), "mem1_exact", with_values=True)
    adv, _ = get_credit("gae").fn(cb, KNOBS)
    m = cb.batch.loss_mask
    whole = masked_whiten(adv, m)
    halves = [(adv[:3], m[:3]), (adv[3:], m[3:])]
    totals = [sum(x) for x in zip(*(masked_moments(a, mm) for a, mm in halves))]
    parts = [masked_whiten(a, mm, mean_var=moments_to_mean_var(*totals)) for a, mm in halves]
    assert torch.allclose(torch.cat(parts), whole, atol=1e-5)


def test_registry_names_and_errors():
    assert {"grpo", "multi_context", "gae"} <= set(CREDIT_RULES)
    assert get_credit("gae").needs_values and not get_credit("grpo").needs_values
    with pytest.raises(ValueError, match="choose one of"):
        get_credit("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_credit("grpo", loop=lambda cb, cfg: None)(lambda cb, cfg: None)


def test_each_method_declares_its_packing_and_credit():
    from memkit.agents import QA_METHODS, get_method
    from memkit.rl.config import TrainConfig

    for name in QA_METHODS:
        m = get_method(name)
        assert m.default_packing in MODES and m.default_credit in CREDIT_RULES
        cfg = TrainConfig(method=name)
        assert cfg.resolved_packing() == m.default_packing
        assert cfg.resolved_credit() == m.default_credit
        assert TrainConfig(method=name, algo="ppo").resolved_credit() == "gae"
        assert TrainConfig(method=name, credit="gae").resolved_credit() == "gae"
    assert TrainConfig(method="mem1").resolved_packing() == "mem1_mask"
    assert TrainConfig(method="memsearcher").resolved_credit() == "multi_context"
    with pytest.raises(ValueError, match="credit"):
        TrainConfig(method="mem1", credit="nope").validate()
    with pytest.raises(ValueError, match="n_samples"):
        TrainConfig(method="mem1", credit="grpo", n_samples=1).validate()
    TrainConfig(method="mem1", algo="ppo", n_samples=1).validate()  # gae needs no group
    with pytest.raises(ValueError, match="critic"):
        TrainConfig(method="mem1", algo="ppo", credit="grpo").validate()
    with pytest.raises(ValueError, match="critic"):
        TrainConfig(method="mem1", algo="grpo", credit="gae").validate()


def test_rl_package_compares_no_method_names():
    """Each method declares its defaults; rl/ never branches on a method's name."""
    import pathlib
    import re

    import memkit.rl
    from memkit.agents import QA_METHODS

    pat = re.compile(r"==\s*[\"'](%s)[\"']" % "|".join(QA_METHODS))
    hits = [
        f"{p.name}:{i}"
        for p in pathlib.Path(memkit.rl.__file__).parent.glob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pat.search(line)
    ]
    assert not hits, hits


# ============================================================================ units and trees
def test_a_unit_of_a_later_call_packs_the_untrained_earlier_output_as_context():
    """A MEM1 unit that starts at call 2 reads call 1's state through a ref: under mem1_mask it is
    placed as plain context (not trained), and the unit's log-probs stay exact under mem1_exact."""
    t = next(t for t in oracle_traces("mem1", 2, 3, 11) if len(t.calls) >= 3)
    unit = TrainingUnit(t, (1, 2))
    for mode in MODES:
        b = pack([unit], mode)
        trained_calls = set(b.call_ids[b.loss_mask > 0].tolist())
        assert trained_calls == {1, 2}
        assert int(b.loss_mask.sum()) == sum(len(t.calls[i].output_ids) for i in (1, 2))
    assert [p.kind for p in row_pieces([unit], "mem1_mask")[0]][0] == "prompt"
    from memkit.models import build_tiny
    from memkit.rl.packed_forward import packing_gap

    model = build_tiny(kit().tokenizer, seed=2)
    assert packing_gap(model, [unit], "mem1_exact")["max_abs"] < 1e-4
    assert packing_gap(model, [unit], "separate")["max_abs"] < 1e-4
    with pytest.raises(ValueError, match="ascending"):
        TrainingUnit(t, (2, 1))


def _tree(method="mem1", fork_after=1, n_children=3):
    from memkit.agents import OracleConfig, get_method
    from memkit.rollout.engine import OraclePolicy, RolloutConfig, advance, continue_rollouts, fork, start_states
    from memkit.rollout.trees import merge_tree

    k = kit()
    m = get_method(method)
    task = oracle_tasks(2, 3, 11)[0]
    policy = OraclePolicy(m, k.tokenizer, OracleConfig(p_wasted_search=0.6, p_wrong_answer=0.3), seed=5)
    cfg = RolloutConfig(n=1)
    [root] = start_states(m, [task], cfg)
    advance(m, [root], k.env, policy, k.tokenizer, cfg, until_calls=fork_after)
    children = fork(root, n_children)
    chains = continue_rollouts(m, children, k.env, policy, k.tokenizer, cfg)
    return chains, merge_tree(chains)


def test_fork_continues_children_from_a_shared_prefix_and_merges_into_a_tree():
    chains, tree = _tree()
    assert tree.is_tree and not chains[0].is_tree
    assert len({tuple(c.output_text for c in ch.calls) for ch in chains}) > 1  # the children differ
    assert tree.children(None) == [0] and len(tree.children(0)) == len(chains)  # one root, forked after it
    assert len(tree.calls) == 1 + sum(len(ch.calls) - 1 for ch in chains)  # the prefix is stored once
    leaves = tree.leaves()
    assert leaves == [o["call"] for o in tree.info["leaf_outcomes"]]
    for ch, leaf in zip(chains, leaves):  # every root-to-leaf path is its chain, refs renumbered
        path = tree.path(leaf)
        assert [tree.calls[i].output_ids for i in path] == [c.output_ids for c in ch.calls]
        assert [tree.calls[i].context_ids for i in path] == [c.context_ids for c in ch.calls]
        for i in path:
            assert all(j in path[: path.index(i)] for _, _, j, _ in tree.calls[i].context_refs)
    for ch in chains:  # each chain alone is still a proper linear trajectory
        assert [c.parent for c in ch.calls] == [None] + list(range(len(ch.calls) - 1))


def test_a_tree_packs_its_shared_ancestors_once_with_exact_logprobs():
    """mem1_exact's prefix trie over a tree trajectory: the shared first call is placed once and
    every node's log-probs equal a per-call recompute (Mem-T: ancestors computed once)."""
    from memkit.models import build_tiny
    from memkit.rl.packed_forward import packing_gap

    chains, tree = _tree()
    tb = pack([tree], "mem1_exact")
    chain_tokens = sum(pack([c], "mem1_exact").n_tokens for c in chains)
    assert tb.n_tokens < chain_tokens
    assert int(tb.loss_mask.sum()) == sum(len(c.output_ids) for c in tree.calls)  # every node trained once
    model = build_tiny(kit().tokenizer, seed=0)
    assert packing_gap(model, [tree], "mem1_exact")["max_abs"] < 1e-4
    for mode in ("separate", "mem1_exact"):  # a root-to-leaf path is a unit too
        leaf = tree.leaves()[1]
        assert packing_gap(model, [TrainingUnit(tree, tuple(tree.path(leaf)))], mode)["max_abs"] < 1e-4


def test_fork_rejects_bad_arguments_and_copies_what_children_change():
    """Children of a MemAct state forked mid-rollout (after a Prune&Write) keep separate records:
    what one child's later calls add never shows in its sibling or the parent."""
    from memkit.agents import get_method
    from memkit.rollout.engine import OraclePolicy, RolloutConfig, advance, continue_rollouts, fork, start_states

    k, m = kit(), get_method("memact")
    task = oracle_tasks(4, 3, 11)[0]
    policy = OraclePolicy(m, k.tokenizer, seed=0)
    [state] = start_states(m, [task], RolloutConfig())
    advance(m, [state], k.env, policy, k.tokenizer, until_calls=3)
    before = (len(state.calls), repr(state.memory))
    a, b = fork(state, 2, seeds=[1, 2])
    assert a.sampler is not None and a.calls is not state.calls and a.memory is not state.memory
    continue_rollouts(m, [a], k.env, policy, k.tokenizer)
    assert a.done and len(a.calls) > before[0] and repr(a.memory) != before[1]
    assert (len(b.calls), repr(b.memory)) == before == (len(state.calls), repr(state.memory))
    with pytest.raises(ValueError, match="n >= 1"):
        fork(b, 0)
    with pytest.raises(ValueError, match="seeds"):
        fork(b, 2, seeds=[1])
    with pytest.raises(ValueError, match="finished"):
        fork(a, 2)


def test_update_records_each_calls_advantage():
    """After credit, every trained call carries its (mean token) advantage: A_i for group rules."""
    from memkit.rl.advantages import grpo_advantages
    from memkit.rl.credit import record_call_advantages

    trajs = _trajs("memsearcher", 0)
    cb = _credit_batch(trajs, "separate")
    adv, _ = get_credit("multi_context").fn(cb, KNOBS)
    record_call_advantages(cb, adv)
    a = grpo_advantages(cb.rewards, cb.group_ids)
    for i, t in enumerate(trajs):
        for _, c in TrainingUnit.of(t):
            assert c.advantage == pytest.approx(float(a[i]), abs=1e-6)


@pytest.mark.parametrize("method", ["react", "mem1", "memsearcher", "mempo", "memact"])
def test_exact_packings_equal_per_call_recompute_on_real_rollouts(method):
    """``separate`` and ``mem1_exact`` rows reproduce every call's log-probs on each format's real
    trajectories (contexts built by the engine, refs and all); ``mem1_mask`` is the approximate one."""
    from memkit.models import build_tiny
    from memkit.rl.packed_forward import packing_gap

    trajs = list(oracle_traces(method, 2, 3, 11))
    model = build_tiny(kit().tokenizer, seed=1)
    for mode in ("separate", "mem1_exact"):
        gap = packing_gap(model, trajs, mode)
        assert gap["n_tokens"] > 0 and gap["max_abs"] < 1e-4, (mode, gap["max_abs"])


def test_exact_packings_hold_when_mem1_answers_each_question_in_turn():
    """MEM1 ``answers="each"`` (issue 58): a commit's observation (the next question) is a ref like a
    search's, so ``separate`` and ``mem1_exact`` rows still reproduce every call's log-probs."""
    from memkit.lab.evaluation import rollout
    from memkit.models import build_tiny
    from memkit.rl.packed_forward import packing_gap

    trajs = rollout("mem1", list(oracle_tasks(3, 2, 12)), kit(), policy="oracle", method_kwargs={"answers": "each"})
    assert (
        all(t.valid for t in trajs)
        and sum("Next question" in (c.observation_text or "") for t in trajs for c in t.calls) == 4
    )
    model = build_tiny(kit().tokenizer, seed=1)
    for mode in ("separate", "mem1_exact"):
        gap = packing_gap(model, trajs, mode)
        assert gap["n_tokens"] > 0 and gap["max_abs"] < 1e-4, (mode, gap["max_abs"])


def test_gae_refuses_a_unit_that_is_not_a_chain():
    _, tree = _tree()
    tree.reward = 1.0
    cb = _credit_batch([tree], "mem1_exact", with_values=True)
    with pytest.raises(ValueError, match="chain"):
        get_credit("gae").fn(cb, KNOBS)
    paths = [TrainingUnit(tree, tuple(tree.path(leaf))) for leaf in tree.leaves()]
    adv, _ = get_credit("gae").fn(_credit_batch([tree], "mem1_exact", paths, with_values=True), KNOBS)
    assert adv.abs().sum() > 0


def test_merge_tree_refuses_chains_that_share_nothing():
    from memkit.rollout.trees import merge_tree

    chains, _ = _tree()
    copies = [Trajectory.from_dict(c.to_dict()) for c in chains]  # equal content, other objects
    with pytest.raises(ValueError, match="share no call"):
        merge_tree(copies)


def test_traces_written_before_calls_had_parents_load_as_chains(tmp_path):
    import json

    from memkit.core.trajectory import load_jsonl

    t = oracle_traces("mem1", 2, 3, 11)[0]
    d = t.to_dict()
    for c in d["calls"]:
        del c["parent"], c["reward"], c["advantage"]
    (tmp_path / "old.jsonl").write_text(json.dumps(d) + "\n")
    (back,) = load_jsonl(tmp_path / "old.jsonl")
    assert [c.parent for c in back.calls] == [c.parent for c in t.calls] == [None] + list(range(len(t.calls) - 1))
    assert not back.is_tree and back.leaves() == [len(t.calls) - 1]


def test_whitening_with_global_moments_is_the_formula_the_update_used_before():
    """(x - mean) * m / sqrt(var + 1e-8) with mean/var from summed moments, bit for bit."""
    import math

    g = torch.Generator().manual_seed(0)
    x, m = torch.randn(64, 50, generator=g), (torch.rand(64, 50, generator=g) > 0.3).float()
    s1, s2, n = masked_moments(x, m)
    mean = s1 / max(n, 1.0)
    var = (s2 - n * mean**2) / max(n - 1.0, 1.0)
    old = (x - mean) * m / math.sqrt(max(var, 0.0) + 1e-8)
    assert torch.equal(masked_whiten(x, m, mean_var=moments_to_mean_var(s1, s2, n)), old)


def _learner(credit, **over):
    from accelerate import Accelerator

    from memkit.models import build_tiny
    from memkit.rl.config import TrainConfig
    from memkit.rl.update import Learner

    cfg = TrainConfig.from_flags(
        method="memsearcher",
        init="tiny",
        credit=credit,
        packing="separate",
        lr=1e-3,
        kl_coef=0.0,
        micro_batch_size=64,
        out_dir="",
        **over,
    )
    return Learner(cfg, build_tiny(kit().tokenizer, seed=0), kit().tokenizer, accelerator=Accelerator(cpu=True))


def test_the_learner_trains_segments_as_units_and_records_call_advantages():
    """Learner.update with each trajectory cut into two segments (units) makes the same update as
    with whole trajectories under multi_context + separate rows + token-mean, and writes every
    trained call's advantage A_i into Call.advantage."""
    from memkit.rl.advantages import grpo_advantages

    trajs = _trajs("memsearcher", 3)
    whole = _learner("multi_context")
    whole.update(trajs)
    a = grpo_advantages(torch.tensor([t.reward for t in trajs]), [t.task_id for t in trajs])
    for i, t in enumerate(trajs):
        for _, c in TrainingUnit.of(t):
            assert c.advantage == pytest.approx(float(a[i]), abs=1e-6)
    segs = []
    for t in trajs:
        idx = TrainingUnit.of(t).calls
        segs += [TrainingUnit(t, idx[:2]), TrainingUnit(t, idx[2:])] if len(idx) > 2 else [TrainingUnit(t, idx)]
    assert len(segs) > len(trajs)
    split = _learner("multi_context")
    split.update(trajs, units=segs)
    for (name, p), q in zip(whole.policy.named_parameters(), split.policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
    moved = _learner("multi_context").policy
    assert any(not torch.equal(p, q) for p, q in zip(whole.policy.parameters(), moved.parameters()))
    with pytest.raises(ValueError, match="same object"):
        _learner("multi_context").update(trajs, units=[TrainingUnit.of(Trajectory.from_dict(trajs[0].to_dict()))])
