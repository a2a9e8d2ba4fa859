"""Reading the rollout journal: :func:`scan_journal` keeps record bodies compressed and undecoded
(decoding is deferred until a group is needed, :func:`~._bodies.record_body`). Segments are memory-mapped,
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
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundles import BundleError
from bundles.support import gc_paused, open_regular_file
from trainer_hooks.journal._format import (
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    JournalCorruptError,
    JournalError,
    JournalRecord,
    parse_segment_name,
)
from trainer_hooks.journal._frames import Frame, read_header, short, sync_mark_after, walk_frames

__all__ = ["JournalRecord", "JournalScan", "journal_lineages", "scan_journal"]


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
        header, _, _, _ = read_header(data, entry.where)
    finally:
        os.close(fd)
    if header is not None:
        _check_names(entry, header)
    return header, len(data)


def _check_names(entry: _Entry, header: dict[str, Any]) -> None:
    if header["lineage"] != entry.lineage:
        raise JournalCorruptError(
            f"{entry.where}: segment header: expected lineage {entry.lineage!r} (the segment's name), "
            f"found {short(header['lineage'])}"
        )
    if header.get("first_seq", entry.first_seq) != entry.first_seq:
        raise JournalCorruptError(
            f"{entry.where}: segment header: expected first_seq {entry.first_seq} (the segment's name), "
            f"found {short(header.get('first_seq'))}"
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
    frames: list[Frame]
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
            seq, kind, at, _, b, _ = f.meta
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
                scan.records.append(_record(entry, f, view if decode_bodies else None))
        if read.damage_at is not None:
            torn = _Torn(entry.where, read.damage_at, read.damage or "damaged", cut_seq)
            scan.problems.append(
                f"{entry.where}: torn tail at byte {read.damage_at} ({read.damage}): "
                f"{len(read.data) - read.damage_at} bytes ignored (never durable); the records before it are kept"
            )
            scan.torn = True
            expected = cut_seq if expected is None else expected
    scan.torn_seq = None if torn is None else torn.lost_seq


def _record(entry: _Entry, f: Frame, view: memoryview | None) -> JournalRecord:
    """The record of frame ``f``; its body a view of the segment's bytes (its checksum checked
    when it is read, :func:`~._bodies.record_body`), or none without ``view`` (indexing)."""
    seq, kind, at, a, b, media = f.meta
    body: bytes | memoryview = b""
    if view is not None and f.blen:
        body = view[f.end - f.blen : f.end]
    crc = f.body_crc if view is not None else None
    return JournalRecord(
        seq, kind, at, a, b, list(media), body, entry.path, crc, offset=f.start, where=entry.where
    )


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
        header, pos, version, damage = read_header(data, entry.where)
        frames: list[Frame] = []
        damage_at: int | None = 0 if damage is not None else None
        if header is not None:
            _check_names(entry, header)
            scan.lineages.add(header["lineage"])
            scan.fingerprint = header.get("fingerprint")
            first = expected if expected is not None else entry.first_seq
            frames, damage_at, damage = walk_frames(fd, data, pos, version, entry.where, first)
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
    mark = sync_mark_after(read.data, read.damage_at + 1, versions)
    if mark is not None:
        raise JournalCorruptError(
            f"{entry.where}: record at byte {read.damage_at} (seq {cut_seq} expected) is damaged: {read.damage}; "
            f"a valid sync mark follows at byte {mark}, so it was durable: corruption, not a torn write; "
            "refusing to resume from this journal (nothing is guessed)"
        )


def _out_of_order(
    entry: _Entry, f: Frame, seq: int, expected: int, torn: _Torn | None
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
