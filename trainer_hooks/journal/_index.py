"""Which records and media each segment of a rollout journal holds, and so what compaction deletes.

The writer (:mod:`._writer`) tells the index each segment it starts and each record it writes
(its seq and the media names it references); a resumed journal's older segments are adopted
when first compacted. ``compact(upto)`` then answers what a committed checkpoint covering every
record up to ``upto`` lets go:

* **on a disk**, every segment whose records are all covered, and the media files that only
  those segments referenced (a media file is in one place, ``journal/media``, shared by all);
* **on a store**, every such shipment whose *carried* media (the files it brought, see
  :mod:`._store_sink`) no live record references; a covered shipment still carrying a file
  that a later record needs is kept, *retired*, until that record is covered too.

Not thread-safe by itself: the journal calls it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SegmentIndex"]


@dataclass
class _Segment:
    first: int
    last: int
    media: set[str] = field(default_factory=set)  # names its records reference
    carried: set[str] = field(default_factory=set)  # on a store: names its shipment brought


class SegmentIndex:
    """See the module docstring."""

    def __init__(self) -> None:
        self._segments: dict[Path, _Segment] = {}
        self._refs: dict[str, int] = {}  # media name -> live segments referencing it
        self._retired: dict[Path, set[str]] = {}  # covered shipments kept for what they carry

    def __len__(self) -> int:
        return len(self._segments)

    def __contains__(self, path: object) -> bool:
        return path in self._segments or path in self._retired

    def start(self, path: Path, first_seq: int) -> None:
        self._segments[path] = _Segment(first_seq, first_seq - 1)

    def note(self, path: Path, seq: int, media: list[str]) -> None:
        """Record ``seq``, referencing ``media``, was written to segment ``path``."""
        seg = self._segments[path]
        seg.last = seq
        for name in media:
            if name not in seg.media:
                seg.media.add(name)
                self._refs[name] = self._refs.get(name, 0) + 1

    def carried(self, path: Path, names: set[str]) -> None:
        """Segment ``path`` was made durable with media files ``names`` (on a store: its
        shipment carries them)."""
        self._segments[path].carried |= names

    def adopt(
        self,
        path: Path,
        first: int,
        last: int,
        media: set[str],
        carried: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """A segment written before this journal started (a resumed lineage's)."""
        if last < first:  # no complete record: nothing it covers, only what it carried
            if carried:
                self._retired[path] = set(carried)
            return
        self._segments[path] = _Segment(first, last, set(media), set(carried))
        for name in media:
            self._refs[name] = self._refs.get(name, 0) + 1

    def _cover(self, upto: int, active: Path | None) -> list[tuple[Path, _Segment, list[str]]]:
        """Drop the segments wholly at or before ``upto`` (never ``active``); each with the media
        names no live segment references any more."""
        out = []
        for path, seg in sorted(self._segments.items()):
            if path == active or seg.last > upto or seg.last < seg.first:
                continue
            del self._segments[path]
            unreferenced = []
            for name in seg.media:
                left = self._refs.get(name, 0) - 1
                if left > 0:
                    self._refs[name] = left
                else:
                    self._refs.pop(name, None)
                    unreferenced.append(name)
            out.append((path, seg, unreferenced))
        return out

    def compact_files(self, upto: int, active: Path | None) -> tuple[list[Path], list[str]]:
        """On a disk: (segments, media names) that may be deleted."""
        covered = self._cover(upto, active)
        return [p for p, _, _ in covered], [n for _, _, names in covered for n in names]

    def compact_shipments(self, upto: int, active: Path | None) -> tuple[int, list[tuple[Path, set[str]]]]:
        """On a store: (segments covered, [(shipment, the media it carried)] that may be deleted)."""
        covered = self._cover(upto, active)
        for path, seg, _ in covered:
            self._retired[path] = seg.carried
        gone = [(p, c) for p, c in self._retired.items() if not any(n in self._refs for n in c)]
        for path, _ in gone:
            del self._retired[path]
        return len(covered), gone
