"""The Miles plugins: a data source, a data buffer and a fully-async rollout function that feed
one :class:`~trainer_hooks.rollout.RolloutState` and save it as one bundle.

Who reports which event (see the state's module docstring for the events themselves):

* :class:`BundledDataSource` (``--data-source-path``): ``handed_out`` in ``get_samples`` (under the
  state's lock, together with the cursor it advanced), ``recycled`` in ``add_samples``.
* :class:`BundledDataBuffer` (``--custom-async-data-buffer-path``): ``finished`` or ``dropped``
  after ``put`` (a kept group is the last entry of the buffer when Miles' ``put`` returns: nothing
  else runs on the event loop in between), ``consumed`` after ``get``, and ``dropped`` for the
  groups Miles' ``get`` discarded as stale under ``--async-unused-samples-handler drop``.
* :class:`FullyAsyncRolloutFn`: wraps a data source that is not a :class:`BundledDataSource` in a
  proxy reporting the same events, uses :class:`BundledDataBuffer` when no buffer path is given,
  and calls ``begin_step(rollout_id)`` before each drain.

Trade-off: the state is found through the ``args`` object that Miles hands to every plugin (a
registry keyed by its identity), not stored on ``args``: Miles ships ``args`` to Ray actors, and a
state holding locks and a writer thread cannot be pickled.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import os
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any

from miles.rollout.data_source import RolloutDataSourceWithBuffer
from miles.rollout.fully_async_data_buffer import (
    DataBufferConstructorInput,
    DataBufferInput,
    DefaultDataBuffer,
)
from miles.rollout.fully_async_rollout import FullyAsyncRolloutFn as _MilesFullyAsyncRolloutFn

from bundles import BundleNotFoundError, Location
from trainer_hooks.checkpoints import RolloutCheckpoint, list_rollout_checkpoints, read_rollout_checkpoint
from trainer_hooks.miles._settings import check_args
from trainer_hooks.rollout import RolloutLedger, RolloutState, materialize
from trainer_hooks.run_media import store_media

__all__ = ["BundledDataBuffer", "BundledDataSource", "FullyAsyncRolloutFn", "rollout_state"]

logger = logging.getLogger(__name__)

_STATES: dict[int, RolloutState] = {}
_STATES_LOCK = threading.Lock()

_CURSOR_FIELDS = ("sample_offset", "epoch_id", "sample_group_index", "sample_index")


def rollout_state(args: Any) -> RolloutState:
    """The run's :class:`RolloutState`: one per ``args`` object, shared by the plugins. The
    first call for an ``args`` checks this project's settings on it (:func:`check_args`)."""
    check_args(args)
    with _STATES_LOCK:
        state = _STATES.get(id(args))
        if state is None or state.args is not args:
            state = _STATES[id(args)] = RolloutState(args)
            # The rollout journal (--rollout-journal-interval, on by default with --save): every
            # event of the state is journaled, and a resume replays it after the checkpoint.
            ledger = RolloutLedger(args, store_image=lambda image, where: store_media(args, image))
            if ledger.enabled:
                ledger.attach(state)
        return state


def _recover(state: RolloutState, rollout_id: int, cursor_owner: Any, put_back: Any) -> Any:
    """Restore through the journal: the newest checkpoint at or before ``rollout_id`` plus the
    journal after it (:meth:`RolloutLedger.recover`). In-flight and recycled groups go back to
    the data source (``put_back(groups)``), completed ones to the buffer, with their group ids,
    and the cursor moves. Returns the :class:`RecoveredState`, or None when there is nothing to
    resume from."""
    ledger = state.ledger
    try:
        rec = ledger.recover(rollout_id)
    except BundleNotFoundError:
        return None
    where = rec.checkpoint or "the rollout journal"
    completed = [(gid, materialize(g)) for gid, g in rec.completed]  # Miles' buffer holds real groups
    with state.lock, ledger.quiet():  # all of this is in the checkpoint or the journal already
        state.reserve_gids(ledger.next_gid)
        if "dataset" not in rec.accepted:
            _restore_cursor(cursor_owner, rec.cursor, where)
        state.begin_step(rollout_id + 1)
        state.set_cursor(_cursor_of(cursor_owner))
        groups = [g.prompt for g in rec.pending]
        put_back(groups)
        state.recycled(groups, gids=[g.gid for g in rec.pending])
        state.restore_completed(
            ((_prompt_group_of(g), g) for _, g in completed), gids=[gid for gid, _ in completed]
        )
    logger.info(
        "restored %s and the journal after it: %d in-flight or recycled, %d completed group(s)",
        where,
        len(rec.pending),
        len(completed),
    )
    return rec


def _cursor_of(source: Any) -> dict[str, Any] | None:
    """Miles' data-source cursor (what ``global_dataset_state_dict_<N>.pt`` holds), or None for a
    data source without one."""
    if not all(isinstance(getattr(source, f, None), int) for f in _CURSOR_FIELDS):
        return None
    cursor: dict[str, Any] = {f: getattr(source, f) for f in _CURSOR_FIELDS}
    cursor["metadata"] = copy.deepcopy(getattr(source, "metadata", None) or {})
    return cursor


def _restore_cursor(source: Any, cursor: dict[str, Any] | None, where: os.PathLike[str] | str) -> None:
    if cursor is None or _cursor_of(source) is None:
        return
    for f in _CURSOR_FIELDS:
        value = cursor.get(f)
        if type(value) is not int or value < 0:
            raise ValueError(f"{where}: meta.data_source.{f}: expected an int >= 0, found {value!r}")
        setattr(source, f, value)
    source.metadata = dict(cursor.get("metadata") or {})
    args = source.args
    if getattr(args, "rollout_global_dataset", False) and getattr(args, "rollout_shuffle", False):
        source.dataset.shuffle(source.epoch_id)  # as Miles' own load does


def _prompt_group_of(group: list[Any]) -> list[Any]:
    """A resubmittable prompt group for a restored finished group (Miles recycles it when the
    group turns stale): shallow copies of its samples (``reset_for_retry`` reassigns fields);
    of a nested group, the first sample of each trajectory."""
    return [copy.copy(item[0] if type(item) is list else item) for item in group]


def _find_checkpoint(args: Any, rollout_id: int) -> bool:
    """Whether ``<--load>/rollout/fully_async_<rollout_id>`` is committed. Refuses to resume from
    nothing when other rollout checkpoints exist: the weights of ``rollout_id`` were saved, but
    its rollout state was not (a crash during the background write), and restarting the data at
    its beginning would train prompts twice."""
    found = list_rollout_checkpoints(args.load)
    if rollout_id in found:
        return True
    if found:
        raise FileNotFoundError(
            f"{args.load}/rollout/fully_async_{rollout_id}: no committed rollout checkpoint for rollout "
            f"{rollout_id}, but the directory holds those of rollouts {sorted(found)}; resume from one of "
            "them (--ckpt-step / the trainer's matching checkpoint) rather than restart the data"
        )
    return False


_NEEDS_OUR_BUFFER = (
    "--fully-async with --data-source-path trainer_hooks.miles.BundledDataSource also needs "
    "--custom-async-data-buffer-path trainer_hooks.miles.BundledDataBuffer: without it the "
    "finished groups are not seen and a resume would train them twice"
)


def _check_buffer_option(args: Any) -> None:
    """Refuse, when the data source is built, a ``--fully-async`` run whose buffer will not be a
    :class:`BundledDataBuffer`: Miles' rollout function (the one ``--fully-async`` selects) builds
    the buffer ``--custom-async-data-buffer-path`` names, or Miles' own without it, and
    :meth:`BundledDataSource.save` could not see the finished groups (it refuses then, but only at
    the first save, perhaps hours in). Only where Miles' parser has resolved the rollout function
    (``args.rollout_function_path``) and both paths load; this project's
    :class:`FullyAsyncRolloutFn` brings a :class:`BundledDataBuffer` itself without the option."""
    fn_path = getattr(args, "rollout_function_path", None)
    if not getattr(args, "fully_async", False) or not isinstance(fn_path, str):
        return
    from miles.utils.misc import load_function

    buffer_path = getattr(args, "custom_async_data_buffer_path", None)
    try:
        fn_cls = load_function(fn_path)
        buffer_cls = load_function(buffer_path) if buffer_path else None
    except Exception:  # Miles reports a path it cannot load when it loads it
        return
    if isinstance(fn_cls, type) and issubclass(fn_cls, FullyAsyncRolloutFn) and buffer_cls is None:
        return
    if isinstance(buffer_cls, type) and issubclass(buffer_cls, BundledDataBuffer):
        return
    found = f"it names {buffer_path}" if buffer_path else "it is not set"
    raise ValueError(f"{_NEEDS_OUR_BUFFER} ({found})")


class _SavesThroughState:
    """``flush``/``close`` of the two Miles plugins that save: both go through the run's one
    checkpointer and journal (``rollout_state``)."""

    rollout_state: Any

    def flush(self) -> list[Location]:
        if self.rollout_state.ledger is not None:
            self.rollout_state.ledger.flush()
        return self.rollout_state.checkpointer.flush()

    def close(self) -> None:
        """Wait for queued saves and the journal (``RolloutManager.dispose`` calls this)."""
        try:
            self.rollout_state.checkpointer.close()
        finally:
            if self.rollout_state.ledger is not None:
                self.rollout_state.ledger.close()


class BundledDataSource(_SavesThroughState, RolloutDataSourceWithBuffer):
    """Miles' ``RolloutDataSourceWithBuffer`` whose ``save``/``load`` write and read one bundle of
    the whole rollout state (``--data-source-path trainer_hooks.miles.BundledDataSource``)."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.rollout_state = rollout_state(args)
        _check_buffer_option(args)
        self.rollout_state.set_cursor(_cursor_of(self))

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        with self.rollout_state.lock:  # the cursor and the hand-out are one step for a save
            groups = super().get_samples(num_samples)
            self.rollout_state.handed_out(groups, _cursor_of(self))
        return groups

    def add_samples(self, samples: list[list[Any]]) -> None:
        with self.rollout_state.lock:
            super().add_samples(samples)
            if samples:
                self.rollout_state.recycled(samples)

    def save(self, rollout_id: int) -> Future[Location] | None:
        """Queue the bundle of ``rollout_id`` (written in the background; the state is cut now)."""
        if not self.args.rollout_global_dataset:
            return None
        state = self.rollout_state
        if getattr(self.args, "fully_async", False) and not state.buffer_attached:
            raise ValueError(_NEEDS_OUR_BUFFER)
        with state.lock:
            state.set_cursor(_cursor_of(self))
            return state.save(rollout_id, in_flight_is_consumed=not state.buffer_attached)

    def load(self, rollout_id: int | None = None) -> Any:
        if not self.args.rollout_global_dataset or self.args.load is None or rollout_id is None:
            return None
        state = self.rollout_state
        state.begin_step(rollout_id + 1)
        if state.ledger is not None:

            def put_back(groups: list[list[Any]]) -> None:
                self.buffer[:0] = groups

            rec = _recover(state, rollout_id, self, put_back)
            if rec is not None:
                return rec
        if rollout_id < 0 or not _find_checkpoint(self.args, rollout_id):
            super().load(rollout_id)  # Miles' own cursor file, for a run started without the plugin
            state.set_cursor(_cursor_of(self))
            return None
        ckpt = read_rollout_checkpoint(self.args, rollout_id)
        with state.lock:
            _restore_cursor(self, ckpt.data_source_state, ckpt.path)
            state.restored(ckpt)
            # In flight first (they were handed out before anything recycled since), then the
            # recycled ones, both ahead of new prompts; both are reset for retry.
            groups = ckpt.pending_groups + ckpt.recycled_groups
            self.buffer[:0] = groups
            state.recycled(groups)
            state.restore_completed((_prompt_group_of(g), g) for g in ckpt.completed_groups)
            state.set_cursor(_cursor_of(self))
        logger.info(
            "restored %s: %d in-flight, %d completed, %d recycled group(s)",
            ckpt.path,
            len(ckpt.pending_groups),
            len(ckpt.completed_groups),
            len(ckpt.recycled_groups),
        )
        return ckpt


class BundledDataBuffer(DefaultDataBuffer):
    """Miles' ``DefaultDataBuffer`` reporting every finished and consumed group, and starting with
    the completed groups of a restored checkpoint
    (``--custom-async-data-buffer-path trainer_hooks.miles.BundledDataBuffer``)."""

    def __init__(self, input: DataBufferConstructorInput) -> None:
        super().__init__(input)
        self.rollout_state = rollout_state(input.args)
        self.rollout_state.buffer_attached = True
        for prompt_group, group in self.rollout_state.take_restored_completed():
            self._buffer.append(DataBufferInput(prompt_group=prompt_group, group=group))

    async def put(self, input: DataBufferInput) -> None:
        await super().put(input)
        # Miles' put appends a kept group and returns without yielding to the loop in between.
        if self._buffer and self._buffer[-1] is input:
            self.rollout_state.finished(input.prompt_group, input.group)
        else:
            self.rollout_state.dropped(input.prompt_group)  # a no-op for a recycled group

    async def get(self, current_version: int | None = None, **context: Any) -> DataBufferInput:
        entry = await super().get(current_version=current_version, **context)
        state = self.rollout_state
        with state.lock:
            state.consumed(entry.prompt_group)
            state.retain_completed({id(e.prompt_group) for e in self._buffer})
        return entry


class _TrackedDataSource:
    """Any data source, reporting hand-outs and recycling to the state, serving restored groups
    first (for :class:`FullyAsyncRolloutFn` without :class:`BundledDataSource`)."""

    def __init__(self, inner: Any, state: RolloutState) -> None:
        self._inner = inner
        self._state = state
        self._restored: deque[list[Any]] = deque()

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        with self._state.lock:
            groups = [self._restored.popleft() for _ in range(min(num_samples, len(self._restored)))]
            if len(groups) < num_samples:
                groups += self._inner.get_samples(num_samples - len(groups))
            self._state.handed_out(groups, _cursor_of(self._inner))
        return groups

    def add_samples(self, samples: list[list[Any]]) -> None:
        with self._state.lock:
            self._inner.add_samples(samples)
            if samples:
                self._state.recycled(samples)

    def restore(self, groups: list[list[Any]]) -> None:
        self._restored.extendleft(reversed(groups))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FullyAsyncRolloutFn(_SavesThroughState, _MilesFullyAsyncRolloutFn):
    """Miles' ``FullyAsyncRolloutFn`` with ``save(rollout_id)`` / ``load(rollout_id)`` of one bundle.

    Construct it as Miles does (``FullyAsyncRolloutFn(RolloutFnConstructorInput(args, data_source))``);
    it behaves as Miles' class otherwise. Without ``--custom-async-data-buffer-path`` it uses
    :class:`BundledDataBuffer`; a custom buffer must subclass it for ``save`` to see finished groups.
    """

    def __init__(self, input: Any) -> None:
        state = rollout_state(input.args)
        if not isinstance(input.data_source, BundledDataSource):
            input = dataclasses.replace(input, data_source=_TrackedDataSource(input.data_source, state))
        super().__init__(input)
        self.rollout_state = state

    async def __call__(self, input: Any) -> Any:
        if not input.evaluation:
            if self._worker is None and self.args.custom_async_data_buffer_path is None:  # type: ignore[has-type]
                self._output = BundledDataBuffer(
                    DataBufferConstructorInput(args=self.args, unused_handler_fn=self._handle_unused)
                )
                self._worker = asyncio.create_task(self._worker_loop())
                logger.info("Started fully-async rollout worker (bundled checkpoints)")
            self.rollout_state.begin_step(input.rollout_id)
        return await super().__call__(input)

    def save(self, rollout_id: int) -> Future[Location] | None:
        """Queue the bundle of ``rollout_id`` at ``<--save>/rollout/fully_async_<rollout_id>``."""
        if isinstance(self.data_source, BundledDataSource):
            return self.data_source.save(rollout_id)
        state = self.rollout_state
        if self._output is not None and not isinstance(self._output, BundledDataBuffer):
            raise ValueError(
                f"--custom-async-data-buffer-path {self.args.custom_async_data_buffer_path}: "
                f"{type(self._output).__qualname__} is not a trainer_hooks.miles.BundledDataBuffer, so save() "
                "cannot see the finished groups; subclass BundledDataBuffer"
            )
        with state.lock:
            state.set_cursor(_cursor_of(self.data_source._inner))
            return state.save(rollout_id)

    def load(self, rollout_id: int | None = None) -> RolloutCheckpoint | None:
        """Restore ``<--load>/rollout/fully_async_<rollout_id>`` (call before the first train call)."""
        if isinstance(self.data_source, BundledDataSource):
            return self.data_source.load(rollout_id)
        if self.args.load is None or rollout_id is None:
            return None
        state = self.rollout_state
        state.begin_step(rollout_id + 1)
        if state.ledger is not None:
            rec = _recover(state, rollout_id, self.data_source._inner, self.data_source.restore)
            if rec is not None:
                return rec
        if rollout_id < 0 or not _find_checkpoint(self.args, rollout_id):
            return None
        ckpt = read_rollout_checkpoint(self.args, rollout_id)
        with state.lock:
            _restore_cursor(self.data_source._inner, ckpt.data_source_state, ckpt.path)
            state.restored(ckpt)
            groups = ckpt.pending_groups + ckpt.recycled_groups
            self.data_source.restore(groups)
            state.recycled(groups)
            state.restore_completed((_prompt_group_of(g), g) for g in ckpt.completed_groups)
        return ckpt
