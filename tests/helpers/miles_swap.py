"""A pytest plugin (``-p miles_swap``) that runs Miles' own tests with our classes in place of
Miles' (tests/test_miles_fully_async.py runs Miles' test file with it, in a subprocess).

``MILES_SWAP=buffer``: ``trainer_hooks.miles.BundledDataBuffer`` replaces ``DefaultDataBuffer``
(in ``miles.rollout.fully_async_data_buffer``, where Miles' tests take it, and in
``miles.rollout.fully_async_rollout``, where Miles' rollout function takes its default).
``MILES_SWAP=fn``: ``trainer_hooks.miles.FullyAsyncRolloutFn`` replaces Miles' class in
``miles.rollout.fully_async_rollout``. Miles' test file is not changed. At the end of the session
the plugin writes to ``MILES_SWAP_REPORT`` how many of our objects were constructed, so the caller
can tell that the swap was in effect.
"""

from __future__ import annotations

import json
import os

from helpers.miles_snapshot import add_miles_to_path

add_miles_to_path()

import miles.rollout.fully_async_data_buffer as data_buffer  # noqa: E402
import miles.rollout.fully_async_rollout as fully_async  # noqa: E402

import trainer_hooks.miles as ours  # noqa: E402

MODE = os.environ["MILES_SWAP"]
CONSTRUCTED = {"BundledDataBuffer": 0, "FullyAsyncRolloutFn": 0}


def _count(cls: type, name: str) -> None:
    original = cls.__init__

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if type(self) is cls or name == "BundledDataBuffer":
            CONSTRUCTED[name] += 1
        original(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


_count(ours.BundledDataBuffer, "BundledDataBuffer")
_count(ours.FullyAsyncRolloutFn, "FullyAsyncRolloutFn")

if MODE == "buffer":
    data_buffer.DefaultDataBuffer = ours.BundledDataBuffer
    fully_async.DefaultDataBuffer = ours.BundledDataBuffer
elif MODE == "fn":
    fully_async.FullyAsyncRolloutFn = ours.FullyAsyncRolloutFn
else:
    raise ValueError(f"MILES_SWAP: expected 'buffer' or 'fn', found {MODE!r}")


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    report = os.environ.get("MILES_SWAP_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"mode": MODE, "constructed": CONSTRUCTED}, f)
