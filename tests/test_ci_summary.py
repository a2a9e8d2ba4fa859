"""``make test`` ends with each tox env's counts: .ci/test_summary.py reads pytest's real JUnit XML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUMMARY = Path(__file__).parents[1] / ".ci" / "test_summary.py"


def test_summary_prints_each_envs_pass_fail_skip_counts(tmp_path):
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
    assert [line.split()[:5] for line in lines[2:]] == [
        ["py310", "2", "1", "0", "1"],
        ["py311-full", "2", "1", "0", "1"],
    ]
    r = subprocess.run(
        [sys.executable, str(SUMMARY), str(tmp_path / "none")], capture_output=True, text=True, check=False
    )
    assert r.returncode == 1 and "no JUnit reports" in r.stdout
