"""MemAct's DCPO (§3.3, Algorithm 1) on real rollouts: segments at memory edits, the round-robin
sampler, the ``dcpo`` credit rule, and the memory schedules of Table 1's baselines.

Trajectories are the scripted oracle's through the rollout engine (``tests/fixtures/traces.py``),
so contexts, records and prunes are what a training run holds; log-probs are compared under the
tiny Llama on the kit's tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from memkit.agents import get_method
from memkit.agents.memact import PRUNE_OPENER
from memkit.core.trajectory import Trajectory
from memkit.rl.config import TrainConfig
from memkit.rl.credit import CreditBatch, get_credit
from memkit.rl.packed_forward import packing_gap
from memkit.rl.packing import pack
from memkit.rl.rules import DCPOConfig
from memkit.rl.segments import (
    dcpo_units,
    sample_segments,
    sample_segments_loop,
    sampler_draws,
    segment_calls,
    segment_units,
)
from tests.fixtures.traces import kit, oracle_tasks, oracle_traces

#: a real trainer config (the rules read its fields; no stand-in with defaults of its own)
KNOBS = TrainConfig(method="memact", credit="dcpo", dcpo=DCPOConfig(group_stats="all", segments=12))


@pytest.fixture(scope="module")
def model():
    from memkit.lab.policies import fresh_tiny

    return fresh_tiny(kit(), seed=3).model.eval()


def _pruned(traj: Trajectory) -> list[int]:
    """Calls whose Prune&Write deleted records (``Trajectory.info``, what the viewers read)."""
    return [i for i, ids in enumerate(traj.info["pruned_ids"]) if ids]


def _group(method="memact", k=4, copies=3, seed=0) -> list[Trajectory]:
    """Real trajectories, 3 tasks x ``copies`` (a group per task), seeded rewards in {1, 0, -0.1}."""
    rng = random.Random(seed)
    out = []
    for c in range(copies):
        for t in oracle_traces(method, k, 3, 11):
            t = Trajectory.from_dict(t.to_dict())
            t.reward, t.group_index = rng.choice([1.0, 0.0, 0.5, -0.1]), c
            out.append(t)
    return out


# ------------------------------------------------------------------------------ segmentation (eq. 2)
def test_segments_end_at_each_prune_and_partition_the_calls():
    trajs = oracle_traces("memact", 4, 3, 11)
    assert all(len(_pruned(t)) >= 2 for t in trajs)
    for t in trajs:
        segs = segment_calls(t)
        assert [i for s in segs for i in s] == [i for i, c in enumerate(t.calls) if c.output_ids]
        assert [s[-1] for s in segs[:-1]] == _pruned(t)  # the prune call ends its segment (pre-prune context)
        assert len(segs) == len(_pruned(t)) + 1
        for s in segs:  # a fixed prefix: each call's context extends the previous one's
            for a, b in zip(s, s[1:]):
                assert t.calls[b].context_ids[: t.calls[a].n_context] == t.calls[a].context_ids


def test_segments_of_other_formats():
    for t in oracle_traces("react", 2, 3, 11):
        assert segment_calls(t) == [tuple(range(len(t.calls)))]  # ReAct never edits: one segment
    for t in oracle_traces("mem1", 2, 3, 11):
        # MEM1's second context (q, S1A1, O1) extends the first (q); from then on it rewrites every turn
        assert segment_calls(t) == [(0, 1)] + [(i,) for i in range(2, len(t.calls))]


def test_final_segment_trains_only_the_calls_after_the_last_edit():
    """Algorithm 1 line 27 (memkit's rule): the surviving note is context of the final segment, not
    trained again (the authors' code re-trains it); over all segments each output token is trained once."""
    t = oracle_traces("memact", 4, 3, 11)[0]
    last = segment_units(t)[-1]
    prune = _pruned(t)[-1]
    assert last.calls[0] == prune + 1
    batch = pack([last], "mem1_exact")
    trained = set(batch.call_ids[0][batch.loss_mask[0] > 0].tolist())
    assert trained == set(last.calls)
    note = t.calls[last.calls[0]].context_refs
    assert any(j == prune and kind == "output" for _, _, j, kind in note)  # the note is in the context ...
    assert prune not in trained  # ... but not trained
    every = pack(segment_units(t), "mem1_exact")
    n_out = sum(c.n_output for c in t.calls) - sum(1 for c in t.calls if c.output_ids and not c.n_context)
    assert int(every.loss_mask.sum()) == n_out


def test_segment_logprobs_equal_per_call_recompute(model):
    """DCPO's exact segments (one trie row each) against one causal forward per call: <= 1e-4. The
    MEM1-style mask over the un-pruned history is not exact after a prune (§3.3's contamination)."""
    trajs = list(oracle_traces("memact", 4, 3, 11))
    units = [u for t in trajs for u in segment_units(t)]
    assert packing_gap(model, units, "mem1_exact")["max_abs"] <= 1e-4
    masked = packing_gap(model, trajs, "mem1_mask")
    after = [g for t, row in zip(trajs, masked["per_call_max"]) for i, g in enumerate(row) if i > _pruned(t)[0]]
    assert max(after) > 1e-2


def test_segments_need_a_chain():
    from memkit.rollout.trees import merge_tree

    t = Trajectory.from_dict(oracle_traces("memact", 2, 3, 11)[0].to_dict())
    u = Trajectory.from_dict(t.to_dict())
    u.calls[-1].output_ids = u.calls[-1].output_ids[:-1] + [7]
    with pytest.raises(ValueError, match="chain"):
        segment_calls(merge_tree([t, u]))


# ------------------------------------------------------------------------------ round-robin sampling
@pytest.mark.parametrize("seed", range(20))
def test_sampler_equals_its_loop_reference(seed):
    rng = random.Random(seed)
    counts = [rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(1, 7))]
    for n_seg in (1, 3, 12, 40):
        draws = sampler_draws(counts, n_seg, torch.Generator().manual_seed(seed))
        got = [tuple(x) for x in sample_segments(counts, n_seg, draws).tolist()]
        assert got == sample_segments_loop(counts, n_seg, draws)
        live = [i for i, c in enumerate(counts) if c]
        if not live:
            assert got == []
            continue
        assert len(got) == n_seg and all(0 <= j < counts[i] for i, j in got)
        n_first = min(n_seg, len(live))
        assert sorted(i for i, _ in got[:n_first]) == sorted(got[i][0] for i in range(n_first))
        assert len({i for i, _ in got[:n_first]}) == n_first  # distinct trajectories first
        per = {i: [j for t, j in got if t == i] for i in live}
        for i, js in per.items():  # no repeat before a trajectory's segments are all taken
            assert len(set(js[: counts[i]])) == len(js[: counts[i]])


def test_dcpo_units_draw_n_seg_per_prompt_and_repeat_with_the_seed():
    trajs = _group()
    units = dcpo_units(trajs, 5, seed=1)
    by_task = {}
    for u in units:
        by_task.setdefault(u.traj.task_id, []).append(u)
    assert sorted(len(v) for v in by_task.values()) == [5, 5, 5]
    for u in units:
        assert u.calls in segment_calls(u.traj)
    again = dcpo_units(trajs, 5, seed=1)
    assert [(id(u.traj), u.calls) for u in units] == [(id(u.traj), u.calls) for u in again]
    every = dcpo_units(trajs, 0)
    assert len(every) == sum(len(segment_calls(t)) for t in trajs)


# ------------------------------------------------------------------------------ advantages (eq. 4-6)
def _cb(trajs, units) -> CreditBatch:
    index = {id(t): i for i, t in enumerate(trajs)}
    unit_traj = torch.tensor([index[id(u.traj)] for u in units])
    trained = torch.zeros(len(trajs), dtype=torch.bool)
    trained[unit_traj] = True
    return CreditBatch(
        batch=pack(units, "mem1_exact"),
        units=units,
        unit_traj=unit_traj,
        rewards=torch.tensor([t.reward for t in trajs]),
        group_ids=[t.task_id for t in trajs],
        trajectories=trajs,
        trained=trained,
    )


@pytest.mark.parametrize("stats", ["all", "sampled"])
@pytest.mark.parametrize("n_seg", [2, 12])
def test_dcpo_equals_its_loop_reference_on_sampled_segments(stats, n_seg):
    rule = get_credit("dcpo")
    cfg = replace(KNOBS, dcpo=DCPOConfig(group_stats=stats))
    for seed in range(3):
        trajs = _group(seed=seed)
        cb = _cb(trajs, dcpo_units(trajs, n_seg, seed))
        got, _ = rule.fn(cb, cfg)
        assert torch.allclose(got, torch.tensor(rule.loop(cb, cfg)), atol=1e-6)


def test_each_segment_inherits_its_trajectorys_advantage_by_hand():
    """One prompt, 4 samples with R = (1, 0, 0, -0.1); 'all' normalises over the 4, 'sampled' over
    the 2 trajectories that have a segment drawn (the authors' code)."""
    base = oracle_traces("memact", 4, 1, 11)[0]
    trajs = []
    for r in (1.0, 0.0, 0.0, -0.1):
        t = Trajectory.from_dict(base.to_dict())
        t.reward = r
        trajs.append(t)
    units = [segment_units(trajs[0])[0], segment_units(trajs[0])[1], segment_units(trajs[3])[0]]
    cb = _cb(trajs, units)
    cfg = KNOBS
    r = torch.tensor([1.0, 0.0, 0.0, -0.1])
    a_all = (r - r.mean()) / (r.std() + 1e-6)
    got, _ = get_credit("dcpo").fn(cb, cfg)
    m = cb.batch.loss_mask > 0
    for row, traj in enumerate([0, 0, 3]):
        assert torch.allclose(got[row][m[row]], a_all[traj].expand(int(m[row].sum())), atol=1e-5)
    cfg = replace(KNOBS, dcpo=DCPOConfig(group_stats="sampled"))
    got, _ = get_credit("dcpo").fn(cb, cfg)
    pair = torch.tensor([1.0, -0.1])
    a_s = (pair - pair.mean()) / (pair.std() + 1e-6)
    assert float(got[0][m[0]][0]) == pytest.approx(float(a_s[0]), abs=1e-5)
    assert float(got[2][m[2]][0]) == pytest.approx(float(a_s[1]), abs=1e-5)


def test_the_learner_trains_dcpo_segments():
    """MemAct's default rule draws N_seg segments per prompt and trains exactly their output tokens."""
    from accelerate import Accelerator

    from memkit.models import build_tiny
    from memkit.rl.config import TrainConfig
    from memkit.rl.update import Learner, _units_seed

    cfg = TrainConfig.from_flags(
        method="memact",
        init="tiny",
        lr=1e-3,
        kl_coef=0.0,
        micro_batch_size=64,
        out_dir="",
        dcpo=DCPOConfig(segments=4),
        agg="seq-mean-token-mean",
    )
    assert cfg.resolved_credit() == "dcpo" and cfg.resolved_packing() == "mem1_exact"
    learner = Learner(cfg, build_tiny(kit().tokenizer, seed=0), kit().tokenizer, accelerator=Accelerator(cpu=True))
    before = [p.detach().clone() for p in learner.policy.parameters()]
    trajs = _group()
    units = dcpo_units(trajs, 4, _units_seed(cfg.seed, trajs))
    stats = learner.update(trajs)
    assert stats["trained_tokens"] == float(pack(units, "mem1_exact").loss_mask.sum())
    assert len(units) == 12 and stats["trained_tokens"] < sum(c.n_output for t in trajs for c in t.calls)
    assert any(not torch.equal(p, q) for p, q in zip(before, learner.policy.parameters()))


# ------------------------------------------------------------------------------ Table 1's schedules
class Scripted:
    """A policy that writes fixed texts in order."""

    def __init__(self, texts):
        self.texts = list(texts)

    def generate_calls(self, states, specs, contexts):
        from memkit.models.generation import Generation

        out = []
        for _ in states:
            text = self.texts.pop(0)
            ids = kit().tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(ids=ids, logprobs=[0.0] * len(ids), text=text))
        return out


def test_fixed_schedule_forces_a_prune_every_interval_calls():
    from memkit.lab.evaluation import rollout

    tasks = list(oracle_tasks(4, 3, 11))
    for traj in rollout("memact", tasks, kit(), policy="oracle", method_kwargs=dict(schedule="fixed", interval=3)):
        assert traj.valid and traj.reward == 1.0
        pruned = [i for i, c in enumerate(traj.calls) if c.context_text.endswith(PRUNE_OPENER)]
        assert pruned == [i for i in range(len(traj.calls)) if i % 3 == 2]
        assert pruned == [i for i, ids in enumerate(traj.info["pruned_ids"]) if ids]
        assert all(not c.output_text.startswith("<think>") for c in (traj.calls[i] for i in pruned))
        assert [s[-1] for s in segment_calls(traj)[:-1]] == pruned


def test_window_keeps_the_last_records_and_has_no_prune_tool():
    from memkit.lab.evaluation import rollout

    tasks = list(oracle_tasks(4, 3, 11))
    for traj in rollout("memact", tasks, kit(), policy="oracle", method_kwargs=dict(schedule="window", window=2)):
        assert traj.valid and not any(traj.info["pruned_ids"])
        for i, c in enumerate(traj.calls):
            shown = [ref[2] for ref in c.context_refs if ref[3] == "output"]
            assert shown == list(range(max(0, i - 2), i))


def test_summary_replaces_what_falls_out_of_the_window_with_a_note(model):
    """Table 1's summarisation: once more than ``window`` records are live the context ends with the prune
    opening and the ids of every record but the newest, the teacher writes only the note (its facts),
    so answers stay right; contexts never hold more than window + 1 records, and DCPO's segments, cut
    at each summary, stay exact."""
    from memkit.lab.evaluation import rollout

    tasks = list(oracle_tasks(4, 3, 11))
    trajs = rollout("memact", tasks, kit(), policy="oracle", method_kwargs=dict(schedule="summary", window=2))
    m = get_method("memact", schedule="summary", window=2)
    for traj in trajs:
        assert traj.valid and traj.reward == 1.0
        due = [i for i, c in enumerate(traj.calls) if c.context_text.endswith("<note>")]
        assert due and due == _pruned(traj) and [s[-1] for s in segment_calls(traj)[:-1]] == due
        live = [len({ref[2] for ref in c.context_refs if ref[3] == "output"}) for c in traj.calls]  # records shown
        for i in due:
            assert live[i] == 3 and len(traj.info["pruned_ids"][i]) == live[i] - 1
            assert not traj.calls[i].output_text.startswith("<think>") and traj.calls[i].output_text.endswith("</note>")
        assert max(live) <= 3
    assert m.suggested_max_turns(tasks[0]) > get_method("memact", schedule="window").suggested_max_turns(tasks[0])
    units = [u for t in trajs for u in segment_units(t)]
    assert packing_gap(model, units, "mem1_exact")["max_abs"] <= 1e-4


def test_off_schedule_prunes_are_invalid_turns():
    from memkit.rollout.engine import RolloutConfig, run_rollouts

    task = oracle_tasks(2, 3, 11)[0]
    env = kit().env_for(3)
    search, prune = "<think>t</think><search>x</search>", "<think>t</think><prune>r1</prune><note>facts</note>"
    cases = [
        (dict(schedule="window"), [search, prune], "no prune tool under the sliding window"),
        (dict(schedule="fixed", interval=3), [search, prune], "off the fixed schedule (every 3 calls)"),
        (dict(schedule="summary", window=3), [search, prune], "before the window is full (more than 3 records)"),
    ]
    for kw, texts, reason in cases:
        m = get_method("memact", **kw)
        traj = run_rollouts(m, [task], env, Scripted(texts), kit().tokenizer, RolloutConfig(max_turns=4))[0]
        assert not traj.valid and reason in traj.reason and traj.reward == -0.1
    # a due call's output continues the forced opening: "r1, r2</prune><note>...</note>" is a Prune&Write
    m = get_method("memact", schedule="fixed", interval=2)
    traj = run_rollouts(
        m,
        [task],
        env,
        Scripted([search, "r1</prune><note>facts</note>", search]),
        kit().tokenizer,
        RolloutConfig(max_turns=3),
    )[0]
    assert traj.info["pruned_ids"][:2] == [[], ["r1"]] and traj.calls[1].valid
    with pytest.raises(ValueError, match="schedule"):
        get_method("memact", schedule="sometimes")
