"""Rollout checkpoints as bundles: snapshot now, write in the background, resume by rehydrating.

Layout and content
------------------
A checkpoint of rollout ``N`` is one bundle of kind ``"rollout_checkpoint"`` at
``<args.save>/rollout/fully_async_<N>`` (read back from ``<args.load>/rollout/…``). Its samples are
the flattened groups, pending groups first, then completed groups, each in order; the group
structure lives in the manifest's ``meta``::

    {"checkpoint_version": 1, "rollout_id": N, "run_uuid": "...", "training_dtype": "bf16",
     "processor": {...} | null, "pending_group_sizes": [4, 4], "completed_group_sizes": [4]}

Version 2 (written only when used): a group layout may be a list (a nested group,
``list[list[Sample]]``, see :mod:`._groups`), ``recycled_group_sizes`` lists groups waiting in the
data source's own buffer (stored after the completed ones), and ``data_source`` holds the data
source's cursor, so that one atomic bundle is the whole rollout state (:mod:`trainer_hooks.miles`).

``processor`` is ``args.rollout_processor_args.to_dict()`` (the engines' resolved processor
settings, see :mod:`trainer_hooks.arguments._processor`) or null when it was not resolved. The samples
stay plain sample dicts, so ``rollout-bundle inspect`` and a replay read a checkpoint like a dump.
Media are taken from ``run_media_dir(args)`` (any absolute path string under it, and every
``MediaRef``) with ``args.bundle_link_mode``; PIL images are stored as PNG media by the bundle
writer and come back as PIL images.

Modules, one concern each
-------------------------
* :mod:`._paths`: where checkpoints live and which are committed.
* :mod:`._writer`: the save protocol (:class:`RolloutCheckpointer`, background writer).
* :mod:`._retention`: ``--keep-rollout-checkpoints``.
* :mod:`._reader`: resume (rehydrating media into the current run).
* :mod:`._groups`: group layouts in the meta (flat and nested groups).
* :mod:`._state`: :class:`RolloutState`, every group's place between data source and training
  (the events the Miles plugins and the journal follow), saved as one cut.
* :mod:`._snapshot`: snapshots on the caller's thread (debug dumps use them too).
* :mod:`.journal`: the rollout journal, a package (append-only segments, background fsync or
  shipments to a store, scan; its writer, sinks and record kinds are used through its own face,
  ``trainer_hooks.checkpoints.journal``).
* :mod:`._ledger`: :class:`RolloutLedger`, group ids + journal + recovery, the one implementation
  behind :class:`FullyAsyncRolloutFn` and the Miles plugins.
* :mod:`._fingerprint`: what a resume must share with the run that saved (fail closed).
* :mod:`._fully_async`: :class:`FullyAsyncRolloutFn`, the fully-async rollout function whose
  ``save``/``load`` write and resume these checkpoints.
* Shared with debug dumps: :mod:`trainer_hooks._sample_bundle` (sample dicts to a bundle, and
  the run's meta).
"""

from trainer_hooks.checkpoints._fingerprint import (
    FINGERPRINT_FIELDS,
    IncompatibleResumeError,
    check_fingerprint,
    run_fingerprint,
)
from trainer_hooks.checkpoints._fully_async import (
    FullyAsyncRolloutFn,
    GroupBuffer,
    ListDataSource,
    RolloutWorkerError,
)
from trainer_hooks.checkpoints._ledger import (
    DEFAULT_JOURNAL_INTERVAL,
    LazyGroup,
    RecoveredGroup,
    RecoveredState,
    RolloutLedger,
    materialize,
)
from trainer_hooks.checkpoints._paths import (
    CHECKPOINT_KIND,
    CHECKPOINT_PREFIX,
    CHECKPOINT_SUBDIR,
    CHECKPOINT_VERSION,
    READABLE_CHECKPOINT_VERSIONS,
    checkpoint_path,
    list_rollout_checkpoints,
)
from trainer_hooks.checkpoints._reader import (
    RolloutCheckpoint,
    load_rollout_checkpoint,
    read_rollout_checkpoint,
)
from trainer_hooks.checkpoints._retention import apply_retention
from trainer_hooks.checkpoints._snapshot import SnapshotError, snapshot_groups, snapshot_value
from trainer_hooks.checkpoints._state import RolloutState, RolloutStateCut
from trainer_hooks.checkpoints._writer import (
    CheckpointSaveError,
    RolloutCheckpointer,
    save_rollout_checkpoint,
)
from trainer_hooks.checkpoints.journal import (
    JOURNAL_DIR,
    JournalCorruptError,
    JournalError,
    JournalRecord,
    JournalScan,
    journal_dir,
    scan_journal,
)

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_PREFIX",
    "CHECKPOINT_SUBDIR",
    "CHECKPOINT_VERSION",
    "DEFAULT_JOURNAL_INTERVAL",
    "FINGERPRINT_FIELDS",
    "JOURNAL_DIR",
    "READABLE_CHECKPOINT_VERSIONS",
    "CheckpointSaveError",
    "FullyAsyncRolloutFn",
    "GroupBuffer",
    "IncompatibleResumeError",
    "JournalCorruptError",
    "JournalError",
    "JournalRecord",
    "JournalScan",
    "LazyGroup",
    "ListDataSource",
    "RecoveredGroup",
    "RecoveredState",
    "RolloutCheckpoint",
    "RolloutCheckpointer",
    "RolloutLedger",
    "RolloutState",
    "RolloutStateCut",
    "RolloutWorkerError",
    "SnapshotError",
    "apply_retention",
    "check_fingerprint",
    "checkpoint_path",
    "journal_dir",
    "list_rollout_checkpoints",
    "load_rollout_checkpoint",
    "materialize",
    "read_rollout_checkpoint",
    "run_fingerprint",
    "save_rollout_checkpoint",
    "scan_journal",
    "snapshot_groups",
    "snapshot_value",
]
