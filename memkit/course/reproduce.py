"""Run the notebooks end to end with papermill and write a report: ``memkit reproduce``.

Two modes: SMOKE (``--smoke``: small sizes, what ``make test`` runs, minutes) and the lab
(``SMOKE = False``: the RL lab of :mod:`memkit.lab.recipes`, real learned numbers; under an hour on 2 cores
from an empty cache, about 25 minutes with the clones cached: ~50 one-core minutes of notebooks on
two lanes; docs/findings.md, '`make reproduce` in an hour').
Each notebook runs (:mod:`memkit.course.execute`) in a fresh kernel of *this* Python environment with
its ``parameters`` cell overridden (only the parameters it declares: ``SMOKE``, ``MODEL``, ``SEED``,
``OUT_DIR``). Its executed copy, its record sidecar and its OUT_DIR go into
``runs/<timestamp>/``; ``REPORT.md`` there lists status, seconds and recorded numbers.
A failing notebook is reported and the others still run.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memkit.core.io import atomic_write_text
from memkit.course.execute import NotebookRun, builder_tag, execute_notebook, own_builds, render_report
from memkit.course.nb import repo_root, resolve_kernel


def default_notebooks_dir() -> Path:
    root = repo_root()
    return root / "notebooks" if root and (root / "notebooks").is_dir() else Path.cwd() / "notebooks"


def select_notebooks(names: Sequence[str] | None, notebooks_dir: Path) -> list[Path]:
    """All ``*.ipynb`` in order, or those matching ``names`` (stem, file name, unique prefix, path)."""
    found = sorted(p for p in Path(notebooks_dir).glob("*.ipynb") if not p.name.startswith("."))
    if not names:
        if not found:
            raise FileNotFoundError(f"no notebooks in {notebooks_dir}; pass --notebooks-dir")
        return found
    chosen = []
    for n in names:
        if n.endswith(".ipynb") and Path(n).is_file():
            chosen.append(Path(n))
            continue
        stem = Path(n).stem if n.endswith(".ipynb") else n
        hits = [p for p in found if p.stem == stem] or [p for p in found if p.stem.startswith(stem)]
        if len(hits) != 1:
            why = "matches several" if hits else "matches no notebook"
            raise ValueError(f"--only {n!r} {why}; choose from: {', '.join(p.stem for p in found)}")
        chosen.append(hits[0])
    return chosen


def without_full_study(paths: list[Path]) -> list[Path]:
    """``paths`` less the full-study notebooks (:data:`memkit.lab.recipes.FULL_STUDY_NOTEBOOKS`), which the
    lab mode runs only with ``full`` or when named; all of them when nothing else is left."""
    from memkit.lab.recipes import FULL_STUDY_NOTEBOOKS

    return [p for p in paths if p.stem[:2] not in FULL_STUDY_NOTEBOOKS] or paths


def _new_run_dir(out_root: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        d = out_root / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a fresh run directory under {out_root}")


def cache_checkpoints() -> set[str]:
    """The finished checkpoints in memkit's cache (directories holding ``memkit.json``), relative
    to it: the difference before and after a notebook names the models that notebook trained."""
    from memkit.core.io import cache_dir

    root = cache_dir()
    return {p.parent.relative_to(root).as_posix() for p in root.rglob("memkit.json")}


def _read_summary(run_dir: Path) -> dict[str, Any]:
    """A run directory's summary.json (what :func:`_write_summary` wrote), {} when it has none."""
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_summary(
    run_dir: Path, runs: list[NotebookRun], meta: dict[str, Any], clones: list[NotebookRun] = ()
) -> None:
    """REPORT.md and summary.json as they stand (after every notebook: a killed run can resume)."""
    runs = sorted(runs, key=lambda r: r.name)
    atomic_write_text(run_dir / "REPORT.md", render_report(runs, meta, list(clones)))

    def row(r):
        return {
            "name": r.name,
            "ok": r.ok,
            "seconds": round(r.seconds, 3),
            "error": r.error,
            "trained": r.trained,
            "records": r.records,
        }

    summary = {"meta": meta, "notebooks": [row(r) for r in runs], "clones": [row(c) for c in clones]}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")


def _finished_in(
    run_dir: Path, summary: dict[str, Any], smoke: bool, model: str, seed: int, seeds: int | None = None
) -> dict[str, NotebookRun]:
    """Notebooks that ran ok in ``run_dir`` (its ``summary``) with the same parameters (what ``resume`` skips)."""
    if not summary:
        return {}
    meta = summary.get("meta", {})
    ran_seeds = meta.get("seeds", "notebook default")  # runs before --seeds existed: the notebooks' default
    if (meta.get("smoke"), meta.get("model"), meta.get("seed"), ran_seeds) != (
        smoke,
        model,
        seed,
        seeds or "notebook default",
    ):
        raise ValueError(
            f"{run_dir} ran smoke={meta.get('smoke')}, model={meta.get('model')}, "
            f"seed={meta.get('seed')}, seeds={ran_seeds}; resume it with the same "
            "--smoke/--model/--seed/--seeds or start a new run without --resume"
        )
    return {
        n["name"]: NotebookRun(
            n["name"],
            True,
            n["seconds"],
            run_dir / f"{n['name']}.ipynb",
            run_dir / f"{n['name']}.record.json",
            n.get("records", {}),
            trained=n.get("trained", []),
        )
        for n in summary.get("notebooks", [])
        if n.get("ok")
    }


def _notebook_task(
    path: Path, run_dir: Path, params: dict[str, Any], kernel: str, timeout: float | None
) -> NotebookRun:
    """Run one notebook (never raises) and name the cache checkpoints that appeared meanwhile."""
    cached = cache_checkpoints()
    try:
        r = execute_notebook(path, run_dir, params, strict=False, kernel=kernel, timeout=timeout)
    except Exception as e:  # unreadable notebook, bad parameters cell
        r = NotebookRun(
            path.stem,
            False,
            0.0,
            run_dir / f"{path.stem}.ipynb",
            run_dir / f"{path.stem}.record.json",
            {},
            f"{type(e).__name__}: {e}",
        )
    r.trained = sorted(own_builds(cache_checkpoints() - cached, builder_tag(run_dir, path.stem)))
    return r


def _clone_task(name: str) -> list[str]:
    """Lane task: lab clone ``name`` (:func:`memkit.lab.recipes.ensure_lab_clone`); its cache entry if trained now."""
    from memkit.core.io import cache_dir
    from memkit.lab.recipes import ensure_lab_clone

    before = cache_checkpoints()
    path = ensure_lab_clone(name)
    root = cache_dir()
    return sorted(p for p in cache_checkpoints() - before if path and (root / p).resolve() == Path(path).resolve())


def _lab_tasks(paths: list[Path], run_dir: Path, params, kernel: str, timeout):
    """The lanes' tasks: the notebooks, each after the lab clones it loads (:data:`memkit.lab.recipes.NOTEBOOK_CLONES`)."""
    from memkit.core.lanes import Task
    from memkit.lab.recipes import LAB_CLONES, LAB_NOTEBOOK_MINUTES, NOTEBOOK_CLONES

    uses = {p.stem: NOTEBOOK_CLONES.get(p.stem[:2], ()) for p in paths}
    needed, todo = set(), [c for cs in uses.values() for c in cs]
    while todo:
        c = todo.pop()
        if c not in needed:
            needed.add(c)
            todo += LAB_CLONES[c].needs
    tasks = [
        Task(
            "clone " + c,
            _clone_task,
            (c,),
            tuple("clone " + d for d in LAB_CLONES[c].needs),
            LAB_CLONES[c].minutes,
            wide=LAB_CLONES[c].wide,
        )
        for c in LAB_CLONES
        if c in needed
    ]
    return tasks + [
        Task(
            p.stem,
            _notebook_task,
            (p, run_dir, params(p), kernel, timeout),
            tuple("clone " + c for c in uses[p.stem]),
            LAB_NOTEBOOK_MINUTES.get(p.stem[:2], 5.0),
        )
        for p in paths
    ]


def reproduce(
    smoke: bool = True,
    model: str = "tiny",
    notebooks: Sequence[str] | None = None,
    out_root: str | Path = "runs",
    kernel: str | None = None,
    *,
    seed: int = 0,
    notebooks_dir: str | Path | None = None,
    timeout: float | None = None,
    resume: str | Path | None = None,
    results: str | Path | None = None,
    stream=None,
    jobs: int = 1,
    seeds: int | None = None,
    full: bool = False,
) -> Path:
    """Run the notebooks into ``out_root/<timestamp>/`` and write ``REPORT.md`` there.

    ``smoke``: SMOKE=True (small sizes, minutes) or the lab mode (SMOKE=False: learned numbers,
    docs/reference.md 'The lab mode'; the SFT checkpoints are cached across notebooks and runs,
    and the report names the ones each notebook trained). ``jobs`` > 1 (lab mode, tiny model): the
    lab's clones and the notebooks run side by side on that many lanes (:mod:`memkit.core.lanes`), each
    notebook once its clones are trained. ``seeds``: the ``N_SEEDS`` parameter of the notebooks that
    declare it (04-06, 08: seeds per arm, one by default; 02: §9's RL seeds, three by default). ``full``: the lab mode also runs the
    full-study notebooks (:data:`memkit.lab.recipes.FULL_STUDY_NOTEBOOKS`: 08), which otherwise run only
    when ``notebooks`` names them, and the parts the hour-long run leaves out
    (:data:`memkit.lab.recipes.LAB_NOTEBOOK_PARAMS`: notebook 02's long-horizon study, 07's SmolLM2 SFT), with
    SmolLM2 as 07's model when ``model`` is "tiny" (:data:`~memkit.lab.recipes.FULL_STUDY_PARAMS`). ``resume``: an earlier run directory;
    its notebooks that finished ok are kept and the others run again (the report and summary are
    rewritten after every notebook). ``results``: also write the claims page (:mod:`memkit.course.results`)
    there; ``RESULTS.md`` in the run directory is always written.

    Returns the run directory. Per notebook a start and a result line go to ``stream``
    (default stdout). Failures are reported in the line and in the report; see
    ``failed_notebooks(run_dir)`` / the CLI exit status.
    """
    stream = stream or sys.stdout
    if jobs > 1 and (smoke or model != "tiny"):
        raise ValueError(
            "--jobs runs the lab mode's clones and the tiny model's notebooks side by side; SMOKE "
            "notebooks and other models share caches the notebooks fill themselves, one at a time: "
            "drop --jobs (or --smoke / --model)"
        )
    if seeds is not None and seeds < 1:
        raise ValueError(f"--seeds {seeds}: give at least 1 seed per arm (3 for the seed spread)")
    nb_dir = Path(notebooks_dir) if notebooks_dir else default_notebooks_dir()
    paths = select_notebooks(notebooks, nb_dir)
    hour_run = not (notebooks or smoke or full)  # the lab run make reproduce times: the full study left out
    if hour_run:
        paths = without_full_study(paths)
    kernel_name = resolve_kernel(kernel)
    if resume is not None:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"--resume {run_dir}: no such run directory (see {out_root}/)")
        earlier = _read_summary(run_dir)
        done = _finished_in(run_dir, earlier, smoke, model, seed, seeds)
    else:
        run_dir, done, earlier = _new_run_dir(Path(out_root)), {}, {}
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    meta = {
        "smoke": smoke,
        "model": model,
        "seed": seed,
        "kernel": kernel_name,
        "python": sys.executable,
        "started": now,
        "notebooks_dir": str(nb_dir),
        "jobs": jobs,
        "seeds": seeds or "notebook default",
    }
    wall_before = 0.0
    if resume is not None:  # one run in parts: its first start, each resume, and the wall time of every part
        first = earlier.get("meta", {})
        meta.update(started=first.get("started", now), resumed=[*first.get("resumed", []), now])
        wall_before = first.get("wall_seconds", 0.0)
    mode = "smoke" if smoke else "lab"
    print(
        f"memkit reproduce: {len(paths)} notebook(s), {mode} mode, model={model}, "
        f"seed={seed}, jobs={jobs} -> {run_dir}",
        file=stream,
        flush=True,
    )

    lab_params = {}
    if hour_run:
        from memkit.lab.recipes import LAB_NOTEBOOK_PARAMS as lab_params
    elif not smoke and model == "tiny":
        from memkit.lab.recipes import FULL_STUDY_PARAMS as lab_params

    def params(p: Path) -> dict[str, Any]:
        return {
            "SMOKE": smoke,
            "MODEL": model,
            "SEED": seed,
            "OUT_DIR": str((run_dir / p.stem).resolve()),
            **({"N_SEEDS": seeds} if seeds else {}),
            **lab_params.get(p.stem[:2], {}),
        }

    runs = [done[p.stem] for p in paths if p.stem in done]
    todo = [p for p in paths if p.stem not in done]
    tasks = _lab_tasks(todo, run_dir, params, kernel_name, timeout) if jobs > 1 else []
    names = [r.name for r in runs] + ([t.name for t in tasks] if tasks else [p.stem for p in todo])
    index, width = {name: i for i, name in enumerate(names, 1)}, max(map(len, names))
    for r in runs:
        print(
            f"[{index[r.name]}/{len(names)}] {r.name:<{width}}  ok (kept from the resumed run)", file=stream, flush=True
        )
    clones: list[NotebookRun] = []
    t_all = time.perf_counter()

    def started(name: str, where: str = "") -> None:
        print(
            f"[{index[name]}/{len(names)}] {name:<{width}}  running ({time.strftime('%H:%M:%S')}{where})",
            file=stream,
            flush=True,
        )

    def report(r: NotebookRun) -> None:
        (clones if r.name.startswith("clone ") else runs).append(r)
        line = f"[{index[r.name]}/{len(names)}] {r.name:<{width}}  {r.status:<6} {r.seconds:7.1f} s"
        print(line + (f"  {r.error}" if r.error else ""), file=stream, flush=True)
        meta["wall_seconds"] = round(wall_before + time.perf_counter() - t_all, 1)  # so far: a killed run keeps it
        _write_summary(run_dir, runs, meta, clones)

    if jobs > 1:
        from memkit.core.lanes import run_tasks

        def on_done(o) -> None:
            if o.name.startswith("clone "):
                r = NotebookRun(o.name, o.ok, o.seconds, Path(), Path(), error=o.error, trained=o.value or [])
            else:
                r = (
                    o.value
                    if o.ok
                    else NotebookRun(
                        o.name,
                        False,
                        o.seconds,
                        run_dir / f"{o.name}.ipynb",
                        run_dir / f"{o.name}.record.json",
                        {},
                        o.error,
                    )
                )
                clone_dirs = {t for c in clones for t in c.trained}
                r.trained = [t for t in r.trained if t not in clone_dirs]
            report(r)

        from memkit.core.lanes import lane_cores

        meta["jobs"] = len(lane_cores(jobs))  # the lanes there are cores for
        run_tasks(tasks, jobs, on_done, on_start=lambda t, lane: started(t.name, f", lane {lane}"))
        clone_dirs = {t for c in clones for t in c.trained}  # a clone that ended while a notebook ran is the clone's
        for r in runs:
            r.trained = [t for t in r.trained if t not in clone_dirs]
    else:
        for p in todo:
            started(p.stem)
            report(_notebook_task(p, run_dir, params(p), kernel_name, timeout))
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    meta["wall_seconds"] = round(wall_before + time.perf_counter() - t_all, 1)
    _write_summary(run_dir, runs, meta, clones)
    from memkit.course.results import write_results

    for path in [run_dir / "RESULTS.md"] + ([Path(results)] if results else []):
        write_results([run_dir], path)
    n_bad = sum(not r.ok for r in runs)
    print(
        f"{len(runs) - n_bad}/{len(runs)} ok in {meta['wall_seconds']:.0f} s; report: {run_dir / 'REPORT.md'}",
        file=stream,
        flush=True,
    )
    return run_dir


def failed_notebooks(run_dir: str | Path) -> list[str]:
    """Names of the notebooks that failed in a run written by :func:`reproduce`."""
    summary = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
    return [n["name"] for n in summary["notebooks"] if not n["ok"]]
