"""Miles' own fully-async tests (``tests/fast/rollout/test_fully_async_rollout.py`` of the snapshot,
unchanged, with Miles' own pytest config: ``asyncio_mode = auto``) run twice in a subprocess:
once with :class:`trainer_hooks.miles.BundledDataBuffer` in place of ``DefaultDataBuffer``, once
with :class:`trainer_hooks.miles.FullyAsyncRolloutFn` in place of Miles' class (the swap:
tests/helpers/miles_swap.py). Every one of Miles' tests must pass, and our classes must have been built."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.miles_snapshot import REPO, require_miles

MILES = require_miles()
pytest.importorskip("pytest_asyncio", reason="Miles' async tests need pytest-asyncio (the miles-tests extra)")
pytest.importorskip(
    "pytest_timeout", reason="Miles' async tests run under pytest-timeout (the miles-tests extra)"
)

MILES_TEST = "tests/fast/rollout/test_fully_async_rollout.py"
N_MILES_TESTS = 21


def run_miles_tests(mode: str, tmp_path: Path) -> tuple[int, int, dict]:
    report = tmp_path / f"swap-{mode}.json"
    env = {
        **os.environ,
        "MILES_SWAP": mode,
        "MILES_SWAP_REPORT": str(report),
        "PYTHONDONTWRITEBYTECODE": "1",  # the snapshot is read-only
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO), str(MILES)]),
    }
    env.pop("MILES_USE_LEGACY_ROLLOUT_V1", None)  # what Miles' conftest clears (it is not loaded)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "helpers.miles_swap",
            "-p",
            "no:cacheprovider",
            # Miles' conftest imports its whole engine/router fixture stack; these tests use none of it.
            "--noconftest",
            "--timeout",
            "60",
            "-q",
            MILES_TEST,
        ],
        cwd=MILES,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    passed = int(m[1]) if (m := re.search(r"(\d+) passed", out)) else 0
    failed = int(m[1]) if (m := re.search(r"(\d+) failed", out)) else 0
    assert report.is_file(), out[-4000:]
    return passed, failed, json.loads(report.read_text())


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["buffer", "fn"])
def test_miles_fully_async_tests_pass_with_our_class(mode, tmp_path):
    passed, failed, report = run_miles_tests(mode, tmp_path)
    assert (passed, failed) == (N_MILES_TESTS, 0), (
        f"{mode}: {passed} passed, {failed} failed of {N_MILES_TESTS}"
    )
    assert report["constructed"]["BundledDataBuffer"] > 0
    if mode == "fn":
        assert report["constructed"]["FullyAsyncRolloutFn"] > 0
