"""The rollout journal's recovery on hostile input (issue 24, R1-R6): the corpus of
``tests/vectors/hostile/journal/`` (``generate_journal.py``), one test per attack. Real files, a
real FIFO and real symlinks made at test time, real subprocesses where a hang must be shown not
to happen."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import trainer_args

from bundles import BundleError, BundleVerificationError
from trainer_hooks.journal import KINDS, JournalCorruptError, JournalError, journal_dir, scan_journal
from trainer_hooks.rollout import RolloutLedger, materialize

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "vectors" / "hostile" / "journal"
TABLE: dict[str, dict] = json.loads((CORPUS / "expected.json").read_text())
_spec = importlib.util.spec_from_file_location("journal_generator", CORPUS.parent / "generate_journal.py")
generator = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(generator)  # type: ignore[union-attr]

PRIVATE = b"PRIVATE: a file of the user's that no journal may read"
#: how long a refusal may take (a hang was killed after 30 s on the previous release)
PROMPT_S = 20.0


def vector(tmp_path: Path, name: str) -> Path:
    """A scratch copy of vector ``name`` as ``tmp_path/ckpt`` (the ``--save``/``--load`` of
    :func:`trainer_args`), with what git cannot hold made now."""
    save = tmp_path / "ckpt"
    shutil.copytree(CORPUS / name, save, symlinks=True)
    outside = tmp_path / "private" / "secret.png"
    outside.parent.mkdir()
    outside.write_bytes(PRIVATE)
    generator.make_specials(save, name, outside)
    return save


def args_of(tmp_path: Path):
    return trainer_args(tmp_path, "run-b", "--rollout-journal-interval", "0.05")


def recover(tmp_path: Path, name: str) -> None:
    row = TABLE[name]
    RolloutLedger(args_of(tmp_path)).recover(
        row["restored_step"], sample_cls=dict, verify_media=row["verify_media"]
    )


def assert_refused(error: BaseException, save: Path, name: str) -> None:
    """The table's error class, its message, the file it must name; never a guess."""
    row = TABLE[name]
    text = str(error)
    assert type(error).__name__ == row["error"], f"{type(error).__name__}: {text}"
    assert row["message"] in text, text
    assert str(save / row["names"]) in text, text
    assert "torn tail" not in text.split(": ")[-1]


def files_under(root: Path) -> set[Path]:
    return {Path(d) / f for d, _, fs in os.walk(root) for f in fs}


def test_the_journal_table_lists_every_vector_and_the_generator_agrees(tmp_path):
    assert json.loads(json.dumps(generator.vectors())) == TABLE
    assert {r["attack"] for r in TABLE.values()} == {"R1", "R2", "R3", "R4", "R5", "R6"}
    for name in TABLE:
        generator.build(name, tmp_path / name)  # deterministic: the same bytes every time
        made = {p.relative_to(tmp_path / name): p.read_bytes() for p in files_under(tmp_path / name)}
        committed = {p.relative_to(CORPUS / name): p.read_bytes() for p in files_under(CORPUS / name)}
        assert made == committed, name


def healthy(tmp_path: Path, version: int) -> Path:
    """The vectors' journal without the attack (8 groups, all consumed by steps 0 and 1)."""
    save = tmp_path / "ckpt"
    segment, _ = generator._records(version)
    generator._write(save, segment)
    return save


@pytest.mark.parametrize("version", [2, 1])
def test_the_vectors_journal_without_the_attack_resumes_cleanly(tmp_path, version):
    """One bit (or one name) away from each vector: a journal that resumes (version 1 too), with
    every group consumed at or before the restored step, so none comes back."""
    healthy(tmp_path, version)
    state = RolloutLedger(args_of(tmp_path)).recover(1, sample_cls=dict)
    assert state.pending == [] and state.completed == [] and not state.problems
    assert state.stats["records_replayed"] == 18
    # At step 0 the groups step 1 consumed come back, generations kept.
    state = RolloutLedger(args_of(tmp_path)).recover(0, sample_cls=dict)
    assert sorted(g for g, _ in state.completed) == [4, 5, 6, 7]


@pytest.mark.parametrize("name", ["r1-media-traversal", "r1-media-traversal-v1"])
def test_r1_a_media_name_with_dot_dot_is_refused_before_anything_is_created(tmp_path, name):
    save = vector(tmp_path, name)
    before = files_under(tmp_path)
    with pytest.raises(JournalError) as e:
        recover(tmp_path, name)
    assert_refused(e.value, save, name)
    # Nothing was created: no evil.png beside the run's media directory, nothing in it.
    assert files_under(tmp_path) - before == set()
    assert [p for p in files_under(tmp_path) if p.name == "evil.png"] == [save / "rollout" / "evil.png"]


@pytest.mark.parametrize("name", ["r2-media-symlink", "r2-media-symlink-v1"])
def test_r2_journal_media_linked_outside_the_save_is_never_read(tmp_path, name):
    save = vector(tmp_path, name)
    before = files_under(tmp_path)
    for verify in (False, True):  # without verification it was copied in; with it, read first
        with pytest.raises(BundleError) as e:
            RolloutLedger(args_of(tmp_path)).recover(1, sample_cls=dict, verify_media=verify)
        assert not isinstance(e.value, BundleVerificationError)  # refused before the read
        assert_refused(e.value, save, name)
        made = files_under(tmp_path) - before
        assert not [p for p in made if p.read_bytes() == PRIVATE], made


@pytest.mark.parametrize("name", ["r3-consumed-step-flip", "r3-consumed-step-flip-v1"])
def test_r3_a_flipped_bit_in_a_durable_consumed_step_fails_closed(tmp_path, name):
    save = vector(tmp_path, name)
    for step in (0, 1, 2, None):  # whichever step was restored, nothing is guessed
        with pytest.raises(JournalError) as e:
            RolloutLedger(args_of(tmp_path)).recover(step, sample_cls=dict)
        assert_refused(e.value, save, name)
    with pytest.raises(JournalError):  # inspect and every reader refuse it too
        scan_journal(journal_dir(save), lineage=generator.LINEAGE)


@pytest.mark.parametrize("name", ["r4-frame-header-flip", "r4-frame-header-flip-v1"])
def test_r4_a_flipped_bit_in_a_durable_frame_header_is_corruption_not_a_torn_tail(tmp_path, name):
    save = vector(tmp_path, name)
    with pytest.raises(JournalError) as e:
        recover(tmp_path, name)
    assert_refused(e.value, save, name)
    assert "a valid sync mark follows" in str(e.value) and "never durable" not in str(e.value)


RECOVER = """
import sys
sys.path.insert(0, {tests!r})
from helpers import trainer_args
from trainer_hooks.rollout import RolloutLedger
from pathlib import Path
args = trainer_args(Path({tmp!r}), "run-b", "--rollout-journal-interval", "0.05")
try:
    RolloutLedger(args).recover(1, sample_cls=dict)
except Exception as e:
    print(f"{{type(e).__name__}}: {{e}}", file=sys.stderr)
    sys.exit(3)
sys.exit(0)
"""


def run(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PROMPT_S * 3, cwd=ROOT)
    return done, time.monotonic() - started


def assert_one_line_naming(done: subprocess.CompletedProcess[str], path: Path, what: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(path) in lines[0] and what in lines[0], lines


def test_r5_a_fifo_named_like_a_segment_hangs_neither_resume_nor_inspect(tmp_path):
    name = "r5-segment-fifo"
    save = vector(tmp_path, name)
    fifo = save / TABLE[name]["names"]
    assert fifo.is_fifo()
    code = RECOVER.format(tests=str(ROOT / "tests"), tmp=str(tmp_path))
    done, took = run([sys.executable, "-c", code])
    assert took < PROMPT_S and done.returncode == 3, (took, done.stderr)
    assert done.stderr.startswith(TABLE[name]["error"] + ": "), done.stderr
    assert_one_line_naming(done, fifo, TABLE[name]["message"])
    for target in (journal_dir(save), save):
        done, took = run([sys.executable, "-m", "trainer_hooks.cli", "inspect", str(target)])
        assert took < PROMPT_S and done.returncode == 1 and done.stdout == "", (took, done)
        assert_one_line_naming(done, fifo, TABLE[name]["message"])


def test_r6_a_directory_named_like_a_segment_is_one_named_error(tmp_path):
    name = "r6-segment-directory"
    save = vector(tmp_path, name)
    with pytest.raises(BundleError) as e:
        recover(tmp_path, name)
    assert not isinstance(e.value, OSError)  # was a raw IsADirectoryError
    assert_refused(e.value, save, name)
    done, took = run([sys.executable, "-m", "trainer_hooks.cli", "inspect", str(journal_dir(save))])
    assert took < PROMPT_S and done.returncode == 1 and done.stdout == "", done
    assert_one_line_naming(done, save / TABLE[name]["names"], TABLE[name]["message"])


def test_a_torn_tail_is_one_only_where_a_crash_can_tear_a_write(tmp_path):
    """Not an attack of its own: the rule R4's fix rests on. A cut after the last sync mark of
    the last segment is a torn tail (one line, the records before it kept), also when the next
    segment continues at the seq it cut off (a resumed run's); followed by one that does not,
    it was durable: corruption."""
    segment, at = generator._records(2)
    jdir = journal_dir(healthy(tmp_path, 2))
    first = jdir / generator.SEGMENT
    first.write_bytes(segment[: at["consumed1"] + 7])  # the last sync mark and record 18 cut off
    scan = scan_journal(jdir, lineage=generator.LINEAGE)
    assert [r.seq for r in scan.records] == list(range(1, 18)) and scan.torn_seq == 18
    (line,) = scan.problems
    assert f"{first}: torn tail at byte {at['consumed1']}" in line and "never durable" in line
    resumed = jdir / f"segment-000000000018-{generator.LINEAGE}-000.rjl"
    resumed.write_bytes(
        generator._segment_header(2, 18) + generator._frame(2, [18, "dropped", 9.0, 3, None, []])
    )
    scan = scan_journal(jdir, lineage=generator.LINEAGE)
    assert [r.seq for r in scan.records][-2:] == [17, 18] and scan.torn_seq is None
    resumed.unlink()
    skipping = jdir / f"segment-000000000019-{generator.LINEAGE}-000.rjl"
    skipping.write_bytes(
        generator._segment_header(2, 19) + generator._frame(2, [19, "dropped", 9.0, 3, None, []])
    )
    with pytest.raises(JournalError, match=rf"{first}: record at byte {at['consumed1']} \(seq 18 expected\)"):
        scan_journal(jdir, lineage=generator.LINEAGE)


def test_a_version_1_journal_resumes_and_the_run_goes_on_in_version_2(tmp_path):
    healthy(tmp_path, 1)
    ledger = RolloutLedger(args_of(tmp_path))
    state = ledger.recover(0, sample_cls=dict)
    assert sorted(g for g, _ in state.completed) == [4, 5, 6, 7]
    ledger.record_consumed(1, [4, 5, 6, 7])
    ledger.close()
    jdir = journal_dir(tmp_path / "ckpt")
    (old, new) = sorted(jdir.glob("segment-*.rjl"))
    assert old.read_bytes().startswith(b"RBJOURNAL1\n") and new.read_bytes().startswith(b"RBJOURNAL2\n")
    scan = scan_journal(jdir, lineage=generator.LINEAGE)
    assert [r.seq for r in scan.records] == list(range(1, 20)) and not scan.problems
    state = RolloutLedger(args_of(tmp_path)).recover(0, sample_cls=dict)
    assert sorted(g for g, _ in state.completed) == [4, 5, 6, 7]  # consumed by step 1 twice: back


# -- every record kind of the table, malformed (issue 31, item 4) -------------------------------
#: A well-formed record of each kind: (seq, a, b, body value or None). The test below fails for a
#: kind added to the table without an example here, so a new kind is checked like the others.
WELL_FORMED: dict[str, tuple[int, int, object, object]] = {
    "take": (1, 0, {"cursor": None, "n": 1, "end": 0}, {"samples": [{"index": 0}]}),
    "sample": (2, 0, 0, {"index": 0}),
    "group": (2, 0, 1, {"samples": [{"index": 0}]}),
    "consumed": (2, 0, [0], None),
    "recycled": (2, 0, {"n": 1}, {"samples": [{"index": 0}]}),
    "dropped": (2, 0, None, None),
    "sync": (-1, -1, 1, None),
}


def test_every_kind_of_the_table_has_a_well_formed_example():
    assert set(WELL_FORMED) == set(KINDS)


def _kind_journal(tmp_path: Path, kind: str, how: str) -> tuple[Path, int]:
    """A journal holding group 0's take (seq 1), then one record of ``kind`` malformed ``how``
    (``meta``: its ``b`` is no value the kind has; ``body``: a body where the kind has none, else
    a body of another shape); returns the segment and that record's byte offset."""
    seq, a, b, value = WELL_FORMED[kind]
    if how == "meta":
        b = "malformed"
    if how == "body":
        value = 42 if value is not None else {"samples": []}  # wrong shape / a body where none is
    body = b"" if value is None else generator._body(value)
    take_seq, take_a, take_b, take_value = WELL_FORMED["take"]
    out = bytearray(generator._segment_header(2, 1))
    if kind != "take":
        out += generator._frame(2, [take_seq, "take", 1.0, take_a, take_b, []], generator._body(take_value))
    offset = len(out)
    out += generator._frame(2, [seq, kind, 2.0, a, b, []], body)
    jdir = journal_dir(tmp_path / "ckpt")
    jdir.mkdir(parents=True)
    segment = jdir / generator.SEGMENT
    segment.write_bytes(bytes(out))
    return segment, offset


@pytest.mark.parametrize("how", ["meta", "body"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_malformed_record_of_every_kind_is_a_journal_error_naming_segment_and_byte(tmp_path, kind, how):
    """Parametrised over the table itself: for each kind, a malformed meta and a malformed body
    are refused, at the scan or when a resume decodes the record, as a JournalCorruptError naming
    the segment and the record's byte offset; never a KeyError or a TypeError from the replay."""
    segment, offset = _kind_journal(tmp_path, kind, how)
    with pytest.raises(JournalCorruptError) as e:
        ledger = RolloutLedger(args_of(tmp_path))
        state = ledger.recover(None, sample_cls=dict)
        for _, group in state.completed:  # a finished group is decoded when training takes it
            materialize(group)
    assert f"{segment}: record at byte {offset}" in str(e.value), str(e.value)
    assert kind in str(e.value), str(e.value)


@pytest.mark.parametrize("kind", sorted(k for k, v in KINDS.items() if v.body is not None))
def test_a_record_of_a_kind_with_a_body_but_none_is_refused_at_the_scan(tmp_path, kind):
    _, a, b, _ = WELL_FORMED[kind]
    jdir = journal_dir(tmp_path / "ckpt")
    jdir.mkdir(parents=True)
    segment = jdir / generator.SEGMENT
    segment.write_bytes(generator._segment_header(2, 1) + generator._frame(2, [1, kind, 1.0, a, b, []]))
    with pytest.raises(
        JournalCorruptError, match=rf"{segment}: record at byte \d+ .*{kind} record: expected a body"
    ):
        scan_journal(jdir, lineage=generator.LINEAGE)
