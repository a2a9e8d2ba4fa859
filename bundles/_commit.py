"""The commit protocol shared by every writer of a bundle directory.

1. A writer creates a staging directory *beside* the destination, named
   ``.<dest name>.staging.<host>.<pid>.<nonce>``, so that the final step is a rename within one
   filesystem and the owner of a staging directory can be told from its name.
2. It writes every file into it, the manifest last (a directory without one is never a bundle),
   then makes them durable together: an fsync of each file, each subdirectory and the staging
   directory, or, for many files, one ``syncfs`` of the filesystem (see ``_fs.Durability``).
3. It renames the staging directory to the destination with ``renameat2(RENAME_NOREPLACE)`` (or
   a plain rename after an existence check where the kernel lacks it), then fsyncs the parent.
   With ``overwrite=True`` and an existing bundle at the destination, ``renameat2(RENAME_EXCHANGE)``
   swaps the two directories in one step, so that a reader sees the complete old or the complete new
   bundle at every instant; the old one, now under the staging name, is then removed. Where the
   exchange is unavailable the old bundle is first renamed aside (``.<name>.retired.…``): a reader
   racing that window finds no bundle rather than a partial one.

A crash at any point leaves either no bundle or the complete previous one at the destination, plus
at most a staging directory. Readers refuse staging directories. The next write into the same
parent removes staging and retired directories whose writer is a dead process on this host;
directories of other hosts are left alone, because their pids mean nothing here.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import socket
from pathlib import Path

from bundles._errors import BundleExistsError, BundleNotFoundError
from bundles._fs import exchange, fsync_dir, pid_alive, remove_tree, rename_noreplace
from bundles._layout import MANIFEST_NAME, RETIRED_MARKER, STAGING_MARKER, STAGING_RE


def host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _sibling_name(dest: Path, marker: str) -> Path:
    return dest.parent / f".{dest.name}{marker}{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}"


def is_staging_name(name: str) -> bool:
    return STAGING_RE.fullmatch(name) is not None


def remove_stale_staging(parent: Path) -> list[Path]:
    """Remove staging/retired directories in ``parent`` left by dead writers on this host."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return removed
    me = host_tag()
    for entry in entries:
        m = STAGING_RE.fullmatch(entry.name)
        if m is None or m["host"] != me or pid_alive(int(m["pid"])):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)  # a packer's temporary file
        except FileNotFoundError:
            continue  # another writer cleaned it first
        removed.append(Path(entry.path))
    return removed


def staging_name(dest: Path) -> Path:
    """A fresh staging name beside ``dest`` (directory or file) for this process."""
    return _sibling_name(dest, STAGING_MARKER)


def scratch_dir(beside: str | os.PathLike[str], purpose: str = "scratch") -> Path:
    """A new empty directory beside ``beside`` for work that feeds a bundle write.

    It is named like a staging directory (``.<name>.<purpose>.staging.<host>.<pid>.<nonce>``), so
    that if this process dies before removing it, the next bundle write into the same parent
    removes it. Same filesystem as the bundle, so files made there can be hard-linked into it.
    Remove it when done.
    """
    target = Path(os.path.abspath(beside))
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(target.parent)
    path = _sibling_name(target.with_name(f"{target.name}.{purpose}"), STAGING_MARKER)
    path.mkdir()
    return path


def create_staging(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(dest.parent)
    staging = _sibling_name(dest, STAGING_MARKER)
    staging.mkdir()
    return staging


def _replaceable(dest: Path) -> bool:
    """Only a bundle (or an empty directory) is ever replaced: overwrite=True must not delete a
    directory of unrelated files because of a typo in a path."""
    if dest.is_symlink() or not dest.is_dir():
        return False
    return (dest / MANIFEST_NAME).is_file() or not any(dest.iterdir())


def is_bundle(path: str | os.PathLike[str]) -> bool:
    """True for a committed bundle directory: not a symlink, not a staging directory, with a
    manifest. Cheap (two stats); :func:`open_bundle` is what validates it."""
    p = Path(path)
    return not p.is_symlink() and not is_staging_name(p.name) and (p / MANIFEST_NAME).is_file()


def remove_bundle(path: str | os.PathLike[str]) -> None:
    """Delete the bundle at ``path`` so that no reader ever finds half of it.

    The bundle is first renamed to a retired name (atomic), then removed; a crash in between
    leaves a retired directory that the next write into the same parent cleans up. Only a
    bundle (a directory with a manifest) is removed: anything else raises.
    """
    dest = Path(os.path.abspath(path))
    if not is_bundle(dest):
        if not os.path.lexists(dest):
            raise BundleNotFoundError(f"{dest}: no bundle here (path does not exist)")
        raise BundleNotFoundError(f"{dest}: not a bundle ({MANIFEST_NAME} is missing); refusing to remove it")
    retired = _sibling_name(dest, RETIRED_MARKER)
    os.rename(dest, retired)
    fsync_dir(dest.parent)
    remove_tree(retired)


def commit(staging: Path, dest: Path, overwrite: bool) -> None:
    """Publish a fully written and fsynced staging directory at ``dest`` (see module docstring)."""
    if os.path.lexists(dest):
        if not overwrite:
            raise BundleExistsError(f"{dest}: destination exists; pass overwrite=True to replace it")
        if not _replaceable(dest):
            raise BundleExistsError(f"{dest}: destination exists and is not a bundle; refusing to replace it")
        if exchange(staging, dest):
            fsync_dir(dest.parent)
            remove_tree(staging)  # now holds the previous bundle
            return
        retired = _sibling_name(dest, RETIRED_MARKER)
        os.rename(dest, retired)
        os.rename(staging, dest)
        fsync_dir(dest.parent)
        remove_tree(retired)
        return
    try:
        rename_noreplace(staging, dest)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise BundleExistsError(f"{dest}: destination appeared during the write; not replaced") from None
        raise
    fsync_dir(dest.parent)
