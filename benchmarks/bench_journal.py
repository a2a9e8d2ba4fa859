"""The rollout journal against its floors, measured in the same run (issue 19; not a test).

    python benchmarks/bench_journal.py [--n 3000] [--recover-n 10000] [--dir bench-out] [--interval 1.0]

Samples are shaped like a computer-use turn: 11k prompt+response token ids as a Python list
(random ids below 151,643, Qwen's vocabulary), 1k log-probs as floats, two 1080p screenshots
already in the run media directory (``bench_save.py``'s cached ~1 MB PNGs, named by sha256; a pool
of ``--pool`` shared by the samples), a reward and a status. Everything runs on this machine's
filesystem (``--dir``).

Figures, each beside its floor:

* **Durability latency.** Seconds from an append to the journal holding the record durably with
  no barrier (what a crash may lose), one small record at a time, each just after a sync (the
  worst case: a whole interval plus the writer's delay): p50 and max against ``--interval``.

* **Durable throughput.** The journal: ``append_sample`` for ``--n`` samples from one thread as fast
  as it can, then ``flush()`` (everything fsynced); samples per second from the first append to
  the flush. Floor: one thread doing only msgpack (plain ``packb``) + zstd level 1 + ``write`` of the
  same samples, fsync once a second, as issue 19 defines it. Also with int32 numpy token arrays.
* **Event-loop cost.** CPU time of the appending thread per sample (``time.thread_time``: the
  snapshot and the queue push; encoding, writing and fsync run on the journal's thread), and its
  wall time per call (which includes waiting for the GIL while the journal's thread encodes),
  with samples arriving a little slower than the floor's rate. At that pace the one-core figure
  is printed too (snapshot + journal thread CPU a sample): the burst inflates both threads' CPU
  time (they run at once on two cores and fight over the GIL and the cache), a rollout's pace
  does not.
* **Recovery.** ``--recover-n`` samples journaled in groups of 8 (take, sample and group
  records, no checkpoint), then ``FullyAsyncRolloutFn.load``: seconds from ``load`` to the first
  new group handed to the generator (completed groups stay encoded until training takes them),
  and the full decode of every restored group (checksums, media placed and hashed, samples as
  dicts) against the codec's decode floor (zstd + ``bundles.decode_sample`` of the same bytes,
  every decoded sample kept as the recovery keeps them; plain ``msgpack.unpackb`` printed for
  reference). Goals (issue 25): the durable throughput >= 90 % of its floor, lists and arrays
  alike; the full decode >= 95 % of the codec's floor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import msgpack
import msgspec
import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_save.py

from bench_save import ensure_media, machine_description

from bundles import MediaRef, decode_sample
from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, parse_args
from trainer_hooks.journal import RolloutJournal, journal_dir, scan_journal
from trainer_hooks.rollout import LazyGroup

VOCAB = 151_643


def make_samples(n: int, images: list[Path], *, arrays: bool = False, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tokens = rng.integers(0, VOCAB, 11_000, dtype=np.int32)
        out.append(
            {
                "index": i,
                "group_index": i // 8,
                "tokens": tokens if arrays else tokens.tolist(),
                "rollout_log_probs": (-rng.random(1_000)).tolist(),
                "response_length": 1_000,
                "reward": float(i % 2),
                "status": "completed",
                "multimodal_inputs": {
                    "images": [str(images[i % len(images)]), str(images[(i + 1) % len(images)])]
                },
            }
        )
    return out


def _plain(sample: dict) -> dict:
    s = dict(sample)
    t = s["tokens"]
    if isinstance(t, np.ndarray):
        s["tokens"] = t.tobytes()
    return s


def _msgpack_packb(sample: dict) -> bytes:
    return msgpack.packb(sample, use_bin_type=True)


# The two packers a floor can use: msgpack's packb, and msgspec's encoder (the same bytes, ~3x
# faster, what the journal packs with). Both floors are printed; the faster one is the floor.
PACKERS = {"msgpack": _msgpack_packb, "msgspec": msgspec.msgpack.Encoder().encode}


def floor(samples: list[dict], path: Path, interval: float, packer: str = "msgpack") -> float:
    """``packer`` + zstd level 1 + write, fsync once per interval: samples per CPU second of the
    one thread (CPU time, as the journal's figure: on a shared machine wall time also counts the
    time other processes held the core)."""
    pack = PACKERS[packer]
    comp = zstandard.ZstdCompressor(level=1)
    plain = [_plain(s) for s in samples]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    cpu0 = time.thread_time()
    last = time.perf_counter()
    for s in plain:
        os.write(fd, comp.compress(pack(s)))
        now = time.perf_counter()
        if now - last >= interval:
            os.fsync(fd)
            last = now
    os.fsync(fd)
    elapsed = time.thread_time() - cpu0
    os.close(fd)
    return len(samples) / elapsed


def journal_throughput(
    samples: list[dict], directory: Path, run_dir: Path, interval: float, copy: bool = True
) -> dict:
    shutil.rmtree(directory, ignore_errors=True)
    journal = RolloutJournal(directory, lineage="bench", interval=interval, media_roots=[run_dir])
    cpu = 0.0
    wall = 0.0
    t0 = time.perf_counter()
    for i, s in enumerate(samples):
        c, w = time.thread_time(), time.perf_counter()
        journal.append_sample(i // 8, i % 8, s, copy=copy)
        cpu += time.thread_time() - c
        wall += time.perf_counter() - w
    journal.flush()
    elapsed = time.perf_counter() - t0
    stats = journal.stats()
    journal.close()
    # One core's worth: the caller's CPU (snapshots) + the writer's CPU (encode, compress, write,
    # fsync calls); the wall-clock burst figure also pays two threads taking turns on the GIL.
    one_core = cpu + stats["writer_cpu_s"]
    return {
        "per_s": len(samples) / one_core,
        "burst_per_s": len(samples) / elapsed,
        "cpu_ms": 1e3 * cpu / len(samples),
        "wall_ms": 1e3 * wall / len(samples),
        "bytes": stats["bytes"],
        "flushes": stats["flushes"],
    }


def paced_cost(
    samples: list[dict], directory: Path, run_dir: Path, interval: float, gap_s: float, copy: bool = True
) -> dict:
    """The event loop's cost per append when samples arrive as a rollout makes them (one every
    ``gap_s``, more than the journal's thread needs per sample): CPU and wall time in the call."""
    shutil.rmtree(directory, ignore_errors=True)
    journal = RolloutJournal(directory, lineage="bench", interval=interval, media_roots=[run_dir])
    cpu = wall = 0.0
    for i, s in enumerate(samples):
        c, w = time.thread_time(), time.perf_counter()
        journal.append_sample(i // 8, i % 8, s, copy=copy)
        cpu += time.thread_time() - c
        wall += time.perf_counter() - w
        time.sleep(gap_s)
    journal.flush()
    writer = journal.stats()["writer_cpu_s"]
    journal.close()
    shutil.rmtree(directory, ignore_errors=True)
    n = len(samples)
    return {"cpu_us": 1e6 * cpu / n, "wall_us": 1e6 * wall / n, "writer_us": 1e6 * writer / n}


def copy_floor(samples: list[dict]) -> float:
    """The least a snapshot can cost: one ``list.copy()`` of each list of the sample (ms)."""
    t0 = time.thread_time()
    for s in samples:
        for v in s.values():
            if isinstance(v, list):
                v.copy()
    return 1e3 * (time.thread_time() - t0) / len(samples)


def journal_groups(samples: list[dict], directory: Path, run_dir: Path, interval: float) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    journal = RolloutJournal(directory, lineage="bench", interval=interval, media_roots=[run_dir])
    for g in range(0, len(samples), 8):
        group = samples[g : g + 8]
        gid = g // 8
        prompt = [{"index": s["index"], "group_index": s["group_index"], "prompt": "p"} for s in group]
        journal.append_take(gid, prompt, {"offset": gid + 1})
        for i, s in enumerate(group):
            journal.append_sample(gid, i, s)
        journal.append_group(gid, None)
    journal.close()


def decode_floor(directory: Path, run_dir: Path) -> tuple[float, float]:
    """The codec's decode floor: zstd + ``bundles.decode_sample`` of every sample body the
    journal holds, media resolved from a ready table (samples per second); and, for reference,
    zstd + plain ``msgpack.unpackb`` of the same bytes."""
    records = [r for r in scan_journal(directory).records if r.kind == "sample"]
    media = {}
    for r in records:
        for name in r.media:
            if name not in media:
                media[name] = MediaRef(
                    "sha256:" + name.split(".")[0],
                    (run_dir / name).stat().st_size,
                    os.path.splitext(name)[1],
                    str(run_dir / name),
                )
    d = zstandard.ZstdDecompressor()
    # Every decoded sample is kept, as the recovery's decode keeps them (holding 10,000 samples
    # of 11k ints costs gigabytes of fresh memory: a floor that frees each sample reuses memory
    # and measures something cheaper).
    kept = []
    t0 = time.perf_counter()
    for r in records:
        kept.append(decode_sample(d.decompress(bytes(r.body)), media))
    codec = len(records) / (time.perf_counter() - t0)
    kept.clear()
    t0 = time.perf_counter()
    for r in records:
        kept.append(msgpack.unpackb(d.decompress(bytes(r.body)), raw=False, strict_map_key=False))
    plain = len(records) / (time.perf_counter() - t0)
    kept.clear()
    return codec, plain


def recovery(bench_dir: Path, run_dir: Path, n: int, interval: float, images: list[Path]) -> dict:
    save = bench_dir / "journal-recover"
    shutil.rmtree(save, ignore_errors=True)
    shared = bench_dir / "shared-recover"
    shutil.rmtree(shared, ignore_errors=True)
    groups_n = n // 8
    samples = make_samples(groups_n * 8, images, seed=1)
    print(f"  journaling {len(samples)} samples for recovery ...", flush=True)
    journal_groups(samples, journal_dir(save), run_dir, interval)
    del samples
    os.sync()
    # Twice over, alternating: the codec's floor, then a recovery and the full decode of what it
    # restored; each side's better run is compared (the first of either pays for growing the
    # heap, and on a shared machine one run of either can be disturbed).
    floors, plains, loads, firsts, decodes = [], [], [], [], []
    decoded = 0
    for _ in range(2):
        floor_per_s, plain_per_s = decode_floor(journal_dir(save), run_dir)
        floors.append(floor_per_s)
        plains.append(plain_per_s)
        t_load, t_first, decoded, t_decode = _recover_once(save, shared, interval, groups_n)
        loads.append(t_load)
        firsts.append(t_first)
        decodes.append(decoded / t_decode)
    shutil.rmtree(save, ignore_errors=True)
    shutil.rmtree(shared, ignore_errors=True)
    return {
        "samples": decoded,
        "load_s": min(loads),
        "first_group_s": min(firsts),
        "decode_per_s": max(decodes),
        "decode_floor_per_s": max(floors),
        "plain_msgpack_per_s": max(plains),
    }


def _recover_once(
    save: Path, shared: Path, interval: float, groups_n: int
) -> tuple[float, float, int, float]:
    """``FullyAsyncRolloutFn.load`` from ``save``: seconds to load, to the first new group handed
    to the generator, and the full decode of every restored group (samples, seconds)."""
    shutil.rmtree(shared, ignore_errors=True)
    first = threading.Event()

    async def gen(args, sample):
        first.set()
        return sample

    args = parse_args(
        [
            "--rollout-batch-size",
            "8",
            "--shared-media-dir",
            str(shared),
            "--run-uuid",
            "resumed",
            "--save",
            str(save),
            "--load",
            str(save),
            "--rollout-journal-interval",
            str(interval),
        ]
    )
    more = [[{"index": 10**6 + i, "group_index": 10**6} for i in range(8)]]
    fn = FullyAsyncRolloutFn(
        args, ListDataSource([[]] * groups_n + more), generate_sample=gen, max_in_flight=1, max_buffered=10**6
    )
    t0 = time.perf_counter()
    fn.load(-1, sample_cls=dict)
    t_load = time.perf_counter() - t0
    fn.start()
    first.wait(30)
    t_first = time.perf_counter() - t0
    fn.stop()
    lazy = [g for g in fn.buffer.groups() if isinstance(g, LazyGroup)]
    t1 = time.perf_counter()
    decoded = sum(len(g.load_dicts()) for g in lazy)
    t_decode = time.perf_counter() - t1
    fn.close()
    del lazy, fn
    return t_load, t_first, decoded, t_decode


def durability_latency(directory: Path, interval: float, records: int) -> list[float]:
    """Seconds from each append to the journal holding it durably, with no barrier (no flush, no
    checkpoint): what a crash may lose. One small record at a time, the next once the last is
    durable, polled every 0.5 ms: each append comes just after a sync, so each waits a whole
    interval, the worst case (an append at a random moment waits about half of it)."""
    shutil.rmtree(directory, ignore_errors=True)
    journal = RolloutJournal(journal_dir(directory), lineage="latency", interval=interval)
    out = []
    try:
        for k in range(records):
            seq = journal.append_take(k, [{"index": k, "prompt": "p"}], {"offset": k})
            t = time.perf_counter()
            while journal.stats()["durable_seq"] < seq:
                if journal.failure is not None or time.perf_counter() - t > 60 + 10 * interval:
                    raise SystemExit(f"record {seq} never became durable: {journal.failure!r}")
                time.sleep(0.0005)
            out.append(time.perf_counter() - t)
    finally:
        journal.close()
        shutil.rmtree(directory, ignore_errors=True)
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=3000, help="samples for the throughput runs")
    parser.add_argument(
        "--recover-n", type=int, default=10_000, help="samples journaled for the recovery run"
    )
    parser.add_argument("--pool", type=int, default=32, help="cached 1080p screenshots shared by the samples")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="fsync interval (--rollout-journal-interval)"
    )
    parser.add_argument("--dir", type=Path, default=Path("bench-out"))
    ns = parser.parse_args(argv)
    bench_dir = ns.dir.resolve()
    images = ensure_media(bench_dir, ns.pool)
    run_dir = images[0].parent
    print(machine_description(bench_dir))
    print(
        f"{ns.n} samples: 11k tokens, 1k log-probs, 2 of {ns.pool} 1080p screenshots; fsync every {ns.interval} s"
    )

    records = max(10, min(100, int(5 / ns.interval)))
    lat = durability_latency(bench_dir / "journal-latency", ns.interval, records)
    print(
        f"durability latency (append -> durable, no barrier, each append just after a sync: the worst case), "
        f"{records} records: p50 {1e3 * lat[len(lat) // 2]:.0f} ms, max {1e3 * lat[-1]:.0f} ms (interval "
        f"{ns.interval} s: a crash loses what is younger)",
        flush=True,
    )
    for arrays in (False, True):
        samples = make_samples(ns.n, images, arrays=arrays)
        kind = "int32 arrays" if arrays else "list of int"
        # The floor twice, before and after the journal's runs; the better one is compared
        # against (on a shared machine one run of either can be disturbed).
        f0s = {k: floor(samples, bench_dir / "floor.bin", ns.interval, k) for k in PACKERS}
        f0 = max(f0s.values())
        c = copy_floor(samples)
        runs = []
        gap = 1.5 * (1.0 / f0)  # arrivals a little slower than the floor's rate
        for copy in (True, False):
            j = journal_throughput(samples, bench_dir / "journal-bench", run_dir, ns.interval, copy)
            p = paced_cost(samples[:300], bench_dir / "journal-paced", run_dir, ns.interval, gap, copy)
            runs.append((copy, j, p))
        floors = {k: max(f0s[k], floor(samples, bench_dir / "floor.bin", ns.interval, k)) for k in PACKERS}
        f = max(floors.values())
        print(
            f"tokens as {kind}: floor {f:.0f} samples/s with {max(floors, key=floors.__getitem__)} "
            f"(msgpack.packb {floors['msgpack']:.0f}/s, msgspec {floors['msgspec']:.0f}/s; one thread, each the "
            f"better of two runs, before and after the journal's; a bare copy of a sample's lists {1e3 * c:.0f} us)"
        )
        for copy, j, p in runs:
            mode = "snapshot (copy=True)" if copy else "lent (copy=False: FullyAsyncRolloutFn)"
            one = p["cpu_us"] + p["writer_us"]
            print(
                f"  {mode}\n"
                f"    burst:    {j['per_s']:7.0f} samples/s on one core ({j['burst_per_s']:.0f}/s wall, two threads): "
                f"{100 * j['per_s'] / f:5.1f} % of the floor (goal >= 90 %); {j['bytes'] / ns.n / 1e3:.1f} kB/sample, "
                f"{j['flushes']} fsyncs; caller {1e3 * j['cpu_ms']:.0f} us CPU a sample\n"
                f"    at pace:  event loop {p['cpu_us']:.0f} us CPU, {p['wall_us']:.0f} us wall a sample, samples every "
                f"{1e3 * gap:.1f} ms (goal <= 100 us); one core {p['cpu_us']:.0f} + {p['writer_us']:.0f} us "
                f"(journal thread) = {1e6 / one:.0f} samples/s, {100 * 1e6 / one / f:.1f} % of the floor",
                flush=True,
            )
        del samples
    (bench_dir / "floor.bin").unlink(missing_ok=True)
    shutil.rmtree(bench_dir / "journal-bench", ignore_errors=True)

    if ns.recover_n:
        r = recovery(bench_dir, run_dir, ns.recover_n, ns.interval, images)
        print(
            f"recovery of {r['samples']} journaled samples: load {r['load_s']:.3f} s, first new group submitted "
            f"after {r['first_group_s']:.3f} s (goal <= 1 s); full decode {r['decode_per_s']:.0f} samples/s, "
            f"codec floor {r['decode_floor_per_s']:.0f}/s: {100 * r['decode_per_s'] / r['decode_floor_per_s']:.1f} % "
            f"(goal >= 95 %); plain msgpack.unpackb of the same bytes {r['plain_msgpack_per_s']:.0f}/s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
