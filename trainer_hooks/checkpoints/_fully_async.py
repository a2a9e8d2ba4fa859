"""A fully-asynchronous rollout function with automatic, bundled checkpoints.

Shaped like Miles' fully-async rollout: a persistent asyncio worker (on its own thread) keeps up
to ``max_in_flight`` prompt groups generating; finished groups wait in a :class:`GroupBuffer`;
each call drains ``rollout_batch_size`` groups, sorted by index, for training. The group
generator (``async def generate_group(args, group) -> group``) and the data source (an object
with Miles' ``get_samples(n) -> list[group]``, or a plain callable ``n -> list[group]``) are
pluggable.

Checkpoints
-----------
``save(rollout_id)`` writes, with no further call, one bundle of kind ``"rollout_checkpoint"``
at ``<args.save>/rollout/fully_async_<rollout_id>`` holding the in-flight groups and the buffered
groups (see :mod:`trainer_hooks.checkpoints`). Each group is snapshotted when it is *submitted*
(before the generator can touch it), so an in-flight group is saved as the prompt the data
source gave, never half-generated; buffered groups are snapshotted in ``save()``. Both are
collected under one lock that also guards the move of a finished group from "in flight" to
"buffered", so every group is saved exactly once. The write runs on a background thread;
``flush()`` waits for it and raises a failure; ``close()`` stops the worker and flushes. The
object is also a rollout manager for the reference drivers (``generate``, ``save``, ``dispose``,
``flush``): their disposer runs ``dispose`` then ``flush`` before ``release_run_media``. Code
with its own :class:`~trainer_hooks.RunDisposer` registers ``close`` *after*
``release_run_media``, so that it runs before the run's media are deleted.

``load(rollout_id)`` reads ``<args.load>/rollout/fully_async_<rollout_id>``, rehydrates its
media into the current run's directory, queues the pending groups for resubmission ahead of any
new prompt, and puts the completed groups back into the buffer.

Trade-off: the worker polls every ``poll_interval`` seconds for free budget instead of being
woken by every drain; with a 10 ms default that is invisible next to generation times.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from argparse import Namespace
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from trainer_hooks.checkpoints._paths import _require, checkpoint_path
from trainer_hooks.checkpoints._reader import read_rollout_checkpoint
from trainer_hooks.checkpoints._snapshot import snapshot_groups
from trainer_hooks.checkpoints._writer import RolloutCheckpointer

__all__ = ["FullyAsyncRolloutFn", "GroupBuffer", "ListDataSource", "RolloutWorkerError"]

logger = logging.getLogger(__name__)

GroupGenerator = Callable[[Namespace, list[Any]], Awaitable[list[Any]]]


class RolloutWorkerError(RuntimeError):
    """The group generator or the data source raised inside the rollout worker."""


class ListDataSource:
    """A data source over a fixed list of prompt groups (Miles' ``get_samples`` call shape)."""

    def __init__(self, groups: Iterable[list[Any]]) -> None:
        self._groups = deque(groups)

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        out: list[list[Any]] = []
        while self._groups and len(out) < num_samples:
            out.append(self._groups.popleft())
        return out

    def __len__(self) -> int:
        return len(self._groups)


class GroupBuffer:
    """Completed groups waiting for training (Miles' data buffer: ``put``, ``get``, ``get_metrics``).

    Not locked by itself: :class:`FullyAsyncRolloutFn` guards it with its own lock.
    """

    def __init__(self) -> None:
        self._groups: deque[list[Any]] = deque()
        self.total_put = 0
        self.total_got = 0

    def put(self, group: list[Any]) -> None:
        self._groups.append(group)
        self.total_put += 1

    def get(self, n: int) -> list[list[Any]]:
        out = [self._groups.popleft() for _ in range(min(n, len(self._groups)))]
        self.total_got += len(out)
        return out

    def groups(self) -> list[list[Any]]:
        return list(self._groups)

    def get_metrics(self) -> dict[str, int]:
        return {
            "buffer/size": len(self._groups),
            "buffer/total_put": self.total_put,
            "buffer/total_got": self.total_got,
        }

    def __len__(self) -> int:
        return len(self._groups)


def _group_index(group: list[Any]) -> tuple[int, int]:
    first = group[0] if group else None
    idx = getattr(first, "index", None) if first is not None else None
    return (0, idx) if isinstance(idx, int) else (1, 0)


class FullyAsyncRolloutFn:
    """Fully-asynchronous rollout with background generation and bundled checkpoints.

    Args:
        args: parsed arguments (``rollout_batch_size``, ``save``, ``load``, run media options).
        data_source: ``get_samples(n) -> list[group]`` object or a callable ``n -> list[group]``.
        generate_group: ``async (args, group) -> group``; the returned group is buffered.
        max_in_flight: groups generating at once (default ``2 * rollout_batch_size``).
        max_buffered: stop submitting while in-flight plus buffered groups reach this
            (default ``4 * rollout_batch_size``).

    Example:
        >>> fn = FullyAsyncRolloutFn(args, data_source, generate_group)      # doctest: +SKIP
        >>> disposer.callback(fn.close, name="rollout_fn.close")              # doctest: +SKIP
        >>> groups = fn(rollout_id)                                            # doctest: +SKIP
        >>> fn.save(rollout_id)   # returns at once; written in the background  # doctest: +SKIP
    """

    def __init__(
        self,
        args: Namespace,
        data_source: Any,
        generate_group: GroupGenerator,
        *,
        max_in_flight: int | None = None,
        max_buffered: int | None = None,
        poll_interval: float = 0.01,
        sample_cls: Any = None,
    ) -> None:
        self.args = args
        self.sample_cls = sample_cls
        self.batch_size = int(getattr(args, "rollout_batch_size", None) or 1)
        self._get_groups: Callable[[int], list[list[Any]]] = (
            data_source.get_samples if hasattr(data_source, "get_samples") else data_source
        )
        self.generate_group = generate_group
        self.max_in_flight = max_in_flight or 2 * self.batch_size
        self.max_buffered = max(max_buffered or 4 * self.batch_size, self.max_in_flight)
        self.poll_interval = poll_interval
        self.buffer = GroupBuffer()
        self.checkpointer = RolloutCheckpointer(args)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._in_flight: dict[int, list[dict[Any, Any]]] = {}  # key -> snapshot taken at submission
        self._resubmit: deque[list[Any]] = deque()
        self._keys = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._source_exhausted = False

    # -- worker ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background worker (done by the first drain)."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._thread_main, name="fully-async-rollout", daemon=True)
            self._thread.start()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._worker())
        except BaseException as e:  # surfaced by drain(); never lost
            with self._changed:
                self._error = self._error or e
                self._changed.notify_all()

    def _next_groups(self, n: int) -> list[list[Any]]:
        """Resubmitted groups first, then fresh ones. Called with the lock held."""
        out = [self._resubmit.popleft() for _ in range(min(n, len(self._resubmit)))]
        if len(out) < n and not self._source_exhausted:
            fresh = list(self._get_groups(n - len(out)))
            if not fresh:
                self._source_exhausted = True
            out += fresh
        return out

    async def _worker(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self._stop.is_set():
                with self._lock:
                    room = min(
                        self.max_in_flight - len(self._in_flight),
                        self.max_buffered - len(self._in_flight) - len(self.buffer),
                    )
                if room > 0:
                    # Taking groups and recording them as in flight is one step under the lock, so
                    # a concurrent save() sees each group exactly once (queued, in flight or
                    # buffered). The snapshot is taken before the generator can touch the group:
                    # it is what a checkpoint saves.
                    with self._lock:
                        started = []
                        for group in self._next_groups(room):
                            key = next(self._keys)
                            self._in_flight[key] = snapshot_groups([group], where=f"in_flight[{key}]")[0]
                            started.append((key, group))
                    for key, group in started:
                        tasks.add(asyncio.create_task(self._run_group(key, group)))
                if tasks:
                    done, _ = await asyncio.wait(
                        tasks, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED
                    )
                    tasks -= done
                    for t in done:
                        t.result()
                else:
                    await asyncio.sleep(self.poll_interval)
        finally:
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_group(self, key: int, group: list[Any]) -> None:
        try:
            result = await self.generate_group(self.args, group)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            with self._changed:
                # The group stays "in flight": a checkpoint taken now still resubmits it.
                self._error = self._error or e
                self._stop.set()
                self._changed.notify_all()
            return
        if not isinstance(result, list):
            result = list(result)
        with self._changed:
            del self._in_flight[key]
            self.buffer.put(result)
            self._changed.notify_all()

    def _raise_worker_error(self) -> None:
        if self._error is not None:
            raise RolloutWorkerError(
                f"rollout worker failed: {type(self._error).__name__}: {self._error}"
            ) from self._error

    # -- training side -----------------------------------------------------------------------------
    def drain(self, n: int | None = None, timeout: float | None = None) -> list[list[Any]]:
        """Wait for ``n`` (default ``rollout_batch_size``) completed groups; return them sorted by
        their first sample's index."""
        n = self.batch_size if n is None else n
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while len(self.buffer) < n:
                self._raise_worker_error()
                if self._source_exhausted and not self._in_flight and not self._resubmit:
                    raise RolloutWorkerError(
                        f"drain: expected {n} completed groups, found {len(self.buffer)} and the data source "
                        "is exhausted with nothing in flight"
                    )
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"drain: expected {n} completed groups within {timeout}s, found {len(self.buffer)} "
                        f"({len(self._in_flight)} in flight)"
                    )
                self._changed.wait(0.1 if remaining is None else min(0.1, remaining))
            groups = self.buffer.get(n)
        return sorted(groups, key=_group_index)

    def __call__(self, rollout_id: int, evaluation: bool = False) -> list[list[Any]]:
        """Miles' rollout-function call: the groups to train ``rollout_id`` on."""
        if evaluation:
            raise NotImplementedError("FullyAsyncRolloutFn: evaluation rollouts are not asynchronous")
        return self.drain()

    def generate(self, rollout_id: int) -> list[list[Any]]:
        """The reference drivers' rollout-manager call (see :mod:`trainer_hooks._drivers`)."""
        return self(rollout_id)

    def dispose(self) -> None:
        """The drivers' ``dispose_rollout_manager`` step: stop generating. Their next step,
        ``flush_pending_writes``, calls :meth:`flush` before ``release_run_media``."""
        self.stop()

    def get_metrics(self) -> dict[str, int]:
        with self._lock:
            return {**self.buffer.get_metrics(), "rollout/in_flight": len(self._in_flight)}

    # -- checkpoints -------------------------------------------------------------------------------
    def save(self, rollout_id: int) -> Future[Path]:
        """Checkpoint in-flight and buffered groups; blocks only for the snapshot (see module doc).

        Raises :class:`trainer_hooks.CheckpointSaveError` when an earlier background save failed.
        """
        self.checkpointer._raise_failed(wait=False)
        dest = checkpoint_path(_require(self.args, "save", "--save"), rollout_id)
        checks: list[Callable[[], None]] = []
        with self._lock:
            pending = list(self._in_flight.values())  # submission snapshots: immutable by contract
            # Buffered groups belong to the caller now and may be mutated: copy them (and the
            # queued resubmissions) while no group can move between the sets.
            pending += snapshot_groups(list(self._resubmit), where="pending_groups", deferred=checks)
            completed = snapshot_groups(self.buffer.groups(), where="completed_groups", deferred=checks)
        return self.checkpointer.submit_snapshot(rollout_id, dest, pending, completed, checks)

    def load(self, rollout_id: int, *, sample_cls: Any = None, verify_media: bool | None = None) -> None:
        """Resume from ``<args.load>/rollout/fully_async_<rollout_id>``: pending groups are
        resubmitted before new prompts, completed groups go back into the buffer. Samples are
        built with ``sample_cls``, else the constructor's ``sample_cls``, else
        :func:`trainer_hooks.default_sample_cls` (Miles' class when ``miles`` imports). The
        rehydrated media are hashed unless ``verify_media`` (default ``--resume-verify-media``,
        on) is False."""
        cls = sample_cls if sample_cls is not None else self.sample_cls
        ckpt = read_rollout_checkpoint(self.args, rollout_id, sample_cls=cls, verify_media=verify_media)
        with self._changed:
            self._resubmit.extendleft(reversed(ckpt.pending_groups))
            for g in ckpt.completed_groups:
                self.buffer.put(g)
            self._changed.notify_all()
        logger.info(
            "loaded %s: %d pending and %d completed groups",
            ckpt.path,
            len(ckpt.pending_groups),
            len(ckpt.completed_groups),
        )

    def flush(self) -> list[Path]:
        """Wait for background checkpoint saves; raise the first failure."""
        return self.checkpointer.flush()

    def stop(self) -> None:
        """Stop the worker (cancelling in-flight generation); the groups stay checkpointable."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            self._thread = None

    def close(self) -> None:
        """Stop the worker, then flush and stop the checkpoint writer (errors are raised)."""
        try:
            self.stop()
        finally:
            self.checkpointer.close()

    def __enter__(self) -> FullyAsyncRolloutFn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
