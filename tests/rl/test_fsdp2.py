"""FSDP2 on CPU (issue 57): what this torch and accelerate can run, tested against one process.

accelerate's FSDP plugin does not engage on CPU (tests/fsdp2_worker.py says how it was measured);
torch's own ``fully_shard`` over gloo does: one GRPO step of the sharded tiny Llama with memkit's loss
pieces equals one process's, and memkit's Learner and Trainer run over weights sharded as the plugin
shards them on a GPU (``fsdp2_worker.fsdp2_on_cpu``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dist_worker as dw
import fsdp2_worker as fw
import pytest
import torch

TESTS = Path(__file__).parents[1]


def run_worker(out_dir: Path, *mode: str, timeout: int = 240) -> None:
    """``torchrun --nproc_per_node 2 tests/fsdp2_worker.py OUT_DIR [mode]`` on CPU (gloo, one thread each)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(TESTS / "fsdp2_worker.py"), str(out_dir), *mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, dw.worker_error(proc.stderr)


@pytest.mark.slow  # two torchrun processes (gloo)
def test_fsdp2_over_gloo_matches_one_process(tmp_path):
    """2 processes, each the 3 or 2 tasks of its share, parameters sharded per decoder layer: the
    gathered gradients and the parameters after one AdamW step equal one process's on all 5 tasks
    to 1e-5; accelerate still turns an FSDP plugin on CPU into DDP (MULTI_CPU)."""
    run_worker(tmp_path)
    two = torch.load(tmp_path / "fsdp2.pt")
    assert two["accelerate_type"] == "DistributedType.MULTI_CPU"  # when this changes, test memkit's Learner instead
    model = dw.tiny_llama()
    fw.grpo_loss(model, range(dw.N_TASKS), fw.total_tokens()).backward()
    assert max(float(p.grad.abs().max()) for p in model.parameters()) > 1e-2  # a step that moves the weights
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    for name, p in model.named_parameters():
        torch.testing.assert_close(two["grads"][name], p.grad, atol=1e-5, rtol=0, msg=name)
        torch.testing.assert_close(two["params"][name], p.detach(), atol=1e-5, rtol=0, msg=name)


@pytest.mark.slow  # two torchrun processes (gloo)
def test_rollouts_over_fsdp2_sharded_weights_run_in_lockstep(tmp_path):
    """2 processes, the tiny model sharded per layer, each rank its own rollouts (3 tasks at k = 1 / one
    at k = 2 and an extra ``generate``): with :class:`memkit.models.lockstep.Lockstep` the ranks finish,
    and each wrote what the unsharded model writes for the same work in one process; the ranks ran
    different numbers of forwards, so the one that finished first followed the other's."""
    from memkit.lab.kit import load_kit
    from memkit.models.tiny import build_tiny

    run_worker(tmp_path, "rollout")
    kit = load_kit(0)
    model = build_tiny(kit.tokenizer, seed=0).eval()
    got = [torch.load(tmp_path / f"rollout-{rank}.pt") for rank in (0, 1)]
    for rank in (0, 1):
        want = fw.rank_work(rank, model, kit)
        assert got[rank]["calls"] == want["calls"] and got[rank].get("extra") == want.get("extra")
    rounds = [g["rounds"] for g in got]
    assert rounds[0] != rounds[1], rounds  # different work: the lockstep had something to do
    assert [g["rounds"] + g["dummies"] for g in got] == [max(rounds)] * 2  # one forward per round on each rank


@pytest.mark.slow  # two torchrun processes (gloo)
def test_learner_and_trainer_over_fsdp2_sharded_weights(tmp_path):
    """memkit's side of FSDP on 2 CPU ranks, the weights sharded as accelerate's FSDP2 plugin shards them:
    a GRPO update with recomputed old log-probs and a sharded KL reference, one rank with an empty
    micro-batch (its idle forwards), equals one unsharded process's; the held-out evaluation (lockstep
    rollouts, then the gather) gives every rank one process's rows; two training steps with an
    evaluation finish on both ranks with the same global rows."""
    run_worker(tmp_path, "trainer", timeout=300)
    got = [torch.load(tmp_path / f"trainer-{rank}.pt") for rank in (0, 1)]
    assert got[0]["sharded_ref"] == "FSDPLlamaForCausalLM"  # the reference is sharded too
    one = dw.make_learner("grpo", sort_micro_batches=False, recompute_old_logprobs=True)
    stats = one.update(dw.trajectories())
    assert stats["kl"] > 0 and abs(stats["pg_loss"] - got[0]["stats"]["pg_loss"]) < 1e-7
    moved = 0.0
    for name, p in one.policy.named_parameters():
        torch.testing.assert_close(got[0]["params"][f"policy.{name}"], p.detach(), atol=1e-5, rtol=0, msg=name)
        moved = max(moved, float((p - dw.tiny_llama().get_parameter(name)).detach().abs().max()))
    assert moved > 1e-3  # the update moved the weights well past the bound
    assert got[0]["eval"] == got[1]["eval"] == [pytest.approx(row, abs=1e-9) for row in dw.eval_rows()]
    rows = [[{k: v for k, v in r.items() if not k.startswith("seconds")} for r in g["history"]] for g in got]
    assert rows[0] == rows[1] and [r["processes"] for r in rows[0]] == [2, 2]  # global rows: the same on both
    assert got[0]["eval_history"] == got[1]["eval_history"] and [r["step"] for r in got[0]["eval_history"]] == [0, 2]
    assert sum(g["dummies"] for g in got) > 0  # the ranks decoded different numbers of forwards
