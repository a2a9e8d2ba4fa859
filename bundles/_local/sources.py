"""Where a bundle's bytes come from: the :class:`Source` interface, and a bundle directory.

The reader sees a bundle through a *source*, which lists its entries, reads the manifest under
its size cap, and opens one member as a bounded binary file. :class:`DirSource` is a bundle
directory; :class:`~bundles._local.archive.PackedSource` a packed bundle read in place
(:mod:`bundles._local.archive`); the store half's ``StoreSource`` a bundle on an object store,
read in place (:class:`RemoteSource` is the part of the interface only a store's source adds).
Here too the rules for the names a layout allows (:func:`layout_name_ok`, :func:`media_name_ok`)
and the one way to open a regular file below a root without following a link
(:func:`open_regular_file`).
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, runtime_checkable

from bundles._errors import BundleError, BundleIOError, BundleNotFoundError, UnsafeBundleError
from bundles._format.images import ReopeningFile
from bundles._format.layout import (
    DIGEST_RE,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    SHARD_PATH_RE,
    SHARDS_DIR,
    SUFFIX_RE,
)
from bundles._format.media import sha256_stream
from bundles._local.faults import fault_point

if TYPE_CHECKING:
    from bundles._format.media import MediaRef
    from bundles._urls import StoreURL

LAYOUT_DIRS = (MEDIA_DIR, SHARDS_DIR)


@dataclass(frozen=True)
class Entry:
    """One entry of a bundle: ``name`` relative to the bundle, ``kind`` ``"file"``, ``"dir"`` or a
    description of anything else (``"a symlink"``), ``size`` in bytes for files. ``kind``
    ``"unlistable"`` is a directory that could not be listed (``error`` says why, e.g.
    ``Permission denied``): its files are unknown, not missing. ``"stray"`` is an object a reader
    never reads that sits where a bundle's file could be mistaken for it (a store generation's own
    ``media/``): ``name`` is its whole URL, ``error`` says why it is a problem; it never counts as
    one of the bundle's files."""

    name: str
    kind: str
    size: int
    error: str | None = None


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def describe(kind: str) -> str:
    return {"file": "a regular file", "dir": "a directory"}.get(kind, kind)


def layout_name_ok(name: str) -> bool:
    """True for the names a bundle's layout allows: the manifest, the two directories, a shard,
    or ``media/<64 hex><suffix>``."""
    if name in (MANIFEST_NAME, MEDIA_DIR, SHARDS_DIR) or SHARD_PATH_RE.fullmatch(name):
        return True
    parts = name.split("/")
    return len(parts) == 2 and parts[0] == MEDIA_DIR and media_name_ok(parts[1])


def media_name_ok(name: str) -> bool:
    """True for a content-addressed media file name, ``<64 lowercase hex><suffix>`` (a suffix of
    at most three ``.part`` s of letters, digits, ``_`` and ``-``): the one rule for the names a
    bundle's ``media/`` (and any store of media named by digest) may hold. Such a name has no
    path separator and no ``..`` by construction, so ``root / name`` is always inside ``root``."""
    digest, dot, suffix = name.partition(".")
    return bool(DIGEST_RE.fullmatch("sha256:" + digest) and SUFFIX_RE.fullmatch(dot + suffix))


_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_below(root: str | os.PathLike[str], rel: str) -> int:
    """The descriptor of ``root/rel`` opened one component at a time through directory
    descriptors (``openat``), none of them through a symlink: ``O_NOFOLLOW`` alone stops only
    at the last component, so ``media -> /elsewhere`` would otherwise be read through. ``root``
    itself is opened as named (the user named it)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise UnsafeBundleError(f"{root}/{rel}: not a path below {root}")
    fd = os.open(root, _DIR_FLAGS)
    try:
        fault_point("read.root-opened", root, rel)  # an overwrite may swap the directory now
        for k, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, _DIR_FLAGS | getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    try:
                        st = os.lstat(part, dir_fd=fd)
                    except OSError:
                        st = None
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        where = f"{root}/{'/'.join(parts[: k + 1])}"
                        raise UnsafeBundleError(f"{where}: expected a directory, found a symlink") from None
                raise
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], _OPEN_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def open_regular_file(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> tuple[BinaryIO, int]:
    """Open ``path`` for reading if it is a regular file; return the file (unbuffered) and its size.

    The one way this project opens a file it did not write itself (a bundle's members, a rollout
    journal's segments and media): ``O_NOFOLLOW`` refuses a symlink as the last component,
    ``O_NONBLOCK`` keeps a FIFO from blocking the open, and the type is checked on the opened
    descriptor (``fstat``), so nothing can be swapped in between. With ``root``, ``path`` is a
    relative path below it (a bundle's ``media/<name>``) and every component below ``root`` is
    opened without following a symlink (``openat`` through directory descriptors): a bundle whose
    ``media/`` or ``samples/`` is a symlink to another directory never reads outside itself.
    Raises FileNotFoundError (``ENOENT``/``ENOTDIR``, as the OS says), :class:`UnsafeBundleError`
    naming the path when it or a directory on the way below ``root`` is a symlink, or it is a
    directory, a FIFO, a socket or a device, and ``OSError`` otherwise.
    """
    shown = path if root is None else f"{root}/{os.fspath(path)}"
    try:
        fd = os.open(path, _OPEN_FLAGS) if root is None else _open_below(root, os.fspath(path))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeBundleError(f"{shown}: expected a regular file, found a symlink") from None
        if e.errno == errno.ENOTDIR:  # a parent is not a directory: missing, as ENOENT is
            raise FileNotFoundError(e.errno, e.strerror, str(shown)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeBundleError(
                f"{shown}: expected a regular file, found {describe(kind_of(st.st_mode))}"
            )
        return os.fdopen(fd, "rb", buffering=0), st.st_size
    except BaseException:
        os.close(fd)
        raise


# -- directories ---------------------------------------------------------------------------------
class DirSource:
    """A bundle directory."""

    packed = False
    remote = False
    description = "directory"

    def __init__(self, root: Path) -> None:
        self.path = root

    def where(self, name: str) -> str:
        return f"{self.path}/{name}"

    def media_path(self, name: str) -> str:
        # Not ``self.path / name``: pathlib interns each component (``sys.intern``), and the
        # interpreter's table of interned strings, resized as 100,000 names come and go, never
        # shrinks (~1 MB more at 100,000 distinct screenshots, traced; issue 39, item 6).
        return os.path.join(self.path, name)

    def open_manifest(self) -> BinaryIO:
        """The manifest file, open, its size under the cap (the parser refuses what is read past
        it: the file may grow); the reader parses it a window at a time (issue 39, item 6)."""
        try:
            f, size = self.open(MANIFEST_NAME)
        except FileNotFoundError:
            raise BundleNotFoundError(f"{self.path}: not a bundle: {MANIFEST_NAME} is missing") from None
        if size > MAX_MANIFEST_BYTES:
            f.close()
            raise UnsafeBundleError(
                f"{self.where(MANIFEST_NAME)}: {size} bytes exceeds the manifest cap of {MAX_MANIFEST_BYTES}"
            )
        return f

    def read_manifest(self) -> bytes:
        with self.open_manifest() as f:
            # an unbuffered read allocates what it is asked for: the size, never past the cap + 1
            raw = f.read(min(os.fstat(f.fileno()).st_size, MAX_MANIFEST_BYTES) + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise UnsafeBundleError(
                f"{self.where(MANIFEST_NAME)}: exceeds the manifest cap of {MAX_MANIFEST_BYTES} bytes"
            )
        return raw

    def entries(self) -> Iterator[Entry]:
        """Every entry below the bundle directory, by ``lstat`` (links are not followed); the
        contents of directories other than the two of the layout are not listed. A directory
        that cannot be listed is an ``"unlistable"`` entry, not a silent gap (``os.walk`` skips
        it by default, and its files would read as missing). Each entry is yielded as
        ``os.scandir`` reads it: no list of a directory's names is held (``os.walk`` makes one,
        ~120 bytes a name: 12 MB for a ``media/`` of 100,000 screenshots; issue 39, item 6)."""
        top = os.fspath(self.path)
        pending = ["."]
        while pending:
            rel_root = pending.pop()
            try:
                listing = os.scandir(top if rel_root == "." else os.path.join(top, rel_root))
            except OSError as e:
                yield self._unlistable(e)
                continue
            with listing:
                while True:
                    try:
                        found = next(listing, None)
                    except OSError as e:  # the directory failed while it was read
                        yield self._unlistable(e)
                        break
                    if found is None:
                        break
                    rel = found.name if rel_root == "." else f"{rel_root}/{found.name}"
                    try:
                        st = found.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # vanished while listing
                    kind = kind_of(st.st_mode)
                    if kind == "dir" and rel in LAYOUT_DIRS:
                        pending.append(rel)
                    yield Entry(rel, kind, st.st_size if kind == "file" else 0)

    def _unlistable(self, e: OSError) -> Entry:
        rel = os.path.relpath(os.fspath(e.filename), self.path) if e.filename is not None else "."
        return Entry(rel, "unlistable", 0, e.strerror or str(e))

    def open(self, name: str) -> tuple[BinaryIO, int]:
        """Open one regular file of the bundle; return it and its size.

        Raises FileNotFoundError when it is missing and :class:`UnsafeBundleError` when it is a
        link or a special file (see :func:`open_regular_file`).
        """
        try:
            return open_regular_file(name, root=self.path)
        except FileNotFoundError:  # the path made only here: no pathlib join a file (media_path)
            path = os.path.join(self.path, name)
            raise FileNotFoundError(errno.ENOENT, "listed in the manifest but missing", path) from None
        except BundleError:
            raise
        except OSError as e:
            raise BundleIOError.wrap(self.path, f"read {name}", e) from e

    def open_detached(self, name: str) -> BinaryIO:
        return self.open(name)[0]  # a file descriptor of its own, valid after close()

    def open_image(self, name: str) -> BinaryIO:
        """A stored image's file that keeps no descriptor between uses (many images of one sample
        would hold many), reopened as :meth:`open` opens it: opened now, so that a missing or
        unsafe file is told here."""
        f = ReopeningFile(str(self.path / name), opener=lambda: self._buffered(name))
        f.open_now()
        return f  # type: ignore[return-value]  # a binary file object

    def _buffered(self, name: str) -> BinaryIO:
        raw: Any = self.open(name)[0]  # an unbuffered FileIO: buffered as open(path, "rb") is
        return io.BufferedReader(raw)

    def media_dir(self) -> Path | None:
        return self.path / MEDIA_DIR

    def reread_manifest(self) -> bytes:
        return self.read_manifest()  # the directory at the path now

    def stored_size(self) -> int | None:
        return None

    def hash(self, name: str) -> tuple[str, int]:
        f, _ = self.open(name)
        with f:
            return sha256_stream(f)

    def close(self) -> None:
        pass


@runtime_checkable
class Source(Protocol):
    """What a :class:`~bundles._local.reader.Bundle` reads through: :class:`DirSource` and
    :class:`~bundles._local.archive.PackedSource`; ``StoreSource`` and ``StorePackedSource`` in
    :mod:`bundles._store`.

    Names are bundle-relative (``manifest.json``, ``samples/000000.msgpack.zst``,
    ``media/<hex><suffix>``). ``packed``: members can only be copied out, never linked.
    ``remote``: the bytes come over a network; such a source is also a :class:`RemoteSource`.
    """

    @property
    def path(self) -> Path | StoreURL: ...
    @property
    def packed(self) -> bool: ...
    @property
    def remote(self) -> bool: ...
    @property
    def description(self) -> str:
        """What kind of location this is, in words (``"directory"``, ``"packed file"``, ...)."""
        ...

    def media_dir(self) -> Path | None:
        """The local directory holding the stored media as plain files; None where they are
        members of a packed file or objects on a store."""
        ...

    def open_image(self, name: str) -> BinaryIO:
        """A stored file for an image that decodes its pixels later, perhaps after :meth:`close`:
        a file, a packed member by range, a store object fetched whole (one request, not one
        per block the decoder reads)."""
        ...

    def where(self, name: str) -> str:
        """Where ``name`` lives, for messages (a path, a member, a URL)."""
        ...

    def media_path(self, name: str) -> str:
        """The path a sample's reference to the stored file ``name`` is rewritten to."""
        ...

    def read_manifest(self) -> bytes: ...

    def reread_manifest(self) -> bytes:
        """The manifest as the location holds it now (it may have been replaced since it was
        opened): tells a bundle swapped by another writer from a damaged one."""
        ...

    def entries(self) -> Iterator[Entry]: ...

    def open(self, name: str) -> tuple[BinaryIO, int]:
        """One stored file and its size; ``FileNotFoundError`` when missing."""
        ...

    def open_detached(self, name: str) -> BinaryIO:
        """``open(name)`` for a reader that may outlive :meth:`close` (an image decoded later)."""
        ...

    def hash(self, name: str) -> tuple[str, int]: ...

    def stored_size(self) -> int | None:
        """The size of the one file or object a packed source reads; None for many files."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RemoteSource(Source, Protocol):
    """A source on an object store: rehydrating downloads its media concurrently."""

    def rehydrate(
        self, media: Mapping[str, MediaRef], target: Path, progress: bool | None
    ) -> dict[str, MediaRef]: ...
