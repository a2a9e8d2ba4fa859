"""One journal segment's bytes read: its header and its record frames, each checked.

:func:`read_header` reads a segment's magic (its format version; a newer one is refused) and
its length-prefixed header (version 2: checksummed); :func:`walk_frames` reads the record frames
after it, each against its checksum (a frame and its meta are read with ``pread``; version 2's
bodies are not touched, their checksum kept for when a body is needed), each meta against its
kind's shape (:data:`~._kinds.KINDS`), and stops at the first frame that fails, saying where and
why. Whether that is a torn tail or corruption is the scan's to decide (:mod:`._scan`), with
:func:`sync_mark_after`: damage followed by a valid sync mark was durable.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from trainer_hooks.journal._format import (
    FRAME,
    FRAME_V1,
    LENGTHS,
    MAX_BODY_BYTES,
    MAX_META_BYTES,
    RECORD_MAGIC,
    RECORD_MAGIC_V1,
    SEGMENT_MAGIC,
    SEGMENT_MAGIC_PREFIX,
    SEGMENT_MAGIC_V1,
    SUPPORTED_VERSIONS,
    U32,
    JournalCorruptError,
    JournalError,
    head_crc,
    record_crc,
)
from trainer_hooks.journal._kinds import KINDS

__all__ = ["Frame", "read_header", "short", "sync_mark_after", "walk_frames"]


@dataclass
class Frame:
    """A record frame that checked: where it lies, its meta, its body's length and checksum."""

    start: int
    end: int
    meta: tuple[Any, ...]
    blen: int
    body_crc: int | None  # version 2: the body's checksum; version 1: None (checked whole)


def read_header(data: Any, where: str) -> tuple[dict[str, Any] | None, int, int, str | None]:
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
                f"{where}: segment header: expected a map with a lineage, found {short(header)}"
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
            f"record meta: expected [seq, kind, at, a, b, media], found {short(meta_b)}",
        )
    spec = KINDS.get(kind)
    if spec is None:
        raise _corrupt(
            _where(where, pos, next_seq),
            f"record kind: expected one of {', '.join(KINDS)}, found {short(kind)}",
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
            + f" (b {short(b)}), found {blen} body bytes",
        )
    return seq, kind, at, a, b, media


def _where(where: str, pos: int, next_seq: int | None) -> str:
    return f"{where}: record at byte {pos}" + ("" if next_seq is None else f" (seq {next_seq} expected)")


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (what a message shows of an untrusted value)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def walk_frames(
    fd: int, data: Any, pos: int, version: int, where: str, next_seq: int | None
) -> tuple[list[Frame], int | None, str | None]:
    """The frames from ``pos`` on, each checked against its checksum; stops at the first that
    fails: ``(frames, its offset, why)`` (None, None: the segment ends cleanly). Frames and metas
    are read with ``pread`` (the bodies, all but a few per cent of the bytes, are not touched
    unless version 1 needs them for its checksum)."""
    frames: list[Frame] = []
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
        frames.append(Frame(pos, end, meta, blen, body_crc))
        pos = end
    return frames, None, None


def sync_mark_after(data: Any, start: int, versions: Sequence[int]) -> int | None:
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
