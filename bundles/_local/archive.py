"""A packed bundle (an uncompressed tar, docs/FORMAT.md §7) read in place: :class:`PackedSource`.

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
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from bundles._errors import BundleError, BundleIOError, BundleNotFoundError, UnsafeBundleError
from bundles._format.layout import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
)
from bundles._format.media import sha256_stream
from bundles._local.sources import LAYOUT_DIRS, Entry, describe, kind_of, layout_name_ok, media_name_ok

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


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a packed bundle: where its data starts in the file, and its size."""

    name: str
    is_dir: bool
    offset: int
    size: int


_MEDIA = MEDIA_DIR + "/"


def _media_key(name: str) -> tuple[bytes, str] | None:
    """``media/<64 lowercase hex><suffix>`` as (32 raw bytes, suffix); None for any other name."""
    if not name.startswith(_MEDIA) or not media_name_ok(name[len(_MEDIA) :]):
        return None
    return bytes.fromhex(name[len(_MEDIA) : len(_MEDIA) + 64]), name[len(_MEDIA) + 64 :]


class MemberIndex(Mapping[str, Member]):
    """A packed file's members by name, as :func:`read_tar_index` read them (its order).

    The media members, one per distinct media file, are held in columns (issue 39, item 6): a
    digest as 32 raw bytes, an offset and a size, a suffix by number, ~52 bytes a member where a
    dict of :class:`Member` objects and their names held ~290 (29 MB at 100,000 screenshots). A
    lookup is a binary search over (digest, suffix), in the archive's order when it is sorted
    (``pack`` writes them so), else through an order built once the index is read. The
    other members (the manifest, the two directories, the shards) are a dict. A ``Member`` is
    built when asked for.
    """

    def __init__(self) -> None:
        self._named: dict[str, Member] = {}
        self._media_at = -1  # how many named members came before the first media member
        self._digests = bytearray()
        self._suffix = array("I")
        self._suffixes: list[str] = []
        self._suffix_ids: dict[str, int] = {}
        self._offsets = array("q")
        self._sizes = array("q")
        self._order: array[int] | None = None

    def add(self, m: Member) -> None:
        key = None if m.is_dir else _media_key(m.name)
        if key is None:
            self._named[m.name] = m
            return
        if self._media_at < 0:
            self._media_at = len(self._named)
        n = len(self._sizes)
        if self._order is None and n and key <= self._key(n - 1):
            self._order = array("I")  # not in order: sorted in finish()
        sid = self._suffix_ids.setdefault(key[1], len(self._suffixes))
        if sid == len(self._suffixes):
            self._suffixes.append(key[1])
        self._digests += key[0]
        self._suffix.append(sid)
        self._offsets.append(m.offset)
        self._sizes.append(m.size)

    def finish(self) -> MemberIndex:
        if self._order is not None:
            self._order = array("I", sorted(range(len(self._sizes)), key=self._key))
        return self

    def _key(self, i: int) -> tuple[bytes, str]:
        return bytes(self._digests[32 * i : 32 * i + 32]), self._suffixes[self._suffix[i]]

    def _media(self, i: int) -> Member:
        name = f"{_MEDIA}{self._digests[32 * i : 32 * i + 32].hex()}{self._suffixes[self._suffix[i]]}"
        return Member(name, False, self._offsets[i], self._sizes[i])

    def _find(self, key: tuple[bytes, str]) -> int:
        order, n = self._order, len(self._sizes)
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._key(mid if order is None else order[mid]) < key:
                lo = mid + 1
            else:
                hi = mid
        j = -1 if lo >= n else lo if order is None else order[lo]
        return j if j >= 0 and self._key(j) == key else -1

    def __getitem__(self, name: str) -> Member:
        m = self._named.get(name)
        if m is not None:
            return m
        key = _media_key(name)
        i = -1 if key is None else self._find(key)
        if i < 0:
            raise KeyError(name)
        return self._media(i)

    def __iter__(self) -> Iterator[str]:
        return (m.name for m in self.values())

    def values(self) -> Iterator[Member]:  # type: ignore[override]
        """The members in the archive's order (the media ones where the first of them was)."""
        named = list(self._named.values())
        at = len(named) if self._media_at < 0 else self._media_at
        yield from named[:at]
        yield from (self._media(i) for i in range(len(self._sizes)))
        yield from named[at:]

    def __len__(self) -> int:
        return len(self._named) + len(self._sizes)


class _Seen(Protocol):
    def __contains__(self, name: object) -> bool: ...
    def add(self, name: str) -> None: ...


class _SeenNames:
    """The names :func:`read_tar_index` has read, for :func:`check_member`'s "appears twice",
    held as the index itself: while the names come in increasing order (``pack`` writes them
    so), a name after the last cannot be a repeat; the first that is not turns this into a set
    of every name read (a foreign archive's order costs a set while its index is read)."""

    def __init__(self, index: MemberIndex) -> None:
        self._index = index
        self._last: str | None = None
        self._set: set[str] | None = None

    def __contains__(self, name: object) -> bool:
        if self._set is None and (self._last is None or str(name) > self._last):
            return False
        if self._set is None:
            self._set = set(self._index)
        return name in self._set

    def add(self, name: str) -> None:
        if self._set is not None:
            self._set.add(name)
        self._last = name


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


def check_member(info: tarfile.TarInfo, where: Path | str, seen: _Seen, file_size: int) -> Member:
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


def read_tar_index(fd: Any, where: Path | str) -> MemberIndex:
    """Index the packed bundle open at ``fd`` (a descriptor, or an object with ``size`` and
    ``pread(n, pos)``): every member checked (see :func:`check_member`), in archive order, before
    any member's data is read.

    Raises:
        UnsafeBundleError: the file is not a well-formed tar, is truncated, or holds a member the
            rules refuse; the message names the file and the member.
    """
    reader = _FdReader(fd) if isinstance(fd, int) else fd
    file_size = reader.size
    members = MemberIndex()
    seen = _SeenNames(members)
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
            members.add(m)
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
    return members.finish()


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
