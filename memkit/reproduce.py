"""Run the notebooks end to end with papermill and write a report: ``memkit reproduce``.

Two modes: SMOKE (``--smoke``: small sizes, what ``make test`` runs, minutes) and the lab
(``SMOKE = False``: the RL lab of :mod:`memkit.lab`, real learned numbers; 2.5-3 hours on 2 cores from an
empty cache, about 1.5 hours with the clones cached).
Each notebook runs in a fresh kernel of *this* Python environment with its ``parameters``
cell overridden (only the parameters it declares: ``SMOKE``, ``MODEL``, ``SEED``,
``OUT_DIR``). Its executed copy, its record sidecar and its OUT_DIR go into
``runs/<timestamp>/``; ``REPORT.md`` there lists status, seconds and recorded numbers.
A failing notebook is reported and the others still run.
"""
from __future__ import annotations

import ast
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from memkit.nb import PAPERMILL_ENV, RECORD_ENV, load_records
from memkit.io import atomic_write_text

STANDARD_PARAMETERS = ("SMOKE", "MODEL", "SEED", "OUT_DIR")
PARAMETERS_TAG = "parameters"


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


# ----------------------------------------------------------------------------- parameters
def _read(nb_or_path):
    import nbformat

    if isinstance(nb_or_path, (str, Path)):
        return nbformat.read(str(nb_or_path), as_version=4)
    return nb_or_path


def parameters_cells(nb_or_path) -> list[int]:
    """Indices of the code cells tagged ``parameters``."""
    nb = _read(nb_or_path)
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])]


def declared_parameters(nb_or_path) -> dict[str, str]:
    """Names assigned at top level of the ``parameters`` cell -> source of their default.

    Raises ``ValueError`` if there is not exactly one such cell or it is not valid Python.
    """
    nb = _read(nb_or_path)
    where = nb_or_path if isinstance(nb_or_path, (str, Path)) else "notebook"
    idx = parameters_cells(nb)
    if len(idx) != 1:
        raise ValueError(f"{where}: expected exactly one code cell tagged 'parameters', found "
                         f"{len(idx)}; tag the cell that sets SMOKE, MODEL, SEED, OUT_DIR "
                         "(View > Cell Toolbar > Tags in Jupyter)")
    src = nb.cells[idx[0]].source
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise ValueError(f"{where}: the parameters cell is not valid Python ({e})") from None
    out: dict[str, str] = {}
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for t in targets:
            if isinstance(t, ast.Name):
                out[t.id] = ast.get_source_segment(src, node.value) if node.value else ""
            elif isinstance(t, (ast.Tuple, ast.List)):  # A, B = 1, 2
                vals = getattr(node.value, "elts", [])
                for j, e in enumerate(t.elts):
                    if isinstance(e, ast.Name):
                        same = len(vals) == len(t.elts)
                        out[e.id] = ast.get_source_segment(src, vals[j]) if same else ""
    return out


# ----------------------------------------------------------------------------- kernel
def _runs_this_python(argv: list[str]) -> bool:
    if not argv:
        return False
    exe = argv[0]
    v = sys.version_info
    if exe in ("python", f"python{v[0]}", f"python{v[0]}.{v[1]}"):
        return True  # jupyter_client substitutes sys.executable for these names
    exe = os.path.abspath(exe)  # no resolve(): a venv python is a symlink to the base python
    return exe == os.path.abspath(sys.executable) or exe.startswith(os.path.abspath(sys.prefix) + os.sep)


def resolve_kernel(kernel: str | None = None) -> str:
    """Name of a kernel spec that runs this interpreter (``sys.executable``).

    Uses ``kernel`` if given, else ``python3`` when it runs this Python, else installs a
    ``memkit`` kernel spec into ``sys.prefix`` (``python -m ipykernel install --sys-prefix``).
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    if kernel:
        try:
            ksm.get_kernel_spec(kernel)
        except NoSuchKernel:
            raise ValueError(f"no Jupyter kernel named {kernel!r}; list them with "
                             "`jupyter kernelspec list` or omit --kernel") from None
        return kernel
    for name in ("python3", "memkit"):
        try:
            if _runs_this_python(ksm.get_kernel_spec(name).argv):
                return name
        except NoSuchKernel:
            continue
    from ipykernel.kernelspec import install

    install(kernel_name="memkit", display_name="Python (memkit)", prefix=sys.prefix)
    return "memkit"


# ----------------------------------------------------------------------------- one notebook
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


def execute_notebook(path: str | Path, out_dir: str | Path, params: dict[str, Any] | None = None,
                     *, strict: bool = True, kernel: str | None = None,
                     cwd: str | Path | None = None, timeout: float | None = None) -> NotebookRun:
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
        raise ValueError(f"{path.name} does not declare parameter(s) {extra} in its parameters "
                         f"cell (it declares {sorted(declared)}); add them there or do not pass them")
    params = {k: v for k, v in params.items() if k in declared}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / f"{path.stem}.ipynb"
    rec = out_dir / f"{path.stem}.record.json"
    rec.unlink(missing_ok=True)  # never report numbers from an earlier run
    kernel_name = resolve_kernel(kernel)

    saved = {k: os.environ.get(k) for k in (RECORD_ENV, PAPERMILL_ENV)}
    os.environ[RECORD_ENV] = str(rec.resolve())
    os.environ[PAPERMILL_ENV] = "1"  # the kernel inherits this environment
    error = None
    t0 = time.perf_counter()
    try:
        with _fd2_to(out_dir / f"{path.stem}.log"):
            pm.execute_notebook(str(path), str(executed), parameters=params,
                                kernel_name=kernel_name, cwd=str(cwd or path.parent),
                                progress_bar=False, log_output=False, start_timeout=180,
                                execution_timeout=timeout)
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


# ----------------------------------------------------------------------------- many notebooks
def default_notebooks_dir() -> Path:
    root = Path(__file__).resolve().parent.parent
    d = root / "notebooks"
    return d if d.is_dir() else Path.cwd() / "notebooks"


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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        s = f"{v:.4g}"
    elif isinstance(v, (list, dict)):
        s = json.dumps(v)
        s = s if len(s) <= 60 else s[:57] + "..."
    else:
        s = str(v)
    return s.replace("|", "\\|").replace("\n", " ")


def cache_checkpoints() -> set[str]:
    """The finished checkpoints in memkit's cache (directories holding ``memkit.json``), relative
    to it: the difference before and after a notebook names the models that notebook trained."""
    from memkit.io import cache_dir

    root = cache_dir()
    return {p.parent.relative_to(root).as_posix() for p in root.rglob("memkit.json")}


def render_report(runs: list[NotebookRun], meta: dict[str, Any]) -> str:
    """REPORT.md: the minutes of each notebook and the cache checkpoints it had to train (a run from
    an empty cache pays for every clone once, in the first notebook that needs it), then each
    notebook's recorded numbers."""
    n_ok = sum(r.ok for r in runs)
    lines = ["# memkit reproduce", ""]
    lines += [f"- {k}: `{v}`" for k, v in meta.items()]
    lines += [f"- result: **{n_ok}/{len(runs)} notebooks ok**", "",
              "| notebook | status | minutes | trained into the cache |", "|---|---|---:|---|"]
    for r in runs:
        lines.append(f"| {r.name} | {r.status} | {r.seconds / 60:.1f} | "
                     f"{'<br>'.join(f'`{t}`' for t in r.trained) or '-'} |")
    lines.append(f"| **total** | {n_ok}/{len(runs)} ok | **{sum(r.seconds for r in runs) / 60:.1f}** | "
                 f"{sum(len(r.trained) for r in runs)} checkpoints |")
    for r in runs:
        lines += ["", f"## {r.name}: {r.status} ({r.seconds:.1f} s)", "",
                  f"executed notebook: `{r.executed_path.name}`, records: `{r.record_path.name}`, "
                  f"kernel log: `{r.name}.log`"]
        if r.error:
            lines += ["", f"**error**: `{_fmt(r.error)}`"]
        if r.records:
            lines += ["", "| name | value |", "|---|---|"]
            lines += [f"| {k} | {_fmt(v)} |" for k, v in sorted(r.records.items())]
    return "\n".join(lines) + "\n"


def _write_summary(run_dir: Path, runs: list[NotebookRun], meta: dict[str, Any]) -> None:
    """REPORT.md and summary.json as they stand (after every notebook: a killed run can resume)."""
    atomic_write_text(run_dir / "REPORT.md", render_report(runs, meta))
    summary = {"meta": meta, "notebooks": [
        {"name": r.name, "ok": r.ok, "seconds": round(r.seconds, 3), "error": r.error,
         "trained": r.trained, "records": r.records} for r in runs]}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")


def _finished_in(run_dir: Path, smoke: bool, model: str, seed: int) -> dict[str, NotebookRun]:
    """Notebooks that ran ok in ``run_dir`` with the same parameters (what ``resume`` skips)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {}
    meta = summary.get("meta", {})
    if (meta.get("smoke"), meta.get("model"), meta.get("seed")) != (smoke, model, seed):
        raise ValueError(f"{run_dir} ran smoke={meta.get('smoke')}, model={meta.get('model')}, "
                         f"seed={meta.get('seed')}; resume it with the same --smoke/--model/--seed "
                         "or start a new run without --resume")
    return {n["name"]: NotebookRun(n["name"], True, n["seconds"], run_dir / f"{n['name']}.ipynb",
                                   run_dir / f"{n['name']}.record.json", n.get("records", {}),
                                   trained=n.get("trained", []))
            for n in summary.get("notebooks", []) if n.get("ok")}


def reproduce(smoke: bool = True, model: str = "tiny", notebooks: Sequence[str] | None = None,
              out_root: str | Path = "runs", kernel: str | None = None, *, seed: int = 0,
              notebooks_dir: str | Path | None = None, timeout: float | None = None,
              resume: str | Path | None = None, results: str | Path | None = None, stream=None) -> Path:
    """Run the notebooks in order into ``out_root/<timestamp>/`` and write ``REPORT.md`` there.

    ``smoke``: SMOKE=True (small sizes, minutes) or the lab mode (SMOKE=False: learned numbers,
    hours on 2 cores from an empty cache, docs/reference.md 'The lab mode'; the SFT checkpoints are
    cached across notebooks and runs, and the report names the ones each notebook trained). ``resume``: an earlier run directory; its notebooks that finished ok are kept and
    the others run again (the report and summary are rewritten after every notebook).
    ``results``: also write the claims page (:mod:`memkit.results`) there; ``RESULTS.md`` in the
    run directory is always written.

    Returns the run directory. Per notebook a start and a result line go to ``stream``
    (default stdout). Failures are reported in the line and in the report; see
    ``failed_notebooks(run_dir)`` / the CLI exit status.
    """
    stream = stream or sys.stdout
    nb_dir = Path(notebooks_dir) if notebooks_dir else default_notebooks_dir()
    paths = select_notebooks(notebooks, nb_dir)
    kernel_name = resolve_kernel(kernel)
    if resume is not None:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"--resume {run_dir}: no such run directory (see {out_root}/)")
        done = _finished_in(run_dir, smoke, model, seed)
    else:
        run_dir, done = _new_run_dir(Path(out_root)), {}
    meta = {"smoke": smoke, "model": model, "seed": seed, "kernel": kernel_name,
            "python": sys.executable, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "notebooks_dir": str(nb_dir)}
    mode = "smoke" if smoke else "lab"
    print(f"memkit reproduce: {len(paths)} notebook(s), {mode} mode, model={model}, "
          f"seed={seed} -> {run_dir}", file=stream, flush=True)
    runs: list[NotebookRun] = []
    width = max(len(p.stem) for p in paths)
    t_all = time.perf_counter()
    for i, p in enumerate(paths, 1):
        if p.stem in done:
            runs.append(done[p.stem])
            print(f"[{i}/{len(paths)}] {p.stem:<{width}}  ok (kept from the resumed run)", file=stream, flush=True)
            continue
        print(f"[{i}/{len(paths)}] {p.stem:<{width}}  running ({time.strftime('%H:%M:%S')})", file=stream, flush=True)
        params = {"SMOKE": smoke, "MODEL": model, "SEED": seed,
                  "OUT_DIR": str((run_dir / p.stem).resolve())}
        cached = cache_checkpoints()
        try:
            r = execute_notebook(p, run_dir, params, strict=False, kernel=kernel_name,
                                 timeout=timeout)
        except Exception as e:  # unreadable notebook, bad parameters cell
            r = NotebookRun(p.stem, False, 0.0, run_dir / f"{p.stem}.ipynb",
                            run_dir / f"{p.stem}.record.json", {}, f"{type(e).__name__}: {e}")
        r.trained = sorted(cache_checkpoints() - cached)
        runs.append(r)
        line = f"[{i}/{len(paths)}] {r.name:<{width}}  {r.status:<6} {r.seconds:7.1f} s"
        print(line + (f"  {r.error}" if r.error else ""), file=stream, flush=True)
        _write_summary(run_dir, runs, meta)
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    meta["wall_seconds"] = round(time.perf_counter() - t_all, 1)
    _write_summary(run_dir, runs, meta)
    from memkit.results import write_results

    for path in [run_dir / "RESULTS.md"] + ([Path(results)] if results else []):
        write_results([run_dir], path)
    n_bad = sum(not r.ok for r in runs)
    print(f"{len(runs) - n_bad}/{len(runs)} ok in {meta['wall_seconds']:.0f} s; report: {run_dir / 'REPORT.md'}",
          file=stream, flush=True)
    return run_dir


def failed_notebooks(run_dir: str | Path) -> list[str]:
    """Names of the notebooks that failed in a run written by :func:`reproduce`."""
    summary = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
    return [n["name"] for n in summary["notebooks"] if not n["ok"]]
