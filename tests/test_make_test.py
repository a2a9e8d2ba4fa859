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


def test_py311_full_starts_first_and_the_light_envs_run_beside_it() -> None:
    """py311-full, the longest env, used to start only after the four light envs had finished
    (34.6 min on a loaded machine, its progress silent until then): it is first in env_list, so
    ``tox run-parallel`` (run in env_list order, one env per core) starts it at once; there is no
    light py311 (py311-full runs its tests on the same interpreter), and the light envs leave to
    it only tests of the repository's tooling, files that exist (issue 36, item 17)."""
    import shlex

    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    envs = [e.strip() for e in ini["tox"]["env_list"].split(",")]
    assert envs[0] == "py311-full" and "py311" not in envs and {"py310", "py313"} <= set(envs), envs
    ignored = shlex.split(ini["testenv"]["light_ignore"])
    assert ignored and all(a.startswith("--ignore=tests/test_") for a in ignored), ignored
    assert all((ROOT / a.removeprefix("--ignore=")).is_file() for a in ignored), ignored
    assert "{[testenv]light_ignore}" in ini["testenv"]["commands"]
    assert "light_ignore" not in ini["testenv:py311-full"]["commands"]
    tox = ROOT / ".venv" / "bin" / "tox"
    if tox.exists():  # what tox itself reads from the file: the order it runs them in
        listed = subprocess.run([str(tox), "-l"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert listed.stdout.split() == envs, listed.stdout + listed.stderr
    recipe = (ROOT / "Makefile").read_text()
    line = next(x for x in recipe.splitlines() if "tox run-parallel" in x)
    assert "--parallel auto" in line, line  # one env per core: py311-full never waits for a core
