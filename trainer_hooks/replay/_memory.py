"""Keeping a replay's resident memory close to what it holds (glibc only; no-ops elsewhere).

A rebuild allocates and frees float32 buffers of tens of MB per screenshot (the processor's
intermediates, then its output once cast). glibc serves allocations above its mmap threshold
with ``mmap`` and returns them on ``free``, but that threshold adapts upwards after each such
free (up to 32 MiB), after which buffers of that size come from the heap, whose freed holes stay
resident under the tensors kept for the step. Two remedies:

* :func:`release_freed_memory` (``malloc_trim(0)``) after each sample: gives free heap pages
  back to the OS, holes included. Cheap; :func:`compute_multimodal_train_inputs` calls it.
* :func:`tune_allocator` (``mallopt(M_MMAP_THRESHOLD, 4 MiB)``): fixes the threshold, so that
  every large buffer is mapped and unmapped. Process-wide, so only a process that exists to
  replay sets it: ``rollout-bundle replay``, its Ray tasks, ``benchmarks/bench_replay.py``.
  A trainer process keeps its allocator as it is.

``benchmarks/bench_replay.py`` measures the effect (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

__all__ = ["MMAP_THRESHOLD", "release_freed_memory", "tune_allocator"]

MMAP_THRESHOLD = 4 * 1024 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only (musl has no malloc_trim)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def _trim() -> Callable[[], None]:
    if _LIBC is None:
        return lambda: None
    fn = _LIBC.malloc_trim
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int

    def trim() -> None:
        fn(0)

    return trim


release_freed_memory = _trim()


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; False where unsupported."""
    if _LIBC is None:
        return False
    fn = _LIBC.mallopt
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return bool(fn(_M_MMAP_THRESHOLD, int(threshold)))
