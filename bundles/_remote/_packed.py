"""Packed ``.rbundle`` files on a store: pack to and unpack from a URL.

See :mod:`bundles._remote` for the protocol."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bundles._commit import scratch_dir
from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleNotFoundError,
)
from bundles._faults import fault_point
from bundles._fs import remove_tree
from bundles._layout import PACK_SUFFIX
from bundles._pack import pack_local, unpack_local
from bundles._reader import Bundle
from bundles._remote._pointer import MULTIPART_THRESHOLD, is_remote_bundle
from bundles._remote._probe import check_preconditions
from bundles._remote._read import StorePackedSource
from bundles._remote._write import _rewrite_message
from bundles._store import StoreURL, get_store, store_error


# -- packed files --------------------------------------------------------------------------------
def pack_to_store(
    bundle: Bundle,
    url_text: str,
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> StoreURL:
    """:func:`bundles.pack_bundle` of an open bundle onto a store: packed locally, then uploaded
    in one atomic put (create-only unless ``overwrite``)."""
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    if not overwrite:
        try:
            if (store.head(url.key)) is not None:
                raise BundleExistsError(f"{url}: output exists; pass overwrite=True to replace it")
        except BundleError:
            raise
        except Exception as e:
            raise store_error(url, "look for an existing object", e) from e
        check_preconditions(store, url)  # the create-only put below is one only where honoured
    with tempfile.TemporaryDirectory(prefix="rollout-bundles-pack-") as tmp:
        out = pack_local(bundle, Path(tmp) / url.name, overwrite=False, progress=progress)
        fault_point("store.before-put", url)
        try:
            if out.stat().st_size > MULTIPART_THRESHOLD:
                if not overwrite and (store.head(url.key)) is not None:
                    raise BundleExistsError(f"{url}: output exists; pass overwrite=True to replace it")
                (store.put_large(url.key, out))  # a multipart upload appears atomically at its end
            elif overwrite:
                store.put(url.key, out.read_bytes(), mode="overwrite")
            elif not store.put_create(url.key, out.read_bytes()):
                raise BundleExistsError(f"{url}: output appeared during the pack; not replaced")
        except BundleError:
            raise
        except Exception as e:
            raise store_error(url, "upload the packed bundle", e) from e
    return url


def unpack_from_store(
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
        source = StorePackedSource(url, store)
    except BundleNotFoundError:
        if not is_remote_bundle(url, storage_options):
            raise
        raise BundleNotFoundError(
            f"{url}: a bundle directory on the store, not a packed file: copy it with "
            f"`rollout-bundle cp {url} DIR` (or read it in place: open_bundle({str(url)!r}))"
        ) from None
    scratch = scratch_dir(dest, "download")
    try:
        packed = scratch / url.name
        with open(packed, "xb") as f:
            data = (source._store.get(url.key))[0]
            f.write(data)
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
    try:
        meta = get_store(url, storage_options).head(url.key)
    except Exception as e:
        raise store_error(url, "read the object's size", e) from e
    if meta is None:
        raise BundleNotFoundError(f"{url}: no object here")
    return int(meta["size"])


def object_exists(url_text: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether the object at ``url`` exists (a packed bundle on a store: one HEAD)."""
    url = StoreURL(url_text)
    try:
        return get_store(url, storage_options).head(url.key) is not None
    except Exception as e:
        raise store_error(url, "look for the object", e) from e


def remove_packed_object(url_text: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete a packed bundle on a store: one object, so one delete is atomic for readers."""
    url = StoreURL(url_text)
    if not object_exists(url, storage_options):
        raise BundleNotFoundError(f"{url}: no bundle here (no such object)")
    try:
        get_store(url, storage_options).delete([url.key])
    except Exception as e:
        raise store_error(url, "remove the packed bundle", e) from e


def list_packed_objects(prefix_text: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The packed bundles (``*.rbundle`` objects) right under ``prefix``, as URLs."""
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    try:
        names = store.files(url.key)
    except Exception as e:
        raise store_error(url, "list the packed bundles", e) from e
    return sorted(str(url.child(n)) for n in names if n.endswith(PACK_SUFFIX) and n != PACK_SUFFIX)
