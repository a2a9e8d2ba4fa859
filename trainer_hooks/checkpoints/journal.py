"""The rollout journal's former home: it is :mod:`trainer_hooks.journal` now.

Every name importable from ``trainer_hooks.checkpoints.journal`` before the journal moved still is
(:data:`MOVED`), resolved from :mod:`trainer_hooks.journal` the first time it is asked for (see
:mod:`trainer_hooks.checkpoints._moved`: the journal imports this package, so this module may not
import it at the top); new code imports :mod:`trainer_hooks.journal`.
"""

from __future__ import annotations

from typing import Any

from trainer_hooks.checkpoints._moved import moved_name

#: The journal's public names, all in :mod:`trainer_hooks.journal` now.
MOVED: dict[str, str] = dict.fromkeys(
    (
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
    ),
    "trainer_hooks.journal",
)

__all__ = ["MOVED", *MOVED]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(MOVED))


def __getattr__(name: str) -> Any:
    return moved_name(__name__, MOVED, globals(), name)
