"""The groups a recovery rebuilds: from the checkpoint, then one journal record at a time.

:meth:`Replay.from_checkpoint` takes the checkpoint's groups by id (its fingerprint checked
first); :meth:`Replay.apply` then applies each complete journal record after its watermark, in
seq order, through its kind's ``replay`` (:data:`trainer_hooks.journal.KINDS`: what each kind of
record does to the groups lives with the kind, this class is the protocol it calls). What a
recovery hands back is a :class:`RecoveredState`: groups in flight (:class:`RecoveredGroup`, a
prompt and its finished siblings), completed groups, the data source's cursor.
"""

from __future__ import annotations

import os
import reprlib
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any

from bundles import BundleFormatError
from trainer_hooks.checkpoints import RolloutCheckpoint, check_fingerprint
from trainer_hooks.journal import KINDS, JournalRecord
from trainer_hooks.rollout._lazy import LazyGroup, MediaPlacer
from trainer_hooks.rollout._meta import MAX_GROUP_ID, consumed_steps, journal_meta

__all__ = ["RecoveredGroup", "RecoveredState", "Replay"]


@dataclass
class RecoveredGroup:
    """A group in flight at the crash: its prompt as handed out and its finished siblings."""

    gid: int
    prompt: list[Any]
    done: dict[int, Any] = field(default_factory=dict)


@dataclass
class RecoveredState:
    """What :meth:`~trainer_hooks.rollout.RolloutLedger.recover` restores."""

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


class Replay:
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
        self.placer: MediaPlacer | None = None
        self.media_ok: Any = lambda rec: True
        self.replayed = self.dropped = 0
        self.takes: list[JournalRecord] = []  # takes of a batch whose last take is not replayed yet

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: RolloutCheckpoint | None,
        state: RecoveredState,
        fingerprint: dict[str, Any],
        args: Namespace,
        sample_cls: Any,
    ) -> Replay:
        """The checkpoint's groups by id (its fingerprint checked first); empty without one."""
        if ckpt is None:
            replay = cls({}, {}, 0, sample_cls)
            replay.state = state
            return replay
        state.meta = ckpt.meta
        state.accepted += check_fingerprint(
            ckpt.meta.get("fingerprint"), fingerprint, where=str(ckpt.path), args=args
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
        for gid, step in consumed_steps(ckpt, completed):
            replay.consumed[gid] = (step, completed.pop(gid))
        replay.state = state
        return replay

    def apply(self, rec: JournalRecord, watermark: int) -> None:
        """One record, in seq order: its kind's ``replay`` (:data:`trainer_hooks.journal.KINDS`)."""
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


def _size(group: RecoveredGroup) -> int:
    p = group.prompt
    if len(p) == 1 and isinstance(p[0], JournalRecord):
        return int((p[0].b or {}).get("n", 0))
    return len(p)
