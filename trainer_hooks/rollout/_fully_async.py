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

What counts as trained: ``save(N)`` is called once the weights of step N are saved, but the
asynchronous driver (:func:`trainer_hooks.train_async`) drains step N+1 while step N trains, so
by then the groups of N+1 may have left the buffer without being in any saved weights. The
groups handed to training for the last two steps drained are therefore kept (a reference, no
copy): ``save(N)`` snapshots those drained for steps after N, which nothing has trained on yet,
and saves them as *completed*, ahead of the buffered ones, with their step
(``meta.consumed_group_steps``); ``load(N)`` puts them back first, exactly once, and a resume
that falls back to an older checkpoint keeps them trained when its step is older than the
weights restored. Groups drained for steps <= N are forgotten. The contract: ``save(N)`` comes
before training of step N+1 starts (as in both reference drivers), and a driver drains at most
two steps ahead of the step it saves (``train_async``: one); a save that finds groups of a later
step released already logs a warning naming them.

``load(rollout_id)`` reads ``<args.load>/rollout/fully_async_<rollout_id>``, rehydrates its
media into the current run's directory, queues the pending groups for resubmission ahead of any
new prompt, and puts the completed groups back into the buffer (those a step after
``rollout_id`` had taken first).

Journal (lossless resume)
-------------------------
With ``--rollout-journal-interval`` > 0 (default 1.0 s) and ``--save`` set, every prompt group
handed out, every finished sibling (with ``generate_sample``) or group (with ``generate_group``)
and every group handed to training is also appended to the rollout journal through one
:class:`~trainer_hooks.rollout.RolloutLedger` (the same the Miles plugins use), and
``load(step)`` restores the newest checkpoint at or before ``step`` plus the journal after it:
a crash loses at most the last interval of generation, and groups trained after ``step`` come
back (see :mod:`trainer_hooks.rollout._ledger` and docs/RESUME.md). A data source with
``state_dict()``/``load_state_dict(state)`` has its cursor saved with the groups.

Trade-off: the worker polls every ``poll_interval`` seconds for free budget instead of being
woken by every drain; with a 10 ms default that is invisible next to generation times.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from argparse import Namespace
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from typing import Any

from bundles import Location
from trainer_hooks.checkpoints import RolloutCheckpointer, saved_checkpoint_path, snapshot_groups
from trainer_hooks.rollout._lazy import LazyGroup, materialize
from trainer_hooks.rollout._ledger import RolloutLedger
from trainer_hooks.rollout._replay import RecoveredGroup

__all__ = ["FullyAsyncRolloutFn", "GroupBuffer", "ListDataSource", "RolloutWorkerError"]

logger = logging.getLogger(__name__)

GroupGenerator = Callable[[Namespace, list[Any]], Awaitable[list[Any]]]
SampleGenerator = Callable[[Namespace, Any], Awaitable[Any]]


class RolloutWorkerError(RuntimeError):
    """The group generator or the data source raised inside the rollout worker."""


class ListDataSource:
    """A data source over a fixed list of prompt groups (Miles' ``get_samples`` call shape)."""

    def __init__(self, groups: Iterable[list[Any]]) -> None:
        self._all = list(groups)
        self._offset = 0

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        out = self._all[self._offset : self._offset + max(0, num_samples)]
        self._offset += len(out)
        return out

    @property
    def dataset_size(self) -> int:
        """Prompt groups in the dataset (the resume fingerprint records it)."""
        return len(self._all)

    def state_dict(self) -> dict[str, int]:
        """The cursor: how many groups were handed out (saved with the rollout state)."""
        return {"offset": self._offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        offset = state.get("offset") if isinstance(state, dict) else None
        if type(offset) is not int or not 0 <= offset <= len(self._all):
            raise ValueError(
                f"ListDataSource.load_state_dict: offset: expected 0..{len(self._all)}, found {offset!r}"
            )
        self._offset = offset

    def __len__(self) -> int:
        return len(self._all) - self._offset


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

    This is the trainer-agnostic loop (``trainer_hooks.FullyAsyncRolloutFn``), for a trainer of
    one's own. Under Miles use :class:`trainer_hooks.miles.FullyAsyncRolloutFn` instead: Miles' own
    class with ``save``/``load``, which keeps Miles' name so that ``--rollout-function-path`` needs
    only the module changed.

    Args:
        args: parsed arguments (``rollout_batch_size``, ``save``, ``load``, run media options).
        data_source: ``get_samples(n) -> list[group]`` object or a callable ``n -> list[group]``.
        generate_group: ``async (args, group) -> group``; the returned group is buffered.
        generate_sample: instead of ``generate_group``, ``async (args, sample) -> sample``: the
            siblings of a group generate concurrently and each is journaled when finished, so
            a resume keeps finished siblings and regenerates only the others. A returned
            sample is lent to the journal, not copied: the generator must not change it
            afterwards (``drain()`` hands it to training once the journal has encoded it).
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
        generate_group: GroupGenerator | None = None,
        *,
        generate_sample: SampleGenerator | None = None,
        max_in_flight: int | None = None,
        max_buffered: int | None = None,
        poll_interval: float = 0.01,
        sample_cls: Any = None,
    ) -> None:
        self.args = args
        self.sample_cls = sample_cls
        self.batch_size = int(getattr(args, "rollout_batch_size", None) or 1)
        self.data_source = data_source
        self._get_groups: Callable[[int], list[list[Any]]] = (
            data_source.get_samples if hasattr(data_source, "get_samples") else data_source
        )
        if (generate_group is None) == (generate_sample is None):
            raise TypeError("FullyAsyncRolloutFn: pass exactly one of generate_group and generate_sample")
        self.generate_group = generate_group
        self.generate_sample = generate_sample
        self.max_in_flight = max_in_flight or 2 * self.batch_size
        self.max_buffered = max(max_buffered or 4 * self.batch_size, self.max_in_flight)
        self.poll_interval = poll_interval
        self.buffer = GroupBuffer()
        self.checkpointer = RolloutCheckpointer(args)
        size = getattr(data_source, "dataset_size", None)
        self.ledger = RolloutLedger(args, prompts=size if isinstance(size, int) else None)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._in_flight: dict[int, list[dict[Any, Any]]] = {}  # group id -> snapshot taken at submission
        self._resubmit: deque[RecoveredGroup] = deque()
        self._buffer_gids: deque[int] = deque()  # the group ids of self.buffer, in its order
        # Groups drained for the last two steps whose weights no save has covered yet: group id
        # -> (step, the group as handed to training). Kept only when checkpoints can be written.
        self._consumed: dict[int, tuple[int, Any]] = {}
        self._keep_consumed = getattr(args, "save", None) is not None
        self._released_step = -1  # the newest step whose held groups were released unsaved
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
            self.ledger.open()
            self._thread = threading.Thread(target=self._thread_main, name="fully-async-rollout", daemon=True)
            self._thread.start()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._worker())
        except BaseException as e:  # surfaced by drain(); never lost
            with self._changed:
                self._error = self._error or e
                self._changed.notify_all()

    def _cursor(self) -> Any:
        state = getattr(self.data_source, "state_dict", None)
        return state() if callable(state) else None

    def _next_groups(self, n: int) -> list[tuple[int, list[Any], dict[int, Any]]]:
        """Resubmitted groups first, then fresh ones, as (group id, group, finished siblings),
        each recorded as in flight. Called with the lock held."""
        out = []
        for _ in range(min(n, len(self._resubmit))):
            r = self._resubmit.popleft()
            self._in_flight[r.gid] = snapshot_groups([r.prompt], where=f"in_flight[{r.gid}]")[0]
            out.append((r.gid, r.prompt, r.done))
        if len(out) < n and not self._source_exhausted:
            fresh = list(self._get_groups(n - len(out)))
            if not fresh:
                self._source_exhausted = True
            cursor = self._cursor() if fresh else None
            # The snapshots are taken before the generator can touch the groups: they are what a
            # checkpoint saves and what the journal records (no second copy).
            snaps = snapshot_groups(fresh, where="in_flight")
            for gid, group, snap in zip(
                self.ledger.take_batch(snaps, cursor, snapshot=False), fresh, snaps, strict=True
            ):
                self._in_flight[gid] = snap
                out.append((gid, group, {}))
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
                    # buffered).
                    with self._lock:
                        started = self._next_groups(room)
                    for gid, group, siblings in started:
                        tasks.add(asyncio.create_task(self._run_group(gid, group, siblings)))
                if tasks:
                    finished, _ = await asyncio.wait(
                        tasks, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED
                    )
                    tasks -= finished
                    for task in finished:
                        task.result()
                else:
                    await asyncio.sleep(self.poll_interval)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_sample(self, gid: int, sibling: int, sample: Any) -> Any:
        assert self.generate_sample is not None
        result = await self.generate_sample(self.args, sample)
        with self._lock:
            # Lent, not copied: nothing touches a finished sample until drain() hands it to
            # training, and drain() first waits for the journal to have encoded it.
            self.ledger.append_sample(gid, sibling, result, copy=False)
        return result

    async def _generate(self, gid: int, group: list[Any], done: dict[int, Any]) -> tuple[list[Any], bool]:
        if self.generate_sample is None:
            assert self.generate_group is not None
            result = await self.generate_group(self.args, group)
            return (result if isinstance(result, list) else list(result)), False
        todo = [i for i in range(len(group)) if i not in done]
        new = await asyncio.gather(*(self._run_sample(gid, i, group[i]) for i in todo))
        finished = dict(done)
        finished.update(zip(todo, new, strict=True))
        return [finished[i] for i in range(len(group))], True

    async def _run_group(self, key: int, group: list[Any], done: dict[int, Any] | None = None) -> None:
        try:
            result, by_sibling = await self._generate(key, group, done or {})
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            with self._changed:
                # The group stays "in flight": a checkpoint taken now still resubmits it.
                self._error = self._error or e
                self._stop.set()
                self._changed.notify_all()
            return
        with self._changed:
            del self._in_flight[key]
            self.buffer.put(result)
            self._buffer_gids.append(key)
            # Every sibling is journaled already in sample mode: the record then has no body.
            self.ledger.append_group(key, None if by_sibling else result)
            self._changed.notify_all()

    def _raise_worker_error(self) -> None:
        if self._error is not None:
            raise RolloutWorkerError(
                f"rollout worker failed: {type(self._error).__name__}: {self._error}"
            ) from self._error

    # -- training side -----------------------------------------------------------------------------
    def drain(
        self, n: int | None = None, timeout: float | None = None, *, step: int | None = None
    ) -> list[list[Any]]:
        """Wait for ``n`` (default ``rollout_batch_size``) completed groups; return them sorted by
        their first sample's index. They are journaled as consumed by training ``step`` (None:
        consumed for good, whatever step a resume restores)."""
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
            # Every sample of a buffered group was journaled before the group was buffered.
            lent_upto = self.ledger.last_seq() if self.generate_sample is not None else 0
        if lent_upto:
            # The samples lent to the journal become the trainer's once encoded (usually they
            # are already). Waited for outside the lock and before anything is taken: a timeout
            # leaves the groups buffered.
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.ledger.wait_encoded(lent_upto, timeout=remaining)
        with self._changed:
            groups = self.buffer.get(n)
            gids = [self._buffer_gids.popleft() for _ in groups]
            self.ledger.record_consumed(-1 if step is None else step, gids)
            if step is not None and self._keep_consumed:
                self._hold_consumed(step, gids, groups)
        # Groups restored from the journal are decoded only now, outside the lock.
        return sorted((materialize(g) for g in groups), key=_group_index)

    def _hold_consumed(self, step: int, gids: list[int], groups: list[Any]) -> None:
        """Keep the groups drained for ``step`` until a save covers it (see the module docstring),
        with the lock held, so that a concurrent save() sees each group buffered or held, never
        neither; release those of steps older than the one before ``step``. A group restored
        from the journal is kept encoded (a copy the training side never decodes)."""
        for gid in [gid for gid, (s, _) in self._consumed.items() if s < step - 1]:
            self._released_step = max(self._released_step, self._consumed.pop(gid)[0])
        for gid, group in zip(gids, groups, strict=True):
            self._consumed[gid] = (step, group.undecoded() if isinstance(group, LazyGroup) else group)

    def __call__(self, rollout_id: int, evaluation: bool = False) -> list[list[Any]]:
        """Miles' rollout-function call: the groups to train ``rollout_id`` on."""
        if evaluation:
            raise NotImplementedError("FullyAsyncRolloutFn: evaluation rollouts are not asynchronous")
        return self.drain(step=rollout_id)

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
    def save(self, rollout_id: int) -> Future[Location]:
        """Checkpoint in-flight and buffered groups, and those drained for steps after
        ``rollout_id`` (see "What counts as trained" in the module doc); blocks only for the
        snapshot. Call it once the weights of ``rollout_id`` are saved.

        Raises :class:`trainer_hooks.CheckpointSaveError` when an earlier background save failed.
        """
        started = time.perf_counter()
        self.checkpointer._raise_failed(wait=False)
        dest = saved_checkpoint_path(self.args, rollout_id)
        # Everything journaled so far (consumption included) is durable before the trainer's
        # checkpoint of this step can be: one fsync, on the caller's thread (never the loop's).
        barrier_s = self.ledger.flush()
        checks: list[Callable[[], None]] = []
        with self._lock:
            pending_gids = list(self._in_flight)
            pending = list(self._in_flight.values())  # submission snapshots: immutable by contract
            # Buffered groups belong to the caller now and may be mutated: copy them (and the
            # queued resubmissions) while no group can move between the sets. Groups restored
            # from the journal and not decoded yet are immutable: the writer decodes them.
            pending_gids += [r.gid for r in self._resubmit]
            pending += snapshot_groups(
                [r.prompt for r in self._resubmit], where="pending_groups", deferred=checks
            )
            buffered = self.buffer.groups()
            plain = snapshot_groups(
                [g for g in buffered if not hasattr(g, "load_dicts")],
                where="completed_groups",
                deferred=checks,
            )
            it = iter(plain)
            completed = [g if hasattr(g, "load_dicts") else next(it) for g in buffered]
            held, steps = _snapshot_held(self._consumed, rollout_id, checks)
            completed[:0] = held
            extra = self.ledger.checkpoint_meta(
                pending_gids, [*steps, *self._buffer_gids], self._cursor(), consumed_steps=steps
            )
            released = self._released_step
        if released > rollout_id:
            logger.warning(
                "save(%d): the groups drained for step %d were released before this save (a driver "
                "drained more than two steps ahead of the step it saves): a resume from this checkpoint "
                "does not train them",
                rollout_id,
                released,
            )
        if steps:
            extra["consumed_after_checkpoint"] = len(steps)
        extra["save_telemetry"] = {
            "blocking_s": round(time.perf_counter() - started, 6),
            "journal_barrier_s": round(barrier_s, 6),
            "groups": len(pending) + len(completed),
        }
        return self.checkpointer.submit_snapshot(
            rollout_id, dest, pending, completed, checks, extra_meta=extra, on_commit=self.ledger.committed
        )

    def load(self, rollout_id: int, *, sample_cls: Any = None, verify_media: bool | None = None) -> None:
        """Resume at the trainer's restored step ``rollout_id``.

        Without the journal (``--rollout-journal-interval 0``): from
        ``<args.load>/rollout/fully_async_<rollout_id>``. With it: from the newest checkpoint at
        or before ``rollout_id`` plus the journal after it (groups consumed by steps after
        ``rollout_id`` come back; finished siblings of in-flight groups are kept). Pending
        groups are resubmitted before new prompts, completed groups go back into the buffer
        first, and the data source's cursor is restored (``load_state_dict``). Samples are built
        with ``sample_cls``, else the constructor's ``sample_cls``, else
        :func:`trainer_hooks.default_sample_cls` (Miles' class when ``miles`` imports). The
        rehydrated media are hashed unless ``verify_media`` (default ``--resume-verify-media``,
        on) is False. Refuses (:class:`trainer_hooks.IncompatibleResumeError`) a checkpoint
        written with another fingerprint (see ``--resume-accept-changes``)."""
        cls = sample_cls if sample_cls is not None else self.sample_cls
        state = self.ledger.recover(rollout_id, sample_cls=cls, verify_media=verify_media)
        with self._changed:
            self._resubmit.extendleft(reversed(state.pending))
            for gid, g in state.completed:
                self.buffer.put(g)
                self._buffer_gids.append(gid)
            load_state = getattr(self.data_source, "load_state_dict", None)
            # A dataset accepted as changed (--resume-accept-changes dataset) keeps its own cursor.
            if state.cursor is not None and callable(load_state) and "dataset" not in state.accepted:
                load_state(state.cursor)
            self._changed.notify_all()

    def flush(self) -> list[Location]:
        """Wait for background checkpoint saves; raise the first failure."""
        self.ledger.flush()
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
            try:
                self.checkpointer.close()
            finally:
                self.ledger.close()

    def __enter__(self) -> FullyAsyncRolloutFn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _snapshot_held(
    consumed: dict[int, tuple[int, Any]], rollout_id: int, checks: list[Callable[[], None]]
) -> tuple[list[Any], dict[int, int]]:
    """For :meth:`FullyAsyncRolloutFn.save`, under its lock: of the groups drained for training
    (``consumed``: group id -> (step, group)), those drained for steps after ``rollout_id``,
    snapshotted, and the step each was drained for (by group id). Drained for steps <=
    ``rollout_id``: in the weights saved now, forgotten (removed from ``consumed``). Drained for
    later steps: in no saved weights yet and not trained on yet (the contract), so snapshotted
    now and saved as completed, ahead of the buffered ones."""
    for gid in [gid for gid, (step, _) in consumed.items() if step <= rollout_id]:
        del consumed[gid]
    later = sorted(consumed.items(), key=lambda item: (item[1][0], item[0]))
    held = [group for _, (_, group) in later]
    it = iter(
        snapshot_groups(
            [g for g in held if not hasattr(g, "load_dicts")],
            where="consumed_groups",
            deferred=checks,
        )
    )
    snapshots = [g if hasattr(g, "load_dicts") else next(it) for g in held]
    return snapshots, {gid: step for gid, (step, _) in later}
