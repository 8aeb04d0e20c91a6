"""memkit's layers: every ``memkit.*`` import (module level and inside functions) points down or
sideways, and the module-level imports form no cycle.

Layers, bottom to top (a module may import its own layer and the ones below):

    0  io, cpu, lanes, trajectory              files, threads, lanes of worker processes, the data model
    1  world, retrieval, metrics,              tasks, conversation streams, search backends, scores
       metrics_locomo
    2  models                                  policies, generation
    3  agents, envs, rollout                   memory formats, the search env, the engine
    4  rl, sft, pretrain, train                training algorithms (take a kit-like object; no assembly)
    5  kit, policies, evaluation, training,    assembly: a kit, policy specs, rollouts/eval, SFT/RL runs,
       lab, conversation_eval, memt_lab,       the RL lab's recipes, Mem-T's evaluation and lab
       memt_hindsight                          (retrieval; construction by hindsight SFT)
    6  nb, reproduce, results, viz             notebook helpers, the claims page
    7  cli                                     the ``memkit`` command
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "memkit"

LAYERS = (
    ("io", "cpu", "lanes", "trajectory"),
    ("world", "retrieval", "metrics", "metrics_locomo"),
    ("models",),
    ("agents", "envs", "rollout"),
    ("rl", "sft", "pretrain", "train"),
    ("kit", "policies", "evaluation", "training", "lab", "conversation_eval", "memt_lab", "memt_hindsight"),
    ("nb", "reproduce", "results", "viz"),
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
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
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
                found.append(" -> ".join(stack[stack.index(dep):] + [dep]))
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
