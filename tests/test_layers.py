"""memkit's layers: every ``memkit.*`` import (module level and inside functions) points down or
sideways, and the module-level imports form no cycle.

Layers, bottom to top (a module may import its own layer and the ones below); each is a top-level
package, so the tree is this diagram:

    0  core                                    files, threads, lanes of worker processes, the data model
    1  world, retrieval, metrics               tasks, conversation streams, search backends, scores
    2  models                                  policies, generation
    3  agents, envs, rollout                   memory formats, the search env, the engine
    4  rl, train                               training algorithms (take a kit-like object; no assembly)
    5  lab                                     assembly: a kit, policy specs, rollouts/eval, SFT/RL runs,
                                               the RL lab's recipes, Mem-T's lab
    6  course, viz                             notebook helpers, reproduce, the claims page, widgets
    7  cli                                     the ``memkit`` command
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "memkit"

LAYERS = (
    ("core",),
    ("world", "retrieval", "metrics"),
    ("models",),
    ("agents", "envs", "rollout"),
    ("rl", "train"),
    ("lab",),
    ("course", "viz"),
    ("cli",),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool, int]]:
    """``(imported memkit module, at module level?, line)`` for every import in the file.
    ``from memkit.a import b`` names ``memkit.a.b`` when that is a module, else ``memkit.a``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in dict.fromkeys(targets):
            if t == "memkit" or t.startswith("memkit."):
                found.append((t, id(node) in top, node.lineno))
    return found


def layer(name: str) -> int | None:
    parts = name.split(".")
    return RANK.get(parts[1]) if len(parts) > 1 else None


def graph():
    mods = modules()
    return mods, {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_every_module_has_a_layer():
    mods, _ = graph()
    unplaced = sorted(m for m in mods if m != "memkit" and layer(m) is None)
    assert not unplaced, f"add these modules to a layer in tests/test_layers.py: {unplaced}"


def test_the_tree_is_the_layer_diagram():
    """Every layer is a top-level package and every top-level package a layer: no loose modules
    beside ``memkit/__init__.py``, so ``ls memkit`` reads as the diagram above."""
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"move these into the package of their layer: {loose}"
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(RANK), (
        f"packages without a layer: {packages - set(RANK)}; layers without a package: {set(RANK) - packages}"
    )


def test_the_tests_mirror_the_packages():
    """A package's tests live in ``tests/<package>/``; the tests at ``tests/`` top level are the
    ones about the whole tree (layers, docs, packaging, faults, property tests)."""
    tests = ROOT.parent / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("fixtures", "__pycache__")}
    assert folders <= set(RANK), f"test folders that name no memkit package: {sorted(folders - set(RANK))}"
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert loose == ["test_docs.py", "test_faults.py", "test_fuzz.py", "test_layers.py", "test_packaging.py"], (
        f"move a package's tests into tests/<package>/: {loose}"
    )


def test_no_upward_imports():
    _, edges = graph()
    bad = []
    for name, found in edges.items():
        for target, top, line in found:
            if layer(name) is not None and layer(target) is not None and layer(target) > layer(name):
                where = "module level" if top else "inside a function"
                bad.append(f"{name}:{line} imports {target} ({where}; layer {layer(name)} -> {layer(target)})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def cycles(deps: dict[str, list[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    found = []

    def visit(node, stack):
        state[node] = 1
        for dep in deps.get(node, ()):
            if state.get(dep) == 1:
                found.append(" -> ".join(stack[stack.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for name in sorted(deps):
        if name not in state:
            visit(name, [name])
    return found


def test_no_cycles_among_module_level_imports():
    _, edges = graph()
    deps = {name: sorted({t for t, top, _ in found if top and t != name}) for name, found in edges.items()}
    assert not cycles(deps), "module-level import cycles:\n" + "\n".join(cycles(deps))


def test_no_cycles_through_function_level_imports_either():
    """A lazy import that closes a loop hides a layering problem rather than solving it."""
    _, edges = graph()
    deps = {name: sorted({t for t, _, _ in found if t != name}) for name, found in edges.items()}
    assert not cycles(deps), "import cycles (counting imports inside functions):\n" + "\n".join(cycles(deps))


def test_the_rule_sees_a_violation(tmp_path):
    """The walker finds function-level imports and resolves ``from pkg import submodule``."""
    src = tmp_path / "memkit" / "models" / "x.py"
    src.parent.mkdir(parents=True)
    src.write_text("from memkit.agents import base\n\ndef f():\n    from memkit.rl.trainer import Trainer\n")
    found = imports("memkit.models.x", src, {"memkit.agents.base", "memkit.rl.trainer"})
    assert found == [("memkit.agents.base", True, 1), ("memkit.rl.trainer", False, 4)]


def test_no_import_error_is_swallowed_silently():
    """``except ImportError: pass`` once hid every error in ``memkit.rl`` by dropping ``memkit train``
    from the CLI. A handler must raise, return or do something else a reader can see."""
    silent = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                names = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
                if names & {"ImportError", "ModuleNotFoundError"} and all(isinstance(b, ast.Pass) for b in node.body):
                    silent.append(f"{name}:{node.lineno}")
    assert not silent, f"silent `except ImportError: pass` in {silent}"


def test_the_paper_locator_points_at_real_things():
    """``memkit.paper(key)`` names each paper's format, credit rule, packing, notebook and recipe;
    every one must exist, and the lazy public names must resolve."""
    import importlib
    import subprocess
    import sys

    import memkit
    from memkit.rl.credit import CREDIT_RULES
    from memkit.rl.packing import MODES

    root = ROOT.parent
    assert list(memkit.PAPERS) == ["mem1", "memsearcher", "mempo", "memact", "memt"]
    for p in memkit.PAPERS.values():
        assert p.credit in CREDIT_RULES and p.packing in MODES, p
        assert (root / p.notebook).is_file(), p.notebook
        module, _, attr = p.recipe.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr)), p.recipe
        shared = root.parent / "shared" / "papers" / p.file
        assert not shared.parent.is_dir() or shared.is_file(), shared
    assert memkit.paper("Mem-T") is memkit.PAPERS["memt"]
    assert (memkit.paper("mem1").credit, memkit.paper("memsearcher").credit) == ("grpo", "multi_context")
    for name in memkit.__all__:
        assert getattr(memkit, name) is not None
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    for name, module in memkit._HOME.items():  # the same object as its module's, never shadowed by a package
        assert name not in packages and getattr(memkit, name) is getattr(importlib.import_module(module), name), name
    try:
        memkit.paper("memgpt")
    except ValueError as e:
        assert "choose from mem1, memsearcher" in str(e)
    else:
        raise AssertionError("an unknown paper must name the choices")
    # `import memkit` stays light: the CLI's start-up depends on it
    out = subprocess.run(
        [sys.executable, "-c", "import memkit, sys; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "False"


def test_no_module_over_400_lines():
    """A module a reader can hold in one sitting: split one that grows past 400 lines."""
    long = {
        name: n for name, path in modules().items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400
    }
    assert not long, f"split these modules (lines): {long}"


def test_every_notebook_imports_at_most_five_memkit_names():
    """d2l's one import: a notebook reaches the library through ``import memkit as mk`` (every name it
    calls is an attribute of ``memkit``), the notebook helpers (``mnb``) and at most three more names."""
    import json

    import memkit

    for path in sorted((ROOT.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        names, used = set(), set()
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            tree = ast.parse("".join(cell["source"]))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "memkit":
                    names |= {a.asname or a.name for a in node.names}
                elif isinstance(node, ast.Import):
                    names |= {a.asname or a.name for a in node.names if a.name.split(".")[0] == "memkit"}
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mk":
                    used.add(node.attr)
        assert len(names) <= 5, f"{path.name} imports {len(names)} memkit names: {sorted(names)}"
        assert used <= set(memkit.__all__), f"{path.name} calls mk.{sorted(used - set(memkit.__all__))}"
