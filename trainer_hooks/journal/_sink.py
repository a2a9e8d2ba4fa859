"""Where a rollout journal's segments go: a :class:`JournalSink`, chosen once where it is opened.

The writer (:class:`~._writer.RolloutJournal`) frames records into segment files in
``sink.directory`` and knows nothing else of where they go; the sink does the four things that
differ between a disk and an object store:

* **make a segment durable** (:meth:`JournalSink.make_durable`): on a disk, fsync the media
  files placed since the last time, the directories, then the segment, and write a sync mark
  after it (the segment goes on: :mod:`._local_sink`); on a store, end the segment with its sync
  mark and put it as one create-only shipment (:mod:`._store_sink`; the next record starts a new
  segment). A sink tells the
  writer when the records are durable by calling the ``done`` it was started with (at once, or
  from a thread of its own), and a failure by ``failed``;
* **delete what compaction frees** (:meth:`JournalSink.free`, under the writer's locks, so that
  no record names a media file meanwhile; a store's deletes then in :meth:`JournalSink.delete`):
  segments and media files on a disk, shipments on a store (which go only once no live record
  references a media file they carry, :mod:`._index`);
* **list what exists and adopt it** (:meth:`JournalSink.existing`): the segments of a resumed
  lineage, indexed at the first compaction;
* **read it back** (:meth:`JournalSink.readable`): a local directory that
  :func:`~._scan.scan_journal` reads (the journal itself, or its shipments checked and unpacked
  into staging).

:func:`~._open.journal_sink` (and :func:`~._open.run_journal`, the journal beside a run's
checkpoints) is the one place that decides which sink a location gets; nothing after it asks.
This module is the interface and what it hands back and forth (:class:`Batch`, :class:`Freed`,
:class:`Adopted`, :class:`FlushStats`); the two sinks are :class:`~._local_sink.LocalFiles` and
:class:`~._store_sink.Shipments`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from trainer_hooks.journal._format import frame_record
from trainer_hooks.journal._index import SegmentIndex

__all__ = [
    "Adopted",
    "Batch",
    "FlushStats",
    "Freed",
    "JournalSink",
    "sync_mark",
]


@dataclass
class FlushStats:
    """What one flush of the journal cost (reported by :meth:`RolloutJournal.stats`):
    an fsync on a disk, a shipment's put on a store (``fsync_s``)."""

    records: int = 0
    bytes: int = 0
    media_linked: int = 0
    media_copied: int = 0
    fsync_s: float = 0.0
    total_s: float = 0.0
    oldest_unflushed_age_s: float = 0.0


@dataclass
class Batch:
    """The records a flush makes durable: those of ``segment`` (open as ``fd``) up to ``seq``,
    and the media files placed since the last flush. A sink that closes the segment sets ``fd``
    to None; ``appended`` is what it wrote to the segment (its sync mark)."""

    segment: Path
    fd: int | None
    seq: int
    media: list[str]
    new_entries: bool  # directory entries made since the last flush (a segment, media)
    stats: FlushStats
    started: float  # time.monotonic() when the flush began
    appended: int = 0


@dataclass
class Freed:
    """What a compaction lets go: how many ``segments`` it covered, the shipments left for
    :meth:`JournalSink.delete`, the media names to ``forget`` (placed again if referenced
    again), and how many media files went."""

    segments: int = 0
    files: list[Path] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)
    media: int = 0


@dataclass
class Adopted:
    """A segment written before this journal started (a resumed lineage's): the seqs it covers,
    the media its records reference, and the media it carries (on a store)."""

    path: Path
    first: int
    last: int
    media: set[str]
    carried: set[str] = field(default_factory=set)


def sync_mark(seq: int) -> bytes:
    """The record written after a flush: every record up to ``seq`` is durable (``inspect`` reads
    the unflushed age from it)."""
    return frame_record(msgpack.packb([-1, "sync", time.time(), -1, seq, []]), b"")


class JournalSink(abc.ABC):
    """Where a journal's segments go (see the module docstring). ``where`` is what messages name
    (the journal where it is kept); ``directory`` where the writer writes its segments and
    ``directory/media`` its media (the journal itself on a disk, a local spool for a store)."""

    where: str
    #: ``(files, bytes)``: where a segment's new media travel with it (a store's shipment), the
    #: writer starts a new segment once those placed since the last flush reach either; None:
    #: media are not carried (a directory).
    carries_media: tuple[int, int] | None = None
    _done: Callable[[Batch], None]
    _failed: Callable[[BaseException], None]

    def __str__(self) -> str:
        return self.where

    @property
    @abc.abstractmethod
    def directory(self) -> Path:
        """Where the writer writes its segments, and ``media/`` its media."""

    def check(self) -> None:  # noqa: B027 (a hook: most sinks have nothing to check)
        """Refuse now, on the caller's thread, what would fail at the first flush."""

    def start(self, done: Callable[[Batch], None], failed: Callable[[BaseException], None]) -> None:
        """Called once by the writer: ``done(batch)`` once a batch is durable, ``failed(e)`` when
        a flush failed off the writer's thread (nothing after it is made durable)."""
        self._done = done
        self._failed = failed

    @abc.abstractmethod
    def make_durable(self, batch: Batch) -> None:
        """On the writer's thread: make ``batch`` durable (or queue it) and end it with a sync mark."""

    @abc.abstractmethod
    def free(self, index: SegmentIndex, upto: int, active: Path | None) -> Freed:
        """Under the writer's locks (no record is being encoded or indexed meanwhile): let go of
        what a checkpoint covering every record up to ``upto`` covers (never the ``active``
        segment), deleting now what is local; what needs the network is left to :meth:`delete`."""

    def delete(self, freed: Freed) -> None:  # noqa: B027 (a hook: a local sink deleted in free())
        """Delete what :meth:`free` let go and left (on the caller's thread, outside the locks)."""

    @abc.abstractmethod
    def existing(self, lineage: str, known: Callable[[Path], bool]) -> Iterator[Adopted]:
        """The segments of ``lineage`` already kept here that ``known`` does not know, read back."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether a journal is kept here."""

    @abc.abstractmethod
    def readable(self, staging: Callable[[], Path], *, must_reach: str | None = None, why: str = "") -> Path:
        """A local directory holding this journal for :func:`~._scan.scan_journal` to read;
        ``staging()`` makes an empty one where the journal must be copied first (the caller
        removes it once done with the records). ``must_reach``: a name of :meth:`kept_name` that
        a checkpoint recorded (``why``: which, for the message); a listing that ends before it is
        asked again, then refused (a store's listing may lag its writes)."""

    def kept_name(self, segment: Path) -> str | None:
        """The name a store lists segment file ``segment`` under once durable (a shipment's),
        for a checkpoint to record; None where nothing is listed late (a local directory)."""
        return None

    def close(self) -> None:  # noqa: B027 (a hook: a sink with no thread has nothing to stop)
        """Stop what :meth:`start` started (after the writer's last flush)."""

    def origin(self, segment: Path) -> str:
        """What a message names for segment file ``segment`` of :meth:`readable`'s directory: the
        file itself here; on a store, the object it came in (never a local staging file)."""
        return str(segment)

    # -- where a journal may be found (``rollout-bundle inspect``) ---------------------------------
    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The last part of the location (a journal's is ``journal``)."""

    @abc.abstractmethod
    def child(self, rel: str) -> JournalSink:
        """The sink at ``<this location>/<rel>``."""

    @abc.abstractmethod
    def parent(self) -> JournalSink | None:
        """The sink at the location above this one (None: none)."""
