"""Packing a bundle into one file and back.

A packed bundle is an uncompressed POSIX (ustar) tar of the bundle directory's entries, in sorted
order, with mtime, uid and gid zeroed and fixed modes: the same bundle always packs to the same
bytes. Media (PNG, JPEG) are already compressed and shards are zstandard, so the tar adds no
compression of its own.

Unpacking trusts nothing: each member must be a regular file or one of the two layout
directories, with a relative name that matches the layout (no absolute names, no ``..``, no
links, no devices, no sparse files, no duplicates). Those rules live in one place,
:func:`bundles._local.archive.read_tar_index`, which the in-place reader uses too, and every header is
checked before a byte is written. The result is fully verified inside a staging directory before
it is committed with the protocol of :mod:`bundles._local.commit`.

Packing reads every byte of the bundle anyway, so it hashes while it streams and refuses a file
whose digest disagrees with the manifest: a damaged bundle is never shipped.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import BinaryIO

from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleFormatError,
    BundleIOError,
    BundleNotFoundError,
    BundleVerificationError,
)
from bundles._format.layout import MANIFEST_NAME, MEDIA_DIR, SHARDS_DIR
from bundles._format.options import Verify
from bundles._local.archive import PackedSource
from bundles._local.atomic import atomic_writer
from bundles._local.commit import commit, create_staging
from bundles._local.fs import fsync_dir, make_read_only, remove_tree
from bundles._local.progress import Progress
from bundles._local.reader import Bundle, load_manifest, open_local
from bundles._local.sources import DirSource

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


class _HashingReader:
    """Feeds tarfile a media file while hashing it, so that pack reads every byte only once and
    refuses a file whose digest disagrees with the manifest (a damaged bundle is never shipped)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data


def _refuse_overlap(src: Path | str, out: Path, what: str) -> None:
    """Refuse an output that is the input, lies inside it, or contains it (replacing it would
    delete the input)."""
    s = os.path.realpath(src)
    o = os.path.realpath(out)
    if o == s or o.startswith(s.rstrip(os.sep) + os.sep) or s.startswith(o.rstrip(os.sep) + os.sep):
        raise BundleError(
            f"{out}: the {what} output must not be the input {src}, lie inside it or contain it"
        )


def pack_local(
    bundle: Bundle, out_file: str | os.PathLike[str], *, overwrite: bool, progress: bool | None
) -> Path:
    """:func:`bundles.pack_bundle` of an open bundle (any location) into a local file."""
    out = Path(os.path.abspath(out_file))
    _refuse_overlap(bundle.path, out, "pack")
    if os.path.isdir(out):
        raise BundleError(f"{out}: output is a directory; expected the path of the packed file to write")
    if os.path.lexists(out) and not overwrite:
        raise BundleExistsError(f"{out}: output exists; pass overwrite=True to replace it")
    try:
        _write_packed(bundle, out, progress, replace=overwrite)
    except FileExistsError as e:
        if e.filename is None or os.fspath(e.filename) != os.fspath(out):
            raise BundleIOError.wrap(out, "write the packed bundle", e) from e
        # Another packer created it between the check above and our rename: theirs stays.
        raise BundleExistsError(f"{out}: output appeared during the pack; not replaced") from None
    except OSError as e:
        if isinstance(e, BundleError):
            raise
        raise BundleIOError.wrap(out, "write the packed bundle", e) from e
    return out


def _write_packed(bundle: Bundle, out: Path, progress: bool | None, *, replace: bool) -> None:
    expected: dict[str, tuple[str, int]] = {e.path: (e.digest, e.size) for e in bundle.manifest.shards}
    expected.update({f"{MEDIA_DIR}/{r.filename}": (r.digest, r.size) for r in bundle.media})
    members = sorted([MANIFEST_NAME, MEDIA_DIR, SHARDS_DIR, *expected])
    out.parent.mkdir(parents=True, exist_ok=True)
    source = bundle._source
    total = sum(size for _, size in expected.values())
    # The one atomic write (bundles._local.atomic): durable, and a dead packer's temporary file is
    # removed by the next write into this directory.
    with (
        atomic_writer(out, durable=True, replace=replace) as raw,
        Progress(f"packing {bundle.path.name}", total=total, unit="B", enabled=progress) as bar,
        tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar,  # closed first
    ):
        for name in members:
            if name in (MEDIA_DIR, SHARDS_DIR):
                tar.addfile(_tarinfo(name, 0, True))
                continue
            try:
                f, size = source.open(name)
            except FileNotFoundError:
                raise BundleVerificationError(
                    bundle.path, [f"{source.where(name)}: listed in the manifest but missing"]
                ) from None
            with f:
                if name in expected and size != expected[name][1]:
                    raise BundleVerificationError(
                        bundle.path,
                        [f"{source.where(name)}: size: expected {expected[name][1]} bytes, found {size}"],
                    )
                reader = _HashingReader(f)
                tar.addfile(_tarinfo(name, size, False), reader)  # type: ignore[arg-type,unused-ignore]
            digest = "sha256:" + reader.hash.hexdigest()
            if name in expected and (digest != expected[name][0] or reader.size != size):
                raise BundleVerificationError(
                    bundle.path,
                    [
                        f"{source.where(name)}: digest: expected {expected[name][0]}, found {digest}; not packed"
                    ],
                )
            bar.advance(size)


def _extract(source: PackedSource, staging: Path, progress: Progress) -> None:
    """Every member of ``source`` written into ``staging`` (fsynced, read-only), the progress
    advanced by each member's size."""
    with progress as bar:
        for entry in source.entries():
            target = staging / entry.name
            if entry.kind == "dir":
                target.mkdir(exist_ok=True)
                continue
            target.parent.mkdir(exist_ok=True)
            fin, _ = source.open(entry.name)
            with fin, open(target, "xb") as fout:
                while chunk := fin.read(_CHUNK):
                    fout.write(chunk)
                fout.flush()
                os.fsync(fout.fileno())
            make_read_only(str(target))
            bar.advance(entry.size)


def unpack_local(
    packed: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
) -> Bundle:
    """:func:`bundles.unpack_bundle` of a local packed file into a local directory."""
    src = Path(os.path.abspath(packed))
    dest = Path(os.path.abspath(out_dir))
    if not os.path.lexists(src):
        raise BundleNotFoundError(f"{src}: no packed bundle here (the file does not exist)")
    if not src.is_file():
        raise BundleFormatError(
            f"{src}: expected a packed bundle file, found {'a directory' if src.is_dir() else 'a special file'}"
        )
    _refuse_overlap(src, dest, "unpack")
    if os.path.lexists(dest) and not overwrite:
        raise BundleExistsError(f"{dest}: output exists; pass overwrite=True to replace it")
    source = PackedSource(src)  # every member is checked here, before anything is written
    staging: Path | None = None
    try:
        load_manifest(source)  # and the manifest, so that its errors name the packed file
        staging = create_staging(dest)
        _extract(
            source,
            staging,
            Progress(f"unpacking {src.name}", total=src.stat().st_size, unit="B", enabled=progress),
        )
        for sub in (SHARDS_DIR, MEDIA_DIR):
            (staging / sub).mkdir(exist_ok=True)
            fsync_dir(staging / sub)
        fsync_dir(staging)
        staged = DirSource(staging)
        try:
            Bundle(staged, load_manifest(staged)).verify(full=True, progress=False)
        except BundleVerificationError as e:
            # Name the members of the packed file, not the staging directory about to vanish.
            raise BundleVerificationError(
                src, [p.replace(f"{staging}/", f"{src}/") for p in e.problems]
            ) from None
        commit(staging, dest, overwrite)
    except OSError as e:
        if staging is not None and staging.exists():
            remove_tree(staging)
        if isinstance(e, BundleError):
            raise
        raise BundleIOError.wrap(dest, f"unpack {src}", e) from e
    except BaseException:
        if staging is not None and staging.exists():
            remove_tree(staging)
        raise
    finally:
        source.close()
    return open_local(dest, Verify.NONE)


__all__ = ["pack_local", "unpack_local"]
