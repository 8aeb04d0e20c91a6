"""Files and caches every layer shares: one atomic writer (files and directories), one cache
directory, a lock for building a cache entry once across processes, and the reader of a training
run's ``checkpoints/latest``.

Nothing is lost when a process is killed mid-write: text goes to a temp file in the target's
directory, is fsync'ed, then ``os.replace``-d over the target (atomic on POSIX), so a reader
sees either the old file or the new one, never half of it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """memkit's cache: ``$MEMKIT_CACHE`` or ``~/.cache/memkit`` (created if missing)."""
    path = Path(os.environ.get("MEMKIT_CACHE") or Path.home() / ".cache" / "memkit").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


#: the environment variable naming who builds cache entries in this process (``memkit reproduce`` sets it to
#: the notebook's record path for its kernel); :func:`build_lock` writes it beside each entry it saw built
BUILT_BY_ENV = "MEMKIT_BUILT_BY"


@contextmanager
def build_lock(path: str | Path):
    """Hold an exclusive lock on ``<path>.lock`` (beside ``path``) for the block: one process at a time
    builds a cache entry, and a second one that asks for it waits, then finds it built, instead of
    training the same model again (or continuing the same interrupted run) beside the first. Two
    notebooks on a shared lab machine, ``memkit reproduce --jobs 2`` and ``pytest -n 2`` all meet
    here. ``fcntl.flock``: released by the OS when the holder dies, so a killed build never leaves the
    entry locked; where ``fcntl`` is missing (Windows) the block runs unlocked::

        with build_lock(path):
            if not path.exists():
                train_into(path)

    An entry the block built (absent before, present after) gets ``<path>.built``: who built it
    (:data:`BUILT_BY_ENV`, else ``pid N``; :func:`built_by`), so a report can credit the entry to the
    notebook that paid for it and not to another process that ran beside it.
    """
    path = Path(path)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        existed = path.exists()
        yield
        _mark_built(path, existed)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            existed = path.exists()
            yield
            _mark_built(path, existed)
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _mark_built(path: Path, existed: bool) -> None:
    if not existed and path.exists():
        atomic_write_text(path.with_name(path.name + ".built"), os.environ.get(BUILT_BY_ENV) or f"pid {os.getpid()}")


def built_by(path: str | Path) -> str | None:
    """Who built the cache entry ``path`` under :func:`build_lock` (its ``.built`` file), None when unrecorded."""
    marker = Path(path).with_name(Path(path).name + ".built")
    return marker.read_text() if marker.is_file() else None


def read_jsonl(path: str | Path, parse, what: str, how_to_make: str) -> list:
    """``parse(json.loads(line))`` for every non-empty line of a JSONL file.

    A missing file raises ``FileNotFoundError`` and a bad line ``ValueError``, each one message
    naming the file (and line), ``what`` was expected and ``how_to_make`` a good one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} does not exist; {how_to_make}")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(parse(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"{path}:{i} is not a memkit {what} ({type(e).__name__}: {e}); {how_to_make}") from None
    return out


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file + rename so a crash never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def replace_dir(src: str | Path, dst: str | Path, keep_existing: bool = False) -> Path:
    """Move the finished directory ``src`` to ``dst`` (same filesystem).

    ``keep_existing``: a ``dst`` that already exists wins and ``src`` is deleted (caches: a
    concurrent process finished first). Otherwise an old ``dst`` is renamed aside before ``src``
    takes its name and deleted after, so ``dst`` is missing only between two renames, never
    while a tree is being deleted."""
    src, dst = Path(src), Path(dst)
    if keep_existing and dst.exists():
        shutil.rmtree(src, ignore_errors=True)
        return dst
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    try:
        os.replace(src, dst)
    except OSError:
        if keep_existing and dst.exists():  # lost the race to another process: keep its copy
            shutil.rmtree(src, ignore_errors=True)
            return dst
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dst


@contextmanager
def atomic_dir(path: str | Path, keep_existing: bool = False):
    """Yield a temp directory beside ``path``; when the block ends without an error it becomes
    ``path`` (:func:`replace_dir`), else it is deleted. A crash never leaves half a directory::

        with atomic_dir(cache_dir() / "tokenizer", keep_existing=True) as tmp:
            tok.save_pretrained(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        replace_dir(tmp, path, keep_existing)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The checkpoint ``ckpt_dir/latest`` names when it is complete (has ``memkit.json``); else
    the newest complete ``step-*`` directory (a run killed between writing a checkpoint and
    ``latest``, or a ``latest`` naming a removed one); None if there is none. The layout is
    ``memkit.rl.checkpoint``'s; ``load_policy`` reads it too."""
    ckpt_dir = Path(ckpt_dir)
    pointer = ckpt_dir / "latest"
    if pointer.is_file():
        path = ckpt_dir / pointer.read_text().strip()
        if (path / "memkit.json").is_file():
            return path
    complete = sorted(p for p in ckpt_dir.glob("step-*") if (p / "memkit.json").is_file())
    return complete[-1] if complete else None


#: fault injection for the kill-and-resume tests: ``MEMKIT_KILL_AT=<point>:<n>`` makes the process
#: SIGKILL itself the n-th time it reaches ``<point>`` (:func:`kill_point`); unset, nothing happens
KILL_ENV = "MEMKIT_KILL_AT"
_passes: dict[str, int] = {}


def kill_point(name: str) -> None:
    """A place where a real crash is tested (a checkpoint half written, a log line half appended)."""
    spec = os.environ.get(KILL_ENV)
    if not spec or spec.rsplit(":", 1)[0] != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == int(spec.rsplit(":", 1)[1]):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
