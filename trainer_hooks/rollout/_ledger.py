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

Each call on the rollout side is a snapshot and a queue push (see :mod:`trainer_hooks.journal`); the lock
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
refused before anything is placed: :class:`~trainer_hooks.journal.JournalCorruptError` or
:class:`bundles.UnsafeBundleError`, naming the file and the record (see :mod:`trainer_hooks.journal._scan`).
What each kind of record does to the groups is its ``replay`` in :data:`trainer_hooks.journal.KINDS`.
Completed groups stay encoded (:class:`LazyGroup`) until training takes them.

Where it lives: this module is the ledger (appends, checkpoints, compaction, the entry of a
recovery); the recovery's steps are :mod:`._recovery`, the groups it rebuilds :mod:`._replay`,
the meta fields it trusts only once checked :mod:`._meta`, and the samples it decodes when
training takes them :mod:`._lazy`.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from argparse import Namespace
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bundles import BundleNotFoundError
from bundles.support import gc_paused, remove_tree, scratch_dir
from trainer_hooks._sample import register_record_types, resolve_sample_cls
from trainer_hooks._sample_bundle import run_media_roots
from trainer_hooks.checkpoints import RolloutCheckpoint, checkpoint_path, run_fingerprint
from trainer_hooks.journal import (
    KINDS,
    MEDIA_DIR,
    JournalRecord,
    RolloutJournal,
    journal_dir,
    new_lineage,
    run_journal,
)
from trainer_hooks.rollout._lazy import MediaPlacer
from trainer_hooks.rollout._meta import journal_meta
from trainer_hooks.rollout._recovery import (
    Found,
    finish,
    journal_for,
    journal_records,
    media_check,
    only_lineage,
    read_checkpoint,
    until_step,
)
from trainer_hooks.rollout._replay import RecoveredState, Replay

__all__ = ["DEFAULT_JOURNAL_INTERVAL", "RolloutLedger", "journal_interval"]

logger = logging.getLogger(__name__)

DEFAULT_JOURNAL_INTERVAL = 1.0
#: The record kind each RolloutState event appends (the Miles plugins' path).
_BY_EVENT = {k.event: k for k in KINDS.values() if k.event is not None}


def journal_interval(args: Namespace) -> float:
    value = getattr(args, "rollout_journal_interval", None)
    return DEFAULT_JOURNAL_INTERVAL if value is None else float(value)


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
        """Journal the events of a :class:`~trainer_hooks.rollout.RolloutState` (its listener
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

    # -- recovery (the steps: trainer_hooks.rollout._recovery) --------------------------------------
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

        The steps, each a function of :mod:`._recovery`: choose and read the checkpoint
        (``read_checkpoint``), rebuild its groups (:meth:`~._replay.Replay.from_checkpoint`), find
        the journal (downloaded from a store into staging, ``journal_for``), scan it, check what it
        may replay and apply its records one by one (:meth:`_replay_journal`), then hand back what
        training and generation take (``finish``). The ledger takes the journal's lineage and
        positions (group ids, seqs, compaction) from what was recovered, so that a run that
        resumes appends after it."""
        started = time.perf_counter()
        load = getattr(self.args, "load", None)
        if load is None:
            raise ValueError("--load is not set: expected a checkpoint directory")
        cls = resolve_sample_cls(sample_cls)
        register_record_types()
        verify = verify_media if verify_media is not None else getattr(self.args, "resume_verify_media", True)
        use_journal = self.interval > 0
        ckpt = read_checkpoint(self.args, load, restored_step, exact or not use_journal, cls, verify)
        state = RecoveredState(ckpt.path if ckpt else None, ckpt.rollout_id if ckpt else None)
        replay = Replay.from_checkpoint(ckpt, state, self.fingerprint(), self.args, cls)
        info = journal_meta(ckpt)
        lineage = info.get("lineage")
        watermark = int(info.get("watermark", 0))
        found = self._journal_for(load, ckpt) if use_journal else Found(journal_dir(load))
        replay.placer = MediaPlacer(self.args, found.directory / MEDIA_DIR, verify)
        if use_journal and (ckpt is None or lineage is not None):
            if ckpt is None:
                lineage = only_lineage(found, state)
            if lineage is not None:
                found, last = self._replay_journal(
                    load, ckpt, found, str(lineage), replay, restored_step, verify
                )
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
        self._compacted_upto = int(info.get("compacted_upto", watermark)) if ckpt is not None else 0
        self._next_gid = max(self._next_gid, replay.next_gid)
        return finish(state, replay, restored_step, cls, started)

    def _replay_journal(
        self,
        load: Any,
        ckpt: RolloutCheckpoint | None,
        found: Found,
        lineage: str,
        replay: Replay,
        restored_step: int | None,
        verify: bool,
    ) -> tuple[Found, int]:
        """``lineage``'s complete records after the checkpoint's watermark, applied to ``replay``
        (on a store, listed again while the restored step's records are missing); returns the
        journal as last found and its last seq."""
        info = journal_meta(ckpt)
        watermark = int(info.get("watermark", 0))
        earlier = int(info.get("compacted_upto", watermark))
        state = replay.state
        assert state is not None
        with gc_paused():  # thousands of records, groups and no cycles (see scan_journal)

            def scanned(f: Found) -> tuple[list[JournalRecord], int]:
                return journal_records(
                    f, lineage, ckpt, watermark, earlier, state, self.fingerprint(), self.args
                )

            found, (records, last) = until_step(
                ckpt, found, scanned, restored_step, state, lambda: self._journal_for(load, ckpt)
            )
            jdir = found.directory
            replay.placer = MediaPlacer(self.args, jdir / MEDIA_DIR, verify)
            replay.media_ok = media_check(jdir, records, state)
            for rec in records:
                replay.apply(rec, watermark)
        return found, last

    def _journal_for(self, load: Any, ckpt: RolloutCheckpoint | None) -> Found:
        """The journal beside the checkpoints under ``load`` (a store's staged beside the run's media)."""
        return journal_for(load, ckpt, lambda: self._scratch_dir("journal-recovery"))
