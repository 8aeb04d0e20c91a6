"""Head-to-head: RL runs of different memory formats side by side, on the same held-out tasks, with the
budget each spent (``memkit compare``; issue 59's table and figure).

Each run directory (``memkit train --out DIR``) brings

* its method and seed (the newest checkpoint's ``memkit.json``),
* its budget, summed over ``metrics.jsonl``: training minutes (``seconds`` per step) and rollout tokens
  (``response_tokens x n_trajectories`` per step: the tokens its policy generated),
* its final policy, evaluated greedily on the *same* held-out tasks at every k
  (:func:`memkit.lab.evaluation.evaluate`: one task set per k for every run).

Runs of one method (seeds) pool into mean and sample std (:func:`by_method`). The Pareto front at a k
(:func:`pareto_front`) holds the runs no other run beats on both axes of MemAct Fig. 3: higher EM with
fewer peak tokens in context.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from memkit.core.io import latest_checkpoint

#: per-k columns of a compare row: summary key -> column prefix
PER_K = {"em": "em", "peak_tokens": "peak", "invalid_rate": "invalid", "seconds": "sec_per_episode"}


def run_budget(run_dir) -> dict:
    """``{run, method, algo, seed, steps, train_minutes, rollout_tokens}`` of a ``memkit train`` run directory."""
    run = Path(run_dir)
    ckpt = latest_checkpoint(run / "checkpoints")
    metrics = run / "metrics.jsonl"
    if ckpt is None or not metrics.is_file():
        raise ValueError(f"{run} is not a finished `memkit train --out` directory (no checkpoints/ or metrics.jsonl)")
    config = json.loads((ckpt / "memkit.json").read_text())["config"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return {
        "run": str(run),
        "method": config["method"],
        "algo": config.get("algo"),
        "seed": config.get("seed"),
        "steps": len(rows),
        "train_minutes": sum(r["seconds"] for r in rows) / 60,
        "rollout_tokens": sum(r["response_tokens"] * r["n_trajectories"] for r in rows),
    }


def compare_runs(run_dirs, kit, objectives=(1, 2, 4), n_tasks: int = 50, seed: int = 1000) -> list[dict]:
    """One row per run: :func:`run_budget` and, at each k, ``em@k``, ``peak@k``, ``invalid@k`` and
    ``sec_per_episode@k`` of its final policy on ``held_out_tasks(kit.world, n_tasks, k, seed)``."""
    from memkit.lab.evaluation import evaluate

    rows = []
    for run_dir in run_dirs:
        row = run_budget(run_dir)
        if row["method"] == "memt":
            raise ValueError(
                f"{run_dir} is a Mem-T run: it answers conversation streams, not wiki tasks; compare it with "
                "`memkit eval --method memt --policy RUN`"
            )
        for k, (summary, _) in evaluate(
            row["method"], kit, objectives, n_tasks, policy=str(run_dir), seed=seed
        ).items():
            row |= {f"{col}@{k}": summary[key] for key, col in PER_K.items()}
        rows.append(row)
    return rows


def by_method(rows: list[dict]) -> list[dict]:
    """Rows pooled per method: ``runs`` and, for every number, its mean and sample std (``<key>_std``;
    0 for one run), in the order methods first appear."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        group = [r for r in rows if r["method"] == method]
        row = {"method": method, "runs": len(group)}
        for key, value in group[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "seed":
                xs = [g[key] for g in group]
                mean = sum(xs) / len(xs)
                var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
                row |= {key: mean, f"{key}_std": math.sqrt(var)}
        out.append(row)
    return out


def pareto_front(rows: list[dict], k: int) -> list[int]:
    """Indices of the rows no other row dominates at ``k``: none has EM >= and peak tokens <= with one
    of the two strictly better."""

    def beats(a, b):
        ge, le = a[f"em@{k}"] >= b[f"em@{k}"], a[f"peak@{k}"] <= b[f"peak@{k}"]
        return ge and le and (a[f"em@{k}"] > b[f"em@{k}"] or a[f"peak@{k}"] < b[f"peak@{k}"])

    return [i for i, r in enumerate(rows) if not any(beats(o, r) for o in rows)]


def format_compare(rows: list[dict], objectives) -> str:
    """The table ``memkit compare`` prints: per method (mean +- std over its runs), budget then EM and
    peak tokens at each k."""
    pooled = by_method(rows)
    head = f"{'method':<13}{'runs':>5}{'minutes':>16}{'rollout tokens':>22}"
    head += "".join(f"{'EM@' + str(k):>16}{'peak@' + str(k):>12}" for k in objectives)
    lines = [head]
    for r in pooled:
        line = f"{r['method']:<13}{r['runs']:>5}{_pm(r, 'train_minutes', 1):>16}{_pm(r, 'rollout_tokens', 0):>22}"
        line += "".join(f"{_pm(r, f'em@{k}', 3):>16}{r[f'peak@{k}']:>12.0f}" for k in objectives)
        lines.append(line)
    return "\n".join(lines)


def _pm(row: dict, key: str, digits: int) -> str:
    return f"{row[key]:.{digits}f} +- {row[key + '_std']:.{digits}f}"


def plot_pareto(rows: list[dict], k: int, path) -> Path:
    """EM against peak tokens at ``k``, one point per run, one colour per method, the Pareto front joined
    (MemAct Fig. 3's axes); saved to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        pts = [(r[f"peak@{k}"], r[f"em@{k}"]) for r in rows if r["method"] == method]
        ax.scatter(*zip(*pts), label=method, s=36)
    front = sorted((rows[i][f"peak@{k}"], rows[i][f"em@{k}"]) for i in pareto_front(rows, k))
    ax.plot(*zip(*front), "k--", lw=1, label="Pareto front")
    ax.set(xlabel=f"peak tokens in context (k = {k})", ylabel=f"EM (k = {k})", title="memory formats, one budget each")
    ax.legend(fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


__all__ = ["PER_K", "by_method", "compare_runs", "format_compare", "pareto_front", "plot_pareto", "run_budget"]
