"""Faults survived: a real ``memkit train`` process SIGKILLed while it saves a checkpoint or appends
a log line, then ``memkit train --resume`` in a new process ends with the same parameters and logs
as a run that was never interrupted; incomplete checkpoints are skipped with a message; LoRA too.

The kill lands at a fixed place through ``MEMKIT_KILL_AT=<point>:<n>`` (:func:`memkit.core.io.kill_point`):
the process kills itself with SIGKILL (no handler, no cleanup), as an OOM kill or a pulled plug would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

# PPO (critic, two optimizers, warmup schedulers) on the random tiny model: the entropy bonus and KL move it
TRAIN = [
    "train",
    "--algo",
    "ppo",
    "--method",
    "mem1",
    "--init",
    "tiny",
    "--steps",
    "4",
    "--tasks-per-step",
    "2",
    "--n",
    "2",
    "--micro-batch-size",
    "2",
    "--lr",
    "1e-3",
    "--entropy-coef",
    "0.01",
    "--warmup-steps",
    "3",
    "--save-every",
    "1",
    "--eval-every",
    "2",
    "--eval-tasks",
    "2",
    "--keep-checkpoints",
    "1",
    "--max-turns",
    "2",
    "--objectives",
    "1",
    "--eval-objectives",
    "1",
    "--device",
    "cpu",
]


def memkit(out: Path, *extra: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MEMKIT_KILL_AT"}
    if kill_at:
        env["MEMKIT_KILL_AT"] = kill_at
    return subprocess.run(
        [sys.executable, "-m", "memkit.cli", *TRAIN, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def final_state(run: Path) -> dict[str, torch.Tensor]:
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "policy"
    files = sorted(ckpt.glob("*.safetensors"))
    assert files, f"no weights in {ckpt}"
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def log_rows(run: Path, name: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / name).read_text().splitlines()]  # a torn line would raise
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run every interrupted one must end equal to."""
    run = tmp_path_factory.mktemp("straight") / "run"
    r = memkit(run)
    assert r.returncode == 0, r.stderr[-2000:]
    return run


def assert_same_run(a: Path, b: Path) -> None:
    sa, sb = final_state(a), final_state(b)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert log_rows(a, "metrics.jsonl") == log_rows(b, "metrics.jsonl") and len(log_rows(a, "metrics.jsonl")) == 4
    assert log_rows(a, "eval.jsonl") == log_rows(b, "eval.jsonl")


def test_run_killed_mid_save_then_mid_log_resumes_to_the_same_end(straight, tmp_path):
    """One run, three processes: SIGKILL while saving step 2's checkpoint; resume, SIGKILL while
    appending step 3's log row; point `latest` at a checkpoint that is gone (deleted by hand, or a
    crash between the renames of a re-save); resume again. It ends equal to the straight run."""
    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    r = memkit(run, kill_at="checkpoint-save:2")
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    # step 2's weights are on disk without its memkit.json; `latest` still names step 1
    assert (ckpts / ".step-000002.tmp").is_dir() and not (ckpts / ".step-000002.tmp" / "memkit.json").exists()
    assert (ckpts / "latest").read_text() == "step-000001"

    r = memkit(run, "--resume", kill_at="log-append:2")  # this process logs step 2, then dies inside step 3's row
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    assert "skipped incomplete checkpoint(s) .step-000002.tmp; resuming from step-000001" in r.stderr
    text = (run / "metrics.jsonl").read_text()
    assert len(text.splitlines()) == 3 and not text.endswith("\n")  # the third row is torn

    (ckpts / "latest").write_text("step-000009")
    r = memkit(run, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "step-000009 (named by latest, not on disk); resuming from step-000002" in r.stderr
    assert_same_run(straight, run)
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-000004"]  # no temp dirs left


def test_lora_run_killed_mid_save_resumes_to_the_same_end(tmp_path):
    """LoRA: the adapters (seeded, LoraSpec.seed) and their optimizer state survive a kill."""
    lora = ["--lora", "--lora-r", "4", "--lora-alpha", "8", "--steps", "2", "--eval-every", "1"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert memkit(a, *lora).returncode == 0
    assert memkit(b, *lora, kill_at="checkpoint-save:2").returncode == -signal.SIGKILL
    r = memkit(b, *lora, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    sa, sb = final_state(a), final_state(b)
    assert any("lora_A" in k for k in sa) and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert log_rows(a, "metrics.jsonl") == log_rows(b, "metrics.jsonl") and len(log_rows(a, "metrics.jsonl")) == 2
