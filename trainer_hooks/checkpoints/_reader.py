"""Reading rollout checkpoints back: resume by rehydrating media into the current run.

:func:`read_rollout_checkpoint` opens the bundle with ``args.bundle_verify``, checks its kind and
meta, and rehydrates its media into the *current* run's ``run_media_dir(args)`` (hard links when
possible): the returned samples reference only the new run's directory, whose teardown removes
them, and the checkpoint itself is left untouched. Pending samples are reset for retry
(``Sample.reset_for_retry``): partial generations are not resumed, the prompts are resubmitted.
Nested groups (``list[list[Sample]]``) come back nested (:mod:`trainer_hooks.checkpoints._groups`);
a version 2 checkpoint may also hold recycled groups and the data source's cursor.

Rehydrated media are hashed by default (``--resume-verify-media``, on; ``verify_media=False``
skips it). A hard-linked file shares its inode with the checkpoint, and a run directory may hold
a file of the right name and size already: neither is covered by ``--bundle-verify fast``, and an
in-place edit of a shared inode (as root, or after a chmod) would otherwise resume silently with
other bytes. The cost is one read of every media file (a 0.6 GB checkpoint hashed in 0.35 s here).
"""

from __future__ import annotations

import logging
import os
from argparse import Namespace
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundles import Bundle, BundleFormatError, BundleVerificationError, Location, MediaRef, open_bundle
from trainer_hooks._sample import resolve_sample_cls
from trainer_hooks._sample_bundle import processor_settings, training_dtype_name
from trainer_hooks.checkpoints._groups import Layout, layout_sample_count, read_layouts, unflatten_groups
from trainer_hooks.checkpoints._paths import (
    CHECKPOINT_KIND,
    READABLE_CHECKPOINT_VERSIONS,
    _require,
    checkpoint_path,
)
from trainer_hooks.run_media import RunMediaError, ensure_run_dir, run_media_dir

__all__ = ["RolloutCheckpoint", "load_rollout_checkpoint", "read_rollout_checkpoint"]

logger = logging.getLogger(__name__)


@dataclass
class RolloutCheckpoint:
    """A loaded checkpoint; samples reference media in the current run's directory."""

    path: Location
    rollout_id: int
    meta: dict[str, Any]
    pending_groups: list[list[Any]] = field(default_factory=list)
    completed_groups: list[list[Any]] = field(default_factory=list)
    #: Groups that waited in the data source's own buffer (Miles' ``add_samples``); version 2.
    recycled_groups: list[list[Any]] = field(default_factory=list)
    #: The data source's cursor (``meta["data_source"]``) or None; version 2.
    data_source_state: dict[str, Any] | None = None


def read_rollout_checkpoint(
    args: Namespace,
    rollout_id: int,
    *,
    root: str | os.PathLike[str] | None = None,
    sample_cls: Any = None,
    verify_media: bool | None = None,
) -> RolloutCheckpoint:
    """Open ``<root or args.load>/rollout/fully_async_<rollout_id>`` and rehydrate it into
    ``run_media_dir(args)``.

    Samples are built with ``sample_cls.from_dict``: by default Miles' ``Sample`` when ``miles``
    is importable, else :class:`trainer_hooks.Sample` (see :func:`trainer_hooks.default_sample_cls`);
    ``sample_cls=dict`` returns the stored dicts as they are (pending ones are then not reset).

    Verification follows ``args.bundle_verify`` (default ``"fast"``); media are placed with
    ``args.bundle_link_mode`` and then hashed against their digests unless ``verify_media`` (default:
    ``args.resume_verify_media``, on) is False; a mismatch raises
    :class:`bundles.BundleVerificationError` naming each placed file. Raises :class:`bundles.BundleNotFoundError` when the checkpoint
    does not exist, :class:`bundles.BundleFormatError` when it is not a rollout checkpoint, and
    :class:`trainer_hooks.RunMediaError` when it holds media but ``--shared-media-dir`` is unset.
    """
    cls = resolve_sample_cls(sample_cls)
    base = root if root is not None else _require(args, "load", "--load")
    path = checkpoint_path(base, rollout_id)
    bundle = open_bundle(path, verify=getattr(args, "bundle_verify", None) or "fast")
    pending_layouts, completed_layouts, recycled_layouts, source_state = _checked_layouts(
        bundle, path, rollout_id
    )
    _warn_on_mismatch(args, bundle.meta, path)
    samples = _rehydrated_samples(args, bundle, path, cls, verify_media)
    pending, pos = unflatten_groups(samples, pending_layouts)
    _reset_for_retry(pending)
    completed, pos = unflatten_groups(samples, completed_layouts, pos)
    recycled, pos = unflatten_groups(samples, recycled_layouts, pos)
    return RolloutCheckpoint(
        path=path,
        rollout_id=rollout_id,
        meta=bundle.meta,
        pending_groups=pending,
        completed_groups=completed,
        recycled_groups=recycled,
        data_source_state=source_state,
    )


def _checked_layouts(
    bundle: Bundle, path: Location, rollout_id: int
) -> tuple[list[Layout], list[Layout], list[Layout], dict[str, Any] | None]:
    """Check the checkpoint's kind and meta before any media is placed; return its pending,
    completed and recycled group layouts and the data source's cursor."""
    if bundle.kind != CHECKPOINT_KIND:
        raise BundleFormatError(f"{path}: kind: expected {CHECKPOINT_KIND!r}, found {bundle.kind!r}")
    meta = bundle.meta
    version = meta.get("checkpoint_version")
    if type(version) is not int or version not in READABLE_CHECKPOINT_VERSIONS:
        raise BundleFormatError(
            f"{path}: meta.checkpoint_version: expected one of {list(READABLE_CHECKPOINT_VERSIONS)}, "
            f"found {version!r}"
        )
    if meta.get("rollout_id") != rollout_id:
        raise BundleFormatError(
            f"{path}: meta.rollout_id: expected {rollout_id}, found {meta.get('rollout_id')!r}"
        )
    pending_layouts = read_layouts(meta, "pending_group_sizes", path)
    completed_layouts = read_layouts(meta, "completed_group_sizes", path)
    recycled_layouts = read_layouts(meta, "recycled_group_sizes", path, required=False)
    if version == 1 and any(type(x) is not int for x in (*pending_layouts, *completed_layouts)):
        raise BundleFormatError(f"{path}: meta: nested group layouts need checkpoint_version 2, found 1")
    declared = sum(layout_sample_count(x) for x in (*pending_layouts, *completed_layouts, *recycled_layouts))
    if declared != len(bundle):
        raise BundleFormatError(
            f"{path}: meta: group sizes add up to {declared} samples, the bundle holds {len(bundle)}"
        )
    source_state = meta.get("data_source")
    if source_state is not None and not isinstance(source_state, dict):
        raise BundleFormatError(
            f"{path}: meta.data_source: expected an object (the data source's cursor), found {source_state!r}"
        )
    return pending_layouts, completed_layouts, recycled_layouts, source_state


def _rehydrated_samples(
    args: Namespace, bundle: Bundle, path: Location, cls: Any, verify_media: bool | None
) -> list[Any]:
    """The checkpoint's samples, their media placed in (and referencing) this run's directory."""
    if not bundle.media:
        return list(bundle.samples(sample_cls=cls))
    if run_media_dir(args) is None:
        raise RunMediaError(
            f"{path}: the checkpoint holds {len(bundle.media)} media file(s) but --shared-media-dir is not "
            "set: there is no run media directory to rehydrate them into"
        )
    media_dir = ensure_run_dir(args)
    samples = bundle.rehydrate(
        media_dir,
        link=getattr(args, "bundle_link_mode", None) or "auto",
        progress=False,
        sample_cls=cls,
    )
    if verify_media if verify_media is not None else getattr(args, "resume_verify_media", True):
        _verify_placed_media(path, media_dir, bundle.media)
    return samples


def _reset_for_retry(pending: list[list[Any]]) -> None:
    # Partial generations are not resumed: their prompts are resubmitted from scratch.
    for group in pending:
        for item in group:
            for s in item if type(item) is list else [item]:
                reset = getattr(s, "reset_for_retry", None)
                if callable(reset):
                    reset()


def _verify_placed_media(path: Location, media_dir: Path, refs: Sequence[MediaRef]) -> None:
    """Hash every media file of the checkpoint where the resume placed it; raise listing every
    file whose bytes disagree with its digest."""

    def check(ref: MediaRef) -> str | None:
        placed = media_dir / ref.filename
        try:
            found = MediaRef.from_file(placed)
        except OSError as e:
            return f"{placed}: cannot read the rehydrated file: {e}"
        if found.size != ref.size:
            return f"{placed}: size: expected {ref.size} bytes, found {found.size}"
        if found.digest != ref.digest:
            return f"{placed}: digest: expected {ref.digest}, found {found.digest}"
        return None

    workers = max(1, min(4, os.cpu_count() or 1, len(refs)))
    with ThreadPoolExecutor(workers) as pool:  # hashlib releases the GIL on large buffers
        problems = [p for p in pool.map(check, refs) if p is not None]
    if problems:
        problems.append(
            f"rehydrated from {path}: a run file edited in place, or a changed file shared with the "
            "checkpoint by a hard link (pass --no-resume-verify-media to skip this check)"
        )
        raise BundleVerificationError(path, problems)


def _warn_on_mismatch(args: Namespace, meta: dict[str, Any], path: Location) -> None:
    for key, now in (("training_dtype", training_dtype_name(args)), ("processor", processor_settings(args))):
        if key in meta and meta[key] != now:
            logger.warning(
                "%s: meta.%s: the checkpoint was written with %r, this run uses %r", path, key, meta[key], now
            )


def load_rollout_checkpoint(
    args: Namespace, rollout_id: int, *, sample_cls: Any = None, verify_media: bool | None = None
) -> tuple[list[list[Any]], list[list[Any]]]:
    """``(pending_groups, completed_groups)`` of ``<args.load>/rollout/fully_async_<rollout_id>``,
    with media rehydrated into the current run's media directory (and hashed there unless
    ``verify_media`` is False) and samples built with ``sample_cls`` (see
    :func:`read_rollout_checkpoint`)."""
    ckpt = read_rollout_checkpoint(args, rollout_id, sample_cls=sample_cls, verify_media=verify_media)
    return ckpt.pending_groups, ckpt.completed_groups
