"""Shared pytest setup: markers, a per-session model/data cache, a temp OUT_DIR."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import nbtools` from test modules


def pytest_configure(config):
    # also declared in pyproject.toml; repeated so a bare `pytest tests/x.py -c /dev/null` works
    config.addinivalue_line("markers", "slow: longer tests (notebooks, training)")
    config.addinivalue_line("markers", "browser: needs /usr/bin/chromium and playwright")
    config.addinivalue_line("markers", "fuzz: property tests; `make test-fuzz` runs them with 10,000 examples each")


@pytest.fixture(scope="session", autouse=True)
def memkit_cache(tmp_path_factory):
    """MEMKIT_CACHE -> one shared per-session directory, unless the caller already set it."""
    if os.environ.get("MEMKIT_CACHE"):
        yield Path(os.environ["MEMKIT_CACHE"])
        return
    d = tmp_path_factory.mktemp("memkit-cache")
    os.environ["MEMKIT_CACHE"] = str(d)
    try:
        yield d
    finally:
        os.environ.pop("MEMKIT_CACHE", None)


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
def out_dir(tmp_path, monkeypatch):
    """A fresh OUT_DIR; figures and records written outside the harness also land in tmp."""
    d = tmp_path / "out"
    d.mkdir()
    monkeypatch.setenv("MEMKIT_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("MEMKIT_RECORD_PATH", str(tmp_path / "records.json"))
    return d
