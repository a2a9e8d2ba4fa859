"""How long ``save()`` blocks with 600 1080p samples in flight on Miles' ``FullyAsyncRolloutFn`` (not a test).

    python benchmarks/bench_miles_save.py [--n 600] [--turns 8] [--repeats 5] [--dir bench-out]

Needs the Miles snapshot at ``../shared/miles`` (imported with the test harness' stand-ins for
sglang and sglang_router, see tests/miles_harness.py). Reuses ``benchmarks/bench_save.py``'s cached
screenshots (~1 MB PNGs in a run media directory) and sample shape (multi-turn trajectories of
``--turns`` screenshots, turn k references the first k+1; 1024 prompt tokens each), as Miles
``Sample`` objects. ``trainer_hooks.miles.FullyAsyncRolloutFn`` (Miles' class with ``save``) runs on
Miles' background event loop through Miles' ``call_rollout_function``, with
``--async-max-concurrent-samples N``: the data source hands out every group, the engine never
finishes one, so all N samples are in flight (snapshotted at hand-out, on the event loop) when
``save()`` is called from this thread, as ``RolloutManager.save`` is.

Measured in the same run, beside ``save()``:

* floor: Miles' own ``RolloutDataSource.save`` (``torch.save`` of the cursor dict), what
  ``RolloutManager.save`` blocks for today while saving no group at all;
* peer: snapshotting the in-flight samples at ``save()`` time (``snapshot_groups``), what a save
  that did not snapshot at hand-out would block for;
* peer: ``copy.deepcopy`` of the groups, the obvious way to take such a snapshot;
* the hand-out cost on the event loop (per sample), and the background commit.

Target (issue 18): ``save()`` blocks for under 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from bench_save import ensure_media, machine_description, make_samples  # noqa: E402
from miles_harness import add_miles_to_path, miles_missing  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=600, help="samples in flight = screenshots (default 600)")
    parser.add_argument("--turns", type=int, default=8, help="samples per group")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("bench-out"))
    parser.add_argument(
        "--rollout-journal-interval",
        type=float,
        default=1.0,
        help="the rollout journal's fsync interval, as the option (default 1.0, the option's default); "
        "0 measures the bundle protocol alone",
    )
    ns = parser.parse_args(argv)
    if (reason := miles_missing()) is not None:
        print(reason)
        return 1
    add_miles_to_path()

    import miles.rollout.fully_async_rollout as fully_async
    import torch
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function
    from miles.utils.async_utils import get_async_loop
    from miles.utils.types import Sample

    from trainer_hooks.checkpoints import snapshot_groups
    from trainer_hooks.miles import FullyAsyncRolloutFn

    bench_dir = ns.dir.resolve()
    paths = ensure_media(bench_dir, ns.n)
    run_dir = paths[0].parent
    groups: dict[int, list] = {}
    for d in make_samples(paths, ns.turns):
        for k in ("response", "loss_mask", "rollout_log_probs", "reward"):
            d.pop(k)  # as handed out: a prompt, not yet generated
        d["response_length"], d["status"] = 0, "pending"
        groups.setdefault(d["group_index"], []).append(Sample.from_dict(d))
    pending = list(groups.values())
    n_samples = sum(len(g) for g in pending)

    class ListSource:  # the data source: hands out the prepared groups, then nothing new
        def __init__(self) -> None:
            self.groups = list(pending)
            self.handout_s = 0.0

        def get_samples(self, n: int) -> list:
            return [self.groups.pop(0) for _ in range(n)]

        def add_samples(self, groups: list) -> None:
            self.groups.extend(groups)

    never = threading.Event()

    class NoProgress:
        def __init__(self, args: Namespace) -> None:
            self.args, self.sampling_params, self.aborted = args, {}, False

    async def stuck_engine(state, group, sampling_params, evaluation=False, sample_done_callback=None):
        while not never.is_set():
            await asyncio.sleep(3600)
        return group

    fully_async.GenerateState = NoProgress
    fully_async.generate_and_rm_group = stuck_engine
    ckpt = bench_dir / "miles-checkpoint-out"
    args = Namespace(
        rollout_global_dataset=True,
        rollout_batch_size=len(pending),
        n_samples_per_prompt=ns.turns,
        max_weight_staleness=None,
        async_max_concurrent_samples=n_samples,
        async_data_buffer_capacity_factor=2.0,
        async_unused_samples_handler="retry",
        custom_async_data_buffer_path=None,
        rollout_submission_granularity="group",
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=30000,
        eval_num_gpus=0,
        save=str(ckpt),
        load=None,
        shared_media_dir=str(run_dir.parent),
        run_uuid=run_dir.name,
        bundle_link_mode="auto",
        keep_rollout_checkpoints=2,
        bf16=True,
        rollout_journal_interval=ns.rollout_journal_interval,
    )
    source = ListSource()
    fn = FullyAsyncRolloutFn(RolloutFnConstructorInput(args=args, data_source=source))
    t_start = time.perf_counter()
    threading.Thread(
        target=call_rollout_function, args=(fn, RolloutFnTrainInput(rollout_id=0)), daemon=True
    ).start()
    while fn.rollout_state.counts()["in_flight"] < len(pending):
        time.sleep(0.001)
    handout = time.perf_counter() - t_start  # includes the worker's start

    print(machine_description(bench_dir))
    print(
        f"{n_samples} samples in flight in {len(pending)} groups (1024 prompt tokens, 1-{ns.turns} 1080p "
        f"screenshots each); rollout journal {'on' if fn.rollout_state.ledger is not None else 'off'} "
        f"(--rollout-journal-interval {ns.rollout_journal_interval})"
    )
    blocked, commit = [], []
    for rid in range(ns.repeats):
        os.sync()
        t0 = time.perf_counter()
        fut = fn.save(rid)
        t1 = time.perf_counter()
        fn.flush()
        commit.append(time.perf_counter() - t1)
        fut.result()
        blocked.append(t1 - t0)
        print(
            f"  repeat {rid}: save() blocked {1000 * (t1 - t0):7.2f} ms; background commit {commit[-1]:6.2f} s"
        )

    floor, snap, deep = [], [], []
    cursor = {
        "sample_offset": 75,
        "epoch_id": 0,
        "sample_group_index": 75,
        "sample_index": 600,
        "metadata": {},
    }
    for _ in range(ns.repeats):
        t0 = time.perf_counter()
        torch.save(cursor, bench_dir / "global_dataset_state_dict_0.pt")
        floor.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        snapshot_groups(pending)
        snap.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        copy.deepcopy(pending)
        deep.append(time.perf_counter() - t0)

    med = statistics.median
    print(f"\n{'':<52} {'median':>9} {'min':>9}")
    for name, xs in (
        ("save() blocks the caller (ours)", blocked),
        ("floor: Miles' data-source save (cursor, torch.save)", floor),
        ("peer: snapshot the in-flight samples at save()", snap),
        ("peer: copy.deepcopy of the in-flight groups", deep),
    ):
        print(f"{name:<52} {1000 * med(xs):9.2f} {1000 * min(xs):9.2f}  ms")
    print(f"{'background commit (save -> flush)':<52} {med(commit):9.2f} {min(commit):9.2f}  s")
    print(
        f"\nsave() / floor {med(blocked) / med(floor):.2f}x; save() / snapshot-at-save {med(blocked) / med(snap):.3f}x; "
        f"hand-out of {n_samples} samples (worker start included) {1000 * handout:.0f} ms, "
        f"{1000 * handout / n_samples:.2f} ms a sample on the event loop"
    )
    target = med(blocked) * 1000
    print(f"target: save() < 50 ms: {'MET' if target < 50 else 'MISSED'} ({target:.2f} ms median)")
    never.set()
    fn.close()
    get_async_loop()  # the loop thread is a daemon: nothing to stop
    os._exit(0)  # the worker task waits on an engine that never answers


if __name__ == "__main__":
    sys.exit(main())
