"""The rollout journal's on-disk format: names, framing, limits and its errors (see the
``Records`` section of :mod:`trainer_hooks.journal._writer`, and docs/RESUME.md). Shared by
the writer (:mod:`._writer`) and the reader (:mod:`._scan`), so that both change
together when the format does.

Versions
--------
The segment magic carries the version (``RBJOURNAL<n>\\n``); a segment of a version not listed
here is refused in one line (a newer rollout-bundles wrote it), never skipped.

**Version 2** (written since issue 24). Every byte a recovery acts on is covered by a checksum
checked before it is used::

    segment: "RBJOURNAL2\\n" | u32 header_len | u32 crc32(header_len + header) | header
    record:  "RJR2" | u32 meta_len | u32 body_len | u32 body_crc | u32 head_crc | meta | body

``body_crc`` is crc32(body); ``head_crc`` is crc32 over the 16 bytes before it (magic, both
lengths, ``body_crc``) and ``meta``. A scan checks every record's ``head_crc`` (a few dozen
bytes a record: the frame and the small meta that recovery replays, a ``consumed`` step
included), so a flipped bit there is found before anything acts on it; the body, whose checksum
the head covers, is checked when it is decoded (for records after the segment's last sync mark,
by the scan, since only there can a write have been torn).

**Version 1** (before issue 24): ``"RBJOURNAL1\\n" | u32 header_len | header`` and records
``"RJR1" | u32 meta_len | u32 body_len | u32 crc32(lengths + meta + body) | meta | body``. Its one
checksum covers the meta only together with the body, so checking a record's meta means reading
its body. Version 1 segments are still read, with that rule applied to every record at scan time
(bodies included): a journal left by the previous release resumes, fail-closed like a version 2
one, at the cost of reading its bodies once during the scan. That cost is paid only for the
segments written before the upgrade, which compaction removes one checkpoint generation later;
refusing them instead would turn an upgrade between two checkpoints into a lost interval of
generation, for no safety gained. The writer writes version 2 only.

Damage and hostile input
------------------------
:class:`JournalCorruptError` names the segment, the byte offset of the record (and the seq it
should have had), what was expected and what was found. A damaged record is a *torn tail*
(ignored, one line) only where a crash can have torn a write: after the segment's last valid
sync mark, in the last segment of its lineage or in one the next segment of the lineage
continues from (a resumed run's). Anything else is corruption, and resume fails closed.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from bundles import BundleError
from bundles.support import LIMITS, media_name_ok
from trainer_hooks.checkpoints import CHECKPOINT_SUBDIR

__all__ = [
    "JOURNAL_DIR",
    "MEDIA_DIR",
    "JournalCorruptError",
    "JournalError",
    "JournalLimitError",
    "JournalRecord",
    "journal_dir",
]

JOURNAL_DIR = "journal"
MEDIA_DIR = "media"
SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".rjl"
#: Every segment magic is ``SEGMENT_MAGIC_PREFIX + <version> + "\n"``.
SEGMENT_MAGIC_PREFIX = b"RBJOURNAL"
SEGMENT_MAGIC = b"RBJOURNAL2\n"
SEGMENT_MAGIC_V1 = b"RBJOURNAL1\n"
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
RECORD_MAGIC = b"RJR2"
RECORD_MAGIC_V1 = b"RJR1"
#: version 2: magic, meta_len, body_len, body_crc, head_crc
FRAME = struct.Struct("<4sIIII")
#: the part of a version 2 frame that ``head_crc`` covers (with the meta)
FRAME_HEAD = struct.Struct("<4sIII")
#: version 1: magic, meta_len, body_len, crc
FRAME_V1 = struct.Struct("<4sIII")
LENGTHS = struct.Struct("<II")
U32 = struct.Struct("<I")
#: Limits of one record's meta and body (and a segment header): rows of the one table of limits
#: (:data:`bundles.support.LIMITS`), which the writer checks before a record is durable and the
#: reader when it reads one; every field's own bound is its kind's (:mod:`._kinds`).
MAX_META_BYTES = LIMITS["MAX_RECORD_META_BYTES"]
MAX_BODY_BYTES = LIMITS["MAX_RECORD_BODY_BYTES"]
#: A record body decompresses to at most this (what the bundle codec decodes as one sample).
MAX_BODY_RAW_BYTES = LIMITS["MAX_SAMPLE_RAW_BYTES"]
DEFAULT_SEGMENT_BYTES = 256 << 20
ZSTD_LEVEL = 1

#: The journal on an object store (:mod:`._store_sink`): one object per flush interval, a
#: segment and the media its records were first to reference, named after the segment.
SHIPMENT_SUFFIX = ".rjs"
SHIPMENT_MAGIC = b"RBJSHIP1\n"
#: Limits when reading a shipment: its size, and how many media it may carry.
MAX_SHIPMENT_BYTES = LIMITS["MAX_SHIPMENT_BYTES"]
MAX_SHIPMENT_MEDIA = LIMITS["MAX_SHIPMENT_MEDIA"]


@dataclass
class JournalRecord:
    """One complete record; ``body`` is the compressed codec value (decoded only when needed).

    Its frame and meta were checked by the scan. The body's checksum (format version 2) is
    checked when it is decoded (:func:`~._scan.record_body`) for records before their segment's last
    sync mark (fsynced whole), by the scan for those after it (only there can a write have been
    torn); ``crc`` is the body checksum still to check (None: checked). ``lengths`` and ``meta``
    are kept for compatibility and unused (a version 1 record is checked whole by the scan)."""

    seq: int
    kind: str
    at: float
    a: Any
    b: Any
    media: list[str]
    body: bytes | memoryview
    segment: Path
    crc: int | None = None  # the body checksum still to check (None: checked)
    lengths: bytes = b""
    meta: bytes | memoryview = b""
    offset: int = 0  # the record's byte offset in its segment
    #: what messages name for its segment (the store object it came in; "": ``segment``)
    where: str = ""


class JournalError(BundleError):
    """The journal cannot be written or read as asked (names the journal and the record)."""


class JournalLimitError(JournalError, ValueError):
    """A record the writer refuses to append: a field out of the bound its reader accepts (see
    :mod:`._kinds`); nothing of it is written. The message names the journal, the record's kind
    and the field, what it may hold and what it held."""


class JournalCorruptError(JournalError):
    """The journal holds bytes its writer cannot have left, even when killed mid-write: a damaged
    record that was durable, a gap in the seqs, a record naming a file outside the journal. A
    resume refuses it (nothing is guessed); the message names the segment, the byte offset and
    the record, what was expected and what was found."""


def journal_dir(root: str | os.PathLike[str]) -> Path:
    """``<root>/rollout/journal``: the journal beside the rollout checkpoints of ``root``."""
    return Path(os.path.abspath(root)) / CHECKPOINT_SUBDIR / JOURNAL_DIR


def segment_name(first_seq: int, lineage: str, attempt: int = 0) -> str:
    # ``attempt`` > 0 when a dead writer left a segment starting at the same seq with no complete
    # record (killed before its first record was whole): names sort by (seq, attempt).
    return f"{SEGMENT_PREFIX}{first_seq:012d}-{lineage}-{attempt:03d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, str, int] | None:
    """``(first_seq, lineage, attempt)`` of a name :func:`segment_name` makes; None otherwise.
    A seq or an attempt has at most as many digits as the largest seq (a name from a store
    listing or a checkpoint's meta is untrusted: ``int()`` of thousands of digits raises)."""
    if not (name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX)):
        return None
    seq, _, rest = name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)].partition("-")
    lineage, _, attempt = rest.rpartition("-")
    if not (lineage and _number(seq) and _number(attempt)):
        return None
    return int(seq), lineage, int(attempt)


_DIGITS = frozenset("0123456789")
_MOST_DIGITS = len(str(LIMITS["MAX_INT"]))


def _number(text: str) -> bool:
    return 0 < len(text) <= _MOST_DIGITS and _DIGITS.issuperset(text)


def is_content_name(name: str) -> bool:
    stem = name.split(".", 1)[0]
    return len(stem) == 64 and all(c in "0123456789abcdef" for c in stem)


def is_media_name(name: object) -> bool:
    """A name a record may list in ``media``: ``<64 hex><suffix>`` (bundles' one rule), which
    cannot name anything outside ``journal/media`` or the run's media directory."""
    return type(name) is str and media_name_ok(name)


def record_crc(lengths: bytes, meta: Any, body: Any) -> int:
    """The version 1 record checksum: crc32 over the lengths, the meta and the body, in order."""
    return zlib.crc32(body, zlib.crc32(meta, zlib.crc32(lengths)))


def head_crc(head: Any, meta: Any) -> int:
    """The version 2 ``head_crc``: crc32 over the frame's first 16 bytes and the meta."""
    return zlib.crc32(meta, zlib.crc32(head))


def frame_record(meta: bytes, body: bytes) -> bytes:
    """One version 2 record: frame, meta, body."""
    return b"".join(frame_record_parts(meta, body))


def frame_record_parts(meta: bytes, body: bytes) -> tuple[bytes, bytes]:
    """The bytes of :func:`frame_record` in two parts, (frame and meta, body), for a writer that
    hands both to ``os.writev`` instead of copying a sample's body into one buffer."""
    head = FRAME_HEAD.pack(RECORD_MAGIC, len(meta), len(body), zlib.crc32(body))
    return head + U32.pack(head_crc(head, meta)) + meta, body


def shipment_name(segment: str) -> str:
    """The store object that carries segment ``segment`` (see :mod:`._store_sink`)."""
    return segment[: -len(SEGMENT_SUFFIX)] + SHIPMENT_SUFFIX


def shipment_trailer(segment_len: int, media: list[tuple[str, int]]) -> bytes:
    """A shipment's last bytes, after its segment and media: the msgpack header
    ``{"segment": <bytes>, "media": [[name, size], ...]}``, its length, the checksum of both, and
    the magic. At the end, so that the segment is the object's first bytes: a recovery downloads
    the object into a file and cuts it down to its segment, never copying the segment."""
    header = msgpack.packb({"segment": segment_len, "media": [[n, s] for n, s in media]})
    length = U32.pack(len(header))
    return header + length + U32.pack(zlib.crc32(length, zlib.crc32(header))) + SHIPMENT_MAGIC


def segment_header(header: bytes) -> bytes:
    """A version 2 segment's first bytes: magic, header length, its checksum, the header."""
    length = U32.pack(len(header))
    return SEGMENT_MAGIC + length + U32.pack(zlib.crc32(header, zlib.crc32(length))) + header
