"""Reading the rollout journal: :func:`scan_journal` keeps record bodies compressed and undecoded
(decoding is deferred until a group is needed, :func:`record_body`); a torn or corrupt tail ends
the scan with one line naming the segment and offset, and segments of another lineage (another
run's journal) are skipped with one line. Segments are memory-mapped, so a scan reads only the
pages it touches. The format is :mod:`._journal_format`'s; the writer is :mod:`._journal`."""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zstandard

from bundles import UnsafeBundleError
from trainer_hooks.checkpoints._journal_format import (
    FRAME,
    KINDS,
    LENGTHS,
    MAX_BODY_BYTES,
    MAX_META_BYTES,
    RECORD_MAGIC,
    SEGMENT_MAGIC,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    U32,
    JournalError,
    record_crc,
)

__all__ = [
    "JournalRecord",
    "JournalScan",
    "decompress_body",
    "journal_lineages",
    "record_body",
    "scan_journal",
]


# -- reading -------------------------------------------------------------------------------------
@dataclass
class JournalRecord:
    """One complete record; ``body`` is the compressed codec value (decoded only when needed).

    Records before a segment's last ``sync`` mark were fsynced whole: their checksum is checked
    when they are decoded (:func:`record_body`), not by the scan; those after it are checked by
    the scan, since only there can a write have been torn."""

    seq: int
    kind: str
    at: float
    a: Any
    b: Any
    media: list[str]
    body: bytes | memoryview
    segment: Path
    crc: int | None = None  # the checksum still to check (None: checked)
    lengths: bytes = b""
    meta: bytes | memoryview = b""


@dataclass
class JournalScan:
    """What :func:`scan_journal` found: complete records in seq order and one line per problem."""

    directory: Path
    records: list[JournalRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    segments: int = 0
    bytes: int = 0
    lineages: set[str] = field(default_factory=set)
    fingerprint: dict[str, Any] | None = None
    last_sync_at: float | None = None
    synced_seq: int = 0
    torn: bool = False


def _segment_paths(directory: Path) -> list[Path]:
    try:
        names = sorted(
            n for n in os.listdir(directory) if n.startswith(SEGMENT_PREFIX) and n.endswith(SEGMENT_SUFFIX)
        )
    except FileNotFoundError:
        return []
    return [directory / n for n in names]


def _map(path: Path) -> Any:
    """The segment's bytes, memory-mapped (only the pages a scan touches are read)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _header(data: Any, where: str) -> tuple[dict[str, Any] | None, int, str | None]:
    if len(data) < len(SEGMENT_MAGIC) + 4 or data[: len(SEGMENT_MAGIC)] != SEGMENT_MAGIC:
        return None, 0, f"{where}: not a rollout journal segment (no header); skipped"
    pos = len(SEGMENT_MAGIC)
    (hlen,) = U32.unpack_from(data, pos)
    pos += 4
    try:
        if hlen > MAX_META_BYTES:
            raise ValueError("header too large")
        header = msgpack.unpackb(bytes(data[pos : pos + hlen]), raw=False)
        if not isinstance(header, dict) or not isinstance(header.get("lineage"), str):
            raise ValueError("no lineage")
    except Exception as e:
        return None, 0, f"{where}: unreadable segment header ({e}); skipped"
    return header, pos + hlen, None


def journal_lineages(directory: str | os.PathLike[str]) -> set[str]:
    """The lineages of a journal's segments, from their headers only."""
    out = set()
    for path in _segment_paths(Path(directory)):
        header, _, _ = _header(_map(path), str(path))
        if header is not None:
            out.add(header["lineage"])
    return out


def scan_journal(
    directory: str | os.PathLike[str],
    *,
    lineage: str | None = None,
    after_seq: int = 0,
    decode_bodies: bool = True,
    only: Sequence[Path] | None = None,
) -> JournalScan:
    """Read the complete records of a journal, oldest first, keeping bodies undecoded.

    Segments of a lineage other than ``lineage`` are skipped (one problem line each); records
    with seq <= ``after_seq`` are not kept. A torn or corrupt record ends its segment (one
    problem line naming the segment and the byte offset): it and everything after it in that
    segment were never durable, or are damaged; the next segment is read only if it continues at
    the next seq (a resumed run's). ``decode_bodies=False`` keeps no bodies (indexing).
    """
    directory = Path(directory)
    scan = JournalScan(directory)
    expected: int | None = None
    for path in only if only is not None else _segment_paths(directory):
        try:
            data = _map(path)
        except FileNotFoundError:
            continue
        scan.segments += 1
        scan.bytes += len(data)
        where = f"{path}"
        header, pos, problem = _header(data, where)
        if header is None:
            scan.problems.append(problem or where)
            scan.torn = True
            continue
        seg_lineage = header["lineage"]
        scan.lineages.add(seg_lineage)
        if lineage is None or seg_lineage == lineage:
            scan.fingerprint = header.get("fingerprint")
        if lineage is not None and seg_lineage != lineage:
            scan.problems.append(
                f"{where}: journal segment of another run lineage ({seg_lineage}, expected {lineage}); ignored"
            )
            continue
        view = memoryview(data)
        torn = None
        # Pass 1: the framing, the metas and the sync marks, read with pread: the bodies (all but
        # a few per cent of the bytes) are not touched until a record is decoded.
        frames: list[tuple[int, int, int, int, int, bytes]] = []  # (start, mlen, blen, crc, end, meta)
        size = len(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            while pos < size:
                if size - pos < FRAME.size:
                    torn = f"{size - pos} trailing bytes, shorter than a record header"
                    break
                head = os.pread(fd, FRAME.size + 256, pos)
                magic, mlen, blen, crc = FRAME.unpack_from(head, 0)
                end = pos + FRAME.size + mlen + blen
                if magic != RECORD_MAGIC or mlen > MAX_META_BYTES or blen > MAX_BODY_BYTES:
                    torn = "no record header"
                    break
                if end > size:
                    torn = f"record of {mlen + blen} bytes, {size - pos - FRAME.size} present"
                    break
                meta_b = head[FRAME.size : FRAME.size + mlen]
                if len(meta_b) < mlen:
                    meta_b = os.pread(fd, mlen, pos + FRAME.size)
                frames.append((pos, mlen, blen, crc, end, meta_b))
                pos = end
        finally:
            os.close(fd)
        synced_upto = -1  # frames before this index were fsynced (a sync mark follows them)
        metas: list[Any] = []
        for i, (_start, mlen, blen, crc, _end, meta_b) in enumerate(frames):
            try:
                meta = msgpack.unpackb(meta_b, raw=False, strict_map_key=False)
                kind = meta[1]
            except Exception:
                meta, kind = None, None
            if kind == "sync" and blen == 0 and record_crc(LENGTHS.pack(mlen, 0), meta_b, b"") == crc:
                synced_upto = i
            metas.append(meta)
        # Pass 2: records (checksums of the unsynced tail checked now, the others when decoded).
        for i, (start, mlen, blen, crc, end, meta_b) in enumerate(frames):
            lengths = LENGTHS.pack(mlen, blen)
            body = view[start + FRAME.size + mlen : end] if blen else b""
            pending_crc: int | None = crc
            if i > synced_upto:
                if record_crc(lengths, meta_b, body) != crc:
                    torn, pos = "checksum mismatch", start
                    break
                pending_crc = None
            meta = metas[i]
            try:
                seq, kind, at, a, b, media = meta
            except Exception as e:
                damaged = pending_crc is not None and record_crc(lengths, meta_b, body) != crc
                torn, pos = "checksum mismatch" if damaged else f"malformed record meta ({e})", start
                break
            if kind == "sync":
                scan.last_sync_at, scan.synced_seq = at, max(scan.synced_seq, int(b))
                continue
            if kind not in KINDS or type(seq) is not int:
                torn, pos = f"unknown record kind {kind!r}", start
                break
            if expected is not None and seq != expected:
                scan.problems.append(
                    f"{where}: record seq {seq} follows {expected - 1}: a gap; the scan stops here"
                )
                scan.torn = True
                return scan
            expected = seq + 1
            if seq > after_seq:
                scan.records.append(
                    JournalRecord(
                        seq,
                        kind,
                        at,
                        a,
                        b,
                        list(media),
                        body if decode_bodies else b"",
                        path,
                        pending_crc if decode_bodies else None,
                        lengths,
                        meta_b if decode_bodies else b"",
                    )
                )
        if torn is not None:
            scan.problems.append(
                f"{where}: torn tail at byte {pos} ({torn}): {len(data) - pos} bytes ignored (never durable); "
                "the records before it are kept"
            )
            scan.torn = True
            # The next segment continues only if it starts at the next seq (a resumed run's):
            # the gap check above stops the scan otherwise.
    return scan


def record_body(rec: JournalRecord, where: str) -> bytes:
    """The codec bytes of a record's body, its checksum checked first if the scan deferred it."""
    if rec.crc is not None:
        if record_crc(rec.lengths, rec.meta, rec.body) != rec.crc:
            raise JournalError(f"{where}: checksum mismatch: the record was damaged after it was written")
        rec.crc = None
    return decompress_body(rec.body, where)


_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    # One per thread: making one allocates a decompression context (a cost per record when a
    # resume decodes thousands), and one object must not be used by two threads at once.
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d


def decompress_body(body: bytes | memoryview, where: str) -> bytes:
    """The codec bytes of a record body (bounded by the format's per-sample limit)."""
    try:
        return _decompressor().decompress(bytes(body), max_output_size=MAX_BODY_BYTES)
    except zstandard.ZstdError as e:
        raise UnsafeBundleError(f"{where}: record body is not a valid zstd frame: {e}") from None
