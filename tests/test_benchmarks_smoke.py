"""The benchmarks still run: each one's ``--quick`` mode, as a real subprocess (a smoke test, not a
timed one: the figures they print are read by people, docs/PERFORMANCE.md, never asserted here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick(script: str, tmp_path: Path, timeout: int = 300, **env: str) -> str:
    """``benchmarks/<script> --quick --dir tmp_path`` as a real subprocess; its stdout, once it
    exited 0 without a traceback."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done.stdout


def test_bench_serve_quick_measures_every_figure(tmp_path: Path) -> None:
    """benchmarks/bench_serve.py --quick (issue 32, item 6): a real `rollout-bundle serve` on a small
    bundle and a small run, and `view` on the same bundle; every figure of the full run is printed."""
    pytest.importorskip("starlette", reason="serve needs the [serve] extra (starlette)")
    pytest.importorskip("uvicorn", reason="serve needs the [serve] extra (uvicorn)")
    pytest.importorskip("jinja2", reason="view and serve need jinja2")
    pytest.importorskip("PIL.Image")
    out = quick("bench_serve.py", tmp_path)
    for figure in (
        r"first page, unindexed +[\d.]+ s from start",
        r"first page, indexed +[\d.]+ s from start",
        r"any page p95 +[\d.]+ ms",
        r"server RSS +\d+ MB now, +\d+ MB peak",
        r"run page, indexed +p50 +[\d.]+ ms +p95 +[\d.]+ ms",
        r"prompt across 5 bundles p50",
        r"view \(same bundle, first 300\): first page [\d.]+ s",
        r"serve vs view +first page [\d.]+x",
        r"floor: one sample read",
        r"floor: list_bundles",
    ):
        assert re.search(figure, out), (figure, out)
    for kind in (
        "filter",
        "sort",
        "search",
        "groups",
        "next page",
        "sample",
        "sample + thumbnails",
        "prompt history",
    ):
        assert re.search(rf"^  {re.escape(kind)} +p50 ", out, re.M), (kind, out)


def test_bench_replay_logprobs_quick_measures_every_figure(tmp_path: Path) -> None:
    """benchmarks/bench_replay_logprobs.py --quick (issue 38, item 6): a small random Qwen2-VL, a
    two-sample dump, `replay --model` against the same forward pass called directly, the rebuild."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("PIL.Image")
    out = quick(
        "bench_replay_logprobs.py", tmp_path, timeout=600, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
    )
    for figure in (
        r"forward pass called directly +[\d.]+ +[\d.]+ +\d+ MiB",
        r"replay --model, 1 per pass +[\d.]+ +[\d.]+ +\d+ MiB",
        r"replay --model, batched +[\d.]+",
        r"  forward +[\d.]+ s +\d+%",
        r"  rebuild +[\d.]+ s +\d+%",
        r"replay's forward passes / direct +[\d.]+x CPU time",
        r"the same, in one process taking turns: [\d.]+x CPU time",
        r"replay / direct peak RSS +[\d.]+x",
        r"rebuild's share of the replay +-?\d+% of its CPU time",
        r"floor: replay <= 1.1x the direct forward pass",
    ):
        assert re.search(figure, out), (figure, out)


def test_bench_export_quick_measures_every_figure(tmp_path: Path) -> None:
    """benchmarks/bench_export.py --quick (issue 39, item 6): two small runs exported in child
    processes, each against pyarrow writing the same columns from memory; every figure printed."""
    pytest.importorskip("pyarrow", reason="export needs the [data] extra (pyarrow)")
    out = quick("bench_export.py", tmp_path)
    for n, bundles_ in ((2000, 2), (6000, 6)):
        for jobs in (1, 2):
            line = rf"^ +{n} +{bundles_} +{jobs} +[\d.]+ +[\d.]+ +\d+ MB +\d+ MB +[\d.]+ +\d+%$"
            assert re.search(line, out, re.M), out
    for jobs in (1, 2):
        assert re.search(
            rf"jobs {jobs}: cost per sample 2000 -> 6000: [\d.]+x; peak RSS a process \d+ -> \d+ MB \([\d.]+x\)",
            out,
        ), out


def test_bench_readers_scale_quick_measures_every_figure(tmp_path: Path) -> None:
    """benchmarks/bench_readers_scale.py --quick (issue 39, item 6): bundles of 200 and 2,000
    samples, open + iterate and verify --full each in a fresh subprocess, with the ratios."""
    out = quick("bench_readers_scale.py", tmp_path)
    for label in ("open \\+ iterate", "verify --full"):
        for n in ("200", "2,000"):
            line = rf"^{label} +N= +{n}  peak RSS +[\d.]+ MB \([\d.]+x\) +[\d.]+ us/sample \([\d.]+x\)$"
            assert re.search(line, out, re.M), (line, out)
