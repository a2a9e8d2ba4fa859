"""Packed ``.rbundle`` files on a store: pack to and unpack from a URL.

See :mod:`bundles._store` for the protocol."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleIOError,
    BundleNotFoundError,
    ObjectExistsError,
)
from bundles._format.layout import PACK_SUFFIX
from bundles._local.commit import scratch_dir
from bundles._local.faults import fault_point
from bundles._local.fs import remove_tree
from bundles._local.pack import pack_local, unpack_local
from bundles._local.reader import Bundle
from bundles._store.client import Store, get_store
from bundles._store.pointer import MULTIPART_THRESHOLD, has_bundle_on_store
from bundles._store.probe import check_preconditions
from bundles._store.read import StorePackedSource
from bundles._store.write import _rewrite_message
from bundles._urls import StoreURL


# -- packed files --------------------------------------------------------------------------------
def pack_on_store(
    bundle: Bundle,
    url_text: str,
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> StoreURL:
    """:func:`bundles.pack_bundle` of an open bundle onto a store: packed locally, then uploaded
    in one atomic put (create-only unless ``overwrite``).

    Verify, then publish: the put is the publication, and what it puts was verified in full
    before it: :func:`bundles._local.pack.pack_local` hashes every member it writes against the
    manifest and refuses a bundle that disagrees, so a damaged bundle never replaces the object.
    The local file lies in a scratch directory named after this process
    (:func:`bundles._local.commit.scratch_dir`): a SIGKILLed packer's is removed by the next one."""
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    if not overwrite:
        if store.head(url.key) is not None:
            raise BundleExistsError(f"{url}: output exists; pass overwrite=True to replace it")
        check_preconditions(store, url)  # the create-only put below is one only where honoured
    scratch = scratch_dir(os.path.join(tempfile.gettempdir(), "rollout-bundles-pack"), "pack")
    try:
        out = pack_local(bundle, scratch / url.name, overwrite=False, progress=progress)
        fault_point("store.before-put", url)
        if out.stat().st_size > MULTIPART_THRESHOLD:
            if not overwrite and store.head(url.key) is not None:
                raise BundleExistsError(f"{url}: output exists; pass overwrite=True to replace it")
            store.put_large(url.key, out)  # a multipart upload appears atomically at its end
        elif overwrite:
            store.put(url.key, out.read_bytes())
        else:
            _put_create_confirmed(store, url, out.read_bytes())
    finally:
        remove_tree(scratch)
    return url


def _put_create_confirmed(store: Store, url: StoreURL, data: bytes) -> None:
    """The create-only put of a packed object, then a HEAD: the object must carry the ETag our put
    was answered with. Where a store dropped ``If-None-Match`` since the probe, of two racing
    writers the one overtaken learns it lost (see FORMAT.md §9 for what remains unseen)."""
    try:
        etag = store.put_new(url.key, data)
    except ObjectExistsError:
        raise BundleExistsError(f"{url}: output appeared during the pack; not replaced") from None
    fault_point("store.before-confirm", url)
    meta = store.head(url.key)
    found = (meta or {}).get("e_tag")
    if meta is None or (etag is not None and found != etag):
        raise BundleExistsError(
            f"{url}: this writer lost: read back right after it was put, the object "
            f"{'is gone' if meta is None else f'has ETag {found}, not ours ({etag})'}; another writer put "
            "it over ours (a store that drops If-None-Match). Nothing of theirs was changed"
        )


def unpack_on_store(
    url_text: str,
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Bundle:
    """:func:`bundles.unpack_bundle` from a packed object on a store: its headers checked in
    place by the same rules, then downloaded, unpacked into a local directory and fully
    verified there."""
    url = StoreURL(url_text)
    dest = Path(os.path.abspath(out_dir))
    if os.path.lexists(dest) and not overwrite:
        raise BundleExistsError(f"{dest}: output exists; pass overwrite=True to replace it")
    store = get_store(url, storage_options)
    try:
        source = StorePackedSource(url, store, manifest_first=False)  # the headers only, here
    except BundleNotFoundError:
        if not has_bundle_on_store(url, storage_options):
            raise
        raise BundleNotFoundError(
            f"{url}: a bundle directory on the store, not a packed file: copy it with "
            f"`rollout-bundle cp {url} DIR` (or read it in place: open_bundle({str(url)!r}))"
        ) from None
    scratch = scratch_dir(dest, "download")
    try:
        packed = scratch / url.name
        with open(packed, "xb") as f:
            try:  # in windows of ranges: a packed bundle of any size never in memory whole
                source._store.download_into(url.key, f.fileno(), source.size)
            except OSError as e:
                if isinstance(e, BundleError):
                    raise
                raise BundleIOError.wrap(packed, f"download {url}", e) from e  # the local disk's
        try:
            return unpack_local(packed, dest, overwrite=overwrite, progress=progress)
        except BundleError as e:
            _rewrite_message(e, str(packed), str(url))
            raise
    finally:
        remove_tree(scratch)


def object_size(url_text: str, storage_options: Mapping[str, Any] | None = None) -> int:
    """The size of one object (a packed bundle on a store)."""
    url = StoreURL(url_text)
    meta = get_store(url, storage_options).head(url.key)
    if meta is None:
        raise BundleNotFoundError(f"{url}: no object here")
    return int(meta["size"])


def object_exists(url_text: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether the object at ``url`` exists (a packed bundle on a store: one HEAD)."""
    url = StoreURL(url_text)
    return get_store(url, storage_options).head(url.key) is not None


def remove_packed_object(url_text: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete a packed bundle on a store: one object, so one delete is atomic for readers."""
    url = StoreURL(url_text)
    if not object_exists(url, storage_options):
        raise BundleNotFoundError(f"{url}: no bundle here (no such object)")
    get_store(url, storage_options).delete([url.key])


def list_packed_objects(prefix_text: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The packed bundles (``*.rbundle`` objects) right under ``prefix``, as URLs."""
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    names = store.files(url.key)
    return sorted(str(url.child(n)) for n in names if n.endswith(PACK_SUFFIX) and n != PACK_SUFFIX)
