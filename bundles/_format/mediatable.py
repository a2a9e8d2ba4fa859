"""A manifest's media list held as columns: ~44 bytes a file, no Python object per file.

A bundle whose every sample has its own screenshot lists one media entry per sample, so what a
reader holds per entry is what its memory grows by (issue 39, item 6). Before, each entry was
held three times over: the JSON object as parsed (a dict, two strings and an int), its
:class:`MediaEntry` and the reader's ``MediaRef`` with its path, ~1 KB a file. Here the entries
are three columns filled as the manifest's ``media`` array is parsed (``bundles._format.manifest``
streams it, an entry at a time, so no list of parsed objects exists at any moment either):

* the digests, 32 raw bytes each, in one ``bytearray``;
* the sizes in an ``array('q')``;
* the suffixes as indices (``array('I')``) into a tuple of the distinct suffixes (one, ``.png``,
  in a run's bundle).

:class:`MediaTable` is a read-only ``Sequence[MediaEntry]`` over them: an entry, or the stored name
``<hex><suffix>``, is built when asked for. :meth:`MediaTable.find` looks a stored name up by a
binary search in (digest, suffix) order: O(log n), with no index to build when the manifest is
sorted as FORMAT.md §2 says it is (a writer's always is); an unsorted one (another writer's) gets
a permutation, 4 bytes an entry. A binary search is chosen over a hash table keyed by the digests:
they come from an untrusted manifest, and an attacker can pick digests that collide in any hash of
a few bytes, never ones that make a search deeper than log2(n) steps.

Entries with fields the format does not define keep them (readers ignore them, FORMAT.md §2) in a
map by index, for :meth:`MediaTable.as_json`: a writer's bundle has none.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, overload

from bundles._format.layout import DIGEST_PREFIX

__all__ = ["MediaEntry", "MediaTable"]

DIGEST_BYTES = 32


def find_sorted(
    key: Callable[[int], tuple[bytes, str]], n: int, order: Sequence[int] | None, target: tuple[bytes, str]
) -> int:
    """The entry ``i`` (of ``n``) whose ``key(i)`` is ``target``, or -1: a binary search over
    entries in ascending key order, their own (``order`` None) or ``order``'s. The one search
    of a media table and of a packed file's member index (no hash table keyed by untrusted
    digests; log2(n) steps whatever the keys)."""
    lo, hi = 0, n
    while lo < hi:  # bisect_left(key=...) measured ~13 % slower here (7.7 against 6.8 us a find)
        mid = (lo + hi) // 2
        if key(mid if order is None else order[mid]) < target:
            lo = mid + 1
        else:
            hi = mid
    j = -1 if lo >= n else lo if order is None else order[lo]
    return j if j >= 0 and key(j) == target else -1


@dataclass(frozen=True)
class MediaEntry:
    """One entry of ``manifest["media"]`` (FORMAT.md §2), validated."""

    digest: str  #: ``sha256:<hex>``
    size: int
    suffix: str  #: e.g. ``.png``; may be empty

    @property
    def filename(self) -> str:
        """The stored name, ``<hex><suffix>``, under ``media/``."""
        return self.digest[7:] + self.suffix


class MediaTable(Sequence[MediaEntry]):
    """The validated ``media`` list of a manifest, in its stored order; see the module docstring.

    Built by the manifest parser only (:meth:`append` after each entry is validated, then
    :meth:`seal`); read-only afterwards."""

    __slots__ = ("_digests", "_extras", "_ids", "_order", "_sizes", "_suffix_ids", "_suffixes")

    def __init__(self) -> None:
        self._digests = bytearray()
        self._sizes = array("q")
        self._ids = array("I")
        self._suffixes: list[str] = []
        self._suffix_ids: dict[str, int] = {}
        self._order: array[int] | None = None  # None: stored in (digest, suffix) order
        self._extras: dict[int, dict[str, Any]] = {}

    # -- building (the manifest parser) -----------------------------------------------------------
    def append(self, digest: bytes, size: int, suffix: str, extra: dict[str, Any] | None = None) -> None:
        """Add a validated entry: ``digest`` the 32 raw bytes, ``extra`` its unknown fields."""
        sid = self._suffix_ids.get(suffix)
        if sid is None:
            sid = self._suffix_ids[suffix] = len(self._suffixes)
            self._suffixes.append(suffix)
        if extra:
            self._extras[len(self._sizes)] = extra
        self._digests += digest
        self._sizes.append(size)
        self._ids.append(sid)

    def key(self, i: int) -> tuple[bytes, str]:
        """Entry ``i``'s (digest bytes, suffix): FORMAT.md §2's order."""
        return bytes(self._digests[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES]), self._suffixes[self._ids[i]]

    def first_duplicate(self) -> int | None:
        """Sort an unsorted table's index (kept for :meth:`find`); return the smallest index
        whose (digest, suffix) an earlier entry has, or None. A table appended in order (checked
        by the parser as it goes, which finds its duplicates itself) has no index to build."""
        order = sorted(range(len(self)), key=self.key)
        first: int | None = None
        for a, b in pairwise(order):
            if self.key(a) == self.key(b) and (first is None or b < first):
                first = b  # the sort is stable: b is the later of the two
        self._order = array("I", order)
        return first

    def seal(self) -> MediaTable:
        self._suffix_ids = {}
        return self

    # -- reading -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._sizes)

    @overload
    def __getitem__(self, index: int) -> MediaEntry: ...
    @overload
    def __getitem__(self, index: slice) -> list[MediaEntry]: ...
    def __getitem__(self, index: int | slice) -> MediaEntry | list[MediaEntry]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        i = range(len(self))[index]  # IndexError as a list raises it; negative from the end
        return MediaEntry(self.digest(i), self._sizes[i], self.suffix(i))

    def __iter__(self) -> Iterator[MediaEntry]:
        for i in range(len(self)):
            yield MediaEntry(self.digest(i), self._sizes[i], self.suffix(i))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MediaTable):
            # Column by column, no dict an entry (a reader compares the manifest it opened with
            # the one there now after every failed verify). The suffixes are numbered in the
            # order the entries meet them: the same entries, the same numbers.
            return (
                self._digests == other._digests
                and self._sizes == other._sizes
                and self._suffixes == other._suffixes
                and self._ids == other._ids
                and self._extras == other._extras
            )
        if isinstance(other, (list, tuple)):
            return list(self) == list(other) or self.as_json() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MediaTable({len(self)} entries)"

    def hexdigest(self, i: int) -> str:
        return self._digests[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES].hex()

    def digest(self, i: int) -> str:
        """``sha256:<hex>`` of entry ``i``."""
        return DIGEST_PREFIX + self.hexdigest(i)

    def size(self, i: int) -> int:
        return self._sizes[i]

    def suffix(self, i: int) -> str:
        return self._suffixes[self._ids[i]]

    def filename(self, i: int) -> str:
        """The stored name of entry ``i``, ``<hex><suffix>``, under ``media/``."""
        return self.hexdigest(i) + self._suffixes[self._ids[i]]

    def total_size(self) -> int:
        return sum(self._sizes)

    def sorted_indices(self) -> Iterator[int]:
        """The indices in (digest, suffix) order: the order of the stored names as strings."""
        return iter(range(len(self)) if self._order is None else self._order)

    def find(self, name: str) -> int:
        """The index of the entry stored as ``name`` (``<64 lowercase hex><suffix>``); -1 when
        no entry is (a binary search: see the module docstring)."""
        hexpart = name[:64]
        try:
            key = bytes.fromhex(hexpart)
        except ValueError:
            return -1
        if len(key) != DIGEST_BYTES or key.hex() != hexpart:  # bytes.fromhex takes upper case, spaces
            return -1
        # The search compares the whole (digest, suffix) key, the table's order: one digest
        # listed with many suffixes (a hostile manifest may list 500,000) costs log2(n) steps too.
        return find_sorted(self.key, len(self._sizes), self._order, (key, name[64:]))

    def as_json(self) -> list[dict[str, Any]]:
        """The list as the manifest stores it (a dict per entry: for JSON, not for a large loop)."""
        out = []
        for i in range(len(self)):
            ent = {"digest": self.digest(i), "size": self._sizes[i], "suffix": self.suffix(i)}
            extra = self._extras.get(i)
            out.append(ent if extra is None else {**extra, **ent})
        return out
