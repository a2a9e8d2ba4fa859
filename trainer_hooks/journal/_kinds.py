"""The journal's record kinds, each declared once: :data:`KINDS`.

A record's meta is ``[seq, kind, at, a, b, media]`` and its body one codec value (or nothing);
what ``a``, ``b`` and the body mean is the kind's. Each :class:`RecordKind` says, in one place:

* ``seq``, ``a`` and ``b``: the :class:`Rule` each field obeys (its type and its bound, from
  the one table of limits, :data:`bundles.support.LIMITS`); ``at`` and ``media`` obey the same
  rules in every kind (:data:`AT`, :data:`MEDIA`). Both sides apply them, from here: the writer
  (:mod:`._writer`) refuses a record with a field out of its bound before it is queued, so before
  it can be durable (:class:`~._format.JournalLimitError` naming the kind and the field), and the
  scan (:mod:`._scan`) refuses the same record read back (:class:`~._format.JournalCorruptError`
  naming the segment and the byte offset). What the writer writes, its reader reads;
  ``shape`` says it in one line;
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
* ``event`` and ``from_event``: the :class:`~trainer_hooks.rollout.RolloutState` event that
  appends it (the Miles plugins' path), and the appends an event makes.

A new kind is one entry here and its line in docs/RESUME.md. ``sync`` (the mark a flush writes)
is declared here too, for the scan; it is not appended by callers nor replayed.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from bundles.support import LIMITS
from trainer_hooks.checkpoints import snapshot_groups
from trainer_hooks.journal._format import JournalRecord, is_media_name

__all__ = [
    "AT",
    "KINDS",
    "MEDIA",
    "Append",
    "Either",
    "Exactly",
    "Fields",
    "Int",
    "ListOf",
    "MediaName",
    "Packed",
    "RecordKind",
    "Replay",
    "Rule",
    "Time",
    "kind_of",
]

MAX_INT = LIMITS["MAX_INT"]
MAX_GROUP_ID = LIMITS["MAX_GROUP_ID"]
MAX_GROUP_SIZE = LIMITS["MAX_GROUP_SIZE"]


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a caller's object whose repr fails is still named
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the rules a field obeys (each one: its type and its bound) -------------------------------------
class Rule:
    """What one field of a record may hold. :meth:`problem` says why ``value`` may not (None: it
    may), prefixed by the field's path (``b.cursor``, ``b[3]``); the writer and the reader both
    ask it."""

    def problem(self, value: Any, path: str) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Rule):
    """An int (never a bool) in ``lo..hi``."""

    lo: int
    hi: int
    what: str = "an int"

    def problem(self, value: Any, path: str) -> str | None:
        if type(value) is int and self.lo <= value <= self.hi:
            return None
        return f"{path}: expected {self}, found {_short(value)}"

    def __str__(self) -> str:
        return f"{self.what} (an int in {self.lo}..{self.hi})"


@dataclass(frozen=True)
class Exactly(Rule):
    """This one value (None, or -1 in a sync mark)."""

    value: Any

    def problem(self, value: Any, path: str) -> str | None:
        if type(value) is type(self.value) and value == self.value:
            return None
        return f"{path}: expected {self}, found {_short(value)}"

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Either(Rule):
    """What one of ``rules`` accepts."""

    rules: tuple[Int | Exactly, ...]

    def problem(self, value: Any, path: str) -> str | None:
        if any(r.problem(value, path) is None for r in self.rules):
            return None
        return f"{path}: expected {' or '.join(map(str, self.rules))}, found {_short(value)}"


@dataclass(frozen=True)
class ListOf(Rule):
    """A list of at most ``most`` items, each obeying ``item``."""

    item: Rule
    most: int

    def problem(self, value: Any, path: str) -> str | None:
        if type(value) is not list:
            return f"{path}: expected a list, found {_short(value)}"
        if len(value) > self.most:
            return f"{path}: {len(value)} items, at most {self.most}"
        for i, v in enumerate(value):
            p = self.item.problem(v, f"{path}[{i}]")
            if p is not None:
                return p
        return None


@dataclass(frozen=True)
class Fields(Rule):
    """A map whose keys are some of ``fields`` (a record written by an older release may lack
    one), each value obeying its rule."""

    fields: tuple[tuple[str, Rule], ...]

    def problem(self, value: Any, path: str) -> str | None:
        if type(value) is not dict:
            return f"{path}: expected a map of {', '.join(k for k, _ in self.fields)}, found {_short(value)}"
        rules = dict(self.fields)
        for key in value:
            if key not in rules:
                return f"{path}: expected keys {', '.join(rules)}, found {_short(key)}"
        for key, rule in self.fields:
            if key in value:
                p = rule.problem(value[key], f"{path}.{key}")
                if p is not None:
                    return p
        return None


@dataclass(frozen=True)
class Packed(Rule):
    """Any value msgpack encodes (a data source's cursor), nested at most ``depth`` deep and at
    most ``most`` bytes encoded, whose map keys are scalars. The depth is walked first, without
    recursion (a cyclic value is refused there). A map key that is a list or a tuple is encoded
    as an array, which the reader cannot make a key of again (a list is not hashable): such a
    cursor would make the journal unreadable, so it is refused."""

    most: int
    depth: int

    def problem(self, value: Any, path: str) -> str | None:
        level: list[Any] = [value]
        for _ in range(self.depth + 1):
            keys = [k for v in level if isinstance(v, dict) for k in v]
            bad = next((k for k in keys if _container_key(k)), None)
            if bad is not None:
                return f"{path}: a map key that is not a scalar, found {_short(bad)} (its reader cannot decode it)"
            level = [
                x
                for v in level
                if isinstance(v, (dict, list, tuple))
                for x in (v.values() if isinstance(v, dict) else v)
            ]
            if not level:
                break
        else:
            return f"{path}: nested more than {self.depth} deep"
        try:
            n = len(msgpack.packb(value))
        except Exception as e:
            return f"{path}: cannot be encoded: {type(e).__name__}: {_short(str(e))}"
        if n > self.most:
            return f"{path}: {n} bytes encoded, at most {self.most}"
        return None


def _container_key(key: Any) -> bool:
    """Whether msgpack encodes map key ``key`` as an array or a map (an ``ExtType``, a tuple, is
    encoded as an extension and decodes to one, hashable)."""
    return isinstance(key, (list, tuple, dict)) and not isinstance(key, msgpack.ExtType)


@dataclass(frozen=True)
class Time(Rule):
    """A time in seconds since the epoch: a finite, non-negative float or int."""

    def problem(self, value: Any, path: str) -> str | None:
        if type(value) is float and math.isfinite(value) and value >= 0:
            return None
        if type(value) is int and 0 <= value <= MAX_INT:
            return None
        return f"{path}: expected a time (a finite number >= 0), found {_short(value)}"


@dataclass(frozen=True)
class MediaName(Rule):
    """A media file name ``<64 hex><suffix>`` (bundles' one rule): it cannot name anything outside
    ``journal/media`` or the run's media directory."""

    def problem(self, value: Any, path: str) -> str | None:
        if is_media_name(value):
            return None
        return f"{path}: expected a content-addressed name '<64 hex><suffix>', found {_short(value)}"


#: ``at`` and ``media``: the same in every kind.
AT: Rule = Time()
MEDIA: Rule = ListOf(MediaName(), LIMITS["MAX_RECORD_MEDIA"])
_SEQ = Int(1, MAX_INT, "a seq")
_GID = Int(0, MAX_GROUP_ID, "a group id")
_SIZE = Int(0, MAX_GROUP_SIZE, "a group size")
_CURSOR = Packed(LIMITS["MAX_CURSOR_BYTES"], LIMITS["MAX_NESTING_DEPTH"])


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
    seq: Rule
    a: Rule
    b: Rule
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

    @property
    def fields(self) -> dict[str, Rule]:
        """Every field of the meta and its rule, in the meta's order (``kind`` is the name)."""
        return {"seq": self.seq, "at": AT, "a": self.a, "b": self.b, "media": MEDIA}

    def problem(self, seq: Any, at: Any, a: Any, b: Any, media: Any) -> str | None:
        """Why a record of this kind with this meta may not be written, nor read (None: it may):
        ``<kind> record: <field>: ...``."""
        for path, value in (("seq", seq), ("at", at), ("a", a), ("b", b), ("media", media)):
            p = self.fields[path].problem(value, path)
            if p is not None:
                return f"{self.name} record: {p}"
        return None

    def append_problem(self, a: Any, b: Any) -> str | None:
        """:meth:`problem` of the fields an append's caller gives (``a`` and ``b``); the writer
        checks the others where it makes them."""
        for path, rule, value in (("a", self.a, a), ("b", self.b, b)):
            p = rule.problem(value, path)
            if p is not None:
                return f"{self.name} record: {p}"
        return None


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
    return Append(_index(step), [_index(g) for g in gids])


def _index(v: Any) -> Any:
    """``v`` as an int if it is an integer of another type (numpy's); else ``v`` unchanged, for
    the kind's rule to refuse by name (a bool, a float, a string)."""
    if type(v) is int or type(v) is bool:
        return v
    try:
        return operator.index(v)
    except TypeError:
        return v


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
        "seq >= 1, a group id, b {cursor: <= MAX_CURSOR_BYTES encoded, n: a group size, end: a group id}",
        _SEQ,
        _GID,
        Fields((("cursor", _CURSOR), ("n", _SIZE), ("end", _GID))),
        "samples",
        _build_take,
        _replay_take,
        event="handed_out",
        from_event=_take_events,
    ),
    RecordKind(
        "sample",
        "seq >= 1, a group id, b a sibling index (0..MAX_GROUP_SIZE)",
        _SEQ,
        _GID,
        Int(0, MAX_GROUP_SIZE, "a sibling index"),
        "sample",
        _build_sample,
        _replay_sample,
        replay_covered=True,
    ),
    RecordKind(
        "group",
        "seq >= 1, a group id, b a group size or None",
        _SEQ,
        _GID,
        Either((Exactly(None), _SIZE)),
        "samples or none",
        _build_group,
        _replay_group,
        replay_missing_media=True,
        event="finished",
        from_event=lambda p: [((p["gid"], p["snapshot"]), {"snapshot": False})],
    ),
    RecordKind(
        "consumed",
        "seq >= 1, a step (-1: none), b a list of at most MAX_CONSUMED_GROUPS group ids",
        _SEQ,
        Int(-1, MAX_INT, "a step"),
        ListOf(_GID, LIMITS["MAX_CONSUMED_GROUPS"]),
        None,
        _build_consumed,
        _replay_consumed,
        names_group=False,
        event="consumed",
        from_event=lambda p: [((p["step"], [p["gid"]]), {})],
    ),
    RecordKind(
        "recycled",
        "seq >= 1, a group id, b {n: a group size}",
        _SEQ,
        _GID,
        Fields((("n", _SIZE),)),
        "samples",
        _build_recycled,
        _replay_recycled,
        event="recycled",
        from_event=_recycled_events,
    ),
    RecordKind(
        "dropped",
        "seq >= 1, a group id, b None",
        _SEQ,
        _GID,
        Exactly(None),
        None,
        lambda gid: Append(gid, None),
        _replay_dropped,
        event="dropped",
        from_event=lambda p: [((p["gid"],), {})],
    ),
    RecordKind(
        "sync",
        "seq -1, a -1, b a durable seq",
        Exactly(-1),
        Exactly(-1),
        Int(0, MAX_INT, "a seq"),
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
