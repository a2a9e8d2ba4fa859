"""A packed file's members, indexed (issue 39, item 6): :class:`MemberIndex` and :class:`SeenNames`.

:func:`bundles._local.archive.read_tar_index` checks each tar header and adds the member it
describes here; what is held per member is what a packed reader's memory grows by, one media
member per distinct screenshot. Two ways, chosen by the archive:

* ``pack``'s order puts ``manifest.json`` first: ``read_tar_index`` parses it as soon as its header
  passed, and the media members after it are held by the entry numbers of its
  :class:`~bundles._format.mediatable.MediaTable`, an offset and a size (16 bytes a file), their
  names being the table's. The table is the one the open bundle keeps (handed over by
  :meth:`MemberIndex.take_manifest`), so a packed bundle holds the digests once. Nothing of the
  manifest decides anything before the last header passed: a name is checked by the archive's
  rules first, then looked up; "appears twice" is told from the names read (:class:`SeenNames`),
  not from the table. A member the table does not list is held by name, as below, for
  ``verify`` to report. The arrays are sized by the table, whose entries the manifest's cap
  bounds (16 bytes beside each entry's 44).
* any other archive (another tool's order, a manifest that does not parse): the media members
  by name, in columns: 32-byte digest, offset, size, suffix number (52 bytes), found by binary
  search over (digest, suffix). Before either, a dict of :class:`Member` objects and their names
  held ~290 bytes a file.

Trade-off: the first way holds 36 bytes a file less (3.6 MB at 100,000 screenshots) for the
manifest parsed before the archive's other headers, and, where the manifest does not parse,
parsed twice (``load_manifest`` parses it again after the index, so that its error comes after
the archive's own, as before).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bundles._format.layout import MEDIA_DIR
from bundles._format.mediatable import find_sorted
from bundles._local.sources import media_name_ok

if TYPE_CHECKING:
    from bundles._format.manifest import Manifest
    from bundles._format.mediatable import MediaTable

__all__ = ["Member", "MemberIndex", "Seen", "SeenNames"]


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a packed bundle: where its data starts in the file, and its size."""

    name: str
    is_dir: bool
    offset: int
    size: int


_MEDIA = MEDIA_DIR + "/"


def _media_key(name: str) -> tuple[bytes, str] | None:
    """``media/<64 lowercase hex><suffix>`` as (32 raw bytes, suffix); None for any other name."""
    if not name.startswith(_MEDIA) or not media_name_ok(name[len(_MEDIA) :]):
        return None
    return bytes.fromhex(name[len(_MEDIA) : len(_MEDIA) + 64]), name[len(_MEDIA) + 64 :]


class MemberIndex(Mapping[str, Member]):
    """A packed file's members by name, as :func:`~bundles._local.archive.read_tar_index` read them.

    The media members, one per distinct media file, are held by the manifest's entry number
    (:meth:`by_entry`: an offset and a size in two ``array('q')`` at the entry's number in the
    manifest's table, -1 for not in the archive; 16 bytes a file, the name the table's) and, the
    ones the table does not list or all of them without a table, by name in columns (a digest as
    32 raw bytes, an offset, a size, a suffix number: 52 bytes), found by binary search over
    (digest, suffix), in the archive's order when it is sorted, else through an order built once
    the index is read. See the module docstring. The other members (the manifest, the two
    directories, the shards) are a dict. A ``Member`` is built when asked for. Iteration gives
    the members in the archive's order, except that the media members the manifest lists come
    in their names' order (``pack``'s), then the others in the archive's.
    """

    def __init__(self) -> None:
        self._named: dict[str, Member] = {}
        self._media_at = -1  # how many named members came before the first media member
        self._digests = bytearray()
        self._suffix = array("I")
        self._suffixes: list[str] = []
        self._suffix_ids: dict[str, int] = {}
        self._offsets = array("q")
        self._sizes = array("q")
        self._order: array[int] | None = None
        # By entry number (by_entry): the manifest's table, each entry's member offset and size.
        self._table: MediaTable | None = None
        self._entry_offsets = array("q")
        self._entry_sizes = array("q")
        self._listed = 0  # how many entries have their member
        self._next = 0  # the entry after the last one found: pack's order finds each there
        self._manifest: Manifest | None = None

    def by_entry(self, manifest: Manifest) -> None:
        """Hold the media members ``manifest`` lists by its table's entry numbers from now on
        (before any media member is added): ``manifest`` parsed from this archive's first
        member, handed over once by :meth:`take_manifest` after the whole index is read."""
        if self._sizes or self._table is not None:
            raise ValueError("by_entry: media members were already added")
        self._table = manifest.media
        self._entry_offsets = array("q", [-1]) * len(manifest.media)
        self._entry_sizes = array("q", [0]) * len(manifest.media)
        self._manifest = manifest

    def take_manifest(self) -> Manifest | None:
        """The manifest :meth:`by_entry` was given, once (None after, or without one): for
        :func:`bundles._local.reader.load_manifest`, so that the index and the open bundle share
        one media table and the manifest is parsed once."""
        manifest, self._manifest = self._manifest, None
        return manifest

    def _entry(self, name: str, key: tuple[bytes, str]) -> int:
        """The table's entry number for the media member ``name`` (its ``key``); -1 if unlisted."""
        table = self._table
        assert table is not None
        j = self._next
        if not (j < len(table) and table.key(j) == key):
            j = table.find(name[len(_MEDIA) :])
        if j >= 0:
            self._next = j + 1
        return j

    def add(self, m: Member) -> None:
        key = None if m.is_dir else _media_key(m.name)
        if key is None:
            self._named[m.name] = m
            return
        if self._media_at < 0:
            self._media_at = len(self._named)
        if self._table is not None:
            j = self._entry(m.name, key)
            if j >= 0:
                if self._entry_offsets[j] >= 0:  # read_tar_index refuses a repeat before this
                    raise ValueError(f"{m.name}: added twice")
                self._entry_offsets[j] = m.offset
                self._entry_sizes[j] = m.size
                self._listed += 1
                return
        n = len(self._sizes)
        if self._order is None and n and key <= self._key(n - 1):
            self._order = array("I")  # not in order: sorted in finish()
        sid = self._suffix_ids.setdefault(key[1], len(self._suffixes))
        if sid == len(self._suffixes):
            self._suffixes.append(key[1])
        self._digests += key[0]
        self._suffix.append(sid)
        self._offsets.append(m.offset)
        self._sizes.append(m.size)

    def finish(self) -> MemberIndex:
        if self._order is not None:
            self._order = array("I", sorted(range(len(self._sizes)), key=self._key))
        return self

    def _key(self, i: int) -> tuple[bytes, str]:
        return bytes(self._digests[32 * i : 32 * i + 32]), self._suffixes[self._suffix[i]]

    def _media(self, i: int) -> Member:
        name = f"{_MEDIA}{self._digests[32 * i : 32 * i + 32].hex()}{self._suffixes[self._suffix[i]]}"
        return Member(name, False, self._offsets[i], self._sizes[i])

    def _listed_member(self, j: int) -> Member:
        assert self._table is not None
        return Member(_MEDIA + self._table.filename(j), False, self._entry_offsets[j], self._entry_sizes[j])

    def _find(self, key: tuple[bytes, str]) -> int:
        return find_sorted(self._key, len(self._sizes), self._order, key)

    def __getitem__(self, name: str) -> Member:
        m = self._named.get(name)
        if m is not None:
            return m
        key = _media_key(name)
        if key is None:
            raise KeyError(name)
        if self._table is not None:
            j = self._table.find(name[len(_MEDIA) :])
            if j >= 0:  # listed: in the archive or not at all (never among the unlisted)
                if self._entry_offsets[j] < 0:
                    raise KeyError(name)
                return self._listed_member(j)
        i = self._find(key)
        if i < 0:
            raise KeyError(name)
        return self._media(i)

    def __iter__(self) -> Iterator[str]:
        return (m.name for m in self.values())

    def values(self) -> Iterator[Member]:  # type: ignore[override]
        """The members in the archive's order (the media ones where the first of them was:
        those the manifest lists in their names' order, then the others in the archive's)."""
        named = list(self._named.values())
        at = len(named) if self._media_at < 0 else self._media_at
        yield from named[:at]
        if self._table is not None and self._listed:
            offsets = self._entry_offsets
            yield from (self._listed_member(j) for j in self._table.sorted_indices() if offsets[j] >= 0)
        yield from (self._media(i) for i in range(len(self._sizes)))
        yield from named[at:]

    def __len__(self) -> int:
        return len(self._named) + self._listed + len(self._sizes)


class Seen(Protocol):
    """What :func:`~bundles._local.archive.check_member` asks of the names read so far."""

    def __contains__(self, name: object) -> bool: ...
    def add(self, name: str) -> None: ...


class SeenNames:
    """The names :func:`~bundles._local.archive.read_tar_index` has read, for :func:`~bundles._local.archive.check_member`'s "appears twice",
    held as the index itself: while the names come in increasing order (``pack`` writes them
    so), a name after the last cannot be a repeat; the first that is not turns this into a set
    of every name read (a foreign archive's order costs a set while its index is read)."""

    def __init__(self, index: MemberIndex) -> None:
        self._index = index
        self._last: str | None = None
        self._set: set[str] | None = None

    def __contains__(self, name: object) -> bool:
        if self._set is None and (self._last is None or str(name) > self._last):
            return False
        if self._set is None:
            self._set = set(self._index)
        return name in self._set

    def add(self, name: str) -> None:
        if self._set is not None:
            self._set.add(name)
        self._last = name
