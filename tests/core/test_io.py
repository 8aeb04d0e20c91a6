"""memkit.core.io.build_lock: a cache entry built once across processes, never left locked by a dead one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memkit.core.io import BUILT_BY_ENV, build_lock, built_by

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fcntl locks: POSIX only")

# a process that builds `entry` under the lock unless it exists: sleeps while building (the other
# process asks meanwhile), then appends its pid to `builds` (one line per build that really ran)
BUILDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from memkit.core.io import build_lock, atomic_write_text
    entry, builds = Path(sys.argv[1]), Path(sys.argv[2])
    with build_lock(entry):
        if not entry.exists():
            time.sleep(1.0)
            with open(builds, "a") as f:
                f.write(f"{os.getpid()}\\n")
            atomic_write_text(entry, "built")
    print(entry.read_text())
    """
)


def _builder(entry: Path, builds: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(entry), str(builds)], env=env, stdout=subprocess.PIPE, text=True
    )


def test_two_processes_build_one_entry_once(tmp_path):
    entry, builds = tmp_path / "cache" / "model", tmp_path / "builds.txt"
    procs = [_builder(entry, builds) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == ["built", "built"]  # the second waited and found the first one's entry
    assert len(builds.read_text().splitlines()) == 1


def test_a_killed_holder_leaves_the_entry_unlocked(tmp_path):
    entry = tmp_path / "model"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom memkit.core.io import build_lock\n"
            f"with build_lock({str(entry)!r}):\n    print('held', flush=True)\n    time.sleep(60)",
        ],
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    t0 = time.perf_counter()
    with build_lock(entry):  # the OS dropped the dead holder's lock
        pass
    assert time.perf_counter() - t0 < 5
    assert not entry.exists() and (tmp_path / "model.lock").exists()


def test_an_entry_built_under_the_lock_names_its_builder(tmp_path, monkeypatch):
    """``<entry>.built`` says who built it (``memkit reproduce`` credits a notebook with its own builds only):
    the environment's tag, else the pid; an entry that was there already, or that the block did not build,
    gets no marker."""
    entry, other, absent = tmp_path / "model", tmp_path / "other", tmp_path / "absent"
    monkeypatch.setenv(BUILT_BY_ENV, "run/07_real_data.ipynb")
    with build_lock(entry):
        entry.mkdir()
    assert built_by(entry) == "run/07_real_data.ipynb"
    other.mkdir()
    with build_lock(other):  # found built: nothing to record
        pass
    with build_lock(absent):  # not built: nothing either
        pass
    assert built_by(other) is None and built_by(absent) is None
    monkeypatch.delenv(BUILT_BY_ENV)
    with build_lock(tmp_path / "m2"):
        (tmp_path / "m2").mkdir()
    assert built_by(tmp_path / "m2") == f"pid {os.getpid()}"
