"""The journal's record kinds, each declared once: :data:`KINDS`.

A record's meta is ``[seq, kind, at, a, b, media]`` and its body one codec value (or nothing);
what ``a``, ``b`` and the body mean is the kind's. Each :class:`RecordKind` says, in one place:

* ``shape`` and ``meta_ok``: the ``seq``, ``a`` and ``b`` the writer writes; the scan
  (:mod:`._scan`) refuses any other (:class:`~._format.JournalCorruptError` naming the segment
  and the byte offset);
* ``body``: what the body holds: ``None`` (never a body), ``"sample"`` (one sample dict, or a
  nested group's trajectory, a list), ``"samples"`` (``{"samples": [...]}``) or
  ``"samples or none"`` (a ``group`` record: a body exactly when ``b`` is its size). The scan
  refuses a body where there is none and none where there is one; :func:`~._scan.record_value`
  refuses a decoded body of another shape;
* ``build``: what an append's arguments become: ``(a, b, value, deferred checks, lent)``
  (:meth:`~._writer.RolloutJournal.append` reads it; the ``append_*`` methods are its typed names);
* ``replay``: what a recovery does with the record (the ledger's replay calls it, in seq order,
  for the records after the checkpoint's watermark; ``replay_covered``: for those it covers
  too); ``names_group``: ``a`` is a group id (a resumed run's next group id goes past it);
* ``event`` and ``from_event``: the :class:`~trainer_hooks.checkpoints.RolloutState` event that
  appends it (the Miles plugins' path), and the appends an event makes.

A new kind is one entry here and its line in docs/RESUME.md. ``sync`` (the mark a flush writes)
is declared here too, for the scan; it is not appended by callers nor replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from trainer_hooks.checkpoints._snapshot import snapshot_groups
from trainer_hooks.checkpoints.journal._format import JournalRecord

__all__ = ["KINDS", "Append", "RecordKind", "Replay", "kind_of"]


@dataclass(frozen=True)
class Append:
    """One record an append makes: its meta's ``a`` and ``b``, the value its body encodes (None:
    no body), the snapshot's deferred type checks, and whether ``value`` is the caller's own
    sample, lent until encoded."""

    a: Any
    b: Any
    value: Any = None
    checks: tuple[Callable[[], Any], ...] = ()
    lent: bool = False


class Replay(Protocol):
    """What a kind's replay handler acts on (the ledger's recovery): groups in flight and
    completed by id, groups consumed after the checkpoint, the take batch not applied yet."""

    pending: dict[int, Any]
    completed: dict[int, Any]
    consumed: dict[int, tuple[int, Any]]
    takes: list[JournalRecord]

    def in_flight(self, gid: int, prompt: list[Any]) -> Any: ...
    def finished(self, gid: int, bodies: list[tuple[JournalRecord, bool]]) -> Any: ...
    def group_size(self, group: Any) -> int: ...
    def media_ok(self, rec: JournalRecord) -> bool: ...
    def set_cursor(self, cursor: Any) -> None: ...


Calls = Iterable[tuple[tuple[Any, ...], dict[str, Any]]]


@dataclass(frozen=True)
class RecordKind:
    """One kind of record (see the module docstring)."""

    name: str
    shape: str
    meta_ok: Callable[[Any, Any, Any], bool]
    body: str | None
    build: Callable[..., Append] | None = None
    replay: Callable[[Replay, JournalRecord], None] | None = None
    names_group: bool = True
    #: replayed also when the checkpoint covers it (a finished sibling of a group it holds in flight)
    replay_covered: bool = False
    #: replayed even when media it names are gone (it decides itself what becomes of its group)
    replay_missing_media: bool = False
    event: str | None = None
    from_event: Callable[[dict[str, Any]], Calls] | None = None

    def has_body(self, b: Any) -> bool:
        """Whether a record of this kind with meta ``b`` carries a body."""
        return self.body is not None and (self.body != "samples or none" or b is not None)


def _int(v: Any) -> bool:
    return type(v) is int


def _data(seq: Any, a: Any) -> bool:
    return _int(seq) and seq >= 1 and _int(a)


def _ints(d: Any, keys: tuple[str, ...]) -> bool:
    return type(d) is dict and all(k not in d or type(d[k]) is int for k in keys)


def _group(
    group: Iterable[Any], where: str, snapshot: bool
) -> tuple[list[Any], tuple[Callable[[], Any], ...]]:
    """``group`` as a record holds it: snapshotted now (the deferred checks run on the writer's
    thread), or, with ``snapshot=False``, a snapshot already (sample dicts nothing mutates)."""
    if not snapshot:
        return list(group), ()
    checks: list[Callable[[], Any]] = []
    (g,) = snapshot_groups([group], where=where, deferred=checks)
    return g, tuple(checks)


# -- take: a prompt group handed out, with the data source's cursor after it ------------------------
def _build_take(
    gid: int, group: Iterable[Any], cursor: Any = None, *, snapshot: bool = True, batch_end: int | None = None
) -> Append:
    g, checks = _group(group, f"take[{gid}]", snapshot)
    b = {"cursor": cursor, "n": len(g), "end": gid if batch_end is None else batch_end}
    return Append(gid, b, {"samples": g}, checks)


def _replay_take(r: Replay, rec: JournalRecord) -> None:
    # A batch of takes shares the cursor after its last group: applied whole.
    r.takes.append(rec)
    if rec.a == (rec.b or {}).get("end", rec.a):
        for t in r.takes:
            r.pending[t.a] = r.in_flight(t.a, [t])
        if "cursor" in (rec.b or {}):
            r.set_cursor(rec.b["cursor"])
        r.takes.clear()


def _take_events(p: dict[str, Any]) -> Calls:
    for gid, snap in zip(p["gids"], p["snapshots"], strict=True):
        yield (gid, snap, p.get("cursor")), {"snapshot": False, "batch_end": p["gids"][-1]}


# -- sample: one finished, graded sibling of a group in flight --------------------------------------
def _build_sample(gid: int, sibling: int, sample: Any, *, copy: bool = True) -> Append:
    if not copy and type(sample) is not list:  # a nested group's trajectory is snapshotted
        if not isinstance(sample, dict) and not callable(getattr(sample, "to_dict", None)):
            raise TypeError(
                f"group[{gid}][{sibling}]: expected a Sample (an object with to_dict()) or a dict, "
                f"found {type(sample).__name__}"
            )
        return Append(gid, sibling, sample, lent=True)
    g, checks = _group([sample], f"group[{gid}][{sibling}]", True)
    return Append(gid, sibling, g[0], checks)


def _replay_sample(r: Replay, rec: JournalRecord) -> None:
    if rec.a in r.pending:
        r.pending[rec.a].done[int(rec.b)] = rec


# -- group: a group finished (its body the group, or none when every sibling was a sample record) ---
def _build_group(gid: int, group: Iterable[Any] | None = None, *, snapshot: bool = True) -> Append:
    if group is None:
        return Append(gid, None)
    g, checks = _group(group, f"group[{gid}]", snapshot)
    return Append(gid, len(g), {"samples": g}, checks)


def _replay_group(r: Replay, rec: JournalRecord) -> None:
    group = r.pending.pop(rec.a, None)
    if not r.media_ok(rec):
        if group is not None:
            group.done.clear()
            r.pending[rec.a] = group  # regenerate it whole
        return
    if rec.b is not None:
        r.completed[rec.a] = r.finished(rec.a, [(rec, True)])
    elif group is not None and group.done and len(group.done) == r.group_size(group):
        r.completed[rec.a] = r.finished(rec.a, [(group.done[i], False) for i in sorted(group.done)])
    elif group is not None:
        r.pending[rec.a] = group


# -- consumed: groups handed to training for a step --------------------------------------------------
def _build_consumed(step: int, gids: Iterable[int]) -> Append:
    return Append(int(step), [int(g) for g in gids])


def _replay_consumed(r: Replay, rec: JournalRecord) -> None:
    for gid in rec.b:
        if gid in r.completed:
            r.consumed[gid] = (int(rec.a), r.completed.pop(gid))


# -- recycled: a group handed back to be generated again ---------------------------------------------
def _build_recycled(gid: int, group: Iterable[Any], *, snapshot: bool = True) -> Append:
    g, checks = _group(group, f"recycled[{gid}]", snapshot)
    return Append(gid, {"n": len(g)}, {"samples": g}, checks)


def _replay_recycled(r: Replay, rec: JournalRecord) -> None:
    r.completed.pop(rec.a, None)
    r.consumed.pop(rec.a, None)
    r.pending.pop(rec.a, None)  # re-queued behind the groups in flight
    r.pending[rec.a] = r.in_flight(rec.a, [rec])


def _recycled_events(p: dict[str, Any]) -> Calls:
    for gid, snap in zip(p["gids"], p["snapshots"], strict=True):
        yield (gid, snap), {"snapshot": False}


# -- dropped: a group that will be neither trained nor regenerated ----------------------------------
def _replay_dropped(r: Replay, rec: JournalRecord) -> None:
    r.pending.pop(rec.a, None)
    r.completed.pop(rec.a, None)


_TABLE = (
    RecordKind(
        "take",
        "seq >= 1, a group id (int), b {cursor, n: int, end: int}",
        lambda seq, a, b: _data(seq, a) and _ints(b, ("n", "end")),
        "samples",
        _build_take,
        _replay_take,
        event="handed_out",
        from_event=_take_events,
    ),
    RecordKind(
        "sample",
        "seq >= 1, a group id (int), b a sibling index (int >= 0)",
        lambda seq, a, b: _data(seq, a) and _int(b) and b >= 0,
        "sample",
        _build_sample,
        _replay_sample,
        replay_covered=True,
    ),
    RecordKind(
        "group",
        "seq >= 1, a group id (int), b a size (int >= 0) or None",
        lambda seq, a, b: _data(seq, a) and (b is None or (_int(b) and b >= 0)),
        "samples or none",
        _build_group,
        _replay_group,
        replay_missing_media=True,
        event="finished",
        from_event=lambda p: [((p["gid"], p["snapshot"]), {"snapshot": False})],
    ),
    RecordKind(
        "consumed",
        "seq >= 1, a step (int), b a list of group ids (ints)",
        lambda seq, a, b: _data(seq, a) and type(b) is list and all(_int(g) for g in b),
        None,
        _build_consumed,
        _replay_consumed,
        names_group=False,
        event="consumed",
        from_event=lambda p: [((p["step"], [p["gid"]]), {})],
    ),
    RecordKind(
        "recycled",
        "seq >= 1, a group id (int), b {n: int}",
        lambda seq, a, b: _data(seq, a) and _ints(b, ("n",)),
        "samples",
        _build_recycled,
        _replay_recycled,
        event="recycled",
        from_event=_recycled_events,
    ),
    RecordKind(
        "dropped",
        "seq >= 1, a group id (int), b None",
        lambda seq, a, b: _data(seq, a) and b is None,
        None,
        lambda gid: Append(gid, None),
        _replay_dropped,
        event="dropped",
        from_event=lambda p: [((p["gid"],), {})],
    ),
    RecordKind(
        "sync",
        "seq -1, b a durable seq (int)",
        lambda seq, a, b: seq == -1 and _int(seq) and _int(b),
        None,
        names_group=False,
    ),
)

#: Every kind by name, in the order the docs list them.
KINDS: Mapping[str, RecordKind] = {k.name: k for k in _TABLE}


def kind_of(name: str) -> RecordKind:
    """The kind called ``name`` (a ValueError naming the known ones otherwise)."""
    kind = KINDS.get(name)
    if kind is None or kind.build is None:
        known = ", ".join(k for k, v in KINDS.items() if v.build is not None)
        raise ValueError(f"journal record kind: expected one of {known}, found {name!r}")
    return kind
