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

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import os
import stat
import threading
from collections.abc import Collection
from typing import Any, BinaryIO

from bundles._errors import BundleError
from bundles._format.options import LinkMode
from bundles._local.faults import fault_point

LINK_MODES = LinkMode.values()
COPY_CHUNK = 1024 * 1024
_FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h

# Errors that mean "this mechanism is not available here", as opposed to a real failure.
LINK_UNSUPPORTED_ERRNOS = _UNSUPPORTED_ERRNOS = frozenset(
    {
        errno.EXDEV,
        errno.EPERM,
        errno.EMLINK,
        errno.ENOTSUP,
        errno.EOPNOTSUPP,
        errno.EINVAL,
        errno.ENOTTY,
        errno.EACCES,
        errno.ENOSYS,
    }
)

_probe_lock = threading.Lock()
_probed: dict[tuple[int, int], str] = {}


def check_link_mode(link: LinkMode | str) -> LinkMode:
    """The :class:`LinkMode` ``link`` names; a :class:`BundleError` naming the choices if none."""
    mode = LinkMode.parse(link)
    if mode is None:
        raise BundleError(f"link: expected one of {', '.join(LINK_MODES)}, found {link!r}")
    return mode


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


def _write_all(f: Any, data: memoryview) -> None:
    """Write all of ``data`` to the unbuffered file ``f``. A raw write may write less than asked
    without an error (a file reaching ``RLIMIT_FSIZE`` or a full disk writes what fits first);
    the next write then raises the ``OSError`` (EFBIG, ENOSPC) instead of a truncated copy."""
    while data:
        written = f.write(data)
        data = data[written:]


def copy_and_hash(src: str | BinaryIO, dst: str) -> tuple[str, int]:
    """Copy ``src`` (a path, or a binary file such as a member of a packed bundle) to a new file
    ``dst``, hashing the bytes as they pass. The caller fsyncs (see :class:`Durability`)."""
    if isinstance(src, str):
        with open(src, "rb", buffering=0) as fin:
            return copy_and_hash(fin, dst)
    reader: Any = src
    h = hashlib.sha256()
    size = 0
    buf = _copy_buffer()
    view = memoryview(buf)
    with open(dst, "xb", buffering=0) as fout:
        while True:
            n = reader.readinto(buf)
            if not n:
                break
            chunk = view[:n]
            h.update(chunk)
            _write_all(fout, chunk)
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
            fault_point("durability.fsync")
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


def ingest(src: str, dst: str, link: LinkMode | str, src_dev: int, dst_dev: int) -> str:
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
                f"{src}: link='{link}' is not possible into {os.path.dirname(dst)} ({e.strerror}); "
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
    rename would silently replace). Where ``renameat2(RENAME_NOREPLACE)`` is refused (NFS, CIFS,
    no such call), a file is hard-linked to ``dst`` (``link(2)`` never replaces, on NFS too) and
    its old name unlinked; only a directory, or a file on a filesystem without hard links, falls
    back to a check and a rename, which another process may race."""
    if _call_renameat2(src, dst, _RENAME_NOREPLACE):
        return
    if not stat.S_ISDIR(os.lstat(src).st_mode):
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as e:
            if e.errno not in LINK_UNSUPPORTED_ERRNOS:
                raise  # EEXIST among them: dst is there
        else:
            os.unlink(src)
            return
    if os.path.lexists(dst):
        raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
    os.rename(src, dst)


# Flags for opening a directory to delete inside it: never through a symlink (O_NOFOLLOW), never
# anything but a directory (O_DIRECTORY), never blocking on a FIFO swapped in (O_NONBLOCK).
_DIR_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# How often one entry may change type under us (directory <-> not) before we give up on it.
_MAX_ENTRY_ATTEMPTS = 4


class _Dir:
    """One open directory on the deletion stack."""

    __slots__ = ("deferred", "display", "fd", "name", "names", "passes", "retries")

    def __init__(self, fd: int, display: str, name: str, passes: int) -> None:
        self.fd = fd
        self.display = display  # for messages only; never used to reach the directory
        self.name = name  # its name inside the directory below it on the stack
        self.passes = passes
        self.names = _list_dir(fd, display)
        self.retries: dict[str, int] = {}
        self.deferred: list[str] = []  # names to remove once everything else is gone

    def retry(self, name: str) -> None:
        """Handle ``name`` again: it changed type (directory <-> not) under us."""
        count = self.retries[name] = self.retries.get(name, 0) + 1
        if count > _MAX_ENTRY_ATTEMPTS:
            raise BundleError(f"{self.display}/{name}: keeps changing type while being removed; giving up")
        self.names.append(name)


def _list_dir(fd: int, display: str) -> list[str]:
    try:
        with os.scandir(fd) as it:
            return [entry.name for entry in it]
    except OSError as e:
        raise BundleError(f"{display}: cannot list the directory to remove it: {e.strerror}") from e


def _open_subdir(parent_fd: int, name: str, display: str) -> int | None:
    """Open ``name`` inside ``parent_fd`` as a directory without following a symlink.

    None when it is gone or is not (any more) a directory. A directory we may not read (mode
    0o000 inside a run directory) is made readable first: it is part of what we delete.
    """
    try:
        return os.open(name, _DIR_OPEN_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return None
        if e.errno != errno.EACCES:
            raise BundleError(f"{display}: cannot open the directory to remove it: {e.strerror}") from e
    _chmod_unreadable_dir(parent_fd, name, display)
    try:
        return os.open(name, _DIR_OPEN_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        raise BundleError(f"{display}: cannot open the directory to remove it: {e.strerror}") from e


def _chmod_unreadable_dir(parent_fd: int, name: str, display: str) -> None:
    # chmod by name would follow a symlink swapped in meanwhile (Linux has no lchmod), so pin
    # the directory itself with O_PATH|O_NOFOLLOW and chmod it through /proc/self/fd.
    o_path = getattr(os, "O_PATH", 0)
    try:
        if not o_path:
            raise OSError(errno.ENOTSUP, "O_PATH is not available")
        pfd = os.open(name, o_path | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            mode = os.fstat(pfd).st_mode
            os.chmod(f"/proc/self/fd/{pfd}", stat.S_IMODE(mode) | stat.S_IRWXU)
        finally:
            os.close(pfd)
    except OSError as e:
        raise BundleError(f"{display}: directory is not readable and cannot be made so: {e.strerror}") from e


def _make_dir_writable(fd: int, display: str) -> None:
    try:
        mode = os.fstat(fd).st_mode
        os.fchmod(fd, stat.S_IMODE(mode) | stat.S_IRWXU)
    except OSError as e:
        raise BundleError(
            f"{display}: directory is read-only and cannot be made writable: {e.strerror}"
        ) from e


def _unlink_entry(d: _Dir, name: str) -> int | None:
    """Unlink the non-directory ``name`` in ``d``; return the bytes freed, or None when it
    turned out to be a directory."""
    try:
        st = os.lstat(name, dir_fd=d.fd)
    except FileNotFoundError:
        return 0
    if stat.S_ISDIR(st.st_mode):
        return None
    for attempt in (0, 1):
        try:
            os.unlink(name, dir_fd=d.fd)  # unlinkat never follows a symlink: it removes the link
            break
        except FileNotFoundError:
            return 0
        except IsADirectoryError:
            return None  # swapped for a directory since the lstat
        except PermissionError as e:
            if attempt:
                raise BundleError(f"{d.display}/{name}: cannot remove: {e.strerror}") from e
            _make_dir_writable(d.fd, d.display)  # d is inside the tree being removed
        except OSError as e:
            raise BundleError(f"{d.display}/{name}: cannot remove: {e.strerror}") from e
    # What deleting freed: a file with other links (a bundle that linked it) keeps its data.
    return st.st_size if st.st_nlink == 1 else 0


def _rmdir_entry(parent: _Dir | None, parent_fd: int, name: str, display: str) -> str:
    """rmdir ``name`` in ``parent_fd``: ``"done"``, ``"not-empty"`` or ``"not-a-dir"``."""
    for attempt in (0, 1):
        try:
            os.rmdir(name, dir_fd=parent_fd)
            return "done"
        except FileNotFoundError:
            return "done"
        except NotADirectoryError:
            return "not-a-dir"  # a symlink swapped in for the directory we just emptied
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return "not-empty"
            # Only a directory inside the tree is ever made writable, never the tree's parent.
            if e.errno in (errno.EACCES, errno.EPERM) and parent is not None and not attempt:
                _make_dir_writable(parent.fd, parent.display)
                continue
            raise BundleError(f"{display}: cannot remove the directory: {e.strerror}") from e
    raise AssertionError("unreachable")


def _defer(d: _Dir, last: Collection[str]) -> None:
    if last:
        d.deferred = [name for name in d.names if name in last]
        d.names = [name for name in d.names if name not in last]


def remove_tree(path: str | os.PathLike[str], *, last: Collection[str] = ()) -> int:
    """Remove the directory tree at ``path``; return the bytes freed. The one tree deletion of
    this project: bundle staging and retired directories, run media directories, sweeps.

    Everything below ``path`` is reached through directory file descriptors, never by a full
    path: each directory is opened with ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's
    descriptor, listed, and its entries unlinked with ``unlinkat(dir_fd=…)``. A subdirectory
    swapped for a symlink after it was listed (by anyone who can write inside the tree) is then
    unlinked as a link, and a directory swapped away keeps being deleted where it now is: no
    deletion ever reaches outside the tree. ``path``'s own parent directories may be symlinks
    (a symlinked shared root); ``path`` itself must be a real directory. A mount point inside
    the tree is not crossed: the deletion stops with an error before touching the other
    filesystem.

    Permissions: read-only or unreadable directories *inside* the tree (stored media are
    read-only; users make run subdirectories so) are made accessible through their descriptors
    first; nothing outside the tree, ``path``'s parent included, is ever chmodded.

    A tree that is already gone is fine (returns 0). A directory that gains an entry while it is
    being deleted (a late heartbeat) is gone over once more. The bytes freed count files with a
    single link: a file also linked elsewhere (into a bundle) keeps its data. Failures raise
    :class:`BundleError` naming the path, with the ``OSError`` as ``__cause__``.

    ``last`` names entries of ``path`` itself to remove after everything else (a run directory's
    marker and lease): a deletion that fails midway leaves them, so the directory is still
    recognised, and retried, by whoever sweeps it next.
    """
    target = os.path.abspath(os.fspath(path))
    parent_path, top_name = os.path.split(target)
    if not top_name:
        raise BundleError(f"{target}: refusing to remove a filesystem root")
    try:
        parent_fd = os.open(parent_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise BundleError(f"{target}: cannot open its parent directory: {e.strerror}") from e
    stack: list[_Dir] = []
    try:
        top_fd = _open_subdir(parent_fd, top_name, target)
        if top_fd is None:
            _refuse_non_directory(parent_fd, top_name, target)
            return 0
        stack.append(_Dir(top_fd, target, top_name, passes=0))
        _defer(stack[0], last)
        top_dev = os.fstat(top_fd).st_dev
        freed = 0
        while stack:
            d = stack[-1]
            if d.names:
                freed += _remove_next_entry(d, stack, top_dev)
            elif d.deferred:
                _release_deferred(d, last)
            else:
                _remove_emptied_dir(stack, parent_fd, target, last)
        return freed
    finally:
        for d in stack:
            os.close(d.fd)
        os.close(parent_fd)


def _refuse_non_directory(parent_fd: int, top_name: str, target: str) -> None:
    """Return when the tree's top is gone; raise when it is something other than a directory.

    A symlink at the top is refused, not followed: following it would delete another tree.
    """
    try:
        st = os.lstat(top_name, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
    raise BundleError(f"{target}: expected a directory to remove, found {what}; removing nothing")


def _remove_next_entry(d: _Dir, stack: list[_Dir], top_dev: int) -> int:
    """Handle one listed name of ``d``, the top of ``stack``: unlink it, or descend into it by
    pushing it on ``stack``. Return the bytes freed."""
    name = d.names.pop()
    fault_point("remove_tree.entry", d.display, name)
    got = _unlink_entry(d, name)
    if got is not None:
        return got
    child = _open_subdir(d.fd, name, f"{d.display}/{name}")
    if child is None:
        d.retry(name)  # not a directory any more: unlink it on the next turn
        return 0
    if os.fstat(child).st_dev != top_dev:
        os.close(child)
        raise BundleError(
            f"{d.display}/{name}: is a mount point (another filesystem); not removing "
            "anything on it: unmount it first"
        )
    stack.append(_Dir(child, f"{d.display}/{name}", name, passes=0))
    return 0


def _release_deferred(d: _Dir, last: Collection[str]) -> None:
    """Everything else in ``d`` is gone: unless something appeared meanwhile, the deferred
    names go now; new entries go first, and only once more."""
    fresh = [name for name in _list_dir(d.fd, d.display) if name not in last]
    if fresh and d.passes >= 1:
        raise BundleError(f"{d.display}: directory keeps getting new entries while being removed")
    if fresh:
        d.passes += 1
        d.names = fresh
    else:
        d.names, d.deferred = d.deferred, []


def _remove_emptied_dir(stack: list[_Dir], parent_fd: int, target: str, last: Collection[str]) -> None:
    """Pop the emptied directory off ``stack`` and rmdir it from the directory below it (the
    tree's parent for the top), going over it once more when it gained an entry meanwhile."""
    d = stack.pop()
    os.close(d.fd)
    below = stack[-1] if stack else None
    outcome = _rmdir_entry(below, below.fd if below else parent_fd, d.name, d.display)
    if outcome == "not-a-dir" and below is not None:
        below.retry(d.name)  # the name is a symlink now: unlink it, not its target
    elif outcome == "not-a-dir":
        raise BundleError(f"{target}: was replaced by a non-directory while being removed")
    elif outcome == "not-empty":
        if d.passes >= 1:
            raise BundleError(f"{d.display}: directory keeps getting new entries while being removed")
        again = _open_subdir(below.fd if below else parent_fd, d.name, d.display)
        if again is not None:
            stack.append(_Dir(again, d.display, d.name, passes=d.passes + 1))
            if below is None:
                _defer(stack[0], last)
        elif below is not None:
            below.retry(d.name)


__all__ = [
    "LINK_MODES",
    "Durability",
    "check_link_mode",
    "copy_and_hash",
    "exchange",
    "fsync_dir",
    "ingest",
    "make_read_only",
    "remove_tree",
    "rename_noreplace",
]
