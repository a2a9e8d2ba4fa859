"""How long ``FullyAsyncRolloutFn.save()`` blocks the caller for a round of 1080p screenshots (not a test).

    python benchmarks/bench_checkpoint_save.py [--n 600] [--repeats 5] [--dir bench-out] [--link auto]

Reuses ``benchmarks/bench_save.py``'s cached screenshots (~1 MB PNGs named by sha256, rendered
once under ``<dir>/media/run-v1-n<N>``) and its sample shape (multi-turn trajectories of
``--turns`` screenshots; turn k references the first k+1, 1024 prompt tokens, 256 log-probs),
turned into :class:`trainer_hooks.Sample` objects with an ``image_grid_thw`` array each. The
cache directory *is* the run media directory (``--shared-media-dir <dir>/media --run-uuid
run-v1-n<N>``), so checkpoints take their media from it as a training run's would.

The completed groups sit in a :class:`FullyAsyncRolloutFn`'s buffer; each repeat times

* ``save()``: what the training loop waits for (snapshot of every sample, then queueing), and
* the background commit: from ``save()`` returning to ``flush()`` returning (encode shards,
  link media, fsync, rename, retention),

with ``os.sync()`` before each repeat; then, as a worst case, ``save()`` issued while the previous
save's commit is still running on the worker (competing for the GIL). Retention keeps 2
checkpoints, so disk use stays small.
Target (issue 4): ``save()`` blocks for under 50 ms on one filesystem.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_save.py

from bench_save import CACHE_VERSION, ensure_media, machine_description, make_samples

from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, Sample, parse_args


async def _never(args, group):  # the benchmark never generates
    raise AssertionError("unused")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=600, help="screenshots (default 600, ~0.6 GB)")
    parser.add_argument("--turns", type=int, default=8, help="screenshots per trajectory = samples per group")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--dir", type=Path, default=Path("bench-out"), help="cache and outputs (one filesystem)"
    )
    parser.add_argument("--link", default="auto", choices=["auto", "hardlink", "reflink", "copy"])
    ns = parser.parse_args(argv)

    bench_dir = ns.dir.resolve()
    paths = ensure_media(bench_dir, ns.n)
    run_dir = paths[0].parent
    assert run_dir.name == f"run-v{CACHE_VERSION}-n{ns.n}"
    media_bytes = sum(p.stat().st_size for p in paths)
    ckpt = bench_dir / "checkpoint-out"  # not bench_save.py's "out", which it wipes
    args = parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--shared-media-dir",
            str(run_dir.parent),
            "--run-uuid",
            run_dir.name,
            "--save",
            str(ckpt),
            "--bundle-link-mode",
            ns.link,
            "--keep-rollout-checkpoints",
            "2",
            "--bf16",
        ]
    )

    groups: dict[int, list[Sample]] = {}
    for d in make_samples(paths, ns.turns):
        n_images = len(d["multimodal_inputs"]["images"])
        d["multimodal_train_inputs"] = {
            "image_grid_thw": np.tile(np.array([[1, 78, 138]], np.int64), (n_images, 1))
        }
        groups.setdefault(d["group_index"], []).append(Sample.from_dict(d))
    n_samples = sum(len(g) for g in groups.values())
    n_refs = sum(len(s.multimodal_inputs["images"]) for g in groups.values() for s in g)

    fn = FullyAsyncRolloutFn(args, ListDataSource([]), _never)
    for g in groups.values():
        fn.buffer.put(g)

    print(machine_description(bench_dir))
    print(
        f"{len(paths)} screenshots, {media_bytes / 1e9:.2f} GB; {n_samples} samples in {len(groups)} groups, "
        f"{n_refs} references; link={ns.link}"
    )
    blocked, commit = [], []
    for rid in range(ns.repeats):
        os.sync()
        t0 = time.perf_counter()
        fut = fn.save(rid)
        t1 = time.perf_counter()
        fn.flush()
        t2 = time.perf_counter()
        fut.result()
        blocked.append(t1 - t0)
        commit.append(t2 - t1)
        print(
            f"  repeat {rid}: save() blocked {1000 * (t1 - t0):7.1f} ms; background commit {t2 - t1:6.2f} s"
        )
    # Back to back: the second save() runs while the first commit holds the worker (and at times
    # the GIL), the worst case for the caller.
    busy = []
    for rid in range(ns.repeats, 2 * ns.repeats):
        os.sync()
        fn.save(rid)
        time.sleep(0.05)  # let the worker get going
        t0 = time.perf_counter()
        fn.save(10_000 + rid)
        busy.append(time.perf_counter() - t0)
        fn.flush()
    fn.close()

    def row(name: str, xs: list[float], scale: float, unit: str) -> str:
        return (
            f"{name:<34} {scale * statistics.median(xs):9.1f} {scale * min(xs):9.1f} "
            f"{scale * max(xs):9.1f}  {unit}"
        )

    print(f"\n{'':<34} {'median':>9} {'min':>9} {'max':>9}")
    print(row("save() blocks the caller", blocked, 1000, "ms"))
    print(row("save() while a commit is running", busy, 1000, "ms"))
    print(row("background commit (save -> flush)", commit, 1, "s"))
    target = statistics.median(blocked) * 1000
    print(f"\ntarget: save() < 50 ms: {'MET' if target < 50 else 'MISSED'} ({target:.1f} ms median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
