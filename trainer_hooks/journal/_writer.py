"""The rollout journal: every graded sample made durable within a second, off the event loop.

A rollout checkpoint is written only when the trainer saves; the journal covers the time between.
It lives at ``<save>/rollout/journal/`` beside the checkpoints::

    journal/segment-<first seq:012d>-<lineage>-<attempt:03d>.rjl   append-only record files, oldest first
    journal/media/<sha256 hex><suffix>      the media the records reference (hard links)

Records
-------
A segment (format version 2, :mod:`._format`) starts with ``SEGMENT_MAGIC`` and one
length-prefixed, checksummed msgpack header (``{"lineage", "first_seq", "created_at",
"fingerprint"}``); then records, each framed as::

    "RJR2" | u32 meta_len | u32 body_len | u32 crc32(body) | u32 crc32(the 16 bytes before + meta) | meta | body

The second checksum covers the frame and the meta, so a scan checks what recovery replays
without reading the bodies; version 1 segments (one checksum over lengths, meta and body) are
still read (see :mod:`._format`).

``meta`` is a small msgpack list ``[seq, kind, at, a, b, media]`` (``seq`` increases by one per
record across segments; ``at`` the append time; ``media`` the stored file names the body
references) and ``body`` a zstd frame (level 1) of one value in the bundle codec
(:func:`bundles.encode_sample`), or nothing. What ``a``, ``b`` and the body of each kind are is
said once, in :data:`~._kinds.KINDS` (and in docs/RESUME.md).

Durability and cost
-------------------
``append_*`` runs on the caller's thread (the rollout event loop): it checks the record's ``a``
and ``b`` against its kind's bounds (:mod:`._kinds`: what the reader would refuse is refused here,
:class:`~._format.JournalLimitError`, before it can be durable), encodes ``b``, snapshots the values
(:func:`trainer_hooks.checkpoints.snapshot_groups`: one list copy per token/log-prob list) and
queues them. A finished sample can instead be *lent* (``append_sample(..., copy=False)``): it is
queued as it is, and the caller leaves it alone until :meth:`RolloutJournal.wait_encoded` says
the writer has encoded it. :class:`FullyAsyncRolloutFn` lends every finished sample (nothing
touches one between grading and ``drain()``, and ``drain()`` waits before handing groups to
training): the event loop then pays a queue push, not a copy, and the writer reads each token
once instead of three times (copy, type check, pack; on two cores each of those passes also
moves the objects' cache lines between them). Prompts handed out (``take``) are still
snapshotted, as generation mutates them in place. One background thread encodes, links media into ``journal/media`` (hard link, else
copy; run media names are content digests, so nothing is hashed), compresses, appends, and every
``interval`` seconds fsyncs the new media files, the media directory and the segment, in that
order. A crash therefore loses at most the records appended in the last ``interval`` seconds
plus one fsync; the file order is the append order, so what survives is always a prefix. A
segment is fsynced before the next one is started, so a later segment never survives an earlier
one's torn tail. ``flush()`` is a barrier: it returns once everything appended before it is
durable (``save()`` calls it, so consumption records are durable before a trainer checkpoint).

Segments roll over at ``segment_bytes`` and at every checkpoint (``roll()``), so a checkpoint's
watermark (the last seq its snapshot covers) is a segment boundary. ``compact(seq)`` deletes the
segments wholly at or before ``seq`` and the media only they referenced. The checkpoint writer
calls it with the *previous* checkpoint's watermark: one generation of journal is kept, so a
trainer that restores the older checkpoint's step can still replay what was consumed after it.

Layout: the format (names, framing, limits, :class:`JournalError`) is
:mod:`._format`; a record's bytes (encoded, compressed, framed, written) and the segments they go
into :mod:`._segments`; reading (:func:`scan_journal`: bodies kept compressed and undecoded, a
torn tail named in one line, foreign lineages skipped) is :mod:`._scan`; the media the
records reference (found, placed, counted) :mod:`._media`; which segment holds what, and
so what compaction deletes, :mod:`._index`; the journal on an object store (a shipment
per interval instead of an fsync) :mod:`._store_sink`. This module is the writer: what the
caller's thread does (bounds, snapshot, queue), the writer thread's loop, and the barriers
(flush, encoded, roll) and compaction.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from bundles import MediaRef
from bundles.support import fault_point
from trainer_hooks.journal._format import (
    DEFAULT_SEGMENT_BYTES,
    JournalError,
    JournalLimitError,
)
from trainer_hooks.journal._index import SegmentIndex
from trainer_hooks.journal._kinds import KINDS, MAX_INT, Append, kind_of
from trainer_hooks.journal._local_sink import LocalFiles
from trainer_hooks.journal._segments import QueuedRecord, SegmentWriter
from trainer_hooks.journal._sink import Batch, FlushStats, JournalSink

__all__ = ["FlushStats", "RolloutJournal", "new_lineage"]

logger = logging.getLogger(__name__)

#: A record's seq is at most this (the reader's bound, :mod:`._kinds`).
MAX_SEQ = MAX_INT


class RolloutJournal:
    """Append-only journal of rollout events with batched, background fsync (see module doc).

    Args:
        sink: where the segments go (:mod:`._sink`): a :class:`JournalSink`, or the journal
            directory (:func:`journal_dir` of ``--save``), which is a :class:`LocalFiles`.
        lineage: the id shared by the checkpoints and journals of one resumable run lineage.
        interval: seconds between fsyncs (> 0).
        media_roots: directories whose content-addressed files samples reference (the run's).
        link: ``"auto"``/``"hardlink"`` link media, ``"copy"`` copies them (``"reflink"`` is
            treated as ``"auto"``: a hard link is what keeps a file alive past a teardown).
        first_seq: the seq of the first record (one after the resumed state's last seq).
        store_image: ``(image, where) -> MediaRef`` storing a PIL image in a media root.
    """

    def __init__(
        self,
        sink: JournalSink | str | os.PathLike[str],
        *,
        lineage: str,
        interval: float = 1.0,
        media_roots: Sequence[str | os.PathLike[str]] = (),
        link: str = "auto",
        first_seq: int = 1,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        store_image: Callable[[Any, str], MediaRef] | None = None,
        fingerprint: dict[str, Any] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"--rollout-journal-interval: expected > 0 seconds here, found {interval}")
        if not (type(first_seq) is int and first_seq >= 1):
            raise JournalLimitError(f"{sink}: first_seq: expected an int >= 1, found {first_seq!r}")
        self._sink = sink if isinstance(sink, JournalSink) else LocalFiles(sink)
        self.where = self._sink.where  # what messages name: the journal where it is kept
        self.directory = self._sink.directory
        self.lineage = lineage
        self.fingerprint = fingerprint
        self.interval = float(interval)
        self.link = link
        self.segment_bytes = segment_bytes
        self._index = SegmentIndex()  # under _cond: what each segment holds, what compaction frees
        self._next_seq = first_seq
        self._seq_lock = threading.Lock()
        self._media_lock = threading.Lock()  # encoding a record, or compacting (see _drain)
        self._queue: deque[QueuedRecord] = deque()
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._durable_seq = first_seq - 1  # every record with seq <= this is fsynced
        self._last_kept: tuple[int, str] | None = None  # (durable seq, the shipment holding it)
        self._encoded_seq = first_seq - 1  # every record with seq <= this is encoded (wait_encoded)
        self._encode_barrier = 0  # a wait_encoded() waits for this seq
        self._barrier = 0  # a flush() asked for records up to this seq to be durable now
        self._roll_after: int | None = None  # roll(): records after this seq go to a new segment
        self._closing = False
        self._stopped = False  # the writer thread has ended (closed, or failed)
        self._error: BaseException | None = None
        # The open segment and its bytes (writer thread only, except under _cond for the index).
        self._segments = SegmentWriter(
            self._sink,
            lineage=lineage,
            fingerprint=fingerprint,
            segment_bytes=segment_bytes,
            first_seq=first_seq,
            media_roots=media_roots,
            link=link,
            store_image=store_image,
            index=self._index,
            cond=self._cond,
        )
        self.media_dir = self._segments.media.dir
        self._totals = self._segments.totals
        self.last_flush = FlushStats()
        self._thread = threading.Thread(target=self._run, name="rollout-journal", daemon=True)
        self._sink.start(self._durable, self._failed)
        self._thread.start()

    # -- caller side (the rollout event loop): snapshot and queue, nothing else ------------------
    def append(self, kind: str, *args: Any, **kwargs: Any) -> int:
        """Append a record of ``kind`` (:data:`~._kinds.KINDS`: what its arguments are is the
        kind's ``build``); returns its seq. Raises the writer's failure, if it failed (a
        :class:`JournalError`): nothing is appended to a journal that can no longer write."""
        return self._push(kind, kind_of(kind).build(*args, **kwargs))  # type: ignore[misc]

    def _push(self, kind: str, rec: Append) -> int:
        if self._error is not None or self._stopped:  # two reads: the event loop's hot path
            self._raise_error()
            raise JournalError(f"{self.where}: the journal is closed; a {kind} record cannot be appended")
        # What the reader would refuse is refused here, before it is queued (so before it can be
        # durable): the kind's bounds (:mod:`._kinds`). ``b`` is encoded now, on the caller's
        # thread: a cursor the caller changes after this call is journaled as it was.
        problem = KINDS[kind].append_problem(rec.a, rec.b)
        if problem is not None:
            raise JournalLimitError(
                f"{self.where}: {problem}; nothing was written (its reader would refuse it)"
            )
        b = msgpack.packb(rec.b)
        with self._seq_lock:
            seq = self._next_seq
            if seq > MAX_SEQ:
                raise JournalLimitError(
                    f"{self.where}: {kind} record: seq: {seq}, at most {MAX_SEQ}; nothing was written"
                )
            self._next_seq += 1
            self._queue.append(
                QueuedRecord(seq, kind, time.time(), rec.a, b, rec.value, rec.checks, rec.lent)
            )
        self._wake.set()
        return seq

    def append_take(
        self,
        gid: int,
        group: Iterable[Any],
        cursor: Any = None,
        *,
        snapshot: bool = True,
        batch_end: int | None = None,
    ) -> int:
        """A prompt group handed out (``group`` as the data source gave it) and the cursor after.

        Groups handed out together share one cursor (the one after the last of them): each take
        names the last group id of its batch (``batch_end``, default ``gid``), and a resume
        applies a batch only when its last take survived, so a cursor never skips a group whose
        take was lost."""
        return self.append("take", gid, group, cursor, snapshot=snapshot, batch_end=batch_end)

    def append_sample(self, gid: int, sibling: int, sample: Any, *, copy: bool = True) -> int:
        """One finished, graded sample ``sibling`` of group ``gid``.

        ``copy=False`` lends the sample instead of snapshotting it: nothing is copied on the
        caller's thread, and the caller promises to leave the sample (and everything it holds)
        unchanged until :meth:`wait_encoded` covers the returned seq. :class:`FullyAsyncRolloutFn`
        lends each finished sample this way and waits in ``drain()``, before training can touch
        it (see the module docstring)."""
        return self.append("sample", gid, sibling, sample, copy=copy)

    def append_group(self, gid: int, group: Iterable[Any] | None = None, *, snapshot: bool = True) -> int:
        """Group ``gid`` finished: ``group`` is its samples, or None when every sibling was
        journaled with :meth:`append_sample` already. ``snapshot=False``: ``group`` is a
        snapshot already (sample dicts nothing mutates)."""
        return self.append("group", gid, group, snapshot=snapshot)

    def record_consumed(self, step: int, gids: Sequence[int]) -> int:
        """Groups ``gids`` were handed to training for ``step``."""
        return self.append("consumed", step, gids)

    def append_recycled(self, gid: int, group: Iterable[Any], *, snapshot: bool = True) -> int:
        """Group ``gid`` was handed back to be generated again (``group``: what to regenerate)."""
        return self.append("recycled", gid, group, snapshot=snapshot)

    def append_dropped(self, gid: int) -> int:
        """Group ``gid`` will be neither trained nor regenerated (filtered, aborted, stale)."""
        return self.append("dropped", gid)

    @property
    def failure(self) -> BaseException | None:
        """What stopped the writer, or its sink's thread (None while it works); from then on
        every append, flush and close raises it, named, as a :class:`JournalError`."""
        return self._error

    def last_kept(self) -> tuple[int, str] | None:
        """``(seq, name)``: the last durable record and the name its sink keeps it under, where
        that name is an object a store lists (a shipment); None on a disk, or before any."""
        with self._cond:
            return self._last_kept

    @property
    def last_seq(self) -> int:
        """The seq of the last record appended (0 before any)."""
        with self._seq_lock:
            return self._next_seq - 1

    # -- barriers --------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> int:
        """Make every record appended so far durable now; returns the durable seq. Raises the
        writer's failure, if any (a :class:`JournalError`)."""
        target = self.last_seq
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._barrier = max(self._barrier, target)
            self._wake.set()
            while self._durable_seq < target and self._error is None and self._thread.is_alive():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"{self.where}: journal flush to seq {target} timed out")
                self._cond.wait(0.1 if remaining is None else min(0.1, remaining))
            self._raise_error()
            if self._durable_seq < target:
                raise JournalError(
                    f"{self.where}: the journal is closed; records up to {target} cannot be made durable"
                )
            return self._durable_seq

    def wait_encoded(
        self, seq: int | None = None, timeout: float | None = None, *, raise_error: bool = True
    ) -> None:
        """Return once every record up to ``seq`` (default: all appended so far) is encoded, so
        the values lent with ``copy=False`` are the caller's again. Not a durability barrier
        (that is :meth:`flush`); usually immediate, as the writer is a record or two behind.

        A failed or stopped writer reads nothing more, so the lent values are the caller's again
        too: with ``raise_error`` (default) its failure is raised (a :class:`JournalError`),
        without it this returns and the failure surfaces at the next :meth:`flush`.
        ``TimeoutError`` after ``timeout`` seconds."""
        target = self.last_seq if seq is None else seq
        if self._encoded_seq >= target:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._wake.set()
            while True:
                # The barrier is set before encoded_seq is read, and the writer sets encoded_seq
                # before it reads the barrier: one of the two sees the other (no lost wake-up).
                # The lowest target waiting is the barrier; every waiter re-sets its own.
                low = self._encode_barrier
                self._encode_barrier = target if not low else min(low, target)
                if self._encoded_seq >= target or self._error is not None or not self._thread.is_alive():
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"{self.where}: journal encode of seq {target} timed out")
                self._cond.wait(0.05 if remaining is None else min(0.05, remaining))
            if not raise_error:
                return
            self._raise_error()
            if self._encoded_seq < target:
                raise JournalError(
                    f"{self.where}: the journal's writer has stopped; record {target} was never encoded"
                )

    def roll(self) -> int:
        """Start a new segment for the records appended after this call (a checkpoint's
        watermark is then a segment boundary); returns the last seq before the boundary."""
        seq = self.last_seq
        with self._cond:
            self._roll_after = seq
        self._wake.set()
        return seq

    def compact(self, upto_seq: int) -> tuple[int, int]:
        """Delete the segments whose records all have seq <= ``upto_seq`` (superseded by a
        committed checkpoint) and the media only they referenced (on a store, the shipments the
        index lets go, :mod:`._index`). Returns (segments, media) deleted. Runs on the caller's
        thread; the active segment is never deleted."""
        if not self._segments.adopted:
            self._segments.adopt_existing()  # here, off the rollout's path: a resumed journal can be large
        with self._media_lock, self._cond:  # no record is being encoded meanwhile
            freed = self._sink.free(self._index, upto_seq, self._segments.segment)
            self._segments.media.forget(freed.forget)  # referenced again: placed (or shipped) again
        self._sink.delete(freed)
        return freed.segments, freed.media

    def stats(self) -> dict[str, Any]:
        """Totals, the last flush's cost and the current backlog (for meta, logs and inspect)."""
        with self._cond:
            now = time.time()
            oldest = self._queue[0].at if self._queue else self._segments.unsynced_since
            return {
                **self._totals,
                "durable_seq": self._durable_seq,
                "last_seq": self.last_seq,
                "segments": len(self._index),
                "oldest_unflushed_age_s": 0.0 if oldest is None else round(now - oldest, 6),
                "last_flush": {
                    k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self.last_flush).items()
                },
            }

    def close(self) -> None:
        """Flush everything appended, then stop the writer thread (raises its failure)."""
        try:
            if self._thread.is_alive():
                self.flush()
        finally:
            with self._cond:
                self._closing = True
            self._wake.set()
            self._thread.join()
            self._sink.close()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise JournalError(
                f"{self.where}: the rollout journal's writer failed: {type(self._error).__name__}: "
                f"{self._error}"
            ) from self._error

    # -- writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        segments = self._segments
        next_sync = time.monotonic() + self.interval
        try:
            while True:
                timeout = max(0.0, next_sync - time.monotonic())
                if not self._queue:  # a drain cut short by a due fsync goes on at once
                    self._wake.wait(timeout if segments.unsynced_since is not None else None)
                self._wake.clear()
                cpu = time.thread_time()
                self._drain(next_sync)
                with self._cond:
                    closing, barrier = self._closing, self._barrier
                now = time.monotonic()
                due = segments.unsynced_since is not None and now >= next_sync
                if due or (barrier > self._durable_seq and segments.written_seq >= barrier):
                    segments.sync()
                    next_sync = time.monotonic() + self.interval
                elif segments.unsynced_since is None:
                    next_sync = now + self.interval
                self._totals["writer_cpu_s"] += time.thread_time() - cpu
                if closing and not self._queue:
                    if segments.unsynced_since is not None:
                        segments.sync()
                    break
        except BaseException as e:  # surfaced by the next append, flush() or close(); logged once now
            logger.error("%s: the rollout journal's writer failed: %s: %s", self.where, type(e).__name__, e)
            self._failed(e)
        finally:
            self._stopped = True
            segments.close_fd()

    def _drain(self, sync_at: float) -> None:
        """Frame and write the queued records; return early when an fsync is due (a caller that
        appends faster than the writer drains must not postpone durability).

        Each record is written as soon as it is framed, with one ``os.writev`` of its parts: the
        kernel copies the compressed body while it is still in the CPU's cache. Batching records
        into a buffer of megabytes first cost a copy of every body, and the kernel's later copy
        of the buffer missed the cache: ~100 us more a 44 kB record, two thirds of it in page
        faults and system time (``benchmarks/bench_journal.py``, docs/PERFORMANCE.md)."""
        segments = self._segments
        while self._queue and (segments.unsynced_since is None or time.monotonic() < sync_at):
            item = self._queue.popleft()
            with self._cond:
                roll_after = self._roll_after
            roll = roll_after is not None and item.seq > roll_after
            if roll:
                with self._cond:
                    if self._roll_after == roll_after:
                        self._roll_after = None
            if segments.needs_new_segment(roll):
                segments.start(item.seq)
            fault_point("journal.append", item.seq)
            # A compaction waits while a record is encoded and indexed: it never frees a media
            # file that the record names (placed before, now referenced only by it).
            with self._media_lock:
                frame, media = segments.frame(item)
                fault_point("journal.encoded", item.seq)
                segments.note(item.seq, media)
            self._encoded_seq = item.seq
            if self._encode_barrier and item.seq >= self._encode_barrier:
                with self._cond:
                    if self._encode_barrier and item.seq >= self._encode_barrier:
                        self._encode_barrier = 0  # the waiters not done yet set it again
                        self._cond.notify_all()
            segments.write(frame, item.seq)

    def _durable(self, batch: Batch) -> None:
        """The sink made ``batch`` durable (on the writer's thread, or on the sink's own)."""
        stats = batch.stats
        stats.total_s = time.monotonic() - batch.started
        kept = self._sink.kept_name(batch.segment)
        with self._cond:
            if kept is not None and batch.seq >= self._durable_seq:
                self._last_kept = (batch.seq, kept)
            self._durable_seq = max(self._durable_seq, batch.seq)
            self._totals["flushes"] += 1
            self.last_flush = stats
            self._cond.notify_all()
        logger.debug(
            "rollout journal flush: %d records, %d bytes, %d media linked, %d copied, fsync %.1f ms, "
            "total %.1f ms, oldest unflushed %.0f ms",
            stats.records,
            stats.bytes,
            stats.media_linked,
            stats.media_copied,
            stats.fsync_s * 1e3,
            stats.total_s * 1e3,
            stats.oldest_unflushed_age_s * 1e3,
        )

    def _failed(self, error: BaseException) -> None:
        """The writer, or the sink's own thread, failed: every caller hears of it from now on."""
        with self._cond:
            self._error = self._error or error
            self._cond.notify_all()


def new_lineage() -> str:
    """A fresh lineage id (a run that does not resume starts one)."""
    return uuid.uuid4().hex
