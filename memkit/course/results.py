"""Each paper's claims beside what memkit measured: ``docs/results.md``, written by ``memkit reproduce``.

A :class:`Claim` names a paper's table or figure, says what the paper reports, and judges the
numbers one notebook recorded (:func:`memkit.course.nb.record_all`) in a run of ``memkit reproduce``:

    status = judge(records)  in  {"shape reproduced", "not reproduced", "not applicable", "not run"}

"Shape" because memkit runs a 1.2M-parameter model on a synthetic world: a claim is reproduced
when the direction and the mechanism hold (a gain outside the seed spread, a curve that rises),
never the paper's absolute numbers. A SMOKE run is too small to judge a claim about learning
(``Claim.learned``); claims about scripted policies and exact computations are judged on it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from memkit.course.judges import (  # noqa: F401  (the statuses: this page's vocabulary, re-exported)
    NOT_APPLICABLE,
    NOT_REPRODUCED,
    NOT_RUN,
    REPRODUCED,
    Verdict,
    exact_packing,
    flat_context,
    gain,
    inter_over_intra,
    long_horizon,
    mem1_flat_peak,
    mem1_lead_grows,
    memact_limit_note,
    mempo_k3_note,
    mempo_p_curves,
    memt_long_note,
    memt_tokens,
    positive,
    real_peak,
    rises,
    study_gain,
    tokens_vs_react,
)
from memkit.lab.compare import results_section
from memkit.lab.real_compare import real_results_section


@dataclass(frozen=True)
class Claim:
    """One claim of a paper, judged on the records of one notebook."""

    paper: str
    source: str  # the paper's table / figure / section
    says: str  # what the paper reports
    notebook: str  # the notebook stem whose records judge it
    judge: Callable[[dict[str, Any]], Verdict]
    learned: bool = True  # judged on a trained model: a SMOKE run's records do not count


# A table, one claim a row, kept as it reads (not one argument a line):
# fmt: off
CLAIMS: tuple[Claim, ...] = (
    Claim("MEM1", "Fig. 2", "peak context tokens stay almost constant from 1 to 16 objectives (3.7x less memory than Qwen2.5-14B at 16); full-context baselines grow linearly",
          "01_rollouts_and_memory_cost", mem1_flat_peak, learned=False),
    Claim("MEM1", "§3.3, Fig. 2 (real QA)", "on multi-objective QA over Wikipedia, MEM1's peak context stays far below a full-context agent's as objectives are added",
          "07_real_data", real_peak, learned=False),
    Claim("MEM1", "App. B.7", "one packed forward over the stitched trajectory gives each call's log-probs",
          "02_mem1_masked_trajectories", exact_packing, learned=False),
    Claim("MEM1", "Tab. 5, App. F.1", "RL beats SFT (GPT-4o trajectories) on 2 objectives",
          "02_mem1_masked_trajectories", positive("rl_em_gain_k2", "RL - SFT EM at k = 2")),
    Claim("MEM1", "Tab. 5", "RL's lead over SFT grows with the number of objectives; SFT collapses at 8-16 (RL trained on 2 objectives, SFT on 2 then 1 and 3)",
          "02_mem1_masked_trajectories", mem1_lead_grows),
    Claim("MEM1", "§4, Fig. 2", "trained on 2 objectives, MEM1 generalises to 16 (valid, near-constant memory: 27.1% of Qwen2.5-14B's peak tokens at 16)",
          "02_mem1_masked_trajectories", lambda r: long_horizon(r, "generalises")),
    Claim("MEM1", "Tab. 5 (long horizons)", "RL's lead over SFT grows with the number of objectives (the row above), judged in notebook 02's long-horizon study: one question at a time (docs/deviations.md, Notebook 02, 10), SFT and RL from one teacher, RL's reward with a cost per repeated query (11)",
          "02_mem1_masked_trajectories", lambda r: long_horizon(r, "lead")),
    Claim("MemSearcher", "Fig. 3", "tokens in context stay flat over turns; ReAct's grow",
          "03_memsearcher_multicontext_grpo", flat_context, learned=False),
    Claim("MemSearcher", "Tab. 2", "RL training lifts average EM 14.4 -> 43.8 (3B) and 25.8 -> 48.9 (7B) over the same workflow untrained",
          "03_memsearcher_multicontext_grpo", lambda r: gain(r, "em_k2_rl", "em_k2_sft_start")),
    Claim("MemSearcher", "Fig. 5", "training and validation reward rise fast for ~25 steps, then slowly",
          "03_memsearcher_multicontext_grpo", rises("rl_val_reward_start", "rl_val_reward_end", "reward")),
    Claim("MemPO", "Fig. 3", "MemPO's memory reward beats vanilla GRPO with the same memory format, other settings equal",
          "04_mempo_memory_reward", lambda r: gain(r, "em_mempo", "em_grpo", "em_mempo_std", "em_grpo_std")),
    Claim("MemPO", "Fig. 4", "P[ans | mem] of MemPO's memories rises over the first steps while GRPO's falls",
          "04_mempo_memory_reward", mempo_p_curves),
    Claim("MemPO", "Fig. 5", "MemPO's memories make the answer more likely than GRPO's",
          "04_mempo_memory_reward", lambda r: gain(r, "mem_p_mempo", "mem_p_grpo", "mem_p_mempo_std", "mem_p_grpo_std",
                                                    what="P[ans | mem]")),
    Claim("MemPO", "Fig. 3 (3 questions)", "MemPO's memory reward beats GRPO with the same memory format (the row above), judged where a memory must carry several answers: 3-question tasks, the arms at equal rollout tokens (docs/deviations.md, Notebook 04, 8-9)",
          "04_mempo_memory_reward", study_gain("mempo_k3", "em_mempo", "em_grpo", "EM", mempo_k3_note)),
    Claim("MemPO", "Fig. 5 (3 questions)", "MemPO's memories make the answer more likely than GRPO's (the row above), on 3-question tasks at equal rollout tokens",
          "04_mempo_memory_reward", study_gain("mempo_k3", "mem_p_mempo", "mem_p_grpo", "P[ans | mem]", mempo_k3_note)),
    Claim("MemPO", "Tab. 2", "memory formats spend far fewer tokens than ReAct (MemPO: 67.6% fewer than ReAct, 73.1% fewer than GRPO without a memory)",
          "01_rollouts_and_memory_cost", tokens_vs_react, learned=False),
    Claim("MemAct", "§5, Tab. 1", "RL improves MemAct over its SFT version (multi-objective accuracy 0.485 -> 0.591)",
          "05_memact_dcpo", lambda r: gain(r, "em_dcpo", "em_start", "em_dcpo_std")),
    Claim("MemAct", "§5", "learned memory actions beat pruning every five turns, which saves context but loses accuracy",
          "05_memact_dcpo", lambda r: gain(r, "em_dcpo", "em_fixed", "em_dcpo_std", "em_fixed_std")),
    Claim("MemAct", "§5, Tab. 1 (a limit that binds)", "RL improves MemAct over its SFT version (the row above), judged under a context limit the SFT agent overflows (260 tokens; docs/deviations.md, Notebook 05, 6)",
          "05_memact_dcpo", study_gain("memact_limit", "em_dcpo", "em_start", "EM", memact_limit_note)),
    Claim("MemAct", "§5, Tab. 1 (a limit that binds)", "learned memory actions beat pruning at a fixed interval (the row above), under a context limit that binds, at equal rollout tokens",
          "05_memact_dcpo", study_gain("memact_limit", "em_dcpo", "em_fixed", "EM", memact_limit_note)),
    Claim("Mem-T", "Fig. 3 (token axis)", "Mem-T lies on the F1 / token Pareto front: far fewer tokens per query than full context",
          "00_tour", memt_tokens, learned=False),
    Claim("Mem-T", "Tab. 4", "retrieval optimisation matters: without it overall F1 drops 5.28 (58.65 -> 53.37)",
          "06_memt_tree_backprop", lambda r: gain(r, "f1_MoT-GRPO", "f1_start", "f1_MoT-GRPO_std", what="F1")),
    Claim("Mem-T", "Tab. 2", "MoT-GRPO beats GRPO from the same start: overall F1 58.65 vs 53.56 (untrained 49.38)",
          "06_memt_tree_backprop", lambda r: gain(r, "f1_MoT-GRPO", "f1_GRPO", "f1_MoT-GRPO_std", "f1_GRPO_std",
                                                   what="F1")),
    Claim("Mem-T", "Tab. 2 (longer streams)", "MoT-GRPO beats GRPO from the same start (the row above), on 10-session streams with RL on their multi-hop questions, where a tree's leaves can differ (docs/deviations.md, Notebook 06, 8)",
          "06_memt_tree_backprop", study_gain("memt_long", "f1_mot", "f1_grpo", "F1", memt_long_note)),
    Claim("Mem-T", "Tab. 2 (longer streams, multi-hop)", "MoT-GRPO beats GRPO on multi-hop questions (Tab. 2's multi-hop column), in the same study",
          "06_memt_tree_backprop", study_gain("memt_long", "f1_multihop_mot", "f1_multihop_grpo", "multi-hop F1", memt_long_note)),
    Claim("Mem-T", "Tab. 4", "removing A_inter hurts more (-4.56 F1) than removing A_intra (-1.70)",
          "06_memt_tree_backprop", inter_over_intra),
    Claim("Mem-T", "Tab. 4", "construction optimisation matters: without it overall F1 drops 3.29 (58.65 -> 55.36)",
          "06_memt_tree_backprop", lambda r: gain(r, "cons_f1_hindsight SFT", "cons_f1_start",
                                                   "cons_f1_hindsight SFT_std", what="F1")),
    Claim("Mem-T", "§3.3", "hindsight credit picks the construction operations worth cloning (no ablation number given)",
          "06_memt_tree_backprop", lambda r: gain(r, "cons_f1_hindsight SFT", "cons_f1_w/o hindsight",
                                                   "cons_f1_hindsight SFT_std", "cons_f1_w/o hindsight_std", what="F1")),
)
# fmt: on


def judge_all(records_by_notebook: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One row per claim: paper, source, says, notebook, status, measured.

    shape: ``records_by_notebook[stem] = {record name: value}``; a stem absent -> status "not run"."""
    rows = []
    for c in CLAIMS:
        records = records_by_notebook.get(c.notebook)
        if records is None:
            status, measured = NOT_RUN, "-"
        elif c.learned and records.get("_smoke"):
            status, measured = NOT_RUN, "SMOKE run only: too small to learn"
        else:
            status, measured = c.judge(records)
        rows.append(
            {
                "paper": c.paper,
                "source": c.source,
                "says": c.says,
                "notebook": c.notebook,
                "status": status,
                "measured": measured,
            }
        )
    return rows


def records_from_runs(run_dirs: list[str | Path]) -> tuple[dict[str, dict], list[dict]]:
    """The records of every notebook that ran ok in ``run_dirs`` (``summary.json`` of ``memkit
    reproduce``; a lab run beats a SMOKE run, else a later directory wins) and each run's meta."""
    by_nb, metas = {}, []
    for d in run_dirs:
        path = Path(d) / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not a run of `memkit reproduce` (no summary.json)")
        summary = json.loads(path.read_text(encoding="utf-8"))
        metas.append({"run": Path(d).name, **summary.get("meta", {})})
        smoke = bool(summary.get("meta", {}).get("smoke"))
        for n in summary.get("notebooks", []):
            if n.get("ok") and not (smoke and by_nb.get(n["name"], {}).get("_smoke") is False):
                by_nb[n["name"]] = {**n.get("records", {}), "_run": Path(d).name, "_smoke": smoke}
    return by_nb, metas


def render_results(records_by_notebook: dict[str, dict], metas: list[dict]) -> str:
    """``docs/results.md``: the claims table, then the runs it was judged on."""
    rows = judge_all(records_by_notebook)
    smoke = any(v.get("_smoke") for v in records_by_notebook.values())
    lines = [
        "# Results: the papers' claims beside memkit's measurements",
        "",
        "Generated by `memkit reproduce` (`make reproduce` writes this file; `memkit results RUN_DIR ...` "
        'regenerates it from earlier runs). Do not edit by hand. "Shape reproduced" = the direction and '
        "mechanism hold on the tiny model and the synthetic world, not the paper's absolute numbers; the "
        "3-seed studies and their history are in `docs/findings.md`.",
        "",
    ]
    if smoke:
        lines += [
            'Some notebooks come from a **SMOKE run** here: their learning claims say "not run" (run '
            "`make reproduce`); what they measure on scripted policies is judged.",
            "",
        ]
    counts = {s: sum(r["status"] == s for r in rows) for s in (REPRODUCED, NOT_REPRODUCED, NOT_APPLICABLE, NOT_RUN)}
    lines += [
        ", ".join(f"{n} {s}" for s, n in counts.items()),
        "",
        "| paper | source | the paper reports | memkit measured | status | notebook |",
        "|---|---|---|---|---|---|",
    ]
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731  (a "|" would end the table cell)
    lines += [
        f"| {r['paper']} | {r['source']} | {cell(r['says'])} | {cell(r['measured'])} | **{r['status']}** "
        f"| `{r['notebook']}` |"
        for r in rows
    ]
    lines += [
        *results_section(records_by_notebook.get("08_head_to_head", {})),
        *real_results_section(records_by_notebook.get("07_real_data", {})),
        "",
        "## Runs",
        "",
        "| run | mode | model | seed | seeds per arm | lanes | started | wall minutes | notebooks |",
        "|---|---|---|---|---|---|---|---:|---|",
    ]
    for m in metas:
        nbs = sorted(k for k, v in records_by_notebook.items() if v.get("_run") == m["run"])
        wall = f"{m['wall_seconds'] / 60:.1f}" if "wall_seconds" in m else "-"
        if m.get("resumed"):  # a run in parts: the minutes are every part's that recorded them
            wall += f" (in {len(m['resumed']) + 1} parts, resumed {', '.join(m['resumed'])})"
        lines.append(
            f"| `{m['run']}` | {'smoke' if m.get('smoke') else 'lab'} | {m.get('model')} | {m.get('seed')} "
            f"| {m.get('seeds', '-')} | {m.get('jobs', 1)} | {m.get('started', '-')} | {wall} | {', '.join(nbs) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def write_results(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Judge the claims on ``run_dirs`` and write the page atomically to ``out``."""
    from memkit.core.io import atomic_write_text

    by_nb, metas = records_from_runs(run_dirs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render_results(by_nb, metas))
    return out
