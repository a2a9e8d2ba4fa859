"""Hooks for Miles/slime-style trainers: run media lifecycle, teardown order, parse-time checks.

* Run media: :func:`store_media` writes content-addressed, read-only files under
  ``<--shared-media-dir>/<--run-uuid>``; :func:`release_run_media` removes that directory as
  the last teardown step; :class:`RunLease` marks it as in use, so that
  ``rollout-bundle sweep`` can tell a crashed run's leftovers from a live run.
* Teardown: :class:`RunDisposer` and the reference drivers :func:`train` / :func:`train_async`.
* Arguments: :func:`add_arguments`, :func:`validate_args`, :func:`parse_args`, and
  :class:`RolloutEngineProcessorArgs`, which refuses engine groups that disagree on the image
  processor at launch.
* :class:`Sample`, :class:`AdapterRef`, :class:`RewardSpec`: at parity with Miles' ``miles.utils.types``.
* Bundled artifacts: :class:`FullyAsyncRolloutFn` (with ``save``/``load`` of rollout checkpoints,
  written in the background), :func:`save_rollout_checkpoint` / :func:`load_rollout_checkpoint`,
  :func:`save_debug_rollout_data` / :func:`load_debug_rollout_data`, and
  :func:`import_legacy_dump` for old ``torch.save`` dumps.
* Replay (:mod:`trainer_hooks.replay`): :func:`convert_samples_to_train_data` with the guard,
  :func:`compute_multimodal_train_inputs` / :func:`get_rollout_data` / :func:`training_dtype`
  (rebuild with cast), :func:`load_processor`, :func:`build_prefill_scoring_payload`,
  :func:`check_image_tokens`, :func:`replay_bundle` and ``rollout-bundle replay``.

The subpackages are the map of the work, each ``__init__`` its public surface (one line each,
those below importing only those above them, and :mod:`bundles`' public API):

* :mod:`trainer_hooks.run_media`: a run's media: store, lease, sweep, release, teardown order.
* :mod:`trainer_hooks.checkpoints`: rollout checkpoints as bundles: snapshot, writer, reader,
  retention, group layouts, fingerprint.
* :mod:`trainer_hooks.arguments`: Miles' options and ours, the engines' processor settings.
* :mod:`trainer_hooks.journal`: the rollout journal between checkpoints: writer, its local and
  store sinks, record kinds, scan, ``inspect`` on a journal.
* :mod:`trainer_hooks.dumps`: debug dumps, trajectory sidecar, legacy ``.pt`` import.
* :mod:`trainer_hooks.rollout`: the rollout state machines: :class:`RolloutLedger` (group ids,
  journal, recovery), ``RolloutState``, :class:`FullyAsyncRolloutFn`.
* :mod:`trainer_hooks.replay`: what training would see of a bundle, checked against it.
* :mod:`trainer_hooks.view`: one HTML page for a bundle (``rollout-bundle view``).
* :mod:`trainer_hooks.serve`: a run browser over every bundle under a root (``rollout-bundle serve``).
* :mod:`trainer_hooks.miles` (imported on its own; its plugins import Miles when first used):
  what a stock Miles run names on its command line (``--data-source-path``,
  ``--custom-async-data-buffer-path``, ``--custom-rollout-log-function-path``).

This module re-exports what users call; :mod:`trainer_hooks.cli` is ``rollout-bundle`` (each
package's commands, registered where they live). ``trainer_hooks`` imports :mod:`bundles`' public
API, never the reverse. Stand-in rollout manager and trainer objects for tests and demos live in
:mod:`trainer_hooks.testing`.
"""

from trainer_hooks._drivers import DriverReport, train, train_async
from trainer_hooks._sample import AdapterRef, RewardSpec, Sample, default_sample_cls
from trainer_hooks.arguments import (
    MILES_OPTIONS,
    OWN_OPTIONS,
    RolloutEngineProcessorArgs,
    add_arguments,
    parse_args,
    validate_args,
)
from trainer_hooks.checkpoints import (
    CheckpointSaveError,
    IncompatibleResumeError,
    RolloutCheckpoint,
    RolloutCheckpointer,
    SnapshotError,
    checkpoint_path,
    list_rollout_checkpoints,
    load_rollout_checkpoint,
    read_rollout_checkpoint,
    save_rollout_checkpoint,
)
from trainer_hooks.dumps import (
    DumpUploadError,
    LegacyDumpError,
    PickleRefusedError,
    flush_dump_uploads,
    import_legacy_dump,
    load_debug_rollout_data,
    save_debug_rollout_data,
    save_debug_trajectory_data,
)
from trainer_hooks.replay import (
    # Miles' private name for the same function, importable for drop-in parity, not in __all__.
    _build_prefill_scoring_payload as _build_prefill_scoring_payload,
)
from trainer_hooks.replay import (
    build_prefill_scoring_payload,
    check_image_tokens,
    compute_multimodal_train_inputs,
    convert_samples_to_train_data,
    get_rollout_data,
    load_processor,
    replay_bundle,
    training_dtype,
)
from trainer_hooks.rollout import (
    FullyAsyncRolloutFn,
    GroupBuffer,
    ListDataSource,
    RolloutLedger,
    RolloutWorkerError,
)
from trainer_hooks.run_media import (
    LEASE_NAME,
    RunDisposer,
    RunLease,
    RunMediaError,
    SweepEntry,
    UnsafeRunDirError,
    acquire_run_lease,
    check_run_id,
    parse_duration,
    read_lease,
    release_run_media,
    run_media_dir,
    store_media,
    sweep_run_media,
)

__all__ = [
    "LEASE_NAME",
    "MILES_OPTIONS",
    "OWN_OPTIONS",
    "AdapterRef",
    "CheckpointSaveError",
    "DriverReport",
    "DumpUploadError",
    "FullyAsyncRolloutFn",
    "GroupBuffer",
    "IncompatibleResumeError",
    "LegacyDumpError",
    "ListDataSource",
    "PickleRefusedError",
    "RewardSpec",
    "RolloutCheckpoint",
    "RolloutCheckpointer",
    "RolloutEngineProcessorArgs",
    "RolloutLedger",
    "RolloutWorkerError",
    "RunDisposer",
    "RunLease",
    "RunMediaError",
    "Sample",
    "SnapshotError",
    "SweepEntry",
    "UnsafeRunDirError",
    "acquire_run_lease",
    "add_arguments",
    "build_prefill_scoring_payload",
    "check_image_tokens",
    "check_run_id",
    "checkpoint_path",
    "compute_multimodal_train_inputs",
    "convert_samples_to_train_data",
    "default_sample_cls",
    "flush_dump_uploads",
    "get_rollout_data",
    "import_legacy_dump",
    "list_rollout_checkpoints",
    "load_debug_rollout_data",
    "load_processor",
    "load_rollout_checkpoint",
    "parse_args",
    "parse_duration",
    "read_lease",
    "read_rollout_checkpoint",
    "release_run_media",
    "replay_bundle",
    "run_media_dir",
    "save_debug_rollout_data",
    "save_debug_trajectory_data",
    "save_rollout_checkpoint",
    "store_media",
    "sweep_run_media",
    "train",
    "train_async",
    "training_dtype",
    "validate_args",
]
