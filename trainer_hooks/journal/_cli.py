"""``rollout-bundle inspect`` learns the rollout journal (a trainer_hooks addition to a bundles command).

The bundles command knows bundles only; :func:`inspect_with_journal` composes its handler with the
journal's (``trainer_hooks.cli`` builds ``inspect`` so, right where it registers bundles'
commands, and adds :data:`INSPECT_DESCRIPTION` to its help), so that:

* ``rollout-bundle inspect <save>/rollout/journal`` (or ``<save>``, or ``<save>/rollout``: paths
  that hold a journal but are not bundles) shows the journal's state;
* ``rollout-bundle inspect <save>/rollout/fully_async_N`` shows the bundle as before, then the
  journal beside it (with ``--json``: one object, the journal under ``"journal"``);
* the same with ``<save>`` an object-store URL: the journal's shipments are downloaded and
  checked into a temporary directory first, as a resume would (so this reads the whole journal).

The state, per run lineage: segments, complete records by kind, bytes, the seq range, the last
fsync (from the journal's ``sync`` marks), the records appended after it and the age of the oldest
of them (what a crash now would lose), the media it holds, and any torn tail or foreign segment.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bundles import BundleError, is_bundle
from bundles.support import LIMITS, display, human_bytes
from trainer_hooks.checkpoints import CHECKPOINT_SUBDIR
from trainer_hooks.journal._format import JOURNAL_DIR, MEDIA_DIR
from trainer_hooks.journal._open import journal_sink
from trainer_hooks.journal._scan import scan_journal
from trainer_hooks.journal._sink import JournalSink

__all__ = ["INSPECT_DESCRIPTION", "inspect_with_journal", "journal_state"]

#: What ``inspect``'s description says once it also shows a journal.
INSPECT_DESCRIPTION = (
    " Pointed at a rollout journal (<save>/rollout/journal, or a checkpoint directory holding one), "
    "or at a rollout checkpoint beside one, it also shows the journal: records, bytes, the last fsync "
    "and the age of the oldest record not yet durable."
)


def _find_journal(text: str, *, beside: bool) -> JournalSink | None:
    """The journal at or in location ``text`` (a path or a store URL): ``text`` itself,
    ``text/journal`` or ``text/rollout/journal``; with ``beside`` (``text`` is a bundle: a
    rollout checkpoint) also ``<parent>/journal``. None without one (or when ``text`` names no
    location, which the bundles command then reports). A path that is no bundle never shows a
    sibling's journal: ``inspect <save>/rollout/typo`` says "no bundle here", as verify does."""
    try:
        here = journal_sink(text)
    except BundleError:
        return None
    parent = here.parent() if beside else None
    candidates = [here, here.child(JOURNAL_DIR), here.child(f"{CHECKPOINT_SUBDIR}/{JOURNAL_DIR}")]
    for candidate in [*candidates, *([] if parent is None else [parent.child(JOURNAL_DIR)])]:
        if candidate.name == JOURNAL_DIR and candidate.exists():
            return candidate
    return None


def journal_state(
    directory: str | os.PathLike[str], *, now: float | None = None, origin: Callable[[Path], str] = str
) -> dict[str, Any]:
    """The journal's state as ``inspect`` prints it (see the module docstring). ``origin`` names a
    segment in a problem (a store journal's: the shipment object, never the local copy)."""
    directory = Path(directory)
    now = time.time() if now is None else now
    lineages = sorted(scan_journal(directory, decode_bodies=False, origin=origin).lineages)
    out: dict[str, Any] = {"path": str(directory), "lineages": []}
    media = directory / MEDIA_DIR
    files = [e for e in os.scandir(media) if e.is_file(follow_symlinks=False)] if media.is_dir() else []
    out["media_files"] = len(files)
    out["media_bytes"] = sum(e.stat(follow_symlinks=False).st_size for e in files)
    for lineage in lineages:
        scan = scan_journal(directory, lineage=lineage, decode_bodies=False, origin=origin)
        kinds: dict[str, int] = {}
        for r in scan.records:
            kinds[r.kind] = kinds.get(r.kind, 0) + 1
        unflushed = [r for r in scan.records if r.seq > scan.synced_seq]
        out["lineages"].append(
            {
                "lineage": lineage,
                "segments": scan.segments,
                "bytes": scan.bytes,
                "records": len(scan.records),
                "records_by_kind": kinds,
                "first_seq": scan.records[0].seq if scan.records else None,
                "last_seq": scan.records[-1].seq if scan.records else None,
                "synced_seq": scan.synced_seq,
                "last_sync_age_s": None if scan.last_sync_at is None else round(now - scan.last_sync_at, 3),
                "unflushed_records": len(unflushed),
                "oldest_unflushed_age_s": round(now - unflushed[0].at, 3) if unflushed else 0.0,
                "problems": [p for p in scan.problems if "another run lineage" not in p],
            }
        )
    return out


def _print_state(state: dict[str, Any]) -> None:
    print(f"journal       {display(state['path'], limit=LIMITS['MAX_SHOWN_PATH_CHARS'])}")
    print(f"media         {state['media_files']} file(s), {human_bytes(state['media_bytes'])}")
    if not state["lineages"]:
        print("records       none")
    for lin in state["lineages"]:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(lin["records_by_kind"].items())) or "none"
        print(
            f"lineage       {display(str(lin['lineage']))}: {lin['segments']} segment(s), {human_bytes(lin['bytes'])}"
        )
        print(f"records       {lin['records']} (seq {lin['first_seq']}..{lin['last_seq']}): {kinds}")
        age = "never" if lin["last_sync_age_s"] is None else f"{lin['last_sync_age_s']:.1f} s ago"
        print(
            f"durable       up to seq {lin['synced_seq']} (last fsync {age}); {lin['unflushed_records']} record(s) "
            f"after it, oldest {lin['oldest_unflushed_age_s']:.1f} s old"
        )
        for p in lin["problems"]:
            print(f"problem       {display(p, limit=LIMITS['MAX_SHOWN_CHARS'])}")


def _journal_state(sink: JournalSink) -> dict[str, Any]:
    """The state of the journal ``sink`` holds (a store's shipments downloaded and checked into
    a temporary directory first, then read as a local journal)."""
    with tempfile.TemporaryDirectory(prefix="rollout-journal-inspect-") as tmp:
        state = journal_state(sink.readable(lambda: Path(tmp)), origin=sink.origin)
    state["path"] = sink.where
    return state


def inspect_with_journal(
    original: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``inspect``'s handler: bundles' handler ``original`` for a bundle, then the journal beside it
    (or only the journal, for a location that holds one and is no bundle; see the module docstring)."""

    def inspect(ns: argparse.Namespace) -> int:
        # The location given is asked first: one that refuses it (a store's credentials, plain
        # http) is then reported about that location by the bundles command, in its words, not
        # about a journal path looked for beside it.
        try:
            bundle_here = is_bundle(ns.bundle)
        except BundleError:
            return int(original(ns))
        journal = _find_journal(ns.bundle, beside=bundle_here)
        if journal is None:
            return int(original(ns))
        state = _journal_state(journal)
        if not bundle_here:
            if ns.json:
                print(json.dumps({"journal": state}, indent=2, sort_keys=True, ensure_ascii=True))
            else:
                _print_state(state)
            return 0
        if ns.json:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                status = int(original(ns))
            info = json.loads(buf.getvalue())
            info["journal"] = state
            print(json.dumps(info, indent=2, sort_keys=True))
            return status
        status = int(original(ns))
        print()
        _print_state(state)
        return status

    return inspect
