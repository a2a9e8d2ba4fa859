"""A packed bundle (an uncompressed tar, docs/FORMAT.md §7) read in place: :class:`PackedSource`.

A packed file is indexed once, when it is opened, by :func:`read_tar_index`: the one
implementation of the rules for tar members, which ``unpack_bundle`` uses too. Every header is
checked before any member's bytes are used or written (the manifest, when it is the first
member as ``pack`` writes it, is parsed as soon as its own header passed, so that the media
members after it are indexed by its entry numbers, but nothing of it is used before the last
header passed: see :func:`read_tar_index`): names must be ones the layout allows
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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from bundles._errors import BundleError, BundleIOError, BundleNotFoundError, UnsafeBundleError
from bundles._format.layout import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
)
from bundles._format.manifest import Manifest, parse_manifest_file
from bundles._format.media import sha256_stream
from bundles._local.memberindex import Member, MemberIndex, Seen, SeenNames
from bundles._local.sources import LAYOUT_DIRS, Entry, describe, kind_of, layout_name_ok

if TYPE_CHECKING:
    from bundles._urls import StoreURL

_BLOCK = tarfile.BLOCKSIZE
# Headers (ustar, and the pax/GNU extensions tarfile understands) are read through a file that
# refuses any single read above this: an extended header declaring gigabytes is not buffered.
_MAX_HEADER_READ = 1024 * 1024
#: The read size of a packed manifest on a store (each a range request; the parser's window is
#: 64 KiB): held while the manifest is parsed, not the whole member.
MANIFEST_WINDOW = 1024 * 1024
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

    def __init__(
        self, source: PackedSource | _Descriptor | _FdReader, offset: int, size: int, where: str
    ) -> None:
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

    def open_member(self, offset: int, size: int, where: str) -> BinaryIO:
        """A file over ``size`` bytes at ``offset`` (the manifest, parsed as it is met)."""
        return MemberFile(self, offset, size, where)  # type: ignore[return-value]


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


def check_member(info: tarfile.TarInfo, where: Path | str, seen: Seen, file_size: int) -> Member:
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


def read_tar_index(fd: Any, where: Path | str, manifest_first: bool = True) -> MemberIndex:
    """Index the packed bundle open at ``fd`` (a descriptor, or an object with ``size`` and
    ``pread(n, pos)``): every member checked (see :func:`check_member`), in archive order, before
    any member's data is used.

    One member's data is read before the others' headers are: where the first member is the
    manifest (``pack``'s order) and ``manifest_first`` (the reader also has
    ``open_member(offset, size, where)``), it is parsed as soon as its header passed, so that the
    media members after it are held by the manifest's entry numbers (:meth:`MemberIndex.by_entry`:
    16 bytes a file, not 52). Nothing of it is used before the whole archive passed, other than
    to tell which entry a checked member's name is: every rule below applies as to any archive,
    a header the rules refuse is refused whatever the manifest says, and the parsed manifest is
    handed to the reader (:meth:`MemberIndex.take_manifest`) only once the index is complete. A
    manifest that does not parse leaves the index by name, and is parsed again (and refused,
    naming its problem) by :func:`bundles._local.reader.load_manifest` after the index: the
    archive's problems come first, as when the manifest was read after the index.

    Raises:
        UnsafeBundleError: the file is not a well-formed tar, is truncated, or holds a member the
            rules refuse; the message names the file and the member.
    """
    reader = _FdReader(fd) if isinstance(fd, int) else fd
    file_size = reader.size
    members = MemberIndex()
    seen = SeenNames(members)
    end = 0
    try:
        header_file: Any = _HeaderFile(reader, where)
        tar = tarfile.TarFile(fileobj=header_file, mode="r", encoding="utf-8", errors="surrogateescape")
        while True:
            info = tar.next()
            if info is None:
                break
            tar.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every header; the index keeps only what it needs
            first = not members
            m = check_member(info, where, seen, file_size)
            members.add(m)
            end = m.offset + -(-m.size // _BLOCK) * _BLOCK
            if first and manifest_first and m.name == MANIFEST_NAME and not m.is_dir:
                manifest = _parse_first_manifest(reader, m, where)
                if manifest is not None:
                    members.by_entry(manifest)
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
    return members.finish()


def _parse_first_manifest(reader: Any, m: Member, where: Path | str) -> Manifest | None:
    """The manifest member ``m`` (its header checked, its size under the cap), parsed for
    :func:`read_tar_index`; None when the reader cannot open a member, or when the parse fails
    in any way: ``load_manifest`` parses it again after the index and raises then, as it did
    when nothing was parsed before the index (a broken manifest is parsed twice; the same
    error, of the same type, is raised, after the archive's own)."""
    open_member = getattr(reader, "open_member", None)
    if open_member is None:
        return None
    label = f"{where}/{MANIFEST_NAME}"
    try:
        with open_member(m.offset, m.size, label) as f:
            return parse_manifest_file(f, label)
    except Exception:
        return None


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
    members: MemberIndex

    def where(self, name: str) -> str:
        return f"{self.path}/{name}"

    def media_path(self, name: str) -> str:
        """Where a member is, as a name: ``<packed file>/<member>``. It names the member inside the
        packed file and cannot be opened as a file; read it with ``Bundle.open_media``."""
        return self.where(name)

    def entries(self) -> Iterator[Entry]:
        for m in self.members.values():
            yield Entry(m.name, "dir" if m.is_dir else "file", m.size)

    def open_manifest(self) -> BinaryIO:
        """The manifest member, open (its size under the cap: :func:`check_member` refused a
        larger one); the reader parses it a window at a time from the member's range, never as
        one ``bytes`` (issue 39, item 6: ~11 MB at 100,000 media files)."""
        try:
            return self.open(MANIFEST_NAME, window=MANIFEST_WINDOW)[0]
        except FileNotFoundError:
            raise BundleNotFoundError(
                f"{self.path}: not a bundle: the packed file holds no {MANIFEST_NAME}"
            ) from None

    def open(self, name: str, window: int | None = None) -> tuple[BinaryIO, int]:
        raise NotImplementedError

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
        with self.open_manifest() as f:
            return f.read()  # the index capped its size

    def open(self, name: str, window: int | None = None) -> tuple[BinaryIO, int]:
        """The member ``name``, read by ``pread`` as asked (``window``: the store's read size,
        nothing to do here)."""
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
