"""Filesystem primitives: ingesting media by hardlink, reflink or copy; fsync; atomic renames.

Link modes differ by filesystem, so each is a small strategy with a capability probe. ``auto``
tries hardlink, then reflink (``FICLONE``), then a copy, and remembers per (source device,
destination device) pair which one worked, so that a save of 600 files probes once, not 600
times.

Trade-off of hardlinks: the bundle and the run media directory share an inode. Deleting the run
directory is safe (the bundle keeps its link), but an in-place write to the source would change
the bundle too. Stored media are therefore made read-only, and ``verify="full"`` re-hashes every
file; a digest trusted from a file name is only ever trusted for a hardlinked file, because then
the bytes in the bundle are the bytes that were named.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import sys
import threading
from typing import Any

from bundles._errors import BundleError

LINK_MODES = ("auto", "hardlink", "reflink", "copy")
COPY_CHUNK = 1024 * 1024
_FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h

# Errors that mean "this mechanism is not available here", as opposed to a real failure.
_UNSUPPORTED_ERRNOS = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTTY,
     errno.EACCES, errno.ENOSYS}
)

_probe_lock = threading.Lock()
_probed: dict[tuple[int, int], str] = {}


def check_link_mode(link: str) -> None:
    if link not in LINK_MODES:
        raise BundleError(f"link: expected one of {', '.join(LINK_MODES)}, found {link!r}")


def _reflink(src: str, dst: str) -> None:
    sfd = os.open(src, os.O_RDONLY)
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.ioctl(dfd, _FICLONE, sfd)
        except OSError:
            os.close(dfd)
            dfd = -1
            os.unlink(dst)
            raise
        finally:
            if dfd >= 0:
                os.close(dfd)
    finally:
        os.close(sfd)


_buffers = threading.local()


def _copy_buffer() -> bytearray:
    # One buffer per thread, reused: zeroing a fresh multi-MiB buffer per ~1 MB file cost more
    # than the copy itself.
    buf: bytearray | None = getattr(_buffers, "copy", None)
    if buf is None:
        buf = _buffers.copy = bytearray(COPY_CHUNK)
    return buf


def copy_and_hash(src: str, dst: str) -> tuple[str, int]:
    """Copy ``src`` to a new file ``dst``, hashing the bytes as they pass. The caller fsyncs
    (see :class:`Durability`)."""
    h = hashlib.sha256()
    size = 0
    buf = _copy_buffer()
    view = memoryview(buf)
    with open(src, "rb", buffering=0) as fin, open(dst, "xb", buffering=0) as fout:
        while True:
            n = fin.readinto(buf)
            if not n:
                break
            chunk = view[:n]
            h.update(chunk)
            fout.write(chunk)
            size += n
    return h.hexdigest(), size


class Durability:
    """Files to make durable before a commit, all at once at the end.

    An fsync right after each link commits the filesystem journal once per file (~0.5 ms each on
    ext4). Instead the writer collects the files and, before the manifest is committed, either
    fsyncs each (a few files) or calls ``syncfs`` once on the bundle's filesystem (many files:
    one flush instead of hundreds). The trade-off of ``syncfs``: it also flushes other dirty data
    on that filesystem, so it can take longer when another process is writing heavily there; it
    never makes anything less durable.
    """

    SYNCFS_THRESHOLD = 32

    def __init__(self) -> None:
        self.paths: list[str] = []

    def add(self, path: str) -> None:
        self.paths.append(path)

    def sync(self, dirs: list[str | os.PathLike[str]]) -> None:
        """Make the collected files and ``dirs`` (deepest first, the staging directory last)
        durable."""
        if len(self.paths) > self.SYNCFS_THRESHOLD and _syncfs(os.fspath(dirs[-1])):
            self.paths.clear()  # syncfs covers file data and every directory's metadata
            return
        for path in self.paths:
            _fsync_path(path)
        for d in dirs:
            fsync_dir(d)
        self.paths.clear()


def _load_syncfs() -> Any:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name, use_errno=True).syncfs if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
    return fn


_syncfs_fn = _load_syncfs()


def _syncfs(path: str) -> bool:
    """``syncfs`` on the filesystem holding ``path``; False where libc lacks it or it fails."""
    if _syncfs_fn is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bool(_syncfs_fn(fd) == 0)
    finally:
        os.close(fd)


def _link(method: str, src: str, dst: str) -> None:
    if method == "hardlink":
        os.link(src, dst)
    else:
        _reflink(src, dst)


def ingest(src: str, dst: str, link: str, src_dev: int, dst_dev: int) -> str:
    """Place ``src``'s bytes at the new path ``dst`` by ``link`` mode; return the method used.

    ``"copy"`` is returned without copying: the caller copies with :func:`copy_and_hash`, so that
    the bytes are hashed on the way. Nothing is fsynced here (see :class:`Durability`).
    """
    if link == "copy":
        return "copy"
    if link in ("hardlink", "reflink"):
        try:
            _link(link, src, dst)
        except OSError as e:
            if e.errno not in _UNSUPPORTED_ERRNOS:
                raise
            raise BundleError(
                f"{src}: link={link!r} is not possible into {os.path.dirname(dst)} ({e.strerror}); "
                "use link='auto' to fall back to a copy"
            ) from e
        return link
    key = (src_dev, dst_dev)
    known = _probed.get(key)
    for method in ("hardlink", "reflink"):
        if known is not None and known != method:
            continue
        try:
            _link(method, src, dst)
        except OSError as e:
            if e.errno not in _UNSUPPORTED_ERRNOS or known is not None:
                raise
            continue
        with _probe_lock:
            _probed[key] = method
        return method
    with _probe_lock:
        _probed[key] = "copy"
    return "copy"


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_read_only(path: str, mode: int | None = None) -> None:
    """Clear the write bits; ``mode`` (a known ``st_mode`` of the same inode) saves a stat."""
    if mode is None:
        mode = os.stat(path).st_mode
    if mode & 0o222:
        os.chmod(path, stat.S_IMODE(mode) & ~0o222)


def _load_renameat2() -> object | None:
    """``renameat2`` from libc, or None where it is missing."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_renameat2 = _load_renameat2()


def _call_renameat2(a: str | os.PathLike[str], b: str | os.PathLike[str], flags: int) -> bool:
    """True when done; False where the kernel or filesystem lacks renameat2 or the flag."""
    if _renameat2 is None:
        return False
    rc = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags)  # type: ignore[operator]
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Atomically swap two existing paths. Returns False where the kernel or filesystem cannot."""
    return _call_renameat2(a, b, _RENAME_EXCHANGE)


def rename_noreplace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename, failing with EEXIST if ``dst`` exists, even as an empty directory (which a plain
    rename would silently replace)."""
    if _call_renameat2(src, dst, _RENAME_NOREPLACE):
        return
    if os.path.lexists(dst):
        raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
    os.rename(src, dst)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove a directory tree whose files may be read-only (stored media are)."""

    def retry_writable(func: Any, p: str, _exc: object) -> None:
        # Removing an entry needs a writable parent; a read-only file itself is fine.
        os.chmod(os.path.dirname(p), 0o755)
        func(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry_writable)
    else:
        shutil.rmtree(path, onerror=retry_writable)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tree_size(path: str | os.PathLike[str]) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


__all__ = [
    "LINK_MODES",
    "Durability",
    "check_link_mode",
    "copy_and_hash",
    "exchange",
    "fsync_dir",
    "ingest",
    "make_read_only",
    "pid_alive",
    "remove_tree",
    "rename_noreplace",
    "tree_size",
]
