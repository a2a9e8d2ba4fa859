"""The commit protocol shared by every writer of a bundle directory.

1. A writer creates a staging directory *beside* the destination, named after itself,
   ``.<dest name>.staging.<host>.<boot>.<pid namespace>.<pid>.<nonce>``, so that the final step is
   a rename within one filesystem and whoever finds it later can tell whether its writer is dead.
2. It writes every file into it, the manifest last (a directory without one is never a bundle),
   then makes them durable together: an fsync of each file, each subdirectory and the staging
   directory, or, for many files, one ``syncfs`` of the filesystem (see ``_fs.Durability``).
3. It renames the staging directory to the destination with ``renameat2(RENAME_NOREPLACE)`` (or
   a plain rename after an existence check where the kernel lacks it), then fsyncs the parent.
   With ``overwrite=True`` and an existing bundle at the destination, ``renameat2(RENAME_EXCHANGE)``
   swaps the two directories in one step, so that a reader sees the complete old or the complete
   new bundle at every instant; the old one, now under the staging name, is then discarded. Where
   the exchange is unavailable the old bundle is first renamed aside (``.<name>.retired.…``), then
   the new one into place: a reader racing that window finds no bundle rather than a partial one.
   Two writers of one destination with ``overwrite=True`` both succeed (the last one wins): a
   destination that appears or vanishes under a writer sends it round again.

Discarding a bundle directory (the previous one after an overwrite, or :func:`remove_bundle`)
first unlinks its manifest, so that a directory half removed by a crash is never complete-looking.

Recovery. A crash leaves either no bundle or a complete one at the destination, plus leftovers:
staging and retired directories, and packer temporary files named like staging. The next write
into the same parent (:func:`remove_stale_staging`) handles the leftovers of *provably dead*
writers and leaves everything else alone:

* dead means: the name's host tag, boot id and pid namespace are ours and no process has that pid
  (or it is a zombie). A writer in another pid namespace on the same host (another container with
  the same host name) is never judged: its pid means nothing here. A leftover from another boot of
  this host name is judged dead once nothing in it changed for :data:`OTHER_BOOT_GRACE_S` (the
  name may be shared by another machine on the same filesystem). Names of another host, and names
  from before 0.2 (without boot and namespace), are never touched.
* when the destination is missing and one dead writer left both a retired directory and a
  complete staging directory (a manifest that validates: :mod:`bundles._local.proof`) for it, it died between the two renames of a fallback
  overwrite, after its new bundle was durable: that bundle is renamed into place. Everything else
  of dead writers is removed (through :func:`bundles._local.fs.remove_tree`, never following a symlink).

Readers refuse staging and retired names.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bundles._errors import BundleError, BundleExistsError, BundleIOError, BundleNotFoundError
from bundles._format.layout import (
    MANIFEST_NAME,
    MEDIA_DIR,
    RETIRED_MARKER,
    SHARDS_DIR,
    STAGING_MARKER,
    STAGING_RE,
)
from bundles._local.faults import fault_point
from bundles._local.fs import exchange, fsync_dir, remove_tree, rename_noreplace
from bundles._local.proc import boot_id, pid_alive, pid_namespace
from bundles._local.proof import (
    DAMAGED_HINT,
    NotProven,
    Proof,
    examine_directory,
    examine_directory_fd,
    removable_names,
)
from bundles._urls import local_path_only

# A leftover of another boot of this host name is removed once nothing in it changed for this
# long: after a reboot the writer is certainly dead, but the same host name on another machine
# sharing the filesystem is possible and its writer may be alive (and slow).
OTHER_BOOT_GRACE_S = 24 * 3600.0
# How often a commit goes round when other writers keep creating or removing the destination.
_COMMIT_ATTEMPTS = 16


def host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _boot_tag() -> str:
    b = boot_id()
    return b.replace("-", "")[:12].lower() if b else "0"


def _pidns_tag() -> str:
    ns = pid_namespace()
    digits = re.sub(r"[^0-9]", "", ns) if ns else ""
    return digits or "0"


def _writer_tag() -> str:
    """``<host>.<boot>.<pid namespace>.<pid>``: who writes, as leftovers will name it."""
    return f"{host_tag()}.{_boot_tag()}.{_pidns_tag()}.{os.getpid()}"


def _sibling_name(dest: Path, marker: str) -> Path:
    return dest.parent / f".{dest.name}{marker}{_writer_tag()}.{secrets.token_hex(4)}"


def is_staging_name(name: str) -> bool:
    """True for the name of a staging or retired directory (or a packer's temporary file)."""
    return STAGING_RE.fullmatch(name) is not None


@dataclass(frozen=True)
class _Leftover:
    path: Path
    dest: str
    kind: str  # "staging" or "retired"
    writer: tuple[str, str, str, str]  # host, boot, pid namespace, pid
    is_dir: bool


def _writer_is_dead(m: re.Match[str], path: str) -> bool:
    """See the module docstring: only a provably dead writer's leftovers are touched."""
    if m["host"] != host_tag() or m["boot"] is None or m["pidns"] is None:
        return False  # another host, or a name from before 0.2: its writer can't be judged
    if m["pidns"] != _pidns_tag():
        return False  # another pid namespace (a container with our host name): pids mean nothing
    if m["boot"] != _boot_tag():
        if m["boot"] == "0" or _boot_tag() == "0":
            return False
        return time.time() - _newest_mtime(path) > OTHER_BOOT_GRACE_S
    return not pid_alive(int(m["pid"]))


def _newest_mtime(path: str) -> float:
    """The newest mtime of ``path`` and its direct children (a writer adds files to ``media/``
    and ``samples/``, which changes those directories, not the staging directory itself)."""
    newest = os.lstat(path).st_mtime
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except FileNotFoundError:
                    continue
    except (NotADirectoryError, FileNotFoundError):
        pass
    return newest


def _dead_leftovers(parent: Path) -> list[_Leftover]:
    try:
        with os.scandir(parent) as it:
            entries = list(it)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        m = STAGING_RE.fullmatch(entry.name)
        if m is None:
            continue
        try:
            if not _writer_is_dead(m, entry.path):
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
        except FileNotFoundError:
            continue  # another writer cleaned it meanwhile
        writer = (m["host"], m["boot"], m["pidns"], m["pid"])
        found.append(_Leftover(Path(entry.path), m["dest"], m["kind"], writer, is_dir))
    return found


def remove_stale_staging(parent: Path) -> list[Path]:
    """Recover or remove the leftovers of dead writers in ``parent`` (see the module docstring).

    Returns the paths removed (a staging directory renamed into place is not among them).
    """
    leftovers = _dead_leftovers(parent)
    recovered = _recover_interrupted_overwrites(parent, leftovers)
    removed: list[Path] = []
    for left in leftovers:
        if left.path in recovered:
            continue
        try:
            if left.is_dir:
                _discard(left.path)
            else:
                os.unlink(left.path)  # a packer's temporary file
        except FileNotFoundError:
            continue  # another writer cleaned it first
        removed.append(left.path)
    return removed


def _recover_interrupted_overwrites(parent: Path, leftovers: list[_Leftover]) -> set[Path]:
    """Put back the new bundle of each dead writer that died between the two renames of a
    fallback overwrite; return the staging paths so recovered."""
    recovered: set[Path] = set()
    retired = {(left.dest, left.writer) for left in leftovers if left.kind == "retired" and left.is_dir}
    for left in leftovers:
        if left.kind != "staging" or not left.is_dir or (left.dest, left.writer) not in retired:
            continue
        dest = parent / left.dest
        if os.path.lexists(dest) or not _complete(left.path):
            continue
        try:
            rename_noreplace(left.path, dest)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOENT):
                continue  # someone else recovered it, or wrote a new bundle meanwhile
            raise BundleError(
                f"{left.path}: cannot move the interrupted overwrite's bundle to {dest}: {e}"
            ) from e
        fsync_dir(parent)
        recovered.add(left.path)
    return recovered


def _complete(staging: Path) -> bool:
    """A dead writer's staging directory holds a bundle the proof accepts (its manifest, written
    last, validates): only such a one is put in place by a recovery."""
    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return isinstance(examine_directory_fd(fd, staging), Proof)
    except BundleError:
        return False
    finally:
        os.close(fd)


def staging_name(dest: Path) -> Path:
    """A fresh staging name beside ``dest`` (directory or file) for this process."""
    return _sibling_name(dest, STAGING_MARKER)


def scratch_dir(beside: str | os.PathLike[str], purpose: str = "scratch") -> Path:
    """A new empty directory beside ``beside`` for work that feeds a bundle write.

    It is named like a staging directory (``.<name>.<purpose>.staging.<writer>.<nonce>``), so
    that if this process dies before removing it, the next bundle write into the same parent
    removes it. Same filesystem as the bundle, so files made there can be hard-linked into it.
    Remove it when done.
    """
    local_path_only(beside, "scratch_dir")
    target = Path(os.path.abspath(beside))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(target.parent)
        path = _sibling_name(target.with_name(f"{target.name}.{purpose}"), STAGING_MARKER)
        path.mkdir()
    except OSError as e:
        if isinstance(e, BundleError):
            raise
        raise BundleIOError.wrap(target, f"create the {purpose} directory beside it", e) from e
    return path


def create_staging(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(dest.parent)
    staging = _sibling_name(dest, STAGING_MARKER)
    staging.mkdir()
    return staging


def is_bundle_dir(path: str | os.PathLike[str]) -> bool:
    """True for a committed bundle directory: proven by :func:`bundles._local.proof.examine_directory`
    (not a symlink, not a staging or retired directory, a manifest that validates). Costs one
    bounded read of the manifest. :func:`bundles.is_bundle` answers for every location."""
    return isinstance(examine_directory(path), Proof)


def _discard(path: Path) -> None:
    """Remove a bundle directory that is no longer published (retired or swapped out): the
    manifest first, so that a crash midway leaves an incomplete directory, never a bundle."""
    try:
        os.unlink(path / MANIFEST_NAME)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as e:
        raise BundleError(f"{path}/{MANIFEST_NAME}: cannot remove: {e.strerror}") from e
    fault_point("discard.after-manifest", path)
    remove_tree(path)


def remove_bundle_dir(path: str | os.PathLike[str], damaged: bool = False) -> None:
    """Delete the bundle directory at ``path`` so that no reader ever finds half of it
    (:func:`bundles.remove_bundle` for every location), and nothing that is not the bundle's.

    The directory is opened once (never through a symlink) and everything after is done through
    that descriptor: the proof (:func:`bundles._local.proof.examine_directory_fd`: the manifest must
    validate), the listing and the unlinks. What goes is what the proof allows
    (:func:`removable_names`): the members its manifest lists; with ``damaged=True``, of a
    manifest that claims the format but does not validate, the names of the format's layout.

    A directory that holds only the bundle (its manifest, its members, ``samples/`` and
    ``media/``) is first renamed to a retired name (atomic), then removed; a crash in between
    leaves a retired directory that the next write into the same parent cleans up. The retired
    directory must be the one proven: an ``overwrite=True`` that swapped a new bundle in between
    the proof and the rename is detected (another inode) and the new bundle is put back, and this
    removal fails rather than report success. A directory that holds anything else too (a user's
    ``README.txt``, ``samples/notes.txt``, a medium the manifest does not list, a nested bundle)
    keeps it: the manifest is unlinked first (the directory is no bundle from then on), then the
    files allowed, then ``samples/`` and ``media/`` if nothing else is left in them. A bundle
    removed by someone else meanwhile raises :class:`BundleNotFoundError`, as if it had never
    been there.
    """
    dest = Path(os.path.abspath(path))
    found = examine_directory(dest)
    if isinstance(found, NotProven) and not found.damaged:
        removable_names(found, damaged)  # raises, naming why
    try:
        top = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise BundleNotFoundError(f"{dest}: no bundle here (removed meanwhile by another process)") from None
    except OSError as e:
        raise BundleError(f"{dest}: cannot open it: {e.strerror}") from e
    try:
        ours = removable_names(examine_directory_fd(top, dest), damaged)  # of this directory
        own, foreign = _own_files(top, dest, ours)
        if foreign:
            _remove_own_files(top, dest, own)
        else:
            _retire(top, dest, ours)
    finally:
        os.close(top)


def _retire(top: int, dest: Path, ours: Callable[[str], bool]) -> None:
    """Rename the directory proven (open as ``top``) to a retired name, check that what was
    renamed is that directory, and discard it (see :func:`remove_bundle_dir`). What someone put
    in it between the listing and the rename is not the bundle's: the directory is listed again
    once retired (no path reaches it any more), and if anything else is there the bundle's own
    files are removed from it and it goes back to its name, with the newcomer's files."""
    retired = _sibling_name(dest, RETIRED_MARKER)
    fault_point("remove_bundle.before-retire", dest)
    try:
        os.rename(dest, retired)
    except FileNotFoundError:
        raise BundleNotFoundError(f"{dest}: no bundle here (removed meanwhile by another process)") from None
    held, moved = os.fstat(top), os.lstat(retired)
    if (held.st_dev, held.st_ino) != (moved.st_dev, moved.st_ino):
        _put_back(retired, dest)
        raise BundleError(
            f"{dest}: replaced by another writer while it was being removed (overwrite=True swapped a new "
            "bundle in): the new bundle is left in place and nothing was removed"
        )
    fsync_dir(dest.parent)
    fault_point("remove_bundle.after-retire", dest)
    own, foreign = _own_files(top, retired, ours)
    if not foreign:
        _discard(retired)
        return
    _remove_own_files(top, retired, own)
    try:
        rename_noreplace(retired, dest)
    except OSError as e:
        raise BundleError(
            f"{dest}: removed, but {', '.join(foreign[:5])} appeared in it meanwhile and could not be put "
            f"back ({e.strerror}): they are kept in {retired}"
        ) from e
    fsync_dir(dest.parent)


def _put_back(retired: Path, dest: Path) -> None:
    """Rename another writer's bundle, retired by mistake, back to ``dest``. Where yet another
    writer published at ``dest`` meanwhile, ours is a replaced bundle (the last writer wins) and
    is discarded as a replacement's previous bundle is."""
    try:
        rename_noreplace(retired, dest)
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise BundleError(f"{retired}: cannot move the bundle back to {dest}: {e.strerror}") from e
        _discard(retired)
        return
    fsync_dir(dest.parent)


def _own_files(top: int, dest: Path, ours: Callable[[str], bool]) -> tuple[dict[str, list[str]], list[str]]:
    """The bundle's own regular files under ``samples/`` and ``media/`` (by directory) of the
    directory open as ``top``, those ``ours`` allows, and the entries that are not the bundle's.
    Nothing is followed through a symlink: a ``samples`` or ``media`` that is a link is not the
    bundle's directory."""
    own: dict[str, list[str]] = {SHARDS_DIR: [], MEDIA_DIR: []}
    foreign: list[str] = []
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        for name in os.listdir(top):
            if name == MANIFEST_NAME:
                continue
            if name not in own or not stat.S_ISDIR(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode):
                foreign.append(name)
                continue
            fd = os.open(name, flags, dir_fd=top)
            try:
                for inner in os.listdir(fd):
                    rel = f"{name}/{inner}"
                    mode = os.stat(inner, dir_fd=fd, follow_symlinks=False).st_mode
                    (own[name] if stat.S_ISREG(mode) and ours(rel) else foreign).append(rel)
            finally:
                os.close(fd)
    except FileNotFoundError:
        pass  # removed meanwhile: the unlink of the manifest, or the rename, says so
    except OSError as e:
        raise BundleError(f"{dest}: cannot list it: {e.strerror}") from e
    return own, sorted(foreign)


def _remove_own_files(top: int, dest: Path, own: dict[str, list[str]]) -> None:
    """Remove the bundle's own files from a directory (open as ``top``) that holds other things
    too: the manifest first, then each allowed file through its directory's descriptor (never by
    a path that a symlink could send elsewhere), then ``samples/`` and ``media/`` if they are
    left empty."""
    try:
        os.unlink(MANIFEST_NAME, dir_fd=top)
    except FileNotFoundError:
        raise BundleNotFoundError(f"{dest}: no bundle here (removed meanwhile by another process)") from None
    except OSError as e:
        raise BundleError(f"{dest}/{MANIFEST_NAME}: cannot remove: {e.strerror}") from e
    os.fsync(top)
    fault_point("remove_bundle.after-manifest", dest)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    for sub, rels in own.items():
        try:
            fd = os.open(sub, flags, dir_fd=top)
        except OSError:
            continue  # gone meanwhile, or swapped for a link: nothing of ours to follow
        try:
            for rel in rels:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(rel.rpartition("/")[2], dir_fd=fd)
        except OSError as e:
            raise BundleError(f"{dest}/{sub}: cannot remove a file of the bundle: {e.strerror}") from e
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):  # not empty: a file of someone else's is left in it
            os.rmdir(sub, dir_fd=top)


def commit(staging: Path, dest: Path, overwrite: bool) -> None:
    """Publish a fully written and fsynced staging directory at ``dest`` (see module docstring)."""
    fault_point("commit.before-rename", dest)
    for _ in range(_COMMIT_ATTEMPTS):
        if os.path.lexists(dest):
            if not overwrite:
                raise BundleExistsError(f"{dest}: destination exists; pass overwrite=True to replace it")
            _refuse_unreplaceable(dest)
            if _overwrite(staging, dest):
                return
            continue  # the destination vanished or reappeared under us: look again
        fault_point("commit.before-noreplace", dest)
        try:
            rename_noreplace(staging, dest)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            if not overwrite:
                raise BundleExistsError(
                    f"{dest}: destination appeared during the write; not replaced"
                ) from None
            continue  # another writer created it first: replace theirs
        fsync_dir(dest.parent)
        fault_point("commit.after-rename", dest)
        return
    raise BundleError(
        f"{dest}: other writers kept replacing the destination; gave up after {_COMMIT_ATTEMPTS} tries"
    )


def _refuse_unreplaceable(dest: Path) -> None:
    """Only a proven bundle (or an empty directory) is ever replaced: ``overwrite=True`` must not
    delete a directory of unrelated files because of a typo in a path, a web app's directory with
    a ``manifest.json``, or a damaged bundle (``remove_bundle(..., damaged=True)`` is the explicit
    way). Replacing a bundle swaps whole directories: one that holds anything that is not the
    bundle's (a user's ``README.txt``, a nested bundle) is refused too, since the swap would
    delete it with it."""
    found = examine_directory(dest)
    if isinstance(found, NotProven):
        if found.empty and os.path.isdir(dest) and not os.path.islink(dest):
            return  # an empty directory
        what = "a damaged bundle" if found.damaged else "not a bundle"
        hint = f"; {DAMAGED_HINT}" if found.damaged else ""
        raise BundleExistsError(
            f"{dest}: destination exists and is {what}; refusing to replace it ({found.why}){hint}"
        )
    try:
        top = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return  # gone meanwhile: the commit goes round again
    try:
        foreign = _own_files(top, dest, set(found.members()).__contains__)[1]
    finally:
        os.close(top)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f", +{len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise BundleExistsError(
            f"{dest}: holds {shown} beside the bundle, which are not the bundle's: refusing to replace "
            "it (replacing swaps the whole directory); move them, or remove the bundle first "
            "(remove_bundle keeps them)"
        )


def _overwrite(staging: Path, dest: Path) -> bool:
    """Replace the bundle at ``dest`` with ``staging``; False when ``dest`` changed under us
    (vanished, or reappeared between the two renames) and the caller should look again."""
    fault_point("commit.before-exchange", dest)
    try:
        exchanged = exchange(staging, dest)
    except FileNotFoundError:
        return False
    if exchanged:
        fsync_dir(dest.parent)
        fault_point("commit.after-rename", dest)
        _discard_previous(staging, dest)  # now holds the previous bundle
        return True
    retired = _sibling_name(dest, RETIRED_MARKER)
    try:
        os.rename(dest, retired)
    except FileNotFoundError:
        return False
    fault_point("commit.between-renames", dest)
    try:
        rename_noreplace(staging, dest)
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            # Put the previous bundle back rather than leave the destination empty.
            with contextlib.suppress(OSError):  # someone published meanwhile: next cleanup's
                rename_noreplace(retired, dest)
            raise
        # Another writer published meanwhile: ours goes round again, and the bundle we moved
        # aside is no longer anyone's.
        _discard(retired)
        return False
    fsync_dir(dest.parent)
    fault_point("commit.after-rename", dest)
    _discard_previous(retired, dest)
    return True


def _discard_previous(old: Path, dest: Path) -> None:
    """Discard the bundle an overwrite swapped out of ``dest`` (now at ``old``). It held only the
    bundle when the overwrite checked it (:func:`_refuse_unreplaceable`); what someone wrote into
    it since is not the bundle's and is moved into ``dest``, where it was written, before the
    rest goes. One that cannot be moved (a name the new bundle holds too) is kept in ``old``,
    named in the error."""
    try:
        fd = os.open(old, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        fd = -1
    stuck: list[str] = []
    if fd >= 0:
        try:
            found = examine_directory_fd(fd, old)  # not a bundle any more (a racing rm): nothing to tell
            others = (
                _own_files(fd, old, set(found.members()).__contains__)[1] if isinstance(found, Proof) else []
            )
            for rel in others:
                try:
                    rename_noreplace(old / rel, dest / rel)
                except OSError:
                    stuck.append(rel)
        finally:
            os.close(fd)
    if stuck:
        raise BundleError(
            f"{dest}: replaced, but {', '.join(stuck[:5])}, written into it meanwhile, could not be moved "
            f"into the new bundle's directory: kept in {old}"
        )
    _discard(old)
