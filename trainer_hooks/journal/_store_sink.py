"""The rollout journal on an object store: one create-only object per flush interval.

With ``--save s3://…`` (or ``gs://``, ``az://``) there is no local directory beside the
checkpoints, and the node that crashed may be gone with its disk, so the journal keeps its
records on the store, at ``<save>/rollout/journal/``::

    segment-<first seq:012d>-<lineage>-<attempt:03d>.rjs   one shipment per flush interval

The writer (:class:`~._writer.RolloutJournal`) works exactly as on a local disk, into a spool
directory beside the run's media (so media are hard-linked, not copied, at append time and
survive the run's teardown). Where a local journal fsyncs, a store journal *ships*: it closes the
segment (ending it with a sync mark), and puts one object holding the segment and every media
file its records were the first to reference::

    segment | media... | header | u32 header_len | u32 crc32(header + header_len) | "RBJSHIP1\\n"

``header`` is msgpack ``{"segment": <segment bytes>, "media": [[name, size], ...]}``; the segment
is a version 2 segment, byte for byte what a local journal writes, and comes first, so that
recovery downloads each shipment into a file (8 MiB ranges, four at a time, each written before
the next are asked for), checks the trailer, the media (read and hashed 1 MiB at a time) and the
segment, places the media and cuts the file down to its segment: the local scan then reads the
staging directory unchanged. A download holds at most 32 MiB of its shipment in memory, whatever
its size (recovering one of 512 MiB: a peak 68 MiB over the process's own, was 514 MiB). The put is create-only
(``If-None-Match: *``): an object is whole or absent, never torn, and a second writer of the same
lineage (a zombie of the crashed trainer) is refused, not merged. Shipments are put one after
the other, so what is on the store is always a prefix of the records, as on a disk; a crash
loses at most the records appended since the last shipment (``--rollout-journal-interval``).

Costs: one PUT per interval per writer (two when a segment rolls over at a checkpoint), whatever
the number of screenshots, instead of one request per media file; the event loop pays exactly
what it pays locally, since shipping runs on the journal's thread. Media are not shared between
shipments: a screenshot referenced again after its shipment was deleted is shipped again.

Compaction deletes a shipment once every record in it is covered by a committed checkpoint *and*
no live record references a media file it carries; so a shipment may outlive its records for as
long as a later record still needs a screenshot it brought. Recovery reads every shipment of
the lineage and checks each before anything is placed: the magic, the header's checksum and
shape, the sizes against the object's length, each media name (``<64 hex><suffix>``) and its
content against the digest its name is (a media file whose bytes do not hash to their name is
refused, never placed), then the segment with the scan's own checks and every record body's
checksum (a segment that does not end whole, with its sync mark, is refused too): a failure is a
:class:`JournalCorruptError` naming the object, never the staging file. So is every error the
local scan and replay raise later about a segment or a record (a gap between shipments, a body
that does not decode): they name each segment by :meth:`Shipments.origin`, the object it came in,
and the byte offset (a shipment starts with its segment, so the offset is the object's too).

A store's listing may lag its writes. A checkpoint records the last shipment it covers
(:meth:`Shipments.kept_name` of the last durable segment, ``meta.journal.last_shipment``); a
recovery whose listing ends before it lists again with backoff (:func:`complete_listing`:
:data:`LISTING_RETRIES` times, 7.75 s in all) and then refuses, naming the missing object,
rather than replay a journal shorter than the checkpoint (docs/RESUME.md, "What resume must
find").

The store must honour preconditions (checked by :meth:`Shipments.check` when the journal is
opened, before the first put; ``ROLLOUT_BUNDLE_SINGLE_WRITER=1`` is the opt-in for one that does
not). The objects are reached through :meth:`bundles.Location.objects` of the journal's location.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import os
import queue
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from bundles import BundleError, Location, StoreURL
from bundles.support import fault_point, remove_tree
from trainer_hooks.journal._format import (
    MAX_META_BYTES,
    MAX_SHIPMENT_BYTES,
    MAX_SHIPMENT_MEDIA,
    MEDIA_DIR,
    SEGMENT_SUFFIX,
    SHIPMENT_MAGIC,
    SHIPMENT_SUFFIX,
    U32,
    JournalCorruptError,
    JournalError,
    JournalLimitError,
    is_content_name,
    is_media_name,
    parse_segment_name,
    shipment_name,
    shipment_trailer,
)
from trainer_hooks.journal._index import SegmentIndex
from trainer_hooks.journal._scan import scan_journal
from trainer_hooks.journal._sink import Adopted, Batch, Freed, JournalSink, sync_mark

__all__ = [
    "Shipment",
    "Shipments",
    "complete_listing",
    "download_journal",
    "is_shipment_name",
    "listing_backoff",
    "shipment_lineage",
]

logger = logging.getLogger(__name__)

# How many shipments a recovery downloads at once.
_DOWNLOADS = 16


@dataclass
class Shipment:
    """One shipment read back: its object name, the segment file it was unpacked to, the media it
    carried (names), and its size on the store."""

    name: str
    segment: Path
    media: list[str]
    size: int


class Shipments(JournalSink):
    """The journal on a store: one create-only shipment per flush, under one store prefix.

    The writer writes into ``directory``, a local spool (``spool()`` makes it, on first use);
    :meth:`make_durable` ends the segment and queues it for a thread of its own, which puts the
    shipments in order, so that the writer encodes the next interval while the last one uploads
    (at most two wait: backpressure)."""

    def __init__(self, location: Location, *, spool: Callable[[], Path] | None = None) -> None:
        self.location = location
        self.prefix = location.objects()
        self.where = str(location)
        self._spool = spool
        self._spool_dir: Path | None = None
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=2)
        self._thread: threading.Thread | None = None

    @property
    def directory(self) -> Path:
        if self._spool_dir is None:
            if self._spool is None:
                raise JournalError(f"{self.where}: no local spool to write this journal into")
            self._spool_dir = self._spool()
        return self._spool_dir

    def check(self) -> None:
        """Refuse a store that ignores preconditions now, on the caller's thread, rather than at
        the first shipment on the journal's thread."""
        self.prefix.check_preconditions()

    def start(self, done: Callable[[Batch], None], failed: Callable[[BaseException], None]) -> None:
        super().start(done, failed)
        self._thread = threading.Thread(target=self._ship_loop, name="rollout-journal-ship", daemon=True)
        self._thread.start()

    def make_durable(self, batch: Batch) -> None:
        """End the segment with its sync mark and queue it, with the media its records were first
        to reference, for the shipping thread (the next record starts a new segment). The records
        are durable once that thread has put it; the spool is never fsynced."""
        if batch.fd is None:
            return
        os.write(batch.fd, sync_mark(batch.seq))
        os.close(batch.fd)
        batch.fd = None
        self._queue.put(batch)

    def _ship_loop(self) -> None:
        """The shipping thread: put each queued segment, in order; then its records are durable."""
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                put_started = time.monotonic()
                media = [Path(p) for p in batch.media]
                self.ship(batch.segment, media)
                for p in [batch.segment, *media]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
            except BaseException as e:  # surfaced by the journal, as the writer's own failure
                logger.error(
                    "%s: the rollout journal's shipment failed: %s: %s", self.where, type(e).__name__, e
                )
                self._failed(e)
                while self._queue.get() is not None:  # nothing after a lost shipment is put
                    pass
                return
            batch.stats.fsync_s = time.monotonic() - put_started
            self._done(batch)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def free(self, index: SegmentIndex, upto: int, active: Path | None) -> Freed:
        """A shipment goes once its records are covered and no live record references a media file
        it carries (see the module docstring)."""
        covered, gone = index.compact_shipments(upto, active)
        carried = [n for _, c in gone for n in c]
        return Freed(covered, [p for p, _ in gone], forget=carried, media=len(carried))

    def delete(self, freed: Freed) -> None:
        if freed.files:
            fault_point("journal.compact", freed.files[0])
            self.prefix.delete([shipment_name(p.name) for p in freed.files])

    def existing(self, lineage: str, known: Callable[[Path], bool]) -> Iterator[Adopted]:
        """The lineage's shipments read back (into the spool, one at a time) for what they cover,
        reference and carry."""
        for name, _ in self.shipments(lineage):
            path = self.directory / (name[: -len(SHIPMENT_SUFFIX)] + SEGMENT_SUFFIX)
            if known(path):
                continue
            tmp = self.directory / f".adopt-{uuid.uuid4().hex}"
            tmp.mkdir()
            try:
                shipment = self.fetch(name, tmp)
                scan = scan_journal(
                    tmp, lineage=lineage, decode_bodies=False, only=[shipment.segment], origin=self.origin
                )
            finally:
                remove_tree(tmp)
            media = {m for r in scan.records for m in r.media}
            first, last = (scan.records[0].seq, scan.records[-1].seq) if scan.records else (1, 0)
            yield Adopted(path, first, last, media, set(shipment.media))

    def exists(self) -> bool:
        return bool(self.shipments())

    def readable(self, staging: Callable[[], Path], *, must_reach: str | None = None, why: str = "") -> Path:
        """Every shipment downloaded and checked into ``staging()`` (module docstring), once the
        listing reaches ``must_reach`` (:func:`complete_listing`)."""
        directory = staging()
        shipments = download_journal(self, directory, must_reach=must_reach, why=why)
        logger.info(
            "rollout journal: %d shipment(s), %d bytes, read from %s",
            len(shipments),
            sum(s.size for s in shipments),
            self.prefix,
        )
        return directory

    #: A shipment carries the media its records were first to reference: the writer ships early,
    #: at half of either bound of a shipment, so that no shipment its reader refuses is put.
    carries_media = (MAX_SHIPMENT_MEDIA // 2, MAX_SHIPMENT_BYTES // 2)

    def kept_name(self, segment: Path) -> str:
        return shipment_name(segment.name)

    def origin(self, segment: Path) -> str:
        """The store object segment file ``segment`` was unpacked from (what messages name)."""
        return f"{self.prefix}/{shipment_name(segment.name)}"

    def child(self, rel: str) -> Shipments:
        return Shipments(self.location.child(rel), spool=self._spool)

    def parent(self) -> Shipments | None:
        url = StoreURL(str(self.location))
        if "/" not in url.key:
            return None
        return Shipments(Location.of(url.parent, self.location.storage_options), spool=self._spool)

    @property
    def name(self) -> str:
        return StoreURL(str(self.location)).name

    # -- the store side ----------------------------------------------------------------------------
    def ship(self, segment: Path, media: Sequence[Path]) -> str:
        """Put one shipment: segment file ``segment`` and media files ``media``; returns the
        object name. :class:`JournalError` when the object exists (another writer of the lineage)."""
        name = shipment_name(segment.name)
        if len(media) > MAX_SHIPMENT_MEDIA:  # its reader would refuse it: never put
            raise JournalLimitError(
                f"{self.prefix}/{name}: shipment: {len(media)} media files, at most {MAX_SHIPMENT_MEDIA}"
            )
        blobs = [p.read_bytes() for p in media]
        body = segment.read_bytes()
        trailer = shipment_trailer(len(body), [(p.name, len(b)) for p, b in zip(media, blobs, strict=True)])
        data = b"".join([body, *blobs, trailer])
        if len(data) > MAX_SHIPMENT_BYTES:
            raise JournalLimitError(
                f"{self.prefix}/{name}: shipment: {len(data)} bytes, at most {MAX_SHIPMENT_BYTES}"
            )
        fault_point("journal.ship", name)
        if not self.prefix.put_create(name, data) and not self._ours(name, data):
            raise JournalError(
                f"{self.prefix}/{name}: the shipment exists already: another writer is journaling lineage "
                f"{segment.name.split('-')[2]} (a trainer of the same run still running?); refusing to "
                "write beside it"
            )
        fault_point("journal.shipped", name)
        return name

    def _ours(self, name: str, data: bytes) -> bool:
        """Whether the object that made a create-only put fail holds exactly ``data``: our own put,
        retried by the client after its answer was lost (the first attempt did create it)."""
        try:
            return self.prefix.get(name, max_bytes=len(data)) == data
        except BundleError:
            return False

    def shipments(self, lineage: str | None = None) -> list[tuple[str, int]]:
        """(name, size) of the shipments under the prefix (of ``lineage``), oldest first."""
        out = []
        for name, size in self.prefix.names().items():
            parsed = _parse_name(name)
            if parsed is not None and (lineage is None or parsed[1] == lineage):
                out.append((parsed, name, size))
        return [(name, size) for _, name, size in sorted(out)]

    def fetch(self, name: str, into: Path) -> Shipment:
        """Download shipment ``name`` and unpack it into directory ``into`` (its segment there,
        its media in ``into/media``), every part checked first (module docstring)."""
        if _parse_name(name) is None:
            raise JournalCorruptError(
                f"{self.prefix}/{name}: not a journal shipment name: expected segment-<seq>-<lineage>-<attempt>.rjs"
            )
        part = into / f".{name}.download"
        self.prefix.download(name, part, max_bytes=MAX_SHIPMENT_BYTES)
        try:
            return unpack_shipment(part, name, into, where=f"{self.prefix}/{name}")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)


def _parse_name(name: str) -> tuple[int, str, int] | None:
    if not name.endswith(SHIPMENT_SUFFIX):
        return None
    return parse_segment_name(name[: -len(SHIPMENT_SUFFIX)] + SEGMENT_SUFFIX)


def is_shipment_name(name: str) -> bool:
    """Whether ``name`` is a shipment's object name (``segment-<seq>-<lineage>-<attempt>.rjs``)."""
    return _parse_name(name) is not None


def shipment_lineage(name: str) -> str | None:
    """The lineage shipment name ``name`` belongs to (None: not a shipment's name)."""
    parsed = _parse_name(name)
    return None if parsed is None else parsed[1]


#: A listing that ends before the shipment a checkpoint names is asked again this many times,
#: waiting LISTING_BACKOFF_S, then twice that, and so on (7.75 s in all), then refused.
LISTING_RETRIES = 5
LISTING_BACKOFF_S = 0.25


def listing_backoff() -> tuple[int, float]:
    """``(LISTING_RETRIES, LISTING_BACKOFF_S)``, read when called: the schedule every caller that
    lists a journal again follows (the ledger's too, for a restored step newer than the
    checkpoint)."""
    return LISTING_RETRIES, LISTING_BACKOFF_S


def complete_listing(shipper: Shipments, must_reach: str | None, why: str = "") -> list[tuple[str, int]]:
    """The shipments under the shipper's prefix, listed until the listing reaches shipment
    ``must_reach`` (one of its lineage at or after it: compaction may have let it go once a
    later one was durable). A store's listing may lag its writes (a stale replica, an eventually
    consistent listing): one that ends before it is asked again, with backoff, at most
    :data:`LISTING_RETRIES` times, then refused, naming the missing shipment, never replayed
    short: a shorter journal would hand groups already trained back to training."""
    wait = LISTING_BACKOFF_S
    target = None if must_reach is None else _parse_name(must_reach)
    for attempt in range(LISTING_RETRIES + 1):
        names = shipper.shipments()
        if target is None or _reaches(names, target):
            return names
        fault_point("resume.listing_short", attempt)
        if attempt < LISTING_RETRIES:
            time.sleep(wait)
            wait *= 2
    assert target is not None  # None returned at the first listing
    ours = [n for n, _ in names if (_parse_name(n) or (0, "", 0))[1] == target[1]]
    last = f"last {ours[-1]}" if ours else f"no shipment of lineage {target[1]}"
    raise JournalError(
        f"{shipper.prefix}/{must_reach}: missing: {why}, in this shipment, but the store's listing of "
        f"{shipper.prefix} ends before it ({last}), listed {LISTING_RETRIES + 1} times over "
        f"{LISTING_BACKOFF_S * (2**LISTING_RETRIES - 1):g} s; refusing to resume from a journal shorter than "
        "the checkpoint (a stale listing, or the object was removed)"
    )


def _reaches(names: list[tuple[str, int]], target: tuple[int, str, int]) -> bool:
    for name, _ in names:
        parsed = _parse_name(name)
        if parsed is not None and parsed[1] == target[1] and (parsed[0], parsed[2]) >= (target[0], target[2]):
            return True
    return False


def unpack_shipment(part: Path, name: str, into: Path, *, where: str) -> Shipment:
    """Check the downloaded shipment ``part`` (object ``name``) and unpack it: its media into
    ``into/media``, then the file itself, cut down to its segment, renamed into ``into``."""
    with open(part, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        seg_len, media = _read_header(f, size, where)
        # Every media file is checked against its name, and the segment by the scan's own
        # checks, before any is placed. Each media file is copied (_CHUNK bytes at a time, hashed
        # on the way) into a file beside its place, renamed into place once all have checked:
        # never more than a chunk of the shipment is in memory, whatever its size.
        media_dir = into / MEDIA_DIR
        media_dir.mkdir(exist_ok=True)
        staged: list[tuple[Path, Path]] = []
        try:
            f.seek(seg_len)
            for media_name, n in media:
                target = media_dir / media_name
                # Shipped twice (again after a resume): the same bytes, checked, not written again.
                tmp = None if os.path.lexists(target) else media_dir / f".{media_name}.{uuid.uuid4().hex}"
                digest = _copy_hashed(f, n, tmp, where)
                if tmp is not None:
                    staged.append((tmp, target))
                if digest != media_name.split(".", 1)[0]:
                    raise JournalCorruptError(
                        f"{where}: media {media_name}: expected content of digest {media_name.split('.', 1)[0]}, "
                        f"found {digest}: the object was damaged or forged; nothing is placed"
                    )
            f.truncate(seg_len)  # what is left is the segment, byte for byte
            f.close()
            segment = into / (name[: -len(SHIPMENT_SUFFIX)] + SEGMENT_SUFFIX)
            if os.path.lexists(segment):
                raise JournalCorruptError(f"{where}: {segment.name} is carried twice")
            os.rename(part, segment)
            _check_segment(segment, where)
            # Two shipments carrying one screenshot may be unpacked at once: both hold the same
            # (checked) bytes, so either rename wins.
            for tmp, target in staged:
                os.replace(tmp, target)
            staged.clear()
        finally:
            for tmp, _ in staged:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
    return Shipment(name, segment, [n for n, _ in media], size)


def _read_header(f: Any, size: int, where: str) -> tuple[int, list[tuple[str, int]]]:
    """The shipment's header, read from the end of ``f`` (``size`` bytes): its trailer (the magic,
    the header's length and checksum) checked, then the header's shape and the sizes it lists
    against the object's: ``(segment bytes, [(media name, bytes), ...])``."""
    tail = len(SHIPMENT_MAGIC) + 2 * U32.size
    f.seek(max(0, size - tail))
    end = f.read(tail)
    if len(end) < tail or end[-len(SHIPMENT_MAGIC) :] != SHIPMENT_MAGIC:
        raise JournalCorruptError(
            f"{where}: expected a journal shipment (ending in {SHIPMENT_MAGIC!r}), found {end[-16:]!r}"
        )
    length = end[: U32.size]
    (hlen,) = U32.unpack(length)
    (crc,) = U32.unpack(end[U32.size : 2 * U32.size])
    if hlen > MAX_META_BYTES or hlen + tail > size:
        raise JournalCorruptError(
            f"{where}: shipment header of {hlen} bytes does not fit the object of {size}"
        )
    f.seek(size - tail - hlen)
    raw = f.read(hlen)
    if zlib.crc32(length, zlib.crc32(raw)) != crc:
        raise JournalCorruptError(f"{where}: shipment header checksum mismatch: the object was damaged")
    try:
        header = msgpack.unpackb(raw, strict_map_key=True)  # bounded: hlen <= MAX_META_BYTES
    except Exception as e:
        raise JournalCorruptError(f"{where}: shipment header is not msgpack: {e}") from None
    seg_len, media = _check_header(header, where)
    carried = sum(n for _, n in media)
    if seg_len + carried + hlen + tail != size:
        raise JournalCorruptError(
            f"{where}: the header lists {seg_len} segment bytes and {carried} media bytes, "
            f"the object holds {size - hlen - tail} before its header"
        )
    return seg_len, media


_CHUNK = 1 << 20


def _copy_hashed(f: Any, n: int, tmp: Path | None, where: str) -> str:
    """Read the next ``n`` bytes of ``f`` a chunk at a time, into the new file ``tmp`` (None: only
    hash them); the hex sha256 of what was read."""
    h = hashlib.sha256()
    fd = None if tmp is None else _create(tmp, where)
    try:
        left = n
        while left:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise JournalCorruptError(f"{where}: the object ends inside a media file")
            h.update(chunk)
            if fd is not None:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            left -= len(chunk)
    finally:
        if fd is not None:
            os.close(fd)
    return h.hexdigest()


def _check_segment(segment: Path, where: str) -> None:
    """The scan's checks of one shipment's segment (frames, seqs, record shapes) and every body's
    checksum (which a scan defers to decoding), a failure named by the store object it came from
    (the scan's ``origin``), never by the staging file. A shipment's segment ends with its sync
    mark, so a torn tail is damage too. On a failure the segment is removed: nothing of the
    shipment stays placed."""
    try:
        scan = scan_journal(segment.parent, only=[segment], origin=lambda _: where)
        if scan.torn_seq is not None or scan.torn:
            problems = "; ".join(scan.problems)
            raise JournalCorruptError(
                f"{where}: the segment is damaged from record {scan.torn_seq} on ({problems}), "
                "but a shipment's segment ends whole, with its sync mark: the object was damaged or forged"
            )
        for rec in scan.records:
            if rec.crc is not None and zlib.crc32(rec.body) != rec.crc:
                raise JournalCorruptError(
                    f"{where}: body checksum mismatch at byte {rec.offset}: expected {rec.crc:#010x}, found "
                    f"{zlib.crc32(rec.body):#010x}: the object was damaged or forged"
                )
        del scan
    except BundleError:
        os.unlink(segment)
        raise


def _check_header(header: Any, where: str) -> tuple[int, list[tuple[str, int]]]:
    if not isinstance(header, dict) or set(header) != {"segment", "media"}:
        raise JournalCorruptError(
            f"{where}: shipment header: expected keys segment and media, found {header!r:.80}"
        )
    seg_len, media = header["segment"], header["media"]
    if type(seg_len) is not int or not 0 <= seg_len <= MAX_SHIPMENT_BYTES:
        raise JournalCorruptError(
            f"{where}: shipment header: segment: expected a size, found {seg_len!r:.40}"
        )
    if not isinstance(media, list) or len(media) > MAX_SHIPMENT_MEDIA:
        raise JournalCorruptError(
            f"{where}: shipment header: media: expected a list of at most {MAX_SHIPMENT_MEDIA}, found {type(media).__name__}"
        )
    out = []
    for i, entry in enumerate(media):
        ok = isinstance(entry, list) and len(entry) == 2 and type(entry[1]) is int and entry[1] >= 0
        if not ok or not is_media_name(entry[0]) or not is_content_name(entry[0]):
            raise JournalCorruptError(
                f"{where}: shipment header: media[{i}]: expected [<64 hex><suffix>, size], found {entry!r:.80}"
            )
        out.append((entry[0], entry[1]))
    return seg_len, out


def _create(path: Path, where: str) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise JournalCorruptError(f"{where}: {path.name} is carried twice") from None


def download_journal(
    shipper: Shipments, staging: Path, *, must_reach: str | None = None, why: str = ""
) -> list[Shipment]:
    """Download every shipment under the shipper's prefix into ``staging`` (segments there, media in
    ``staging/media``), checked; the local scan then reads ``staging`` as a journal directory. The
    listing must reach ``must_reach`` (:func:`complete_listing`)."""
    (staging / MEDIA_DIR).mkdir(parents=True, exist_ok=True)
    names = complete_listing(shipper, must_reach, why)
    fault_point("resume.download", len(names))
    if not names:
        return []
    try:
        with concurrent.futures.ThreadPoolExecutor(min(_DOWNLOADS, len(names))) as pool:
            return list(pool.map(lambda n: shipper.fetch(n[0], staging), names))
    except BundleError:
        raise
    except OSError as e:
        raise JournalError(f"{staging}: cannot unpack the journal downloaded from {shipper}: {e}") from None
