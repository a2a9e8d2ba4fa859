"""Where rollout checkpoints live: ``<root>/rollout/fully_async_<N>``, and which are committed."""

from __future__ import annotations

import os
import re
from argparse import Namespace
from typing import Any

from bundles import Location, child_location, list_bundles

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_PREFIX",
    "CHECKPOINT_SUBDIR",
    "CHECKPOINT_VERSION",
    "READABLE_CHECKPOINT_VERSIONS",
    "checkpoint_path",
    "list_rollout_checkpoints",
    "saved_checkpoint_path",
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


def checkpoint_path(root: str | os.PathLike[str], rollout_id: int) -> Location:
    """``<root>/rollout/fully_async_<rollout_id>`` (a :class:`bundles.StoreURL` when ``root`` is
    an object-store URL: :func:`bundles.child_location`)."""
    if isinstance(rollout_id, bool) or not isinstance(rollout_id, int) or rollout_id < 0:
        raise ValueError(f"rollout_id: expected an int >= 0, found {rollout_id!r}")
    return child_location(root, f"{CHECKPOINT_SUBDIR}/{CHECKPOINT_PREFIX}{rollout_id}")


def list_rollout_checkpoints(root: str | os.PathLike[str]) -> dict[int, Location]:
    """Committed checkpoints under ``<root>/rollout``, by rollout id, on any kind of root
    (:func:`bundles.list_bundles`: staging directories, unpublished prefixes and directories
    without a manifest are not bundles)."""
    found: dict[int, Location] = {}
    for location in list_bundles(child_location(root, CHECKPOINT_SUBDIR)):
        m = _CHECKPOINT_RE.fullmatch(location.rstrip("/").rsplit("/", 1)[-1])
        if m:
            found[int(m["id"])] = checkpoint_path(root, int(m["id"]))
    return dict(sorted(found.items()))


def _require(args: Namespace, name: str, option: str) -> Any:
    value = getattr(args, name, None)
    if value is None:
        raise ValueError(f"{option} is not set: expected a checkpoint directory")
    return value


def saved_checkpoint_path(args: Namespace, rollout_id: int) -> Location:
    """Where this run saves the checkpoint of rollout ``rollout_id``: :func:`checkpoint_path` under
    ``args.save``, refusing a run without ``--save``."""
    return checkpoint_path(_require(args, "save", "--save"), rollout_id)
