"""The docs point at real code: every ``memkit.…`` name and every ``tests/…::test_…`` reference in
the README and docs/*.md resolves (the course's equation map is read by students; a renamed
function or test must not leave it pointing nowhere)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"`(memkit(?:\.\w+)+)")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`((?:, `::\w+`)*)")


def resolve(dotted: str):
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
            break
        except ModuleNotFoundError:
            continue
    for p in parts[k:]:
        obj = getattr(obj, p)
    return obj


def test_names_in_the_docs_resolve():
    missing = []
    for doc in DOCS:
        for name in sorted(set(NAME.findall(doc.read_text()))):
            try:
                resolve(name)
            except AttributeError:
                missing.append(f"{doc.name}: {name}")
    assert not missing, "docs name code that does not exist (rename it there too): " + "; ".join(missing)


def test_test_references_in_the_docs_exist():
    refs = []
    for doc in DOCS:
        for path, first, more in TEST_REF.findall(doc.read_text()):
            refs += [(doc.name, path, t) for t in [first, *re.findall(r"::(\w+)", more)]]
    assert len(refs) >= 40  # the course's equation maps
    missing = []
    for doc, path, test in refs:
        file = ROOT / path
        defined = (
            {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}
            if file.exists()
            else set()
        )
        if test not in defined:
            missing.append(f"{doc}: {path}::{test}")
    assert not missing, "docs cite tests that do not exist: " + "; ".join(missing)


@pytest.mark.parametrize("dotted", ["memkit.rl.mot._register", "memkit.no_such_module.x"])
def test_resolve_fails_on_a_missing_name(dotted):
    with pytest.raises((AttributeError, ModuleNotFoundError)):
        resolve(dotted)
