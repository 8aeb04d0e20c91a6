"""Head-to-head: RL runs of different memory formats side by side, on the same held-out tasks, with the
budget each spent (``memkit compare``; issue 59's table and figure).

Each run directory (``memkit train --out DIR``) brings

* its method, the method's options (MemAct's ``schedule``: the sliding window is a baseline, labelled
  ``memact[window=3]``) and its seed (the newest checkpoint's ``memkit.json``),
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
from memkit.metrics.efficiency import rollout_tokens

#: per-k columns of a compare row: summary key -> column prefix
PER_K = {
    "em": "em",
    "f1": "f1",
    "peak_tokens": "peak",
    "dependency": "dep",
    "invalid_rate": "invalid",
    "seconds": "sec_per_episode",
}


#: the row-label suffix of a pretrained model's SFT-only row (no RL: the budget is SFT minutes)
SFT_TAG = " (SFT only)"


def sft_budget(sft_dir) -> dict:
    """``{steps, train_minutes, examples, rollout_tokens}`` an SFT checkpoint spent (its ``memkit.json``):
    logged optimizer steps, wall minutes of the optimisation, calls cloned; rollout tokens are 0, no policy
    rolled out."""
    meta_path = Path(sft_dir) / "memkit.json"
    if not meta_path.is_file():
        raise ValueError(f"{sft_dir} is not an SFT checkpoint (no memkit.json); give a `memkit sft --out` directory")
    meta = json.loads(meta_path.read_text())
    history = meta.get("history") or []
    return {
        "steps": history[-1]["step"] + 1 if history else 0,
        "train_minutes": history[-1]["seconds"] / 60 if history else 0.0,
        "examples": meta.get("n_examples", 0),
        "rollout_tokens": 0,
    }


def method_label(method: str, method_kwargs: dict | None = None) -> str:
    """The row label of a format under its options: ``memact`` + ``{"schedule": "window", "window": 3}`` ->
    ``memact[window=3]``, + ``{"schedule": "fixed", "interval": 3}`` -> ``memact[fixed,interval=3]``."""
    kw = dict(method_kwargs or {})
    if not kw:
        return method
    tag = kw.pop("schedule", None)
    parts = [f"{k}={v}" for k, v in sorted(kw.items())]
    return f"{method}[{','.join(([tag] if tag and tag not in kw else []) + parts)}]"


def run_budget(run_dir) -> dict:
    """``{run, method, format, method_kwargs, algo, seed, context_limit, steps, train_minutes, rollout_tokens}`` of
    a ``memkit train`` run directory (``method``: :func:`method_label`, the row's name; ``format``: the registry's;
    ``context_limit``: the ``max_context_tokens`` it trained under). A ``memkit sft`` checkpoint is a row too:
    its SFT budget (:func:`sft_budget`), ``algo`` "sft", its label tagged "(SFT only)"."""
    run = Path(run_dir)
    meta = run / "memkit.json"
    if meta.is_file() and "sft" in (sft := json.loads(meta.read_text())):  # a `memkit sft --out` checkpoint
        cfg = sft["sft"]
        return {
            "run": str(run), "method": method_label(cfg["method"], cfg.get("method_kwargs")) + SFT_TAG,
            "format": cfg["method"], "method_kwargs": cfg.get("method_kwargs") or {}, "algo": "sft",
            "seed": cfg.get("seed"), "context_limit": None, **sft_budget(run),
        }  # fmt: skip
    ckpt = latest_checkpoint(run / "checkpoints")
    metrics = run / "metrics.jsonl"
    if ckpt is None or not metrics.is_file():
        raise ValueError(f"{run} is not a finished `memkit train --out` directory (no checkpoints/ or metrics.jsonl)")
    config = json.loads((ckpt / "memkit.json").read_text())["config"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return {
        "run": str(run),
        "method": method_label(config["method"], config.get("method_kwargs")),
        "format": config["method"],
        "method_kwargs": config.get("method_kwargs") or {},
        "algo": config.get("algo"),
        "seed": config.get("seed"),
        "context_limit": config.get("max_context_tokens"),
        "steps": len(rows),
        "train_minutes": sum(r["seconds"] for r in rows) / 60,
        "rollout_tokens": rollout_tokens(rows),
    }


def compare_runs(run_dirs, kit, objectives=(1, 2, 4), n_tasks: int = 50, seed: int = 1000, **rollout_kw) -> list[dict]:
    """One row per run: :func:`run_budget` and, at each k, ``em@k``, ``peak@k``, ``invalid@k`` and
    ``sec_per_episode@k`` of its final policy on ``held_out_tasks(kit.world, n_tasks, k, seed)``, under its
    method options and the context limit it trained under (a call over it ends the episode as invalid, as in
    the trainer's own evaluations: MemAct's limit that binds). ``rollout_kw``: as :func:`evaluated`'s."""
    rows = []
    for run_dir in run_dirs:
        row = run_budget(run_dir)
        if row["format"] == "memt":
            raise ValueError(
                f"{run_dir} is a Mem-T run: it answers conversation streams, not wiki tasks; compare it with "
                "`memkit eval --method memt --policy RUN`"
            )
        kw, limit = row["method_kwargs"], row["context_limit"]
        rows.append(
            row | evaluated(row["format"], str(run_dir), kit, objectives, n_tasks, seed, kw, limit, **rollout_kw)
        )
    return rows


def evaluated(
    method: str, policy, kit, objectives, n_tasks: int, seed: int, method_kwargs=None, context_limit=None, **rollout_kw
) -> dict:
    """``em@k``, ``f1@k``, ``peak@k``, ``dep@k`` (MEM1's dependency), ``invalid@k``, ``sec_per_episode@k`` of
    ``policy`` (any policy spec, a run directory, a loaded model) greedily on the held-out tasks of
    :func:`compare_runs`: the columns of a start that had no RL (a baseline's row, budget 0) as well as a run's.
    ``context_limit``: the longest context a call may have (None: the model's window); ``rollout_kw``: more
    options of :func:`memkit.lab.evaluation.rollout` (a pretrained model's ``min_new_tokens``)."""
    from memkit.lab.evaluation import evaluate

    res = evaluate(
        method, kit, objectives, n_tasks, policy=policy, seed=seed, method_kwargs=method_kwargs or {},
        max_context_tokens=context_limit, **rollout_kw,
    )  # fmt: skip
    return {f"{col}@{k}": summary[key] for k, (summary, _) in res.items() for key, col in PER_K.items()}


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
    """The table ``memkit compare`` prints: per method (mean +- std over its runs), budget then EM, peak
    tokens, dependency and seconds per episode at each k."""
    pooled = by_method(rows)
    head = f"{'method':<24}{'runs':>5}{'minutes':>16}{'rollout tokens':>22}"
    head += "".join(
        f"{'EM@' + str(k):>16}{'peak@' + str(k):>9}{'dep@' + str(k):>11}{'s/ep@' + str(k):>9}" for k in objectives
    )
    lines = [head]
    for r in pooled:
        line = f"{r['method']:<24}{r['runs']:>5}{_pm(r, 'train_minutes', 1):>16}{_pm(r, 'rollout_tokens', 0):>22}"
        line += "".join(
            f"{_pm(r, f'em@{k}', 3):>16}{r[f'peak@{k}']:>9.0f}{r.get(f'dep@{k}', math.nan):>11,.0f}"
            f"{r.get(f'sec_per_episode@{k}', math.nan):>9.2f}"
            for k in objectives
        )
        lines.append(line)
    return "\n".join(lines)


def _pm(row: dict, key: str, digits: int) -> str:
    return f"{row[key]:.{digits}f} +- {row[key + '_std']:.{digits}f}"


#: the label suffix of a format's start (its SFT model without RL) beside its runs: notebook 08's baseline rows
START = " (SFT)"


def draw_pareto(ax, rows: list[dict], k: int) -> None:
    """EM against peak tokens at ``k`` on ``ax``: one point per row, one colour per method (a start,
    ``"<method> (SFT)"``, hollow in its method's colour; past ten methods the marker changes too), the
    Pareto front (:func:`pareto_front`) joined (MemAct Fig. 3's axes)."""
    labels = list(dict.fromkeys(r["method"] for r in rows))
    methods = list(dict.fromkeys(m.removesuffix(START) for m in labels))
    for label in labels:
        i = methods.index(label.removesuffix(START))
        colour, marker = f"C{i % 10}", "os^Dv"[i // 10 % 5]
        pts = [(r[f"peak@{k}"], r[f"em@{k}"]) for r in rows if r["method"] == label]
        face = "none" if label.endswith(START) else colour
        ax.scatter(*zip(*pts), label=label, s=36, marker=marker, facecolors=face, edgecolors=colour)
    front = sorted((rows[i][f"peak@{k}"], rows[i][f"em@{k}"]) for i in pareto_front(rows, k))
    ax.plot(*zip(*front), "k--", lw=1, label="Pareto front")
    ax.set(xlabel=f"peak tokens in context (k = {k})", ylabel=f"EM (k = {k})", title="memory formats, one budget each")
    many = len(labels) > 8  # beside the axes, not over the points
    ax.legend(fontsize=7 if many else 8, **(dict(loc="upper left", bbox_to_anchor=(1.02, 1)) if many else {}))


def plot_pareto(rows: list[dict], k: int, path) -> Path:
    """:func:`draw_pareto` saved to ``path`` (PNG). A bare ``Figure``: no pyplot backend is switched, so a
    notebook's inline plots are left alone."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 4))
    draw_pareto(fig.subplots(), rows, k)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def results_section(records: dict) -> list[str]:
    """docs/results.md's head-to-head section from notebook 08's records (``h2h``: per method EM, its std,
    peak tokens, dependency and seconds per episode where recorded, minutes and rollout tokens at the largest
    k; ``front``; ``h2h_k``; ``h2h_seeds``), best EM first; [] when the notebook has not run."""
    h2h, k = records.get("h2h"), records.get("h2h_k")
    if not h2h or k is None:
        return []
    front = set(records.get("front", ()))
    lines = [
        "",
        f"## Head to head (notebook 08): one budget, the same held-out tasks, k = {k}",
        "",
        f"Each format from the same teacher's clone, the same RL minutes with its own credit rule "
        f"({records.get('h2h_seeds', 1)} seed(s) each; mean +- std). * = on the EM-vs-peak-tokens Pareto front.",
        "",
    ]
    cost = any("dep" in r for r in h2h.values())  # dependency and s / episode: recorded since 2026-12-05
    lines += [
        f"| method | EM | peak tokens |{' dependency | s / episode |' if cost else ''} RL minutes | rollout tokens "
        "| start's EM |",
        "|---|---|---:|" + "---:|" * (2 * cost) + "---:|---:|---:|",
    ]
    starts = records.get("h2h_starts", {})
    for m, r in sorted(h2h.items(), key=lambda kv: -kv[1]["em"]):
        start = starts.get(m + START)
        dep, sec = r.get("dep"), r.get("sec_per_episode")
        cols = f" {'-' if dep is None else f'{dep:,.0f}'} | {'-' if sec is None else f'{sec:.2f}'} |" if cost else ""
        lines.append(
            f"| {m}{' *' if m in front else ''} | {r['em']:.3f} +- {r['em_std']:.3f} | {r['peak']:.0f} |{cols}"
            f" {r['minutes']:.1f} | {r['rollout_tokens']:,.0f} | {'-' if start is None else f'{start:.3f}'} |"
        )
    return lines


__all__ = [
    "PER_K",
    "SFT_TAG",
    "START",
    "by_method",
    "compare_runs",
    "draw_pareto",
    "evaluated",
    "format_compare",
    "method_label",
    "pareto_front",
    "plot_pareto",
    "results_section",
    "run_budget",
    "sft_budget",
]
