"""Packed bundles read in place vs the same bundle unpacked (not a test).

    python benchmarks/bench_packed.py [--n 600] [--repeats 5] [--dir bench-out]

The workload of ``bench_save.py`` (N cached 1080p screenshots, trajectories of 8 turns) is
written once as a bundle directory and packed into one ``.rbundle`` file. Then, page cache warm
(both are read once first; a person inspecting a dump just copied reads it from the cache too),
each operation is timed on the directory and on the packed file:

* ``inspect``: ``open_bundle(verify="none")`` and the numbers ``rollout-bundle inspect`` prints;
* ``verify --full``: every shard and media digest (``Bundle.problems(full=True)``);
* ``samples()``: decode every sample;

plus two references measured in the same run: ``unpack_bundle`` (what reading a packed file
cost before it could be read in place) and single-core ``hashlib.sha256`` over the same bytes in
memory (the floor of a full verify on one core).
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_save import ensure_media, make_samples

import bundles


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # untimed warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def inspect(path: Path) -> dict[str, Any]:
    with bundles.open_bundle(path, verify="none") as b:
        return {"samples": len(b), "media": len(b.media), "bytes": b.media_bytes, "refs": b.media_references}


def verify_full(path: Path) -> None:
    with bundles.open_bundle(path, verify="none") as b:
        problems = b.problems(full=True)
    assert not problems, problems


def read_samples(path: Path) -> int:
    with bundles.open_bundle(path, verify="none") as b:
        return sum(1 for _ in b.samples())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="screenshots (default 600)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("bench-out"))
    ns = ap.parse_args()

    paths = ensure_media(ns.dir, ns.n)
    out = ns.dir / "packed"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    directory = bundles.write_bundle(
        out / "dump.bundle", make_samples(paths, ns.turns), media_roots=[paths[0].parent], link="copy"
    )
    packed = bundles.pack_bundle(directory, out / "dump.rbundle")
    info = inspect(packed)
    assert info == inspect(directory)
    size_mb = packed.stat().st_size / 1e6
    print(
        f"{info['samples']} samples, {info['media']} media files ({info['bytes'] / 1e6:.0f} MB), "
        f"{info['refs']} references; packed file {size_mb:.0f} MB"
    )
    for p in (directory, packed):  # page cache warm for both
        verify_full(p)

    rows: list[tuple[str, float, float]] = []
    for name, fn in (("inspect", inspect), ("verify --full", verify_full), ("samples()", read_samples)):
        d = median_time(lambda fn=fn: fn(directory), ns.repeats)
        p = median_time(lambda fn=fn: fn(packed), ns.repeats)
        rows.append((name, d, p))

    def unpack() -> None:
        target = out / "unpacked.bundle"
        shutil.rmtree(target, ignore_errors=True)
        bundles.unpack_bundle(packed, target)

    unpack_s = median_time(unpack, max(1, ns.repeats // 2))
    blob = packed.read_bytes()
    sha_s = median_time(lambda: hashlib.sha256(blob).digest(), ns.repeats)

    print(f"\nmachine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"medians of {ns.repeats} (page cache warm)\n")
    print("| operation | directory s | packed, in place s | packed / directory |")
    print("|---|---:|---:|---:|")
    for name, d, p in rows:
        print(f"| {name} | {d:.4f} | {p:.4f} | {p / d:.2f}x |")
    print()
    print("| reference | s | |")
    print("|---|---:|---|")
    print(
        f"| unpack_bundle (the way before in-place reads) | {unpack_s:.3f} | "
        f"{unpack_s / rows[0][2]:.0f}x the in-place inspect |"
    )
    print(
        f"| hashlib.sha256 1 core, in memory, {size_mb:.0f} MB | {sha_s:.3f} | "
        f"in-place verify --full at {sha_s / rows[1][2]:.0%} of it |"
    )


if __name__ == "__main__":
    main()
