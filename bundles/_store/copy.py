"""Copying a bundle directory off a store, byte for byte (``rollout-bundle cp URL DIR``).

See :mod:`bundles._store` for the protocol. The copy is the same bundle: the manifest's bytes
as the pointer names them (size and digest checked), and every shard and medium it lists,
each checked against its digest as it arrives, written into a staging directory beside the
destination and committed by the local protocol (FORMAT.md §5), then fully verified where it
lies. The other direction is :func:`bundles._store.write.upload_bundle`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bundles._errors import BundleError, BundleExistsError, BundleIOError, BundleVerificationError
from bundles._format.layout import DIGEST_PREFIX, MANIFEST_NAME, MAX_MANIFEST_BYTES, MEDIA_DIR, SHARDS_DIR
from bundles._format.manifest import Manifest, parse_manifest_bytes
from bundles._format.options import Verify
from bundles._local.commit import commit, create_staging
from bundles._local.fs import fsync_dir, make_read_only, remove_tree
from bundles._local.progress import Progress
from bundles._local.reader import open_local
from bundles._store.client import naming, parallel
from bundles._store.pointer import READ_WINDOW, _bundle_prefix, _BundlePrefix
from bundles._urls import StoreURL

__all__ = ["download_bundle"]


def _fetch(place: Any, rel: str, size: int, digest: str, target: Path, bar: Progress) -> None:
    """Download ``rel`` into ``target`` in windows, hashing as it goes; refuse bytes that are not
    the ones the manifest lists. ``size`` is the manifest's (bounded when it was parsed, but
    untrusted): the windows are produced lazily, and the first short one (an object smaller
    than the manifest says) ends the download, so a forged size costs one request."""
    key = place.key(rel)
    h = hashlib.sha256()
    with open(target, "xb") as f:
        for start in range(0, size, READ_WINDOW):
            want = min(READ_WINDOW, size - start)
            chunk = place.store.get_range(key, start, start + want)
            h.update(chunk)
            f.write(chunk)
            bar.advance(len(chunk))
            if len(chunk) < want:
                break
        f.flush()
        os.fsync(f.fileno())
    found = DIGEST_PREFIX + h.hexdigest()
    if os.path.getsize(target) != size or found != digest:
        raise BundleVerificationError(
            place.url, [f"{place.url}/{rel}: expected {size} bytes with {digest}, found {found}"]
        )
    make_read_only(str(target))


def _pointed_manifest(place: _BundlePrefix, url: StoreURL) -> tuple[bytes, Manifest]:
    """The manifest's bytes and their parse, checked against the pointer's size and digest (a
    plain copy, with no pointer, has none to check)."""
    raw, _ = place.store.get(place.key(MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
    pointer = place.pointer
    if pointer.generation is not None and (
        len(raw) != pointer.manifest_size
        or DIGEST_PREFIX + hashlib.sha256(raw).hexdigest() != pointer.manifest_digest
    ):
        raise BundleError(
            f"{url}/{MANIFEST_NAME}: not the manifest the pointer names (size or digest differ)"
        )
    return raw, parse_manifest_bytes(raw, f"{url}/{MANIFEST_NAME}")


def download_bundle(
    url_text: str,
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """Copy the bundle at ``url`` (a pointer, or a plain copy) into the new directory
    ``out_dir``; return the directory, fully verified.

    Raises:
        BundleExistsError: ``out_dir`` exists and ``overwrite`` is false.
        BundleNotFoundError: no bundle at ``url``.
        BundleVerificationError: an object's bytes differ from the manifest's digest; nothing is
            left at ``out_dir``.
        BundleIOError: the store refused a request after the retries.
    """
    url = StoreURL(url_text)
    dest = Path(os.path.abspath(out_dir))
    if os.path.lexists(dest) and not overwrite:
        raise BundleExistsError(f"{dest}: output exists; pass overwrite=True to replace it")
    place = _bundle_prefix(url, storage_options, "read the pointer")
    raw, manifest = _pointed_manifest(place, url)
    files = [(e.path, e.size, e.digest) for e in manifest.shards]
    files += [(f"{MEDIA_DIR}/{m.filename}", m.size, m.digest) for m in manifest.media]
    staging = create_staging(dest)
    try:
        for sub in (SHARDS_DIR, MEDIA_DIR):
            (staging / sub).mkdir()
        total = sum(size for _, size, _ in files)
        with Progress(f"downloading {url.name}", total=total, unit="B", enabled=progress) as bar:
            try:
                with naming(url, "download the bundle"):
                    parallel(lambda f: _fetch(place, f[0], f[1], f[2], staging / f[0], bar), files)
            except OSError as e:
                if isinstance(e, BundleError):
                    raise
                raise BundleIOError.wrap(dest, f"download {url}", e) from e  # the local disk's
        with open(staging / MANIFEST_NAME, "xb") as f:  # the manifest last, as every writer does
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        make_read_only(str(staging / MANIFEST_NAME))
        for d in (staging / SHARDS_DIR, staging / MEDIA_DIR, staging):
            fsync_dir(d)
        commit(staging, dest, overwrite)
    except BaseException:
        remove_tree(staging)
        raise
    open_local(dest, Verify.FULL).close()
    return dest
