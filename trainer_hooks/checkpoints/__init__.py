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
* :mod:`._snapshot`: snapshots on the caller's thread (the writer, the journal, the rollout state
  and debug dumps take them).
* :mod:`._fingerprint`: what a resume must share with the run that saved (fail closed).
* Shared with debug dumps: :mod:`trainer_hooks._sample_bundle` (sample dicts to a bundle, and
  the run's meta).

What moved out, and stays importable here
-----------------------------------------
The rollout state machines (:class:`RolloutLedger`, :class:`RolloutState`,
:class:`FullyAsyncRolloutFn`, ...) are :mod:`trainer_hooks.rollout`, and the rollout journal is
:mod:`trainer_hooks.journal`; both import this package, never the reverse. Their names that were
importable from here still are (:data:`MOVED`), each resolved from its new home the first time it
is asked for (:pep:`562`), so that no module of this package imports them; new code imports them
from their new home.
"""

from typing import Any

from trainer_hooks.checkpoints._fingerprint import (
    FINGERPRINT_FIELDS,
    IncompatibleResumeError,
    accepted_changes,
    check_fingerprint,
    run_fingerprint,
)
from trainer_hooks.checkpoints._moved import moved_name
from trainer_hooks.checkpoints._paths import (
    CHECKPOINT_KIND,
    CHECKPOINT_PREFIX,
    CHECKPOINT_SUBDIR,
    CHECKPOINT_VERSION,
    READABLE_CHECKPOINT_VERSIONS,
    checkpoint_path,
    list_rollout_checkpoints,
    saved_checkpoint_path,
)
from trainer_hooks.checkpoints._reader import (
    RolloutCheckpoint,
    load_rollout_checkpoint,
    read_rollout_checkpoint,
)
from trainer_hooks.checkpoints._retention import apply_retention
from trainer_hooks.checkpoints._snapshot import SnapshotError, sample_dict, snapshot_groups, snapshot_value
from trainer_hooks.checkpoints._writer import (
    CheckpointSaveError,
    RolloutCheckpointer,
    save_rollout_checkpoint,
)

#: The names that moved out of this package (issue 37), by the module that holds them now.
MOVED: dict[str, str] = {
    **dict.fromkeys(
        (
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
            "materialize",
        ),
        "trainer_hooks.rollout",
    ),
    **dict.fromkeys(
        (
            "JOURNAL_DIR",
            "JournalCorruptError",
            "JournalError",
            "JournalRecord",
            "JournalScan",
            "journal_dir",
            "scan_journal",
        ),
        "trainer_hooks.journal",
    ),
}


def __getattr__(name: str) -> Any:
    return moved_name(__name__, MOVED, globals(), name)


__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_PREFIX",
    "CHECKPOINT_SUBDIR",
    "CHECKPOINT_VERSION",
    "FINGERPRINT_FIELDS",
    "MOVED",
    "READABLE_CHECKPOINT_VERSIONS",
    "CheckpointSaveError",
    "IncompatibleResumeError",
    "RolloutCheckpoint",
    "RolloutCheckpointer",
    "SnapshotError",
    "accepted_changes",
    "apply_retention",
    "check_fingerprint",
    "checkpoint_path",
    "list_rollout_checkpoints",
    "load_rollout_checkpoint",
    "read_rollout_checkpoint",
    "run_fingerprint",
    "sample_dict",
    "save_rollout_checkpoint",
    "saved_checkpoint_path",
    "snapshot_groups",
    "snapshot_value",
    # the names that moved stay in ``import *`` too (resolved on first use by __getattr__)
    *MOVED,
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(MOVED))
