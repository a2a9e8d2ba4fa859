"""The segments' bytes: each record framed, encoded, compressed and appended; segments started,
closed and handed to the sink to be made durable.

:class:`SegmentWriter` is the part of :class:`~._writer.RolloutJournal` that runs on its writer
thread and owns the open segment: the record's body encoded with the bundle codec (media
resolved and placed through :class:`~._media.JournalMedia`, a lent sample read in place),
compressed (zstd level 1), checked against the reader's bounds (a record its reader would refuse
fails the journal, named, before it is written), framed (:func:`~._format.frame_record_parts`)
and written with one ``os.writev``; a new segment (``segment-<first seq>-<lineage>-<attempt>``,
created exclusively, its header first) at a rollover; and each flush's :class:`~._sink.Batch`
(the records written since the last, the media placed since) given to the sink. The queue, the
thread's loop, the barriers and what callers see stay in :mod:`._writer`; the index of what each
segment holds is shared with it under its condition lock (compaction reads it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zstandard

from bundles import MediaRef, UnsupportedValueError, sample_encoder
from bundles.support import fault_point
from trainer_hooks.checkpoints import sample_dict, snapshot_groups
from trainer_hooks.journal._format import (
    MAX_BODY_BYTES,
    MEDIA_DIR,
    ZSTD_LEVEL,
    JournalLimitError,
    frame_record_parts,
    segment_header,
    segment_name,
)
from trainer_hooks.journal._index import SegmentIndex
from trainer_hooks.journal._kinds import MEDIA
from trainer_hooks.journal._media import JournalMedia
from trainer_hooks.journal._sink import Batch, FlushStats, JournalSink

__all__ = ["QueuedRecord", "SegmentWriter", "run_checks", "write_all"]


def write_all(fd: int, parts: tuple[bytes, ...]) -> None:
    """Write ``parts`` to ``fd`` in order, all of them: one ``os.writev``, resumed where a short
    write stopped."""
    views = [memoryview(p) for p in parts if p]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


@dataclass
class QueuedRecord:
    """A record appended and not yet written: what the caller's thread queued."""

    seq: int
    kind: str
    at: float
    a: Any
    b: bytes  # the meta's b, encoded (msgpack) on the caller's thread
    value: Any  # snapshot to encode (None: no body)
    checks: Sequence[Callable[[], Any]] = field(default_factory=tuple)
    lent: bool = False  # value is the caller's sample itself, lent until encoded (copy=False)


def run_checks(checks: Iterable[Callable[[], Any]]) -> set[int]:
    """Run a snapshot's deferred type checks (raising on a bad item); the ids of the lists they
    proved to hold only numbers, for the encoder's ``number_lists``."""
    numbers: set[int] = set()
    for check in checks:
        numbers.update(check() or ())
    return numbers


class SegmentWriter:
    """The open segment and what goes into it, on the journal's writer thread (see the module
    docstring). ``index`` and ``totals`` are the journal's, ``index`` read and written under
    ``cond``."""

    def __init__(
        self,
        sink: JournalSink,
        *,
        lineage: str,
        fingerprint: dict[str, Any] | None,
        segment_bytes: int,
        first_seq: int,
        media_roots: Sequence[str | os.PathLike[str]],
        link: str,
        store_image: Callable[[Any, str], MediaRef] | None,
        index: SegmentIndex,
        cond: threading.Condition,
    ) -> None:
        self.sink = sink
        self.where = sink.where
        self.directory = sink.directory
        self.lineage = lineage
        self.fingerprint = fingerprint
        self.segment_bytes = segment_bytes
        self.index = index
        self.cond = cond
        #: the journal's totals (for meta, logs and ``inspect``), this writer's and its flushes'
        self.totals: dict[str, Any] = dict.fromkeys(
            ("records", "bytes", "flushes", "media_linked", "media_copied"), 0
        )
        self.totals["writer_cpu_s"] = 0.0
        (self.directory / MEDIA_DIR).mkdir(parents=True, exist_ok=True)
        self.media = JournalMedia(
            self.directory / MEDIA_DIR,
            media_roots,
            link=link,
            store_image=store_image,
            count=self._count_media,
        )
        self.fd: int | None = None
        self.segment: Path | None = None
        self.size = 0
        self.new_dir_entries = False
        self.unsynced_since: float | None = None  # when the oldest record not yet durable was written
        self.written_seq = first_seq - 1
        self.batch_stats = FlushStats()
        self.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        self.media_of_item: list[str] = []  # the media names of the record being encoded
        self.encode = self._encoder(store_image is not None)
        self.adopted = False  # the segments already kept are indexed at the first compaction

    def _encoder(self, images: bool) -> Callable[..., bytes]:
        media = self.media
        return sample_encoder(
            resolve_string=lambda v, w: media.string(v, w, self.media_of_item),
            string_prefixes=media.roots,
            resolve_ref=lambda r, w: media.ref(r, w, self.media_of_item),
            store_image=(lambda im, w: media.image(im, w, self.media_of_item)) if images else None,
        )

    def _count_media(self, how: str) -> None:
        if how == "copy":
            self.batch_stats.media_copied += 1
            self.totals["media_copied"] += 1
        else:
            self.batch_stats.media_linked += 1
            self.totals["media_linked"] += 1

    def needs_new_segment(self, roll: bool) -> bool:
        """Whether the next record starts a new segment: none open, a checkpoint's roll, the
        segment full, or the media it would carry at their bound."""
        return self.fd is None or roll or self.size >= self.segment_bytes or self.media_full()

    def media_full(self) -> bool:
        """Whether the media placed since the last flush reach what one segment may carry (on a
        store, a shipment's bounds): the next record starts a new segment, shipping this one."""
        carries = self.sink.carries_media
        return carries is not None and (
            len(self.media.new) >= carries[0] or self.media.new_bytes >= carries[1]
        )

    def write(self, parts: tuple[bytes, bytes], seq: int) -> None:
        assert self.fd is not None
        write_all(self.fd, parts)
        size = len(parts[0]) + len(parts[1])
        self.size += size
        self.batch_stats.bytes += size
        self.totals["bytes"] += size
        self.written_seq = seq
        if self.unsynced_since is None:
            self.unsynced_since = time.time()

    def note(self, seq: int, media: list[str]) -> None:
        assert self.segment is not None
        with self.cond:
            self.index.note(self.segment, seq, media)

    def start(self, first_seq: int) -> None:
        self.close()
        attempt = 0
        while True:
            path = self.directory / segment_name(first_seq, self.lineage, attempt)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
                break
            except FileExistsError:
                attempt += 1
        header = msgpack.packb(
            {
                "lineage": self.lineage,
                "first_seq": first_seq,
                "created_at": time.time(),
                "fingerprint": self.fingerprint,
            }
        )
        os.write(fd, segment_header(header))
        self.fd, self.segment, self.size = fd, path, 0
        with self.cond:
            self.index.start(path, first_seq)
        self.new_dir_entries = True

    def close(self) -> None:
        if self.fd is None:
            return
        # A segment is durable before the next one gets a record: what survives is a prefix.
        if self.unsynced_since is not None:
            self.sync()
        if self.fd is not None:  # (a sink that ships a segment closes it itself)
            os.close(self.fd)
            self.fd = None
        self.segment = None

    def frame(self, item: QueuedRecord) -> tuple[tuple[bytes, bytes], list[str]]:
        # The snapshot's deferred type check proves each long number list once; the encoder is
        # told which, so it does not sum them a second time (a third of the floor's cost).
        numbers = run_checks(item.checks)
        media: list[str] = []
        self.media_of_item = media
        body = b""
        if item.value is not None:
            where = f"{self.where}: record {item.seq} ({item.kind} {item.a})"
            if item.lent:
                body = self.compressor.compress(self.encode_lent(item.value, where))
            else:
                body = self.compressor.compress(self.encode(item.value, where, number_lists=numbers))
        names = sorted(set(media))
        problem = MEDIA.problem(names, "media")
        if problem is None and len(body) > MAX_BODY_BYTES:
            problem = f"body: {len(body)} bytes compressed, at most {MAX_BODY_BYTES}"
        if problem is not None:  # the journal fails, named: never a record its reader refuses
            raise JournalLimitError(f"{self.where}: record {item.seq}: {item.kind} record: {problem}")
        # The meta is msgpack [seq, kind, at, a, b, media]: a 6-item array, b encoded already.
        pack = msgpack.packb
        meta = b"".join(
            (b"\x96", pack(item.seq), pack(item.kind), pack(item.at), pack(item.a), item.b, pack(names))
        )
        self.batch_stats.records += 1
        self.totals["records"] += 1
        return frame_record_parts(meta, body), media

    def encode_lent(self, sample: Any, where: str) -> bytes:
        """A lent sample, read in place (its owner leaves it alone until wait_encoded). The codec
        takes plain containers only; a sample holding subclasses (an ``OrderedDict``, a
        namedtuple) is snapshotted here, on this thread, which turns them into plain ones, as a
        caller-side snapshot would have."""
        media_before = len(self.media_of_item)
        try:
            return self.encode(sample_dict(sample, where), where)
        except UnsupportedValueError:
            del self.media_of_item[media_before:]
            checks: list[Callable[[], Any]] = []
            (snap,) = snapshot_groups([[sample]], where=where, deferred=checks)
            return self.encode(snap[0], where, number_lists=run_checks(checks))

    def sync(self) -> None:
        """Make what was written durable: the sink fsyncs it (or ships it) and says when."""
        started = time.monotonic()
        fault_point("journal.fsync", self.written_seq)
        if self.fd is None or self.segment is None:
            return  # nothing open to make durable (a shipped segment is on its way already)
        media = self.media.take_new()
        stats = self.batch_stats
        stats.oldest_unflushed_age_s = (
            0.0 if self.unsynced_since is None else time.time() - self.unsynced_since
        )
        self.batch_stats = FlushStats()
        self.unsynced_since = None
        batch = Batch(self.segment, self.fd, self.written_seq, media, self.new_dir_entries, stats, started)
        self.new_dir_entries = False
        with self.cond:  # before it can be durable: compaction reads what a segment carries
            self.index.carried(self.segment, {os.path.basename(p) for p in media})
        self.sink.make_durable(batch)
        self.size += batch.appended
        if batch.fd is None:  # the sink closed the segment: the next record starts a new one
            self.fd = None

    def adopt_existing(self) -> None:
        """Index the segments already kept (a resumed lineage's) for compaction; runs at the
        first compaction, on the checkpoint writer's thread."""
        self.adopted = True

        def known(path: Path) -> bool:
            with self.cond:
                return path in self.index  # written by this journal: indexed as it was written

        for seg in self.sink.existing(self.lineage, known):
            with self.cond:
                self.index.adopt(seg.path, seg.first, seg.last, seg.media, seg.carried)

    def close_fd(self) -> None:
        """Close the open segment's descriptor as it is (the writer thread ended)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
