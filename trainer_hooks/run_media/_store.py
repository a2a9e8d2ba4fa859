"""Per-run media directories: ``<shared_media_dir>/<run_uuid>/<sha256 hex><suffix>``.

Protocol
--------
* Every run writes its media (screenshots, rendered frames, …) under its own directory, named
  by ``--run-uuid``. Inside it, files are content-addressed: the name is the sha256 of the
  bytes plus a suffix, so storing the same image twice costs nothing and a name always means
  the same bytes.
* A file is written to a hidden temporary name in the same directory, made read-only (0o444)
  and renamed onto its final name. A reader therefore sees either no file or
  the whole file; a crash leaves at most a hidden ``.<name>.staging.*`` that the run's release (or
  ``rollout-bundle sweep``) removes with the directory.
* Creating the directory writes a marker, ``.run-media.json`` (``{"marker_version": 1,
  "run_id": …, "created_at": …, "pid": …}``): ``rollout-bundle sweep`` and
  ``release_run_media`` delete only directories that carry it or a lease naming them (the proof
  that a run made the directory), so neither pointed at the wrong directory deletes anything.
* A run never adopts a directory it did not make: an existing ``<shared_media_dir>/<run_uuid>``
  without that proof (``--shared-media-dir /home --run-uuid alice``) is refused when the run
  first uses it (its lease, its first screenshot), before anything is written into it, since
  teardown would delete it whole. Only an empty directory is adopted (it holds nothing to lose),
  and a crashed run's directory is resumed (it carries the proof).
* The directory is keyed by run, not by rollout step: with the asynchronous driver a sample
  generated in step n trains in step n+1, and a step-keyed directory would have to be kept
  alive across steps anyway.
* ``release_run_media`` removes the whole directory as the last teardown step of a driver
  (see :mod:`trainer_hooks.run_media._disposer`). It is the only code that deletes media, so it is
  paranoid: it refuses run ids that could name anything other than one direct child of
  ``shared_media_dir``, a run directory that is a symlink or resolves elsewhere, one without the
  marker or a lease naming it, and one leased by another live run (a second launch with the same
  run id, refused at its start, must not delete the first run's media at its teardown), and it
  deletes nothing in those cases. The deletion goes through directory file descriptors
  and never follows a symlink (``bundles.support.remove_tree``), so a subdirectory swapped for a
  symlink while it runs cannot redirect it outside the run directory.

Trade-offs
----------
* Neither the file nor the run directory is fsynced: losing a just-stored file in a machine
  crash only loses media of a run that is dead anyway, and a bundle that links the file makes
  it durable when it commits. An fsync per screenshot would cost the rollout a journal commit
  per image.
* An existing file with the right name and size is trusted without rehashing it; rehashing a
  large file on every store would cost more than it protects against (only a tamperer can put
  other bytes under a content-addressed name, since every write is atomic).
* ``release_run_media`` reports the bytes actually freed: a file that is also hard-linked
  elsewhere (e.g. into a bundle written with ``--bundle-link-mode hardlink``) keeps its data
  alive and is not counted.
"""

from __future__ import annotations

import io
import json
import os
import stat
import time
from argparse import Namespace
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundles import BundleError, MediaRef

# The one atomic write, tree deletion, URL refusal and message repr.
from bundles.support import atomic_write, bounded_repr, local_path_only, remove_tree

__all__ = [
    "RunMediaError",
    "UnsafeRunDirError",
    "check_run_id",
    "ensure_run_dir",
    "release_run_media",
    "run_media_dir",
    "store_media",
]

MEDIA_FILE_MODE = 0o444
RUN_DIR_MODE = 0o755
# Written into every run media directory when it is created: the proof ``sweep`` asks for
# before it deletes anything (a lease is the other proof).
RUN_MARKER_NAME = ".run-media.json"
# A live run's lease (see trainer_hooks.run_media._lease, which writes it).
LEASE_NAME = ".lease.json"
# The longest run id, in bytes of its file-system encoding: it names a directory, and file names
# are limited (255 bytes on ext4, XFS, btrfs and NFS; 143 on eCryptfs). 128 leaves room on all of
# them; a uuid4 hex is 32.
MAX_RUN_ID_BYTES = 128


class RunMediaError(BundleError):
    """A run media directory cannot be used as asked (no ``--shared-media-dir``, a bad layout)."""


class UnsafeRunDirError(RunMediaError, ValueError):
    """A run id or run directory could make a deletion reach outside the run's own directory."""


def check_run_id(run_id: object, *, option: str = "--run-uuid") -> str:
    """Return ``run_id`` if it can only name one direct child of the shared media directory.

    Refused: non-strings, the empty string, anything holding ``/``, ``\\``, ``..`` or a NUL
    byte, names starting with ``.`` (``.`` itself names the shared root; hidden names are
    reserved for temporary files and are skipped by ``sweep``), and names longer than
    :data:`MAX_RUN_ID_BYTES` bytes. ``option`` names where the value came from in the message.
    """
    if not isinstance(run_id, str):
        raise UnsafeRunDirError(
            f"{option}: expected a string run id, found {type(run_id).__name__} {bounded_repr(run_id)}"
        )
    problem = None
    try:
        size = len(os.fsencode(run_id))
    except UnicodeError:
        size = None
    if not run_id:
        problem = "it is empty"
    elif size is None:
        problem = "it cannot be encoded as a file name"
    elif size > MAX_RUN_ID_BYTES:
        problem = (
            f"it is {size} bytes long, more than {MAX_RUN_ID_BYTES} (it names a directory, and file names "
            "are limited: 255 bytes on most file systems)"
        )
    elif "/" in run_id or "\\" in run_id or (os.altsep and os.altsep in run_id):
        problem = "it holds a path separator"
    elif ".." in run_id:
        problem = "it holds '..'"
    elif "\0" in run_id:
        problem = "it holds a NUL byte"
    elif run_id.startswith("."):
        problem = "it starts with '.'"
    if problem:
        raise UnsafeRunDirError(
            f"{option}: run id {bounded_repr(run_id)} is refused because {problem}; expected a plain name "
            "such as a uuid4 hex"
        )
    return run_id


def run_media_dir(args: Namespace) -> Path | None:
    """``<args.shared_media_dir>/<args.run_uuid>``, or None when ``shared_media_dir`` is unset.

    The run id is checked (see :func:`check_run_id`), and a URL for the directory is refused
    (run media live on a local or shared file system); nothing is created.
    """
    shared = getattr(args, "shared_media_dir", None)
    if shared is None:
        return None
    local_path_only(shared, "--shared-media-dir")
    run_id = check_run_id(getattr(args, "run_uuid", None))
    return Path(shared) / run_id


def ensure_run_dir(args: Namespace) -> Path:
    run_dir = run_media_dir(args)
    if run_dir is None:
        raise RunMediaError(
            "--shared-media-dir is not set: there is no run media directory to store media in"
        )
    create_run_dir(run_dir)
    return run_dir


def create_run_dir(run_dir: Path, *, ensure_marker: bool = False) -> None:
    """Create ``run_dir`` (and the shared root) if missing, with its run marker, and check it.

    The marker (:data:`RUN_MARKER_NAME`) is what lets ``rollout-bundle sweep`` and
    :func:`release_run_media` tell a run media directory from any other directory under the root.
    It is written when this call creates the directory, when it adopts an empty one, and with
    ``ensure_marker`` (a lease starting) where a lease naming the directory is its only proof.
    An existing directory without either proof that holds anything is refused
    (:class:`UnsafeRunDirError`), and nothing is written into it: the run did not make it, and its
    teardown would delete it.
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    created = False
    with suppress(FileExistsError):
        run_dir.mkdir(mode=RUN_DIR_MODE)
        created = True
    st = _check_run_dir(run_dir.parent, run_dir)
    key = (st.st_dev, st.st_ino) if st is not None else None
    if created:
        _write_run_marker(run_dir)
        _PROVEN.add(key)
        return
    if key in _PROVEN and not ensure_marker:
        return  # proven in this process already: no marker read per screenshot
    if read_run_marker(run_dir) is not None:
        _PROVEN.add(key)
        return
    if _lease_names(run_dir):
        if ensure_marker:
            _write_run_marker(run_dir)
        return
    found = _entries_not_ours(run_dir)
    if found and read_run_marker(run_dir) is not None:
        # Written since it was read above, by another thread or process of this run that made
        # the directory (a resume placing media while the rollout worker stores its first
        # screenshot): what the listing shows came after a marker that names this directory.
        _PROVEN.add(key)
        return
    if found:
        shown = ", ".join(bounded_repr(name, 40) for name in found[:_SHOWN_ENTRIES])
        more = f" and {len(found) - _SHOWN_ENTRIES} more" if len(found) > _SHOWN_ENTRIES else ""
        raise UnsafeRunDirError(
            f"{run_dir}: exists and is not a run media directory (no {RUN_MARKER_NAME} marker and no lease "
            f"naming it; it holds {shown}{more}): refusing to use it, since a run deletes its media "
            "directory at teardown; choose another --run-uuid or --shared-media-dir"
        )
    _write_run_marker(run_dir)  # empty (or only a marker being written by another process): ours
    _PROVEN.add(key)


# Run directories (device, inode) this process created or found marked: store_media skips reading
# the marker again for them (it would cost each screenshot an open and a parse). Only the refusal
# to write into a foreign directory uses it; a deletion always reads the proof again.
_PROVEN: set[tuple[int, int] | None] = set()
# Entries of a foreign directory a refusal names.
_SHOWN_ENTRIES = 3


def _entries_not_ours(run_dir: Path) -> list[str]:
    """Names in ``run_dir`` other than the temporaries of a marker or lease being written (a
    process of the same run creating the directory at the same moment), sorted; at most a few
    more than a refusal shows."""
    ours = (f".{RUN_MARKER_NAME}.", f".{LEASE_NAME}.")
    found: list[str] = []
    with os.scandir(run_dir) as it:
        for entry in it:
            if not entry.name.startswith(ours):
                found.append(entry.name)
                if len(found) > 100:
                    break
    return sorted(found)


def _lease_names(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a lease (:mod:`._lease` writes it) that names it."""
    return _names_dir(Path(run_dir) / LEASE_NAME, Path(run_dir).name)


def _names_dir(path: Path, run_id: str) -> bool:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(64 * 1024))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("run_id") == run_id


def is_run_dir(run_dir: Path) -> bool:
    """Whether ``run_dir`` proves it is a run media directory: its marker, or a lease naming it
    (what ``sweep`` and :func:`release_run_media` ask before deleting)."""
    return read_run_marker(run_dir) is not None or _lease_names(run_dir)


def _write_run_marker(run_dir: Path) -> None:
    record = {"marker_version": 1, "run_id": run_dir.name, "created_at": time.time(), "pid": os.getpid()}
    # The one atomic write (bundles.support); the run directory is removed as a whole, leftovers
    # of a killed writer included, so no sweep of its thousands of files.
    atomic_write(run_dir / RUN_MARKER_NAME, json.dumps(record, sort_keys=True), sweep=False)


def read_run_marker(run_dir: Path) -> dict[str, Any] | None:
    """The run marker of ``run_dir`` when it is there and names this directory, else None."""
    try:
        with open(Path(run_dir) / RUN_MARKER_NAME, "rb") as f:
            data = json.loads(f.read(64 * 1024))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("run_id") != Path(run_dir).name:
        return None
    return data


def _check_run_dir(shared: Path, run_dir: Path) -> os.stat_result | None:
    """lstat ``run_dir`` and refuse it unless it is a real directory directly inside ``shared``.

    Returns None when it does not exist.
    """
    try:
        st = os.lstat(run_dir)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRunDirError(
            f"{run_dir}: run media directory is a symlink (to {os.readlink(run_dir)!r}); "
            "refusing to use or delete it, or what it points to"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRunDirError(f"{run_dir}: expected a run media directory, found {_kind(st.st_mode)}")
    # Defence in depth: with a checked run id and no symlink this cannot fail, unless a path
    # component is swapped underneath us. A symlinked shared root itself is fine: both sides
    # resolve through it.
    real_shared, real_run = shared.resolve(), run_dir.resolve()
    if real_run.parent != real_shared:
        raise UnsafeRunDirError(
            f"{run_dir}: run media directory resolves to {real_run}, expected a direct child of {real_shared}"
        )
    return st


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a special file"


def _encode_image(image: Any, suffix: str) -> bytes:
    # PIL is imported only here: storing bytes must work without pillow installed.
    from PIL import Image

    Image.init()
    fmt = Image.registered_extensions().get(suffix.lower())
    if fmt is None:
        raise RunMediaError(f"store_media: suffix {suffix!r} names no image format PIL can write")
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def _to_bytes(data: Any, suffix: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    try:
        from PIL import Image
    except ImportError:
        Image = None  # type: ignore[assignment]
    if Image is not None and isinstance(data, Image.Image):
        return _encode_image(data, suffix)
    raise TypeError(f"store_media: expected bytes or a PIL image, found {type(data).__name__}")


def store_media(args: Namespace, data: Any, suffix: str = ".png") -> MediaRef:
    """Store ``data`` (bytes or a PIL image) in the run's media directory; return its reference.

    Args:
        args: parsed arguments with ``shared_media_dir`` and ``run_uuid``.
        data: the file's bytes, or a PIL image, encoded in the format ``suffix`` names.
        suffix: the file extension, e.g. ``".png"``.

    Returns:
        A :class:`bundles.MediaRef` whose ``path`` is the absolute path of the stored file.

    The write is atomic (temporary name, then rename), idempotent for equal content and
    leaves the file read-only. Raises :class:`RunMediaError` when ``--shared-media-dir`` is
    unset.

    Example:
        >>> ref = store_media(args, png_bytes)            # doctest: +SKIP
        >>> ref.filename                                   # doctest: +SKIP
        '9f86d0…08.png'
    """
    payload = _to_bytes(data, suffix)
    probe = MediaRef.from_bytes(payload, suffix)  # validates the suffix before touching disk
    run_dir = ensure_run_dir(args)
    dest = run_dir / probe.filename
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != len(payload):
        _write_atomic(dest, payload)
    return probe.with_path(str(dest.absolute()))


def _write_atomic(dest: Path, payload: bytes) -> None:
    # No fsync: run media are scratch for one run, and whatever must survive a crash is in a
    # bundle, whose commit makes the files it links durable (bundles' Durability). A screenshot
    # cut short by a crash has the wrong size and is rewritten by the next call. Renaming over
    # an existing read-only file works on POSIX (only the directory's permissions matter): two
    # writers of the same content race harmlessly. No sweep: see _write_run_marker.
    atomic_write(dest, payload, mode=MEDIA_FILE_MODE, sweep=False)


def release_run_media(args: Namespace) -> int:
    """Remove the run's media directory and return the bytes freed (0 when there is none).

    Idempotent. Refuses (raising :class:`UnsafeRunDirError`, deleting nothing) a run id that
    is empty or holds ``/``, ``\\`` or ``..``, a run directory that is a symlink or resolves
    outside ``shared_media_dir``, and one without its marker or a lease naming it (a directory no
    run made). Refuses (:class:`RunMediaError`) a directory leased by another run that is alive:
    only the run holding the lease, or a sweep once it is gone, removes it. Never touches another
    run's directory or the shared root.
    """
    run_dir = run_media_dir(args)
    if run_dir is None:
        return 0
    return remove_run_dir(run_dir.parent, run_dir.name)


# Called with the run directory before it is removed; one that raises stops the removal.
# trainer_hooks.run_media._lease registers one that closes this process's lease on it, so that no
# heartbeat writes into a directory being deleted, and refuses a directory another live run holds
# the lease of (the dependency runs that way round: _lease imports this module).
_BEFORE_REMOVE: list[Callable[[Path], None]] = []


def remove_run_dir(shared: Path, run_id: str) -> int:
    """Remove ``shared/run_id`` after the safety checks of :func:`release_run_media`."""
    check_run_id(run_id)
    run_dir = Path(shared) / run_id
    st = _check_run_dir(Path(shared), run_dir)
    if st is None:
        return 0
    _PROVEN.discard((st.st_dev, st.st_ino))  # its inode may name another directory next
    if not is_run_dir(run_dir):
        raise UnsafeRunDirError(
            f"{run_dir}: not a run media directory (no {RUN_MARKER_NAME} marker and no lease naming it): "
            "no run made it, so deleting nothing"
        )
    for hook in _BEFORE_REMOVE:
        hook(run_dir)
    # The marker and a lease go last: a deletion that fails midway leaves a directory that sweep
    # still recognises as a run directory, and retries.
    return remove_tree(run_dir, last=(RUN_MARKER_NAME, LEASE_NAME))


@dataclass
class DirUsage:
    """``total``: apparent bytes of the files under a directory; ``unshared``: the part held by
    files with a single link, i.e. what deleting the directory frees."""

    total: int = 0
    unshared: int = 0
    files: int = 0
    newest_mtime: float = 0.0


def dir_usage(path: Path) -> DirUsage:
    """Walk ``path`` without following symlinks and sum its files' sizes."""
    usage = DirUsage(newest_mtime=os.lstat(path).st_mtime)
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            usage.newest_mtime = max(usage.newest_mtime, st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))
            else:
                usage.files += 1
                usage.total += st.st_size
                if st.st_nlink == 1:
                    usage.unshared += st.st_size
    return usage
