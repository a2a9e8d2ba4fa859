"""``make test`` shows its progress as it goes (issue 30, item 18: it ran 10-17 minutes printing
nothing for the first five). tox runs the envs in parallel with ``--parallel-live``, and pytest in
each env through ``.ci/prefix.py``, which passes each line on as it is completed, prefixed by the
env's name, so that the interleaved lines of concurrent envs say where they come from."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ROOT / ".ci" / "prefix.py"


def test_prefix_passes_each_line_on_as_it_comes(tmp_path: Path) -> None:
    """The first line arrives, prefixed, while the command still runs (it waits for a file the
    test creates only after reading that line); stderr is merged; the exit status is the command's."""
    go = tmp_path / "go"
    child = (
        "import os, sys, time\n"
        "print('collected 3 items', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('tests/test_a.py ...  [100%]')\n"
        "print('an error line', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(PREFIX), "py311-full", sys.executable, "-c", child],
        stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        t = time.monotonic()
        assert proc.stdout.readline() == "py311-full: collected 3 items\n"
        assert proc.poll() is None and time.monotonic() - t < 30  # live: the command has not ended
        go.touch()
        rest = proc.stdout.read()
    finally:
        go.touch()
        status = proc.wait(30)
    assert rest == "py311-full: tests/test_a.py ...  [100%]\npy311-full: an error line\n"
    assert status == 3


def test_tox_runs_pytest_through_prefix_and_make_test_is_live() -> None:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    for section in ("testenv", "testenv:py311-full"):
        command = ini[section]["commands"].strip()
        assert command.startswith("python {tox_root}/.ci/prefix.py {env_name} pytest "), (section, command)
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    recipe = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    tox = next(line for line in recipe.splitlines() if "tox run-parallel" in line)
    assert "--parallel-live" in tox, tox
    assert any(line.startswith("echo ") and "minutes" in line for line in recipe.splitlines()), recipe
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`make test` takes 10 to 20 minutes on two cores" in readme
    assert "MILES_SOURCE=/path/to/miles" in readme
