"""Resuming from a journal on a store (``--save s3://…``), against moto on 127.0.0.1 (issue 36):

* item 5: a damaged segment inside a valid shipment (trailer, checksums, media all whole) is
  named by its store object and the byte, never by the local staging file it was unpacked into;
* item 6, "resume knows what it must find": a checkpoint records the last shipment it covers
  (``meta.journal.last_shipment``); a listing that ends before it (the object removed, or a
  listing that lags) is listed again with backoff and then refused, naming the missing
  shipment, never replayed short; a listing that catches up on a retry resumes exactly once.

The listing is made short for real: the newest shipments are deleted from the store, and put
back (from the resume's own retry, at its fault point) for the one that catches up."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
import zstandard
from helpers.small_run import grader, prompt_groups
from obstore.store import S3Store

from bundles import encode_sample, open_bundle
from bundles.support import on_fault_point
from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, Sample, parse_args
from trainer_hooks.checkpoints import checkpoint_path
from trainer_hooks.journal import JournalCorruptError, JournalError
from trainer_hooks.journal import _store_sink as store_module
from trainer_hooks.journal._format import shipment_trailer
from trainer_hooks.rollout import RolloutLedger, materialize

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "journal_generator", ROOT / "tests" / "vectors" / "hostile" / "generate_journal.py"
)
generator = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(generator)  # type: ignore[union-attr]

GROUPS, SIZE = 8, 2


@pytest.fixture
def moto(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str, S3Store]:
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto_s3.bucket()
    o = moto_s3.options()
    client = S3Store(
        bucket,
        endpoint=o["endpoint"],
        access_key_id=o["access_key_id"],
        secret_access_key=o["secret_access_key"],
        region="us-east-1",
        client_options={"allow_http": True},
    )
    return moto_s3, bucket, client


def _args(tmp_path: Path, url: str, run: str) -> Any:
    return parse_args(
        [
            "--rollout-batch-size", "2",
            "--shared-media-dir", str(tmp_path / "shared"),
            "--run-uuid", run,
            "--save", url,
            "--load", url,
            "--rollout-journal-interval", "0.05",
        ]
    )  # fmt: skip


# -- item 5: a damaged segment in a valid shipment, named by its object ---------------------------
def _zstd(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(raw)


def _put_shipment(client: S3Store, key: str, first_seq: int, frames: list[bytes], last_seq: int) -> str:
    """A valid shipment (lineage ``hostile``, no media) of a segment holding ``frames`` and its
    sync mark; returns its object name."""
    segment = generator._segment_header(2, first_seq) + b"".join(frames)
    segment += generator._frame(2, [-1, "sync", 3.0, -1, last_seq, []])
    name = f"segment-{first_seq:012d}-{generator.LINEAGE}-000.rjs"
    obstore.put(client, f"{key}/rollout/journal/{name}", segment + shipment_trailer(len(segment), []))
    return name


def _take(seq: int, gid: int, body: bytes | None = None) -> bytes:
    b = {"cursor": {"offset": gid + 1}, "n": 1, "end": gid}
    body = _zstd(encode_sample({"samples": [{"index": gid}]})) if body is None else body
    return generator._frame(2, [seq, "take", 1.0, gid, b, []], body)


def _recover(tmp_path: Path, url: str) -> None:
    state = RolloutLedger(_args(tmp_path, url, "run-b")).recover(None, sample_cls=dict)
    for _, group in state.completed:
        materialize(group)


def test_a_record_in_a_valid_shipment_that_does_not_decode_is_named_by_its_object(moto, tmp_path):
    _, bucket, client = moto
    url = f"s3://{bucket}/undecodable"
    first = _take(1, 0)
    name = _put_shipment(client, "undecodable", 1, [first, _take(2, 1, body=b"not a zstd frame")], 2)
    offset = len(generator._segment_header(2, 1)) + len(first)
    with pytest.raises(JournalCorruptError) as e:
        _recover(tmp_path, url)
    assert str(e.value).startswith(
        f"{url}/rollout/journal/{name}: record at byte {offset} (seq 2, take): body: not a valid zstd frame"
    ), str(e.value)
    assert str(tmp_path) not in str(e.value)


def test_a_gap_between_valid_shipments_is_named_by_the_object_past_it(moto, tmp_path):
    _, bucket, client = moto
    url = f"s3://{bucket}/gap"
    _put_shipment(client, "gap", 1, [_take(1, 0), _take(2, 1)], 2)
    name = _put_shipment(client, "gap", 4, [_take(4, 3)], 4)  # record 3 is in no shipment
    offset = len(generator._segment_header(2, 4))
    with pytest.raises(JournalCorruptError) as e:
        _recover(tmp_path, url)
    assert str(e.value).startswith(
        f"{url}/rollout/journal/{name}: record at byte {offset}: expected seq 3, found 4 (records 3..3 are missing"
    ), str(e.value)
    assert str(tmp_path) not in str(e.value)


def test_inspect_names_a_gap_in_a_store_journal_by_its_shipment(moto, tmp_path):
    # `rollout-bundle inspect` downloads the shipments into a temporary directory to read them:
    # a problem it reports names the shipment object, never that directory.
    _, bucket, client = moto
    url = f"s3://{bucket}/inspected"
    _put_shipment(client, "inspected", 1, [_take(1, 0), _take(2, 1)], 2)
    name = _put_shipment(client, "inspected", 4, [_take(4, 3)], 4)  # record 3 is in no shipment
    done = subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", "inspect", f"{url}/rollout/journal", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)},
        timeout=300,
    )
    assert done.returncode != 0, done.stdout
    assert f"{url}/rollout/journal/{name}: record at byte" in done.stderr, done.stderr
    assert str(tmp_path) not in done.stderr


# -- item 6: resume knows what it must find -------------------------------------------------------
def _groups() -> list[list[Sample]]:
    return prompt_groups(GROUPS, SIZE)


_gen = grader(20)


def _run_and_cut_the_listing(
    tmp_path: Path, url: str, key: str, client: S3Store
) -> tuple[list[int], str, dict]:
    """A run that trains steps 0-2, saving at step 1, then dies. Then every shipment from the
    one checkpoint 1 names on is removed from the store: the listing ends before it. Returns
    what steps 0-1 trained, the named shipment and the removed objects' bytes."""
    fn = FullyAsyncRolloutFn(_args(tmp_path, url, "run-0"), ListDataSource(_groups()), generate_sample=_gen)
    trained = []
    for step in range(3):
        trained += [s.index for g in fn(step) for s in g]
        if step == 1:
            fn.save(step).result()
    fn.ledger.flush()
    fn.ledger.journal.close()
    meta = open_bundle(str(checkpoint_path(url, 1))).meta["journal"]
    named = meta["last_shipment"]
    assert meta["last_shipment_seq"] <= meta["watermark"]
    prefix = f"{key}/rollout/journal/"
    listed = sorted(m["path"] for batch in obstore.list(client, prefix) for m in batch)
    assert f"{prefix}{named}" in listed, listed
    removed = {}
    for path in listed[listed.index(f"{prefix}{named}") :]:
        removed[path] = bytes(obstore.get(client, path).bytes())
        obstore.delete(client, path)
    return trained[: 2 * 2 * SIZE], named, removed


def _resume(tmp_path: Path, url: str) -> list[int]:
    fn = FullyAsyncRolloutFn(_args(tmp_path, url, "run-1"), ListDataSource(_groups()), generate_sample=_gen)
    try:
        fn.load(1)
        return [s.index for step in range(2, GROUPS // 2) for g in fn(step) for s in g]
    finally:
        fn.close()


def test_a_listing_that_ends_before_the_checkpoints_last_shipment_is_refused_naming_it(
    moto, tmp_path, monkeypatch
):
    _, bucket, client = moto
    url = f"s3://{bucket}/stale"
    _, named, _ = _run_and_cut_the_listing(tmp_path, url, "stale", client)
    monkeypatch.setattr(store_module, "LISTING_BACKOFF_S", 0.01)  # the retries' waits, not their count
    listings: list[int] = []
    with on_fault_point("resume.listing_short", listings.append), pytest.raises(JournalError) as e:
        _resume(tmp_path, url)
    text = str(e.value)
    assert text.startswith(f"{url}/rollout/journal/{named}: missing: rollout checkpoint "), text
    assert (
        "ends before it" in text and "refusing to resume from a journal shorter than the checkpoint" in text
    )
    assert listings == list(range(store_module.LISTING_RETRIES + 1))  # asked again, bounded


def test_a_listing_that_catches_up_on_a_retry_resumes_exactly_once(moto, tmp_path):
    _, bucket, client = moto
    url = f"s3://{bucket}/late"
    first, _, removed = _run_and_cut_the_listing(tmp_path, url, "late", client)
    listings: list[int] = []

    def catch_up(attempt: int) -> None:  # the listing lags: the objects appear after the first
        listings.append(attempt)
        for path, data in removed.items():
            obstore.put(client, path, data)

    with on_fault_point("resume.listing_short", catch_up):
        rest = _resume(tmp_path, url)
    assert listings == [0]
    # Step 2's weights are gone: what it trained comes back; every sample is trained exactly once.
    assert sorted(first + rest) == list(range(GROUPS * SIZE))


@pytest.mark.slow
def test_a_store_journal_ships_before_a_shipment_would_carry_more_media_than_its_reader_takes(moto, tmp_path):
    """An interval whose records reference more new media than one shipment may carry
    (MAX_SHIPMENT_MEDIA, a row of the one table) is shipped in several: every shipment is one its
    reader takes, and the journal reads back whole (one shipment carrying them all was put, and
    every later resume refused it)."""
    from bundles import MediaRef
    from bundles.support import LIMITS
    from trainer_hooks.journal import RolloutJournal, journal_sink, scan_journal

    _, bucket, _ = moto
    url = f"s3://{bucket}/many/rollout/journal"
    shot = tmp_path / "shot.png"
    shot.write_bytes(generator.PNG)
    digest = "sha256:" + generator.PNG_NAME[:64]
    per_record = LIMITS["MAX_RECORD_MEDIA"] // 2 + 1
    records = LIMITS["MAX_SHIPMENT_MEDIA"] // per_record + 1  # more media than one shipment may carry
    spool = tmp_path / "spool"
    spool.mkdir()
    journal = RolloutJournal(journal_sink(url, spool=lambda: spool), lineage="many", interval=600)
    try:
        for r in range(records):
            refs = [MediaRef(digest, len(generator.PNG), f".r{r}n{i}", str(shot)) for i in range(per_record)]
            journal.append_sample(r, 0, {"index": r, "images": refs})
        journal.flush()
    finally:
        journal.close()
    sink = journal_sink(url)
    shipped = sink.shipments()
    assert len(shipped) >= 2, shipped
    staging = tmp_path / "staging"
    scan = scan_journal(sink.readable(lambda: staging), lineage="many")
    assert [r.seq for r in scan.records] == list(range(1, records + 1)) and not scan.problems
    assert len(list((staging / "media").iterdir())) == records * per_record


# -- the restored step newer than the checkpoint, with a listing that lags ------------------------
def _run_and_lag_after_the_checkpoint(
    tmp_path: Path, url: str, key: str, client: S3Store
) -> tuple[list, dict]:
    """A run that trains steps 0-2, saving at step 1, then dies (the trainer saved step 2's
    weights, its rollout checkpoint never committed). Every shipment after the one checkpoint 1
    names is removed: the listing reaches the checkpoint, not step 2's records. Returns what
    steps 0-2 trained and the removed objects' bytes."""
    fn = FullyAsyncRolloutFn(_args(tmp_path, url, "run-0"), ListDataSource(_groups()), generate_sample=_gen)
    trained = []
    for step in range(3):
        trained += [s.index for g in fn(step) for s in g]
        if step == 1:
            fn.save(step).result()
    fn.ledger.flush()
    fn.ledger.journal.close()
    named = open_bundle(str(checkpoint_path(url, 1))).meta["journal"]["last_shipment"]
    prefix = f"{key}/rollout/journal/"
    listed = sorted(m["path"] for batch in obstore.list(client, prefix) for m in batch)
    removed = {}
    for path in listed[listed.index(f"{prefix}{named}") + 1 :]:
        removed[path] = bytes(obstore.get(client, path).bytes())
        obstore.delete(client, path)
    assert removed, listed
    return trained[: 3 * 2 * SIZE], removed


def _resume_at(tmp_path: Path, url: str, step: int) -> list[int]:
    fn = FullyAsyncRolloutFn(_args(tmp_path, url, "run-1"), ListDataSource(_groups()), generate_sample=_gen)
    try:
        fn.load(step)
        return [s.index for later in range(step + 1, GROUPS // 2) for g in fn(later) for s in g]
    finally:
        fn.close()


def test_a_restored_step_newer_than_the_checkpoint_waits_for_a_lagging_listing(moto, tmp_path):
    """The listing reaches the checkpoint's last shipment but not the records of the step the
    trainer restored: it used to replay the shorter journal and train step 2's groups again."""
    _, bucket, client = moto
    url = f"s3://{bucket}/newer"
    first, removed = _run_and_lag_after_the_checkpoint(tmp_path, url, "newer", client)
    listings: list[int] = []

    def catch_up(attempt: int) -> None:  # the listing lags: the objects appear after the first
        listings.append(attempt)
        for path, data in removed.items():
            obstore.put(client, path, data)

    with on_fault_point("resume.step_missing", catch_up):
        rest = _resume_at(tmp_path, url, 2)
    assert sorted(first + rest) == list(range(GROUPS * SIZE))  # every sample trained exactly once
    assert listings == [0]


def test_a_restored_step_the_journal_never_shows_goes_on_with_one_line(moto, tmp_path, monkeypatch, caplog):
    """Records lost for real (appended after the last shipment) look like a listing that never
    catches up: after the retries the resume goes on, saying what it could not prove."""
    _, bucket, client = moto
    url = f"s3://{bucket}/lost"
    _run_and_lag_after_the_checkpoint(tmp_path, url, "lost", client)
    monkeypatch.setattr(store_module, "LISTING_BACKOFF_S", 0.01)  # the retries' waits, not their count
    listings: list[int] = []
    with on_fault_point("resume.step_missing", listings.append), caplog.at_level("WARNING"):
        _resume_at(tmp_path, url, 2)
    assert listings == list(range(store_module.LISTING_RETRIES))
    lines = [r.getMessage() for r in caplog.records if "the trainer restored step 2" in r.getMessage()]
    assert len(lines) == 1 and "groups already trained may be trained again" in lines[0], lines
    assert f"{url}/rollout/journal" in lines[0]
