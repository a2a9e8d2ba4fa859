"""A run's media, from the first screenshot to teardown.

Audience: trainer code and the other ``trainer_hooks`` subpackages. One concern per module:

* :mod:`._store`: the per-run directory ``<shared_media_dir>/<run_uuid>``: :func:`store_media`
  writes content-addressed, read-only files; :func:`release_run_media` deletes the directory.
* :mod:`._lease`: :class:`RunLease` marks a run directory as in use; :func:`sweep_run_media`
  removes crashed runs' leftovers (``rollout-bundle sweep``, :mod:`._sweep_cli`).
* :mod:`._disposer`: :class:`RunDisposer`, the teardown order (checkpoints and dumps flushed
  before the media they link are released).

The reference drivers that follow this order, :func:`trainer_hooks.train` /
:func:`trainer_hooks.train_async`, compose run media with checkpoints and dumps, so they live
above the subpackages, in :mod:`trainer_hooks._drivers`.
"""

from trainer_hooks.run_media._disposer import RunDisposer
from trainer_hooks.run_media._lease import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_SWEEP_OLDER_THAN_S,
    LEASE_NAME,
    RunLease,
    SweepEntry,
    acquire_run_lease,
    format_duration,
    parse_duration,
    read_lease,
    sweep_run_media,
)
from trainer_hooks.run_media._store import (
    RunMediaError,
    UnsafeRunDirError,
    check_run_id,
    ensure_run_dir,
    release_run_media,
    run_media_dir,
    store_media,
)
from trainer_hooks.run_media._sweep_cli import register as register_commands

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "DEFAULT_SWEEP_OLDER_THAN_S",
    "LEASE_NAME",
    "RunDisposer",
    "RunLease",
    "RunMediaError",
    "SweepEntry",
    "UnsafeRunDirError",
    "acquire_run_lease",
    "check_run_id",
    "ensure_run_dir",
    "format_duration",
    "parse_duration",
    "read_lease",
    "register_commands",
    "release_run_media",
    "run_media_dir",
    "store_media",
    "sweep_run_media",
]
