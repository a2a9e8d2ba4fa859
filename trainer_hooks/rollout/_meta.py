"""What a rollout checkpoint's meta tells the ledger, each field checked before it is spent.

A checkpoint is a bundle anyone may have edited: ``meta.journal`` (the lineage, the watermark,
the next group id, the last shipment it covers) goes into the names, headers and records of the
journal a resumed run writes, and ``meta.consumed_group_steps`` decides which groups come back to
training; a forged value is refused here (:class:`bundles.BundleFormatError` naming the
checkpoint and the field), never written into a journal its next reader would refuse.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

from bundles import BundleFormatError
from bundles.support import LIMITS, display
from trainer_hooks.checkpoints import RolloutCheckpoint

__all__ = ["MAX_GROUP_ID", "consumed_steps", "journal_meta", "shown"]

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
            f"at most {LIMITS['MAX_ID_CHARS']}), found {shown(lineage)}"
        )
    for key, (lo, hi) in _JOURNAL_INTS.items():
        value = info.get(key)
        if key in info and not (type(value) is int and lo <= value <= hi):
            raise BundleFormatError(
                f"{ckpt.path}: meta.journal.{key}: expected an int in {lo}..{hi}, found {shown(value)}"
            )
    return info


def consumed_steps(ckpt: RolloutCheckpoint, completed: dict[int, Any]) -> list[tuple[int, int]]:
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


def shown(value: Any) -> str:
    """A value of a checkpoint's meta in a message: a string through :func:`display`, quoted."""
    return repr(display(value, limit=120)) if type(value) is str else reprlib.repr(value)
