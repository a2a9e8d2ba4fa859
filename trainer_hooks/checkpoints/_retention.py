"""Retention of rollout checkpoints (``--keep-rollout-checkpoints K``).

After a checkpoint is committed, committed ``fully_async_<id>`` bundles beyond the K with the
highest rollout ids are deleted; the one just committed is never deleted. A failed save deletes
nothing. Deletion goes through :func:`bundles.remove_bundle` (rename aside, then remove), so a
crash during deletion never leaves a half-deleted bundle under a checkpoint's name.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from bundles import BundleNotFoundError, remove_bundle
from bundles.support import fault_point
from trainer_hooks.checkpoints._paths import list_rollout_checkpoints

__all__ = ["apply_retention"]

logger = logging.getLogger(__name__)


def apply_retention(root: str | os.PathLike[str], keep: int | None, *, keep_id: int) -> list[Path]:
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
    return deleted
