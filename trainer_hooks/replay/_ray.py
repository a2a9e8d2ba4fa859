"""Replay on a Ray cluster: :func:`replay_on_ray`.

The samples' positions are split into contiguous shards, one Ray task each. A task opens the
bundle *by path* (the cluster shares the filesystem the bundle lives on; nothing but the plan
and a list of positions is shipped), builds the processor from the same recorded settings, runs
:func:`trainer_hooks.replay._run.replay_positions` and returns its sample entries, payloads
and peak RSS. The driver concatenates the entries in position order, so the merged report is
the local one, fingerprints included; only ``peak_rss_bytes`` (the largest of the processes)
differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_hooks.replay._plan import ReplayPlan
from trainer_hooks.replay._run import replay_positions

__all__ = ["replay_on_ray", "shard_positions"]


def shard_positions(positions: tuple[int, ...], shards: int) -> list[tuple[int, ...]]:
    """Split ``positions`` into at most ``shards`` contiguous, non-empty, near-equal runs."""
    shards = max(1, min(shards, len(positions)))
    size, extra = divmod(len(positions), shards)
    out, start = [], 0
    for i in range(shards):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            out.append(positions[start:end])
        start = end
    return out


def _replay_shard(
    plan: ReplayPlan, positions: tuple[int, ...], with_payloads: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    from trainer_hooks.replay._memory import tune_allocator

    tune_allocator()  # a Ray worker may be reused by other tasks; the setting only moves big buffers to mmap
    return replay_positions(plan, positions, with_payloads=with_payloads)


def replay_on_ray(
    plan: ReplayPlan,
    *,
    address: str | None = None,
    with_payloads: bool = False,
    num_tasks: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Run ``plan`` as Ray tasks; returns ``(entries, payloads, peak RSS)`` like ``replay_positions``.

    Uses the Ray session this process already has; otherwise connects to ``address`` (``auto``:
    the cluster of ``RAY_ADDRESS`` or ``ray start``), or with no address to a running local
    cluster or a new one, and shuts down what it started.
    """
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        if num_tasks is None:
            num_tasks = max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(num_cpus=1)(_replay_shard)
        shards = shard_positions(plan.positions, num_tasks)
        refs = [task.remote(plan, shard, with_payloads) for shard in shards]
        # Progress by finished shard; results are then taken in shard (= position) order.
        size = {ref: len(shard) for ref, shard in zip(refs, shards, strict=True)}
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            done += size[ready[0]]
            if progress is not None:
                progress(done, len(plan.positions))
        entries: list[dict[str, Any]] = []
        payloads: list[dict[str, Any]] = []
        peak = 0
        for part_entries, part_payloads, part_peak in ray.get(refs):
            entries.extend(part_entries)
            payloads.extend(part_payloads)
            peak = max(peak, part_peak)
        return entries, payloads, peak
    finally:
        if started:
            ray.shutdown()
