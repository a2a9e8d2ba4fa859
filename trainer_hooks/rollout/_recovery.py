"""A recovery's steps: the checkpoint chosen, the journal found, scanned, checked and replayed.

:meth:`~trainer_hooks.rollout.RolloutLedger.recover` runs them in order, each a function here:
choose and read the checkpoint (:func:`read_checkpoint`: the newest at or before the trainer's
restored step), find the journal (:func:`journal_for`: ``<load>/rollout/journal``, or its
shipments downloaded from a store into staging, a listing that lags asked again), scan it and
check what it may replay (:func:`journal_records`: a torn tail the checkpoint proves durable is
corruption, a gap after the watermark stops the replay), list a lagging store again when the
restored step's records are missing (:func:`until_step`), check its media (:func:`media_check`),
then hand back what training and generation take (:func:`finish`). The groups themselves are
rebuilt by :class:`~._replay.Replay`. Anything a crash cannot have left is refused before
anything is placed (docs/RESUME.md, docs/RELIABILITY.md "Rollout journal recovery").
"""

from __future__ import annotations

import logging
import time
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundles import BundleFormatError, UnsafeBundleError
from bundles.support import display, fault_point, open_regular_file
from trainer_hooks.checkpoints import (
    RolloutCheckpoint,
    check_fingerprint,
    list_rollout_checkpoints,
    read_rollout_checkpoint,
)
from trainer_hooks.journal import (
    MEDIA_DIR,
    JournalCorruptError,
    JournalError,
    JournalRecord,
    Shipments,
    journal_lineages,
    listing_backoff,
    run_journal,
    scan_journal,
    shipment_lineage,
)
from trainer_hooks.rollout._lazy import MediaPlacer, build_sample, decode_record
from trainer_hooks.rollout._meta import journal_meta, shown
from trainer_hooks.rollout._replay import RecoveredState, Replay

__all__ = [
    "Found",
    "finish",
    "journal_for",
    "journal_records",
    "media_check",
    "only_lineage",
    "read_checkpoint",
    "until_step",
]

logger = logging.getLogger(__name__)


@dataclass
class Found:
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


def read_checkpoint(
    args: Namespace, load: Any, restored_step: int | None, exact: bool, cls: Any, verify: bool
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
    ckpt = read_rollout_checkpoint(args, rid, sample_cls=cls, verify_media=verify)
    if restored_step is not None and rid != restored_step:
        logger.info("%s: the newest rollout checkpoint at or before step %s", ckpt.path, restored_step)
    return ckpt


def journal_for(load: Any, ckpt: RolloutCheckpoint | None, scratch: Callable[[], Path]) -> Found:
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
            f"found {shown(must)}"
        )
    why = f"rollout checkpoint {ckpt.path if ckpt else load} covers the journal up to record "
    why += str(info.get("last_shipment_seq"))
    directory = sink.readable(scratch, must_reach=must, why=why)
    return Found(directory, sink.where, sink.origin, sink)


def until_step(
    ckpt: RolloutCheckpoint | None,
    found: Found,
    scanned: Callable[[Found], tuple[list[JournalRecord], int]],
    restored_step: int | None,
    state: RecoveredState,
    again: Callable[[], Found],
) -> tuple[Found, tuple[list[JournalRecord], int]]:
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
        found = again()
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


def journal_records(
    found: Found,
    lineage: str,
    ckpt: RolloutCheckpoint | None,
    watermark: int,
    earlier: int,
    state: RecoveredState,
    fingerprint: dict[str, Any],
    args: Namespace,
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
        state.accepted += check_fingerprint(scan.fingerprint, fingerprint, where=str(jdir), args=args)
    records = scan.records
    after = next((r.seq for r in records if r.seq > watermark), None)
    if after is not None and after != watermark + 1:
        state.problems.append(
            f"{jdir}: the journal resumes at record {after}, the checkpoint covers up to "
            f"{watermark}: the records in between are gone, so the journal is not replayed"
        )
        records = [r for r in records if r.seq <= watermark]
    return records, (scan.records[-1].seq if scan.records else 0)


def finish(
    state: RecoveredState, replay: Replay, restored_step: int | None, cls: Any, started: float
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
        group.prompt = _prompt(group.prompt, placer, cls)
        group.done = {
            i: build_sample(decode_record(r, placer), cls, r) if isinstance(r, JournalRecord) else r
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


def only_lineage(found: Found, state: RecoveredState) -> str | None:
    """The one lineage of the journal found (a recovery without a checkpoint); None, with a
    problem line, when segments of several lie there."""
    lineages = journal_lineages(found.directory, origin=found.origin)
    if len(lineages) > 1:
        state.problems.append(
            f"{found.where}: journal segments of {len(lineages)} run lineages and no checkpoint to tell which "
            "is this run's; none is replayed"
        )
        return None
    return next(iter(lineages), None)


def media_check(jdir: Path, records: list[JournalRecord], state: RecoveredState) -> Any:
    """``ok(record)``: whether every media file ``record`` names is in the journal (a missing one is
    one problem line, once; its records are dropped and regenerate)."""
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


def _prompt(prompt: list[Any], placer: MediaPlacer, cls: Any) -> list[Any]:
    if len(prompt) == 1 and isinstance(prompt[0], JournalRecord):
        rec = prompt[0]
        return [build_sample(s, cls, rec) for s in decode_record(rec, placer)["samples"]]
    return prompt


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


def _trained(records: Sequence[JournalRecord], ckpt: RolloutCheckpoint | None, step: int) -> bool:
    """Whether the journal (or the checkpoint, for a step drained while it was cut) records
    groups handed to training step ``step`` or a later one."""
    if any(r.kind == "consumed" and r.a >= step for r in records):
        return True
    pairs = (ckpt.meta.get("consumed_group_steps") or []) if ckpt is not None else []
    return any(type(p) is list and len(p) == 2 and type(p[1]) is int and p[1] >= step for p in pairs)
