"""``write_bundle(link="auto")`` against its floor, measured in the same run (issue 25; not a test).

    python benchmarks/bench_save_floor.py [--samples 100] [--tokens 3000] [--refs 4] [--repeats 15]
                                          [--dir bench-out] [--profile]

The workload: ``--samples`` samples of ``--tokens`` token ids (plus a loss mask and log-probs of
the response), each referencing ``--refs`` of ``--samples`` distinct cached 1080p screenshots
(``bench_save.py``'s cache under ``<dir>/media``, on the same filesystem as the bundles, so that
``link="auto"`` hard-links).

The floor is what any durable save of these samples must do, written as directly as Python
allows, with nothing a bundle adds (no reference resolution, no digests, no manifest fields):

* one ``os.link`` per distinct screenshot into a ``media/`` directory;
* every sample packed (paths as plain strings) and zstd level 1 of the stream, on this thread;
  packed twice over, by ``msgpack.packb`` and by msgspec's encoder (the same bytes, ~3x faster,
  what ``write_bundle`` packs with): both floors are printed and the faster one judged against;
* write + fsync of one shard file and of a small manifest;
* fsync of the two directories that received entries, and one rename into place.

Each repeat runs both, interleaved and in alternating order, after ``os.sync()``, so that
neither pays for the other's writeback; the ratio is taken per repeat and its median printed
beside the goal (issue 25: <= 1.2x). ``--profile`` prints cProfile's top entries of the bundle
side, the entries the floor does not have.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_save import ensure_media, fsync_file, machine_description

import bundles

GOAL = 1.2


def make_samples(paths: list[Path], n: int, tokens: int, refs: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [
        {
            "group_index": i // 8,
            "index": i,
            "prompt": f"<|im_start|>user\nstep {i}: finish the task on screen<|im_end|>",
            "tokens": rng.integers(0, 150_000, tokens).tolist(),
            "multimodal_inputs": {"images": [str(paths[(i + k) % len(paths)]) for k in range(refs)]},
            "response": "<tool_call>click(960, 540)</tool_call>",
            "response_length": 256,
            "reward": 1.0,
            "loss_mask": [1] * 256,
            "rollout_log_probs": rng.standard_normal(256).tolist(),
            "status": "completed",
            "metadata": {"turn": i % 8},
        }
        for i in range(n)
    ]


PACKERS = {"msgpack": msgpack.Packer().pack, "msgspec": msgspec.msgpack.Encoder().encode}


def floor_save(samples: list[dict[str, Any]], paths: list[Path], dest: Path, packer: str) -> None:
    staging = dest.with_name(dest.name + ".staging")
    media = staging / "media"
    media.mkdir(parents=True)
    for p in paths:
        os.link(p, media / p.name)
    pack = PACKERS[packer]
    body = zstandard.ZstdCompressor(level=1).compress(b"".join(pack(s) for s in samples))
    for name, data in (
        ("shard.msgpack.zst", body),
        ("manifest.json", json.dumps({"n": len(samples)}).encode()),
    ):
        fd = os.open(staging / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_file(media)  # a directory: its entries (bench_save's fsync opens read-only)
    fsync_file(staging)
    os.rename(staging, dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--samples", type=int, default=100, help="samples, and distinct screenshots (default 100)"
    )
    ap.add_argument("--tokens", type=int, default=3000, help="token ids a sample (default 3000)")
    ap.add_argument("--refs", type=int, default=4, help="screenshot references a sample (default 4)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dir", type=Path, default=Path("bench-out"))
    ap.add_argument("--profile", action="store_true", help="cProfile the bundle side (top entries)")
    ns = ap.parse_args(argv)
    ns.dir.mkdir(parents=True, exist_ok=True)
    paths = ensure_media(ns.dir, ns.samples)
    run_dir = paths[0].parent
    samples = make_samples(paths, ns.samples, ns.tokens, ns.refs)
    print(f"{machine_description(ns.dir)}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{ns.samples} samples x {ns.tokens} tokens x {ns.refs} screenshot references ({len(paths)} distinct "
        f"1080p PNGs); {ns.repeats} repeats, interleaved",
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        out = Path(tmp)
        counter = iter(range(10**6))

        def ours() -> None:
            bundles.write_bundle(
                out / f"b{next(counter)}", samples, media_roots=[run_dir], link="auto", progress=False
            )

        sides = {
            "ours": ours,
            **{k: (lambda k=k: floor_save(samples, paths, out / f"f{next(counter)}", k)) for k in PACKERS},
        }

        def timed(fn: Any) -> float:
            os.sync()
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        for fn in sides.values():  # warm-up: imports, page cache of the sources
            fn()
        times: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(ns.repeats):
            order = list(sides)[r % 3 :] + list(sides)[: r % 3]
            for name in order:
                times[name].append(timed(sides[name]))
        med = {k: statistics.median(v) for k, v in times.items()}
        best = min(PACKERS, key=med.__getitem__)
        ratios = [a / b for a, b in zip(times["ours"], times[best], strict=True)]
        ratio = statistics.median(ratios)
        print(
            f"write_bundle(link='auto') {med['ours'] * 1e3:6.2f} ms; floor with msgpack.packb "
            f"{med['msgpack'] * 1e3:6.2f} ms, with msgspec {med['msgspec'] * 1e3:6.2f} ms; against the faster "
            f"({best}): {ratio:.2f}x (per repeat {min(ratios):.2f}-{max(ratios):.2f}; goal <= {GOAL}x: "
            f"{'met' if ratio <= GOAL else 'missed'}); against msgpack's "
            f"{statistics.median(a / b for a, b in zip(times['ours'], times['msgpack'], strict=True)):.2f}x",
            flush=True,
        )
        if ns.profile:
            prof = cProfile.Profile()
            for _ in range(5):
                prof.runcall(ours)
            print("\ncProfile of 5 saves, by own time:")
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
        shutil.rmtree(out, ignore_errors=True)
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
