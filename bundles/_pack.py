"""Packing a bundle into one file and back.

A packed bundle is an uncompressed POSIX (ustar) tar of the bundle directory's entries, in sorted
order, with mtime, uid and gid zeroed and fixed modes: the same bundle always packs to the same
bytes. Media (PNG, JPEG) are already compressed and shards are zstandard, so the tar adds no
compression of its own.

Unpacking trusts nothing: each member must be a regular file or one of the two layout
directories, with a relative name that matches the layout (no absolute names, no ``..``, no
links, no devices, no duplicates), and the result is fully verified inside a staging directory
before it is committed with the protocol of :mod:`bundles._commit`.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from bundles._commit import commit, create_staging, remove_stale_staging, staging_name
from bundles._errors import BundleExistsError, BundleFormatError, BundleNotFoundError, UnsafeBundleError
from bundles._fs import fsync_dir, make_read_only, remove_tree
from bundles._layout import (
    DIGEST_RE,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    SHARD_PATH_RE,
    SHARDS_DIR,
    SUFFIX_RE,
)
from bundles._progress import Progress
from bundles._reader import Bundle, open_bundle, parse_manifest

_CHUNK = 8 * 1024 * 1024


def _tarinfo(name: str, size: int, is_dir: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if is_dir:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = size
        info.mode = 0o444
    return info


def pack_bundle(
    path: str | os.PathLike[str],
    out_file: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
) -> Path:
    """Pack the bundle at ``path`` into the single file ``out_file`` (written atomically).

    The bundle is verified (fast level) first, so a damaged bundle is never packed.
    """
    bundle = open_bundle(path, verify="fast")
    out = Path(os.path.abspath(out_file))
    if os.path.lexists(out) and not overwrite:
        raise BundleExistsError(f"{out}: output exists; pass overwrite=True to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    members = [MANIFEST_NAME, MEDIA_DIR, SHARDS_DIR]
    members += [e["path"] for e in bundle.manifest["shards"]]
    members += [f"{MEDIA_DIR}/{r.filename}" for r in bundle.media]
    members.sort()
    remove_stale_staging(out.parent)
    tmp = staging_name(out)  # a dead packer's leftover is removed by the next write here
    total = sum(os.path.getsize(bundle.path / m) for m in members if m not in (MEDIA_DIR, SHARDS_DIR))
    try:
        with (
            open(tmp, "wb") as raw,
            Progress(f"packing {bundle.path.name}", total=total, unit="B", enabled=progress) as bar,
        ):
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                for name in members:
                    if name in (MEDIA_DIR, SHARDS_DIR):
                        tar.addfile(_tarinfo(name, 0, True))
                        continue
                    size = os.path.getsize(bundle.path / name)
                    with open(bundle.path / name, "rb") as f:
                        tar.addfile(_tarinfo(name, size, False), f)
                    bar.advance(size)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
    return out


def _check_member_name(name: str, where: Path) -> None:
    if name.startswith("/") or "\\" in name:
        raise UnsafeBundleError(f"{where}: member {name!r}: absolute names are refused")
    parts = name.split("/")
    if ".." in parts or "." in parts or "" in parts:
        raise UnsafeBundleError(f"{where}: member {name!r}: names with '..', '.' or empty parts are refused")
    if name in (MANIFEST_NAME, MEDIA_DIR, SHARDS_DIR) or SHARD_PATH_RE.fullmatch(name):
        return
    if len(parts) == 2 and parts[0] == MEDIA_DIR:
        digest, dot, suffix = parts[1].partition(".")
        if DIGEST_RE.fullmatch("sha256:" + digest) and SUFFIX_RE.fullmatch(dot + suffix):
            return
    raise UnsafeBundleError(f"{where}: member {name!r}: not a name the bundle layout allows")


def unpack_bundle(
    packed: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
) -> Bundle:
    """Unpack a packed bundle into the new directory ``out_dir``, fully verify it, commit it.

    Raises:
        BundleNotFoundError: ``packed`` does not exist.
        BundleExistsError: ``out_dir`` exists and ``overwrite`` is false.
        UnsafeBundleError: a member is absolute, holds ``..``, is a link or special file,
            appears twice or has a name outside the layout. Nothing is left at ``out_dir``.
    """
    src = Path(os.path.abspath(packed))
    dest = Path(os.path.abspath(out_dir))
    if not os.path.lexists(src):
        raise BundleNotFoundError(f"{src}: no packed bundle here (the file does not exist)")
    if not src.is_file():
        raise BundleFormatError(f"{src}: expected a packed bundle file, found a directory or special file")
    if os.path.lexists(dest) and not overwrite:
        raise BundleExistsError(f"{dest}: output exists; pass overwrite=True to replace it")
    staging = create_staging(dest)
    try:
        seen: set[str] = set()
        try:
            tar = tarfile.open(src, mode="r:")  # noqa: SIM115 - closed by the with below
        except tarfile.TarError as e:
            raise UnsafeBundleError(f"{src}: not a packed bundle (uncompressed tar): {e}") from None
        with (
            tar,
            Progress(f"unpacking {src.name}", total=src.stat().st_size, unit="B", enabled=progress) as bar,
        ):
            for member in tar:
                name = member.name
                _check_member_name(name, src)
                if name in seen:
                    raise UnsafeBundleError(f"{src}: member {name!r} appears twice")
                seen.add(name)
                if member.isdir():
                    if name not in (MEDIA_DIR, SHARDS_DIR):
                        raise UnsafeBundleError(f"{src}: member {name!r}: unexpected directory")
                    (staging / name).mkdir(exist_ok=True)
                    continue
                if not member.isreg():
                    raise UnsafeBundleError(f"{src}: member {name!r}: links and special files are refused")
                if name == MANIFEST_NAME and member.size > MAX_MANIFEST_BYTES:
                    raise UnsafeBundleError(
                        f"{src}: member {name!r}: {member.size} bytes exceeds the manifest cap"
                    )
                target = staging / name
                target.parent.mkdir(exist_ok=True)
                fin = tar.extractfile(member)
                assert fin is not None  # a regular member always has a file object
                with fin, open(target, "xb") as fout:
                    while chunk := fin.read(_CHUNK):
                        fout.write(chunk)
                    fout.flush()
                    os.fsync(fout.fileno())
                make_read_only(str(target))
                bar.advance(member.size)
        for sub in (SHARDS_DIR, MEDIA_DIR):
            (staging / sub).mkdir(exist_ok=True)
            fsync_dir(staging / sub)
        fsync_dir(staging)
        Bundle(staging, parse_manifest(staging)).verify(full=True, progress=False)
        commit(staging, dest, overwrite)
    except BaseException:
        if staging.exists():
            remove_tree(staging)
        raise
    return open_bundle(dest, verify="none")


__all__ = ["pack_bundle", "unpack_bundle"]
