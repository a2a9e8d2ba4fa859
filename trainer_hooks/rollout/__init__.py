"""The rollout state machines: where every prompt group is, journaled, saved and recovered.

Between the data source and training a prompt group is handed out, generated, finished, trained
or recycled; this package follows it and makes a crash lose at most the last journal interval.
It stands on :mod:`trainer_hooks.checkpoints` (a checkpoint bundle written, read, fingerprinted)
and :mod:`trainer_hooks.journal` (the records between checkpoints), through their faces; neither
imports it. Modules, one job each:

* :mod:`._state`: :class:`RolloutState`, every group's place between data source and training
  (the events the Miles plugins call), saved as one cut (:class:`RolloutStateCut`).
* :mod:`._ledger`: :class:`RolloutLedger`, group ids, the journal, checkpoint watermarks, and the
  entry of a recovery; the one implementation behind :class:`FullyAsyncRolloutFn` and the Miles
  plugins.
* :mod:`._recovery`: a recovery's steps (the newest checkpoint at or before the restored step, the
  journal found, scanned, checked), :mod:`._replay` the groups it rebuilds record by record
  (:class:`RecoveredState`), :mod:`._meta` the checkpoint's meta fields it checks before use.
* :mod:`._lazy`: journal records made samples, media placed; completed groups kept encoded until
  training takes them (:class:`LazyGroup`, :func:`materialize`).
* :mod:`._fully_async`: :class:`FullyAsyncRolloutFn`, a fully-asynchronous rollout function
  (its worker, :class:`GroupBuffer`, :class:`ListDataSource`) whose ``save``/``load`` write and
  resume rollout checkpoints.

These names were importable from :mod:`trainer_hooks.checkpoints` before they moved here, and
still are (``trainer_hooks.checkpoints.MOVED``).
"""

from trainer_hooks.rollout._fully_async import (
    FullyAsyncRolloutFn,
    GroupBuffer,
    ListDataSource,
    RolloutWorkerError,
)
from trainer_hooks.rollout._lazy import LazyGroup, materialize
from trainer_hooks.rollout._ledger import DEFAULT_JOURNAL_INTERVAL, RolloutLedger, journal_interval
from trainer_hooks.rollout._replay import RecoveredGroup, RecoveredState
from trainer_hooks.rollout._state import RolloutState, RolloutStateCut

__all__ = [
    "DEFAULT_JOURNAL_INTERVAL",
    "FullyAsyncRolloutFn",
    "GroupBuffer",
    "LazyGroup",
    "ListDataSource",
    "RecoveredGroup",
    "RecoveredState",
    "RolloutLedger",
    "RolloutState",
    "RolloutStateCut",
    "RolloutWorkerError",
    "journal_interval",
    "materialize",
]
