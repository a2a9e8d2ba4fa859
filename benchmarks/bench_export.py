"""``rollout-bundle export``: flat in memory, flat in cost, against a floor (issue 39, item 6).

For each run size (samples in all, ``--sizes``; 5,000 samples a bundle, so 1,000,000 samples is
200 bundles), a run is written once under ``--dir`` (samples of 300 tokens, log-probs, a loss mask,
metadata with two actions, two small screenshots each from a pool of 64 PNGs), then measured in
fresh child processes:

* ``export``: ``export_run(run, out, jobs=J)`` (what ``rollout-bundle export`` calls) for each
  ``--jobs`` J (1: in the child itself; more: that many spawned workers, a bundle each): wall
  time, cost per sample, the peak RSS of the largest process, and ``all RSS``, an upper bound of
  the export's memory (the child's peak plus each worker's at its peak at once);
* ``floor``: the same columns written by pyarrow from memory (the export's own parts read back into
  one table first, outside the timing): ``pyarrow.parquet.write_table`` of it, zstd.

It prints per size: samples, bundles, export seconds, microseconds a sample, peak RSS, the floor's
seconds and the export's throughput as a share of the floor's; and across sizes the growth of the
cost per sample and of the peak RSS (smallest to largest). The issue's bars: RSS at most 500 MB
whatever the size, cost per sample growing at most 1.2x, throughput at least 50 % of the floor.
``--quick`` (2,000 and 6,000 samples, 1,000 a bundle: two bundles and six) is the smoke run of
tests/test_benchmarks_smoke.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_BUNDLE = 5000

CHILD = r"""
import json, resource, sys, time
mode, run, out, jobs = sys.argv[1:5]
if mode == "export":
    from bundles._commands.exporting import export_run
    t = time.perf_counter()
    report = export_run(run, out, progress=False, jobs=int(jobs))
    dt = time.perf_counter() - t
    assert not report.problems, report.problems
    rows = report.rows
else:
    import pyarrow.dataset as ds, pyarrow.parquet as pq
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    rows = table.num_rows
    t = time.perf_counter()
    pq.write_table(table, run, compression="zstd")
    dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"seconds": dt, "rows": rows, "peak_mb": peak, "worker_peak_mb": worker}))
"""


def write_run(run: Path, samples: int, per_bundle: int = PER_BUNDLE) -> int:
    import bundles
    from trainer_hooks.testing import png_bytes

    media = run.parent / "media"
    media.mkdir(parents=True, exist_ok=True)
    pool = []
    for k in range(64):
        data = png_bytes(16, 12, (k, 255 - k, 3 * k % 256))
        path = media / f"shot{k}.png"
        path.write_bytes(data)
        pool.append(str(path))
    n_bundles = max(1, -(-samples // per_bundle))
    for b in range(n_bundles):
        count = min(per_bundle, samples - b * per_bundle)

        def gen(b: int = b, count: int = count):  # type: ignore[no-untyped-def]
            for i in range(count):
                j = b * per_bundle + i
                yield {"index": j, "group_index": j // 8, "prompt": f"task {j % 97}", "response": "done",
                       "reward": (j % 10) / 10, "status": "completed", "response_length": 100,
                       "tokens": list(range(j % 1000, j % 1000 + 300)), "rollout_log_probs": [-0.5] * 100,
                       "loss_mask": [1] * 100, "multimodal_inputs": {"images": [pool[j % 64], pool[(j + 1) % 64]]},
                       "metadata": {"actions": ["click(1, 2)", "type('x')"], "task": j % 97}}  # fmt: skip

        bundles.write_bundle(run / f"rollout_{b}", gen(), media_roots=[media], kind="rollout",
                             meta={"rollout_id": b})  # fmt: skip
    return n_bundles


def child(mode: str, a: str, b: str, jobs: int = 1) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, mode, a, b, str(jobs)], capture_output=True, text=True,
                          env=env, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,100000,1000000", help="samples in all, comma-separated")
    p.add_argument(
        "--quick", action="store_true", help="2,000 and 6,000 samples, 1,000 a bundle (a smoke run)"
    )
    p.add_argument("--jobs", default="1,2", help="export's worker processes to measure, comma-separated")
    p.add_argument("--dir", help="where the runs are written (default: a temporary directory)")
    ns = p.parse_args(argv)
    sizes = [2000, 6000] if ns.quick else [int(s) for s in ns.sizes.split(",")]
    jobs_list = [int(j) for j in ns.jobs.split(",")]
    base = Path(ns.dir or tempfile.mkdtemp(prefix="bench-export-"))
    rows: dict[int, list[tuple[int, dict[str, float]]]] = {j: [] for j in jobs_list}
    print(f"{'samples':>9} {'bundles':>7} {'jobs':>4} {'export s':>9} {'us/sample':>9} {'peak RSS':>9} "
          f"{'all RSS':>8} {'floor s':>8} {'vs floor':>8}")  # fmt: skip
    for n in sizes:
        run = base / f"run-{n}-{1000 if ns.quick else PER_BUNDLE}" / "run"
        n_bundles = (
            write_run(run, n, 1000 if ns.quick else PER_BUNDLE)
            if not run.exists()
            else len(list(run.iterdir()))
        )
        floor = None
        for jobs in jobs_list:
            out = base / f"out-{n}-{jobs}"
            shutil.rmtree(out, ignore_errors=True)
            exp = child("export", str(run), str(out), jobs)
            assert exp["rows"] == n, (exp, n)
            if floor is None:  # the same columns, whichever export wrote them
                floor = child("floor", str(base / f"floor-{n}.parquet"), str(out))
            share = floor["seconds"] / exp["seconds"]
            workers = min(jobs, n_bundles)
            # every process at its own peak at once: an upper bound of the export's memory
            all_rss = exp["peak_mb"] + (workers * exp["worker_peak_mb"] if workers > 1 else 0)
            rows[jobs].append((n, exp))
            print(f"{n:>9} {n_bundles:>7} {jobs:>4} {exp['seconds']:>9.2f} {exp['seconds'] / n * 1e6:>9.1f} "
                  f"{max(exp['peak_mb'], exp['worker_peak_mb']):>6.0f} MB {all_rss:>5.0f} MB "
                  f"{floor['seconds']:>8.2f} {share:>7.0%}")  # fmt: skip
    for jobs, measured in rows.items():
        (n0, e0), (n1, e1) = measured[0], measured[-1]
        cost = (e1["seconds"] / n1) / (e0["seconds"] / n0)
        p0, p1 = (max(e["peak_mb"], e["worker_peak_mb"]) for e in (e0, e1))
        print(f"jobs {jobs}: cost per sample {n0} -> {n1}: {cost:.2f}x; peak RSS a process {p0:.0f} -> "
              f"{p1:.0f} MB ({p1 / p0:.2f}x)")  # fmt: skip
    if not ns.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"total {time.perf_counter() - t0:.1f} s")
    sys.exit(code)
