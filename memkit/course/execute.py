"""Run one notebook with papermill: :func:`execute_notebook` and the :class:`NotebookRun` it returns;
:func:`render_report` writes a run's NotebookRuns as its REPORT.md.

The notebook runs in a fresh kernel of *this* Python environment with its ``parameters`` cell
overridden (only the parameters it declares); its executed copy, its record sidecar
(:func:`memkit.course.nb.record_all`) and its log go into one directory. An execution error never
raises: it is returned in ``NotebookRun.error``, so ``memkit reproduce`` (:mod:`memkit.course.reproduce`)
reports it and runs the other notebooks, and the notebook tests fail with it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memkit.core.io import BUILT_BY_ENV
from memkit.course.nb import PAPERMILL_ENV, RECORD_ENV, declared_parameters, load_records, resolve_kernel


@dataclass
class NotebookRun:
    name: str
    ok: bool
    seconds: float
    executed_path: Path
    record_path: Path
    records: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # "ErrorName: message" when not ok
    trained: list[str] = field(default_factory=list)  # checkpoints this run added to the cache

    @property
    def status(self) -> str:
        return "ok" if self.ok else "FAILED"


@contextmanager
def _fd2_to(path: Path):
    """Send file descriptor 2 (ours and the kernel's, which inherits it) to ``path``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def builder_tag(out_dir: str | Path, stem: str) -> str:
    """What a notebook run executed into ``out_dir`` writes beside the cache entries it builds
    (:data:`memkit.core.io.BUILT_BY_ENV`): its executed path, one per run and notebook."""
    return str((Path(out_dir) / f"{stem}.ipynb").resolve())


def own_builds(entries, tag: str) -> list[str]:
    """The cache ``entries`` (relative to the cache) that ``tag``'s notebook built: those whose
    :func:`memkit.core.io.built_by` (of the entry or the nearest folder above it that recorded one) is ``tag``,
    or unrecorded (built outside :func:`~memkit.core.io.build_lock`). An entry another process built
    meanwhile (a second notebook, a background job) is not this one's."""
    from memkit.core.io import built_by, cache_dir

    root = cache_dir()

    def builder(entry: str) -> str | None:
        parts = Path(entry).parts
        return next(
            (b for i in range(len(parts), 0, -1) if (b := built_by(root.joinpath(*parts[:i]))) is not None), None
        )

    return [e for e in entries if builder(e) in (None, tag)]


def execute_notebook(
    path: str | Path,
    out_dir: str | Path,
    params: dict[str, Any] | None = None,
    *,
    strict: bool = True,
    kernel: str | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
) -> NotebookRun:
    """Run one notebook with papermill into ``out_dir/<stem>.ipynb`` (+ ``<stem>.record.json``).

    The kernel's stderr and papermill's log go to ``out_dir/<stem>.log``.

    ``strict``: refuse (``ValueError``) parameters the notebook does not declare; otherwise
    drop them silently. Execution errors do not raise: they are returned in ``.error``.
    """
    import papermill as pm

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"notebook {path} does not exist")
    params = dict(params or {})
    declared = declared_parameters(path)
    extra = sorted(set(params) - set(declared))
    if extra and strict:
        raise ValueError(
            f"{path.name} does not declare parameter(s) {extra} in its parameters "
            f"cell (it declares {sorted(declared)}); add them there or do not pass them"
        )
    params = {k: v for k, v in params.items() if k in declared}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / f"{path.stem}.ipynb"
    rec = out_dir / f"{path.stem}.record.json"
    rec.unlink(missing_ok=True)  # never report numbers from an earlier run
    kernel_name = resolve_kernel(kernel)

    saved = {k: os.environ.get(k) for k in (RECORD_ENV, PAPERMILL_ENV, BUILT_BY_ENV)}
    os.environ[RECORD_ENV] = str(rec.resolve())
    os.environ[PAPERMILL_ENV] = "1"  # the kernel inherits this environment
    os.environ[BUILT_BY_ENV] = builder_tag(out_dir, path.stem)  # cache entries the kernel builds name this run
    error = None
    t0 = time.perf_counter()
    try:
        with _fd2_to(out_dir / f"{path.stem}.log"):
            pm.execute_notebook(
                str(path),
                str(executed),
                parameters=params,
                kernel_name=kernel_name,
                cwd=str(cwd or path.parent),
                progress_bar=False,
                log_output=False,
                start_timeout=180,
                execution_timeout=timeout,
            )
    except pm.PapermillExecutionError as e:
        msg = (e.evalue or "").strip().splitlines()
        error = f"{e.ename}: {msg[0] if msg else ''} (in cell [{e.exec_count}])"
    except Exception as e:  # dead kernel, timeout, bad notebook: report, never crash the run
        msg = str(e).strip().splitlines()
        error = f"{type(e).__name__}: {msg[0] if msg else ''}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - t0
    try:
        records = load_records(rec, missing_ok=True)
    except ValueError as e:
        records, error = {}, error or f"ValueError: {e}"
    return NotebookRun(path.stem, error is None, seconds, executed, rec, records, error)


# ---- REPORT.md: one run's minutes and records ---------------------------------------------------
def _fmt(v: Any) -> str:
    s = f"{v:.4g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    if isinstance(v, (list, dict)) and len(s) > 60:
        s = s[:57] + "..."
    return s.replace("|", "\\|").replace("\n", " ")


def render_report(runs: list, meta: dict[str, Any], clones: list = ()) -> str:
    """REPORT.md of a run's ``memkit.course.execute.NotebookRun`` records: the minutes of each notebook
    and the cache checkpoints it had to train (a run from an empty cache pays for every clone once: in
    the first notebook that needs it, or with ``--jobs`` in a lane of its own, listed first), then each
    notebook's recorded numbers."""
    n_ok = sum(r.ok for r in runs)
    lines = ["# memkit reproduce", ""]
    lines += [f"- {k}: `{v}`" for k, v in meta.items()]
    lines += [
        f"- result: **{n_ok}/{len(runs)} notebooks ok**",
        "",
        "| notebook | status | minutes | trained into the cache |",
        "|---|---|---:|---|",
    ]
    every = list(clones) + runs
    for r in every:
        lines.append(
            f"| {r.name} | {r.status} | {r.seconds / 60:.1f} | {'<br>'.join(f'`{t}`' for t in r.trained) or '-'} |"
        )
    lines.append(
        f"| **total** (sum; wall time above) | {n_ok}/{len(runs)} ok | **{sum(r.seconds for r in every) / 60:.1f}** | "
        f"{sum(len(r.trained) for r in every)} checkpoints |"
    )
    for r in runs:
        lines += [
            "",
            f"## {r.name}: {r.status} ({r.seconds:.1f} s)",
            "",
            f"executed notebook: `{r.executed_path.name}`, records: `{r.record_path.name}`, kernel log: `{r.name}.log`",
        ]
        if r.error:
            lines += ["", f"**error**: `{_fmt(r.error)}`"]
        if r.records:
            lines += ["", "| name | value |", "|---|---|"]
            lines += [f"| {k} | {_fmt(v)} |" for k, v in sorted(r.records.items())]
    return "\n".join(lines) + "\n"
