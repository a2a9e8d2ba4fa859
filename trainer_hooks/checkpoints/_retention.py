"""Retention of rollout checkpoints (``--keep-rollout-checkpoints K``).

After a checkpoint is committed, committed ``fully_async_<id>`` bundles beyond the K with the
highest rollout ids are deleted; the one just committed is never deleted. A failed save deletes
nothing. Deletion goes through :func:`bundles.remove_bundle` (rename aside, then remove), so a
crash during deletion never leaves a half-deleted bundle under a checkpoint's name.

On an object store (``--save s3://...``) the checkpoints share one content-addressed media pool
(``<save>/rollout/.media``): removing a checkpoint removes its pointer and shards, and the media
that no surviving checkpoint lists are then collected (:func:`bundles.collect_garbage`, with
:data:`POOL_GRACE_S`), so retention never deletes a file a surviving checkpoint needs.
"""

from __future__ import annotations

import logging
import os

from bundles import BundleNotFoundError, Location, remove_bundle
from bundles.support import fault_point
from trainer_hooks.checkpoints._paths import CHECKPOINT_SUBDIR, list_rollout_checkpoints

__all__ = ["apply_retention"]

logger = logging.getLogger(__name__)

#: Media of a store's shared pool younger than this are kept by retention even when no
#: checkpoint lists them (docs/FORMAT.md §9: a writer uploads media before it publishes).
POOL_GRACE_S = 15 * 60.0


def apply_retention(root: str | os.PathLike[str], keep: int | None, *, keep_id: int) -> list[Location]:
    """Delete committed checkpoints beyond the ``keep`` highest ids; never ``keep_id``. Returns
    the deleted paths. Call only after ``keep_id`` is committed."""
    if keep is None:
        return []
    if keep < 1:
        raise ValueError(f"--keep-rollout-checkpoints: expected at least 1, found {keep}")
    found = list_rollout_checkpoints(root)
    kept = set(sorted(found, reverse=True)[:keep]) | {keep_id}
    deleted = []
    for rid, path in found.items():
        if rid in kept:
            continue
        # remove_bundle renames first: a crash mid-removal leaves a hidden leftover that the next
        # bundle write sweeps, never a half-deleted bundle under a checkpoint's name.
        fault_point("retention.remove", path)
        try:
            remove_bundle(path)
        except BundleNotFoundError:
            continue  # removed concurrently
        deleted.append(path)
        logger.info("retention: removed rollout checkpoint %s (keeping %d)", path, keep)
    pool = Location.of(root).child(CHECKPOINT_SUBDIR)
    if deleted and pool.has_pool:  # in a directory, a bundle's media go with it (hard links)
        # The checkpoints share one media pool: what no surviving checkpoint lists goes now (the
        # grace period spares media another writer has uploaded but not yet published).
        report = pool.collect_garbage(older_than_s=POOL_GRACE_S)
        if report is not None:
            logger.info(
                "retention: %s: removed %d unreferenced media file(s), %d bytes",
                pool,
                len(report.media),
                report.bytes,
            )
    return deleted
