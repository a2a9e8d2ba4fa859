"""Reference training drivers, ``train`` and ``train_async``, shaped like Miles' train.py and
train_async.py, with a fixed teardown order.

Both build everything inside a :class:`RunDisposer` and register, in this order::

    1. release_run_media        (runs last)
    2. close_run_lease
    3. flush_pending_writes     rollout_manager.close() (else .flush()), if the manager has one
    4. dispose_rollout_manager  rollout_manager.dispose()
    5. close_<role>             trainer.close(), for the actor then the critic, if present
    6. shutdown_rollout_thread  (train_async only) waits for the in-flight generate() to end

so teardown runs 6 → 1: the in-flight rollout stops writing media, trainers stop reading it,
the rollout executor shuts down (its dispose may still read the media), pending bundle writes
are flushed (a bundle writer takes media out of the run directory), the lease ends, and only
then is the run directory removed. This holds when the loop raises, too.

The flush slot is the extension point for pending bundle writes: a rollout manager that
writes bundles in the background exposes ``flush()`` that blocks until they are on disk.

The drivers take factories (``args -> object``) for the rollout manager and trainers; by
default the stand-ins of :mod:`trainer_hooks.testing`. The objects need:

* rollout manager: ``generate(rollout_id) -> data``, ``save(rollout_id)``, ``dispose()``,
  optionally ``flush()``;
* trainer: ``train(rollout_id, data)``, ``save_model(rollout_id)``, ``update_weights()``,
  optionally ``close()``.

Ray is not used: ``train_async`` overlaps the generation of step n+1 with training of step n
on a one-thread executor, where Miles uses ``rollout_manager.generate.remote``.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trainer_hooks.dumps import flush_dump_uploads
from trainer_hooks.run_media import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    RunDisposer,
    acquire_run_lease,
    release_run_media,
)

__all__ = ["DriverReport", "train", "train_async"]

Factory = Callable[[Namespace], Any]


@dataclass
class DriverReport:
    """What a driver run did: the rollout ids trained, the media bytes freed at teardown and
    the teardown steps in the order they ran."""

    trained_rollout_ids: list[int] = field(default_factory=list)
    media_bytes_freed: int | None = None
    teardown: list[str] = field(default_factory=list)


def _default_factories() -> tuple[Factory, Factory]:
    from trainer_hooks.testing import StandInRolloutManager, StandInTrainer

    return StandInRolloutManager, StandInTrainer


def _should_save(args: Namespace, rollout_id: int) -> bool:
    # Miles' should_run_periodic_action: every save_interval steps and at the last step.
    interval = getattr(args, "save_interval", None)
    if getattr(args, "save", None) is None or interval is None:
        return False
    return (rollout_id + 1) % interval == 0 or rollout_id + 1 == args.num_rollout


def _save(args: Namespace, rollout_id: int, actor: Any, critic: Any, rollout_manager: Any) -> None:
    # Miles' order: actor, critic, then the rollout manager's dataset state.
    actor.save_model(rollout_id)
    if critic is not None:
        critic.save_model(rollout_id)
    rollout_manager.save(rollout_id)


@dataclass
class _Run:
    """One driver run, set up by :func:`_setup`: what a driver's loop steps through."""

    args: Namespace
    disposer: RunDisposer
    report: DriverReport
    rollout_manager: Any
    actor: Any
    critic: Any

    def train_step(self, rollout_id: int, data: Any) -> None:
        """Train on one step's rollout (the critic first, as in Miles), record it, and save when due."""
        if self.critic is not None:
            self.critic.train(rollout_id, data)
        self.actor.train(rollout_id, data)
        self.report.trained_rollout_ids.append(rollout_id)
        if _should_save(self.args, rollout_id):
            _save(self.args, rollout_id, self.actor, self.critic, self.rollout_manager)


def _setup(
    args: Namespace,
    disposer: RunDisposer,
    report: DriverReport,
    create_rollout_manager: Factory | None,
    create_actor: Factory | None,
    create_critic: Factory | None,
    lease_interval: float,
) -> _Run:
    default_manager, default_trainer = _default_factories()

    def release() -> None:
        report.media_bytes_freed = release_run_media(args)

    # Registered first so that it runs last (see the module docstring for the full order), and
    # only once the lease is ours: a run refused its lease (another run holds it) releases nothing.
    lease = acquire_run_lease(args, interval=lease_interval)
    disposer.callback(release, name="release_run_media")
    if lease is not None:
        disposer.callback(lease.close, name="close_run_lease")

    rollout_manager = (create_rollout_manager or default_manager)(args)
    disposer.callback(_flush, rollout_manager, name="flush_pending_writes")
    disposer.callback(rollout_manager.dispose, name="dispose_rollout_manager")

    actor = (create_actor or default_trainer)(args)
    _register_close(disposer, actor, "actor")
    critic = create_critic(args) if create_critic is not None else None
    if critic is not None:
        _register_close(disposer, critic, "critic")
    return _Run(args, disposer, report, rollout_manager, actor, critic)


def _flush(rollout_manager: Any) -> None:
    # close() when there is one: it flushes and also stops the writer thread, which a process
    # that runs several trainings would otherwise keep one of per run.
    finish = getattr(rollout_manager, "close", None) or getattr(rollout_manager, "flush", None)
    try:
        if finish is not None:
            finish()
    finally:
        flush_dump_uploads()  # dumps to an object store upload in the background


def _register_close(disposer: RunDisposer, trainer: Any, role: str) -> None:
    close = getattr(trainer, "close", None)
    if close is not None:
        disposer.callback(close, name=f"close_{role}")


def _steps(args: Namespace) -> tuple[int, int]:
    """``(start, stop)`` rollout ids. ``--num-rollout`` defaults to None as in Miles, which derives
    it from the dataset; the reference drivers have no dataset size and need it given."""
    stop = getattr(args, "num_rollout", None)
    if stop is None:
        raise ValueError(
            "--num-rollout is not set: the reference drivers need the number of rollout steps "
            "(Miles derives it from the dataset size; give it explicitly here)"
        )
    return getattr(args, "start_rollout_id", None) or 0, stop


def train(
    args: Namespace,
    *,
    create_rollout_manager: Factory | None = None,
    create_actor: Factory | None = None,
    create_critic: Factory | None = None,
    disposer: RunDisposer | None = None,
    lease_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S,
) -> DriverReport:
    """Synchronous driver: generate step n, train on it, save, update weights; then teardown.

    ``disposer``, if given, must be empty; passing one lets a caller read its ``history``
    even when the driver raises.
    """
    return _drive(
        _sync_steps, args, create_rollout_manager, create_actor, create_critic, disposer, lease_interval
    )


def _sync_steps(run: _Run, start: int, stop: int) -> None:
    run.actor.update_weights()
    for rollout_id in range(start, stop):
        run.train_step(rollout_id, run.rollout_manager.generate(rollout_id))
        run.actor.update_weights()


def train_async(
    args: Namespace,
    *,
    create_rollout_manager: Factory | None = None,
    create_actor: Factory | None = None,
    create_critic: Factory | None = None,
    disposer: RunDisposer | None = None,
    lease_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S,
) -> DriverReport:
    """One-step off-policy driver: the rollout of step n+1 runs while step n trains.

    As in Miles' train_async.py, weights are updated every ``update_weights_interval`` steps,
    after waiting for the in-flight rollout (engines can't take new weights mid-generation).
    """
    return _drive(
        _async_steps, args, create_rollout_manager, create_actor, create_critic, disposer, lease_interval
    )


def _async_steps(run: _Run, start: int, stop: int) -> None:
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
    # Wait for (never abandon) an in-flight generate: it may still be storing media, and
    # the run directory must not be released under it.
    run.disposer.callback(pool.shutdown, wait=True, cancel_futures=True, name="shutdown_rollout_thread")
    run.actor.update_weights()
    update_interval = getattr(run.args, "update_weights_interval", 1) or 1
    next_future: Future[Any] | None = (
        pool.submit(run.rollout_manager.generate, start) if start < stop else None
    )
    current: Any = None
    for rollout_id in range(start, stop):
        if next_future is not None:
            current = next_future.result()
            next_future = None
        if rollout_id + 1 < stop:
            next_future = pool.submit(run.rollout_manager.generate, rollout_id + 1)
        run.train_step(rollout_id, current)
        if (rollout_id + 1) % update_interval == 0:
            if next_future is not None:
                current = next_future.result()
                next_future = None
            run.actor.update_weights()


def _drive(
    steps: Callable[[_Run, int, int], None],
    args: Namespace,
    create_rollout_manager: Factory | None,
    create_actor: Factory | None,
    create_critic: Factory | None,
    disposer: RunDisposer | None,
    lease_interval: float,
) -> DriverReport:
    """What both drivers share: set up inside the disposer (the order of the module docstring),
    run ``steps`` from ``--start-rollout-id`` to ``--num-rollout``, tear down, and report the
    teardown also when a step raises."""
    start, stop = _steps(args)
    report = DriverReport()
    disposer = _fresh(disposer)
    try:
        with disposer:
            run = _setup(
                args, disposer, report, create_rollout_manager, create_actor, create_critic, lease_interval
            )
            steps(run, start, stop)
    finally:
        report.teardown = list(disposer.history)
    return report


def _fresh(disposer: RunDisposer | None) -> RunDisposer:
    if disposer is None:
        return RunDisposer()
    if disposer.names or disposer.history:
        raise ValueError(
            f"driver: the disposer passed in must be empty (release_run_media must be its first entry), "
            f"found {disposer.names or disposer.history}"
        )
    return disposer
