"""A prefix on an object store for objects a tool keeps beside its bundles (the rollout journal).

A bundle on a store is written, read and removed through :func:`bundles.write_bundle` and its
peers; a tool that keeps objects of its own next to bundles (trainer_hooks' rollout journal keeps
one create-only object per flush interval under ``<save>/rollout/journal/``) needs a handful of
operations on flat objects instead, with the same configuration, the same errors naming the URL,
and the same refusal of a store that ignores preconditions (:mod:`._probe`). That is all
:class:`StorePrefix` is: it knows nothing of what the objects hold.

Names are one path component each (no ``/``, no ``.``/``..``): an object listed under the prefix
whose name is anything else is not returned by :meth:`StorePrefix.names`, so a name read back from
a (possibly hostile) store can be used as a local file name only after the caller's own check of
its form, never as a path. Reads are bounded: :meth:`StorePrefix.get` refuses an object larger
than the caller's limit before downloading it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from bundles._errors import BundleError, BundleNotFoundError, ObjectTooLargeError
from bundles._store.client import Store, get_store
from bundles._store.probe import check_preconditions
from bundles._urls import StoreURL, classify

__all__ = ["StorePrefix"]

_NAME_RE = re.compile(r"[^/\x00]+")


class StorePrefix:
    """The objects right under one store prefix (``s3://bucket/a/b``), by name.

    Args:
        url: an ``s3://``, ``gs://`` or ``az://`` URL (configured as :mod:`bundles._store.client` says).
        storage_options: obstore options, as for :func:`bundles.write_bundle`.
    """

    def __init__(self, url: str | StoreURL, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url if isinstance(url, StoreURL) else StoreURL(str(url))
        self.storage_options = dict(storage_options or {})
        self._store: Store | None = None
        self._checked = False

    @classmethod
    def at(
        cls, location: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> StorePrefix | None:
        """The prefix at ``location`` when it is a store URL, None for a local path (another
        URL scheme, or a store URL without its extra, raises :class:`UnsupportedLocationError`)."""
        if classify(location) != "store":
            return None
        return cls(str(location), storage_options)

    def child(self, name: str) -> StorePrefix:
        """The prefix ``<url>/<name>`` (``name`` may hold ``/``-separated parts)."""
        return StorePrefix(self.url.child(name), self.storage_options)

    def __str__(self) -> str:
        return str(self.url)

    def __repr__(self) -> str:
        return f"StorePrefix({str(self.url)!r})"

    def _key(self, name: str) -> str:
        if name in (".", "..") or not _NAME_RE.fullmatch(name):
            raise BundleError(f"{self.url}: {name!r} is not an object name (one path component)")
        return self.url.key_of(name)

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = get_store(self.url, self.storage_options)
        return self._store

    def check_preconditions(self) -> None:
        """Ask the store now whether it honours preconditions (once per process and bucket; see
        :mod:`bundles._store.probe`): :class:`UnsafeStoreError` when it does not, unless the
        single-writer opt-in is set. :meth:`put_create` asks before its first put anyway."""
        if not self._checked:
            check_preconditions(self.store, self.url.child("probe"))
            self._checked = True

    def put_create(self, name: str, data: bytes | bytearray | memoryview) -> bool:
        """Store ``data`` at ``name`` unless an object is there: True when this call created it,
        False when one was there already (it is left as it was). The first put through a prefix
        asks the store whether it honours preconditions (:mod:`bundles._store.probe`); one that
        does not is refused with :class:`UnsafeStoreError` unless the single-writer opt-in is set."""
        key = self._key(name)
        self.check_preconditions()
        return self.store.put_create(key, data)

    def _size(self, key: str, url: StoreURL, max_bytes: int) -> int:
        """The size of the object at ``key``, from its head, before anything is downloaded: one
        that is absent or over ``max_bytes`` is refused here."""
        head = self.store.head(key)
        if head is None:
            raise BundleNotFoundError(f"{url}: not found")
        size = int(head.get("size", 0))
        if size > max_bytes:
            raise ObjectTooLargeError(f"{url}: {size} bytes exceeds the limit of {max_bytes} bytes")
        return size

    def get(self, name: str, *, max_bytes: int) -> bytes:
        """The bytes of object ``name``: :class:`BundleNotFoundError` when it is not there, a
        :class:`BundleError` when it is larger than ``max_bytes`` (checked before downloading)."""
        key = self._key(name)
        data, _ = self.store.get(key, max_bytes, "limit")
        return data

    def download(self, name: str, path: str | os.PathLike[str], *, max_bytes: int) -> int:
        """Write object ``name`` into the new file ``path`` (created exclusively, never through a
        symlink) and return its size; bounded like :meth:`get`. A large object is read in
        8 MiB ranges, four at once, each written where it belongs before the next are read
        (:meth:`bundles._store.client.Store.download_into`): at most 32 MiB of it is held in memory."""
        key = self._key(name)
        url = self.url.child(name)
        try:
            size = self._size(key, url, max_bytes)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                self.store.download_into(key, fd, size)
            finally:
                os.close(fd)
        except BundleError:
            raise
        except OSError as e:  # the local file's: the store's are BundleErrors
            raise BundleError(f"{url}: cannot download into {path}: {e.strerror or e}") from None
        return size

    def names(self) -> dict[str, int]:
        """Every object right under the prefix (not below), name -> size; names that are not one
        path component are left out."""
        listing = self.store.listing(self.url.key)
        base = self.url.key + "/" if self.url.key else ""
        out: dict[str, int] = {}
        for meta in listing:
            rel = str(meta["path"])[len(base) :]
            if rel and "/" not in rel and rel not in (".", "..") and _NAME_RE.fullmatch(rel):
                out[rel] = int(meta.get("size", 0))
        return out

    def delete(self, names: Iterable[str]) -> None:
        """Delete these objects (absent ones are no error)."""
        keys = [self._key(n) for n in names]
        if keys:
            self.store.delete(keys)
