"""Waiting on conditions in tests, never on a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = 30.0, poll: float = 0.005) -> T:
    """Poll ``condition`` until it returns something truthy and return that; fail the test naming
    ``what`` after ``timeout`` seconds. Tests wait on conditions, never on a fixed sleep: a sleep
    is too short on a loaded machine, and an "absent" check after one passes if nothing happened."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)
