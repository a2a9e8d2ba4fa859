"""A bundle's stored media as views over its manifest's :class:`MediaTable`, built on demand.

An open :class:`~bundles.Bundle` holds no object per media file (issue 39, item 6: a bundle
with a screenshot per sample lists as many files as samples). :class:`StoredMedia` maps a stored
name ``<hex><suffix>`` to its ``MediaRef`` with ``path`` set where the source keeps it (the
sample decoder resolves references through it, a binary search each, cached per shard by the
decoder); :class:`MediaRefs` is ``bundle.media``, a read-only sequence in the manifest's order.
Each ``MediaRef`` is made when asked for: two lookups of one name give equal references, not the
same object.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import overload

from bundles._format.layout import MEDIA_DIR
from bundles._format.media import MediaRef, trusted_ref
from bundles._format.mediatable import MediaTable
from bundles._local.sources import Source

__all__ = ["MediaRefs", "StoredMedia"]


class StoredMedia(Mapping[str, MediaRef]):
    """Stored name -> ``MediaRef`` (``path`` set) of every file a bundle's manifest lists."""

    __slots__ = ("_source", "table")

    def __init__(self, table: MediaTable, source: Source) -> None:
        self.table = table
        self._source = source

    def ref(self, i: int) -> MediaRef:
        """Entry ``i``'s reference, with its path (values the manifest parser validated)."""
        table = self.table
        ref = trusted_ref(table.digest(i), table.size(i), table.suffix(i))
        path = self._source.media_path(f"{MEDIA_DIR}/{table.filename(i)}")
        object.__setattr__(ref, "path", path)
        return ref

    def __getitem__(self, name: str) -> MediaRef:
        i = self.table.find(name) if isinstance(name, str) else -1
        if i < 0:
            raise KeyError(name)
        return self.ref(i)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.table.find(name) >= 0

    def __iter__(self) -> Iterator[str]:
        table = self.table
        return (table.filename(i) for i in range(len(table)))

    def __len__(self) -> int:
        return len(self.table)

    def items(self) -> Iterator[tuple[str, MediaRef]]:  # type: ignore[override]
        """(name, ref) pairs in the manifest's order, each built once."""
        table = self.table
        return ((table.filename(i), self.ref(i)) for i in range(len(table)))

    def values(self) -> Iterator[MediaRef]:  # type: ignore[override]
        return (self.ref(i) for i in range(len(self.table)))


class MediaRefs(Sequence[MediaRef]):
    """``bundle.media``: every stored file's ``MediaRef``, in the manifest's order, made when read."""

    __slots__ = ("_stored",)

    def __init__(self, stored: StoredMedia) -> None:
        self._stored = stored

    def __len__(self) -> int:
        return len(self._stored)

    @overload
    def __getitem__(self, index: int) -> MediaRef: ...
    @overload
    def __getitem__(self, index: slice) -> list[MediaRef]: ...
    def __getitem__(self, index: int | slice) -> MediaRef | list[MediaRef]:
        if isinstance(index, slice):
            return [self._stored.ref(i) for i in range(len(self))[index]]
        return self._stored.ref(range(len(self))[index])

    def __iter__(self) -> Iterator[MediaRef]:
        return self._stored.values()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (MediaRefs, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MediaRefs({len(self)} files)"
