"""The one atomic file write of the project: a reader sees the old file or the new one, never a
torn one, and a crash leaves at most a temporary file that the next write (or a cleanup) removes.

Protocol, for a destination ``d``:

1. The bytes go to a temporary file in ``d``'s own directory (a rename is atomic only within one
   filesystem), named like a bundle staging directory, ``.<d name>.staging.<host>.<boot>.<pid
   namespace>.<pid>.<nonce>`` (:func:`bundles._local.commit.staging_name`). The name says which process
   wrote it, so whoever finds it later can tell whether its writer is provably dead; the random
   nonce makes two threads of one process, or two processes, never share a temporary file.
2. With ``durable=True`` the file's data is fsynced before the rename, and the directory after
   it: once the call returns, a power loss keeps the new file. Without it (scratch files, reports
   a user can regenerate) the write is still atomic for every reader while the machine runs;
   after a power loss the destination may be the old file, or, on a filesystem that does not
   order a file's data before a rename over another file, an empty or short one.
3. The file is given its final ``mode`` (read-only media) before the rename, then renamed over
   the destination with ``rename(2)`` (``os.replace``): atomic for every reader. With
   ``replace=False`` the rename is ``renameat2(RENAME_NOREPLACE)`` instead, so that of two
   writers racing for a new file exactly one creates it and the other gets ``FileExistsError``
   (a check before the write cannot promise that: both writers pass it).
4. Any failure (an exception, ``KeyboardInterrupt`` included) unlinks the temporary file and
   re-raises, with an ``OSError`` naming the destination rather than the temporary name.

Recovery. A SIGKILL or power loss between steps 1 and 3 leaves the temporary file. Its name is a
staging name, so :func:`bundles._local.commit.remove_stale_staging` (run by every bundle write into the
directory, by ``sweep=True`` here, and by :func:`remove_stale_temps`) removes it once its writer
is provably dead, and never one of a live writer. Writers into directories with many files and
frequent writes (run media, a lease beside them) pass ``sweep=False``: their directory is
removed as a whole when the run ends, leftovers included.

Fault points ``atomic_write.after-data`` (temporary file complete, not yet renamed) and
``atomic_write.after-rename`` (renamed, directory not yet fsynced) let the crash suite kill a
writer exactly there (tests/test_atomic_write.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from bundles._errors import UnsafeBundleError
from bundles._local.commit import remove_stale_staging, staging_name
from bundles._local.faults import fault_point
from bundles._local.fs import LINK_UNSUPPORTED_ERRNOS, fsync_dir, rename_noreplace

__all__ = [
    "DestinationExistsError",
    "atomic_path",
    "atomic_write",
    "atomic_writer",
    "place_file",
    "remove_stale_temps",
]


class DestinationExistsError(FileExistsError):
    """``replace=False`` found ``dest`` there at the rename: raised by that step only, so that a
    caller can tell "someone published first" from an EEXIST while the content was written."""


def _fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_in(e: OSError, tmp: Path, dest: Path) -> None:
    """Make ``e`` name ``dest`` instead of the temporary file: a user never typed that name."""
    if e.filename is not None and os.fspath(e.filename) == os.fspath(tmp):
        e.filename = os.fspath(dest)
    if e.filename2 is not None and os.fspath(e.filename2) == os.fspath(tmp):
        e.filename2 = os.fspath(dest)


@contextmanager
def atomic_path(
    dest: str | os.PathLike[str],
    *,
    durable: bool = False,
    mode: int | None = None,
    sweep: bool = True,
    replace: bool = True,
    _data_synced: bool = False,
) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``dest``; the caller creates the file there (open it
    with ``"xb"``, hard-link or reflink into it, copy into it). When the block ends normally the
    file is made durable (``durable=True``), given ``mode`` and renamed over ``dest``; when it
    raises, the temporary file is removed. See the module docstring for the protocol.

    ``sweep=True`` first removes temporary files (and bundle staging leftovers) of provably dead
    writers in ``dest``'s directory: one ``scandir`` of it. ``replace=False`` never replaces an
    existing ``dest``: :class:`DestinationExistsError` (a ``FileExistsError``) naming it instead
    (step 3).
    """
    dest = Path(dest)
    if sweep:
        remove_stale_staging(dest.parent)
    tmp = staging_name(dest)
    try:
        yield tmp
        if durable and not _data_synced:
            _fsync_file(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        fault_point("atomic_write.after-data", dest)
        if replace:
            os.replace(tmp, dest)
        else:
            try:
                rename_noreplace(tmp, dest)
            except FileExistsError as e:
                raise DestinationExistsError(e.errno, e.strerror, os.fspath(dest)) from None
        fault_point("atomic_write.after-rename", dest)
        if durable:
            fsync_dir(dest.parent)
    except BaseException as e:
        with suppress(FileNotFoundError, NotADirectoryError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            _rename_in(e, tmp, dest)
        raise


@contextmanager
def atomic_writer(
    dest: str | os.PathLike[str],
    *,
    durable: bool = False,
    mode: int | None = None,
    sweep: bool = True,
    text: bool = False,
    encoding: str = "utf-8",
    replace: bool = True,
) -> Iterator[IO[Any]]:
    """``with atomic_writer(path, durable=True) as f: f.write(...)``: a new file object whose
    content replaces ``dest`` atomically when the block ends normally (see :func:`atomic_path`)."""
    with atomic_path(
        dest, durable=durable, mode=mode, sweep=sweep, replace=replace, _data_synced=durable
    ) as tmp:
        f: IO[Any]
        with open(tmp, "x", encoding=encoding) if text else open(tmp, "xb") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())


def atomic_write(
    dest: str | os.PathLike[str],
    data: bytes | bytearray | memoryview | str | Callable[[IO[bytes]], object],
    *,
    durable: bool = False,
    mode: int | None = None,
    sweep: bool = True,
) -> Path:
    """Replace ``dest`` atomically with ``data`` (bytes, text as UTF-8, or a function that
    writes to the binary file it is given); return ``dest``. See the module docstring."""
    with atomic_writer(dest, durable=durable, mode=mode, sweep=sweep) as f:
        if callable(data):
            data(f)
        else:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(dest)


def place_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    link: str = "auto",
    opened: IO[bytes] | None = None,
) -> str:
    """Put ``src``'s bytes at the new path ``dst``: a hard link, else a copy. Returns
    ``"hardlink"``, ``"copy"``, or ``"exists"`` when ``dst`` was there already (left as it is:
    callers place content-addressed files, whose name says what they hold).

    ``link``: ``"auto"`` (or ``"reflink"``) links where the filesystem allows and copies where it
    cannot (another filesystem, no hard links); ``"hardlink"`` raises instead of copying;
    ``"copy"`` always copies. The link never follows ``src`` if it is a symlink. A copy is atomic
    (:func:`atomic_path`) and not fsynced (the caller decides when its files are durable).
    ``opened``: ``src`` opened already (by :func:`bundles.support.open_regular_file`, for
    untrusted input): the link is checked to be that very inode and a copy reads that file, so a
    file swapped in meanwhile is never placed (:class:`UnsafeBundleError`).

    The one "hard-link, else copy" of trainer_hooks (the journal placing run media, a resume
    placing journal media); a bundle's writer has its own, which also reflinks and hashes as it
    copies (:func:`bundles._local.fs.ingest`).
    """
    src, dst = os.fspath(src), os.fspath(dst)
    if link != "copy":
        try:
            os.link(src, dst, follow_symlinks=False)
        except FileExistsError:
            return "exists"
        except OSError as e:
            if link == "hardlink" or e.errno not in LINK_UNSUPPORTED_ERRNOS:
                raise
        else:
            if opened is not None:
                st, linked = os.fstat(opened.fileno()), os.lstat(dst)
                if (linked.st_ino, linked.st_dev) != (st.st_ino, st.st_dev):
                    os.unlink(dst)
                    raise UnsafeBundleError(
                        f"{src}: replaced while it was being linked into {os.path.dirname(dst)}; nothing placed"
                    )
            return "hardlink"
    if os.path.lexists(dst):
        return "exists"
    with atomic_path(dst, sweep=False) as tmp:
        if opened is None:
            shutil.copyfile(src, tmp)
        else:
            opened.seek(0)
            with open(tmp, "wb") as out:
                shutil.copyfileobj(opened, out, 1 << 20)
    return "copy"


def remove_stale_temps(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files (and bundle staging leftovers) that provably dead writers left
    in ``directory``; return what was removed. Live writers' files are never touched."""
    return remove_stale_staging(Path(directory))
