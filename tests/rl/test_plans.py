"""One trainer for all five papers (memkit.rl.plans): each method declares its rollout plan and the
Trainer runs it. Mem-T's plan grows MoT-GRPO's operation trees (or the GRPO baseline's chains) over
teacher-built stores; ``memkit train --method memt`` runs that step end to end."""

from __future__ import annotations

import json

import pytest

from memkit.agents import METHODS, get_method
from memkit.rl.config import TrainConfig
from memkit.rl.plans import PLANS, ChainPlan, TreePlan
from memkit.rl.rules import MoTConfig


def test_every_method_declares_a_plan_the_trainer_knows():
    assert {get_method(m).rollout_plan for m in METHODS} == {"chains"}
    assert get_method("memt").rollout_plan == "trees" and set(PLANS) == {"chains", "trees"}


def _memt_trainer(kit, **over):
    from memkit.lab.memt.retrieval import memt_wrap
    from memkit.lab.policies import fresh_tiny
    from memkit.rl.trainer import Trainer

    kw = dict(
        method="memt",
        init="tiny",
        packing="mem1_exact",
        steps=1,
        tasks_per_step=2,
        n_samples=2,
        n_train_tasks=2,
        eval_tasks=1,
        mot=MoTConfig(rounds=1, pivots=1),
        eval_every=0,
        micro_batch_size=4,
    )
    cfg = TrainConfig.from_flags(**{**kw, **over})
    return Trainer(cfg, fresh_tiny(kit, 0).model, kit.tokenizer, memt_wrap(kit), kit)


def test_memt_trains_trees_or_chains_through_the_trainer(kit, monkeypatch):
    """credit mot: G = n_samples trees per question, scored with the config's MoT knobs (--mot-alpha
    reaches the node rewards); credit grpo: n_samples chains per question. Both update the policy."""
    import memkit.rl.plans as plans

    seen = []
    real = plans.score_query
    monkeypatch.setattr(plans, "score_query", lambda trees, ev, src, cfg: seen.append(cfg) or real(trees, ev, src, cfg))
    mot = _memt_trainer(kit, mot=MoTConfig(rounds=1, pivots=1, alpha=0.8, combine="sequential"))
    assert isinstance(mot.plan, TreePlan)
    local = mot.plan.tasks(mot, 0)
    trajs, units = mot.plan.rollout(mot, local, 0)
    assert len(local) == 2 and len(trajs) == 2 * 2 and len(units) == len(trajs)  # 2 questions x G = 2 trees
    assert all("leaf_outcomes" in t.info for t in trajs)
    assert [(c.alpha, c.combine) for c in seen] == [(0.8, "sequential")] * 2
    row = mot.train_step()
    assert row["trained_tokens"] > 0 and row["rollout_tokens"] > 0 and 0.0 <= row["leaf_reward"] <= 1.0
    grpo = _memt_trainer(kit, credit="grpo", n_samples=3)
    trajs, units = grpo.plan.rollout(grpo, grpo.plan.tasks(grpo, 0), 0)
    assert len(trajs) == 2 * 3 and all("leaf_outcomes" not in t.info for t in trajs)
    assert 0.0 <= row["mixed_groups"] <= 1.0
    assert grpo.plan.tasks(grpo, 5) == grpo.plan.tasks(grpo, 5)  # a function of (seed, step): resumable


def test_a_tree_plan_draws_only_the_categories_it_is_given(kit):
    """``TreePlan.categories`` (Mem-T's longer-stream study trains on multi-hop questions only): every drawn
    question is of those categories; a category the stores do not ask is refused by name."""
    from memkit.agents.memt_tools import stream_conversation
    from memkit.world.conversation import CATEGORIES

    tr = _memt_trainer(kit, tasks_per_step=3, n_train_tasks=3)
    tr.plan.categories = ("multi-hop",)
    drawn = [CATEGORIES[stream_conversation(b).qa[qi].category] for s in range(4) for b, qi in tr.plan.tasks(tr, s)]
    assert len(drawn) == 12 and set(drawn) == {"multi-hop"}
    tr.plan.categories = ("no such category",)
    with pytest.raises(ValueError, match="no such category"):
        tr.plan.tasks(tr, 0)


def test_wiki_methods_keep_the_chain_plan(kit):
    from memkit.lab.policies import fresh_tiny
    from memkit.rl.trainer import Trainer

    cfg = TrainConfig.from_flags(
        method="mem1",
        init="tiny",
        steps=1,
        tasks_per_step=2,
        n_samples=2,
        max_turns=2,
        objectives=(1,),
        n_train_tasks=8,
        eval_every=0,
    )
    loaded = fresh_tiny(kit, 0)
    t = Trainer(cfg, loaded.model, loaded.tokenizer, loaded.wrap, kit)
    assert isinstance(t.plan, ChainPlan) and t.plan.tasks(t, 3) == t.step_tasks(3)


def test_cli_train_memt_runs_the_mot_grpo_step(tmp_path, capsys):
    """``memkit train --method memt``: trees over teacher-built stores, a logged step, a held-out
    evaluation over every question of the evaluation stores, a checkpoint."""
    from memkit.cli import main

    out = tmp_path / "memt"
    rc = main(
        [
            "train",
            "--method",
            "memt",
            "--init",
            "tiny",
            "--steps",
            "1",
            "--tasks-per-step",
            "2",
            "--n",
            "2",
            "--n-train-tasks",
            "2",
            "--eval-tasks",
            "1",
            "--eval-every",
            "1",
            "--no-eval-at-start",
            "--mot-pivots",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["step"] == 1 and step["trained_tokens"] > 0 and "leaf_reward" in step
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert len(evals) == 1 and evals[0]["questions"] > 0 and 0.0 <= evals[0]["f1"] <= 1.0
    assert (out / "checkpoints" / "step-000001").is_dir()
    assert "questions): F1" in capsys.readouterr().out


def test_mixed_groups_counts_the_questions_whose_leaves_differ(kit):
    """``TreePlan.stats``' ``mixed_groups`` against a loop over real rollouts (2 questions, 2 trees each; then
    3 chains each) whose leaf rewards are set by hand: one question all-equal, one mixed -> 0.5."""
    import copy

    for credit, n in (("mot", 2), ("grpo", 3)):
        tr = _memt_trainer(kit, credit=credit, n_samples=n)
        trajs, _ = tr.plan.rollout(tr, tr.plan.tasks(tr, 0), 0)
        by_q = {}
        for t in trajs:
            by_q.setdefault(t.task_id, []).append(t)
        assert len(by_q) == 2 and all(len(g) == n for g in by_q.values())
        for q, (tid, group) in enumerate(by_q.items()):
            for j, t in enumerate(group):
                value = 1.0 if q == 1 and j == 0 else 0.0  # question 1: one leaf right, the rest wrong
                if t.is_tree:
                    t.info = copy.deepcopy(t.info)
                    for o in t.info["leaf_outcomes"]:
                        o["reward"] = 0.0
                    t.info["leaf_outcomes"][0]["reward"] = value
                else:
                    t.reward = value
        loop = sum(len({o for t in g for o in ([x.reward for x in t.leaf_outcomes()] or [t.reward])}) > 1
                   for g in by_q.values()) / len(by_q)  # fmt: skip
        assert tr.plan.stats(trajs)["mixed_groups"] == loop == 0.5
