"""The head-to-head on real composites: one pretrained chat model behaviour-cloned into every memory format
(SFT only), scored on the same held-out real questions (notebook 07 §7; issue 59's last item).

Notebook 08's tiny-model head to head gives each format an RL budget. A pretrained model on this CPU
trains at ~110 tokens a second, so here each format gets what notebook 07 gives MEM1: LoRA SFT of
SmolLM2-135M-Instruct on the scripted teacher's trajectories of the same real composites (the offline set's
sft questions, k = 1, 2), for the same wall-clock minutes, from the same base and LoRA seed
(:func:`real_sft_config`). Nothing here is RL; the rows say so (:data:`SFT_TAG`).

Per format (:func:`real_h2h`): the SFT budget it spent (minutes, optimizer steps, calls cloned, from the
checkpoint's ``memkit.json``: :func:`memkit.lab.compare.sft_budget`), then on ``n`` held-out composites per k, greedily, the
columns of :func:`memkit.lab.compare.evaluated` (EM, peak tokens, dependency, invalid rate, seconds per
episode) and the scripted teacher's peak tokens on the same tasks, counted in the model's own tokens and chat
template (the calls SFT cloned): what the format costs once the model follows it.
"""

from __future__ import annotations

from memkit.lab.compare import SFT_TAG, evaluated, method_label, sft_budget


def real_sft_config(method: str, base: str, data, *, seed: int = 0, minutes: float = 12.0, smoke: bool = False,
                    method_kwargs: dict | None = None):  # fmt: skip
    """Notebook 07's LoRA SFT of a pretrained ``base`` on ``data``'s composites, for any format: 400 teacher
    tasks of k = 1, 2 (SMOKE 8), LoRA r 32 / alpha 64 on every linear layer, 4 calls a step, ``minutes`` of
    wall clock (data included; SMOKE: 3 steps). The same recipe for every contestant, so only the format
    differs; with ``method="mem1"`` it is notebook 07's run (one cache entry)."""
    from memkit.rl.groups import LoRAConfig
    from memkit.train.config import SFTConfig

    return SFTConfig(
        method=method, method_kwargs=dict(method_kwargs or {}), init=base, data=data, seed=seed, objectives=(1, 2),
        lora=LoRAConfig(enabled=True, r=32, alpha=64, targets="all-linear"),
        n_tasks=8 if smoke else 400, steps=3 if smoke else 400, batch_size=4, log_every=1,
        max_seconds=None if smoke else 60.0 * minutes,
    )  # fmt: skip


def real_h2h(kit, contestants: dict, base: str, data, *, minutes: float = 12.0, objectives=(1, 2), n_tasks: int = 10,
             seed: int = 0, eval_seed: int = 1000, cap: int = 256, smoke: bool = False, progress: bool = False):  # fmt: skip
    """One row per contestant (``{name: (format, options)}``) on ``kit`` (a :func:`memkit.lab.real.data_kit`):
    ``base`` SFT'd into the format by :func:`real_sft_config` (cached: :func:`memkit.lab.runs.ensure_sft`),
    :func:`~memkit.lab.compare.sft_budget`, the :func:`~memkit.lab.compare.evaluated` columns on ``n_tasks``
    held-out composites per k (``cap``: output tokens a call may write) and ``teacher_peak@k``, the scripted teacher's peak tokens
    on the same tasks in the model's tokens. ``method``: the format's label plus :data:`SFT_TAG`."""
    from tqdm.auto import tqdm

    from memkit.lab.policies import load_spec
    from memkit.lab.runs import ensure_sft

    rows = []
    for name in tqdm(contestants, desc="SFT + evaluate", disable=not progress, leave=False):
        fmt, kw = contestants[name]
        cfg = real_sft_config(fmt, base, data, seed=seed, minutes=minutes, smoke=smoke, method_kwargs=kw)
        sft_dir = ensure_sft(fmt, kit, cfg, progress=False)
        policy = load_spec(str(sft_dir), fmt, kit, seed)  # loaded once: the model, and the teacher's tokens
        teacher = evaluated(fmt, "oracle", kit, objectives, n_tasks, eval_seed, kw, as_model=policy, prompt="paper")
        row = {"method": method_label(fmt, kw) + SFT_TAG, "format": fmt, "run": str(sft_dir), "seed": seed}
        row |= sft_budget(sft_dir) | evaluated(fmt, policy, kit, objectives, n_tasks, eval_seed, kw, min_new_tokens=cap)
        rows.append(row | {f"teacher_peak@{k}": teacher[f"peak@{k}"] for k in objectives})
    return rows


def real_results_section(records: dict) -> list[str]:
    """docs/results.md's section of notebook 07 §7's records (``real_h2h``: per format its SFT minutes and
    steps, valid rate, EM, model's and teacher's peak tokens at each k of ``real_h2h_ks``), best EM first;
    [] when the section did not run (``SFT_MINUTES = 0``, the hour-long ``make reproduce``) or ran under SMOKE
    (a 2-layer random stand-in: its numbers mean nothing)."""
    h2h, ks = records.get("real_h2h"), records.get("real_h2h_ks")
    if not h2h or not ks or records.get("_smoke"):
        return []
    react = next((r for m, r in h2h.items() if m.startswith("react")), None)
    lines = [
        "",
        f"## Head to head on real composites (notebook 07 §7): {records.get('real_h2h_model', '?')} + LoRA, SFT only",
        "",
        f"Not RL: every format behaviour-cloned from the same base for the same CPU minutes, then scored greedily "
        f"on {records.get('real_h2h_n', '?')} held-out composites of real questions per k, one seed. No paper's "
        "claim is judged on it; teacher peak = the scripted teacher's on the same tasks, in the model's tokens.",
        "",
        "| format | SFT minutes | steps |"
        + "".join(f" valid k={k} | EM k={k} | peak k={k} | teacher peak k={k} |" for k in ks),
        "|---|---:|---:|" + "---:|---:|---:|---:|" * len(ks),
    ]
    for m, r in sorted(h2h.items(), key=lambda kv: -sum(kv[1][f"em@{k}"] for k in ks)):
        cols = "".join(
            f" {1 - r[f'invalid@{k}']:.2f} | {r[f'em@{k}']:.2f} | {r[f'peak@{k}']:.0f} | {r[f'teacher_peak@{k}']:.0f}"
            + (f" ({r[f'teacher_peak@{k}'] / react[f'teacher_peak@{k}']:.2f}x ReAct)" if react else "")
            + " |"
            for k in ks
        )
        lines.append(f"| {m} | {r['minutes']:.1f} | {r['steps']} |{cols}")
    return lines


__all__ = ["real_h2h", "real_results_section", "real_sft_config"]
