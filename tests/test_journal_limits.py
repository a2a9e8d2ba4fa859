"""The rollout journal's limits (issue 36, item 5): one set of bounds, the record kinds' table
(``trainer_hooks/journal/_kinds.py``, its numbers rows of ``bundles.support.LIMITS``),
applied by the writer before a record can be durable and by the reader when it scans one.

Parametrised over the table itself: for every kind and every bounded field, the values just past
the bound (and of another type) are derived from the field's rule; the writer refuses each one
that an append can carry (``JournalLimitError`` naming the kind and the field; nothing is
written), and the reader refuses the same record forged with valid checksums
(``JournalCorruptError`` naming the segment and the record's byte offset). Forged records of the
right outer shape with wrong inner types and values, bodies included, are in
``tests/test_journal_forged.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers import trainer_args

from bundles.support import LIMITS
from trainer_hooks.journal import (
    KINDS,
    JournalCorruptError,
    JournalError,
    JournalLimitError,
    RolloutJournal,
    journal_dir,
    scan_journal,
)
from trainer_hooks.journal._kinds import (
    AT,
    MEDIA,
    Either,
    Exactly,
    Fields,
    Int,
    ListOf,
    MediaName,
    Packed,
    Rule,
    Time,
)
from trainer_hooks.rollout import RolloutLedger

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "journal_generator", ROOT / "tests" / "vectors" / "hostile" / "generate_journal.py"
)
generator = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(generator)  # type: ignore[union-attr]

MAX_CURSOR = LIMITS["MAX_CURSOR_BYTES"]
MAX_GROUP = LIMITS["MAX_GROUP_SIZE"]
#: A well-formed record of each kind: (seq, a, b, body value or None).
WELL_FORMED: dict[str, tuple[int, Any, Any, Any]] = {
    "take": (2, 0, {"cursor": {"offset": 1}, "n": 1, "end": 0}, {"samples": [{"index": 0}]}),
    "sample": (2, 0, 0, {"index": 0}),
    "group": (2, 0, 1, {"samples": [{"index": 0}]}),
    "consumed": (2, 0, [0], None),
    "recycled": (2, 0, {"n": 1}, {"samples": [{"index": 0}]}),
    "dropped": (2, 0, None, None),
    "sync": (-1, -1, 1, None),
}
NAME = "ab" * 32 + ".png"


class _Unencodable:
    """A value msgpack cannot encode (a data source's cursor holding an object)."""

    def __repr__(self) -> str:
        return "<unencodable>"


def outside(rule: Rule) -> list[tuple[str, Any]]:
    """Values just past ``rule``'s bound, and of another type: (sub-path, value), the sub-path
    being where inside the field the value goes ("" for the field itself, ".cursor", "[0]")."""
    if isinstance(rule, Int):
        return [("", rule.hi + 1), ("", rule.lo - 1), ("", True), ("", float(rule.lo)), ("", str(rule.lo))]
    if isinstance(rule, Exactly):
        return [("", "other"), ("", 0 if rule.value is None else None)]
    if isinstance(rule, Either):
        return [(p, v) for p, v in outside(rule.rules[-1]) if all(r.problem(v, "") for r in rule.rules)]
    if isinstance(rule, ListOf):
        good = inside(rule.item)
        bad = [("[0]", [v]) for _, v in outside(rule.item)][:2]
        return [("", [good] * (rule.most + 1)), ("", "not a list"), *bad]
    if isinstance(rule, Fields):
        base = {k: inside(r) for k, r in rule.fields}
        out: list[tuple[str, Any]] = [("", [1]), ("", {**base, "unknown": 1})]
        for key, sub in rule.fields:
            out += [(f".{key}{p}", {**base, key: v}) for p, v in outside(sub)]
        return out
    if isinstance(rule, Packed):
        deep: list[Any] = []
        for _ in range(rule.depth + 1):
            deep = [deep]
        return [("", b"x" * (rule.most - 4)), ("", deep), ("", _Unencodable())]
    if isinstance(rule, Time):
        return [("", -1.0), ("", float("nan")), ("", float("inf")), ("", "now")]
    if isinstance(rule, MediaName):
        return [("", "../../evil.png"), ("", NAME.upper()), ("", 7)]
    raise AssertionError(f"no values outside {rule!r}: a new kind of rule needs its case here")


def inside(rule: Rule) -> Any:
    """A value ``rule`` accepts."""
    if isinstance(rule, Int):
        return max(rule.lo, 0)
    if isinstance(rule, Exactly):
        return rule.value
    if isinstance(rule, Either):
        return inside(rule.rules[0])
    if isinstance(rule, ListOf):
        return [inside(rule.item)]
    if isinstance(rule, Fields):
        return {k: inside(r) for k, r in rule.fields}
    if isinstance(rule, Packed):
        return {"offset": 1}
    if isinstance(rule, Time):
        return 1.0
    if isinstance(rule, MediaName):
        return NAME
    raise AssertionError(rule)


#: The fields an append's arguments carry into the meta unchanged, by kind (the rest the writer
#: makes itself: seq, at, media; a take's b is a map whatever its arguments; a size is the
#: group's, reachable only past its bound, by a group of MAX_GROUP_SIZE + 1 samples).
REACHABLE = {
    "take": {"a", "b.cursor", "b.end", "b.n"},
    "sample": {"a", "b"},
    "group": {"a", "b"},
    "consumed": {"a", "b", "b[0]"},
    "recycled": {"a", "b.n"},
    "dropped": {"a"},
}


def _reachable(kind: str, field: str, sub: str, value: Any) -> bool:
    if f"{field}{sub}" not in REACHABLE.get(kind, ()):
        return False
    if (kind, field) in (("take", "b"), ("recycled", "b")) and sub == ".n":
        return value["n"] == MAX_GROUP + 1
    if (kind, field) == ("group", "b"):
        return value == MAX_GROUP + 1
    return True


def cases(writer: bool = False) -> list[Any]:
    """(kind, field, sub-path, value) for every kind of the table and every bounded field; with
    ``writer``, those an append can carry (:func:`_reachable`), else those a journal can hold
    (msgpack encodes them)."""
    out = []
    for name, kind in sorted(KINDS.items()):
        for field, rule in kind.fields.items():
            for sub, value in outside(rule):
                keep = _reachable(name, field, sub, value) if writer else _encodable(value)
                if keep:
                    out.append(pytest.param(name, field, sub, value, id=f"{name}-{field}{sub}-{_id(value)}"))
    return out


def _encodable(value: Any) -> bool:
    try:
        msgpack.packb(value)
    except (TypeError, ValueError):
        return False
    return True


def _id(value: Any) -> str:
    text = repr(value) if not isinstance(value, (bytes, list, dict)) else type(value).__name__
    return text[:24]


def _meta(kind: str, field: str, value: Any) -> list[Any]:
    seq, a, b, _ = WELL_FORMED[kind]
    meta = {"seq": seq, "at": 2.0, "a": a, "b": b, "media": []}
    meta[field] = value
    return [meta["seq"], kind, meta["at"], meta["a"], meta["b"], meta["media"]]


def _forge(tmp_path: Path, meta: list[Any], body_value: Any) -> tuple[Path, int]:
    """A journal holding group 0's take (seq 1), then the record ``meta``: its segment and that
    record's byte offset."""
    out = bytearray(generator._segment_header(2, 1))
    take = [1, "take", 1.0, 0, {"cursor": None, "n": 1, "end": 0}, []]
    out += generator._frame(2, take, generator._body({"samples": [{"index": 0}]}))
    offset = len(out)
    body = b"" if body_value is None else generator._body(body_value)
    out += generator._frame(2, meta, body)
    jdir = journal_dir(tmp_path / "ckpt")
    jdir.mkdir(parents=True)
    segment = jdir / generator.SEGMENT
    segment.write_bytes(bytes(out))
    return segment, offset


@pytest.mark.parametrize(("kind", "field", "sub", "value"), cases())
def test_the_reader_refuses_every_field_past_its_bound_naming_segment_and_byte(
    tmp_path, kind, field, sub, value
):
    segment, offset = _forge(tmp_path, _meta(kind, field, value), WELL_FORMED[kind][3])
    with pytest.raises(JournalCorruptError) as e:
        scan_journal(journal_dir(tmp_path / "ckpt"), lineage=generator.LINEAGE)
    text = str(e.value)
    assert text.startswith(
        f"{segment}: record at byte {offset} (seq 2 expected): {kind} record: {field}{sub}"
    ), text
    with pytest.raises(JournalCorruptError, match=rf"record at byte {offset} "):  # and a resume
        RolloutLedger(trainer_args(tmp_path, "run-b")).recover(None, sample_cls=dict)


def _append(journal: RolloutJournal, kind: str, field: str, sub: str, value: Any) -> None:
    """Append a record of ``kind`` whose ``field`` (at ``sub``) is ``value``, through the public
    append API, as a caller would (a field an append cannot set is skipped by the caller)."""
    good = [{"index": 0}]
    if kind == "take" and field == "a":
        journal.append_take(value, good)
    elif kind == "take" and sub == ".cursor":
        journal.append_take(0, good, value["cursor"])
    elif kind == "take" and sub == ".end":
        journal.append_take(0, good, batch_end=value["end"])
    elif kind in ("take", "group", "recycled") and field == "b":  # a size: the group's
        journal.append(kind, 0, [{"index": 0}] * (MAX_GROUP + 1))
    elif kind == "sample":
        journal.append_sample(value if field == "a" else 0, value if field == "b" else 0, {"index": 0})
    elif kind == "consumed":
        journal.record_consumed(value if field == "a" else 0, value if field == "b" else [0])
    else:  # group, recycled, dropped: a is the group id
        journal.append(kind, value, *([good] if kind != "dropped" else []))


@pytest.mark.parametrize(("kind", "field", "sub", "value"), cases(writer=True))
def test_the_writer_refuses_what_its_reader_refuses_before_anything_is_written(
    tmp_path, kind, field, sub, value
):
    jdir = tmp_path / "journal"
    journal = RolloutJournal(jdir, lineage="limits", interval=0.05)
    try:
        with pytest.raises(JournalLimitError) as e:
            _append(journal, kind, field, sub, value)
        text = str(e.value)
        assert text.startswith(f"{jdir}: {kind} record: {field}"), text
        assert "nothing was written" in text
        assert journal.failure is None
        journal.append_dropped(3)  # the journal goes on
        journal.flush()
    finally:
        journal.close()
    scan = scan_journal(jdir, lineage="limits")
    assert [(r.seq, r.kind) for r in scan.records] == [(1, "dropped")] and not scan.problems


def test_the_writer_refuses_a_seq_past_the_bound_and_a_first_seq_below_one(tmp_path):
    with pytest.raises(JournalLimitError, match="first_seq: expected an int >= 1, found 0"):
        RolloutJournal(tmp_path / "j0", lineage="limits", first_seq=0)
    journal = RolloutJournal(tmp_path / "j1", lineage="limits", first_seq=LIMITS["MAX_INT"] + 1)
    try:
        with pytest.raises(
            JournalLimitError, match=rf"dropped record: seq: {LIMITS['MAX_INT'] + 1}, at most"
        ):
            journal.append_dropped(1)
    finally:
        journal.close()
    assert not list((tmp_path / "j1").glob("segment-*"))


def test_a_take_whose_cursor_is_1_5_mib_is_refused_and_the_run_resumes(tmp_path):
    """The issue's case: it was appended and flushed, and every later recover() refused the
    journal, so the run could never resume."""
    args = trainer_args(tmp_path, "run-a", "--rollout-journal-interval", "0.05")
    ledger = RolloutLedger(args)
    ledger.take([{"index": 0}], {"offset": 1})
    cursor = {"blob": b"x" * (3 << 19)}  # 1.5 MiB
    with pytest.raises(JournalLimitError) as e:
        ledger.take([{"index": 1}], cursor)
    found = len(msgpack.packb(cursor))
    assert f"take record: b.cursor: {found} bytes encoded, at most {MAX_CURSOR}" in str(e.value)
    ledger.take([{"index": 2}], {"offset": 3})
    ledger.flush()
    ledger.close()
    state = RolloutLedger(trainer_args(tmp_path, "run-b", "--rollout-journal-interval", "0.05")).recover(
        None, sample_cls=dict
    )
    assert state.cursor == {"offset": 3}
    assert sorted(g.gid for g in state.pending) == [0, 2]


def test_a_forged_take_with_gid_2_64_minus_1_is_refused_at_resume(tmp_path):
    """It was accepted, and the run died at its first step (the next gid does not fit a record)."""
    segment, offset = _forge(
        tmp_path,
        [2, "take", 2.0, 2**64 - 1, {"cursor": None, "n": 1, "end": 2**64 - 1}, []],
        {"samples": [{"index": 1}]},
    )
    with pytest.raises(JournalCorruptError) as e:
        RolloutLedger(trainer_args(tmp_path, "run-b")).recover(None, sample_cls=dict)
    assert str(e.value).startswith(
        f"{segment}: record at byte {offset} (seq 2 expected): take record: a: expected a group id "
        f"(an int in 0..{LIMITS['MAX_GROUP_ID']}), found {2**64 - 1}"
    ), str(e.value)


def test_a_record_with_every_field_at_its_bound_fits_the_meta_limit():
    """The meta bound is room for every field at its bound at once, so a record the writer
    accepts field by field is never refused whole by its size."""
    longest = "a" * 64 + ".abcdefghijklmnop" * 3
    assert MEDIA.problem([longest], "media") is None
    media = [longest] * LIMITS["MAX_RECORD_MEDIA"]
    cursor = b"x" * (MAX_CURSOR - 5)
    assert len(msgpack.packb(cursor)) == MAX_CURSOR
    gid = LIMITS["MAX_GROUP_ID"]
    seq = LIMITS["MAX_INT"]
    biggest = [
        [seq, "take", 1e300, gid, {"cursor": cursor, "n": MAX_GROUP, "end": gid}, media],
        [seq, "consumed", 1e300, seq, [gid] * LIMITS["MAX_CONSUMED_GROUPS"], media],
    ]
    for meta in biggest:
        assert KINDS[meta[1]].problem(*meta[:1], *meta[2:]) is None
        assert len(msgpack.packb(meta)) <= LIMITS["MAX_RECORD_META_BYTES"]
    assert AT.problem(1e300, "at") is None


def test_a_record_naming_more_media_than_its_bound_fails_the_journal_before_it_is_written(tmp_path):
    """The media a body references are known only once the writer's thread has encoded it: past
    the bound there, the journal fails, named (every later append and flush raises it), and the
    record is never written; the records before it stay readable."""
    from bundles import MediaRef

    shot = tmp_path / "shot.png"
    shot.write_bytes(generator.PNG)
    digest = "sha256:" + generator.PNG_NAME[:64]
    most = LIMITS["MAX_RECORD_MEDIA"]
    refs = [MediaRef(digest, len(generator.PNG), f".s{i}", str(shot)) for i in range(most + 1)]
    jdir = tmp_path / "journal"
    journal = RolloutJournal(jdir, lineage="limits", interval=0.05)
    try:
        journal.append_dropped(0)
        journal.flush()
        journal.append_sample(1, 0, {"index": 0, "images": refs})
        with pytest.raises(JournalError) as e:
            journal.flush()
        assert f"record 2: sample record: media: {most + 1} items, at most {most}" in str(e.value)
        with pytest.raises(JournalError):
            journal.append_dropped(2)
    finally:
        with pytest.raises(JournalError):
            journal.close()
    scan = scan_journal(jdir, lineage="limits")
    assert [(r.seq, r.kind) for r in scan.records] == [(1, "dropped")] and not scan.problems
