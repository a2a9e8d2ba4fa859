"""Reading the rollout journal: :func:`scan_journal` keeps record bodies compressed and undecoded
(decoding is deferred until a group is needed, :func:`record_body`). Segments are memory-mapped,
so a scan reads only the pages it touches. The format is :mod:`._format`'s; the writer
is :mod:`._writer`.

What a scan trusts, and what it refuses
---------------------------------------
Segments are opened as a bundle's files are (:func:`bundles.support.open_regular_file`: regular
files only, never through a symlink, never blocking on a FIFO), and each one's name, header and
records must agree (the lineage and first seq in the name are the header's; seqs go up by one
from the header's first seq and on into the next segment of the lineage). Every record's frame
and meta are checked against their checksum before anything reads them (version 1: the whole
record), and the meta must be one the writer writes (kinds, types, media names that are
``<64 hex><suffix>``, so nothing a record names can lie outside ``journal/media``).

A record that fails is a *torn tail* only where a crash can have torn a write: no valid sync
mark follows it in its segment (a sync mark is written after an fsync that made everything
before it durable), and the segment is the last of its lineage or the next one continues from
the seq the damage cut off (a resumed run's, which started there). Then it and everything after
it in the segment are ignored, in one line. Anything else, a damaged record that was durable, a
gap or a step back in the seqs, a name or header that disagrees, is
:class:`~._format.JournalCorruptError`: the scan fails closed, naming the segment, the
byte offset, the seq the record should have had, what was expected and what was found.
Segments of another lineage (another run's journal) are skipped with one line.
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zstandard

from bundles import BundleError, MediaRef, decode_sample
from bundles.support import gc_paused, open_regular_file
from trainer_hooks.journal._format import (
    FRAME,
    FRAME_V1,
    LENGTHS,
    MAX_BODY_BYTES,
    MAX_BODY_RAW_BYTES,
    MAX_META_BYTES,
    RECORD_MAGIC,
    RECORD_MAGIC_V1,
    SEGMENT_MAGIC,
    SEGMENT_MAGIC_PREFIX,
    SEGMENT_MAGIC_V1,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    SUPPORTED_VERSIONS,
    U32,
    JournalCorruptError,
    JournalError,
    JournalRecord,
    head_crc,
    parse_segment_name,
    record_crc,
)
from trainer_hooks.journal._kinds import KINDS

__all__ = [
    "JournalRecord",
    "JournalScan",
    "decompress_body",
    "journal_lineages",
    "record_body",
    "record_value",
    "record_where",
    "scan_journal",
]


# -- reading -------------------------------------------------------------------------------------
@dataclass
class JournalScan:
    """What :func:`scan_journal` found: complete records in seq order and one line per problem."""

    directory: Path
    records: list[JournalRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: the segments read and their bytes (of ``lineage`` when one was asked for)
    segments: int = 0
    bytes: int = 0
    lineages: set[str] = field(default_factory=set)
    fingerprint: dict[str, Any] | None = None
    last_sync_at: float | None = None
    synced_seq: int = 0
    torn: bool = False
    #: the first seq the last torn tail cut off (None: no torn tail at the end)
    torn_seq: int | None = None


@dataclass
class _Entry:
    path: Path
    first_seq: int
    lineage: str
    attempt: int
    where: str = ""  # what messages name: the segment, or the store object it came in


#: What a message names for a segment file: the file itself (a journal read where it is kept), or
#: the store object it was unpacked from (a journal read back from a store, :mod:`._store_sink`).
Origin = Callable[[Path], str]


@dataclass
class _Frame:
    start: int
    end: int
    meta: tuple[Any, ...]
    blen: int
    body_crc: int | None  # version 2: the body's checksum; version 1: None (checked whole)


@dataclass
class _Torn:
    where: str
    pos: int
    reason: str
    lost_seq: int | None


def _entries(directory: Path, only: Sequence[Path] | None, origin: Origin = str) -> list[_Entry]:
    if only is not None:
        paths = [Path(p) for p in only]
    else:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise JournalError(f"{directory}: cannot list the journal: {e.strerror or e}") from None
        paths = [directory / n for n in names if n.startswith(SEGMENT_PREFIX) and n.endswith(SEGMENT_SUFFIX)]
    out = []
    for path in paths:
        parsed = parse_segment_name(path.name)
        if parsed is None:
            raise JournalCorruptError(
                f"{origin(path)}: not a journal segment name: expected segment-<seq>-<lineage>-<attempt>{SEGMENT_SUFFIX}"
            )
        out.append(_Entry(path, *parsed, where=origin(path)))
    out.sort(key=lambda e: (e.first_seq, e.attempt, e.lineage))
    return out


def _open(path: Path, where: str) -> tuple[Any, int]:
    """The segment's bytes, memory-mapped, and a descriptor to ``pread`` its frames (the caller
    closes it); opened as a bundle's files are (regular files only, no symlink, no blocking)."""
    try:
        f, size = open_regular_file(path)
    except FileNotFoundError:
        raise
    except BundleError:
        raise
    except OSError as e:
        raise JournalError(f"{where}: cannot read the journal segment: {e.strerror or e}") from None
    fd = os.dup(f.fileno())
    f.close()
    try:
        data: Any = b"" if size == 0 else mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        raise
    return data, fd


def _header(data: Any, where: str) -> tuple[dict[str, Any] | None, int, int, str | None]:
    """``(header, records' start, version, damage)``: damage is why the header cannot be read
    (None when it can). A segment of a version this release does not read is refused."""
    magic_len = len(SEGMENT_MAGIC)
    head = bytes(data[:magic_len])
    if head.startswith(SEGMENT_MAGIC_PREFIX) and len(head) == magic_len and head.endswith(b"\n"):
        version_text = head[len(SEGMENT_MAGIC_PREFIX) : -1]
        if version_text.isdigit() and int(version_text) not in SUPPORTED_VERSIONS:
            raise JournalError(
                f"{where}: journal format version {int(version_text)}: this rollout-bundles reads versions "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}; a newer rollout-bundles wrote it"
            )
    if head == SEGMENT_MAGIC:
        version, lengths_size = 2, 8
    elif head == SEGMENT_MAGIC_V1:
        version, lengths_size = 1, 4
    else:
        return None, 0, 2, f"expected the segment magic {SEGMENT_MAGIC!r}, found {head!r}"
    if len(data) < magic_len + lengths_size:
        return None, 0, version, f"{len(data)} bytes, shorter than a segment header"
    pos = magic_len + lengths_size
    (hlen,) = U32.unpack_from(data, magic_len)
    if hlen > MAX_META_BYTES:
        return None, 0, version, f"header length {hlen}, over the {MAX_META_BYTES}-byte limit"
    if pos + hlen > len(data):
        return None, 0, version, f"header of {hlen} bytes, {len(data) - pos} present"
    raw = bytes(data[pos : pos + hlen])
    if version == 2:
        (stored,) = U32.unpack_from(data, magic_len + 4)
        found = zlib.crc32(raw, zlib.crc32(bytes(data[magic_len : magic_len + 4])))
        if found != stored:
            return None, 0, version, f"header checksum: expected {stored:#010x}, found {found:#010x}"
    try:
        header = msgpack.unpackb(raw, raw=False)
    except Exception as e:
        return None, 0, version, f"header is not msgpack ({e})"
    if not isinstance(header, dict) or type(header.get("lineage")) is not str:
        if version == 2:  # checksummed: the writer wrote it so
            raise JournalCorruptError(
                f"{where}: segment header: expected a map with a lineage, found {_short(header)}"
            )
        return None, 0, version, "header without a lineage"
    return header, pos + hlen, version, None


def _corrupt(where: str, what: str) -> JournalCorruptError:
    return JournalCorruptError(f"{where}: {what}")


def _check_meta(meta_b: bytes, where: str, pos: int, next_seq: int | None, blen: int) -> tuple[Any, ...]:
    """The record meta as the writer writes it (its kind's shape, :data:`~._kinds.KINDS`, and a
    body exactly where the kind has one), or :class:`JournalCorruptError` (its checksum matched,
    so this is not a torn write: a writer bug or a crafted journal)."""
    try:
        meta = msgpack.unpackb(meta_b, raw=False, strict_map_key=False)
        seq, kind, at, a, b, media = meta
        good = type(meta) is list and type(kind) is str  # each field's own rule: its kind's
    except Exception:
        good = False
    if not good:
        raise _corrupt(
            _where(where, pos, next_seq),
            f"record meta: expected [seq, kind, at, a, b, media], found {_short(meta_b)}",
        )
    spec = KINDS.get(kind)
    if spec is None:
        raise _corrupt(
            _where(where, pos, next_seq),
            f"record kind: expected one of {', '.join(KINDS)}, found {_short(kind)}",
        )
    # The bounds the writer checked before it wrote the record (one table, :mod:`._kinds`).
    problem = spec.problem(seq, at, a, b, media)
    if problem is not None:
        raise _corrupt(_where(where, pos, next_seq), problem)
    if spec.has_body(b) != (blen > 0):
        raise _corrupt(
            _where(where, pos, next_seq),
            f"{kind} record: expected "
            + ("a body" if spec.has_body(b) else "no body")
            + f" (b {_short(b)}), found {blen} body bytes",
        )
    return seq, kind, at, a, b, media


def _where(where: str, pos: int, next_seq: int | None) -> str:
    return f"{where}: record at byte {pos}" + ("" if next_seq is None else f" (seq {next_seq} expected)")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _walk(
    fd: int, data: Any, pos: int, version: int, where: str, next_seq: int | None
) -> tuple[list[_Frame], int | None, str | None]:
    """The frames from ``pos`` on, each checked against its checksum; stops at the first that
    fails: ``(frames, its offset, why)`` (None, None: the segment ends cleanly). Frames and metas
    are read with ``pread`` (the bodies, all but a few per cent of the bytes, are not touched
    unless version 1 needs them for its checksum)."""
    frames: list[_Frame] = []
    size = len(data)
    frame = FRAME if version == 2 else FRAME_V1
    magic_expected = RECORD_MAGIC if version == 2 else RECORD_MAGIC_V1
    fsize = frame.size
    view = memoryview(data) if version == 1 and size else None
    while pos < size:
        if size - pos < fsize:
            return frames, pos, f"{size - pos} trailing bytes, shorter than a record frame"
        head = os.pread(fd, fsize + 256, pos)
        if version == 2:
            magic, mlen, blen, body_crc, stored = FRAME.unpack_from(head, 0)
        else:
            magic, mlen, blen, stored = FRAME_V1.unpack_from(head, 0)
            body_crc = None
        if magic != magic_expected:
            return frames, pos, f"expected the record magic {magic_expected!r}, found {magic!r}"
        if mlen > MAX_META_BYTES or blen > MAX_BODY_BYTES:
            return frames, pos, f"meta_len {mlen}, body_len {blen}: over the format's limits"
        end = pos + fsize + mlen + blen
        if pos + fsize + mlen > size:
            return frames, pos, f"record meta of {mlen} bytes, {size - pos - fsize} present"
        meta_b = head[fsize : fsize + mlen]
        if len(meta_b) < mlen:
            meta_b = os.pread(fd, mlen, pos + fsize)
        if version == 2:
            found = head_crc(head[:16], meta_b)
            if found != stored:
                return frames, pos, f"frame checksum: expected {stored:#010x}, found {found:#010x}"
            if end > size:
                return frames, pos, f"record of {mlen + blen} bytes, {size - pos - fsize} present"
        else:
            if end > size:
                return frames, pos, f"record of {mlen + blen} bytes, {size - pos - fsize} present"
            assert view is not None
            found = record_crc(LENGTHS.pack(mlen, blen), meta_b, view[pos + fsize + mlen : end])
            if found != stored:
                return frames, pos, f"checksum: expected {stored:#010x}, found {found:#010x}"
        meta = _check_meta(meta_b, where, pos, next_seq, blen)
        if meta[1] != "sync" and next_seq is not None:
            next_seq += 1
        frames.append(_Frame(pos, end, meta, blen, body_crc))
        pos = end
    return frames, None, None


def _sync_mark_after(data: Any, start: int, versions: Sequence[int]) -> int | None:
    """The offset of the first valid sync mark at or after ``start`` (None: none). A sync mark is
    written after an fsync made every byte before it durable: damage before one is not a torn
    write."""
    size = len(data)
    for version in versions:
        magic, frame = (RECORD_MAGIC, FRAME) if version == 2 else (RECORD_MAGIC_V1, FRAME_V1)
        i = data.find(magic, start) if size else -1
        while i != -1:
            if i + frame.size <= size:
                fields = frame.unpack_from(data, i)
                mlen, blen = fields[1], fields[2]
                if blen == 0 and mlen <= 256 and i + frame.size + mlen <= size:
                    meta_b = bytes(data[i + frame.size : i + frame.size + mlen])
                    if version == 2:
                        ok = fields[3] == 0 and head_crc(bytes(data[i : i + 16]), meta_b) == fields[4]
                    else:
                        ok = record_crc(LENGTHS.pack(mlen, 0), meta_b, b"") == fields[3]
                    if ok:
                        try:
                            meta = msgpack.unpackb(meta_b, raw=False)
                        except Exception:
                            meta = None
                        if type(meta) is list and len(meta) == 6 and meta[1] == "sync":
                            return i
            i = data.find(magic, i + 1)
    return None


def journal_lineages(directory: str | os.PathLike[str], *, origin: Origin = str) -> set[str]:
    """The lineages of a journal's segments, from their headers (their names for a segment whose
    header a crash tore); ``origin`` as :func:`scan_journal`'s."""
    out = set()
    for entry in _entries(Path(directory), None, origin):
        if _header_only(entry) is not None:
            out.add(entry.lineage)
    return out


def _header_only(entry: _Entry) -> tuple[dict[str, Any] | None, int] | None:
    """``(header, size)`` of a segment read for its header alone, the header checked against the
    segment's name (None for a header a crash tore); None when the segment is gone (a compaction
    removed it since it was listed)."""
    try:
        data, fd = _open(entry.path, entry.where)
    except FileNotFoundError:
        return None
    try:
        header, _, _, _ = _header(data, entry.where)
    finally:
        os.close(fd)
    if header is not None:
        _check_names(entry, header)
    return header, len(data)


def _check_names(entry: _Entry, header: dict[str, Any]) -> None:
    if header["lineage"] != entry.lineage:
        raise JournalCorruptError(
            f"{entry.where}: segment header: expected lineage {entry.lineage!r} (the segment's name), "
            f"found {_short(header['lineage'])}"
        )
    if header.get("first_seq", entry.first_seq) != entry.first_seq:
        raise JournalCorruptError(
            f"{entry.where}: segment header: expected first_seq {entry.first_seq} (the segment's name), "
            f"found {_short(header.get('first_seq'))}"
        )


def scan_journal(
    directory: str | os.PathLike[str],
    *,
    lineage: str | None = None,
    after_seq: int = 0,
    decode_bodies: bool = True,
    only: Sequence[Path] | None = None,
    origin: Origin = str,
) -> JournalScan:
    """Read the complete records of a journal, oldest first, keeping bodies undecoded.

    ``lineage``: only that run lineage's segments are read (the others are skipped, one problem
    line each); None reads every lineage, each checked on its own. Records with seq <=
    ``after_seq`` are checked but not kept. A torn tail (see the module docstring) is one
    problem line; corruption raises :class:`JournalCorruptError`, a segment that is not a
    regular file :class:`bundles.UnsafeBundleError`. ``decode_bodies=False`` keeps no bodies
    (indexing); ``only``: just these segments (of ``lineage``). ``origin(path)``: what messages
    and records (:attr:`JournalRecord.where`) name for a segment file (default: the file; a
    journal read back from a store names the object each segment came in).
    """
    directory = Path(directory)
    scan = JournalScan(directory)
    chains: dict[str, list[_Entry]] = {}
    for entry in _entries(directory, only, origin):
        chains.setdefault(entry.lineage, []).append(entry)
    # A scan makes a few objects a record (tens of thousands) and no cycles; the collections
    # they set off walk the whole heap of a trainer's process each time (its model, torch, the
    # samples it holds): with the collector on, a scan of 10,000 records took 2-3x as long.
    with gc_paused():
        for name in sorted(chains):
            if lineage is not None and name != lineage:
                for entry in chains[name]:
                    _foreign(scan, entry, lineage)
                continue
            _scan_chain(scan, chains[name], after_seq, decode_bodies)
    return scan


def _foreign(scan: JournalScan, entry: _Entry, lineage: str) -> None:
    read = _header_only(entry)
    if read is None:
        return
    header, _ = read  # another lineage's: not counted in this one's segments and bytes
    if header is not None:
        scan.lineages.add(header["lineage"])
    scan.problems.append(
        f"{entry.where}: journal segment of another run lineage ({entry.lineage}, expected {lineage}); ignored"
    )


@dataclass
class _Read:
    """One segment as :func:`_read_segment` read it: its bytes, header (None: torn), version, the
    frames that checked, and where and why the rest did not (None: it ends cleanly)."""

    data: Any
    header: dict[str, Any] | None
    version: int
    frames: list[_Frame]
    damage_at: int | None
    damage: str | None


def _scan_chain(scan: JournalScan, chain: list[_Entry], after_seq: int, decode_bodies: bool) -> None:
    """One lineage's segments, in seq order: each continues the one before it."""
    expected: int | None = None  # the seq of the next data record
    torn: _Torn | None = None  # a torn tail not yet known to be the last one
    for entry in chain:
        read = _read_segment(scan, entry, expected)
        if read is None:
            continue  # compacted meanwhile
        _check_unsynced_bodies(read)
        data_frames = [f for f in read.frames if f.meta[1] != "sync"]
        # The seq the damage cut off: the one after the segment's last good record.
        cut_seq = (
            data_frames[-1].meta[0] + 1
            if data_frames
            else (expected if expected is not None else entry.first_seq)
        )
        if read.damage_at is not None:
            _refuse_durable_damage(entry, read, cut_seq)
        view = memoryview(read.data) if len(read.data) else None
        for f in read.frames:
            seq, kind, at, a, b, media = f.meta
            if kind == "sync":
                scan.last_sync_at, scan.synced_seq = at, max(scan.synced_seq, int(b))
                continue
            if expected is None:
                expected = seq
            if seq != expected:
                raise _out_of_order(entry, f, seq, expected, torn)
            if read.header is not None and f is data_frames[0] and seq != read.header.get("first_seq", seq):
                raise JournalCorruptError(
                    f"{entry.where}: record at byte {f.start}: expected seq {read.header.get('first_seq')} (the "
                    f"segment header's first_seq), found {seq}"
                )
            torn = None
            expected = seq + 1
            if seq > after_seq:
                body: bytes | memoryview = b""
                if decode_bodies and f.blen:
                    assert view is not None
                    body = view[f.end - f.blen : f.end]
                crc = f.body_crc if decode_bodies else None
                scan.records.append(
                    JournalRecord(
                        seq,
                        kind,
                        at,
                        a,
                        b,
                        list(media),
                        body,
                        entry.path,
                        crc,
                        offset=f.start,
                        where=entry.where,
                    )
                )
        if read.damage_at is not None:
            torn = _Torn(entry.where, read.damage_at, read.damage or "damaged", cut_seq)
            scan.problems.append(
                f"{entry.where}: torn tail at byte {read.damage_at} ({read.damage}): "
                f"{len(read.data) - read.damage_at} bytes ignored (never durable); the records before it are kept"
            )
            scan.torn = True
            expected = cut_seq if expected is None else expected
    scan.torn_seq = None if torn is None else torn.lost_seq


def _read_segment(scan: JournalScan, entry: _Entry, expected: int | None) -> _Read | None:
    """Open ``entry``, read its header and walk its frames (None: it is gone, compacted since it
    was listed); counted in ``scan``."""
    try:
        data, fd = _open(entry.path, entry.where)
    except FileNotFoundError:
        return None
    try:
        scan.segments += 1
        scan.bytes += len(data)
        header, pos, version, damage = _header(data, entry.where)
        frames: list[_Frame] = []
        damage_at: int | None = 0 if damage is not None else None
        if header is not None:
            _check_names(entry, header)
            scan.lineages.add(header["lineage"])
            scan.fingerprint = header.get("fingerprint")
            first = expected if expected is not None else entry.first_seq
            frames, damage_at, damage = _walk(fd, data, pos, version, entry.where, first)
        else:
            scan.lineages.add(entry.lineage)
    finally:
        os.close(fd)
    return _Read(data, header, version, frames, damage_at, damage)


def _check_unsynced_bodies(read: _Read) -> None:
    """Records after the last sync mark were not fsynced: their bodies are checked now; the first
    that fails is damage (it and every frame after it are dropped)."""
    last_sync = max((i for i, f in enumerate(read.frames) if f.meta[1] == "sync"), default=-1)
    view = memoryview(read.data) if len(read.data) else None
    for i in range(last_sync + 1, len(read.frames)):
        f = read.frames[i]
        if f.body_crc is not None and f.blen:
            assert view is not None
            found = zlib.crc32(view[f.end - f.blen : f.end])
            if found != f.body_crc:
                read.damage_at = f.start
                read.damage = f"body checksum: expected {f.body_crc:#010x}, found {found:#010x}"
                del read.frames[i:]
                return
            f.body_crc = None


def _refuse_durable_damage(entry: _Entry, read: _Read, cut_seq: int) -> None:
    """Damage followed by a valid sync mark was durable: corruption, not a torn write."""
    assert read.damage_at is not None
    versions = (read.version,) if read.header is not None else (2, 1)
    mark = _sync_mark_after(read.data, read.damage_at + 1, versions)
    if mark is not None:
        raise JournalCorruptError(
            f"{entry.where}: record at byte {read.damage_at} (seq {cut_seq} expected) is damaged: {read.damage}; "
            f"a valid sync mark follows at byte {mark}, so it was durable: corruption, not a torn write; "
            "refusing to resume from this journal (nothing is guessed)"
        )


def _out_of_order(
    entry: _Entry, f: _Frame, seq: int, expected: int, torn: _Torn | None
) -> JournalCorruptError:
    """A record whose seq does not continue the lineage: past a torn tail (then that tail was
    durable), or a gap or a step back."""
    if torn is not None:
        return JournalCorruptError(
            f"{torn.where}: record at byte {torn.pos} (seq {torn.lost_seq} expected) is damaged: "
            f"{torn.reason}; the journal goes on in {entry.where} at seq {seq}, past it (a run "
            f"resumed after a crash goes on at seq {torn.lost_seq}): it was durable: corruption, not a "
            "torn write; refusing to resume from this journal (nothing is guessed)"
        )
    return JournalCorruptError(
        f"{entry.where}: record at byte {f.start}: expected seq {expected}, found {seq} "
        + (
            f"(records {expected}..{seq - 1} are missing: a segment removed or damaged)"
            if seq > expected
            else "(a seq repeated or going back)"
        )
        + "; refusing to resume from this journal (nothing is guessed)"
    )


def record_where(rec: JournalRecord) -> str:
    """What a message names for record ``rec``: its segment (the store object it came in, for a
    journal read back from a store), its byte offset there, its seq and kind."""
    return f"{rec.where or rec.segment}: record at byte {rec.offset} (seq {rec.seq}, {rec.kind})"


def record_body(rec: JournalRecord, where: str | None = None) -> bytes:
    """The codec bytes of a record's body, its checksum checked first if the scan deferred it
    (``where``: what a message names; default :func:`record_where`)."""
    where = record_where(rec) if where is None else where
    if rec.crc is not None:
        found = zlib.crc32(rec.body)
        if found != rec.crc:
            raise JournalCorruptError(
                f"{where}: body checksum mismatch at byte {rec.offset}: expected {rec.crc:#010x}, found "
                f"{found:#010x}: the record was damaged after it was written"
            )
        rec.crc = None
    return decompress_body(rec.body, where)


def record_value(rec: JournalRecord, refs: Mapping[str, MediaRef]) -> Any:
    """A record's body decoded (its checksum checked first), with ``refs`` for the media it
    names. A body that does not decode (whatever the codec finds wrong in its bytes), or whose
    value is not the shape its kind says, is :class:`JournalCorruptError` naming the segment and
    the record's byte offset: the checksums matched, so a writer wrote it so, or a forger."""
    where = record_where(rec)
    raw = record_body(rec, where)
    try:
        value = decode_sample(raw, refs, where=where)
    except (JournalError, MemoryError):
        raise
    except Exception as e:  # untrusted bytes: any failure of the codec on them is this record's
        raise JournalCorruptError(
            f"{where}: body: {type(e).__name__}: {e}; refusing to resume from this journal (nothing is guessed)"
        ) from None
    body = KINDS[rec.kind].body
    if body == "sample":
        good = isinstance(value, (dict, list))
        expected = "a sample (a map) or a trajectory (a list)"
    else:
        samples = value.get("samples") if isinstance(value, dict) else None
        good = isinstance(samples, list) and all(isinstance(s, (dict, list)) for s in samples)
        expected = "{samples: [a sample (a map) or a trajectory (a list), ...]}"
    if not good:
        raise JournalCorruptError(
            f"{where}: body: expected {expected}, found {type(value).__name__}; refusing to resume from "
            "this journal (nothing is guessed)"
        )
    return value


_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    # One per thread: making one allocates a decompression context (a cost per record when a
    # resume decodes thousands), and one object must not be used by two threads at once.
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d


def decompress_body(body: bytes | memoryview, where: str) -> bytes:
    """The codec bytes of a record body, at most :data:`~._format.MAX_BODY_RAW_BYTES` (what the
    codec decodes as one sample). A frame that declares more is refused before anything is
    allocated (zstd sizes its output by the size a frame declares, whatever the bound asked)."""
    data = bytes(body)
    try:
        declared = zstandard.frame_content_size(data)
        if declared > MAX_BODY_RAW_BYTES:
            raise JournalCorruptError(
                f"{where}: body: a zstd frame of {declared} bytes decompressed, at most {MAX_BODY_RAW_BYTES}"
            )
        return _decompressor().decompress(data, max_output_size=MAX_BODY_RAW_BYTES)
    except zstandard.ZstdError as e:
        raise JournalCorruptError(f"{where}: body: not a valid zstd frame: {e}") from None
