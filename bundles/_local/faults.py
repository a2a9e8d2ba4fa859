"""Named fault points: the places where tests make a crash or a concurrent change happen exactly
there, deterministically, instead of hoping a timer lands in the right window.

Code that has a moment worth testing (between two renames, after the n-th media file is linked,
between a sweep's verdict and its deletion) calls ``fault_point("commit.between-renames")``.
Nothing happens unless a test armed that point:

* ``ROLLOUT_BUNDLES_KILL_AT=<name>[@<n>]`` in the environment of a process makes it SIGKILL
  itself the ``n``-th time (default: the first) it passes ``<name>``; read once at import.
  The crash-injection suite (tests/test_crash_injection.py) runs saves in subprocesses this way.
* :func:`on_fault_point` runs a callback in-process at a point, for a concurrent change.

Unarmed, a fault point costs one function call and a truth test of one global.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

KILL_ENV = "ROLLOUT_BUNDLES_KILL_AT"


def _parse_kill(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, count = spec.partition("@")
    return name, int(count) if count else 1


_kill = _parse_kill(os.environ.get(KILL_ENV))
_callbacks: dict[str, Callable[..., None]] = {}
_armed = _kill is not None
_passes: dict[str, int] = {}
_lock = threading.Lock()


def arm_kill(spec: str | None) -> None:
    """Arm (or with None disarm) the kill point as ``ROLLOUT_BUNDLES_KILL_AT`` would, for a
    process forked after import (the crash-injection suite forks one child per kill point)."""
    global _kill, _armed
    _kill = _parse_kill(spec)
    _passes.clear()
    _armed = _kill is not None or bool(_callbacks)


def fault_point(name: str, *args: Any) -> None:
    """Mark a moment named ``name``; ``args`` are passed to an in-process callback."""
    if not _armed:
        return
    _hit(name, args)


def _hit(name: str, args: tuple[Any, ...]) -> None:
    if _kill is not None and _kill[0] == name:
        with _lock:
            n = _passes[name] = _passes.get(name, 0) + 1
        if n == _kill[1]:
            os.kill(os.getpid(), signal.SIGKILL)
    callback = _callbacks.get(name)
    if callback is not None:
        callback(*args)


@contextmanager
def on_fault_point(name: str, callback: Callable[..., None]) -> Iterator[None]:
    """Run ``callback(*args)`` whenever ``fault_point(name, *args)`` is passed, in this process,
    while the context is open (tests only)."""
    global _armed
    _callbacks[name] = callback
    _armed = True
    try:
        yield
    finally:
        del _callbacks[name]
        _armed = _kill is not None or bool(_callbacks)


__all__ = ["KILL_ENV", "arm_kill", "fault_point", "on_fault_point"]
