"""Notebook helpers: record key numbers, place figures, progress bars that behave under papermill;
the ``parameters`` cell and the Jupyter kernel that ``memkit reproduce`` and the tests run notebooks with.

Every notebook records the numbers it wants tested with :func:`record`. They go to a JSON
sidecar so the test suite and ``memkit reproduce`` can check them without parsing outputs:

* ``MEMKIT_RECORD_PATH`` set (the test harness and ``memkit reproduce`` set it per notebook,
  e.g. ``runs/<stamp>/01_rollouts_and_memory_cost.record.json``): that file;
* otherwise ``./records.json`` in the kernel's working directory.

Every write rewrites the whole sidecar atomically, so an interrupted notebook never leaves
a half-written file behind.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, TypeVar

from memkit.core.io import atomic_write_text

T = TypeVar("T")

RECORD_ENV = "MEMKIT_RECORD_PATH"
FIGURES_ENV = "MEMKIT_FIGURES"
PAPERMILL_ENV = "MEMKIT_PAPERMILL"  # set to "1" by memkit's papermill harness

__all__ = [
    "record",
    "record_all",
    "load_records",
    "record_path",
    "figure_path",
    "figures_dir",
    "in_papermill",
    "progress",
    "smoke_scale",
    "to_jsonable",
]


def record_path() -> Path:
    """Where :func:`record` writes: ``$MEMKIT_RECORD_PATH`` or ``./records.json``."""
    env = os.environ.get(RECORD_ENV, "").strip()
    return Path(env) if env else Path.cwd() / "records.json"


def to_jsonable(value: Any, _where: str = "value") -> Any:
    """Convert numbers, strings, lists, tuples, dicts and numpy/torch scalars/arrays to JSON types.

    Raises ``TypeError`` naming the offending part for anything else (e.g. a model object).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(
                    f"{_where}: dict keys must be strings, got {type(k).__name__} key {k!r}; convert keys with str()"
                )
            out[k] = to_jsonable(v, f"{_where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{_where}[{i}]") for i, v in enumerate(value)]
    # numpy / torch scalars and arrays, without importing either library here
    mod = type(value).__module__.split(".")[0]
    if mod in ("numpy", "torch"):
        if hasattr(value, "detach"):  # torch tensor
            value = value.detach().cpu()
        if getattr(value, "ndim", 0) == 0 and hasattr(value, "item"):
            return to_jsonable(value.item(), _where)
        if hasattr(value, "tolist"):
            return to_jsonable(value.tolist(), _where)
    raise TypeError(
        f"{_where}: cannot record a {type(value).__module__}.{type(value).__name__}; "
        "record a number, string, list or dict (e.g. float(x), str(x), x.tolist())"
    )


def load_records(path: str | Path | None = None, missing_ok: bool = False) -> dict[str, Any]:
    """Read a sidecar written by :func:`record` (default: :func:`record_path`)."""
    path = Path(path) if path is not None else record_path()
    if not path.exists():
        if missing_ok:
            return {}
        raise FileNotFoundError(
            f"no records at {path}: the notebook must call memkit.course.nb.record(name, value) "
            f"(and {RECORD_ENV} must point to this file when it runs)"
        )
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"records file {path} is not valid JSON ({e}); delete it and re-run the notebook") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"records file {path} holds a {type(data).__name__}, not a JSON object; delete it and re-run the notebook"
        )
    return data


def record(name: str, value: Any) -> Any:
    """Store ``value`` under ``name`` in the notebook's JSON sidecar and return ``value``.

    Re-recording a name overwrites it. Numbers, strings, lists and dicts are accepted;
    numpy/torch scalars become Python numbers and arrays/tensors become lists.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"record(name, value): name must be a non-empty string, got {name!r}")
    data = to_jsonable(value, f"record({name!r})")
    path = record_path()
    records = load_records(path, missing_ok=True)
    records[name] = data
    atomic_write_text(path, json.dumps(records, indent=2, sort_keys=True) + "\n")
    return value


def record_all(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`record` every ``name: value`` of ``values`` (one call per notebook section)."""
    for name, value in values.items():
        record(name, value)
    return values


def repo_root() -> Path | None:
    """The checkout memkit runs from (memkit/course/nb.py -> the directory with pyproject.toml), or
    None for an installed copy."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() else None


def figures_dir() -> Path:
    """``$MEMKIT_FIGURES``, else the repository's ``figures/`` (``./figures`` if not in a checkout)."""
    env = os.environ.get(FIGURES_ENV, "").strip()
    if env:
        d = Path(env)
    else:
        root = repo_root()
        d = (root if root is not None else Path.cwd()) / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


def figure_path(name: str) -> Path:
    """Path for a figure file in :func:`figures_dir` (created). ``.png`` is added if no suffix."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"figure_path(name): give a plain file name such as 'mem1_mask.png', got {name!r}")
    p = figures_dir() / name
    return p if p.suffix else p.with_suffix(".png")


def in_papermill() -> bool:
    """True when the notebook runs under memkit's papermill harness (tests, ``memkit reproduce``).

    The harness sets ``MEMKIT_PAPERMILL=1`` in the kernel's environment; set it yourself
    when calling papermill directly.
    """
    return os.environ.get(PAPERMILL_ENV, "") not in ("", "0")


def progress(iterable: Iterable[T], **kw: Any) -> Iterable[T]:
    """``tqdm.auto.tqdm(iterable, **kw)`` in Jupyter/terminal, silent under papermill.

    Pass ``disable=False`` to force a bar under papermill.
    """
    from tqdm.auto import tqdm

    if in_papermill():
        kw.setdefault("disable", True)
        kw.setdefault("mininterval", 60.0)
    return tqdm(iterable, **kw)


def smoke_scale(smoke: bool, small: T, full: T) -> T:
    """``small`` when ``smoke`` else ``full``: one place to size a notebook's work."""
    if not isinstance(smoke, bool):
        if isinstance(smoke, int) and smoke in (0, 1):
            smoke = bool(smoke)
        else:
            raise TypeError(
                f"SMOKE must be True or False, got {smoke!r} ({type(smoke).__name__}); with papermill use -p SMOKE True"
            )
    return small if smoke else full


def budget_left(t_start: float, total_s: float, reserve_s: float = 0.0, floor_s: float = 60.0) -> float:
    """Seconds a notebook's next stage may use so the whole run fits in ``total_s``.

    ``t_start``: the notebook's ``time.perf_counter()`` at its first cell; ``reserve_s``: what the
    stages after this one need. A full-mode RL cell gets what an SFT (10 minutes when its model
    is not cached yet) and the earlier sections left, but never less than ``floor_s``.
    """
    import time

    return max(total_s - reserve_s - (time.perf_counter() - t_start), floor_s)


# ---- the parameters cell and the kernel (memkit reproduce, the test harness) -----------------------
STANDARD_PARAMETERS = ("SMOKE", "MODEL", "SEED", "OUT_DIR")
PARAMETERS_TAG = "parameters"


def _read(nb_or_path):
    import nbformat

    if isinstance(nb_or_path, (str, Path)):
        return nbformat.read(str(nb_or_path), as_version=4)
    return nb_or_path


def parameters_cells(nb_or_path) -> list[int]:
    """Indices of the code cells tagged ``parameters``."""
    nb = _read(nb_or_path)
    return [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and PARAMETERS_TAG in c.get("metadata", {}).get("tags", [])
    ]


def declared_parameters(nb_or_path) -> dict[str, str]:
    """Names assigned at top level of the ``parameters`` cell -> source of their default.

    Raises ``ValueError`` if there is not exactly one such cell or it is not valid Python.
    """
    nb = _read(nb_or_path)
    where = nb_or_path if isinstance(nb_or_path, (str, Path)) else "notebook"
    idx = parameters_cells(nb)
    if len(idx) != 1:
        raise ValueError(
            f"{where}: expected exactly one code cell tagged 'parameters', found "
            f"{len(idx)}; tag the cell that sets SMOKE, MODEL, SEED, OUT_DIR "
            "(View > Cell Toolbar > Tags in Jupyter)"
        )
    src = nb.cells[idx[0]].source
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise ValueError(f"{where}: the parameters cell is not valid Python ({e})") from None
    out: dict[str, str] = {}
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
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
            raise ValueError(
                f"no Jupyter kernel named {kernel!r}; list them with `jupyter kernelspec list` or omit --kernel"
            ) from None
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
