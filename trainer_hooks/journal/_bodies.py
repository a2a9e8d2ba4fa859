"""A journal record's body: its checksum checked, decompressed within its bound, decoded.

A scan keeps bodies compressed and undecoded (:class:`~._format.JournalRecord`); a recovery
decodes one when it needs the group (:func:`record_value`), and a message names the record by
:func:`record_where` (its segment, or the store object the segment came in, its byte offset, seq
and kind). The checksums matched when the record was read, so a body that does not decode, or
whose value is not its kind's shape, was written so: :class:`~._format.JournalCorruptError`.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Mapping
from typing import Any

import zstandard

from bundles import MediaRef, decode_sample
from trainer_hooks.journal._format import MAX_BODY_RAW_BYTES, JournalCorruptError, JournalError, JournalRecord
from trainer_hooks.journal._kinds import KINDS

__all__ = ["decompress_body", "record_body", "record_value", "record_where"]


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
