"""The rollout journal: every graded sample made durable within a second, off the event loop.

A rollout checkpoint is written only when the trainer saves; the journal covers the time between,
at ``<save>/rollout/journal/`` (docs/RESUME.md). This package's face is what the ledger
(:class:`~trainer_hooks.checkpoints.RolloutLedger`), ``rollout-bundle inspect`` and the
benchmarks use; its modules, one job each:

* :mod:`._writer`: :class:`RolloutJournal`, the writer (the queue, its thread, the segments'
  bytes, the flush); it never asks where its segments go.
* :mod:`._sink`: where they go, a :class:`JournalSink` chosen once (:mod:`._open`:
  :func:`journal_sink`; :func:`run_journal`, the one beside a run's checkpoints):
  :class:`LocalFiles` (a directory, fsynced in place) or :class:`Shipments` (:mod:`._store`: an
  object store, one create-only shipment per interval).
* :mod:`._kinds`: the record kinds, each declared once (:data:`KINDS`: its shape, its append,
  its replay).
* :mod:`._format`: names, framing, limits, :class:`JournalError` (the on-disk format, versions 1
  and 2).
* :mod:`._scan`: the reader (:func:`scan_journal`; bodies decoded when needed, :func:`record_value`).
* :mod:`._media`: the media the records reference (found, placed, counted).
* :mod:`._index`: which segment holds what, and so what compaction deletes.
* :mod:`._cli`: ``rollout-bundle inspect`` on a journal.
"""

from trainer_hooks.checkpoints.journal._format import (
    JOURNAL_DIR,
    MEDIA_DIR,
    JournalCorruptError,
    JournalError,
    JournalLimitError,
    is_media_name,
    journal_dir,
)
from trainer_hooks.checkpoints.journal._kinds import KINDS, RecordKind
from trainer_hooks.checkpoints.journal._open import journal_sink, run_journal
from trainer_hooks.checkpoints.journal._scan import (
    JournalRecord,
    JournalScan,
    journal_lineages,
    record_body,
    record_value,
    record_where,
    scan_journal,
)
from trainer_hooks.checkpoints.journal._sink import FlushStats, JournalSink, LocalFiles
from trainer_hooks.checkpoints.journal._store import (
    Shipments,
    is_shipment_name,
    listing_backoff,
    shipment_lineage,
)
from trainer_hooks.checkpoints.journal._writer import RolloutJournal, new_lineage

__all__ = [
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
