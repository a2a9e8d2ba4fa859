"""Where rollout checkpoints live: ``<root>/rollout/fully_async_<N>``, and which are committed."""

from __future__ import annotations

import os
import re
from argparse import Namespace
from pathlib import Path
from typing import Any

from bundles import StoreURL, is_bundle, is_store_url, list_remote_bundles

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_PREFIX",
    "CHECKPOINT_SUBDIR",
    "CHECKPOINT_VERSION",
    "READABLE_CHECKPOINT_VERSIONS",
    "checkpoint_path",
    "list_rollout_checkpoints",
]

CHECKPOINT_KIND = "rollout_checkpoint"
CHECKPOINT_PREFIX = "fully_async_"
CHECKPOINT_SUBDIR = "rollout"
#: Version 2 adds nested group layouts, ``recycled_group_sizes`` and ``data_source`` (see
#: :mod:`trainer_hooks.checkpoints._groups` and docs/FORMAT.md, appendix A). A checkpoint that
#: uses none of them is still written as version 1, so older readers keep reading it.
CHECKPOINT_VERSION = 2
READABLE_CHECKPOINT_VERSIONS = (1, 2)
_CHECKPOINT_RE = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(?P<id>[0-9]+)")

Group = list[Any]


def checkpoint_path(root: str | os.PathLike[str], rollout_id: int) -> Path:
    """``<root>/rollout/fully_async_<rollout_id>`` (a :class:`bundles.StoreURL` when ``root`` is
    an object-store URL)."""
    if isinstance(rollout_id, bool) or not isinstance(rollout_id, int) or rollout_id < 0:
        raise ValueError(f"rollout_id: expected an int >= 0, found {rollout_id!r}")
    if is_store_url(root):
        return StoreURL(str(root)).child(f"{CHECKPOINT_SUBDIR}/{CHECKPOINT_PREFIX}{rollout_id}")  # type: ignore[return-value]
    return Path(os.path.abspath(root)) / CHECKPOINT_SUBDIR / f"{CHECKPOINT_PREFIX}{rollout_id}"


def list_rollout_checkpoints(root: str | os.PathLike[str]) -> dict[int, Path]:
    """Committed checkpoints under ``<root>/rollout``, by rollout id (staging directories and
    directories without a manifest are not checkpoints)."""
    found: dict[int, Path] = {}
    if is_store_url(root):
        for name, url in list_remote_bundles(StoreURL(str(root)).child(CHECKPOINT_SUBDIR)).items():
            m = _CHECKPOINT_RE.fullmatch(name)
            if m:
                found[int(m["id"])] = url  # type: ignore[assignment]
        return dict(sorted(found.items()))
    parent = Path(root) / CHECKPOINT_SUBDIR
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return found
    for e in entries:
        m = _CHECKPOINT_RE.fullmatch(e.name)
        if m and e.is_dir(follow_symlinks=False) and is_bundle(e.path):
            found[int(m["id"])] = Path(e.path)
    return dict(sorted(found.items()))


def _require(args: Namespace, name: str, option: str) -> Any:
    value = getattr(args, name, None)
    if value is None:
        raise ValueError(f"{option} is not set: expected a checkpoint directory")
    return value
