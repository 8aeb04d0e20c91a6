"""The accelerate config files of ``configs/accelerate/`` (issue 57): each parses with accelerate's
own loader and says what its name says, each is documented, and the DDP one launches ``memkit train``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
#: file -> (accelerate's distributed_type, the engine option that defines it)
EXPECTED = {
    "ddp.yaml": ("MULTI_GPU", {}),
    "fsdp2.yaml": ("FSDP", {"fsdp_config": {"fsdp_version": 2}}),
    "deepspeed_zero2.yaml": ("DEEPSPEED", {"deepspeed_config": {"zero_stage": 2}}),
    "deepspeed_zero3.yaml": ("DEEPSPEED", {"deepspeed_config": {"zero_stage": 3}}),
}


def test_every_config_parses_with_accelerates_loader():
    from accelerate.commands.config.config_args import load_config_from_file

    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)
    for name, (kind, options) in EXPECTED.items():
        cfg = load_config_from_file(str(CONFIGS / name))
        assert type(cfg).__name__ == "ClusterConfig", name
        assert str(cfg.distributed_type).rsplit(".", 1)[-1] == kind, name
        for field, want in options.items():
            got = getattr(cfg, field)
            assert {k: got.get(k) for k in want} == want, (name, got)


def test_every_config_is_documented():
    text = (ROOT / "docs" / "reference.md").read_text()
    for name in EXPECTED:
        assert f"configs/accelerate/{name}" in text, name


@pytest.mark.slow  # two CPU processes roll out, train, evaluate and save (~40 s on 2 cores)
def test_ddp_config_launches_a_one_step_train(tmp_path):
    """``accelerate launch --config_file ddp.yaml`` overridden to 2 processes that train on the CPU
    (memkit's ``--device cpu``: gloo): one GRPO step of the tiny model over 2 tasks x 2 samples,
    greedy evaluations and a checkpoint, as a user runs it. (accelerate's own ``--cpu`` would start
    one process: its launcher runs CPU jobs through the single-process path.)"""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / "ddp.yaml"),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "-m",
        "memkit.cli",
        "train",
        *("--algo", "grpo", "--method", "mem1", "--init", "tiny", "--device", "cpu"),
        *("--steps", "1", "--tasks-per-step", "2", "--n", "2", "--max-turns", "2", "--objectives", "1"),
        *("--eval-every", "1", "--eval-tasks", "2", "--eval-objectives", "1", "--out", str(out)),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert (row["processes"], row["n_trajectories"]) == (2, 4)
    evaluations = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [(e["step"], e["k"]) for e in evaluations] == [(0, 1), (1, 1)]  # at the start and after the step
    assert (out / "checkpoints" / "step-000001" / "memkit.json").is_file()


def test_engines_memkit_cannot_train_with_are_refused_with_the_config_that_works():
    """FSDP with a critic (accelerate prepares one model under FSDP2) or a vLLM backend (no gathered
    weights for it), DeepSpeed ZeRO-3 (the HF loop over partitioned weights is not run) and PPO under
    DeepSpeed (two models, one engine each) stop at once and name the config that works (issue 57);
    FSDP and DeepSpeed ZeRO-2 with a critic-free rule and the HF loop, DDP and one process pass
    (tests/rl/test_fsdp2.py runs memkit's side of FSDP on CPU; ZeRO-2's and FSDP2's updates equal one
    process's on a GPU: tests/gpu_check.py, accelerate engages either only there)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType
    from dist_worker import make_learner

    from memkit.rl.engines import check_engine

    def acc(kind, stage=None):
        plugin = SimpleNamespace(zero_stage=stage) if stage is not None else None
        return SimpleNamespace(distributed_type=kind, state=SimpleNamespace(deepspeed_plugin=plugin))

    with pytest.raises(ValueError, match=r"prepares one under FSDP2; use a critic-free rule .*ddp.yaml"):
        make_learner("ppo", accelerator=acc(DistributedType.FSDP))
    with pytest.raises(ValueError, match=r"--backend vllm under FSDP .*--backend hf"):
        make_learner("grpo", accelerator=acc(DistributedType.FSDP), backend="vllm")
    with pytest.raises(ValueError, match=r"not ZeRO-3 yet .*fsdp2.yaml .*deepspeed_zero2.yaml"):
        make_learner("grpo", accelerator=acc(DistributedType.DEEPSPEED, 3))
    with pytest.raises(ValueError, match=r"one per DeepSpeed engine; use a critic-free rule"):
        make_learner("ppo", accelerator=acc(DistributedType.DEEPSPEED, 2))
    for kind, stage in [(DistributedType.DEEPSPEED, 2), (DistributedType.DEEPSPEED, 1), (DistributedType.FSDP, None)]:
        check_engine(acc(kind, stage))
    for kind in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        check_engine(acc(kind), critic=True)
