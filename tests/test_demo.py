"""``make demo`` runs in CI: ``examples/demo.py`` is the first thing a newcomer runs, and it broke
once without any test noticing (the resumed run's dataset was refused by the resume fingerprint).

It runs as a real subprocess, exactly as ``make demo`` starts it, with ``--out`` in a temporary
directory; the test checks its exit status, its last line, and the files it says it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.processor, pytest.mark.slow]

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def test_make_demo_plays_a_whole_run_and_writes_its_report(tmp_path):
    out = tmp_path / "demo-out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (
        f"demo exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("demo OK in") for line in lines), proc.stdout[-2000:]
    assert "[6/6]" in proc.stdout and "Traceback" not in proc.stderr
    page = Path(lines[-1].rsplit(": ", 1)[1])  # "open the report of the last debug dump: <page>"
    reports = sorted(out.glob("*.replay.json"))
    assert page.is_file() and page.parent == out and reports, sorted(p.name for p in out.iterdir())
    summary = json.loads(reports[-1].read_text())["summary"]
    assert summary["samples"] == 2 and summary["images"] == 6 and summary["problems"] == {}
    html = page.read_text()
    assert "Content-Security-Policy" in html and "<script" not in html.split("</head>")[1]
