"""Writing rollout checkpoints: snapshot now, write in the background, in call order.

Save protocol (:class:`RolloutCheckpointer`)
--------------------------------------------
1. ``save()`` first raises the error of an earlier background save that failed, if any (each
   failure is raised exactly once, at the next ``save()`` or ``flush()``; it is never
   swallowed). The new save is then *not* started: the caller decides whether to retry.
2. It snapshots the groups synchronously (:func:`trainer_hooks.checkpoints._snapshot.snapshot_groups`, whose
   docstring has the cost and the trade-off): after ``save()`` returns, mutating a sample (even
   in place, even a tensor) does not change the checkpoint; media files are never touched on the
   caller's thread.
3. A single worker thread (so saves commit in call order) runs the snapshot's deferred checks,
   encodes images, calls :func:`bundles.write_bundle` (staging directory, fsync, rename: the
   commit protocol of :mod:`bundles._local.commit`) and only then applies retention
   (:mod:`trainer_hooks.checkpoints._retention`).
4. ``flush()`` waits for every queued save and raises the first failure. Drivers run it from the
   disposer *before* ``release_run_media``: a background save may still be linking media out of
   the run directory.

A process killed at any point leaves the previous checkpoints complete: a checkpoint directory
either does not exist or is a committed bundle; a dead writer's staging directory is removed by
the next save into the same ``rollout/`` directory.
"""

from __future__ import annotations

import logging
import threading
import time
from argparse import Namespace
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bundles import BundleError, Location
from trainer_hooks._sample_bundle import (
    other_run_media_policy,
    run_media_roots,
    run_meta,
    write_samples_bundle,
)
from trainer_hooks.checkpoints._groups import flatten_groups, group_layout
from trainer_hooks.checkpoints._paths import CHECKPOINT_KIND, CHECKPOINT_VERSION, _require, checkpoint_path
from trainer_hooks.checkpoints._retention import apply_retention
from trainer_hooks.checkpoints._snapshot import snapshot_groups


def materialize_dicts(group: Any) -> list[Any]:
    """A group as sample dicts: a journal-restored group not yet decoded (anything with
    ``load_dicts()``) is decoded now."""
    load = getattr(group, "load_dicts", None)
    return load() if callable(load) else group


__all__ = ["CheckpointSaveError", "RolloutCheckpointer", "save_rollout_checkpoint"]

logger = logging.getLogger(__name__)


class CheckpointSaveError(BundleError):
    """A background checkpoint save failed; ``__cause__`` holds the original error."""


@dataclass(frozen=True)
class _Extras:
    """What a save may hold besides its groups, as :meth:`RolloutCheckpointer.submit_snapshot`
    takes it (there documented): one value on its way to the worker."""

    recycled: list[list[Any]] | None = None
    extra_meta: dict[str, Any] | None = None
    on_commit: Callable[[dict[str, Any]], None] | None = None


def _write_checkpoint(
    args: Namespace,
    rollout_id: int,
    pending: list[list[Any]],
    completed: list[list[Any]],
    checks: Sequence[Callable[[], None]] = (),
    extras: _Extras = _Extras(),
) -> Location:
    recycled = extras.recycled
    started = time.perf_counter()
    for check in checks:  # the snapshot's deferred checks, before anything is written
        check()
    # Groups restored from the journal and not trained yet are decoded here, off the caller.
    pending = [materialize_dicts(g) for g in pending]
    completed = [materialize_dicts(g) for g in completed]
    dest = checkpoint_path(_require(args, "save", "--save"), rollout_id)
    layouts = {
        "pending_group_sizes": [group_layout(g) for g in pending],
        "completed_group_sizes": [group_layout(g) for g in completed],
    }
    if recycled is not None:
        layouts["recycled_group_sizes"] = [group_layout(g) for g in recycled]
    extra = dict(extras.extra_meta or {})
    flat_only = all(type(x) is int for sizes in layouts.values() for x in sizes)
    version = 1 if flat_only and recycled is None and not extra else CHECKPOINT_VERSION
    meta = {"checkpoint_version": version, "rollout_id": rollout_id, **run_meta(args), **layouts, **extra}
    samples = flatten_groups(pending) + flatten_groups(completed) + flatten_groups(recycled or [])
    path = write_samples_bundle(
        dest,
        samples,
        media_roots=run_media_roots(args),
        kind=CHECKPOINT_KIND,
        meta=meta,
        link=getattr(args, "bundle_link_mode", None) or "auto",
        overwrite=True,
        outside_paths=other_run_media_policy(args),
    )
    if extras.on_commit is not None:
        extras.on_commit(meta)
    apply_retention(args.save, getattr(args, "keep_rollout_checkpoints", None), keep_id=rollout_id)
    _log_save(path, meta, len(samples), time.perf_counter() - started)
    return path


def _log_save(path: Location, meta: dict[str, Any], samples: int, total_s: float) -> None:
    """The one log line of a save: what it cost the caller and in all (its meta holds the
    caller's part and the journal's counters; the total is known only after the commit)."""
    tele = meta.get("save_telemetry") or {}
    journal = (meta.get("journal") or {}).get("stats") or {}
    logger.info(
        "rollout checkpoint %s: %d samples, %s media file(s) %s bytes, blocked the caller %.1f ms "
        "(journal barrier %.1f ms), total %.1f ms; journal: %s records, %s bytes, %s flushes, %s media "
        "linked, %s copied",
        path,
        samples,
        tele.get("media_files", "?"),
        tele.get("media_bytes", "?"),
        1e3 * float(tele.get("blocking_s", 0.0)),
        1e3 * float(tele.get("journal_barrier_s", 0.0)),
        1e3 * total_s,
        journal.get("records", 0),
        journal.get("bytes", 0),
        journal.get("flushes", 0),
        journal.get("media_linked", 0),
        journal.get("media_copied", 0),
    )


def _write_logged(
    args: Namespace,
    rollout_id: int,
    pending: list[list[Any]],
    completed: list[list[Any]],
    checks: Sequence[Callable[[], None]],
    extras: _Extras,
) -> Location:
    """:func:`_write_checkpoint` on the worker. A failure is also logged at once: it is raised at
    the next ``save()``/``flush()``, but a process that never calls either still shows it."""
    try:
        return _write_checkpoint(args, rollout_id, pending, completed, checks, extras)
    except BaseException as e:
        logger.error(
            "background save of the rollout checkpoint for rollout %s failed (raised at the next "
            "save() or flush()): %s: %s",
            rollout_id,
            type(e).__name__,
            e,
        )
        raise


def save_rollout_checkpoint(
    args: Namespace,
    rollout_id: int,
    pending_groups: Iterable[Iterable[Any]],
    completed_groups: Iterable[Iterable[Any]],
) -> Location:
    """Write the checkpoint of ``rollout_id`` now, in this thread, and apply retention.

    Args:
        args: with ``save``, and ``shared_media_dir``/``run_uuid`` when samples reference media;
            ``bundle_link_mode``, ``keep_rollout_checkpoints``, ``bf16``/``fp16`` and
            ``rollout_processor_args`` are used when present.
        rollout_id: the rollout step; the bundle goes to ``<save>/rollout/fully_async_<id>``.
        pending_groups: prompt groups in flight (resubmitted on resume).
        completed_groups: finished groups waiting for training; a group may be nested
            (``list[list[Sample]]``) and comes back nested.

    Returns:
        The committed bundle's path.

    Use :class:`RolloutCheckpointer` to keep the write off the caller's thread.
    """
    pending = snapshot_groups(pending_groups, where="pending_groups")
    completed = snapshot_groups(completed_groups, where="completed_groups")
    return _write_checkpoint(args, rollout_id, pending, completed)


class RolloutCheckpointer:
    """Background checkpoint saves: snapshot on ``save()``, write on one worker thread, in order.

    See the module docstring for the protocol. Thread-safe; ``close()`` flushes and stops the
    worker. The worker is a non-daemon thread, so a normal interpreter exit also waits for queued
    saves.
    """

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._futures: list[tuple[int, Location, Future[Location]]] = []
        self.committed: list[Location] = []

    def _raise_failed(self, *, wait: bool) -> None:
        with self._lock:
            queued = list(self._futures)
        for rid, dest, fut in queued:
            if not wait and not fut.done():
                break  # saves complete in order: nothing after an unfinished one is done
            exc = fut.exception()
            with self._lock:
                entry = (rid, dest, fut)
                if entry not in self._futures:
                    continue  # another thread reported it already
                self._futures.remove(entry)
                if exc is None:
                    self.committed.append(fut.result())
            if exc is not None:
                raise CheckpointSaveError(
                    f"{dest}: background save of the rollout checkpoint for rollout {rid} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

    def save(
        self,
        rollout_id: int,
        pending_groups: Iterable[Iterable[Any]],
        completed_groups: Iterable[Iterable[Any]],
    ) -> Future[Location]:
        """Snapshot the groups and queue the write; returns the future of the committed path.

        Raises :class:`CheckpointSaveError` (and queues nothing) when an earlier save failed.
        """
        self._raise_failed(wait=False)
        dest = checkpoint_path(_require(self.args, "save", "--save"), rollout_id)
        checks: list[Callable[[], None]] = []
        pending = snapshot_groups(pending_groups, where="pending_groups", deferred=checks)
        completed = snapshot_groups(completed_groups, where="completed_groups", deferred=checks)
        return self.submit_snapshot(rollout_id, dest, pending, completed, checks)

    def submit_snapshot(
        self,
        rollout_id: int,
        dest: Location,
        pending: list[list[Any]],
        completed: list[list[Any]],
        checks: Sequence[Callable[[], None]] = (),
        *,
        recycled: list[list[Any]] | None = None,
        extra_meta: dict[str, Any] | None = None,
        on_commit: Callable[[dict[str, Any]], None] | None = None,
    ) -> Future[Location]:
        """Queue already-snapshotted groups (nothing may mutate them afterwards) and the
        snapshot's deferred checks, which run on the worker before anything is written.

        ``recycled`` (groups waiting in a data source's own buffer) and ``extra_meta`` (JSON
        values, e.g. a data source's cursor under ``"data_source"``, the journal's state) are
        merged into the checkpoint (version 2 when present); ``on_commit(meta)`` runs on the
        worker once the bundle is committed (the journal's compaction).
        """
        extras = _Extras(recycled, extra_meta, on_commit)
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-checkpoint")
            fut = self._executor.submit(
                _write_logged, self.args, rollout_id, pending, completed, checks, extras
            )
            self._futures.append((rollout_id, dest, fut))
        return fut

    @property
    def pending_saves(self) -> int:
        with self._lock:
            return sum(not f.done() for _, _, f in self._futures)

    def flush(self) -> list[Location]:
        """Wait for every queued save; raise the first failure. Returns the paths committed since
        the last flush."""
        try:
            self._raise_failed(wait=True)
        finally:
            with self._lock:
                done, self.committed = self.committed, []
        return done

    def close(self) -> None:
        """Flush, then stop the worker thread (also when the flush raises)."""
        try:
            self.flush()
        finally:
            with self._lock:
                executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True)
