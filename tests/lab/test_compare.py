"""``memkit compare`` (memkit.lab.compare): runs of different formats on the same held-out tasks, with
the budgets they spent; built from real (short) training runs of the tiny model."""

from __future__ import annotations

import json
import math

import pytest

from memkit.lab.compare import (
    by_method,
    compare_runs,
    evaluated,
    method_label,
    pareto_front,
    results_section,
    run_budget,
)
from tests.rl.test_trainer import _loop_cfg


@pytest.fixture(scope="module")
def runs(kit, tmp_path_factory):
    """Two GRPO steps each of MEM1 (2 seeds) and MemSearcher (1 seed) from the random tiny model."""
    from memkit.lab.runs import train

    root, out = tmp_path_factory.mktemp("runs"), []
    for method, seed in (("mem1", 0), ("mem1", 1), ("memsearcher", 0)):
        path = root / f"{method}-s{seed}"
        train(_loop_cfg(path, 2, algo="grpo", method=method, seed=seed, eval_every=0), kit, progress=False)
        out.append(path)
    return out


def test_a_runs_budget_is_what_its_steps_spent(runs):
    """Rollout tokens = the response tokens the updates trained (``trained_tokens``: every generated
    token is trained under GRPO), minutes = the steps' seconds; method and seed from the checkpoint."""
    for path in runs:
        b = run_budget(path)
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        assert b["steps"] == 2 and b["method"] == path.name.split("-")[0] and b["seed"] == int(path.name[-1])
        assert b["rollout_tokens"] == pytest.approx(sum(r["trained_tokens"] for r in rows))
        assert b["train_minutes"] == pytest.approx(sum(r["seconds"] for r in rows) / 60) and b["train_minutes"] > 0


def test_every_run_is_evaluated_on_the_same_tasks_as_memkit_eval(runs, kit):
    """Each row's per-k numbers are :func:`memkit.lab.evaluation.evaluate`'s for that run's policy on the
    held-out tasks of the given seed (the same tasks for every run)."""
    from memkit.lab.evaluation import evaluate

    rows = compare_runs(runs, kit, objectives=(1, 2), n_tasks=3, seed=7)
    for row, path in zip(rows, runs):
        res = evaluate(row["method"], kit, (1, 2), 3, policy=str(path), seed=7)
        for k, (summary, _) in res.items():
            assert row[f"peak@{k}"] == summary["peak_tokens"] > 0 and row[f"em@{k}"] == summary["em"]
            assert row[f"invalid@{k}"] == summary["invalid_rate"]
    pooled = by_method(rows)
    assert [(p["method"], p["runs"]) for p in pooled] == [("mem1", 2), ("memsearcher", 1)]
    a, b = rows[0]["peak@2"], rows[1]["peak@2"]
    assert pooled[0]["peak@2"] == pytest.approx((a + b) / 2)
    assert pooled[0]["peak@2_std"] == pytest.approx(abs(a - b) / math.sqrt(2)) and pooled[1]["peak@2_std"] == 0.0


def test_a_baseline_schedule_is_its_own_row_and_evaluated_under_its_schedule(kit, tmp_path):
    """A MemAct run under the sliding window (``method_kwargs``) is labelled ``memact[window=1]`` and
    evaluated with the window (no prune tool): its numbers equal ``evaluate(..., method_kwargs=...)``'s."""
    from memkit.lab.evaluation import evaluate
    from memkit.lab.runs import train

    window = dict(schedule="window", window=1)
    path = tmp_path / "memact-window"
    train(_loop_cfg(path, 1, algo="grpo", method="memact", method_kwargs=window, eval_every=0), kit, progress=False)
    (row,) = compare_runs([path], kit, objectives=(2,), n_tasks=3, seed=7)
    assert row["method"] == "memact[window=1]" == method_label("memact", window) and row["format"] == "memact"
    res = evaluate("memact", kit, (2,), 3, policy=str(path), seed=7, method_kwargs=window)
    assert row["peak@2"] == res[2][0]["peak_tokens"] and row["em@2"] == res[2][0]["em"]
    # the options reach the rollout (the teacher's contexts shrink under a one-record window)
    assert (
        evaluated("memact", "oracle", kit, (2,), 3, 7, window)["peak@2"]
        < evaluated("memact", "oracle", kit, (2,), 3, 7)["peak@2"]
    )
    assert method_label("memact", dict(schedule="fixed", interval=3)) == "memact[fixed,interval=3]"
    assert method_label("mem1", {}) == "mem1"


def test_a_run_is_evaluated_under_the_context_limit_it_trained_under(kit, tmp_path):
    """A run trained with ``max_context_tokens`` L (MemAct's limit that binds) is evaluated with L, as the
    trainer's own evaluations are: its row equals ``evaluate(..., max_context_tokens=L)``'s, not the
    unlimited evaluation's (20 tokens: every episode ends at its first context, before generating)."""
    from memkit.lab.evaluation import evaluate
    from memkit.lab.runs import train

    path = tmp_path / "memact-limit"
    train(_loop_cfg(path, 1, algo="grpo", method="memact", max_context_tokens=20, eval_every=0), kit, progress=False)
    (row,) = compare_runs([path], kit, objectives=(2,), n_tasks=3, seed=7)
    assert row["context_limit"] == 20 and row["invalid@2"] == 1.0
    limited = evaluate("memact", kit, (2,), 3, policy=str(path), seed=7, max_context_tokens=20)[2][0]
    unlimited = evaluate("memact", kit, (2,), 3, policy=str(path), seed=7)[2][0]
    assert row["peak@2"] == limited["peak_tokens"] != unlimited["peak_tokens"]


def test_pareto_front_keeps_the_runs_nothing_beats_on_both_axes():
    rows = [
        {"em@2": 0.5, "peak@2": 100},  # front
        {"em@2": 0.4, "peak@2": 120},  # beaten by 0
        {"em@2": 0.7, "peak@2": 300},  # front: the best EM
        {"em@2": 0.5, "peak@2": 100},  # a tie with 0: neither beats the other
        {"em@2": 0.2, "peak@2": 50},  # front: the fewest tokens
    ]
    assert pareto_front(rows, 2) == [0, 2, 3, 4]


def test_pareto_figure_tells_every_contestant_and_its_start_apart():
    """Notebook 08's figure: eight formats and their eight starts (16 labels, more than one colour cycle):
    each format its own colour, its start hollow in that colour."""
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure

    from memkit.lab.compare import START, draw_pareto

    names = ["react", "mem1", "memsearcher", "mempo", "memact", "amem", "memact[window=3]", "memact[summary,window=3]"]
    rows = [
        {"method": m + s, "em@2": i / 20, "peak@2": 100 + i}
        for i, (m, s) in enumerate((m, s) for s in ("", START) for m in names)
    ]
    ax = Figure().subplots()
    draw_pareto(ax, rows, 2)
    dots = {c.get_label(): c for c in ax.collections}
    assert len(dots) == 16

    def look(label):
        c = dots[label]
        return tuple(c.get_edgecolor()[0]), tuple(c.get_facecolor()[0]) if len(c.get_facecolor()) else None

    for m in names:
        (edge, face), (start_edge, start_face) = look(m), look(m + START)
        assert edge == start_edge == face and start_face in (None, to_rgba("none")), m
    assert len({look(m)[0] for m in names}) == len(names)


def test_cli_prints_the_table_and_writes_the_figure(runs, tmp_path, capsys):
    from memkit.cli import main

    fig = tmp_path / "figures" / "h2h.png"
    argv = ["compare", *map(str, runs), "--objectives", "1,2", "--n-tasks", "2", "--figure", str(fig)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mem1" in out and "memsearcher" in out and "rollout tokens" in out and "EM@2" in out, out
    assert "dep@2" in out and "s/ep@2" in out and "nan" not in out, out
    assert fig.stat().st_size > 5_000


def test_bad_runs_get_one_clear_error(runs, tmp_path, capsys):
    from memkit.cli import main

    assert main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a finished `memkit train --out` directory" in err and err.count("\n") == 1, err


def test_results_page_section_from_notebook_08s_records():
    """docs/results.md's head-to-head table: best EM first, the front starred, the start's EM beside each;
    dependency and seconds per episode where recorded (runs before them show "-")."""
    from memkit.course.results import render_results

    one = {"em_std": 0.0, "minutes": 3.0, "rollout_tokens": 1e4}
    rec = {
        "h2h": {
            "react": {"em": 0.2, "peak": 900.0, **one},
            "mem1": {"em": 0.5, "peak": 300.0, "dep": 12345.6, "sec_per_episode": 0.25, **one},
        },
        "h2h_starts": {"mem1 (SFT)": 0.3},
        "front": ["mem1"],
        "h2h_k": 4,
        "h2h_seeds": 1,
    }
    lines = results_section(rec)
    rows = [x for x in lines if x.startswith("| mem1") or x.startswith("| react")]
    assert (
        rows[0].startswith("| mem1 * | 0.500") and rows[1].startswith("| react | 0.200") and rows[1].endswith("| - |")
    )
    assert "| 0.300 |" in rows[0] and "k = 4" in "\n".join(lines)
    assert "| 300 | 12,346 | 0.25 | 3.0 |" in rows[0] and "| 900 | - | - | 3.0 |" in rows[1], rows
    del rec["h2h"]["mem1"]["dep"]  # a run that recorded neither: the table leaves both columns out
    assert "dependency" not in "\n".join(results_section(rec)) and "| 300 | 3.0 |" in "\n".join(results_section(rec))
    assert results_section({}) == []
    assert "## Head to head" in render_results({"08_head_to_head": rec}, [])
