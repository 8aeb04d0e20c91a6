"""MemPO and MemAct where their mechanisms can act (issue 58): two 3-seed studies at equal rollout tokens.

In the lab's 2-question setting neither mechanism has anything to work on (docs/findings.md): every MemPO
memory before the last holds at most half the gold, and MemAct's contexts never approach a limit. Each study
moves the setting to where the mechanism binds, clones the lab's flawed teacher where it is valid there
(the lab's clones are not: MemPO's is invalid at k = 3, MemAct's in 0.98 of 2-question episodes), and compares
the paper's method with its baseline at **equal rollout tokens** (:func:`equal_token_arms`).

* :func:`mempo_study` (notebook 04 §8; MemPO Fig. 3-5): 3-question tasks, where a memory can carry two
  answers before the last search. MemPO's credit (eq. 9) against GRPO with the same ``<mem>`` format; both
  score their memories by eq. 3's

      R^M(mem_t) = P[ans | q, mem_t]

  on held-out tasks, and count searches per task: the measured way MemPO raises R^M is to stop searching
  (docs/findings.md, 'MemPO against GRPO-with-memory where memories carry several answers').
* :func:`memact_study` (notebook 05 §8; MemAct §5, Tab. 1): 2-question tasks under a 260-token context
  limit. A call whose context is longer ends its trajectory with eq. 3's r_pen = -0.1, and the agent's
  4-search episodes reach it (docs/findings.md, 'MemAct under a context limit that binds'). DCPO (the agent
  prunes) against a Prune&Write every 3rd call and against the 3-record sliding window.
* :func:`memt_study` (notebook 06 §8; Mem-T Tab. 2): longer streams (10 sessions, ~150 turns, against the lab's 4)
  and RL on their multi-hop questions only, where the clone is weakest and a tree's leaves can differ, so the
  node rewards (eq. 10-13) have right answers to back up; the clone copies a teacher with half the lab's
  ``stop_early`` rate (:data:`MEMT_TEACHER`). MoT-GRPO (3 trees) against GRPO (7 chains;
  :func:`memkit.lab.memt.retrieval.run_arm`) at equal rollout tokens.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from memkit.lab.evaluation import evaluate
from memkit.lab.memt.retrieval import LAB_TEACHER
from memkit.lab.recipes import LAB_WINDOW, lab_sft_config, lab_window_sft_config
from memkit.lab.runs import ensure_sft, train_arms
from memkit.metrics.efficiency import rollout_tokens
from memkit.rl.config import TrainConfig
from memkit.train.config import SFTConfig

#: questions per MemPO task: the most a 1-3-question clone of the lab's teacher answers validly
MEMPO_K = 3
#: MemAct's context limit in tokens: the agent's 4-search episodes overflow it, its 3-search ones fit
MEMACT_LIMIT = 260
#: MemAct's fixed-interval baseline (Table 1's dagger row): a Prune&Write at every 3rd call
FIXED_INTERVAL = {"schedule": "fixed", "interval": 3}
#: the per-run numbers each arm reports (mean and std over seeds)
RUN_KEYS = ("em", "invalid", "em_bridge", "searches", "memory_actions", "context_tokens", "mem_p", "steps",
            "rollout_tokens", "minutes")  # fmt: skip
_SMOKE_SFT = dict(n_tasks=40, steps=20, batch_size=8, warmup=5, log_every=5, init="scratch")
_SMOKE_RL = dict(steps=1, tasks_per_step=2, n_samples=2, n_train_tasks=50, log_entropy=False)


def mempo_sft(smoke: bool = False) -> SFTConfig:
    """The lab's MemPO clone recipe on 1-3-question tasks for 3,000 steps (SMOKE: 20 steps from scratch)."""
    return replace(lab_sft_config("mempo"), objectives=(1, 2, 3), **(_SMOKE_SFT if smoke else dict(steps=3000)))


def memact_sft(smoke: bool = False) -> SFTConfig:
    """The lab's MemAct clone recipe for 3,000 steps, twice the lab's: valid on 2 questions (SMOKE: 20 steps)."""
    return replace(lab_sft_config("memact"), **(_SMOKE_SFT if smoke else dict(steps=3000)))


def _rl_base(method: str, init, out_dir, k: int, steps: int, smoke: bool, n_tasks: int, **over) -> TrainConfig:
    """The lab's RL settings (notebooks 04 and 05) on ``k``-question tasks; one greedy evaluation at the end."""
    sizes = _SMOKE_RL if smoke else dict(steps=steps, tasks_per_step=8, n_samples=4, log_entropy=False)
    return TrainConfig.from_flags(
        method=method, init=str(init), objectives=(k,), eval_objectives=(k,), eval_tasks=n_tasks, eval_every=10_000,
        eval_at_start=False, lr=3e-4, kl_coef=0.001, temperature=0.5, save_every=0, out_dir=str(out_dir), **sizes, **over,
    )  # fmt: skip


def equal_token_arms(base: TrainConfig, paper: tuple[str, dict], baseline: tuple[str, dict], seeds, kit,
                     progress: bool = False) -> dict:  # fmt: skip
    """Per seed: the paper's arm for ``base.steps``, then the baseline until it has generated as many rollout
    tokens as that run did (``max_rollout_tokens``; at most twice the steps). -> ``{(arm, seed): TrainResult}``.

    The arms differ in tokens per step (a policy that searches less writes less), so equal steps would
    give one arm more samples to learn from; equal tokens is the budget the issue asks both arms to share."""
    (name, over), (base_name, base_over) = paper, baseline
    out = {}
    for seed in seeds:
        run = train_arms(base, {name: over}, [seed], kit, progress=progress)
        budget = max(rollout_tokens(run[name, seed].history), 1)
        out |= run
        limited = base.with_flags(steps=2 * base.steps, max_rollout_tokens=budget)
        out |= train_arms(limited, {base_name: base_over}, [seed], kit, progress=progress)
    return out


def run_row(result, k: int) -> dict:
    """One run's last evaluation at ``k`` (:data:`RUN_KEYS`) with its steps, rollout tokens and training minutes
    (``mem_p`` None where no ``<mem>`` was written, ``em_bridge`` where no bridge question was asked)."""
    e = [r for r in result.eval_history if r["k"] == k][-1]
    return {"em": e["em"], "invalid": e["invalid_rate"], "em_bridge": e.get("em_bridge"), "searches": e["tool_calls"],
            "memory_actions": e["memory_actions"], "context_tokens": e["context_tokens"], "mem_p": e.get("mem_p"),
            "steps": len(result.history),
            "rollout_tokens": rollout_tokens(result.history),
            "minutes": sum(r["seconds"] for r in result.history) / 60}  # fmt: skip


def start_row(summary: dict, mem_p: float | None = None) -> dict:
    """The SFT start's evaluation summary (:func:`memkit.lab.evaluation.evaluate`) as a :func:`run_row`."""
    return {"em": summary["em"], "invalid": summary["invalid_rate"], "em_bridge": summary.get("em_bridge"),
            "searches": summary["tool_calls"], "memory_actions": summary["memory_actions"],
            "context_tokens": summary["context_tokens"], "mem_p": mem_p, "steps": 0, "rollout_tokens": 0,
            "minutes": 0.0}  # fmt: skip


def _over_seeds(per: list[dict], keys) -> dict:
    """Each of ``keys`` as the mean over the seeds' rows ``per`` that have it and ``<key>_std``, the sample std
    (0 for one seed; both None where no seed has it)."""
    out = {}
    for key in keys:
        xs = [float(r[key]) for r in per if r.get(key) is not None]
        out[key] = statistics.fmean(xs) if xs else None
        out[f"{key}_std"] = (statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else None
    return out


def arm_rows(starts: dict[str, dict], runs: dict, k: int) -> list[dict]:
    """One row per start (one value, std 0) and per arm: each :data:`RUN_KEYS` as mean and ``_std`` (sample std
    over the seeds that have it; 0 for one, None for none), ``em_seeds`` the per-seed EM, ``seeds`` how many."""
    rows = [{"arm": name, "seeds": 1, "em_seeds": [r["em"]], **r, **{f"{key}_std": 0.0 for key in RUN_KEYS}}
            for name, r in starts.items()]  # fmt: skip
    for arm in dict.fromkeys(a for a, _ in runs):
        per = [run_row(res, k) for (a, _), res in runs.items() if a == arm]
        row = {"arm": arm, "seeds": len(per), "em_seeds": [r["em"] for r in per]}
        rows.append(row | _over_seeds(per, RUN_KEYS))
    return rows


def mempo_study(kit, seeds, out_dir, smoke: bool = False, n_tasks: int = 50, progress: bool = False) -> dict:
    """Clone (cached), evaluate it, then MemPO and GRPO-with-memory per seed at equal rollout tokens, on
    :data:`MEMPO_K`-question tasks. -> ``{"rows": arm_rows, "sft": path, "seeds", "k", "steps"}``; arms
    "SFT start", "MemPO", "GRPO"."""
    from memkit.models import load_policy
    from memkit.rl.memory_reward import score_memories
    from memkit.rl.rules import MemPOConfig

    init = ensure_sft("mempo", kit, mempo_sft(smoke), progress=progress)
    base = _rl_base("mempo", init, Path(out_dir), MEMPO_K, 60, smoke, n_tasks)
    policy = load_policy(str(init))
    summary, trajs = evaluate("mempo", kit, objectives=(MEMPO_K,), n_tasks=n_tasks, policy=policy,
                              seed=base.eval.seed)[MEMPO_K]  # fmt: skip
    mems = score_memories(policy.model, policy.tokenizer, trajs)
    start = start_row(summary, statistics.fmean(m["p_mem"] for m in mems) if mems else None)
    runs = equal_token_arms(base, ("MemPO", dict(credit="mempo")),
                            ("GRPO", dict(credit="grpo", mem_reward=MemPOConfig(log=True))), seeds, kit, progress)  # fmt: skip
    return {"rows": arm_rows({"SFT start": start}, runs, MEMPO_K), "sft": str(init), "seeds": list(seeds),
            "k": MEMPO_K, "steps": base.steps}  # fmt: skip


def memact_study(kit, seeds, out_dir, smoke: bool = False, n_tasks: int = 50, progress: bool = False) -> dict:
    """Clone and window clone (cached), evaluate both under the limit, then DCPO and fixed-interval pruning per
    seed at equal rollout tokens and the window agent (one seed, the steps DCPO trained), all under
    :data:`MEMACT_LIMIT`. -> ``{"rows": arm_rows, "sft", "window_sft", "seeds", "limit", "steps"}``; arms
    "SFT start", "SFT start, window", "DCPO", "fixed interval", "sliding window"."""
    start_cfg = memact_sft(smoke)
    init = ensure_sft("memact", kit, start_cfg, progress=progress)
    window_cfg = lab_window_sft_config(LAB_WINDOW, start_cfg)
    window = ensure_sft("memact", kit, replace(window_cfg, steps=20) if smoke else window_cfg, progress=progress)
    base = _rl_base("memact", init, Path(out_dir), 2, 40, smoke, n_tasks, agg="seq-mean-token-mean",
                    max_context_tokens=MEMACT_LIMIT)  # fmt: skip
    starts = {}
    for name, path, kw in (("SFT start", init, {}), ("SFT start, window", window, dict(LAB_WINDOW))):
        res = evaluate("memact", kit, objectives=(2,), n_tasks=n_tasks, policy=str(path), seed=base.eval.seed,
                       method_kwargs=kw, max_context_tokens=MEMACT_LIMIT)  # fmt: skip
        starts[name] = start_row(res[2][0])
    runs = equal_token_arms(base, ("DCPO", {}), ("fixed interval", dict(method_kwargs=FIXED_INTERVAL)), seeds, kit,
                            progress)  # fmt: skip
    runs |= train_arms(base, {"sliding window": dict(method_kwargs=dict(LAB_WINDOW), init=str(window))}, list(seeds)[:1],
                       kit, progress=progress)  # fmt: skip
    return {"rows": arm_rows(starts, runs, 2), "sft": str(init), "window_sft": str(window), "seeds": list(seeds),
            "limit": MEMACT_LIMIT, "steps": base.steps}  # fmt: skip


def _by_arm(study: dict) -> dict[str, dict]:
    return {r["arm"]: r for r in study["rows"]}


def mempo_summary(study: dict) -> dict:
    """What ``docs/results.md`` judges (record ``mempo_k3``): each arm's EM, P[ans | mem], searches and rollout
    tokens (mean, std) at k = :data:`MEMPO_K`, and the SFT start's."""
    a = _by_arm(study)
    out = {"k": study["k"], "seeds": len(study["seeds"]), "steps": study["steps"]}
    for key, arm in (("start", "SFT start"), ("mempo", "MemPO"), ("grpo", "GRPO")):
        for m in ("em", "mem_p", "searches", "em_bridge", "rollout_tokens", "steps"):
            out[f"{m}_{key}"], out[f"{m}_{key}_std"] = a[arm][m], a[arm][f"{m}_std"]
    return out


def memact_summary(study: dict) -> dict:
    """What ``docs/results.md`` judges (record ``memact_limit``): EM, invalid share, context tokens per call and
    rollout tokens (mean, std) of DCPO, fixed-interval pruning and the window agent under the limit, and the
    starts'."""
    a = _by_arm(study)
    out = {"limit": study["limit"], "seeds": len(study["seeds"]), "steps": study["steps"]}
    arms = (("start", "SFT start"), ("window_start", "SFT start, window"), ("dcpo", "DCPO"),
            ("fixed", "fixed interval"), ("window", "sliding window"))  # fmt: skip
    for key, arm in arms:
        for m in ("em", "invalid", "context_tokens", "searches", "rollout_tokens", "steps"):
            out[f"{m}_{key}"], out[f"{m}_{key}_std"] = a[arm][m], a[arm][f"{m}_std"]
    return out


#: Mem-T's longer streams (:data:`memkit.world.streams.SIZES`) and the questions its RL trains on
MEMT_SIZE, MEMT_TRAIN_CATEGORIES = "medium", ("multi-hop",)
#: the teacher the study's clone copies: the lab's (:data:`memkit.lab.memt.retrieval.LAB_TEACHER`) with its
#: ``stop_early`` habit on multi-hop questions at 0.3 instead of 0.65. With the lab's rate the clone answers 3.6%
#: of multi-hop F1 on these streams, so a tree's leaves were nearly always all wrong alike and eq. 10's node
#: rewards had nothing to back up (docs/findings.md, 'Mem-T on longer streams'); a deviation of notebook 06
MEMT_TEACHER = replace(LAB_TEACHER, flaw_rate=0.3)
#: the study's retrieval clone: that teacher on 150 longer streams for 3,000 steps (the lab's clone has 300
#: 4-session streams and a 300-second budget, ~880 steps on one core: overall F1 0.20, multi-hop 0.05 on these
#: streams)
MEMT_CLONE = dict(size=MEMT_SIZE, train_conversations=150, sft_steps=3000, sft_seconds=None, teacher=MEMT_TEACHER)
#: F1 columns of the Mem-T study (``f1_by_category``'s keys that a medium stream asks)
MEMT_KEYS = (
    "overall",
    "multi-hop",
    "single-hop",
    "temporal",
    "open-domain",
    "invalid",
    "rollout_tokens",
    "mixed_groups",
    "steps",
)


def memt_study(kit, seeds, smoke: bool = False, steps: int = 56, n_eval: int = 24, progress: bool = False) -> dict:
    """A retrieval clone of :data:`MEMT_TEACHER` on :data:`MEMT_SIZE` streams (cached): its F1 on ``n_eval``
    held-out streams, then per seed MoT-GRPO for ``steps`` steps of 4 :data:`MEMT_TRAIN_CATEGORIES` questions and
    GRPO until it has rolled out as many tokens (at most twice the steps; :func:`equal_token_arms`' rule)
    (SMOKE: the lab's small clone and stores, one step of 2). -> ``{"rows", "seeds", "size", "steps",
    "questions"}``; rows "SFT start", "MoT-GRPO", "GRPO" with each of :data:`MEMT_KEYS` as mean and ``_std``, and
    the arms' per-seed ``overall_seeds`` and ``multi-hop_seeds``."""
    from memkit.lab.memt.retrieval import MemTLab, answer_with, built_stores, ensure_memt_clone, f1_by_category, run_arm

    lab = MemTLab.smoke() if smoke else MemTLab(**MEMT_CLONE)
    start = ensure_memt_clone(kit, lab, progress=progress)
    size, steps = (lab.size, 1) if smoke else (MEMT_SIZE, steps)
    _, train = built_stores(kit, 4 if smoke else 20, seed=20_000, size=size)
    _, held = built_stores(kit, 2 if smoke else n_eval, seed=30_000, size=size)
    first = answer_with(start.eval(), kit, held)
    rows = [{"arm": "SFT start", "seeds": 1, **{key: f1_by_category(first).get(key) for key in MEMT_KEYS}}]
    rows[0].update({"rollout_tokens": 0, "steps": 0, **{f"{key}_std": 0.0 for key in MEMT_KEYS}})
    per = {"MoT-GRPO": [], "GRPO": []}
    for seed in seeds:
        budget = None
        for arm in per:  # MoT-GRPO first: its tokens are GRPO's budget
            steps_rows, f1 = run_arm(kit, start, train, held, arm, steps if budget is None else 2 * steps, seed=seed,
                                     queries=2 if smoke else 4, categories=MEMT_TRAIN_CATEGORIES,
                                     max_rollout_tokens=budget)  # fmt: skip
            tokens = sum(r["rollout_tokens"] for r in steps_rows)
            per[arm].append({**f1, "rollout_tokens": tokens, "steps": len(steps_rows),
                             "mixed_groups": sum(r["mixed_groups"] for r in steps_rows) / len(steps_rows)})  # fmt: skip
            budget = max(tokens, 1)
    rows += [{"arm": arm, "seeds": len(p)} | _over_seeds(p, MEMT_KEYS)
             | {f"{key}_seeds": [r.get(key) for r in p] for key in ("overall", "multi-hop")}
             for arm, p in per.items()]  # fmt: skip
    return {"rows": rows, "seeds": list(seeds), "size": size, "steps": steps, "questions": len(first)}


def memt_summary(study: dict) -> dict:
    """What ``docs/results.md`` judges (record ``memt_long``): overall and multi-hop F1 (mean, std), rollout
    tokens, steps and the share of training questions with mixed leaves (``mixed_groups``: the ones with any
    advantage; None for the start) of MoT-GRPO, GRPO and the start, with the stream size, steps and held-out questions."""
    a = _by_arm(study)
    out = {k: study[k] for k in ("size", "steps", "questions")} | {"seeds": len(study["seeds"])}
    for key, arm in (("start", "SFT start"), ("mot", "MoT-GRPO"), ("grpo", "GRPO")):
        for m, name in (("f1", "overall"), ("f1_multihop", "multi-hop"), ("rollout_tokens", "rollout_tokens"),
                        ("mixed_groups", "mixed_groups"), ("steps", "steps")):  # fmt: skip
            out[f"{m}_{key}"], out[f"{m}_{key}_std"] = a[arm].get(name), a[arm].get(f"{name}_std")
    return out
