"""The rollout journal (issue 19): records, durability off the event loop, recovery at the trainer's
restored step, sibling-level restore, damaged journals named in one line, the fingerprint."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from helpers import digest_of, trainer_args
from helpers.waiting import wait_until

from bundles import BundleNotFoundError, MediaRef, decode_sample, encode_sample, open_bundle
from bundles.support import on_fault_point
from trainer_hooks import (
    FullyAsyncRolloutFn,
    IncompatibleResumeError,
    ListDataSource,
    Sample,
    checkpoint_path,
    release_run_media,
    run_media_dir,
    store_media,
)
from trainer_hooks.journal import JournalCorruptError, JournalError, RolloutJournal, journal_dir, scan_journal
from trainer_hooks.testing import png_bytes

# The journal_place fixture: one test per journal sink (a local directory, SeaweedFS).
pytest_plugins = ("helpers.journal_sinks",)

SIZE = 2


def make_args(tmp_path: Path, run: str, *extra: str):
    """A run journaling every 50 ms (the tests wait for flushes, not for a second)."""
    return trainer_args(tmp_path, run, "--rollout-journal-interval", "0.05", *extra, batch_size=2)


def prompts(n_groups: int, size: int = SIZE) -> list[list[Sample]]:
    return [
        [Sample(group_index=g, index=g * size + i, prompt=f"prompt {g}") for i in range(size)]
        for g in range(n_groups)
    ]


class SampleGen:
    """Generates one sample: stores a screenshot in the run directory, answers; samples whose
    index is in ``hold`` wait for ``gate``."""

    def __init__(self, hold: set[int] = frozenset()) -> None:
        self.hold = set(hold)
        self.gate = threading.Event()
        self.calls: list[int] = []
        self.finished: set[int] = set()

    async def __call__(self, args, s):
        self.calls.append(s.index)
        if s.index in self.hold:
            while not self.gate.is_set():
                await asyncio.sleep(0.005)
        ref = store_media(args, png_bytes(4, 4, (s.group_index % 256, s.index % 256, 7)))
        s.multimodal_inputs = {"images": [ref]}
        s.tokens = [*range(200), s.index]
        s.rollout_log_probs = [-0.5] * 50
        s.response = f"answer {s.index}"
        s.response_length = 1
        s.reward = float(s.index)
        s.status = Sample.Status.COMPLETED
        self.finished.add(s.index)
        return s


def indices(groups) -> list[int]:
    return [s.index for g in groups for s in g]


def drain_all(fn, first_step: int) -> dict[int, list[int]]:
    """Train steps from ``first_step`` until the data source is exhausted; then close."""
    from trainer_hooks import RolloutWorkerError

    got: dict[int, list[int]] = {}
    step = first_step
    while True:
        try:
            got[step] = indices(fn.drain(timeout=10, step=step))
        except RolloutWorkerError:
            break
        step += 1
    fn.close()
    return got


def flat(got: dict[int, list[int]]) -> list[int]:
    return [i for s in sorted(got) for i in got[s]]


def test_codec_round_trip_through_the_public_functions(tmp_path):
    ref = MediaRef.from_bytes(b"abc", ".png")
    data = encode_sample(
        {"tokens": [1, 2, 3], "t": (1, "x"), "img": ref}, resolve_ref=lambda r, w: r.with_path(None)
    )
    back = decode_sample(data, {ref.filename: ref.with_path(tmp_path / "f.png")})
    assert (
        back["tokens"] == [1, 2, 3] and back["t"] == (1, "x") and back["img"].path == str(tmp_path / "f.png")
    )
    with pytest.raises(Exception, match="truncated"):
        decode_sample(data[:-2], {ref.filename: ref})
    with pytest.raises(Exception, match="img"):  # an unknown reference names its key path
        decode_sample(data, {})


def test_records_become_durable_on_their_own_with_no_barrier(tmp_path):
    """The writer makes what is appended durable by itself, every interval: no ``flush()``, no
    checkpoint, no ``close()`` (a writer that wrote only at barriers would lose every record
    since the last checkpoint at a crash, and the crash tests could not tell). Records appended
    in three bursts: each burst is read back from the segment on disk, by another reader, before
    the next is appended."""
    args = make_args(tmp_path, "run-a")
    journal = RolloutJournal(journal_dir(args.save), lineage="L1", interval=0.05)
    try:
        for burst in range(3):
            for k in range(4):
                journal.append_take(burst * 4 + k, [{"index": burst * 4 + k, "prompt": "p"}], {"offset": k})
            last = journal.last_seq
            wait_until(lambda last=last: journal.stats()["durable_seq"] >= last, f"seq {last} durable", 60)
            on_disk = scan_journal(journal_dir(args.save), decode_bodies=False)
            assert [r.seq for r in on_disk.records] == list(range(1, last + 1))
            assert on_disk.synced_seq >= last
        assert journal.stats()["flushes"] >= 3
    finally:
        journal.close()


def test_records_are_durable_after_flush_and_media_are_linked_at_append_time(tmp_path):
    args = make_args(tmp_path, "run-a")
    run_dir = run_media_dir(args)
    ref = store_media(args, png_bytes(3, 3, (1, 2, 3)))
    journal = RolloutJournal(journal_dir(args.save), lineage="L1", interval=0.05, media_roots=[run_dir])
    journal.append_take(0, [{"index": 0, "prompt": "p"}], {"offset": 1})
    journal.append_sample(0, 0, {"index": 0, "img": str(run_dir / ref.filename), "tokens": [1, 2]})
    journal.append_group(0, None)
    journal.record_consumed(3, [0])
    assert journal.flush() == 4
    stats = journal.stats()
    assert stats["records"] == 4 and stats["media_linked"] == 1 and stats["durable_seq"] == 4
    linked = journal_dir(args.save) / "media" / ref.filename
    assert os.stat(linked).st_ino == os.stat(run_dir / ref.filename).st_ino  # a link, not a copy
    journal.close()
    release_run_media(args)  # a teardown of the run cannot take what the journal holds
    assert digest_of(linked.read_bytes()) == ref.digest
    scan = scan_journal(journal_dir(args.save), lineage="L1")
    assert [(r.seq, r.kind) for r in scan.records] == [
        (1, "take"),
        (2, "sample"),
        (3, "group"),
        (4, "consumed"),
    ]
    assert scan.records[1].media == [ref.filename] and not scan.problems
    assert scan.synced_seq == 4 and scan.last_sync_at is not None


def test_fsync_runs_on_the_journal_thread_never_on_the_caller(tmp_path):
    args = make_args(tmp_path, "run-a")
    threads = []
    with on_fault_point("journal.fsync", lambda *a: threads.append(threading.current_thread().name)):
        journal = RolloutJournal(journal_dir(args.save), lineage="L", interval=0.02)
        for i in range(50):
            journal.append_sample(0, i, {"index": i, "tokens": list(range(100))})
        journal.flush()
        journal.close()
    assert threads and set(threads) == {"rollout-journal"}


def test_a_torn_tail_is_ignored_and_named_in_one_line(tmp_path):
    args = make_args(tmp_path, "run-a")
    journal = RolloutJournal(journal_dir(args.save), lineage="L", interval=0.05)
    for i in range(5):
        journal.append_sample(0, i, {"index": i})
    journal.close()
    (segment,) = journal_dir(args.save).glob("segment-*.rjl")
    data = segment.read_bytes()
    scan = scan_journal(journal_dir(args.save), lineage="L")
    assert len(scan.records) == 5
    # Cut inside the fourth record: the records before it are kept, the rest ignored.
    fourth = data.index(b"RJR2", data.index(b"RJR2", data.index(b"RJR2", data.index(b"RJR2") + 1) + 1) + 1)
    segment.write_bytes(data[: fourth + 7])
    scan = scan_journal(journal_dir(args.save), lineage="L")
    assert [r.seq for r in scan.records] == [1, 2, 3]
    assert len(scan.problems) == 1 and str(segment) in scan.problems[0] and "torn tail" in scan.problems[0]
    # A flipped byte in a complete record of the unsynced tail (the sync mark after it cut off)
    # is a checksum mismatch there: a torn write, ignored.
    sync = data.rindex(b"RJR2")
    damaged = bytearray(data[:sync])
    damaged[fourth + 24] ^= 0xFF
    segment.write_bytes(bytes(damaged))
    scan = scan_journal(journal_dir(args.save), lineage="L")
    assert [r.seq for r in scan.records] == [1, 2, 3] and "checksum" in scan.problems[0]
    # The same flip with the sync mark after it: the record was durable, so it is corruption,
    # named, and the scan fails closed (tests/test_journal_hostile.py has one test per attack).
    damaged = bytearray(data)
    damaged[fourth + 24] ^= 0xFF
    segment.write_bytes(bytes(damaged))
    with pytest.raises(JournalCorruptError, match=rf"{segment}: record at byte {fourth} \(seq 4 expected\)"):
        scan_journal(journal_dir(args.save), lineage="L")


def run_and_crash(
    tmp_path, *, n_groups=8, save_at=(), steps=3, hold=(), release_at_save=False, settle=(), extra=()
):
    """Run A: train ``steps`` steps (saving after the steps in ``save_at``), then stop without
    a checkpoint, as a crash would (what the journal flushed survives)."""
    args = make_args(tmp_path, "run-a", *extra)
    gen = SampleGen(hold=set(hold))
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(n_groups)), generate_sample=gen, max_in_flight=4)
    trained = {}
    for step in range(steps):
        trained[step] = indices(fn(step))
        if step in save_at:
            fn.save(step).result()
            if release_at_save:
                gen.gate.set()  # the held samples finish after the checkpoint
    deadline = time.monotonic() + 10
    while not set(settle) <= gen.finished and time.monotonic() < deadline:
        time.sleep(0.005)  # samples that must be graded (and journaled) before the "crash"
    with fn._lock:
        pass  # a sample graded is journaled under this lock: after it, its record is queued
    fn.ledger.flush()
    fn.stop()
    fn.checkpointer.close()
    fn.ledger.journal.close()  # what the background thread had; a real crash is tested by SIGKILL
    release_run_media(args)
    return args, gen, trained


def resume(tmp_path, step, *extra, n_groups=8, hold=()):
    args = make_args(tmp_path, "run-b", *extra)
    gen = SampleGen(hold=set(hold))
    fn = FullyAsyncRolloutFn(
        args, ListDataSource(prompts(n_groups)), generate_sample=gen, max_in_flight=4, sample_cls=Sample
    )
    fn.load(step)
    return args, gen, fn


def test_groups_consumed_after_the_restored_step_come_back_with_their_generations(tmp_path):
    _, _, trained = run_and_crash(tmp_path, save_at=(0,), steps=3)
    # The trainer restores step 0: what steps 1 and 2 trained is gone with their weights.
    _, gen_b, fn = resume(tmp_path, 0)
    got = drain_all(fn, 1)
    lineage = trained[0] + flat(got)
    assert sorted(lineage) == list(range(16))  # every sample trained exactly once in the lineage
    assert got[1] + got[2] == trained[1] + trained[2]  # back first, in their order
    regenerated = set(gen_b.calls) & set(trained[1] + trained[2])
    assert not regenerated  # generations kept, not regenerated


def test_groups_consumed_at_or_before_the_restored_step_never_come_back(tmp_path):
    _, _, trained = run_and_crash(tmp_path, save_at=(0,), steps=3)
    _, gen_b, fn = resume(tmp_path, 2)  # the trainer has the weights of step 2
    rest = flat(drain_all(fn, 3))
    assert sorted(trained[0] + trained[1] + trained[2] + rest) == list(range(16))
    assert not set(gen_b.calls) & set(trained[0] + trained[1] + trained[2])


def test_finished_siblings_are_kept_and_only_unfinished_ones_regenerate(tmp_path):
    # Group 2's second sample (index 5) is held: its sibling 4 finishes and is journaled.
    _, gen_a, trained = run_and_crash(tmp_path, n_groups=3, steps=1, hold={5}, settle={4})
    assert 4 in gen_a.calls and 5 in gen_a.calls
    _, gen_b, fn = resume(tmp_path, 0, n_groups=3)
    batch = fn.drain(1, timeout=5, step=1)
    fn.close()
    assert sorted(indices(batch)) == [4, 5] and sorted(trained[0]) == [0, 1, 2, 3]
    assert 4 not in gen_b.calls and 5 in gen_b.calls  # the finished sibling kept its result
    four = next(s for g in batch for s in g if s.index == 4)
    assert four.reward == 4.0 and four.status is Sample.Status.COMPLETED
    (img,) = four.multimodal_inputs["images"]
    assert Path(img.path).parent == run_media_dir(make_args(tmp_path, "run-b"))
    assert digest_of(Path(img.path).read_bytes()) == img.digest  # restored media verify


def test_a_journal_without_a_checkpoint_resumes_from_the_first_record(tmp_path):
    _, _, trained = run_and_crash(tmp_path, steps=2)
    _, gen_b, fn = resume(tmp_path, 0)
    rest = flat(drain_all(fn, 1))
    assert sorted(trained[0] + rest) == list(range(16))
    assert not set(gen_b.calls) & set(trained[0] + trained[1])


def test_journal_media_removed_drops_only_those_records_named_in_one_line(tmp_path, caplog):
    _, _, trained = run_and_crash(
        tmp_path, save_at=(0,), steps=2, hold=set(range(4, 16)), release_at_save=True
    )
    jdir = journal_dir(tmp_path / "ckpt")
    watermark = open_bundle(checkpoint_path(tmp_path / "ckpt", 0)).meta["journal"]["watermark"]
    after = [r for r in scan_journal(jdir).records if r.seq > watermark and r.kind == "sample"]
    victim = jdir / "media" / after[-1].media[0]  # a sample journaled after the checkpoint
    victim.unlink()
    with caplog.at_level(logging.WARNING, logger="trainer_hooks"):
        _, gen_b, fn = resume(tmp_path, 0)
    lines = [r.getMessage() for r in caplog.records if str(victim) in r.getMessage()]
    assert len(lines) == 1 and "missing" in lines[0]
    rest = flat(drain_all(fn, 1))
    assert sorted(trained[0] + rest) == list(range(16))  # nothing else is lost
    assert len(set(gen_b.calls) & set(trained[1])) <= SIZE  # at most the sample(s) of that file


def test_a_journal_of_another_run_is_ignored_in_one_line(tmp_path, caplog):
    _, _, trained = run_and_crash(tmp_path, save_at=(0,), steps=1)
    foreign = RolloutJournal(
        journal_dir(tmp_path / "ckpt"), lineage="someone-else", interval=0.05, first_seq=1
    )
    foreign.append_group(99, [{"index": 999}])
    foreign.close()
    with caplog.at_level(logging.WARNING, logger="trainer_hooks"):
        _, _, fn = resume(tmp_path, 0)
    lines = [r.getMessage() for r in caplog.records if "another run lineage" in r.getMessage()]
    assert len(lines) == 1 and "someone-else" in lines[0]
    rest = flat(drain_all(fn, 1))
    assert sorted(trained[0] + rest) == list(range(16))


def test_a_different_fingerprint_is_refused_naming_each_field_and_deleting_nothing(tmp_path):
    run_and_crash(tmp_path, save_at=(0,), steps=1)
    before = sorted(p.relative_to(tmp_path / "ckpt") for p in (tmp_path / "ckpt").rglob("*"))
    args = make_args(tmp_path, "run-b", "--bf16")
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(9)), generate_sample=SampleGen())
    with pytest.raises(IncompatibleResumeError) as e:
        fn.load(0)
    msg = str(e.value)
    assert "training_dtype: checkpoint 'fp32', this run 'bf16'" in msg
    assert "dataset" in msg and "'prompts': 8" in msg and "'prompts': 9" in msg
    assert "--resume-accept-changes training_dtype,dataset" in msg
    fn.close()
    after = sorted(p.relative_to(tmp_path / "ckpt") for p in (tmp_path / "ckpt").rglob("*"))
    assert before == after  # nothing deleted
    args = make_args(tmp_path, "run-c", "--bf16", "--resume-accept-changes", "training_dtype")
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(8)), generate_sample=SampleGen())
    fn.load(0)  # the named difference is accepted
    fn.close()


def test_checkpoint_meta_and_one_log_line_report_the_save_and_the_journal(tmp_path, caplog):
    args = make_args(tmp_path, "run-a")
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(4)), generate_sample=SampleGen(), max_in_flight=4)
    fn(0)
    with caplog.at_level(logging.INFO, logger="trainer_hooks"):
        path = fn.save(0).result()
    fn.close()
    meta = open_bundle(path).meta
    tele, journal = meta["save_telemetry"], meta["journal"]
    assert tele["blocking_s"] >= tele["journal_barrier_s"] >= 0
    assert journal["stats"]["records"] >= 4 and journal["stats"]["bytes"] > 0
    assert (
        journal["watermark"] >= 4 and journal["lineage"] and meta["fingerprint"]["training_dtype"] == "fp32"
    )
    assert meta["data_source_cursor"] == {"offset": 4}
    lines = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith(f"rollout checkpoint {path}")
    ]
    assert len(lines) == 1 and "blocked the caller" in lines[0] and "journal:" in lines[0]


def test_compaction_deletes_superseded_segments_one_generation_behind(tmp_path):
    args = make_args(tmp_path, "run-a")
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(12)), generate_sample=SampleGen(), max_in_flight=2)
    jdir = journal_dir(args.save)
    seen = []
    for step in range(4):
        fn(step)
        fn.save(step).result()
        seen.append(sorted(p.name for p in jdir.glob("segment-*")))
    fn.close()
    # After save N commits, the segments before save N-1's watermark are gone.
    assert len(seen[-1]) <= 3
    assert not set(seen[0]) & set(seen[-1])
    live_media = {m for r in scan_journal(jdir).records for m in r.media}
    present = {p.name for p in (jdir / "media").iterdir()}
    # Nothing a surviving record needs was deleted. Known gap (issue 19, left open): on a loaded
    # machine, media linked for samples still in flight when the run closed can outlive their
    # (never written) records until a later compaction; so this checks no more than that.
    assert live_media <= present


def test_interval_zero_disables_the_journal_and_load_needs_the_exact_checkpoint(tmp_path):
    args = make_args(tmp_path, "run-a", "--rollout-journal-interval", "0")
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(4)), generate_sample=SampleGen())
    fn(0)
    fn.save(0).result()
    fn.close()
    assert not journal_dir(args.save).exists()
    fn = FullyAsyncRolloutFn(
        make_args(tmp_path, "run-b", "--rollout-journal-interval", "0"),
        ListDataSource(prompts(4)),
        generate_sample=SampleGen(),
    )
    with pytest.raises(BundleNotFoundError):
        fn.load(1)
    fn.load(0)
    fn.close()


def test_load_with_nothing_to_resume_from_says_so(tmp_path):
    fn = FullyAsyncRolloutFn(
        make_args(tmp_path, "run-a"), ListDataSource(prompts(2)), generate_sample=SampleGen()
    )
    with pytest.raises(BundleNotFoundError, match="no journal records"):
        fn.load(3)
    fn.close()
    assert checkpoint_path(tmp_path / "ckpt", 3).exists() is False


def test_inspect_shows_the_journal_state(tmp_path, capsys):
    import json

    from trainer_hooks.cli import main

    args = make_args(tmp_path, "run-a")
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(4)), generate_sample=SampleGen(), max_in_flight=4)
    fn(0)
    path = fn.save(0).result()
    fn(1)
    fn.close()
    assert main(["inspect", str(journal_dir(args.save))]) == 0
    out = capsys.readouterr().out
    assert "journal       " in out and "records       " in out and "durable       up to seq" in out
    assert main(["inspect", "--json", str(path)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "rollout_checkpoint"
    (lin,) = info["journal"]["lineages"]
    assert lin["records"] >= 9 and lin["records_by_kind"]["consumed"] == 2 and lin["bytes"] > 0
    assert lin["unflushed_records"] == 0 and lin["oldest_unflushed_age_s"] == 0.0  # closed: all durable
    assert lin["lineage"] == open_bundle(path).meta["journal"]["lineage"]


def test_a_damaged_fsynced_record_is_refused_when_decoded_naming_it(tmp_path):
    from trainer_hooks.journal import JournalError, record_body

    args = make_args(tmp_path, "run-a")
    journal = RolloutJournal(journal_dir(args.save), lineage="L", interval=0.05)
    journal.append_sample(0, 0, {"index": 0, "tokens": list(range(500))})
    journal.close()
    (segment,) = journal_dir(args.save).glob("segment-*.rjl")
    data = bytearray(segment.read_bytes())
    data[data.index(b"RJR2") + 64] ^= 0xFF  # inside the body of a record a sync mark follows
    segment.write_bytes(bytes(data))
    (rec,) = scan_journal(journal_dir(args.save), lineage="L").records  # the scan defers the check
    with pytest.raises(JournalError, match="checksum mismatch"):
        record_body(rec, f"{segment}: record 1")


def test_a_batch_of_takes_cut_by_a_crash_moves_neither_the_cursor_nor_its_groups(tmp_path):
    from trainer_hooks.rollout import RolloutLedger

    args = make_args(tmp_path, "run-a")
    journal = RolloutJournal(journal_dir(args.save), lineage="L", interval=0.05)
    for gid in (0, 1):  # a whole batch: the cursor after it is {"offset": 2}
        journal.append_take(gid, [{"index": gid}], {"offset": 2}, batch_end=1)
    journal.append_take(2, [{"index": 2}], {"offset": 4}, batch_end=3)  # its batch-mate was lost
    journal.close()
    state = RolloutLedger(make_args(tmp_path, "run-b")).recover(-1, sample_cls=dict)
    assert [g.gid for g in state.pending] == [0, 1]  # group 2 is handed out again by the source
    assert state.cursor == {"offset": 2}


def test_a_number_list_the_snapshot_proved_is_not_proved_again_by_the_encoder():
    from bundles import sample_encoder
    from bundles.support import only_numbers

    offered: list[str] = []
    encode = sample_encoder(resolve_string=lambda v, w: offered.append(v), string_prefixes=("/",))
    tokens = [*range(100), 7]
    assert only_numbers(tokens)
    sample = {"tokens": tokens, "logp": [-0.5] * 80}
    # Told the ids it was proved by, the encoder packs the same bytes without a second proof.
    assert encode(sample, number_lists={id(tokens)}) == encode(sample)
    # The proof really is skipped: a list named as proved is packed as it is (this one breaks the
    # contract on purpose, so that the skip shows), while without the hint its string is offered
    # to the resolver.
    lying = [*range(100), "/run/x.png", 1]
    encode({"l": lying})
    assert offered == ["/run/x.png"]
    offered.clear()
    encode({"l": lying}, number_lists={id(lying)})
    assert offered == []


def test_the_journal_still_checks_what_the_snapshot_copied_shallowly(tmp_path):
    from trainer_hooks.journal import JournalError

    journal = RolloutJournal(tmp_path / "journal", lineage="L1", interval=0.05)
    journal.append_sample(0, 0, {"index": 0, "tokens": [*range(100), [1], 2]})  # a list among the ints
    with pytest.raises(JournalError, match=r"tokens\[100\].*list"):
        journal.flush()
    with pytest.raises(JournalError):
        journal.close()


def bodies(jdir: Path, kind: str) -> list:
    """The values of a journal's ``kind`` records, decoded as the module docstring specifies
    (a zstd frame of one value in the bundle codec; media from ``journal/media``)."""
    import zstandard

    out = []
    for rec in scan_journal(jdir).records:
        if rec.kind == kind:
            media = {n: MediaRef.from_file(jdir / "media" / n) for n in rec.media}
            out.append(decode_sample(zstandard.ZstdDecompressor().decompress(bytes(rec.body)), media))
    return out


def test_a_lent_sample_is_the_callers_again_only_once_encoded(tmp_path):
    gate = threading.Event()
    journal = RolloutJournal(tmp_path / "journal", lineage="L1", interval=0.05)
    sample = Sample(index=3, group_index=1, tokens=[*range(200), 9], reward=1.0)
    with on_fault_point("journal.append", lambda seq: gate.wait(10)):  # the writer is held
        seq = journal.append_sample(1, 0, sample, copy=False)
        with pytest.raises(TimeoutError, match=f"seq {seq}"):
            journal.wait_encoded(timeout=0.2)
        gate.set()
        journal.wait_encoded(timeout=10)
    sample.tokens.append(10**6)  # the caller's again: the record is what was lent
    sample.reward = -1.0
    journal.close()
    (body,) = bodies(tmp_path / "journal", "sample")
    assert body["tokens"] == [*range(200), 9] and body["reward"] == 1.0


def test_drain_hands_out_lent_samples_only_after_the_journal_encoded_them(tmp_path):
    args = make_args(tmp_path, "run-a")
    gate = threading.Event()
    held = threading.Event()

    def hold(seq):
        held.set()
        gate.wait(10)

    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(1)), generate_sample=SampleGen())
    got: list = []
    with on_fault_point("journal.append", hold):
        t = threading.Thread(target=lambda: got.append(fn.drain(1, timeout=20, step=0)))
        t.start()
        assert held.wait(10)
        deadline = time.monotonic() + 10
        while fn.get_metrics()["buffer/size"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        t.join(0.3)
        # The group is finished and buffered, but not encoded yet: drain() waits, taking nothing.
        metrics = fn.get_metrics()
        assert metrics["buffer/size"] == 1 and metrics["buffer/total_got"] == 0 and t.is_alive() and not got
        gate.set()
        t.join(20)
    (group,) = got[0]
    for s in group:  # the trainer's now: mutating them cannot reach the journal
        s.tokens.clear()
        s.reward = None
    fn.close()
    lent = bodies(journal_dir(args.save), "sample")
    assert sorted(b["index"] for b in lent) == [0, 1]
    assert all(len(b["tokens"]) == 201 and b["reward"] == float(b["index"]) for b in lent)


def test_a_lent_sample_holding_container_subclasses_is_journaled_as_plain_containers(tmp_path):
    from collections import OrderedDict, namedtuple

    Point = namedtuple("Point", "x y")
    journal = RolloutJournal(tmp_path / "journal", lineage="L1", interval=0.05)
    sample = {
        "index": 1,
        "metadata": OrderedDict(a=1, b=[1, 2]),
        "click": Point(3, 4),
        "tokens": [*range(100)],
    }
    journal.append_sample(0, 0, sample, copy=False)
    journal.close()
    (body,) = bodies(tmp_path / "journal", "sample")
    assert body["metadata"] == {"a": 1, "b": [1, 2]} and type(body["metadata"]) is dict
    assert body["click"] == (3, 4) and body["tokens"] == [*range(100)]


def test_lending_something_that_is_no_sample_fails_the_caller_not_the_journal(tmp_path):
    journal = RolloutJournal(tmp_path / "journal", lineage="L1", interval=0.05)
    with pytest.raises(TypeError, match=r"group\[0\]\[1\]: expected a Sample"):
        journal.append_sample(0, 1, 42, copy=False)
    journal.append_sample(0, 0, {"index": 0}, copy=False)  # the journal goes on
    journal.close()
    assert [b["index"] for b in bodies(tmp_path / "journal", "sample")] == [0]
    # A closed journal is said at the append, never waited on: nothing is queued to a writer
    # that is gone.
    with pytest.raises(JournalError, match="the journal is closed; a sample record cannot be appended"):
        journal.append_sample(0, 2, {"index": 2})
    journal.wait_encoded(timeout=5)
    assert journal.flush(timeout=5) == journal.last_seq == 1


def test_a_drain_timing_out_on_the_journal_leaves_its_groups_buffered(tmp_path):
    args = make_args(tmp_path, "run-a")
    gate = threading.Event()
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(1)), generate_sample=SampleGen())
    with on_fault_point("journal.append", lambda seq: gate.wait(10)):  # the writer is held
        deadline = time.monotonic() + 10
        fn.start()
        while fn.get_metrics()["buffer/size"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(TimeoutError, match="encode"):
            fn.drain(1, timeout=0.3, step=0)
        assert fn.get_metrics()["buffer/size"] == 1  # nothing taken
        gate.set()
        (group,) = fn.drain(1, timeout=10, step=0)
    assert sorted(s.index for s in group) == [0, 1]
    fn.close()


def test_a_torn_tail_the_checkpoint_covers_is_corruption_not_a_torn_write(tmp_path):
    # save() makes the journal durable up to the checkpoint's watermark before it commits: a
    # crash cannot tear a record at or before it (issue 24, R4's rule at the ledger).
    args, _, _ = run_and_crash(tmp_path, save_at=(0,), steps=1)
    watermark = open_bundle(checkpoint_path(args.save, 0)).meta["journal"]["watermark"]
    jdir = journal_dir(args.save)
    segments = sorted(jdir.glob("segment-*.rjl"))
    holding = next(p for p in segments if watermark in {r.seq for r in scan_journal(jdir, only=[p]).records})
    rec = next(r for r in scan_journal(jdir, only=[holding]).records if r.seq == watermark)
    holding.write_bytes(holding.read_bytes()[: rec.offset + 7])
    for later in segments[segments.index(holding) + 1 :]:
        later.unlink()
    with pytest.raises(JournalCorruptError, match=f"covers up to record {watermark}"):
        resume(tmp_path, 0)


# -- a journal that cannot write stops training (issue 30, item 8) ------------------------------
@pytest.mark.parametrize("where", ["writer", "sink"])
def test_a_dead_journal_writer_stops_training_at_the_next_step_naming_the_cause(journal_place, where):
    """The writer dies (its thread, or its sink's: a local fsync, a store's shipment) with a
    cause of its own; the next training step fails naming the journal and that cause, and so
    does every step after it: no step trains unjournaled."""
    from trainer_hooks import RolloutWorkerError

    point = {"writer": "journal.append", "sink": {"local": "journal.synced", "seaweedfs": "journal.ship"}}[
        where
    ]
    if isinstance(point, dict):
        point = point[journal_place.name]
    args = journal_place.args(f"run-dead-{where}")
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(100)), generate_sample=SampleGen(), max_in_flight=2)
    assert len(fn.drain(timeout=20, step=0)) == 2  # a healthy step first
    journal = fn.ledger.journal
    assert journal is not None and journal.failure is None

    def full_disk(*_: object) -> None:
        raise OSError(28, "No space left on device (planted by the test)")

    trained_after = []
    with on_fault_point(point, full_disk):
        for step in range(1, 8):
            time.sleep(0.15)  # three flush intervals: the writer flushes (and dies) meanwhile
            dead = journal.failure is not None  # known dead before the step began
            try:
                fn.drain(timeout=20, step=step)
            except (JournalError, RolloutWorkerError) as e:
                error = e
                break
            if dead:
                trained_after.append(step)
        else:
            pytest.fail(f"7 steps trained and none failed; the journal's failure: {journal.failure!r}")
    assert trained_after == []
    text = str(error)
    assert "No space left on device (planted by the test)" in text and journal.where in text, text
    assert isinstance(journal.failure, OSError)
    with pytest.raises((JournalError, RolloutWorkerError), match="planted by the test"):
        fn.drain(timeout=20, step=step + 1)  # and it stays stopped
    with pytest.raises(JournalError, match="planted by the test"):
        fn.close()


def _screenshot(tmp_path: Path, color: tuple[int, int, int]) -> tuple[Path, Path, bytes]:
    """A run media directory holding one screenshot named by its digest: (directory, file, bytes)."""
    import hashlib

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    png = png_bytes(4, 4, color)
    image = run_dir / (hashlib.sha256(png).hexdigest() + ".png")
    image.write_bytes(png)
    return run_dir, image, png


def test_both_sinks_keep_one_journal_and_compaction_frees_only_what_a_checkpoint_covers(
    journal_place, tmp_path
):
    """The writer through each sink (a directory, SeaweedFS), by the same code: what is appended
    is read back after a flush, records and media; a resumed journal of the lineage adopts what
    the first left, and compaction frees the segments (shipments) a watermark covers with the
    media only they referenced, and nothing after it."""
    import tempfile

    run_dir, image, png = _screenshot(tmp_path, (1, 2, 3))
    first = RolloutJournal(journal_place.sink(), lineage="L", interval=0.05, media_roots=[run_dir])
    first.append_take(0, [{"index": 0, "image": str(image)}], {"offset": 1})
    first.append_sample(0, 0, {"index": 0, "image": str(image), "reward": 1.0})
    first.append_group(0, None)
    watermark = first.roll()
    first.append_dropped(1)
    assert first.flush(timeout=20) == 4
    first.close()
    with tempfile.TemporaryDirectory(dir=tmp_path) as staging:
        directory = journal_place.sink().readable(lambda: Path(staging))
        scan = scan_journal(directory, lineage="L")
        assert [(r.seq, r.kind) for r in scan.records] == [
            (1, "take"),
            (2, "sample"),
            (3, "group"),
            (4, "dropped"),
        ]
        assert (directory / "media" / image.name).read_bytes() == png
    kept = journal_place.kept()
    assert any(int(n.split("-")[1]) <= watermark for n in kept), kept

    resumed = RolloutJournal(
        journal_place.sink(), lineage="L", interval=0.05, first_seq=5, media_roots=[run_dir]
    )
    resumed.append_dropped(2)
    resumed.flush(timeout=20)
    segments, media = resumed.compact(watermark)
    resumed.close()
    left = journal_place.kept()
    assert segments >= 1 and media == 1, (segments, media, kept, left)
    assert left and all(int(n.split("-")[1]) > watermark for n in left), left
    with tempfile.TemporaryDirectory(dir=tmp_path) as staging:
        directory = journal_place.sink().readable(lambda: Path(staging))
        assert [r.seq for r in scan_journal(directory, lineage="L").records] == [4, 5]
        assert not (directory / "media" / image.name).exists()  # only the covered records named it


def test_compaction_never_frees_a_media_file_the_record_being_encoded_names(journal_place, tmp_path):
    """Compaction runs on the checkpoint writer's thread while the journal's thread encodes: a
    record being encoded that names a screenshot only covered records named before keeps it
    (locally its file, on a store the shipment carrying it); the record is never left naming a
    file the journal deleted under it."""
    import tempfile

    run_dir, image, png = _screenshot(tmp_path, (9, 8, 7))
    journal = RolloutJournal(journal_place.sink(), lineage="L", interval=0.05, media_roots=[run_dir])
    journal.append_take(0, [{"index": 0, "image": str(image)}], {"offset": 1})
    watermark = journal.roll()
    journal.flush(timeout=20)
    journal.compact(0)  # the first compaction adopts what is kept; nothing is covered yet
    compactions: list[threading.Thread] = []

    def compact_meanwhile(seq: int) -> None:
        if seq == watermark + 1:  # the sample, encoded, not yet indexed
            t = threading.Thread(target=journal.compact, args=(watermark,))
            t.start()
            t.join(1.0)  # done meanwhile, unless it waits for the record to be indexed
            compactions.append(t)

    with on_fault_point("journal.encoded", compact_meanwhile):
        journal.append_sample(0, 0, {"index": 0, "image": str(image), "reward": 1.0})
        journal.flush(timeout=20)
    assert compactions
    compactions[0].join(20)
    journal.close()
    with tempfile.TemporaryDirectory(dir=tmp_path) as staging:
        directory = journal_place.sink().readable(lambda: Path(staging))
        (sample,) = [r for r in scan_journal(directory, lineage="L").records if r.kind == "sample"]
        assert sample.media == [image.name]
        assert (directory / "media" / image.name).read_bytes() == png, "the sample's screenshot was deleted"
