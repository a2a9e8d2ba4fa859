"""Rollout checkpoints as bundles: snapshot now, write in the background, resume by rehydrating.

Layout and content
------------------
A checkpoint of rollout ``N`` is one bundle of kind ``"rollout_checkpoint"`` at
``<args.save>/rollout/fully_async_<N>`` (read back from ``<args.load>/rollout/…``). Its samples are
the flattened groups, pending groups first, then completed groups, each in order; the group
structure lives in the manifest's ``meta``::

    {"checkpoint_version": 1, "rollout_id": N, "run_uuid": "...", "training_dtype": "bf16",
     "processor": {...} | null, "pending_group_sizes": [4, 4], "completed_group_sizes": [4]}

``processor`` is ``args.rollout_processor_args.to_dict()`` (the engines' resolved processor
settings, see :mod:`trainer_hooks._processor_args`) or null when it was not resolved. The samples
stay plain sample dicts, so ``rollout-bundle inspect`` and a replay read a checkpoint like a dump.
Media are taken from ``run_media_dir(args)`` (any absolute path string under it, and every
``MediaRef``) with ``args.bundle_link_mode``; PIL images are encoded to PNG media on the way.

Save protocol (:class:`RolloutCheckpointer`)
--------------------------------------------
1. ``save()`` first raises the error of an earlier background save that failed, if any (each
   failure is raised exactly once, at the next ``save()`` or ``flush()``; it is never
   swallowed). The new save is then *not* started: the caller decides whether to retry.
2. It snapshots the groups synchronously (:func:`snapshot_groups`): ``to_dict()`` of each sample,
   every dict/list/tuple copied, numpy arrays and torch tensors copied (tensors to CPU), PIL
   images copied. Strings, numbers, bytes and ``MediaRef`` are immutable and shared. After
   ``save()`` returns, mutating a sample (even in place, even a tensor) does not change the
   checkpoint. The cost is one pass over the structure plus a memcpy of array/tensor bytes; media
   files are never touched on the caller's thread. Trade-off: long lists whose first and last
   items are scalars (token ids, masks, log-probs: the bulk of a sample) are copied with one
   ``list.copy()`` and their other items' types are checked on the worker, before writing; a
   list that hides a mutable item (say a tensor among ints) fails that save with
   :class:`SnapshotError` naming the item, rather than risk a checkpoint that a later mutation
   changed. Checking every item on the caller's thread cost ~20 ns each, ~25 ms for a round
   of 600 samples with 1280 token/mask items each.
3. A single worker thread (so saves commit in call order) encodes images, calls
   :func:`bundles.write_bundle` (staging directory, fsync, rename: the commit protocol of
   :mod:`bundles._commit`) and only then applies retention.
4. ``flush()`` waits for every queued save and raises the first failure. Drivers run it from the
   disposer *before* ``release_run_media``: a background save may still be linking media out of
   the run directory.

A process killed at any point leaves the previous checkpoints complete: a checkpoint directory
either does not exist or is a committed bundle; a dead writer's staging directory is removed by
the next save into the same ``rollout/`` directory.

Retention (``--keep-rollout-checkpoints K``)
--------------------------------------------
After a checkpoint is committed, committed ``fully_async_<id>`` bundles beyond the K with the
highest rollout ids are deleted; the one just committed is never deleted. A failed save deletes
nothing. Deletion goes through :func:`bundles.remove_bundle` (rename aside, then remove), so a
crash during deletion never leaves a half-deleted bundle under a checkpoint's name.

Resume
------
:func:`read_rollout_checkpoint` opens the bundle with ``args.bundle_verify``, checks its kind and
meta, and rehydrates its media into the *current* run's ``run_media_dir(args)`` (hard links when
possible): the returned samples reference only the new run's directory, whose teardown removes
them, and the checkpoint itself is left untouched. Pending samples are reset for retry
(``Sample.reset_for_retry``): partial generations are not resumed, the prompts are resubmitted.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import re
import shutil
import sys
import threading
from argparse import Namespace
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundles import (
    BundleError,
    BundleFormatError,
    BundleNotFoundError,
    MediaRef,
    is_bundle,
    open_bundle,
    remove_bundle,
    scratch_dir,
    write_bundle,
)
from trainer_hooks._run_media import RunMediaError, _ensure_run_dir, run_media_dir
from trainer_hooks._sample import Sample

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_PREFIX",
    "CheckpointSaveError",
    "RolloutCheckpoint",
    "RolloutCheckpointer",
    "SnapshotError",
    "checkpoint_path",
    "list_rollout_checkpoints",
    "load_rollout_checkpoint",
    "read_rollout_checkpoint",
    "save_rollout_checkpoint",
    "snapshot_groups",
    "snapshot_value",
]

logger = logging.getLogger(__name__)

CHECKPOINT_KIND = "rollout_checkpoint"
CHECKPOINT_PREFIX = "fully_async_"
CHECKPOINT_SUBDIR = "rollout"
CHECKPOINT_VERSION = 1
_CHECKPOINT_RE = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(?P<id>[0-9]+)")

Group = list[Any]


class CheckpointSaveError(BundleError):
    """A background checkpoint save failed; ``__cause__`` holds the original error."""


# -- snapshots -------------------------------------------------------------------------------------


class SnapshotError(BundleError, TypeError):
    """A value taken at ``save()`` could not be snapshotted faithfully (see :func:`snapshot_groups`)."""


def _pil_image_type() -> type | None:
    pil = sys.modules.get("PIL.Image")
    return None if pil is None else pil.Image


# Immutable values, shared between the caller and a snapshot. (MediaRef is a frozen dataclass.)
_SCALAR_TYPES = frozenset({str, int, float, bool, type(None), bytes, complex, MediaRef})
# Lists at least this long whose first and last items are scalars are copied in one C call and
# their item types checked later, off the caller's thread (see snapshot_groups).
_DEFERRED_CHECK_MIN_LEN = 64

Path_ = tuple[Any, ...]


def _format_path(path: Path_) -> str:
    out = str(path[0])
    for part in path[1:]:
        out += f"[{part}]" if isinstance(part, int) or not str(part).isidentifier() else f".{part}"
    return out


class _Snapshotter:
    def __init__(self) -> None:
        # (list copy, key path): long scalar-ended lists copied shallowly, to check item types later.
        self.deferred: list[tuple[list[Any], Path_]] = []

    def value(self, value: Any, path: Path_) -> Any:
        t = type(value)
        if t in _SCALAR_TYPES:
            return value
        if t is dict:
            return {k: v if type(v) in _SCALAR_TYPES else self.value(v, (*path, k)) for k, v in value.items()}
        if t is list:
            n = len(value)
            if n == 0:
                return []
            if n >= _DEFERRED_CHECK_MIN_LEN:
                if type(value[0]) in _SCALAR_TYPES and type(value[-1]) in _SCALAR_TYPES:
                    copied = value.copy()
                    self.deferred.append((copied, path))
                    return copied
            elif _SCALAR_TYPES.issuperset(set(map(type, value))):
                return value.copy()
            return [v if type(v) in _SCALAR_TYPES else self.value(v, (*path, i)) for i, v in enumerate(value)]
        if t is tuple:
            if _SCALAR_TYPES.issuperset(set(map(type, value))):
                return value
            return tuple(
                v if type(v) in _SCALAR_TYPES else self.value(v, (*path, i)) for i, v in enumerate(value)
            )
        if t is bytearray or t is memoryview:
            return bytes(value)
        np = sys.modules.get("numpy")
        if np is not None:
            if isinstance(value, np.ndarray):
                return value.copy()
            if isinstance(value, np.generic):
                return value
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            # One copy, straight to host memory; a CPU tensor is cloned by copy=True.
            return value.detach().to("cpu", copy=True)
        pil = _pil_image_type()
        if pil is not None and isinstance(value, pil):
            return value.copy()  # type: ignore[attr-defined]
        if isinstance(value, dict):
            return {k: self.value(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, (*path, i)) for i, v in enumerate(value)]
        return copy.deepcopy(value)

    def check(self) -> None:
        """Check the item types of the lists copied shallowly; raise naming the first bad item."""
        for copied, path in self.deferred:
            if _SCALAR_TYPES.issuperset(set(map(type, copied))):
                continue
            i, bad = next((i, v) for i, v in enumerate(copied) if type(v) not in _SCALAR_TYPES)
            raise SnapshotError(
                f"{_format_path((*path, i))}: a list whose first and last items are scalars holds a "
                f"{type(bad).__module__}.{type(bad).__qualname__}; save() copies such lists shallowly and "
                "cannot guarantee that the checkpoint is unaffected by later changes to that item. Keep "
                "lists of token ids, masks and log-probs to plain scalars (or use a numpy array)"
            )
        self.deferred.clear()


def snapshot_value(value: Any, where: str = "value") -> Any:
    """A copy of ``value`` that no later mutation of ``value`` can reach.

    Containers (dict, list, tuple) are copied recursively; numpy arrays and torch tensors are
    copied (tensors moved to CPU); PIL images are copied; immutable scalars, ``bytes`` and
    ``MediaRef`` are shared; ``bytearray`` becomes ``bytes``; anything else goes through
    :func:`copy.deepcopy` (the bundle writer then decides whether it can be stored).
    """
    snap = _Snapshotter()
    out = snap.value(value, (where,))
    snap.check()
    return out


def _sample_dict(sample: Any, where: str) -> dict[Any, Any]:
    """A dict of the sample's fields that the caller does not hold (``to_dict()`` makes one)."""
    if isinstance(sample, dict):
        return dict(sample)
    to_dict = getattr(sample, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, dict):
            # Miles' to_dict() returns a fresh shallow copy; a to_dict() that hands out the
            # instance's own __dict__ (or a dict subclass) is copied once more.
            return d if type(d) is dict and d is not getattr(sample, "__dict__", None) else dict(d)
    raise TypeError(
        f"{where}: expected a Sample (an object with to_dict()) or a dict, found {type(sample).__name__}"
    )


def _snapshot_sample(snap: _Snapshotter, sample: Any, path: Path_) -> dict[Any, Any]:
    # The dict is ours (see _sample_dict): replace only its non-scalar values, in place.
    d = _sample_dict(sample, _format_path(path))
    for k, v in d.items():
        if type(v) not in _SCALAR_TYPES:
            d[k] = snap.value(v, (*path, k))
    return d


def snapshot_groups(
    groups: Iterable[Iterable[Any]],
    *,
    where: str = "groups",
    deferred: list[Callable[[], None]] | None = None,
) -> list[list[dict[Any, Any]]]:
    """Snapshot groups of samples (``Sample`` objects or dicts) into independent sample dicts.

    Cost: one pass over the structure. Long lists (token ids, loss masks, log-probs) whose first
    and last items are scalars are copied in one C call (``list.copy``) instead of item by item;
    their remaining item types are checked by a callable appended to ``deferred`` (to run on the
    writer's thread) or, when ``deferred`` is None, right here. A list that turns out to hold a
    mutable item fails the check with :class:`SnapshotError` naming it, so a checkpoint is never
    silently affected by a later mutation: it is either faithful or not written.
    """
    snap = _Snapshotter()
    out: list[list[dict[Any, Any]]] = []
    for gi, group in enumerate(groups):
        if isinstance(group, (dict, str, bytes)) or not isinstance(group, Iterable):
            raise TypeError(
                f"{where}[{gi}]: expected a group (a list of samples), found {type(group).__name__}"
            )
        out.append([_snapshot_sample(snap, s, (where, gi, si)) for si, s in enumerate(group)])
    if deferred is None:
        snap.check()
    elif snap.deferred:
        deferred.append(snap.check)
    return out


# -- PIL images become PNG media ---------------------------------------------------------------------


class ImageSink:
    """Encodes PIL images found in samples as PNG files, content-addressed, in one directory.

    The directory is meant to be a bundle's media root for one write and removed afterwards
    (the bundle holds its own link or copy). ``replace`` never mutates its input: containers on
    the path to an image are rebuilt, everything else is shared.
    """

    def __init__(self, media_dir: Path) -> None:
        self.media_dir = media_dir
        self.count = 0

    def _store(self, image: Any, where: str) -> MediaRef:
        buf = io.BytesIO()
        try:
            image.save(buf, format="PNG")
        except (OSError, ValueError, KeyError) as e:
            raise BundleError(
                f"{where}: PIL image (mode {image.mode}) cannot be written as PNG: {e}"
            ) from None
        data = buf.getvalue()
        ref = MediaRef.from_bytes(data, ".png")
        path = self.media_dir / ref.filename
        if not path.exists():
            self.media_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        self.count += 1
        return ref.with_path(str(path))

    def replace(self, value: Any, where: str) -> Any:
        pil = _pil_image_type()
        if pil is None:
            return value
        return self._walk(value, where, pil)

    def _walk(self, value: Any, where: str, pil: type) -> Any:
        t = type(value)
        if t in _SCALAR_TYPES:
            return value
        if isinstance(value, pil):
            return self._store(value, where)
        if t is dict:
            new = {k: self._walk(v, f"{where}.{k}", pil) for k, v in value.items()}
            return value if all(new[k] is value[k] for k in value) else new
        if t is list or t is tuple:
            items = [self._walk(v, f"{where}[{i}]", pil) for i, v in enumerate(value)]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items if t is list else tuple(items)
        return value


def write_samples_bundle(
    dest: Path,
    samples: Sequence[dict[Any, Any]],
    *,
    media_roots: Sequence[str | os.PathLike[str]],
    kind: str,
    meta: dict[str, Any],
    link: str,
    overwrite: bool,
) -> Path:
    """``write_bundle`` after turning PIL images into PNG media in a temporary directory beside
    ``dest`` (same filesystem, so the bundle can hard-link them); the directory is removed after."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch_dir(dest, "images")  # removed by the next save if this process dies
    try:
        sink = ImageSink(tmp)
        prepared = [sink.replace(s, f"samples[{i}]") for i, s in enumerate(samples)]
        roots = [*media_roots, tmp] if sink.count else list(media_roots)
        return write_bundle(
            dest,
            prepared,
            media_roots=roots,
            kind=kind,
            meta=meta,
            link=link,
            overwrite=overwrite,
            progress=False,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- paths and meta ------------------------------------------------------------------------------------


def checkpoint_path(root: str | os.PathLike[str], rollout_id: int) -> Path:
    """``<root>/rollout/fully_async_<rollout_id>``."""
    if isinstance(rollout_id, bool) or not isinstance(rollout_id, int) or rollout_id < 0:
        raise ValueError(f"rollout_id: expected an int >= 0, found {rollout_id!r}")
    return Path(os.path.abspath(root)) / CHECKPOINT_SUBDIR / f"{CHECKPOINT_PREFIX}{rollout_id}"


def list_rollout_checkpoints(root: str | os.PathLike[str]) -> dict[int, Path]:
    """Committed checkpoints under ``<root>/rollout``, by rollout id (staging directories and
    directories without a manifest are not checkpoints)."""
    found: dict[int, Path] = {}
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


def training_dtype(args: Namespace) -> str:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "fp32"


def processor_settings(args: Namespace) -> dict[str, Any] | None:
    """The engines' resolved processor settings (``args.rollout_processor_args``), or None."""
    proc = getattr(args, "rollout_processor_args", None)
    return None if proc is None else proc.to_dict()


def run_meta(args: Namespace) -> dict[str, Any]:
    """What every bundle written by a run records about it."""
    return {
        "run_uuid": getattr(args, "run_uuid", None),
        "training_dtype": training_dtype(args),
        "processor": processor_settings(args),
    }


def _media_roots(args: Namespace) -> list[Path]:
    run_dir = run_media_dir(args)
    return [] if run_dir is None else [run_dir]


def _require(args: Namespace, name: str, option: str) -> Any:
    value = getattr(args, name, None)
    if value is None:
        raise ValueError(f"{option} is not set: expected a checkpoint directory")
    return value


# -- writing -------------------------------------------------------------------------------------------


def _write_checkpoint(
    args: Namespace,
    rollout_id: int,
    pending: list[list[dict[Any, Any]]],
    completed: list[list[dict[Any, Any]]],
    checks: Sequence[Callable[[], None]] = (),
) -> Path:
    for check in checks:  # the snapshot's deferred checks, before anything is written
        check()
    dest = checkpoint_path(_require(args, "save", "--save"), rollout_id)
    meta = {
        "checkpoint_version": CHECKPOINT_VERSION,
        "rollout_id": rollout_id,
        **run_meta(args),
        "pending_group_sizes": [len(g) for g in pending],
        "completed_group_sizes": [len(g) for g in completed],
    }
    samples = [s for g in pending for s in g] + [s for g in completed for s in g]
    path = write_samples_bundle(
        dest,
        samples,
        media_roots=_media_roots(args),
        kind=CHECKPOINT_KIND,
        meta=meta,
        link=getattr(args, "bundle_link_mode", None) or "auto",
        overwrite=True,
    )
    apply_retention(args.save, getattr(args, "keep_rollout_checkpoints", None), keep_id=rollout_id)
    return path


def _write_logged(
    args: Namespace,
    rollout_id: int,
    pending: list[list[dict[Any, Any]]],
    completed: list[list[dict[Any, Any]]],
    checks: Sequence[Callable[[], None]],
) -> Path:
    """:func:`_write_checkpoint` on the worker. A failure is also logged at once: it is raised at
    the next ``save()``/``flush()``, but a process that never calls either still shows it."""
    try:
        return _write_checkpoint(args, rollout_id, pending, completed, checks)
    except BaseException as e:
        logger.error(
            "background save of the rollout checkpoint for rollout %s failed (raised at the next "
            "save() or flush()): %s: %s",
            rollout_id,
            type(e).__name__,
            e,
        )
        raise


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
        try:
            remove_bundle(path)
        except BundleNotFoundError:
            continue  # removed concurrently
        deleted.append(path)
        logger.info("retention: removed rollout checkpoint %s (keeping %d)", path, keep)
    return deleted


def save_rollout_checkpoint(
    args: Namespace,
    rollout_id: int,
    pending_groups: Iterable[Iterable[Any]],
    completed_groups: Iterable[Iterable[Any]],
) -> Path:
    """Write the checkpoint of ``rollout_id`` now, in this thread, and apply retention.

    Args:
        args: with ``save``, and ``shared_media_dir``/``run_uuid`` when samples reference media;
            ``bundle_link_mode``, ``keep_rollout_checkpoints``, ``bf16``/``fp16`` and
            ``rollout_processor_args`` are used when present.
        rollout_id: the rollout step; the bundle goes to ``<save>/rollout/fully_async_<id>``.
        pending_groups: prompt groups in flight (resubmitted on resume).
        completed_groups: finished groups waiting for training.

    Returns:
        The committed bundle's path.

    Use :class:`RolloutCheckpointer` to keep the write off the caller's thread.
    """
    pending = snapshot_groups(pending_groups, where="pending_groups")
    completed = snapshot_groups(completed_groups, where="completed_groups")
    return _write_checkpoint(args, rollout_id, pending, completed)


class RolloutCheckpointer:
    """Background checkpoint saves: snapshot on ``save()``, write on one worker thread, in order.

    See the module docstring for the protocol. Thread-safe; ``close()`` flushes and stops the
    worker. The worker is a non-daemon thread, so a normal interpreter exit also waits for queued
    saves.
    """

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._futures: list[tuple[int, Path, Future[Path]]] = []
        self.committed: list[Path] = []

    def _raise_failed(self, *, wait: bool) -> None:
        with self._lock:
            queued = list(self._futures)
        for rid, dest, fut in queued:
            if not wait and not fut.done():
                break  # saves complete in order: nothing after an unfinished one is done
            exc = fut.exception()
            with self._lock:
                entry = (rid, dest, fut)
                if entry not in self._futures:
                    continue  # another thread reported it already
                self._futures.remove(entry)
                if exc is None:
                    self.committed.append(fut.result())
            if exc is not None:
                raise CheckpointSaveError(
                    f"{dest}: background save of the rollout checkpoint for rollout {rid} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

    def save(
        self,
        rollout_id: int,
        pending_groups: Iterable[Iterable[Any]],
        completed_groups: Iterable[Iterable[Any]],
    ) -> Future[Path]:
        """Snapshot the groups and queue the write; returns the future of the committed path.

        Raises :class:`CheckpointSaveError` (and queues nothing) when an earlier save failed.
        """
        self._raise_failed(wait=False)
        dest = checkpoint_path(_require(self.args, "save", "--save"), rollout_id)
        checks: list[Callable[[], None]] = []
        pending = snapshot_groups(pending_groups, where="pending_groups", deferred=checks)
        completed = snapshot_groups(completed_groups, where="completed_groups", deferred=checks)
        return self.submit_snapshot(rollout_id, dest, pending, completed, checks)

    def submit_snapshot(
        self,
        rollout_id: int,
        dest: Path,
        pending: list[list[dict[Any, Any]]],
        completed: list[list[dict[Any, Any]]],
        checks: Sequence[Callable[[], None]] = (),
    ) -> Future[Path]:
        """Queue already-snapshotted groups (nothing may mutate them afterwards) and the
        snapshot's deferred checks, which run on the worker before anything is written."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-checkpoint")
            fut = self._executor.submit(_write_logged, self.args, rollout_id, pending, completed, checks)
            self._futures.append((rollout_id, dest, fut))
        return fut

    @property
    def pending_saves(self) -> int:
        with self._lock:
            return sum(not f.done() for _, _, f in self._futures)

    def flush(self) -> list[Path]:
        """Wait for every queued save; raise the first failure. Returns the paths committed since
        the last flush."""
        try:
            self._raise_failed(wait=True)
        finally:
            with self._lock:
                done, self.committed = self.committed, []
        return done

    def close(self) -> None:
        """Flush, then stop the worker thread (also when the flush raises)."""
        try:
            self.flush()
        finally:
            with self._lock:
                executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True)


# -- reading -------------------------------------------------------------------------------------------


@dataclass
class RolloutCheckpoint:
    """A loaded checkpoint; samples reference media in the current run's directory."""

    path: Path
    rollout_id: int
    meta: dict[str, Any]
    pending_groups: list[list[Sample]] = field(default_factory=list)
    completed_groups: list[list[Sample]] = field(default_factory=list)


def _check_sizes(meta: dict[str, Any], key: str, where: Path) -> list[int]:
    sizes = meta.get(key)
    if not isinstance(sizes, list) or not all(type(n) is int and n >= 0 for n in sizes):
        raise BundleFormatError(
            f"{where}: meta.{key}: expected a list of group sizes (ints >= 0), found {sizes!r}"
        )
    return sizes


def read_rollout_checkpoint(
    args: Namespace,
    rollout_id: int,
    *,
    root: str | os.PathLike[str] | None = None,
    sample_factory: Callable[[dict[Any, Any]], Any] = Sample.from_dict,
) -> RolloutCheckpoint:
    """Open ``<root or args.load>/rollout/fully_async_<rollout_id>`` and rehydrate it into
    ``run_media_dir(args)``.

    Verification follows ``args.bundle_verify`` (default ``"fast"``); media are placed with
    ``args.bundle_link_mode``. Raises :class:`bundles.BundleNotFoundError` when the checkpoint
    does not exist, :class:`bundles.BundleFormatError` when it is not a rollout checkpoint, and
    :class:`trainer_hooks.RunMediaError` when it holds media but ``--shared-media-dir`` is unset.
    """
    base = root if root is not None else _require(args, "load", "--load")
    path = checkpoint_path(base, rollout_id)
    bundle = open_bundle(path, verify=getattr(args, "bundle_verify", None) or "fast")
    if bundle.kind != CHECKPOINT_KIND:
        raise BundleFormatError(f"{path}: kind: expected {CHECKPOINT_KIND!r}, found {bundle.kind!r}")
    meta = bundle.meta
    version = meta.get("checkpoint_version")
    if version != CHECKPOINT_VERSION:
        raise BundleFormatError(
            f"{path}: meta.checkpoint_version: expected {CHECKPOINT_VERSION}, found {version!r}"
        )
    if meta.get("rollout_id") != rollout_id:
        raise BundleFormatError(
            f"{path}: meta.rollout_id: expected {rollout_id}, found {meta.get('rollout_id')!r}"
        )
    pending_sizes = _check_sizes(meta, "pending_group_sizes", path)
    completed_sizes = _check_sizes(meta, "completed_group_sizes", path)
    if sum(pending_sizes) + sum(completed_sizes) != len(bundle):
        raise BundleFormatError(
            f"{path}: meta: group sizes add up to {sum(pending_sizes) + sum(completed_sizes)} samples, "
            f"the bundle holds {len(bundle)}"
        )
    _warn_on_mismatch(args, meta, path)
    if bundle.media:
        if run_media_dir(args) is None:
            raise RunMediaError(
                f"{path}: the checkpoint holds {len(bundle.media)} media file(s) but --shared-media-dir is not "
                "set: there is no run media directory to rehydrate them into"
            )
        rows = bundle.rehydrate(
            _ensure_run_dir(args), link=getattr(args, "bundle_link_mode", None) or "auto", progress=False
        )
    else:
        rows = list(bundle.samples())
    samples = [sample_factory(r) for r in rows]
    pending: list[list[Any]] = []
    pos = 0
    for n in pending_sizes:
        group = samples[pos : pos + n]
        for s in group:
            reset = getattr(s, "reset_for_retry", None)
            if callable(reset):
                reset()
        pending.append(group)
        pos += n
    completed = []
    for n in completed_sizes:
        completed.append(samples[pos : pos + n])
        pos += n
    return RolloutCheckpoint(
        path=path, rollout_id=rollout_id, meta=meta, pending_groups=pending, completed_groups=completed
    )


def _warn_on_mismatch(args: Namespace, meta: dict[str, Any], path: Path) -> None:
    for key, now in (("training_dtype", training_dtype(args)), ("processor", processor_settings(args))):
        if key in meta and meta[key] != now:
            logger.warning(
                "%s: meta.%s: the checkpoint was written with %r, this run uses %r", path, key, meta[key], now
            )


def load_rollout_checkpoint(
    args: Namespace, rollout_id: int
) -> tuple[list[list[Sample]], list[list[Sample]]]:
    """``(pending_groups, completed_groups)`` of ``<args.load>/rollout/fully_async_<rollout_id>``,
    with media rehydrated into the current run's media directory (see
    :func:`read_rollout_checkpoint`)."""
    ckpt = read_rollout_checkpoint(args, rollout_id)
    return ckpt.pending_groups, ckpt.completed_groups
