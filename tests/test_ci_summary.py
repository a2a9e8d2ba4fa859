"""``make test`` ends with each tox env's counts and why tests were skipped: .ci/test_summary.py
reads pytest's real JUnit XML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.miles_snapshot import MILES_ROOT, MILES_SOURCE_ENV, MISSING, miles_missing

REPO = Path(__file__).parents[1]
SUMMARY = REPO / ".ci" / "test_summary.py"


def test_summary_prints_each_envs_counts_skip_reasons_and_last_the_failures(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_a(): pass\n"
        "def test_b(): pass\n"
        "def test_c(): assert False\n"
        "@pytest.mark.skip(reason='no browser')\n"
        "def test_d(): pass\n"
    )
    junit = tmp_path / "junit"
    for env in ("py310", "py311-full"):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}/{env}.xml",
                str(tmp_path / "test_x.py"),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            check=False,
        )
        assert r.returncode == 1, r.stdout
    r = subprocess.run(
        [sys.executable, str(SUMMARY), str(junit)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "test summary (per tox env):"
    assert lines[1].split() == ["ENV", "PASSED", "FAILED", "ERRORS", "SKIPPED", "TIME"]
    assert [line.split()[:5] for line in lines[2:4]] == [
        ["py310", "2", "1", "0", "1"],
        ["py311-full", "2", "1", "0", "1"],
    ]
    assert lines[4:] == [
        "skipped, by reason:",
        "  py310: 1 skipped: no browser",
        "  py311-full: 1 skipped: no browser",
        "failed:",
        "  py310: failed test_x::test_c: assert False",
        "  py311-full: failed test_x::test_c: assert False",
    ]
    r = subprocess.run(
        [sys.executable, str(SUMMARY), str(tmp_path / "none")], capture_output=True, text=True, check=False
    )
    assert r.returncode == 1 and "no JUnit reports" in r.stdout


def _pytest_junit(junit: Path, env: dict[str, str], *tests: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
    )


def test_without_a_miles_checkout_the_miles_tests_skip_and_the_summary_says_why_in_one_line(tmp_path):
    """A user's clone: no ``../shared/miles`` that counts (``MILES_SOURCE`` names a folder that is no
    Miles checkout), so every Miles test module skips at collection with one line naming
    ``MILES_SOURCE``, and the summary gives the count and that reason once per env."""
    junit = tmp_path / "junit"
    bogus = tmp_path / "no-miles-here"
    bogus.mkdir()
    env = {**os.environ, MILES_SOURCE_ENV: str(bogus)}
    tests = [
        "tests/test_miles_convert.py",
        "tests/test_miles_dumps.py",
        "tests/test_ci_summary.py::test_summary_prints_each_envs_counts_skip_reasons_and_last_the_failures",
    ]
    r = _pytest_junit(junit / "py311-full.xml", env, *tests)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "2 skipped" in r.stdout and "1 passed" in r.stdout, r.stdout[-3000:]
    r = subprocess.run(
        [sys.executable, str(SUMMARY), str(junit)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    reason = f"{MISSING}: {MILES_SOURCE_ENV}={bogus} has no miles/utils/types.py"
    assert r.stdout.splitlines()[-2:] == ["skipped, by reason:", f"  py311-full: 2 skipped: {reason}"]
    assert reason.startswith("Miles checkout not found (set MILES_SOURCE=/path/to/miles)")


def test_miles_source_names_the_checkout_the_tests_import(tmp_path):
    """``MILES_SOURCE=/path/to/miles`` wins over ``../shared/miles``: Miles is imported from there
    (a link to the checkout this run found, under another name)."""
    if (reason := miles_missing()) is not None:
        pytest.skip(reason)  # this test links to the checkout the other tests found
    for dep in ("httpx", "pybase64", "aiohttp", "pylatexenc", "torch"):  # what require_miles needs
        pytest.importorskip(dep, reason=f"Miles tests need {dep} (pip install -e '.[miles-tests]')")
    elsewhere = tmp_path / "checkouts" / "miles"
    elsewhere.parent.mkdir()
    elsewhere.symlink_to(MILES_ROOT, target_is_directory=True)
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from helpers.miles_snapshot import require_miles\n"
        "root = require_miles()\n"
        "import miles\n"
        "print(root); print(miles.__file__)\n"
    )
    env = {**os.environ, MILES_SOURCE_ENV: str(elsewhere)}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    root, module = r.stdout.splitlines()[-2:]
    assert Path(root) == elsewhere
    assert Path(module) == elsewhere / "miles" / "__init__.py"
