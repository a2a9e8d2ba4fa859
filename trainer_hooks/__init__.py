"""Hooks for Miles/slime-style trainers: run media lifecycle, teardown order, parse-time checks.

* Run media: :func:`store_media` writes content-addressed, read-only files under
  ``<--shared-media-dir>/<--run-uuid>``; :func:`release_run_media` removes that directory as
  the last teardown step; :class:`RunLease` marks it as in use, so that
  ``rollout-bundle sweep`` can tell a crashed run's leftovers from a live run.
* Teardown: :class:`RunDisposer` and the reference drivers :func:`train` / :func:`train_async`.
* Arguments: :func:`add_arguments`, :func:`validate_args`, :func:`parse_args`, and
  :class:`RolloutEngineProcessorArgs`, which refuses engine groups that disagree on the image
  processor at launch.
* :class:`Sample`, compatible with Miles' ``Sample``.

``trainer_hooks`` imports :mod:`bundles`, never the reverse. Stand-in rollout manager and
trainer objects for tests and demos live in :mod:`trainer_hooks.testing`.
"""

from trainer_hooks._args import add_arguments, parse_args, validate_args
from trainer_hooks._disposer import RunDisposer
from trainer_hooks._drivers import DriverReport, train, train_async
from trainer_hooks._lease import (
    LEASE_NAME,
    RunLease,
    SweepEntry,
    acquire_run_lease,
    parse_duration,
    read_lease,
    sweep_run_media,
)
from trainer_hooks._processor_args import RolloutEngineProcessorArgs
from trainer_hooks._run_media import (
    RunMediaError,
    UnsafeRunDirError,
    check_run_id,
    release_run_media,
    run_media_dir,
    store_media,
)
from trainer_hooks._sample import Sample

__all__ = [
    "LEASE_NAME",
    "DriverReport",
    "RolloutEngineProcessorArgs",
    "RunDisposer",
    "RunLease",
    "RunMediaError",
    "Sample",
    "SweepEntry",
    "UnsafeRunDirError",
    "acquire_run_lease",
    "add_arguments",
    "check_run_id",
    "parse_args",
    "parse_duration",
    "read_lease",
    "release_run_media",
    "run_media_dir",
    "store_media",
    "sweep_run_media",
    "train",
    "train_async",
    "validate_args",
]
