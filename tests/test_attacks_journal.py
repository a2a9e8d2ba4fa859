"""An attacker's and a user's read of the training side of issue 36 (journal, resume,
checkpoints, replay reports, inspect): each test is an attack that succeeded on the wave's
code, kept as the proof of its fix. The rule they hold: what the journal's writer accepts its
reader reads (a record the reader refuses makes a run unresumable), and what a checkpoint or a
report forges is refused, named, before it is spent."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers import trainer_args

from bundles import BundleFormatError
from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, Sample
from trainer_hooks.checkpoints import checkpoint_path
from trainer_hooks.journal import JournalCorruptError, JournalLimitError, RolloutJournal, scan_journal
from trainer_hooks.rollout import RolloutLedger


@pytest.mark.parametrize(
    "cursor", [{(0, 1): "x"}, {"state": [{((),): 1}]}], ids=["tuple-key", "nested-tuple-key"]
)
def test_a_cursor_with_a_container_map_key_is_refused_by_the_writer_and_the_run_resumes(tmp_path, cursor):
    """msgpack encodes a tuple key as an array, which the reader cannot make a key again: the
    take was written, and every later resume refused the journal (unresumable)."""
    ledger = RolloutLedger(trainer_args(tmp_path, "run-a", "--rollout-journal-interval", "0.05"))
    ledger.take([{"index": 0}], {"offset": 1})
    with pytest.raises(JournalLimitError) as e:
        ledger.take([{"index": 1}], cursor)
    assert "take record: b.cursor: a map key that is not a scalar, found" in str(e.value), str(e.value)
    assert "nothing was written" in str(e.value)
    ledger.take([{"index": 2}], {"offset": 3, 4: None, None: b"x"})
    ledger.flush()
    ledger.close()
    state = RolloutLedger(trainer_args(tmp_path, "run-b", "--rollout-journal-interval", "0.05")).recover(
        None, sample_cls=dict
    )
    assert state.cursor == {"offset": 3, 4: None, None: b"x"}
    assert sorted(g.gid for g in state.pending) == [0, 2]


# -- a checkpoint's meta.journal.last_shipment, forged ----------------------------------------------
def _run_args(tmp_path: Path, run: str) -> Any:
    return trainer_args(tmp_path, run, "--rollout-journal-interval", "0.05", batch_size=2)


def _groups() -> list[list[Sample]]:
    return [[Sample(group_index=g, index=g * 2 + i, prompt=f"p{g}") for i in range(2)] for g in range(4)]


async def _gen(args: Any, s: Sample) -> Sample:
    s.tokens = [1, 2, s.index]
    s.reward = 1.0
    s.status = Sample.Status.COMPLETED
    return s


def _saved(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A local run that trains step 0 and saves it: its checkpoint's manifest and what it holds."""
    fn = FullyAsyncRolloutFn(_run_args(tmp_path, "run-0"), ListDataSource(_groups()), generate_sample=_gen)
    try:
        fn(0)
        fn.save(0).result()
    finally:
        fn.close()
    manifest = Path(checkpoint_path(tmp_path / "ckpt", 0)) / "manifest.json"
    return manifest, json.loads(manifest.read_text())


def _refused(tmp_path: Path) -> str:
    """The message of the BundleFormatError a resume from step 0 raises."""
    fn = FullyAsyncRolloutFn(_run_args(tmp_path, "run-1"), ListDataSource(_groups()), generate_sample=_gen)
    try:
        with pytest.raises(BundleFormatError) as e:
            fn.load(0)
    finally:
        fn.close()
    return str(e.value)


@pytest.mark.parametrize(
    "forged",
    [
        "segment-" + "1" * 5000 + "-{lineage}-000.rjs",
        "segment-000000000001-{lineage}-" + "9" * 5000 + ".rjs",
        "segment-000000000001-../../../../etc-000.rjs",
        "segment-000000000001-another-lineage-000.rjs",
        "segment-000000000001-{lineage}\x1b[2J-000.rjs",
    ],
    ids=["5000-digit-seq", "5000-digit-attempt", "dot-dot", "other-lineage", "escape"],
)
def test_a_forged_last_shipment_is_refused_naming_the_field(tmp_path, forged):
    """A seq of 5000 digits escaped as ``ValueError`` (``int()``'s digit limit); a name of
    another lineage was accepted (on a store: its absence waited out the retries and was called
    a lagging listing, or a shipment planted under it passed the check)."""
    manifest, doc = _saved(tmp_path)
    lineage = doc["meta"]["journal"]["lineage"]
    doc["meta"]["journal"]["last_shipment"] = forged.replace("{lineage}", lineage)
    manifest.write_text(json.dumps(doc))
    text = _refused(tmp_path)
    assert text.startswith(
        f"{checkpoint_path(tmp_path / 'ckpt', 0)}: meta.journal.last_shipment: expected a shipment name of "
        f"the checkpoint's lineage (segment-<seq>-{lineage}-<attempt>.rjs), found 'segment-"
    ), text
    assert "\x1b" not in text and len(text) < 600, text


# -- inspect ----------------------------------------------------------------------------------------
def test_inspect_counts_each_lineages_own_segments_and_bytes(tmp_path, capsys):
    """A journal holding two lineages (a new run saving where an old one did) showed every
    segment and byte of the directory under each lineage."""
    from trainer_hooks.cli import main

    jdir = tmp_path / "save" / "rollout" / "journal"
    sizes = {}
    for lineage, n in (("old", 3), ("new", 1)):
        journal = RolloutJournal(jdir, lineage=lineage, interval=0.05)
        try:
            for gid in range(n):
                journal.append_dropped(gid)
                journal.flush()
                journal.roll()  # one segment per record
        finally:
            journal.close()
        sizes[lineage] = sorted(p.stat().st_size for p in jdir.glob(f"segment-*-{lineage}-*.rjl"))
    assert main(["inspect", str(tmp_path / "save"), "--json"]) == 0
    found = {x["lineage"]: x for x in json.loads(capsys.readouterr().out)["journal"]["lineages"]}
    for lineage, records in (("old", 3), ("new", 1)):
        assert found[lineage]["records"] == records
        assert (found[lineage]["segments"], found[lineage]["bytes"]) == (
            len(sizes[lineage]),
            sum(sizes[lineage]),
        ), (lineage, found[lineage], sizes)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lineage", 5),
        ("lineage", "a/b"),
        ("lineage", "\x1b[2J"),
        ("lineage", "x" * 257),
        ("watermark", "x"),
        ("watermark", 1e300),
        ("watermark", -5),
        ("compacted_upto", None),
        ("next_gid", 2**70),
        ("last_shipment_seq", "\x1b]0;t\x07"),
        ("", "x"),
    ],
)
def test_a_forged_journal_meta_field_is_refused_naming_it(tmp_path, field, value):
    """A lineage of 5 was taken: the resumed run wrote segments whose header its reader refuses
    (every later resume failed); other fields escaped as ValueError, TypeError or
    AttributeError, or killed the run at its first step (a watermark of 1e300)."""
    manifest, doc = _saved(tmp_path)
    if field:
        doc["meta"]["journal"][field] = value
    else:
        doc["meta"]["journal"] = value
    manifest.write_text(json.dumps(doc))
    text = _refused(tmp_path)
    named = "meta.journal" + (f".{field}" if field else "")
    assert text.startswith(f"{checkpoint_path(tmp_path / 'ckpt', 0)}: {named}: expected "), text
    assert "\x1b" not in text and len(text) < 600, text


# -- what an error message holds of a forged file ---------------------------------------------------
def test_a_segment_header_without_a_lineage_is_named_in_a_bounded_line(tmp_path):
    """Its whole header (up to the 8 MiB a header may hold) was the message."""
    header = msgpack.packb({"lineage": 5, "pad": "x" * (4 << 20)})
    length = struct.pack("<I", len(header))
    jdir = tmp_path / "journal"
    jdir.mkdir()
    segment = jdir / "segment-000000000001-hostile-000.rjl"
    segment.write_bytes(
        b"RBJOURNAL2\n" + length + struct.pack("<I", zlib.crc32(header, zlib.crc32(length))) + header
    )
    with pytest.raises(JournalCorruptError) as e:
        scan_journal(jdir)
    text = str(e.value)
    assert text.startswith(f"{segment}: segment header: expected a map with a lineage, found "), text[:300]
    assert len(text) < 400, len(text)


@pytest.mark.parametrize(
    "doc",
    [
        {"format": "A" * (4 << 20), "version": 1, "samples": []},
        {"format": "rollout-bundle-replay", "version": ["v"] * (1 << 20), "samples": []},
        {
            "format": "rollout-bundle-replay",
            "version": 1,
            "samples": [{"position": 0, "index": [0] * (1 << 20)}],
        },
    ],
    ids=["format", "version", "index"],
)
def test_a_replay_report_with_a_huge_field_is_refused_in_a_bounded_line(tmp_path, doc):
    """The field's whole repr (up to the 16 MiB a report may hold) was the message."""
    from trainer_hooks.replay import ReportError, load_replay_report

    report = tmp_path / "r.json"
    report.write_text(json.dumps(doc))
    with pytest.raises(ReportError) as e:
        load_replay_report(report)
    assert str(e.value).startswith(f"{report}: ") and len(str(e.value)) < 400, str(e.value)[:300]
