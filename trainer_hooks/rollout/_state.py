"""The rollout state: every prompt group's place between the data source and training.

One :class:`RolloutState` per run follows each prompt group through five events, each a method
called by whoever sees it happen (the Miles plugins of :mod:`trainer_hooks.miles`: the data
source, the data buffer, the rollout function):

==================  =============================================  ==============================
event               who calls it, when                             the group moves
==================  =============================================  ==============================
``handed_out``      data source ``get_samples``, after its cursor  new / recycled -> in flight
                    advanced (the cursor given is the one *after*)
``finished``        data buffer ``put``, the group kept            in flight -> completed
``dropped``         data buffer, a finished group not kept         in flight / completed -> gone
                    (aborted with ``drop``, filtered, stale)
``consumed``        data buffer ``get``, the group handed to       completed -> consumed at step S
                    training
``recycled``        data source ``add_samples``                    in flight / completed -> recycled
==================  =============================================  ==============================

A group is known by the identity of its *prompt group* (the list the data source handed out;
Miles passes that very list back as ``DataBufferInput.prompt_group``), and numbered by a
sequence id (``gid``, in hand-out order) that listeners can log. Snapshots
(:func:`trainer_hooks.checkpoints.snapshot_groups`) are taken at the event, on the caller's
thread: an in-flight group as it was handed out (before generation mutates it in place), a
completed one as it was put (before training mutates loss masks or ``remove_sample``), a
recycled one after its reset. A save therefore only collects snapshots: O(groups) under the lock.

Consumption by step: Miles' rollout function drains exactly ``rollout_batch_size`` groups per
step, in order, so the k-th group consumed since :meth:`begin_step` (or since the state was
created, starting at the step after the restored checkpoint, or ``--start-rollout-id``) belongs
to step ``first_step + k // rollout_batch_size``. ``save(N)`` is called after step N's weights
are saved: groups consumed for steps <= N are in those weights and forgotten; groups consumed for
later steps (the asynchronous driver drains step N+1 while step N trains) are saved as
*completed*, ahead of the buffered ones, because the weights they went into do not survive a
crash. That is "exactly once in the lineage of the restored weights".

Consistency: every event and :meth:`save` run under one re-entrant lock (``state.lock``). Miles'
rollout worker calls the events on its event loop thread while ``RolloutManager.save`` runs on
the actor's thread; the data source advances its cursor under the same lock, so a checkpoint's
cursor, in-flight, completed, consumed and recycled groups are always one consistent cut.

Journal hook: :meth:`add_listener` registers ``fn(event, **payload)``, called under the lock
right after each transition (on the caller's thread; keep it cheap: enqueue, never write).
Payloads: ``handed_out(gids, snapshots, cursor)``, ``finished(gid, snapshot)``, ``dropped(gid)``,
``consumed(gid, step)``, ``recycled(gids, snapshots)``, ``saved(rollout_id, future)``,
``restored(checkpoint)``.
"""

from __future__ import annotations

import threading
from argparse import Namespace
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from bundles import Location
from trainer_hooks.checkpoints import (
    RolloutCheckpoint,
    RolloutCheckpointer,
    saved_checkpoint_path,
    snapshot_groups,
)

__all__ = ["RolloutState", "RolloutStateCut"]

Listener = Callable[..., None]


@dataclass
class _Record:
    gid: int
    prompt_group: Any  # the live list (kept so that its id() is not reused while tracked)
    snapshot: list[Any]  # the snapshotted group (prompt as handed out, or the finished group)
    step: int | None = None  # the step a consumed group went into


@dataclass
class RolloutStateCut:
    """What a save writes: one consistent cut of the state (snapshots, never live samples)."""

    pending: list[list[Any]] = field(default_factory=list)
    completed: list[list[Any]] = field(default_factory=list)
    recycled: list[list[Any]] = field(default_factory=list)
    cursor: dict[str, Any] | None = None
    consumed_after: dict[int, int] = field(default_factory=dict)  # gid -> step, for steps > N
    pending_gids: list[int] = field(default_factory=list)
    completed_gids: list[int] = field(default_factory=list)
    recycled_gids: list[int] = field(default_factory=list)


class RolloutState:
    """See the module docstring. Thread-safe; all methods take ``self.lock``."""

    def __init__(self, args: Namespace, checkpointer: RolloutCheckpointer | None = None) -> None:
        self.args = args
        self.lock = threading.RLock()
        self.checkpointer = checkpointer if checkpointer is not None else RolloutCheckpointer(args)
        self._next_gid = 0
        #: The rollout journal (:class:`~trainer_hooks.rollout.RolloutLedger`, attached with
        #: ``ledger.attach(state)``): ``save`` then makes the journal durable first, records its
        #: watermark in the bundle and compacts it once the bundle commits.
        self.ledger: Any = None
        self._in_flight: dict[int, _Record] = {}
        self._completed: dict[int, _Record] = {}
        self._consumed: dict[int, _Record] = {}
        self._recycled: dict[int, _Record] = {}
        self._listeners: list[Listener] = []
        self._cursor: dict[str, Any] | None = None
        start = getattr(args, "start_rollout_id", None)
        self._first_step = start if isinstance(start, int) else 0
        self._consumed_count = 0
        #: Set by the data buffer plugin: without one, finished groups are never seen.
        self.buffer_attached = False
        # (prompt_group, group) restored as completed, waiting for the data buffer to take them.
        self._restored_completed: list[tuple[list[Any], list[Any]]] = []

    def _gid(self, given: int | None = None) -> int:
        """A new group id, or ``given`` (a group put back by a resume keeps its id)."""
        if given is None:
            given = self._next_gid
        self._next_gid = max(self._next_gid, given + 1)
        return given

    def reserve_gids(self, next_gid: int) -> None:
        """New groups get ids from ``next_gid`` on (a resume continues the journal's numbering)."""
        with self.lock:
            self._next_gid = max(self._next_gid, next_gid)

    # -- listeners --------------------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        with self.lock:
            self._listeners.append(fn)

    def _emit(self, event: str, **payload: Any) -> None:
        for fn in self._listeners:
            fn(event, **payload)

    # -- events -----------------------------------------------------------------------------------
    def handed_out(self, groups: Iterable[list[Any]], cursor: dict[str, Any] | None = None) -> list[int]:
        """``groups`` left the data source (as these very lists); ``cursor`` is its position now."""
        groups = list(groups)
        with self.lock:
            snaps = snapshot_groups(groups, where="handed_out")
            gids = []
            for group, snap in zip(groups, snaps, strict=True):
                rec = self._recycled.pop(id(group), None)
                gid = rec.gid if rec is not None else self._gid()
                self._in_flight[id(group)] = _Record(gid, group, snap)
                gids.append(gid)
            if cursor is not None:
                self._cursor = cursor
            self._emit("handed_out", gids=gids, snapshots=snaps, cursor=cursor)
            return gids

    def finished(self, prompt_group: list[Any], group: list[Any], gid: int | None = None) -> None:
        """A finished ``group`` (of ``prompt_group``) was kept by the buffer."""
        (snap,) = snapshot_groups([group], where="finished")
        with self.lock:
            rec = self._in_flight.pop(id(prompt_group), None)
            gid = rec.gid if rec is not None else self._gid(gid)
            self._completed[id(prompt_group)] = _Record(gid, prompt_group, snap)
            self._emit("finished", gid=gid, snapshot=snap)

    def dropped(self, prompt_group: list[Any]) -> None:
        """A finished group was not kept (and not recycled): it will not be trained or retried."""
        with self.lock:
            rec = self._in_flight.pop(id(prompt_group), None) or self._completed.pop(id(prompt_group), None)
            if rec is not None:
                self._emit("dropped", gid=rec.gid)

    def consumed(self, prompt_group: list[Any]) -> int:
        """The group went to training; returns the step it belongs to (see the module docstring)."""
        with self.lock:
            step = self._first_step + self._consumed_count // max(1, int(self.args.rollout_batch_size))
            self._consumed_count += 1
            rec = self._completed.pop(id(prompt_group), None)
            if rec is not None:
                rec.step = step
                self._consumed[id(prompt_group)] = rec
                self._emit("consumed", gid=rec.gid, step=step)
            return step

    def retain_completed(self, alive: set[int]) -> None:
        """Drop the completed groups whose prompt group's id is not in ``alive`` (a buffer that
        discards groups without telling, e.g. stale ones under ``drop``, reports what it holds)."""
        with self.lock:
            for key in [k for k in self._completed if k not in alive]:
                self._emit("dropped", gid=self._completed.pop(key).gid)

    def recycled(self, groups: Iterable[list[Any]], gids: list[int] | None = None) -> None:
        """``groups`` (reset for retry) went back into the data source's own buffer; ``gids``:
        their ids, for groups put back by a resume."""
        groups = list(groups)
        given = list(gids) if gids is not None else [None] * len(groups)
        with self.lock:
            snaps = snapshot_groups(groups, where="recycled")
            gids = []
            for group, snap, g in zip(groups, snaps, given, strict=True):
                rec = self._in_flight.pop(id(group), None) or self._completed.pop(id(group), None)
                gid = rec.gid if rec is not None else self._gid(g)
                self._recycled[id(group)] = _Record(gid, group, snap)
                gids.append(gid)
            self._emit("recycled", gids=gids, snapshots=snaps)

    def begin_step(self, step: int) -> None:
        """Groups consumed from now on belong to ``step`` onwards (a rollout function that knows
        its ``rollout_id`` calls this before draining)."""
        with self.lock:
            self._first_step, self._consumed_count = step, 0

    def set_cursor(self, cursor: dict[str, Any] | None) -> None:
        with self.lock:
            self._cursor = cursor

    # -- save / restore ---------------------------------------------------------------------------
    def cut(self, rollout_id: int, *, in_flight_is_consumed: bool = False) -> RolloutStateCut:
        """The consistent cut a save of ``rollout_id`` writes; forgets groups consumed for steps
        <= ``rollout_id``. ``in_flight_is_consumed``: a synchronous rollout (no data buffer)
        trains every group it handed out before the save, so none is in flight."""
        with self.lock:
            if in_flight_is_consumed:
                self._in_flight.clear()
            for key in [k for k, r in self._consumed.items() if r.step is not None and r.step <= rollout_id]:
                del self._consumed[key]
            later = sorted(self._consumed.values(), key=lambda r: (r.step, r.gid))
            return RolloutStateCut(
                pending=[r.snapshot for r in self._in_flight.values()],
                completed=[r.snapshot for r in later] + [r.snapshot for r in self._completed.values()],
                recycled=[r.snapshot for r in self._recycled.values()],
                cursor=None if self._cursor is None else dict(self._cursor),
                consumed_after={r.gid: r.step for r in later if r.step is not None},
                pending_gids=[r.gid for r in self._in_flight.values()],
                completed_gids=[r.gid for r in later] + [r.gid for r in self._completed.values()],
                recycled_gids=[r.gid for r in self._recycled.values()],
            )

    def save(self, rollout_id: int, *, in_flight_is_consumed: bool = False) -> Future[Location]:
        """Queue one atomic ``rollout_checkpoint`` bundle of the cut (see :meth:`cut`) on the
        background checkpointer; returns the future of the committed path."""
        dest = saved_checkpoint_path(self.args, rollout_id)
        ledger = self.ledger
        # The journal is durable up to now before the trainer's checkpoint of this step can be.
        barrier_s = ledger.flush() if ledger is not None else 0.0
        with self.lock:
            self.checkpointer._raise_failed(wait=False)
            c = self.cut(rollout_id, in_flight_is_consumed=in_flight_is_consumed)
            meta: dict[str, Any] = {"data_source": c.cursor} if c.cursor is not None else {}
            if c.consumed_after:
                meta["consumed_after_checkpoint"] = len(c.consumed_after)
            on_commit = None
            if ledger is not None:
                meta.update(
                    ledger.checkpoint_meta(
                        c.pending_gids,
                        c.completed_gids,
                        c.cursor,
                        c.recycled_gids,
                        consumed_steps=c.consumed_after,
                    )
                )
                meta["save_telemetry"] = {"journal_barrier_s": round(barrier_s, 6)}
                on_commit = ledger.committed
            fut = self.checkpointer.submit_snapshot(
                rollout_id,
                dest,
                c.pending,
                c.completed,
                recycled=c.recycled,
                extra_meta=meta,
                on_commit=on_commit,
            )
            self._emit("saved", rollout_id=rollout_id, future=fut)
            return fut

    def restored(self, checkpoint: RolloutCheckpoint) -> None:
        """Start counting consumption at the step after ``checkpoint`` (groups put back by the
        plugins are re-announced through the events as they re-enter)."""
        with self.lock:
            self._first_step, self._consumed_count = checkpoint.rollout_id + 1, 0
            self._cursor = checkpoint.data_source_state
            self._emit("restored", checkpoint=checkpoint)

    def restore_completed(
        self, entries: Iterable[tuple[list[Any], list[Any]]], gids: list[int] | None = None
    ) -> None:
        """Completed groups read from a checkpoint, as ``(prompt_group, group)``: tracked as
        completed now, handed to the data buffer by :meth:`take_restored_completed`."""
        entries = list(entries)
        given = list(gids) if gids is not None else [None] * len(entries)
        for (prompt_group, group), gid in zip(entries, given, strict=True):
            self.finished(prompt_group, group, gid)
        with self.lock:
            self._restored_completed.extend(entries)

    def take_restored_completed(self) -> list[tuple[list[Any], list[Any]]]:
        with self.lock:
            out, self._restored_completed = self._restored_completed, []
            return out

    def counts(self) -> dict[str, int]:
        """Groups in each place (for logs, metrics and tests)."""
        with self.lock:
            return {
                "in_flight": len(self._in_flight),
                "completed": len(self._completed),
                "consumed_unsaved": len(self._consumed),
                "recycled": len(self._recycled),
            }
