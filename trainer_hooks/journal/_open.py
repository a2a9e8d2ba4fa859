"""Which sink a journal gets, decided once, where it is opened.

:func:`journal_sink` reads the location once, as a :class:`bundles.Location`, and picks by its
capability: a location whose writes upload (an object store) gets :class:`~._store_sink.Shipments`,
any other a directory of files, :class:`~._sink.LocalFiles`. Nothing after it asks which kind it
holds: the writer, the ledger's recovery and ``rollout-bundle inspect`` call the sink.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bundles import Location
from trainer_hooks.checkpoints import CHECKPOINT_SUBDIR
from trainer_hooks.journal._format import JOURNAL_DIR
from trainer_hooks.journal._local_sink import LocalFiles
from trainer_hooks.journal._sink import JournalSink
from trainer_hooks.journal._store_sink import Shipments

__all__ = ["journal_sink", "run_journal"]


def run_journal(root: str | os.PathLike[str], *, spool: Callable[[], Path] | None = None) -> JournalSink:
    """The sink of the journal beside the rollout checkpoints of ``root`` (``--save`` or
    ``--load``): ``<root>/rollout/journal``, a directory or a store prefix."""
    return journal_sink(Location.of(root).child(f"{CHECKPOINT_SUBDIR}/{JOURNAL_DIR}"), spool=spool)


def journal_sink(location: Any, *, spool: Callable[[], Path] | None = None) -> JournalSink:
    """The sink of the journal at ``location`` (the journal directory itself: ``journal_dir`` of
    ``--save``, or its store URL); ``spool()`` makes the local directory a store journal writes
    into (needed only to write one). The one place that decides which kind of sink a location
    gets (issue 31, item 5): by the location's capability, never its text."""
    where = Location.of(location)
    return Shipments(where, spool=spool) if where.uploads else LocalFiles(location)
