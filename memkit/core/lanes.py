"""Tasks with dependencies on parallel lanes: how ``memkit reproduce --jobs N`` spends N cores.

A lane is one worker process pinned to its share of the cores (``os.sched_setaffinity``); what it
starts (a notebook's kernel, an SFT) inherits the pinning, so on the 2-core machine two lanes run
one torch thread each instead of four threads fighting over two cores. A task starts when every
task it ``needs`` has finished and a lane is free. Among the ready tasks the one with the longest
chain of work still behind it goes first (list scheduling by critical path; a ``wide`` task, which
needs every core, goes before all and waits for every lane to be free):

    rest(t) = minutes(t) + max(rest(u) for u needing t, default 0)

so a long chain (the pretrained base, then Mem-T's clones, then notebook 06) starts before short
independent work. A failed task fails the tasks that need it, with the reason; the others go on.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from memkit.core.cpu import usable_core_ids


@dataclass
class Task:
    name: str
    fn: Callable[..., Any]  # a module-level function: lanes are spawned processes
    args: tuple = ()
    needs: tuple[str, ...] = ()
    minutes: float = 1.0  # expected length, for the order only
    wide: bool = False  # runs alone on every lane's cores (a time-budgeted run that trains on all cores)


@dataclass
class Outcome:
    name: str
    ok: bool
    seconds: float
    lane: int
    value: Any = None
    error: str | None = None
    cores: list[int] = field(default_factory=list)


def lane_cores(jobs: int, cores: Sequence[int] | None = None) -> list[list[int]]:
    """Split ``cores`` (default: this process's) over ``min(jobs, len(cores))`` lanes, round-robin."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: run at least one lane (--jobs 1 runs the tasks one after another)")
    cores = list(cores) if cores is not None else usable_core_ids()
    n = min(jobs, len(cores))
    return [cores[i::n] for i in range(n)]


def check_tasks(tasks: Sequence[Task]) -> None:
    """``ValueError`` for a duplicate name, a need that is not a task, or a cycle of needs."""
    names = [t.name for t in tasks]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"task names must be unique: {dup}")
    by = {t.name: t for t in tasks}
    for t in tasks:
        missing = [d for d in t.needs if d not in by]
        if missing:
            raise ValueError(f"task {t.name!r} needs {missing}, which are not tasks")
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(n: str, path: tuple[str, ...]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError(f"tasks need each other in a cycle: {' -> '.join(path + (n,))}")
        state[n] = 1
        for d in by[n].needs:
            visit(d, path + (n,))
        state[n] = 2

    for n in by:
        visit(n, ())


def critical_path(tasks: Sequence[Task]) -> dict[str, float]:
    """rest(t): t's minutes plus the longest chain of tasks that (transitively) need t."""
    needed_by: dict[str, list[str]] = {t.name: [] for t in tasks}
    for t in tasks:
        for d in t.needs:
            needed_by[d].append(t.name)
    by = {t.name: t for t in tasks}
    rest: dict[str, float] = {}

    def r(n: str) -> float:
        if n not in rest:
            rest[n] = by[n].minutes + max((r(u) for u in needed_by[n]), default=0.0)
        return rest[n]

    return {t.name: r(t.name) for t in tasks}


def _pin(cores: list[int]) -> None:
    """Lane initializer: this process and its children run on ``cores`` only, with one torch thread
    per core. If torch is loaded already (a wide task widened its pool), its pool is resized too:
    two OpenMP threads spin-waiting on one core made a lane's SFT ~18x slower than on two free
    cores (measured: docs/findings.md, '`make reproduce`: every claim judged from one lab run, and a lane bug')."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cores))


def _timed(fn, args, widen: list[int] | None = None):
    """Run ``fn(*args)``; a wide task first widens this lane's process to ``widen`` (every lane's cores)."""
    pinned = sorted(os.sched_getaffinity(0)) if widen and hasattr(os, "sched_getaffinity") else None
    if pinned is not None:
        _pin(widen)
    t0 = time.perf_counter()
    try:
        return fn(*args), time.perf_counter() - t0
    finally:
        if pinned is not None:
            _pin(pinned)


def run_tasks(
    tasks: Sequence[Task],
    jobs: int,
    on_done: Callable[[Outcome], None] | None = None,
    cores: Sequence[int] | None = None,
    on_start: Callable[[Task, int], None] | None = None,
) -> dict[str, Outcome]:
    """Run ``tasks`` on ``jobs`` lanes (see the module docstring); ``on_start(task, lane)`` and
    ``on_done(outcome)`` are called in this process, in that order of events. Returns every task's
    :class:`Outcome`."""
    check_tasks(tasks)
    lanes_cores = lane_cores(jobs, cores)
    rest = critical_path(tasks)
    pending = sorted(tasks, key=lambda t: (not t.wide, -rest[t.name]))
    every_core = sorted(c for cs in lanes_cores for c in cs)
    ctx = get_context("spawn")
    lanes = [ProcessPoolExecutor(1, mp_context=ctx, initializer=_pin, initargs=(c,)) for c in lanes_cores]
    free, running, out = list(range(len(lanes))), {}, {}

    def finish(o: Outcome) -> None:
        out[o.name] = o
        if on_done:
            on_done(o)

    try:
        while pending or running:
            for t in list(pending):  # in order of the chains: a failure reaches the whole chain in one pass
                bad = [d for d in t.needs if d in out and not out[d].ok]
                if bad:
                    pending.remove(t)
                    finish(Outcome(t.name, False, 0.0, -1, error=f"not run: it needs {', '.join(bad)}, which failed"))
            for t in [t for t in pending if all(d in out and out[d].ok for d in t.needs)]:
                if not free or (t.wide and len(free) < len(lanes)):
                    break  # a ready wide task holds back the rest until every lane is free
                lane = free.pop(0)
                held = list(free) if t.wide else []
                free = [f for f in free if f not in held]
                if on_start:
                    on_start(t, lane)
                running[lanes[lane].submit(_timed, t.fn, t.args, every_core if t.wide else None)] = (t, lane, held)
                pending.remove(t)
            if not running:
                continue
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for f in done:
                t, lane, held = running.pop(f)
                free += [lane, *held]
                try:
                    value, seconds = f.result()
                    finish(Outcome(t.name, True, seconds, lane, value, cores=lanes_cores[lane]))
                except Exception as e:  # the task raised, or its lane died: report it, go on
                    msg = str(e).strip().splitlines()
                    finish(
                        Outcome(
                            t.name,
                            False,
                            0.0,
                            lane,
                            error=f"{type(e).__name__}: {msg[0] if msg else ''}",
                            cores=lanes_cores[lane],
                        )
                    )
                    if type(e).__name__ == "BrokenProcessPool":
                        lanes[lane].shutdown(wait=False)
                        lanes[lane] = ProcessPoolExecutor(
                            1, mp_context=ctx, initializer=_pin, initargs=(lanes_cores[lane],)
                        )
    except BaseException:  # Ctrl-C or a failing callback: stop the lanes' work now, not after it ends
        for ex in lanes:
            for proc in list(getattr(ex, "_processes", {}).values()):
                proc.terminate()
        raise
    finally:
        for ex in lanes:
            ex.shutdown(wait=True, cancel_futures=True)
    return out
