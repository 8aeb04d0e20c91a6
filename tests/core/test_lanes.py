"""memkit.core.lanes: tasks with dependencies on lanes of pinned worker processes (memkit reproduce --jobs)."""

from __future__ import annotations

import io
import json
import os
import time

import pytest

from memkit.core.lanes import Task, check_tasks, critical_path, lane_cores, run_tasks


def note(name: str, seconds: float = 0.05) -> dict:
    """A task: sleeps, then says where it ran (its process and the cores it may use)."""
    t0 = time.time()
    time.sleep(seconds)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {
        "name": name,
        "pid": os.getpid(),
        "cores": cores,
        "start": t0,
        "end": time.time(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
    }


def torch_threads(name: str, seconds: float = 0.05) -> dict:
    """A task that uses torch: :func:`note` plus the size of this process's torch thread pool."""
    import torch

    torch.ones(64, 64) @ torch.ones(64, 64)  # sizes the OpenMP pool
    return {**note(name, seconds), "torch_threads": torch.get_num_threads()}


def fail(name: str) -> None:
    raise RuntimeError(f"{name} broke")


def test_lane_cores_split_round_robin_and_refuse_zero():
    assert lane_cores(2, [0, 1]) == [[0], [1]]
    assert lane_cores(2, [0, 1, 2, 3]) == [[0, 2], [1, 3]]
    assert lane_cores(4, [0, 1]) == [[0], [1]]  # never more lanes than cores
    with pytest.raises(ValueError, match="at least one lane"):
        lane_cores(0, [0, 1])


def test_check_tasks_names_duplicates_unknown_needs_and_cycles():
    with pytest.raises(ValueError, match="unique"):
        check_tasks([Task("a", note), Task("a", note)])
    with pytest.raises(ValueError, match=r"needs \['z'\]"):
        check_tasks([Task("a", note, needs=("z",))])
    with pytest.raises(ValueError, match="cycle: a -> b -> a"):
        check_tasks([Task("a", note, needs=("b",)), Task("b", note, needs=("a",))])


def test_critical_path_is_the_longest_chain_behind_a_task():
    tasks = [
        Task("base", note, minutes=8),
        Task("cons", note, needs=("base",), minutes=20),
        Task("retr", note, needs=("base",), minutes=15),
        Task("nb06", note, needs=("cons", "retr"), minutes=7),
        Task("mem1", note, minutes=18),
    ]
    rest = critical_path(tasks)
    assert rest == {"base": 8 + 20 + 7, "cons": 27, "retr": 22, "nb06": 7, "mem1": 18}


def test_one_lane_runs_the_longest_chain_first_and_respects_needs():
    order = []
    tasks = [
        Task("short", note, ("short",), minutes=1),
        Task("head", note, ("head",), minutes=2),
        Task("tail", note, ("tail",), needs=("head",), minutes=5),
    ]
    out = run_tasks(tasks, 1, on_done=lambda o: order.append(o.name))
    assert order == ["head", "tail", "short"]  # head's chain is 7 minutes, short's 1
    assert all(o.ok and o.value["name"] == o.name for o in out.values())
    assert out["tail"].value["start"] >= out["head"].value["end"]


def test_two_lanes_run_side_by_side_each_pinned_to_its_core(whole_machine):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    cores = sorted(os.sched_getaffinity(0))[:2]
    out = run_tasks([Task("a", note, ("a", 1.0)), Task("b", note, ("b", 1.0))], 2, cores=cores)
    a, b = out["a"].value, out["b"].value
    assert a["pid"] != b["pid"] and sorted(a["cores"] + b["cores"]) == cores and len(a["cores"]) == 1
    assert a["omp"] == b["omp"] == "1"
    assert a["start"] < b["end"] and b["start"] < a["end"]  # they overlapped


def test_a_wide_task_runs_alone_on_every_core_first(whole_machine):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    cores = sorted(os.sched_getaffinity(0))[:2]
    out = run_tasks(
        [
            Task("long", note, ("long", 0.3), minutes=50),
            Task("wide", note, ("wide", 0.5), minutes=1, wide=True),
            Task("after", note, ("after",), needs=("wide",)),
        ],
        2,
        cores=cores,
    )
    wide, long_ = out["wide"].value, out["long"].value
    assert wide["cores"] == cores and wide["omp"] == "2"  # widened for the task ...
    assert long_["start"] >= wide["end"]  # ... and alone, although "long" has the longer chain
    assert out["after"].value["cores"] != cores  # the lane is narrowed again afterwards


def test_after_a_wide_torch_task_the_lane_has_one_torch_thread_per_core(whole_machine):
    """A wide task loads torch with a pool of two threads; the lane it returns to has one core, so
    its pool must shrink to one (two spin-waiting threads on one core: an 18x slower SFT)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    cores = sorted(os.sched_getaffinity(0))[:2]
    out = run_tasks(
        [
            Task("wide", torch_threads, ("wide",), minutes=1, wide=True),
            *(Task(f"after{i}", torch_threads, (f"after{i}", 0.3), needs=("wide",)) for i in range(2)),
        ],
        2,
        cores=cores,
    )
    assert out["wide"].value["torch_threads"] == 2
    assert [out[f"after{i}"].value["torch_threads"] for i in range(2)] == [1, 1]


def test_a_failed_task_fails_what_needs_it_and_the_rest_goes_on():
    out = run_tasks(
        [
            Task("bad", fail, ("bad",), minutes=3),
            Task("after", note, ("after",), needs=("bad",)),
            Task("after2", note, ("after2",), needs=("after",)),
            Task("free", note, ("free",)),
        ],
        1,
    )
    assert not out["bad"].ok and out["bad"].error == "RuntimeError: bad broke"
    assert out["after"].error == "not run: it needs bad, which failed"
    assert out["after2"].error == "not run: it needs after, which failed"
    assert out["free"].ok


def test_reproduce_jobs_refuses_smoke_and_bad_seeds(tmp_path):
    from memkit.course.reproduce import reproduce

    with pytest.raises(ValueError, match="drop --jobs"):
        reproduce(smoke=True, jobs=2, notebooks_dir=tmp_path, stream=io.StringIO())
    with pytest.raises(ValueError, match="drop --jobs"):
        reproduce(smoke=False, model="smollm2-135m", jobs=2, notebooks_dir=tmp_path, stream=io.StringIO())
    with pytest.raises(ValueError, match="at least 1 seed"):
        reproduce(smoke=False, seeds=0, notebooks_dir=tmp_path, stream=io.StringIO())


@pytest.mark.slow
def test_reproduce_on_two_lanes_runs_every_notebook_and_passes_n_seeds(tmp_path, whole_machine):
    """Lab mode on 2 lanes (notebooks that load no lab clone): both notebooks run, each in its own
    lane, N_SEEDS reaches the notebook that declares it, the report and summary list both."""
    from nbtools import make_notebook

    from memkit.course.reproduce import reproduce

    nbs = tmp_path / "nbs"
    body = "import os, memkit.course.nb as nb\nnb.record('cores', sorted(os.sched_getaffinity(0)))\nnb.record('seeds', N_SEEDS)"
    make_notebook(nbs / "xa.ipynb", [body], parameters="SMOKE = True\nN_SEEDS = 1\n")
    make_notebook(nbs / "xb.ipynb", ["import memkit.course.nb as nb; nb.record('seed', SEED)"], parameters="SEED = 0\n")
    run = reproduce(
        smoke=False, model="tiny", out_root=tmp_path / "runs", notebooks_dir=nbs, jobs=2, seeds=3, stream=io.StringIO()
    )  # stems outside the lab's 00-06 names load no lab clone
    summary = json.loads((run / "summary.json").read_text())
    recs = {n["name"]: n["records"] for n in summary["notebooks"]}
    assert [n["ok"] for n in summary["notebooks"]] == [True, True] and summary["clones"] == []
    assert recs["xa"]["seeds"] == 3 and recs["xb"]["seed"] == 0
    if len(os.sched_getaffinity(0)) >= 2:
        assert len(recs["xa"]["cores"]) == len(os.sched_getaffinity(0)) // 2
    assert summary["meta"]["jobs"] == 2 and "wall_seconds" in summary["meta"]
    with pytest.raises(ValueError, match="same --smoke/--model/--seed/--seeds"):  # a 3-seed run goes on with 3
        reproduce(smoke=False, model="tiny", notebooks_dir=nbs, jobs=2, seeds=1, resume=run, stream=io.StringIO())
    out = io.StringIO()
    assert reproduce(smoke=False, model="tiny", notebooks_dir=nbs, jobs=2, seeds=3, resume=run, stream=out) == run
    assert out.getvalue().count("kept from the resumed run") == 2
