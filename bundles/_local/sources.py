"""Where a bundle's bytes come from: a directory, or a packed file read in place.

The reader sees a bundle through a *source*, which lists its entries, reads the manifest under
its size cap, and opens one member as a bounded binary file. :class:`DirSource` is a bundle
directory; :class:`PackedSource` is a packed bundle (an uncompressed tar, see docs/FORMAT.md §7)
read by member offsets, with no extraction and no temporary copy.

A packed file is indexed once, when it is opened, by :func:`read_tar_index`: the one
implementation of the rules for tar members, which ``unpack_bundle`` uses too. Every header is
checked before any member's bytes are read or written: names must be ones the layout allows
(no absolute names, no ``.``/``..`` parts, no backslashes), members must be regular files or the
two layout directories (no links, devices, FIFOs or sparse files), no name may appear twice, the
manifest must fit its cap, every member's data must lie inside the file, and the archive must end
with its end-of-archive blocks followed by nothing but zeros (so a truncated file, or a second
archive hidden after the first, is refused rather than read as whatever prefix parses).

A :class:`PackedSource` keeps its file open and reads with ``pread`` at the recorded offsets: a
packed file replaced on disk while open (``pack --force`` renames a new file into place) is never
read as a mix of two files; the open bundle keeps reading the file it indexed. Member reads are
thread-safe (no shared file position). Call ``close()`` (or use the bundle as a context manager)
to release the descriptor early; it is closed when the object is collected otherwise.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
import weakref
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

if TYPE_CHECKING:
    from bundles._format.media import MediaRef
    from bundles._urls import StoreURL

LAYOUT_DIRS = (MEDIA_DIR, SHARDS_DIR)
_BLOCK = tarfile.BLOCKSIZE
# Headers (ustar, and the pax/GNU extensions tarfile understands) are read through a file that
# refuses any single read above this: an extended header declaring gigabytes is not buffered.
_MAX_HEADER_READ = 1024 * 1024
_REGULAR_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
_TYPE_NAMES = {
    tarfile.SYMTYPE: "a symlink",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}


@dataclass(frozen=True)
class Entry:
    """One entry of a bundle: ``name`` relative to the bundle, ``kind`` ``"file"``, ``"dir"`` or a
    description of anything else (``"a symlink"``), ``size`` in bytes for files. ``kind``
    ``"unlistable"`` is a directory that could not be listed (``error`` says why, e.g.
    ``Permission denied``): its files are unknown, not missing."""

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
        return str(self.path / name)

    def read_manifest(self) -> bytes:
        mpath = self.path / MANIFEST_NAME
        try:
            f, size = self.open(MANIFEST_NAME)
        except FileNotFoundError:
            raise BundleNotFoundError(f"{self.path}: not a bundle: {MANIFEST_NAME} is missing") from None
        with f:
            if size > MAX_MANIFEST_BYTES:
                raise UnsafeBundleError(
                    f"{mpath}: {size} bytes exceeds the manifest cap of {MAX_MANIFEST_BYTES}"
                )
            raw = f.read(size + 1)  # not the cap: an unbuffered read allocates what it is asked for
        if len(raw) > MAX_MANIFEST_BYTES:
            raise UnsafeBundleError(f"{mpath}: exceeds the manifest cap of {MAX_MANIFEST_BYTES} bytes")
        return raw

    def entries(self) -> Iterator[Entry]:
        """Every entry below the bundle directory, by ``lstat`` (links are not followed); the
        contents of directories other than the two of the layout are not listed. A directory
        that cannot be listed is an ``"unlistable"`` entry, not a silent gap (``os.walk`` skips
        it by default, and its files would read as missing)."""
        failed: list[OSError] = []
        for root, dirs, files in os.walk(self.path, onerror=failed.append):
            rel_root = os.path.relpath(root, self.path)
            for name in dirs + files:
                rel = name if rel_root == "." else f"{rel_root}/{name}"
                try:
                    st = os.lstat(os.path.join(root, name))
                except FileNotFoundError:
                    continue  # vanished while listing
                kind = kind_of(st.st_mode)
                if kind == "dir" and rel not in LAYOUT_DIRS:
                    dirs.remove(name)
                yield Entry(rel, kind, st.st_size if kind == "file" else 0)
            while failed:
                yield self._unlistable(failed.pop())
        while failed:
            yield self._unlistable(failed.pop())

    def _unlistable(self, e: OSError) -> Entry:
        rel = os.path.relpath(os.fspath(e.filename), self.path) if e.filename is not None else "."
        return Entry(rel, "unlistable", 0, e.strerror or str(e))

    def open(self, name: str) -> tuple[BinaryIO, int]:
        """Open one regular file of the bundle; return it and its size.

        Raises FileNotFoundError when it is missing and :class:`UnsafeBundleError` when it is a
        link or a special file (see :func:`open_regular_file`).
        """
        path = self.path / name
        try:
            return open_regular_file(name, root=self.path)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "listed in the manifest but missing", str(path)) from None
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


# -- packed files --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Member:
    """One member of a packed bundle: where its data starts in the file, and its size."""

    name: str
    is_dir: bool
    offset: int
    size: int


class WindowFile(io.RawIOBase):
    """A read-only, seekable binary file over ``size`` bytes of something larger (a member of a
    packed file, a range of an object): position and seeking; subclasses read."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos


class MemberFile(WindowFile):
    """A read-only binary file over ``size`` bytes at ``offset`` of the packed file ``source``.

    Reads use ``pread`` on the source's descriptor, so many of these can share it across threads.
    The file holds its source, so the descriptor stays open while the file is in use even when
    the ``Bundle`` it came from is gone (``open_bundle(p).open_media(ref)``), and it reads the
    descriptor anew on each read: after the source is closed a read raises instead of reading
    whatever file the number was reused for. Reaching the end of the underlying file before
    ``size`` bytes raises :class:`UnsafeBundleError` (the packed file was truncated after it was
    indexed).
    """

    def __init__(self, source: PackedSource | _Descriptor, offset: int, size: int, where: str) -> None:
        super().__init__(size)
        self._source = source
        self._offset = offset
        self._where = where

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        view = memoryview(b).cast("B")[:n]
        fd = self._source.fd
        if fd < 0:
            raise BundleError(f"{self._where}: cannot read: the bundle was closed")
        try:
            if hasattr(os, "preadv"):
                got = os.preadv(fd, [view], self._offset + self._pos)
            else:  # pragma: no cover - platforms without preadv
                data = os.pread(fd, n, self._offset + self._pos)
                got = len(data)
                view[:got] = data
        except OSError as e:
            raise BundleIOError.wrap(self._where, "read", e) from e
        if got == 0:
            raise UnsafeBundleError(
                f"{self._where}: truncated: the packed file ends {self._size - self._pos} bytes before this member does"
            )
        self._pos += got
        return got


class _FdReader:
    """Positioned reads of a local file: what :func:`read_tar_index` reads through (an object on
    a store gives the same two members, see :mod:`bundles._store`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size

    def pread(self, n: int, pos: int) -> bytes:
        return os.pread(self.fd, n, pos)


class _HeaderFile:
    """The file object tarfile reads headers through: positioned reads, each capped at
    ``_MAX_HEADER_READ`` (tarfile seeks over member data; it only reads headers)."""

    def __init__(self, reader: Any, where: Path | str) -> None:
        self._reader = reader
        self._pos = 0
        self._where = where

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > _MAX_HEADER_READ:
            raise UnsafeBundleError(
                f"{self._where}: a tar header at offset {self._pos} declares an extended header of {n} bytes; "
                f"more than {_MAX_HEADER_READ} is refused"
            )
        data = self._reader.pread(n, self._pos)
        self._pos += len(data)
        return data

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            pos += self._pos
        elif whence == io.SEEK_END:
            pos += self._reader.size
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos


def _type_name(info: tarfile.TarInfo) -> str:
    return _TYPE_NAMES.get(info.type, f"tar member type {info.type!r}")


def check_member(info: tarfile.TarInfo, where: Path | str, seen: set[str], file_size: int) -> Member:
    """Check one tar header against the rules of docs/FORMAT.md §7; return the member it describes.

    The single implementation used by ``unpack_bundle`` and by the in-place reader.
    """
    name = info.name
    label = f"{where}: member {name!r}"
    if name.startswith("/") or "\\" in name:
        raise UnsafeBundleError(f"{label}: absolute names are refused")
    parts = name.split("/")
    if ".." in parts or "." in parts or "" in parts:
        raise UnsafeBundleError(f"{label}: names with '..', '.' or empty parts are refused")
    if not layout_name_ok(name):
        raise UnsafeBundleError(f"{label}: not a name the bundle layout allows")
    if name in seen:
        raise UnsafeBundleError(f"{label}: appears twice")
    seen.add(name)
    if info.type == tarfile.DIRTYPE:
        if name not in LAYOUT_DIRS:
            raise UnsafeBundleError(f"{label}: expected a regular file, found a directory")
        return Member(name, True, info.offset_data, 0)
    if info.type not in _REGULAR_TYPES or info.sparse is not None:
        what = "a sparse file" if info.sparse is not None else _type_name(info)
        raise UnsafeBundleError(
            f"{label}: expected a regular file, found {what}; links, sparse and special files are refused"
        )
    if name in LAYOUT_DIRS:
        raise UnsafeBundleError(f"{label}: expected the directory {name}/, found a regular file")
    if name == MANIFEST_NAME and info.size > MAX_MANIFEST_BYTES:
        raise UnsafeBundleError(
            f"{label}: {info.size} bytes exceeds the manifest cap of {MAX_MANIFEST_BYTES}"
        )
    if info.offset_data + info.size > file_size:
        raise UnsafeBundleError(
            f"{label}: truncated: its {info.size} bytes at offset {info.offset_data} end past the end of the "
            f"file ({file_size} bytes)"
        )
    return Member(name, False, info.offset_data, info.size)


# What ``torch.save`` writes: a zip archive whose first member is ``<name>/data.pkl`` (torch >=
# 1.6), or a pickle (protocol 2+, older torch and ``_use_new_zipfile_serialization=False``).
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def _legacy_hint(fd: Any, where: Path | str) -> str:
    """A hint for a file that looks like a ``torch.save`` dump (the debug dumps written before
    bundles): ``rollout-bundle import-dump`` converts those. Empty for anything else."""
    try:  # a descriptor, or a remote reader with pread(n, pos)
        head = os.pread(fd, 256, 0) if isinstance(fd, int) else bytes(fd.pread(256, 0))
    except Exception:  # only a hint: whatever the read raises, the main error stands
        return ""
    torch_zip = head.startswith(b"PK\x03\x04") and b"data.pkl" in head
    if not (torch_zip or head.startswith(_PICKLE_MAGIC)):
        return ""
    return (
        f"; it looks like a torch.save file (a debug dump from before bundles?): convert it with "
        f"`rollout-bundle import-dump {where} -o {os.path.splitext(str(where))[0]}.rbundle`"
    )


def read_tar_index(fd: Any, where: Path | str) -> dict[str, Member]:
    """Index the packed bundle open at ``fd`` (a descriptor, or an object with ``size`` and
    ``pread(n, pos)``): every member checked (see :func:`check_member`), in archive order, before
    any member's data is read.

    Raises:
        UnsafeBundleError: the file is not a well-formed tar, is truncated, or holds a member the
            rules refuse; the message names the file and the member.
    """
    reader = _FdReader(fd) if isinstance(fd, int) else fd
    file_size = reader.size
    members: dict[str, Member] = {}
    seen: set[str] = set()
    end = 0
    try:
        header_file: Any = _HeaderFile(reader, where)
        tar = tarfile.TarFile(fileobj=header_file, mode="r", encoding="utf-8", errors="surrogateescape")
        while True:
            info = tar.next()
            if info is None:
                break
            tar.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every header; the index keeps only what it needs
            m = check_member(info, where, seen, file_size)
            members[m.name] = m
            end = m.offset + -(-m.size // _BLOCK) * _BLOCK
    except UnsafeBundleError:
        raise
    except (
        Exception
    ) as e:  # tarfile raises ReadError, but also ValueError, UnicodeError, EOFError on hostile headers
        raise UnsafeBundleError(
            f"{where}: not a packed bundle (uncompressed tar): {type(e).__name__}: {e}{_legacy_hint(fd, where)}"
        ) from None
    if not members:
        raise UnsafeBundleError(f"{where}: not a packed bundle: the archive holds no members")
    _check_archive_end(reader, where, end, file_size)
    return members


def _check_archive_end(reader: Any, where: Path | str, end: int, file_size: int) -> None:
    """After the last member: at least the two zero blocks that end a tar, then only zeros."""
    if file_size - end < 2 * _BLOCK:
        raise UnsafeBundleError(
            f"{where}: truncated: the archive's end-of-archive blocks are missing after offset {end} "
            f"(the file has {file_size} bytes)"
        )
    pos = end
    while pos < file_size:
        chunk = reader.pread(min(1024 * 1024, file_size - pos), pos)
        if not chunk:
            break
        if chunk.count(0) != len(chunk):
            first = pos + next(i for i, b in enumerate(chunk) if b)
            raise UnsafeBundleError(
                f"{where}: unexpected data at offset {first}, after the archive's last member ending at {end} "
                "(a malformed header, or data appended after the end of the archive)"
            )
        pos += len(chunk)


class PackedMembers:
    """What both packed sources (this module's file, a packed object on a store) answer from the
    archive's index, ``members`` (:func:`read_tar_index`): names, entries, and the one lookup of
    a member before it is opened."""

    path: Path | StoreURL
    members: dict[str, Member]

    def where(self, name: str) -> str:
        return f"{self.path}/{name}"

    def media_path(self, name: str) -> str:
        """Where a member is, as a name: ``<packed file>/<member>``. It names the member inside the
        packed file and cannot be opened as a file; read it with ``Bundle.open_media``."""
        return self.where(name)

    def entries(self) -> Iterator[Entry]:
        for m in self.members.values():
            yield Entry(m.name, "dir" if m.is_dir else "file", m.size)

    def member(self, name: str) -> Member:
        """The regular member ``name``: ``FileNotFoundError`` when the archive has none, a
        directory is :class:`UnsafeBundleError`."""
        m = self.members.get(name)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, "listed in the manifest but missing", self.where(name))
        if m.is_dir:
            raise UnsafeBundleError(f"{self.where(name)}: expected a regular file, found a directory")
        return m


class PackedSource(PackedMembers):
    """A packed bundle read in place (see the module docstring)."""

    path: Path
    packed = True
    remote = False
    description = "packed file"

    def __init__(self, path: Path) -> None:
        self.path = path
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise BundleNotFoundError(f"{path}: no bundle here (path does not exist)") from None
        except OSError as e:
            raise BundleIOError.wrap(path, "open the packed bundle", e) from e
        self._fd = fd
        self._closer = weakref.finalize(self, os.close, fd)
        self._detached: _Descriptor | None = None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeBundleError(
                    f"{path}: expected a packed bundle file, found {describe(kind_of(st.st_mode))}"
                )
            self.members = read_tar_index(fd, path)
        except BaseException:
            self.close()
            raise

    @property
    def fd(self) -> int:
        """The packed file's descriptor; -1 once closed."""
        return self._fd

    def read_manifest(self) -> bytes:
        try:
            f, _ = self.open(MANIFEST_NAME)
        except FileNotFoundError:
            raise BundleNotFoundError(
                f"{self.path}: not a bundle: the packed file holds no {MANIFEST_NAME}"
            ) from None
        with f:
            return f.read()  # the index capped its size

    def open(self, name: str) -> tuple[BinaryIO, int]:
        m = self.member(name)
        if self._fd < 0:
            raise BundleError(f"{self.path}: the bundle was closed")
        return MemberFile(self, m.offset, m.size, self.where(name)), m.size  # type: ignore[return-value]

    def open_detached(self, name: str) -> BinaryIO:
        """``open(name)``, for a reader that outlives the bundle: a PIL image of a sample decodes
        its pixels whenever its user asks, perhaps after :meth:`close`.

        Such files read through one duplicate of the descriptor, shared by all of them and
        closed when the last one is collected: the same file the index was read from (a file
        renamed over the path since is never read), no copy of the member in memory, and one
        descriptor however many images. ``close()`` releases the bundle's own descriptor at
        once; the duplicate stays open while detached files still exist.
        """
        m = self.members.get(name)
        if m is None or m.is_dir:
            return self.open(name)[0]  # the same errors
        if self._fd < 0:
            raise BundleError(f"{self.path}: the bundle was closed")
        if self._detached is None:
            self._detached = _Descriptor(os.dup(self._fd))
        return MemberFile(self._detached, m.offset, m.size, self.where(name))  # type: ignore[return-value]

    def open_image(self, name: str) -> BinaryIO:
        return self.open_detached(name)  # by member range: no copy of the member in memory

    def media_dir(self) -> Path | None:
        return None  # members of one file

    def reread_manifest(self) -> bytes:
        return self.read_manifest()  # the file opened: a rename over its path is never read

    def stored_size(self) -> int | None:
        if self._fd < 0:
            raise BundleError(f"{self.path}: the bundle was closed")
        return os.fstat(self._fd).st_size

    def hash(self, name: str) -> tuple[str, int]:
        f, _ = self.open(name)
        with f:
            return sha256_stream(f)

    def close(self) -> None:
        self._closer()
        self._fd = -1
        self._detached = None  # detached files keep it open while they exist


class _Descriptor:
    """A file descriptor closed when the last object holding this is collected."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        weakref.finalize(self, os.close, fd)


@runtime_checkable
class Source(Protocol):
    """What a :class:`~bundles._local.reader.Bundle` reads through: :class:`DirSource` and
    :class:`PackedSource` here, ``StoreSource`` and ``StorePackedSource`` in :mod:`bundles._store`.

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
