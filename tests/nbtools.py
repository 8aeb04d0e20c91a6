"""Shared helpers for notebook tests: build small notebooks, run them, check recorded numbers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import nbformat

from memkit.course.execute import execute_notebook

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO / "notebooks"
# cells with these tags may keep outputs in committed notebooks; the smoke run compares them
# (output_check_problems: nbval's --nbval-lax check on the smoke run's own execution)
OUTPUT_CHECK_TAGS = {"nbval-check-output", "nbval-check"}

DEFAULT_PARAMS = 'SMOKE = True\nMODEL = "tiny"\nSEED = 0\nOUT_DIR = "out"\n'


def make_notebook(
    path: str | Path,
    cells: Iterable[str],
    parameters: str | None = DEFAULT_PARAMS,
    tags: dict[int, list[str]] | None = None,
) -> Path:
    """Write a python3 notebook: an optional ``parameters`` cell, then one code cell per source.

    ``tags`` maps the index of a cell in ``cells`` to extra tags.
    """
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    if parameters is not None:
        nb.cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    for i, src in enumerate(cells):
        nb.cells.append(nbformat.v4.new_code_cell(src, metadata={"tags": list((tags or {}).get(i, []))}))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def run_notebook(
    path: str | Path, params: dict[str, Any], out_dir: str | Path, timeout: float | None = 600
) -> dict[str, Any]:
    """Execute ``path`` with papermill into ``out_dir``; return its recorded numbers.

    Refuses (``ValueError``) any parameter the notebook's parameters cell does not declare,
    and raises ``AssertionError`` with the notebook's error if execution fails.
    """
    run = execute_notebook(path, out_dir, params, strict=True, timeout=timeout)
    if not run.ok:
        raise AssertionError(
            f"{Path(path).name} failed after {run.seconds:.1f} s: {run.error}\n"
            f"executed notebook with outputs: {run.executed_path}"
        )
    return run.records


def code_cells_with_outputs(nb) -> list[int]:
    """Indices of code cells that carry outputs or execution counts and are not output-checked."""
    bad = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        if OUTPUT_CHECK_TAGS & set(c.get("metadata", {}).get("tags", [])):
            continue
        if c.get("outputs") or c.get("execution_count") is not None:
            bad.append(i)
    return bad


SUFFIXES = ("_min", "_max", "_eq", "_close")


def check_expectations(records: dict[str, Any], expectations: dict[str, Any]) -> list[str]:
    """Problems found comparing recorded numbers with an expectation table (empty = all good).

    Keys: ``<record>_min`` (value >= bound), ``<record>_max`` (value <= bound),
    ``<record>_eq`` (exact equality, for ints/strings), ``<record>_close`` ((target, abs_tol)).
    """
    problems = []
    if not expectations:
        return ["the expectation table is empty: assert at least one recorded number"]
    for key, bound in expectations.items():
        suffix = next((s for s in SUFFIXES if key.endswith(s)), None)
        if suffix is None:
            problems.append(f"expectation key {key!r} must end in one of {SUFFIXES}")
            continue
        name = key[: -len(suffix)]
        if name not in records:
            problems.append(
                f"{name!r} was not recorded (recorded: {sorted(records)}); "
                f"call memkit.course.nb.record({name!r}, value) in the notebook"
            )
            continue
        v = records[name]
        if suffix == "_eq":
            if v != bound:
                problems.append(f"{name} = {v!r}, expected {bound!r}")
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            problems.append(f"{name} = {v!r} is not a finite number")
        elif suffix == "_min" and not v >= bound:
            problems.append(f"{name} = {v:.6g} < minimum {bound}")
        elif suffix == "_max" and not v <= bound:
            problems.append(f"{name} = {v:.6g} > maximum {bound}")
        elif suffix == "_close":
            target, tol = bound
            if not abs(v - target) <= tol:
                problems.append(f"{name} = {v:.6g}, expected {target} +- {tol}")
    return problems


def _comparable(outputs) -> list:
    """What nbval compares of a cell's outputs, its own way: streams coalesced (``\\r``/``\\b``
    applied) and keyed by stream name; results and displays by their ``text/plain``; errors by name."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    out = []
    for o in transform_streams_for_comparison(coalesce_streams(nbformat.from_dict(list(outputs)))):
        if o["output_type"] == "stream":
            out.append({k: v for k, v in o.items() if k != "output_type"})
        elif o["output_type"] == "error":
            out.append({"error": o["ename"]})
        else:
            out.append({"text/plain": o.get("data", {}).get("text/plain")})
    return out


def output_check_problems(committed: str | Path, executed: str | Path) -> list[str]:
    """nbval's output check, done on an execution that already ran: every code cell of the committed
    notebook tagged in :data:`OUTPUT_CHECK_TAGS` must have produced the outputs it was committed with.

    ``make test`` executes each notebook once (the papermill SMOKE run) and checks both its recorded
    numbers and these outputs, where nbval over ``notebooks/`` would execute every notebook again;
    untagged cells need only run without error, which papermill already enforces (``--nbval-lax``).
    papermill's injected-parameters cell is skipped when pairing cells.
    """
    ref = [c for c in nbformat.read(str(committed), as_version=4).cells if c.cell_type == "code"]
    run = [
        c
        for c in nbformat.read(str(executed), as_version=4).cells
        if c.cell_type == "code" and "injected-parameters" not in c.get("metadata", {}).get("tags", [])
    ]
    if len(ref) != len(run):
        return [f"{Path(executed).name}: {len(run)} code cells executed, the committed notebook has {len(ref)}"]
    problems = []
    for i, (want, got) in enumerate(zip(ref, run)):
        if OUTPUT_CHECK_TAGS & set(want.get("metadata", {}).get("tags", [])):
            if _comparable(want.outputs) != _comparable(got.outputs):
                problems.append(
                    f"code cell {i}: outputs {_comparable(got.outputs)!r}, committed {_comparable(want.outputs)!r}"
                )
    return problems
