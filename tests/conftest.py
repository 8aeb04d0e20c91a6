"""Shared pytest setup: markers, a per-session model/data cache, a temp OUT_DIR, and the cores of
``pytest -n N`` workers (``make test`` runs one worker per core: pytest-xdist)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import nbtools` from test modules

#: every core this pytest process could use before an xdist worker pinned itself (:func:`_pin_worker`)
ALL_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _pin_worker() -> None:
    """Under ``pytest -n N`` (N <= cores), worker i keeps cores i, i + N, ... (as ``memkit.core.lanes``
    gives lanes theirs) and sizes OpenMP to them. The tiny model's tests and the SMOKE notebooks run
    one torch thread; what would use two (a notebook's SFT under ``all_cores``) then uses its
    worker's core only, instead of spin-waiting against the other worker's (OpenMP threads on a busy
    core: ~10x slower, and a time-budgeted SFT would train fewer steps). Subprocesses (notebook
    kernels, the CLI, torchrun) inherit the affinity and ``OMP_NUM_THREADS``; set before torch loads."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not ALL_CORES:
        return
    mine = ALL_CORES[int(worker.removeprefix("gw")) % count :: count] if len(ALL_CORES) >= count else []
    if mine:
        os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(mine)))


def pytest_configure(config):
    _pin_worker()
    # also declared in pyproject.toml; repeated so a bare `pytest tests/x.py -c /dev/null` works
    config.addinivalue_line("markers", "slow: longer tests (notebooks, training)")
    config.addinivalue_line("markers", "browser: needs /usr/bin/chromium and playwright")
    config.addinivalue_line("markers", "fuzz: property tests; `make test-fuzz` runs them with 10,000 examples each")


#: modules whose tests are independent of each other and long (one notebook each): ``pytest -n N``
#: spreads them over the workers; every other module runs on one worker, so its module-scoped
#: fixtures (a vLLM engine, a trained clone) are built once
SPREAD_MODULES = {"test_notebooks.py"}


def pytest_collection_modifyitems(config, items):
    """``make test``'s ``--dist loadgroup``: one xdist group per test module except SPREAD_MODULES.
    (Running the notebooks first was tried: two SMOKE notebooks side by side on a cold cache made the
    suite slower, 1,085 s against 974 s: docs/findings.md.)"""
    for item in items:
        if item.path.name not in SPREAD_MODULES and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest.fixture(scope="session", autouse=True)
def memkit_cache(tmp_path_factory):
    """MEMKIT_CACHE -> one shared per-session directory, unless the caller already set it. Under
    ``pytest -n N`` the workers share it (the temp root above their own): each model is built once,
    the others wait for it (``memkit.core.io.build_lock``)."""
    if os.environ.get("MEMKIT_CACHE"):
        yield Path(os.environ["MEMKIT_CACHE"])
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        d = tmp_path_factory.getbasetemp().parent / "memkit-cache"
        d.mkdir(exist_ok=True)
    else:
        d = tmp_path_factory.mktemp("memkit-cache")
    os.environ["MEMKIT_CACHE"] = str(d)
    try:
        yield d
    finally:
        os.environ.pop("MEMKIT_CACHE", None)


@pytest.fixture(scope="module")
def kit():
    """The synthetic world of seed 0 with its tokenizer (``memkit.lab.kit.load_kit``), once per module; a module
    that needs another kit (real data, a chat model's) defines its own ``kit``."""
    from memkit.lab.kit import load_kit

    return load_kit(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls gain nothing from 2 threads, and on a shared 2-core box OpenMP spin-waits
    made model tests ~10x slower; restore the setting afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def whole_machine():
    """The test may use every core of the machine (a test of lanes that pins its own): an xdist
    worker widens its affinity for the test and narrows it again after."""
    if not ALL_CORES:
        yield []
        return
    mine = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, ALL_CORES)
    try:
        yield ALL_CORES
    finally:
        os.sched_setaffinity(0, mine)


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """A fresh OUT_DIR; figures and records written outside the harness also land in tmp."""
    d = tmp_path / "out"
    d.mkdir()
    monkeypatch.setenv("MEMKIT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("MEMKIT_RECORD_PATH", str(tmp_path / "records.json"))
    return d
