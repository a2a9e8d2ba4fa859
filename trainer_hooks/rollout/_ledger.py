"""The rollout ledger: group ids, the journal, checkpoint watermarks and recovery, in one place.

One implementation serves :class:`trainer_hooks.FullyAsyncRolloutFn` and the Miles plugins
(``trainer_hooks.miles``): whatever holds the rollout state calls, *under its own state lock*,

* :meth:`RolloutLedger.take` when the data source hands out a prompt group (returns its group id),
* :meth:`RolloutLedger.append_sample` for each finished, graded sibling and
  :meth:`RolloutLedger.append_group` when the group is finished,
* :meth:`RolloutLedger.record_consumed` when groups are handed to training step ``step``, and
  :meth:`RolloutLedger.append_recycled` when a group is handed back for regeneration;
* :meth:`RolloutLedger.flush` before a checkpoint (a durability barrier), then
  :meth:`RolloutLedger.checkpoint_meta` inside the snapshot (same lock), and passes
  :meth:`RolloutLedger.committed` to the checkpoint writer as its commit callback;
* :meth:`RolloutLedger.recover` on load.

Each call on the rollout side is a snapshot and a queue push (see :mod:`.journal`); the lock
makes "state changed" and "record appended" one step, so a checkpoint's watermark (the last seq
its snapshot covers) is exact.

Recovery (exactly once in the lineage of the weights that survive)
------------------------------------------------------------------
``recover(restored_step)`` takes the newest committed checkpoint with ``rollout_id <=
restored_step`` (the trainer's restored step; None: the newest), checks its fingerprint, then
replays the complete journal records after its watermark (``sample`` records of its in-flight
groups from the previous watermark on, so finished siblings survive a checkpoint too):

* a ``take`` makes a group in flight (its prompt as handed out; the cursor moves with it);
* ``sample`` records are its finished siblings: they keep their results, only the others
  regenerate; a ``group`` record completes it (it goes back to the buffer);
* ``consumed`` at a step <= ``restored_step`` removes groups for good (trained into surviving
  weights); consumed after it, they come back to the buffer first, generations kept.

A torn tail is ignored; a record whose media are missing from ``journal/media`` is dropped (its
sibling or group regenerates); segments of another lineage are ignored; each is one log line.
Anything a crash cannot have left (a durable record damaged, a gap in the seqs, a record naming a
file outside the journal, a link or special file where a segment or a media file should be) is
refused before anything is placed: :class:`~.journal.JournalCorruptError` or
:class:`bundles.UnsafeBundleError`, naming the file and the record (see :mod:`.journal._scan`).
What each kind of record does to the groups is its ``replay`` in :data:`.journal.KINDS`.
Completed groups stay encoded (:class:`LazyGroup`) until training takes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import reprlib
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundles import (
    BundleFormatError,
    BundleNotFoundError,
    BundleVerificationError,
    MediaMissingError,
    MediaRef,
    UnsafeBundleError,
)
from bundles.support import (
    LIMITS,
    display,
    fault_point,
    gc_paused,
    open_regular_file,
    place_file,
    remove_tree,
    scratch_dir,
)
from trainer_hooks._sample import register_record_types, resolve_sample_cls
from trainer_hooks._sample_bundle import run_media_roots
from trainer_hooks.checkpoints import (
    RolloutCheckpoint,
    check_fingerprint,
    checkpoint_path,
    list_rollout_checkpoints,
    read_rollout_checkpoint,
    run_fingerprint,
)
from trainer_hooks.journal import (
    KINDS,
    MEDIA_DIR,
    JournalCorruptError,
    JournalError,
    JournalRecord,
    RolloutJournal,
    Shipments,
    is_media_name,
    journal_dir,
    journal_lineages,
    listing_backoff,
    new_lineage,
    record_value,
    record_where,
    run_journal,
    scan_journal,
    shipment_lineage,
)
from trainer_hooks.run_media import ensure_run_dir

__all__ = ["DEFAULT_JOURNAL_INTERVAL", "LazyGroup", "RecoveredGroup", "RecoveredState", "RolloutLedger"]

logger = logging.getLogger(__name__)

DEFAULT_JOURNAL_INTERVAL = 1.0
#: The record kind each RolloutState event appends (the Miles plugins' path).
_BY_EVENT = {k.event: k for k in KINDS.values() if k.event is not None}
MAX_GROUP_ID = LIMITS["MAX_GROUP_ID"]
#: A lineage as the writer makes one (``new_lineage``: hex) and a segment name can carry.
_LINEAGE = re.compile(rf"[0-9A-Za-z_.-]{{1,{LIMITS['MAX_ID_CHARS']}}}")
#: ``meta.journal``'s numbers: what each may hold (a forged one is refused, naming it, before
#: it is spent: a resumed run would write what its next reader refuses).
_JOURNAL_INTS = {
    "watermark": (0, LIMITS["MAX_INT"]),
    "compacted_upto": (0, LIMITS["MAX_INT"]),
    "next_gid": (0, MAX_GROUP_ID),
    "last_shipment_seq": (1, LIMITS["MAX_INT"]),
}


def journal_meta(ckpt: RolloutCheckpoint | None) -> dict[str, Any]:
    """A rollout checkpoint's ``meta.journal`` ({} without one), its fields checked:
    :class:`BundleFormatError` naming the checkpoint and the field. ``lineage`` goes into the
    names and headers of the segments a resumed run writes, the numbers into its records and
    group ids: a forged value would make the journal one its reader refuses."""
    if ckpt is None:
        return {}
    info = ckpt.meta.get("journal")
    if info is None:
        return {}
    if type(info) is not dict:
        raise BundleFormatError(f"{ckpt.path}: meta.journal: expected an object, found {reprlib.repr(info)}")
    lineage = info.get("lineage")
    if lineage is not None and not (type(lineage) is str and _LINEAGE.fullmatch(lineage)):
        raise BundleFormatError(
            f"{ckpt.path}: meta.journal.lineage: expected a lineage id (letters, digits, '_', '.', '-'; "
            f"at most {LIMITS['MAX_ID_CHARS']}), found {_shown(lineage)}"
        )
    for key, (lo, hi) in _JOURNAL_INTS.items():
        value = info.get(key)
        if key in info and not (type(value) is int and lo <= value <= hi):
            raise BundleFormatError(
                f"{ckpt.path}: meta.journal.{key}: expected an int in {lo}..{hi}, found {_shown(value)}"
            )
    return info


def journal_interval(args: Namespace) -> float:
    value = getattr(args, "rollout_journal_interval", None)
    return DEFAULT_JOURNAL_INTERVAL if value is None else float(value)


class _Placer:
    """Places journal media into the current run's directory (hard link, else copy) and, when
    asked, hashes them there; one per recovery."""

    def __init__(self, args: Namespace, source: Path, verify: bool) -> None:
        self.args = args
        self.source = source
        self.verify = verify
        self.placed: dict[str, MediaRef] = {}

    def refs(self, names: Iterable[str], where: str) -> dict[str, MediaRef]:
        out = {}
        for name in names:
            ref = self.placed.get(name)
            if ref is None:
                ref = self.placed[name] = self._place(name, where)
            out[name] = ref
        return out

    def _place(self, name: str, where: str) -> MediaRef:
        fault_point("resume.place", name)
        if not is_media_name(name):  # the scan refused such a record already; never a path
            raise JournalCorruptError(f"{where}: media name {name!r} is not '<64 hex><suffix>'")
        src = self.source / name
        run_dir = ensure_run_dir(self.args)
        dst = run_dir / name
        # Read as a bundle reads its media: a regular file, never through a symlink (a link out
        # of the journal would copy whatever it points at into the run), never blocking.
        try:
            f, size = open_regular_file(src)
        except FileNotFoundError:
            raise MediaMissingError(f"{src}: journal media file missing ({where})") from None
        except OSError as e:
            raise JournalError(
                f"{src}: cannot read the journal media file ({where}): {e.strerror or e}"
            ) from None
        with f:
            try:
                place_file(src, dst, opened=f)
            except OSError as e:
                raise JournalError(f"{src}: cannot place the journal media file in {run_dir}: {e}") from None
        ref = MediaRef("sha256:" + name[:64], size, name[64:], str(dst))
        if self.verify:
            found = MediaRef.from_file(dst)
            if found.digest != ref.digest:
                raise BundleVerificationError(
                    dst,
                    [
                        f"{dst}: digest: expected {ref.digest}, found {found.digest} (restored from {src}, {where})"
                    ],
                )
        return ref


@dataclass
class _Found:
    """A journal found for a recovery: the local ``directory`` a scan reads, what messages name
    for the journal (``where``) and for each of its segment files (``origin``: the store object
    a segment came in, for a journal read back from a store)."""

    directory: Path
    where: str = ""
    origin: Any = str
    #: the journal's sink (:class:`Shipments` on a store: its listing may lag)
    sink: Any = None

    def __post_init__(self) -> None:
        self.where = self.where or str(self.directory)


class LazyGroup:
    """A finished group restored from the journal, decoded when training takes it."""

    __slots__ = ("_bodies", "_dicts", "_placer", "_sample_cls", "gid")

    def __init__(
        self, gid: int, bodies: list[tuple[JournalRecord, bool]], placer: _Placer, sample_cls: Any
    ) -> None:
        self.gid = gid
        self._bodies = bodies  # (record, holds the whole group)
        self._placer = placer
        self._sample_cls = sample_cls
        self._dicts: list[tuple[Any, JournalRecord]] | None = None

    def __len__(self) -> int:
        return sum(int(r.b) if whole else 1 for r, whole in self._bodies)

    def undecoded(self) -> LazyGroup:
        """The same group, decoded anew when read: what a checkpoint keeps of a group handed to
        training (the trainer may change the samples decoded for it)."""
        return LazyGroup(self.gid, self._bodies, self._placer, self._sample_cls)

    def load_dicts(self) -> list[Any]:
        """The group's sample dicts (media placed in the current run's directory)."""
        return [d for d, _ in self._decoded()]

    def _decoded(self) -> list[tuple[Any, JournalRecord]]:
        """Each sample dict and the record it came from (what an error names)."""
        if self._dicts is None:
            out: list[tuple[Any, JournalRecord]] = []
            for rec, whole in self._bodies:
                value = _decode(rec, self._placer)
                out.extend((v, rec) for v in (value["samples"] if whole else [value]))
            self._dicts = out
        return self._dicts

    def __iter__(self) -> Any:
        return iter(self.load())

    def __getitem__(self, i: Any) -> Any:
        return self.load()[i]

    def __repr__(self) -> str:
        return f"LazyGroup(gid={self.gid}, samples={len(self)})"

    def load(self) -> list[Any]:
        """The group's samples, built with the loader's sample class."""
        return [_build(s, self._sample_cls, rec) for s, rec in self._decoded()]


def _decode(rec: JournalRecord, placer: _Placer) -> Any:
    return record_value(rec, placer.refs(rec.media, record_where(rec)))


def _build(d: Any, cls: Any, rec: JournalRecord) -> Any:
    """A sample of record ``rec``'s body, built with ``cls``: a body the class cannot build from
    (wrong types, keys it refuses) is :class:`JournalCorruptError` naming the record, whatever
    the class raised."""
    if type(d) is list:  # a nested group's trajectory (Miles' list[list[Sample]])
        return [_build(x, cls, rec) for x in d]
    if not isinstance(d, dict):
        raise JournalCorruptError(
            f"{record_where(rec)}: body: expected a sample (a map) or a trajectory (a list), found "
            f"{type(d).__name__}; refusing to resume from this journal (nothing is guessed)"
        )
    if cls is dict:
        return d
    try:
        return cls.from_dict(d)
    except (JournalError, MemoryError):
        raise
    except Exception as e:  # the class's own refusal of untrusted values, whichever it is
        raise JournalCorruptError(
            f"{record_where(rec)}: body: not a {getattr(cls, '__name__', cls)}: {type(e).__name__}: "
            f"{reprlib.repr(str(e))}; refusing to resume from this journal (nothing is guessed)"
        ) from None


def materialize(group: Any) -> list[Any]:
    """A buffered group as samples (a :class:`LazyGroup` is decoded now)."""
    return group.load() if isinstance(group, LazyGroup) else group


@dataclass
class RecoveredGroup:
    """A group in flight at the crash: its prompt as handed out and its finished siblings."""

    gid: int
    prompt: list[Any]
    done: dict[int, Any] = field(default_factory=dict)


@dataclass
class RecoveredState:
    """What :meth:`RolloutLedger.recover` restores."""

    checkpoint: os.PathLike[str] | None
    rollout_id: int | None
    pending: list[RecoveredGroup] = field(default_factory=list)
    completed: list[tuple[int, Any]] = field(default_factory=list)  # (gid, list or LazyGroup)
    cursor: Any = None
    problems: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    #: fingerprint fields that differ and were accepted (--resume-accept-changes)
    accepted: list[str] = field(default_factory=list)


class _Replay:
    """The groups a recovery rebuilds: from the checkpoint, then one journal record at a time.

    ``pending``: groups in flight (gid -> prompt and finished siblings); ``completed``: finished
    groups not yet trained; ``consumed``: gid -> (step, group) handed to training after the
    checkpoint (they come back when that step's weights are gone)."""

    def __init__(
        self, pending: dict[int, RecoveredGroup], completed: dict[int, Any], next_gid: int, cls: Any
    ) -> None:
        self.pending = pending
        self.completed = completed
        self.consumed: dict[int, tuple[int, Any]] = {}
        self.next_gid = next_gid
        self.cls = cls
        self.cursor: Any = None
        self.state: RecoveredState | None = None
        self.placer: _Placer | None = None
        self.media_ok: Any = lambda rec: True
        self.replayed = self.dropped = 0
        self.takes: list[JournalRecord] = []  # takes of a batch whose last take is not replayed yet

    @classmethod
    def from_checkpoint(
        cls, ckpt: RolloutCheckpoint | None, state: RecoveredState, ledger: RolloutLedger, sample_cls: Any
    ) -> _Replay:
        """The checkpoint's groups by id (its fingerprint checked first); empty without one."""
        if ckpt is None:
            replay = cls({}, {}, 0, sample_cls)
            replay.state = state
            return replay
        state.meta = ckpt.meta
        state.accepted += check_fingerprint(
            ckpt.meta.get("fingerprint"), ledger.fingerprint(), where=str(ckpt.path), args=ledger.args
        )
        info = journal_meta(ckpt)
        state.cursor = ckpt.meta.get("data_source_cursor", ckpt.data_source_state)
        pending_ids = ckpt.meta.get("pending_group_ids") or list(range(len(ckpt.pending_groups)))
        completed_ids = ckpt.meta.get("completed_group_ids") or [
            len(pending_ids) + i for i in range(len(ckpt.completed_groups))
        ]
        recycled_ids = ckpt.meta.get("recycled_group_ids") or [
            len(pending_ids) + len(completed_ids) + i for i in range(len(ckpt.recycled_groups))
        ]
        for key, ids, groups in (
            ("pending_group_ids", pending_ids, ckpt.pending_groups),
            ("completed_group_ids", completed_ids, ckpt.completed_groups),
            ("recycled_group_ids", recycled_ids, ckpt.recycled_groups),
        ):
            if len(ids) != len(groups) or not all(type(i) is int and 0 <= i <= MAX_GROUP_ID for i in ids):
                raise BundleFormatError(
                    f"{ckpt.path}: meta.{key}: expected {len(groups)} group ids (ints in 0..{MAX_GROUP_ID}), "
                    f"found {reprlib.repr(ids)}"
                )
        pending = {
            gid: RecoveredGroup(gid, g) for gid, g in zip(pending_ids, ckpt.pending_groups, strict=True)
        }
        # Recycled groups regenerate after the in-flight ones, like them.
        pending.update(
            (gid, RecoveredGroup(gid, g)) for gid, g in zip(recycled_ids, ckpt.recycled_groups, strict=True)
        )
        completed: dict[int, Any] = dict(zip(completed_ids, ckpt.completed_groups, strict=True))
        next_gid = int(info.get("next_gid", len(pending_ids) + len(completed_ids) + len(recycled_ids)))
        replay = cls(pending, completed, next_gid, sample_cls)
        # Completed groups that a later step had taken when the checkpoint was cut (the async
        # driver drains step N+1 while N trains): consumed at that step, so _finish brings them
        # back only when the restored weights are older than it.
        for gid, step in _consumed_steps(ckpt, completed):
            replay.consumed[gid] = (step, completed.pop(gid))
        replay.state = state
        return replay

    def apply(self, rec: JournalRecord, watermark: int) -> None:
        """One record, in seq order: its kind's ``replay`` (:data:`.journal.KINDS`)."""
        kind = KINDS[rec.kind]
        if kind.replay is None:
            return
        if rec.seq <= watermark:
            # Between the previous checkpoint and this one: only the finished siblings of
            # groups this checkpoint holds in flight (it saved them as prompts).
            if kind.replay_covered and self.media_ok(rec):
                kind.replay(self, rec)
            return
        self.replayed += 1
        if kind.names_group:
            self.next_gid = max(self.next_gid, rec.a + 1)
        if not self.media_ok(rec):
            self.dropped += 1
            if not kind.replay_missing_media:
                return  # a prompt or sibling whose media are gone: it regenerates
        kind.replay(self, rec)

    # -- what the kinds' replay handlers build (the journal's Replay protocol) ---------------------
    def in_flight(self, gid: int, prompt: list[Any]) -> RecoveredGroup:
        return RecoveredGroup(gid, prompt)

    def finished(self, gid: int, bodies: list[tuple[JournalRecord, bool]]) -> LazyGroup:
        assert self.placer is not None
        return LazyGroup(gid, bodies, self.placer, self.cls)

    def group_size(self, group: RecoveredGroup) -> int:
        return _size(group)

    def set_cursor(self, cursor: Any) -> None:
        assert self.state is not None
        self.state.cursor = cursor


class RolloutLedger:
    """See the module docstring. ``prompts``: the dataset's size, for the fingerprint."""

    def __init__(self, args: Namespace, *, prompts: int | None = None, store_image: Any = None) -> None:
        self.args = args
        self.interval = journal_interval(args)
        if self.interval < 0:
            raise ValueError(f"--rollout-journal-interval: expected >= 0 seconds, found {self.interval}")
        self.enabled = self.interval > 0 and getattr(args, "save", None) is not None
        self.lineage = new_lineage()
        self.prompts = prompts
        self._store_image = store_image
        self._next_gid = 0
        self._first_seq = 1
        self._compacted_upto = 0  # the seq the previous committed checkpoint covers
        self.journal: RolloutJournal | None = None
        self._last_checkpoint_stats: dict[str, Any] | None = None
        self._quiet = False
        # With --save/--load on a store: the writer's spool and the recovery's staging (local
        # directories beside the run's media, removed at close).
        self._scratch: list[Path] = []

    # -- the journal -------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        return run_fingerprint(self.args, prompts=self.prompts)

    def open(self) -> RolloutJournal | None:
        """Start the journal (no-op when disabled or started)."""
        if self.journal is None and self.enabled:
            register_record_types()  # before the journal's encoder is made
            sink = run_journal(self.args.save, spool=lambda: self._scratch_dir("journal"))
            sink.check()  # a store that ignores preconditions: refused here, in one line
            self.journal = RolloutJournal(
                sink,
                lineage=self.lineage,
                interval=self.interval,
                media_roots=[str(r) for r in run_media_roots(self.args)],
                link=getattr(self.args, "bundle_link_mode", None) or "auto",
                first_seq=self._first_seq,
                store_image=self._store_image,
                fingerprint=self.fingerprint(),
            )
        return self.journal

    @property
    def next_gid(self) -> int:
        """The id the next new group gets (after a resume: past every id the lineage used)."""
        return self._next_gid

    def new_gid(self) -> int:
        gid = self._next_gid
        self._next_gid += 1
        return gid

    def take(self, group: Sequence[Any], cursor: Any = None, *, snapshot: bool = True) -> int:
        """A group handed out; returns its id. ``snapshot=False``: ``group`` is a snapshot
        already (sample dicts nothing mutates)."""
        return self.take_batch([group], cursor, snapshot=snapshot)[0]

    def take_batch(
        self, groups: Sequence[Sequence[Any]], cursor: Any = None, *, snapshot: bool = True
    ) -> list[int]:
        """Groups handed out together, ``cursor`` the data source's position after the last;
        returns their ids. A resume applies the batch only whole (see ``append_take``)."""
        gids = [self.new_gid() for _ in groups]
        journal = self.open()
        if journal is not None and gids:
            for gid, group in zip(gids, groups, strict=True):
                journal.append_take(gid, group, cursor, snapshot=snapshot, batch_end=gids[-1])
        return gids

    def append_sample(self, gid: int, sibling: int, sample: Any, *, copy: bool = True) -> None:
        """``copy=False``: the sample is lent to the journal until :meth:`wait_encoded`."""
        journal = self.open()
        if journal is not None:
            journal.append_sample(gid, sibling, sample, copy=copy)

    def last_seq(self) -> int:
        """The seq of the last journal record appended (0 without a journal)."""
        return self.journal.last_seq if self.journal is not None else 0

    def wait_encoded(self, seq: int | None = None, timeout: float | None = None) -> None:
        """The samples lent (``copy=False``) up to record ``seq`` (default: all so far) are the
        caller's again. A failed journal raises its failure here, before training takes the
        groups (a :class:`JournalError` naming the cause: training stops, never runs on
        unjournaled); ``TimeoutError`` after ``timeout`` seconds."""
        if self.journal is not None:
            self.journal.wait_encoded(seq, timeout)

    def append_group(self, gid: int, group: Sequence[Any] | None = None) -> None:
        journal = self.open()
        if journal is not None:
            journal.append_group(gid, group)

    def record_consumed(self, step: int, gids: Sequence[int]) -> None:
        journal = self.open()
        if journal is not None and gids:
            journal.record_consumed(step, gids)

    def append_recycled(self, gid: int, group: Sequence[Any]) -> None:
        journal = self.open()
        if journal is not None:
            journal.append_recycled(gid, group)

    def flush(self) -> float:
        """Durability barrier (everything appended is fsynced); returns the seconds it blocked."""
        started = time.perf_counter()
        if self.journal is not None:
            self.journal.flush()
        return time.perf_counter() - started

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoint_meta(
        self,
        pending_gids: Sequence[int],
        completed_gids: Sequence[int],
        cursor: Any,
        recycled_gids: Sequence[int] | None = None,
        consumed_steps: Mapping[int, int] | None = None,
    ) -> dict[str, Any]:
        """The ledger's part of a checkpoint's meta; call inside the snapshot (state lock held).
        ``consumed_steps``: the completed groups (by id) already handed to a training step after
        the checkpoint's, with that step (a resume brings them back only when its weights are gone)."""
        watermark = self.journal.roll() if self.journal is not None else self._first_seq - 1
        # The last shipment it covers, durable already (the save's flush came first): a resume
        # refuses a store listing that ends before it (docs/RESUME.md, "What resume must find").
        kept = self.journal.last_kept() if self.journal is not None else None
        ids = (*pending_gids, *completed_gids, *(recycled_gids or ()))
        self._next_gid = max([self._next_gid, *(g + 1 for g in ids)])
        return {
            **({"recycled_group_ids": list(recycled_gids)} if recycled_gids is not None else {}),
            "journal": {
                "lineage": self.lineage,
                "watermark": watermark,
                "compacted_upto": self._compacted_upto,
                "next_gid": self._next_gid,
                "interval_s": self.interval,
                **({"last_shipment": kept[1], "last_shipment_seq": kept[0]} if kept is not None else {}),
                **({"stats": self.journal.stats()} if self.journal is not None else {}),
            },
            "pending_group_ids": list(pending_gids),
            "completed_group_ids": list(completed_gids),
            **(
                {"consumed_group_steps": [[g, s] for g, s in consumed_steps.items()]}
                if consumed_steps
                else {}
            ),
            "data_source_cursor": cursor,
            "fingerprint": self.fingerprint(),
        }

    def committed(self, meta: dict[str, Any]) -> None:
        """The checkpoint holding ``meta`` committed: compact the journal one generation behind."""
        info = meta.get("journal") or {}
        watermark = int(info.get("watermark", 0))
        if self.journal is not None:
            # Never the shipment this checkpoint names (when nothing new was durable since the
            # previous one, it holds only records that checkpoint covers): a resume must find it.
            named = info.get("last_shipment_seq")
            upto = self._compacted_upto if named is None else min(self._compacted_upto, int(named) - 1)
            segments, media = self.journal.compact(upto)
            if segments:
                logger.info(
                    "rollout journal: %d segment(s) and %d media file(s) superseded by checkpoints deleted",
                    segments,
                    media,
                )
        self._compacted_upto = max(self._compacted_upto, watermark)

    # -- the Miles plugins' RolloutState --------------------------------------------------------------
    def attach(self, state: Any) -> None:
        """Journal the events of a :class:`~trainer_hooks.checkpoints.RolloutState` (its listener
        hook) and give its ``save`` this ledger's barrier, meta and compaction (``state.ledger``)."""
        state.ledger = self
        state.add_listener(self._on_event)

    def _on_event(self, event: str, **p: Any) -> None:
        if self._quiet or not self.enabled:
            return
        kind = _BY_EVENT.get(event)
        if kind is None:
            return
        journal = self.open()
        assert journal is not None
        assert kind.from_event is not None
        for args, kwargs in kind.from_event(p):
            journal.append(kind.name, *args, **kwargs)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Events inside are not journaled (groups put back by a resume are in the journal already)."""
        self._quiet = True
        try:
            yield
        finally:
            self._quiet = False

    def close(self) -> None:
        try:
            if self.journal is not None:
                journal, self.journal = self.journal, None
                journal.close()
                self._first_seq = journal.last_seq + 1
        finally:
            while self._scratch:
                remove_tree(self._scratch.pop())

    def _scratch_dir(self, purpose: str) -> Path:
        """A local directory beside the run's media (same filesystem: media are hard-linked), or
        in the temp dir without one; a dead process's is removed by the next one made there."""
        roots = run_media_roots(self.args)
        beside = roots[0] if roots else Path(tempfile.gettempdir()) / "rollout-journal"
        path = scratch_dir(beside, purpose)
        self._scratch.append(path)
        return path

    # -- recovery ----------------------------------------------------------------------------------
    def recover(
        self,
        restored_step: int | None,
        *,
        sample_cls: Any = None,
        verify_media: bool | None = None,
        exact: bool = False,
    ) -> RecoveredState:
        """Restore from ``--load``: the newest checkpoint at or before ``restored_step`` plus the
        journal after it (see the module docstring). ``exact``: the checkpoint of exactly
        ``restored_step`` must exist (the behaviour without a journal).

        The steps, each a method: choose and read the checkpoint (:meth:`_read_checkpoint`),
        rebuild its groups (:meth:`_Replay.from_checkpoint`), find the journal (downloaded from a
        store into staging, :meth:`_journal_for`), scan it and check what it may replay
        (:meth:`_journal_records`), apply its records one by one (:meth:`_Replay.apply`), then
        hand back what training and generation take (:meth:`_finish`)."""
        started = time.perf_counter()
        load = getattr(self.args, "load", None)
        if load is None:
            raise ValueError("--load is not set: expected a checkpoint directory")
        cls = resolve_sample_cls(sample_cls)
        register_record_types()
        verify = verify_media if verify_media is not None else getattr(self.args, "resume_verify_media", True)
        use_journal = self.interval > 0
        ckpt = self._read_checkpoint(load, restored_step, exact or not use_journal, cls, verify)
        state = RecoveredState(ckpt.path if ckpt else None, ckpt.rollout_id if ckpt else None)
        replay = _Replay.from_checkpoint(ckpt, state, self, cls)
        info = journal_meta(ckpt)
        lineage = info.get("lineage")
        watermark = int(info.get("watermark", 0))
        earlier = int(info.get("compacted_upto", watermark))
        found = self._journal_for(load, ckpt) if use_journal else _Found(journal_dir(load))
        replay.placer = _Placer(self.args, found.directory / MEDIA_DIR, verify)
        if use_journal and (ckpt is None or lineage is not None):
            if ckpt is None:
                lineage = self._only_lineage(found, state)
            if lineage is not None:
                with gc_paused():  # thousands of records, groups and no cycles (see scan_journal)

                    def scanned(f: _Found) -> tuple[list[JournalRecord], int]:
                        return self._journal_records(f, str(lineage), ckpt, watermark, earlier, state)

                    found, (records, last) = self._until_step(
                        load, ckpt, found, scanned, restored_step, state
                    )
                    jdir = found.directory
                    replay.placer = _Placer(self.args, jdir / MEDIA_DIR, verify)
                    replay.media_ok = self._media_check(jdir, records, state)
                    for rec in records:
                        replay.apply(rec, watermark)
                self._first_seq = max(self._first_seq, last + 1, watermark + 1)
            self.lineage = lineage or self.lineage
        elif ckpt is not None:
            self._first_seq = watermark + 1
            if lineage is not None:
                self.lineage = lineage
        if ckpt is None and not replay.replayed:
            raise BundleNotFoundError(
                f"{checkpoint_path(load, max(restored_step or 0, 0))}: no rollout checkpoint at or before step "
                f"{restored_step} and no journal records in {found.where} to resume from"
            )
        self._compacted_upto = earlier if ckpt is not None else 0
        self._next_gid = max(self._next_gid, replay.next_gid)
        return self._finish(state, replay, restored_step, cls, started)

    def _read_checkpoint(
        self, load: Any, restored_step: int | None, exact: bool, cls: Any, verify: bool
    ) -> RolloutCheckpoint | None:
        """The checkpoint to resume from: exactly ``restored_step``'s (without a journal it must
        exist: :class:`BundleNotFoundError`), else the newest at or before it (None: none)."""
        found = list_rollout_checkpoints(load)
        if exact:
            rid: int | None = restored_step if restored_step is not None else max(found, default=0)
        else:
            rid = max((r for r in found if restored_step is None or r <= restored_step), default=None)
        if rid is None:
            return None
        ckpt = read_rollout_checkpoint(self.args, rid, sample_cls=cls, verify_media=verify)
        if restored_step is not None and rid != restored_step:
            logger.info("%s: the newest rollout checkpoint at or before step %s", ckpt.path, restored_step)
        return ckpt

    def _journal_for(self, load: Any, ckpt: RolloutCheckpoint | None) -> _Found:
        """The journal to scan: ``<load>/rollout/journal``, or, with ``--load`` on a store, its
        shipments checked and unpacked into a local staging directory (:mod:`trainer_hooks.journal._store_sink`),
        named in messages by the objects they came in. A store's listing must reach the shipment
        the checkpoint names (``journal.last_shipment``): one that ends before it is asked again,
        then refused (docs/RESUME.md, "What resume must find")."""
        sink = run_journal(load)
        info = journal_meta(ckpt)
        must = info.get("last_shipment")
        if must is not None and not (type(must) is str and shipment_lineage(must) == info.get("lineage")):
            raise BundleFormatError(
                f"{ckpt.path if ckpt else load}: meta.journal.last_shipment: expected a shipment name of "
                f"the checkpoint's lineage (segment-<seq>-{display(str(info.get('lineage')), limit=80)}-<attempt>.rjs), "
                f"found {_shown(must)}"
            )
        why = f"rollout checkpoint {ckpt.path if ckpt else load} covers the journal up to record "
        why += str(info.get("last_shipment_seq"))
        directory = sink.readable(lambda: self._scratch_dir("journal-recovery"), must_reach=must, why=why)
        return _Found(directory, sink.where, sink.origin, sink)

    def _until_step(
        self,
        load: Any,
        ckpt: RolloutCheckpoint | None,
        found: _Found,
        scanned: Callable[[_Found], tuple[list[JournalRecord], int]],
        restored_step: int | None,
        state: RecoveredState,
    ) -> tuple[_Found, tuple[list[JournalRecord], int]]:
        """The journal scanned (``scanned(found)``), and, on a store, when the trainer restored a
        step newer than the checkpoint and the journal holds no ``consumed`` record of it (nor of
        a later step), listed again with backoff (``LISTING_RETRIES`` times, as the store's
        ``complete_listing``), downloaded and scanned again whenever the listing names a
        shipment not read yet: a lagging listing would otherwise hand the groups that step
        trained back to training. No checkpoint names those records, and a crash may have lost
        them for real (appended after the last shipment), so after the retries the resume goes
        on, with one problem line (docs/RESUME.md, "What resume must find")."""
        records, last = scanned(found)
        sink = found.sink
        if (
            not isinstance(sink, Shipments)
            or restored_step is None
            or (ckpt is not None and restored_step <= ckpt.rollout_id)
            or _trained(records, ckpt, restored_step)
        ):
            return found, (records, last)
        retries, wait = listing_backoff()
        problems, first = len(state.problems), wait
        for attempt in range(retries):
            fault_point("resume.step_missing", attempt)
            time.sleep(wait)
            wait *= 2
            have = {sink.kept_name(p) for p in found.directory.glob("segment-*")}
            if {name for name, _ in sink.shipments()} <= have:
                continue
            del state.problems[problems:]
            found = self._journal_for(load, ckpt)
            records, last = scanned(found)
            if _trained(records, ckpt, restored_step):
                return found, (records, last)
        state.problems.append(
            f"{found.where}: the trainer restored step {restored_step}, newer than "
            f"{ckpt.path if ckpt else 'any rollout checkpoint'}, but the journal holds no record of the "
            f"groups step {restored_step} trained (listed {retries + 1} times over "
            f"{first * (2**retries - 1):g} s): if the store's listing lags, groups "
            "already trained may be trained again"
        )
        return found, (records, last)

    def _journal_records(
        self,
        found: _Found,
        lineage: str,
        ckpt: RolloutCheckpoint | None,
        watermark: int,
        earlier: int,
        state: RecoveredState,
    ) -> tuple[list[JournalRecord], int]:
        """The lineage's complete records from the previous watermark on, and its last seq;
        refused when a torn tail lies where the checkpoint proves the journal was durable, cut
        at a gap after the watermark (one problem line)."""
        jdir = found.where
        scan = scan_journal(
            found.directory, lineage=lineage, after_seq=min(earlier, watermark), origin=found.origin
        )
        fault_point("resume.scanned", len(scan.records))
        if scan.torn_seq is not None and ckpt is not None and scan.torn_seq <= watermark:
            # The checkpoint's save made the journal durable up to its watermark first:
            # a crash cannot have torn a record it covers.
            raise JournalCorruptError(
                f"{jdir}: the journal's last segment is damaged from record {scan.torn_seq} on, but "
                f"checkpoint {ckpt.path} covers up to record {watermark}, made durable before it was "
                f"saved: corruption, not a torn write ({_torn_line(scan.problems)}); refusing to resume from "
                "this journal (nothing is guessed)"
            )
        state.problems += scan.problems
        if ckpt is None and scan.fingerprint is not None:
            state.accepted += check_fingerprint(
                scan.fingerprint, self.fingerprint(), where=str(jdir), args=self.args
            )
        records = scan.records
        after = next((r.seq for r in records if r.seq > watermark), None)
        if after is not None and after != watermark + 1:
            state.problems.append(
                f"{jdir}: the journal resumes at record {after}, the checkpoint covers up to "
                f"{watermark}: the records in between are gone, so the journal is not replayed"
            )
            records = [r for r in records if r.seq <= watermark]
        return records, (scan.records[-1].seq if scan.records else 0)

    def _finish(
        self, state: RecoveredState, replay: _Replay, restored_step: int | None, cls: Any, started: float
    ) -> RecoveredState:
        """Groups consumed after the restored step back first (trained into weights that are
        gone), then the completed ones; in-flight groups with their finished siblings decoded."""
        back = [
            (gid, g)
            for gid, (step, g) in replay.consumed.items()
            if restored_step is not None and step > restored_step
        ]
        state.completed = back + list(replay.completed.items())
        placer = replay.placer
        assert placer is not None
        for group in replay.pending.values():
            group.prompt = self._prompt(group.prompt, placer, cls)
            group.done = {
                i: _build(_decode(r, placer), cls, r) if isinstance(r, JournalRecord) else r
                for i, r in group.done.items()
            }
        state.pending = list(replay.pending.values())
        for line in state.problems:
            logger.warning("%s", line)
        state.stats = {
            "records_replayed": replay.replayed,
            "records_dropped": replay.dropped,
            "groups_in_flight": len(state.pending),
            "siblings_kept": sum(len(g.done) for g in state.pending),
            "groups_completed": len(state.completed),
            "groups_returned": len(back),
            "load_s": round(time.perf_counter() - started, 6),
        }
        logger.info(
            "resumed from %s and %d journal record(s): %d group(s) in flight (%d finished sibling(s) kept), "
            "%d completed (%d consumed after step %s came back), %d record(s) dropped, %.3f s",
            state.checkpoint or "no checkpoint",
            replay.replayed,
            len(state.pending),
            state.stats["siblings_kept"],
            len(state.completed),
            len(back),
            restored_step,
            replay.dropped,
            state.stats["load_s"],
        )
        return state

    def _only_lineage(self, found: _Found, state: RecoveredState) -> str | None:
        lineages = journal_lineages(found.directory, origin=found.origin)
        if len(lineages) > 1:
            state.problems.append(
                f"{found.where}: journal segments of {len(lineages)} run lineages and no checkpoint to tell which "
                "is this run's; none is replayed"
            )
            return None
        return next(iter(lineages), None)

    def _media_check(self, jdir: Path, records: list[JournalRecord], state: RecoveredState) -> Any:
        media = jdir / MEDIA_DIR
        if media.is_symlink():
            raise UnsafeBundleError(
                f"{media}: expected the journal's media directory, found a symlink; refusing to follow it"
            )
        present: dict[str, bool] = {}
        reported: set[str] = set()

        def ok(rec: JournalRecord) -> bool:
            good = True
            for name in rec.media:
                p = present.get(name)
                if p is None:
                    p = present[name] = _present(media / name)
                if not p:
                    good = False
                    if name not in reported:
                        reported.add(name)
                        state.problems.append(
                            f"{media / name}: missing (removed?): record {rec.seq} ({rec.kind} of group {rec.a}) "
                            "is dropped and regenerates; nothing else is lost"
                        )
            return good

        return ok

    def _prompt(self, prompt: list[Any], placer: _Placer, cls: Any) -> list[Any]:
        if len(prompt) == 1 and isinstance(prompt[0], JournalRecord):
            rec = prompt[0]
            return [_build(s, cls, rec) for s in _decode(rec, placer)["samples"]]
        return prompt


def _consumed_steps(ckpt: RolloutCheckpoint, completed: dict[int, Any]) -> list[tuple[int, int]]:
    """``meta.consumed_group_steps`` of ``ckpt``: ``[[gid, step], ...]``, each a completed group's id."""
    pairs = ckpt.meta.get("consumed_group_steps") or []
    ok = type(pairs) is list and all(
        type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is int and p[0] in completed
        for p in pairs
    )
    if not ok or len({p[0] for p in pairs}) != len(pairs):
        raise BundleFormatError(
            f"{ckpt.path}: meta.consumed_group_steps: expected [[group id, step], ...] naming each of "
            f"meta.completed_group_ids at most once, found {reprlib.repr(pairs)}"
        )
    return [(p[0], p[1]) for p in pairs]


def _torn_line(problems: list[str]) -> str:
    return next((p for p in reversed(problems) if "torn tail" in p), "")


def _present(path: Path) -> bool:
    """Whether a journal media file is there (False: removed; its records regenerate). A link or
    a special file in its place is refused (:class:`bundles.UnsafeBundleError`), never followed."""
    try:
        f, _ = open_regular_file(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise JournalError(f"{path}: cannot read the journal media file: {e.strerror or e}") from None
    f.close()
    return True


def _size(group: RecoveredGroup) -> int:
    p = group.prompt
    if len(p) == 1 and isinstance(p[0], JournalRecord):
        return int((p[0].b or {}).get("n", 0))
    return len(p)


def _shown(value: Any) -> str:
    """A value of a checkpoint's meta in a message: a string through :func:`display`, quoted."""
    return repr(display(value, limit=120)) if type(value) is str else reprlib.repr(value)


def _trained(records: Sequence[JournalRecord], ckpt: RolloutCheckpoint | None, step: int) -> bool:
    """Whether the journal (or the checkpoint, for a step drained while it was cut) records
    groups handed to training step ``step`` or a later one."""
    if any(r.kind == "consumed" and r.a >= step for r in records):
        return True
    pairs = (ckpt.meta.get("consumed_group_steps") or []) if ckpt is not None else []
    return any(type(p) is list and len(p) == 2 and type(p[1]) is int and p[1] >= step for p in pairs)
