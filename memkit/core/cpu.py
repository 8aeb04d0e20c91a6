"""CPU knobs for small models: threads, the memory allocator, and whether the cores are free.

The tiny model is so small that how the process runs matters as much as what it computes:

* **Threads.** Small batched decodes gain nothing from a second thread and can lose a lot to
  OpenMP spin-waits on a busy 2-core box, while SFT's matmuls run faster on two
  (:func:`notebook_cpu_setup`, :func:`all_cores`).
* **The allocator.** PyTorch's CPU tensors come from ``malloc``. glibc serves every block above
  its mmap threshold (128 KiB at start, raised on the fly up to 32 MiB) with a fresh ``mmap``
  and unmaps it on ``free``, so each new KV-cache buffer, prefill activation or logits tensor
  page-faults its memory back in, zero-filled by the kernel, every step.
  :func:`keep_freed_memory` keeps such blocks in the heap for reuse instead, what preloading
  jemalloc/tcmalloc does in PyTorch's CPU tuning guide: batched rollouts and SFT steps run a few
  percent faster, with far fewer page faults (measured: docs/findings.md, 'CPU runtime').
* **Other jobs.** A wall-clock SFT budget buys fewer steps on a shared CPU
  (:func:`busy_cpu_note`).

Not needed: the old trick of making MKL treat an AMD CPU as Intel. With torch 2.13's MKL the
tiny model's matmuls run at the same speed either way (measured: docs/findings.md, 'CPU runtime').
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from contextlib import contextmanager

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit: larger blocks are still mmapped and returned
_TRIM_THRESHOLD = 1 << 30  # free memory kept at the top of the heap before it is given back
_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Let glibc reuse freed blocks of up to 32 MiB instead of unmapping them (see module doc).

    Sets ``M_MMAP_THRESHOLD`` to its 32 MiB ceiling (blocks above it are still mmapped and
    returned to the system at once) and ``M_TRIM_THRESHOLD`` to 1 GiB (the heap keeps up to
    that much free memory at its top). Process-wide and idempotent; returns whether it is in
    effect. A no-op returning False where the C library is not glibc (macOS, musl) or when
    ``MEMKIT_KEEP_FREED_MEMORY=0``. Numbers are unaffected: only where memory comes from changes.
    """
    global _kept
    if _kept is not None:
        return _kept
    _kept = False
    if os.environ.get("MEMKIT_KEEP_FREED_MEMORY", "1") == "0":
        return _kept
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 -- glibc only: the mallopt parameters below are glibc's
    except (OSError, AttributeError):
        return _kept
    _kept = (
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
        and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
    )  # mallopt returns 1 on success
    return _kept


def notebook_cpu_setup(smoke: bool) -> int:
    """The notebooks' CPU setup: one torch thread in SMOKE mode or on a machine of <= 2 cores
    (OpenMP spin-waits can make small-model generation ~100x slower on a busy box), and
    :func:`keep_freed_memory`. Returns the torch thread count now in force."""
    import torch

    if smoke or (os.cpu_count() or 1) <= 2:
        torch.set_num_threads(1)
    keep_freed_memory()
    return torch.get_num_threads()


def usable_core_ids() -> list[int]:
    """The cores this process may run on (its CPU affinity where the OS reports it, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (:func:`usable_core_ids`)."""
    return len(usable_core_ids())


@contextmanager
def all_cores():
    """Train on every core this process may use, then restore the caller's thread count.

    Notebooks on a 2-core machine set one torch thread for generation (small batched decodes
    gain nothing from two and lose a lot to OpenMP spin-waits on a busy box), but SFT's
    matmuls do run ~1.8x faster on two: a time-budgeted SFT inside a notebook then takes as
    many steps, and gives the same model, as `memkit sft` from the shell.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(before, usable_cores()))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def cpu_busy_share(interval: float = 0.5) -> float | None:
    """Share of all cores' time spent busy over the next ``interval`` seconds (Linux ``/proc/stat``).

    Called while this process sleeps, so it measures *other* jobs. None where ``/proc/stat`` is missing.
    """

    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(interval)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def busy_cpu_note(busy: float | None = None) -> str | None:
    """A warning when other processes already use the cores a time-budgeted SFT will train on.

    The budget is wall-clock, so a shared CPU means fewer steps, and the tiny model's EM rises
    steeply near the step counts a 10-minute run reaches (measured: docs/findings.md, 'SFT recipe',
    "Run it alone").
    ``busy`` defaults to :func:`cpu_busy_share` (half a second of sampling).
    """
    busy = cpu_busy_share() if busy is None else busy
    if busy is None or busy < 0.25:
        return None
    return (
        f"note: other jobs keep the CPU {100 * busy:.0f}% busy; a time-budgeted SFT trains fewer steps beside "
        "them and ends less accurate. Run it alone, or pass --max-minutes 0 to train all --steps whatever the time."
    )
