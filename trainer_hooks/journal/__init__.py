"""The rollout journal: every graded sample made durable within a second, off the event loop.

A rollout checkpoint is written only when the trainer saves; the journal covers the time between,
at ``<save>/rollout/journal/`` (docs/RESUME.md). It stands on :mod:`trainer_hooks.checkpoints`
(the snapshots it takes, the ``rollout/`` directory it shares with the checkpoints) and knows
nothing of who appends: this package's face is what the ledger
(:class:`~trainer_hooks.rollout.RolloutLedger`), ``rollout-bundle inspect`` and the benchmarks
use. Its modules, one job each:

* :mod:`._writer`: :class:`RolloutJournal`, the writer (the caller's side, the queue, its thread,
  the barriers, compaction); it never asks where its segments go.
* :mod:`._segments`: the segments' bytes on the writer's thread (each record encoded, compressed,
  framed and written; segments started, closed and handed to the sink).
* :mod:`._sink`: where they go, a :class:`JournalSink` chosen once (:mod:`._open`:
  :func:`journal_sink`; :func:`run_journal`, the one beside a run's checkpoints), one of two:
* :mod:`._local_sink`: :class:`LocalFiles`, a directory, fsynced in place;
* :mod:`._store_sink`: :class:`Shipments`, an object store, one create-only shipment per interval.
* :mod:`._kinds`: the record kinds, each declared once (:data:`KINDS`: its shape, its append,
  its replay).
* :mod:`._format`: names, framing, limits, :class:`JournalError` (the on-disk format, versions 1
  and 2).
* :mod:`._scan`: the reader (:func:`scan_journal`: segments in seq order, a torn tail told from
  corruption), over :mod:`._frames` (one segment's header and record frames, each checked);
  :mod:`._bodies`: a record's body, decoded when needed (:func:`record_value`).
* :mod:`._media`: the media the records reference (found, placed, counted).
* :mod:`._index`: which segment holds what, and so what compaction deletes.
* :mod:`._cli`: ``rollout-bundle inspect`` on a journal (:func:`inspect_with_journal`, which
  ``trainer_hooks.cli`` composes with ``bundles``' ``inspect``).

These names were importable from ``trainer_hooks.checkpoints.journal`` before the journal moved
here, and still are.
"""

from trainer_hooks.journal._bodies import record_body, record_value, record_where
from trainer_hooks.journal._cli import INSPECT_DESCRIPTION, inspect_with_journal
from trainer_hooks.journal._format import (
    JOURNAL_DIR,
    MEDIA_DIR,
    JournalCorruptError,
    JournalError,
    JournalLimitError,
    is_media_name,
    journal_dir,
)
from trainer_hooks.journal._kinds import KINDS, RecordKind
from trainer_hooks.journal._local_sink import LocalFiles
from trainer_hooks.journal._open import journal_sink, run_journal
from trainer_hooks.journal._scan import JournalRecord, JournalScan, journal_lineages, scan_journal
from trainer_hooks.journal._sink import FlushStats, JournalSink
from trainer_hooks.journal._store_sink import (
    Shipments,
    is_shipment_name,
    listing_backoff,
    shipment_lineage,
)
from trainer_hooks.journal._writer import RolloutJournal, new_lineage

__all__ = [
    "INSPECT_DESCRIPTION",
    "JOURNAL_DIR",
    "KINDS",
    "MEDIA_DIR",
    "FlushStats",
    "JournalCorruptError",
    "JournalError",
    "JournalLimitError",
    "JournalRecord",
    "JournalScan",
    "JournalSink",
    "LocalFiles",
    "RecordKind",
    "RolloutJournal",
    "Shipments",
    "inspect_with_journal",
    "is_media_name",
    "is_shipment_name",
    "journal_dir",
    "journal_lineages",
    "journal_sink",
    "listing_backoff",
    "new_lineage",
    "record_body",
    "record_value",
    "record_where",
    "run_journal",
    "scan_journal",
    "shipment_lineage",
]
