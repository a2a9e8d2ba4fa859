"""The rollout journal's on-disk format: names, framing, limits and its error (see the
``Records`` section of :mod:`trainer_hooks.checkpoints._journal`, and docs/RESUME.md). Shared by
the writer (:mod:`._journal`) and the reader (:mod:`._journal_scan`), so that both change
together when the format does."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

from bundles import BundleError
from trainer_hooks.checkpoints._paths import CHECKPOINT_SUBDIR

__all__ = [
    "JOURNAL_DIR",
    "KINDS",
    "MEDIA_DIR",
    "JournalError",
    "journal_dir",
]

JOURNAL_DIR = "journal"
MEDIA_DIR = "media"
SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".rjl"
SEGMENT_MAGIC = b"RBJOURNAL1\n"
RECORD_MAGIC = b"RJR1"
FRAME = struct.Struct("<4sIII")
LENGTHS = struct.Struct("<II")
U32 = struct.Struct("<I")
#: Limits when reading (a journal may be damaged): one record's meta and body, a segment header.
MAX_META_BYTES = 1 << 20
MAX_BODY_BYTES = 1 << 30
DEFAULT_SEGMENT_BYTES = 256 << 20
ZSTD_LEVEL = 1

KINDS = ("take", "sample", "group", "consumed", "recycled", "dropped", "sync")


class JournalError(BundleError):
    """The journal cannot be written or read as asked (names the journal and the record)."""


def journal_dir(root: str | os.PathLike[str]) -> Path:
    """``<root>/rollout/journal``: the journal beside the rollout checkpoints of ``root``."""
    return Path(os.path.abspath(root)) / CHECKPOINT_SUBDIR / JOURNAL_DIR


def segment_name(first_seq: int, lineage: str, attempt: int = 0) -> str:
    # ``attempt`` > 0 when a dead writer left a segment starting at the same seq with no complete
    # record (killed before its first record was whole): names sort by (seq, attempt).
    return f"{SEGMENT_PREFIX}{first_seq:012d}-{lineage}-{attempt:03d}{SEGMENT_SUFFIX}"


def is_content_name(name: str) -> bool:
    stem = name.split(".", 1)[0]
    return len(stem) == 64 and all(c in "0123456789abcdef" for c in stem)


def record_crc(lengths: bytes, meta: Any, body: Any) -> int:
    """The record checksum: crc32 over the lengths, the meta and the body, in that order."""
    return zlib.crc32(body, zlib.crc32(meta, zlib.crc32(lengths)))
