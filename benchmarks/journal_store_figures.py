"""The rollout journal on an object store against the local journal, in the same run (issue 26,
item 6; used by ``bench_object_store.py --only journal``, runnable alone; not a test).

    python benchmarks/journal_store_figures.py [--n 2000] [--recover-n 10000] [--dir bench-out]

Starts SeaweedFS on 127.0.0.1 itself (tests/helpers/store.py) and measures, with the samples of
``bench_journal.py`` (11k token ids, 1k log-probs, two of a pool of 1080p screenshots):

* **Durable throughput**: ``append_sample`` of ``--n`` lent samples from one thread, then
  ``flush()``; samples per second from the first append until the flush returns (everything
  durable: fsynced locally, shipped on the store). The store journal against the local one, at
  the default interval (goal >= 80 %).
* **PUT requests per second per writer** at the default interval (1 s), samples arriving at a
  steady pace for ``--pace-s`` seconds, counted at a loopback proxy in front of the server
  (goal <= 2).
* **Recovery** of ``--recover-n`` journaled samples (groups of 8) from the store:
  ``FullyAsyncRolloutFn.load`` with ``--load s3://…`` until the first new group is handed to the
  generator (goal <= 2 s), beside the same recovery from a local journal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_journal.py, bench_save.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers.store: loopback servers

from bench_journal import make_samples
from bench_save import ensure_media, machine_description

from bundles.support import remove_tree
from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, parse_args
from trainer_hooks.journal import JournalSink, RolloutJournal, run_journal


def _journal(directory: Path, run_dir: Path, interval: float, url: str | None) -> RolloutJournal:
    remove_tree(directory) if directory.exists() else None
    sink: JournalSink | Path = directory
    if url is not None:
        directory.mkdir(parents=True)
        sink = run_journal(url, spool=lambda: directory)
        sink.check()  # the probe, before the clock starts (a trainer's journal does it at open)
    return RolloutJournal(sink, lineage=f"bench{time.time_ns()}", interval=interval, media_roots=[run_dir])


def journal_groups(samples: list[dict], sink: Any, run_dir: Path, interval: float) -> None:
    """``samples`` journaled as a run does, in groups of 8: take, each sample, group."""
    journal = RolloutJournal(sink, lineage="bench", interval=interval, media_roots=[run_dir])
    for g in range(0, len(samples), 8):
        gid = g // 8
        journal.append_take(
            gid,
            [{"index": s["index"], "group_index": gid, "prompt": "p"} for s in samples[g : g + 8]],
            {"offset": gid + 1},
        )
        for i, s in enumerate(samples[g : g + 8]):
            journal.append_sample(gid, i, s)
        journal.append_group(gid, None)
    journal.close()


def throughput(
    samples: list[dict], directory: Path, run_dir: Path, interval: float, url: str | None, rounds: int
) -> dict:
    journal = _journal(directory, run_dir, interval, url)
    t0 = time.perf_counter()
    # The samples ``rounds`` times over (lent, read only): a run of several intervals, so that
    # the last interval's put (or fsync), which nothing overlaps, weighs as it does in a run.
    for i, s in enumerate(samples * rounds):
        journal.append_sample(i // 8, i % 8, s, copy=False)
    journal.flush()
    elapsed = time.perf_counter() - t0
    stats = journal.stats()
    journal.close()
    return {"per_s": rounds * len(samples) / elapsed, "flushes": stats["flushes"], "bytes": stats["bytes"]}


def upload_floor(url: str, total: int, pieces: int) -> float:
    """Seconds to put ``total`` bytes in ``pieces`` create-only objects one after the other (as
    the journal must, to keep a prefix), with the same client: the store's own rate here."""
    from bundles import StorePrefix

    prefix = StorePrefix(url)
    size = max(1, total // max(1, pieces))
    data = os.urandom(size)
    prefix.check_preconditions()
    t0 = time.perf_counter()
    for i in range(max(1, pieces)):
        prefix.put_create(f"floor-{i}", data)
    return time.perf_counter() - t0


def puts_per_second(
    samples: list[dict], directory: Path, run_dir: Path, url: str, proxy: Any, pace_s: float
) -> dict:
    journal = _journal(directory, run_dir, 1.0, url)
    proxy.clear()
    gap = pace_s / len(samples)
    t0 = time.perf_counter()
    for i, s in enumerate(samples):
        journal.append_sample(i // 8, i % 8, s)
        time.sleep(max(0.0, t0 + (i + 1) * gap - time.perf_counter()))
    elapsed = time.perf_counter() - t0
    puts = sum(1 for method, _, _ in proxy.hits if method == "PUT")
    journal.close()
    return {
        "puts": puts,
        "seconds": elapsed,
        "per_s": puts / elapsed,
        "samples_per_s": len(samples) / elapsed,
    }


def journal_for_recovery(bench: Path, run_dir: Path, samples: list[dict], save: str, interval: float) -> None:
    """The journal a recovery from ``save`` reads: ``samples`` in groups of 8, no checkpoint."""
    spool = bench / "journal-spool"

    def fresh_spool() -> Path:
        remove_tree(spool) if spool.exists() else None
        spool.mkdir(parents=True)
        return spool

    journal_groups(samples, run_journal(save, spool=fresh_spool), run_dir, interval)


def recovery(bench: Path, groups_n: int, save: str, interval: float) -> dict:
    """``FullyAsyncRolloutFn.load`` from ``save`` until the first new group is generated. The
    caller holds no samples meanwhile: a trainer resuming holds none either, and the collector
    would walk them (tens of millions of list slots) on every collection of the heap."""
    shared = bench / "shared-recover"
    remove_tree(shared) if shared.exists() else None
    first = threading.Event()

    async def gen(args: Any, sample: Any) -> Any:
        first.set()
        return sample

    args = parse_args(
        [
            "--rollout-batch-size", "8",
            "--shared-media-dir", str(shared),
            "--run-uuid", "resumed",
            "--save", save,
            "--load", save,
            "--rollout-journal-interval", str(interval),
        ]
    )  # fmt: skip
    more = [[{"index": 10**6 + i, "group_index": 10**6} for i in range(8)]]
    fn = FullyAsyncRolloutFn(
        args, ListDataSource([[]] * groups_n + more), generate_sample=gen, max_in_flight=1, max_buffered=10**6
    )
    t0 = time.perf_counter()
    fn.load(-1, sample_cls=dict)
    t_load = time.perf_counter() - t0
    fn.start()
    first.wait(60)
    t_first = time.perf_counter() - t0
    fn.stop()
    restored = sum(1 for _ in fn.buffer.groups())
    fn.close()
    remove_tree(shared) if shared.exists() else None
    return {"load_s": t_load, "first_group_s": t_first, "groups": restored}


def journal_figures(
    bench: Path, images: list[Path], server: Any, *, n: int, recover_n: int, pace_s: float, rounds: int = 4
) -> None:
    """Print the figures of the module docstring against a running S3 server (``server``: a
    tests/helpers/store.py server whose environment is already set)."""
    from helpers.store import FaultProxy

    run_dir = images[0].parent
    bucket = server.bucket()
    url = f"s3://{bucket}/journal-bench"
    samples = make_samples(n, images)
    local = max(
        (throughput(samples, bench / "journal-local", run_dir, 1.0, None, rounds) for _ in range(2)),
        key=lambda r: r["per_s"],
    )
    store = max(
        (throughput(samples, bench / "journal-spool", run_dir, 1.0, f"{url}/t{i}", rounds) for i in range(2)),
        key=lambda r: r["per_s"],
    )
    floor_s = upload_floor(f"{url}/floor", store["bytes"], store["flushes"])
    floor_per_s = rounds * n / floor_s
    # Both floors at once, as the store journal must run them: the local journal's work and the
    # server taking the same bytes, each on its own thread (this machine has two cores, the
    # server process is on them too). The machine's floor for a journal on this store.
    took: list[float] = []
    uploader = threading.Thread(
        target=lambda: took.append(upload_floor(f"{url}/both", store["bytes"], store["flushes"]))
    )
    t0 = time.perf_counter()
    uploader.start()
    throughput(samples, bench / "journal-local", run_dir, 1.0, None, rounds)
    uploader.join()
    both_per_s = rounds * n / (time.perf_counter() - t0)
    print(
        f"journal on the store, durable throughput ({n} lent samples x {rounds}, 1 s interval, the better of two runs): "
        f"{store['per_s']:.0f} samples/s, local journal {local['per_s']:.0f}/s: "
        f"{100 * store['per_s'] / local['per_s']:.1f} % of local (goal >= 80 %); "
        f"{store['flushes']} shipments, {store['bytes'] / 1e6:.0f} MB; the store alone takes those bytes "
        f"(raw create-only puts in order, same client) at {store['bytes'] / floor_s / 1e6:.0f} MB/s = "
        f"{floor_per_s:.0f} samples/s; both at once (the local journal's work while the server takes the bytes, "
        f"as on this 2-core machine they share the cores) {both_per_s:.0f} samples/s: "
        f"{100 * store['per_s'] / both_per_s:.1f} % of that floor",
        flush=True,
    )
    proxy = FaultProxy(server.endpoint)
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
    try:
        paced = puts_per_second(
            samples[:400], bench / "journal-spool", run_dir, f"{url}/paced", proxy, pace_s
        )
    finally:
        if saved is not None:
            os.environ["AWS_ENDPOINT_URL"] = saved
        proxy.close()
    print(
        f"journal on the store, requests: {paced['puts']} PUTs in {paced['seconds']:.1f} s at "
        f"{paced['samples_per_s']:.0f} samples/s: {paced['per_s']:.2f} PUT/s per writer at the default "
        f"1 s interval (goal <= 2; a put per interval carries its records and new screenshots)",
        flush=True,
    )
    del samples
    if recover_n:
        groups = make_samples(recover_n // 8 * 8, images, seed=1)
        groups_n = len(groups) // 8
        local_save = bench / "journal-recover-local"
        remove_tree(local_save) if local_save.exists() else None
        journal_for_recovery(bench, run_dir, groups, f"{url}/recover", 1.0)
        journal_for_recovery(bench, run_dir, groups, str(local_save), 1.0)
        del groups
        remote = recovery(bench, groups_n, f"{url}/recover", 1.0)
        here = recovery(bench, groups_n, str(local_save), 1.0)
        remove_tree(local_save) if local_save.exists() else None
        print(
            f"journal on the store, recovery of {groups_n * 8} journaled samples: first new group after "
            f"{remote['first_group_s']:.2f} s (load {remote['load_s']:.2f} s; goal <= 2 s); from a local "
            f"journal {here['first_group_s']:.2f} s",
            flush=True,
        )
    for name in ("journal-local", "journal-spool"):
        shutil.rmtree(bench / name, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="samples for the throughput runs")
    parser.add_argument("--rounds", type=int, default=4, help="times the samples are appended (a longer run)")
    parser.add_argument("--recover-n", type=int, default=10_000, help="samples journaled for recovery")
    parser.add_argument(
        "--pace-s", type=float, default=5.0, help="seconds of paced appends for the PUT count"
    )
    parser.add_argument("--pool", type=int, default=32, help="cached 1080p screenshots shared by the samples")
    parser.add_argument("--dir", type=Path, default=Path("bench-out"))
    ns = parser.parse_args(argv)
    bench = ns.dir.resolve()
    images = ensure_media(bench, ns.pool)
    print(machine_description(bench))
    from helpers.store import seaweed_server

    with seaweed_server() as server:
        os.environ.update(server.env)
        journal_figures(
            bench, images, server, n=ns.n, recover_n=ns.recover_n, pace_s=ns.pace_s, rounds=ns.rounds
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
