"""The readers at scale: peak RSS and time per sample against the number of samples (not a test).

    python benchmarks/bench_readers_scale.py [--n 2000 10000 100000] [--dir bench-out] [--quick]
        [--distinct-media] [--repeats K] [--source dir|packed|store]

Bundles of N samples (3,000 tokens each as a list of ints, a reward, a status, a prompt and a
response of a few words, one small screenshot: the same file for every sample, so dedup by
digest keeps the media one file) are written once with ``write_bundle`` (shards as the writer
cuts them, ~64 MiB of samples each) and cached under ``<dir>/readers-scale/`` by N. Then, each in a
fresh subprocess (so every figure is that process's own peak):

* ``open + iterate``: ``open_bundle(verify="none")`` and every sample of ``samples()``;
* ``verify --full``: ``rollout-bundle verify --full --json`` through the CLI's ``main`` (the
  sample count read from its report, not from a second open).

``--source`` picks what is read: ``dir`` (the default) the bundle directory; ``packed`` the
same bundle packed into one ``.rbundle`` file by ``pack_bundle`` (cached beside it); ``store`` the
bundle uploaded by ``upload_bundle(shared_media=True)`` to a SeaweedFS server on loopback
(``tests/helpers/store.py``), one prefix per N, its media in the prefix's shared pool. The server
runs in a child of its own for the whole run (started, filled and stopped there), so that the
parent, whose RSS at each fork is a floor of its children's peaks, never imports boto3 or
``bundles``; the upload is not cached (the server's disk is a temporary directory).

Each line prints the child's peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) and its
time per sample, and the ratios against the smallest N: issue 39, item 6 asks both ratios to stay
<= 1.2x from 2,000 to 100,000 samples. ``--quick`` runs N = 200 and 2,000 (the smoke test's).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOKENS = 3000
CACHE_VERSION = 1  # bump when the samples change, so a stale cache is not reused


def png(label: int | None = None) -> bytes:
    """A small real PNG (64x40 RGB, a gradient); with ``label`` a text chunk makes it distinct."""
    w, h = 64, 40
    rows = b"".join(
        b"\x00" + bytes(v for x in range(w) for v in (x * 4 % 256, y * 6 % 256, 128)) for y in range(h)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    text = b"" if label is None else chunk(b"tEXt", b"Comment\x00step %d" % label)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + text
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def make_samples(n: int, media: Path, distinct: bool) -> Iterator[dict[str, Any]]:
    """N samples; their screenshots one shared file, or (``distinct``) one file each."""
    import numpy as np  # here: the children measure the readers' memory, not numpy's

    shared = media / "screen.png"
    if not shared.exists():
        shared.write_bytes(png())
    rng = np.random.default_rng(39)
    for i in range(n):
        image = shared
        if distinct:
            image = media / f"screen-{i}.png"
            if not image.exists():
                image.write_bytes(png(i))
        yield {
            "index": i,
            "group_index": i // 8,
            "prompt": f"Open the settings and turn on dark mode ({i % 97})",
            "response": "click(120, 48)",
            "tokens": rng.integers(0, 151_000, TOKENS, dtype=np.int64).tolist(),
            "response_length": 40,
            "reward": float(i % 2),
            "status": "completed",
            "multimodal_inputs": {"images": [str(image)]},
        }


def ensure_bundle(root: Path, n: int, distinct: bool) -> Path:
    """The cached bundle of ``n`` samples, written in a subprocess when missing: a child's peak
    RSS counts its parent's at the fork (Linux keeps ``ru_maxrss`` across ``exec``), so the
    parent that spawns the measured children never imports ``bundles`` or writes anything."""
    dest = root / f"v{CACHE_VERSION}-n{n}{'-distinct' if distinct else ''}.bundle"
    if (dest / "manifest.json").exists():
        return dest
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--child", "write", f"{dest}:{n}:{int(distinct)}"],
        check=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    print(f"  wrote {n:,} samples in {time.perf_counter() - t:.1f} s: {dest}", flush=True)
    return dest


def ensure_packed(dest: Path) -> Path:
    """The cached bundle ``dest`` packed into one file beside it (in a subprocess, as writing)."""
    packed = dest.with_suffix(".rbundle")
    if not packed.exists():
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--child", "pack", str(dest)], check=True, stdin=subprocess.DEVNULL
        )  # fmt: skip
        print(f"  packed in {time.perf_counter() - t:.1f} s: {packed}", flush=True)
    return packed


def serve(paths: str) -> None:
    """The ``store`` source's server child: SeaweedFS on loopback, each bundle of ``paths``
    (``N=DIR`` joined by ``,``) uploaded to ``s3://bench/nN/b`` with a shared media pool; one line
    of JSON (the credentials' environment and the URLs), then the server runs until stdin closes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.store import seaweed_server

    import bundles

    with seaweed_server() as server:
        server.make_bucket("bench")
        urls = {}
        for item in paths.split(","):
            n, path = item.split("=", 1)
            t = time.perf_counter()
            urls[n] = f"s3://bench/n{n}/b"
            bundles.upload_bundle(path, urls[n], shared_media=True, storage_options=server.options())
            print(
                f"  uploaded {int(n):,} samples in {time.perf_counter() - t:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        print(json.dumps({"env": server.env, "urls": urls}), flush=True)
        sys.stdin.read()  # until the parent closes it


def write(spec: str) -> None:
    import bundles

    dest, n, distinct = spec.rsplit(":", 2)
    media = Path(dest).parent / "media"
    media.mkdir(parents=True, exist_ok=True)
    samples = make_samples(int(n), media, distinct == "1")
    bundles.write_bundle(dest, samples, media_roots=[media], link="auto", overwrite=True)


# -- the child: one operation, its own peak RSS ---------------------------------------------------
def child(op: str, path: str) -> None:
    if op == "write":
        write(path)
        return
    if op == "pack":
        import bundles

        bundles.pack_bundle(path, Path(path).with_suffix(".rbundle"), overwrite=True)
        return
    if op == "serve":
        serve(path)
        return
    import bundles

    if op == "verify":  # imported before the clock starts (20 to 40 ms: up to 20 us a sample at 2,000)
        from bundles.cli import main
    t = time.perf_counter()
    if op == "iterate":
        with bundles.open_bundle(path, verify="none") as b:
            count = sum(1 for _ in b.samples())
    else:
        # The count from the command's own report: opening the bundle again to count it would
        # add a second manifest parse to the figure (and, after the first table's buffers were
        # freed, glibc serves the second from its heap: ~3 MB more at 100,000 media files).
        out = io.StringIO()
        sys.stdout = out
        try:
            rc = main(["verify", "--full", "--json", path])
        finally:
            sys.stdout = sys.__stdout__
        if rc != 0:
            raise SystemExit(f"verify --full {path}: exit {rc}: {out.getvalue()[-2000:]}")
        count = json.loads(out.getvalue())["samples"]
    seconds = time.perf_counter() - t
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"samples": count, "seconds": seconds, "peak_mb": peak_kib / 1024}))


def measure(op: str, path: Path | str, repeats: int, env: dict[str, str] | None = None) -> dict[str, float]:
    """``repeats`` fresh children: the fastest time (the least disturbed by a loaded machine)
    and the highest peak."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, __file__, "--child", op, str(path)],
            capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"seconds": min(r["seconds"] for r in runs), "peak_mb": max(r["peak_mb"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[2000, 10000, 100000])
    ap.add_argument("--dir", type=Path, default=Path("bench-out"))
    ap.add_argument("--quick", action="store_true", help="N = 200 and 2,000 (a smoke test)")
    ap.add_argument(
        "--repeats", type=int, default=1, help="children per figure: the fastest time, the highest peak"
    )
    ap.add_argument(
        "--distinct-media", action="store_true", help="one screenshot file per sample instead of one for all"
    )
    ap.add_argument(
        "--source", choices=("dir", "packed", "store"), default="dir",
        help="read the directory, its packed file, or its copy on SeaweedFS on loopback",
    )  # fmt: skip
    ap.add_argument("--child", nargs=2, metavar=("OP", "PATH"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        child(*ns.child)
        return
    sizes = sorted([200, 2000] if ns.quick else ns.n)
    root = ns.dir / "readers-scale"
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    shared = "one file each" if ns.distinct_media else "one file for all"
    print(f"samples of {TOKENS:,} tokens and one small screenshot ({shared})")
    paths: dict[int, Path | str] = {n: ensure_bundle(root, n, ns.distinct_media) for n in sizes}
    env: dict[str, str] = {}
    server = None
    if ns.source == "packed":
        paths = {n: ensure_packed(Path(p)) for n, p in paths.items()}
    elif ns.source == "store":
        print("source: the bundles uploaded to SeaweedFS on loopback (shared media pools)", flush=True)
        server = subprocess.Popen(
            [sys.executable, __file__, "--child", "serve", ",".join(f"{n}={p}" for n, p in paths.items())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None
        line = server.stdout.readline()
        while line and not line.startswith('{"env"'):  # anything else the upload printed
            line = server.stdout.readline()
        if not line:
            raise SystemExit(f"the store's server child exited with {server.wait()}")
        ready = json.loads(line)
        env, paths = ready["env"], {int(n): url for n, url in ready["urls"].items()}
    try:
        run_all(sizes, paths, env, ns.repeats)
    finally:
        if server is not None and server.stdin is not None:
            server.stdin.close()
            server.wait(timeout=60)


def run_all(sizes: list[int], paths: dict[int, Path | str], env: dict[str, str], repeats: int) -> None:
    for op, label in (("iterate", "open + iterate"), ("verify", "verify --full")):
        base: dict[str, float] | None = None
        for n in sizes:
            r = measure(op, paths[n], repeats, env)
            per = r["seconds"] / n * 1e6
            if base is None:
                base = {"per": per, "peak": r["peak_mb"]}
            print(
                f"{label:<15} N={n:>7,}  peak RSS {r['peak_mb']:7.1f} MB ({r['peak_mb'] / base['peak']:.2f}x)"
                f"  {per:8.1f} us/sample ({per / base['per']:.2f}x)",
                flush=True,
            )


if __name__ == "__main__":
    main()
