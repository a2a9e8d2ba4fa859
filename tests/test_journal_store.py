"""The rollout journal on an object store (``--save s3://…``; trainer_hooks/journal/_store_sink.py),
against moto and s3rver on 127.0.0.1: what a run leaves there, compaction, a second writer of one
lineage, forged shipments refused before anything is placed, and a store that ignores
preconditions. The SIGKILL suite on SeaweedFS is in tests/test_journal_crash.py."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import msgpack
import obstore
from helpers.small_run import grader, prompt_groups
from obstore.store import S3Store

from bundles import UnsafeStoreError
from trainer_hooks import (
    FullyAsyncRolloutFn,
    ListDataSource,
    RolloutWorkerError,
    Sample,
    parse_args,
)
from trainer_hooks.journal import JournalCorruptError, JournalError

GROUPS, SIZE = 8, 2


def _env(monkeypatch: pytest.MonkeyPatch, server: Any) -> str:
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    return server.bucket()


def _client(server: Any, bucket: str) -> S3Store:
    o = server.options()
    return S3Store(
        bucket,
        endpoint=o["endpoint"],
        access_key_id=o["access_key_id"],
        secret_access_key=o["secret_access_key"],
        region="us-east-1",
        client_options={"allow_http": True},
    )


def _journal_objects(client: S3Store, save_key: str) -> dict[str, bytes]:
    prefix = f"{save_key}/rollout/journal/"
    out = {}
    for batch in obstore.list(client, prefix):
        for m in batch:
            out[m["path"][len(prefix) :]] = bytes(obstore.get(client, m["path"]).bytes())
    return out


def _args(tmp_path: Path, url: str, run: str, interval: str = "0.05") -> Any:
    return parse_args(
        [
            "--rollout-batch-size", "2",
            "--shared-media-dir", str(tmp_path / "shared"),
            "--run-uuid", run,
            "--save", url,
            "--load", url,
            "--rollout-journal-interval", interval,
        ]
    )  # fmt: skip


def _groups() -> list[list[Sample]]:
    return prompt_groups(GROUPS, SIZE)


_gen = grader(50)


def _crashed_run(
    tmp_path: Path, url: str, steps: int, save_at: tuple[int, ...] = ()
) -> tuple[Any, list[int]]:
    """A run that trains ``steps`` steps, saving at ``save_at``, and then "dies": its journal is
    made durable (as the interval would) and the run is left unclosed."""
    fn = FullyAsyncRolloutFn(
        _args(tmp_path, url, "run-0"), ListDataSource(_groups()), generate_sample=_gen, max_in_flight=4
    )
    trained = []
    for step in range(steps):
        trained += [s.index for g in fn(step) for s in g]
        if step in save_at:
            fn.save(step).result()
    fn.ledger.flush()
    return fn, trained


def _resume(tmp_path: Path, url: str, step: int, run: str = "run-1") -> tuple[Any, list[int]]:
    fn = FullyAsyncRolloutFn(
        _args(tmp_path, url, run), ListDataSource(_groups()), generate_sample=_gen, max_in_flight=4
    )
    fn.load(step)
    trained = [s.index for st in range(step + 1, GROUPS // 2) for g in fn(st) for s in g]
    fn.close()
    return fn, trained


@pytest.fixture
def moto(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    return moto_s3, _env(monkeypatch, moto_s3)


def test_a_run_on_a_store_leaves_shipments_and_resumes_from_them_exactly_once(
    moto: Any, tmp_path: Path
) -> None:
    server, bucket = moto
    url = f"s3://{bucket}/ckpt"
    dead, first = _crashed_run(tmp_path, url, steps=3, save_at=(1,))
    objects = _journal_objects(_client(server, bucket), "ckpt")
    assert objects and all(n.startswith("segment-") and n.endswith(".rjs") for n in objects), sorted(objects)
    assert not any((tmp_path / "shared").glob("*journal*/segment-*")), "the spool keeps no shipped segment"
    _, rest = _resume(tmp_path, url, step=1)
    # Step 2's weights are gone: what it trained comes back, everything is trained once after step 1.
    assert sorted(first[:8] + rest) == list(range(GROUPS * SIZE))
    dead.ledger.journal.close()


def test_compaction_deletes_the_shipments_a_committed_checkpoint_covers(moto: Any, tmp_path: Path) -> None:
    server, bucket = moto
    url = f"s3://{bucket}/compact"
    client = _client(server, bucket)
    fn = FullyAsyncRolloutFn(
        _args(tmp_path, url, "run-0"), ListDataSource(_groups()), generate_sample=_gen, max_in_flight=4
    )
    fn(0)
    fn.save(0).result()
    fn(1)
    before = set(_journal_objects(client, "compact"))
    fn.save(1).result()  # compacts up to checkpoint 0's watermark
    fn(2)
    fn.save(2).result()  # and up to checkpoint 1's
    after = set(_journal_objects(client, "compact"))
    fn.close()
    gone = before - after
    assert gone, f"nothing was compacted: {sorted(before)} -> {sorted(after)}"
    first_left = min(int(n.split("-")[1]) for n in after)
    assert all(int(n.split("-")[1]) < first_left for n in gone)
    _, rest = _resume(tmp_path, url, step=2)
    assert len(rest) == GROUPS * SIZE - 6 * SIZE


def test_a_second_writer_of_the_lineage_is_refused_not_merged(moto: Any, tmp_path: Path) -> None:
    server, bucket = moto
    url = f"s3://{bucket}/twice"
    fn, _ = _crashed_run(tmp_path, url, steps=1)
    journal = fn.ledger.journal
    # Another trainer of the lineage shipped the next records (rollouts in flight may append a
    # few more before the next shipment starts: every name it can take is taken).
    client = _client(server, bucket)
    for seq in range(journal.last_seq + 1, journal.last_seq + 80):
        obstore.put(client, f"twice/rollout/journal/segment-{seq:012d}-{journal.lineage}-000.rjs", b"theirs")
    # The refused shipment stops the run at its next step (or at the flush, if the step was
    # quicker than the shipment): it never trains on unjournaled.
    with pytest.raises(
        (JournalError, RolloutWorkerError), match=r"\.rjs: the shipment exists already: another writer"
    ):
        fn(1)
        fn.ledger.flush()


def _shipment(objects: dict[str, bytes]) -> tuple[str, bytes]:
    return next((n, b) for n, b in sorted(objects.items()) if n.endswith(".rjs"))


def _forge(data: bytes, how: str) -> bytes:
    """The shipment ``data`` damaged or forged one way (its layout: segment | media | header |
    u32 header_len | u32 crc | magic)."""
    magic = b"RBJSHIP1\n"
    hlen = struct.unpack_from("<I", data, len(data) - len(magic) - 8)[0]
    start = len(data) - len(magic) - 8 - hlen
    header = msgpack.unpackb(data[start : start + hlen])
    body = data[:start]
    if how == "magic":
        return data[: -len(magic)] + b"RBJSHIP9\n"
    if how == "header-checksum":
        return data[: start + 1] + bytes([data[start + 1] ^ 1]) + data[start + 2 :]
    if how == "forged-media":
        # The header is re-made with a valid checksum: only the digest check can catch it.
        assert header["media"], "the first shipment carries media"
        body = body[:-1] + bytes([body[-1] ^ 0xFF])
    elif how in ("forged-record", "forged-tail"):
        # A valid shipment (trailer, checksum, media) around a segment altered in a record (its
        # frame or its body, wherever the middle falls) or in its last byte (its sync mark).
        at = header["segment"] // 2 if how == "forged-record" else header["segment"] - 1
        body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1 :]
    elif how == "sizes":
        header["segment"] += 7
    elif how == "name":
        header["media"][0][0] = "../../etc/passwd"
    raw = msgpack.packb(header)
    length = struct.pack("<I", len(raw))
    return body + raw + length + struct.pack("<I", zlib.crc32(length, zlib.crc32(raw))) + magic


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("magic", "expected a journal shipment \\(ending in"),
        ("header-checksum", "shipment header checksum mismatch"),
        ("forged-media", "media [0-9a-f]{64}.png: expected content of digest .* nothing is placed"),
        ("sizes", "the header lists .* segment bytes"),
        ("forged-record", r"(record at byte [0-9]+ .*is damaged|body checksum mismatch at byte [0-9]+)"),
        ("forged-tail", r"the segment is damaged from record [0-9]+ on .* a shipment's segment ends whole"),
        ("name", r"shipment header: media\[0\]: expected \[<64 hex><suffix>, size\]"),
    ],
)
def test_a_forged_shipment_is_refused_naming_the_object_before_anything_is_placed(
    moto: Any, tmp_path: Path, how: str, message: str
) -> None:
    server, bucket = moto
    url = f"s3://{bucket}/forged-{how}"
    client = _client(server, bucket)
    dead, _ = _crashed_run(tmp_path, url, steps=1)
    dead.ledger.journal.close()
    name, data = _shipment(_journal_objects(client, f"forged-{how}"))
    obstore.put(client, f"forged-{how}/rollout/journal/{name}", _forge(data, how))
    fn = FullyAsyncRolloutFn(_args(tmp_path, url, "run-1"), ListDataSource(_groups()), generate_sample=_gen)
    with pytest.raises(JournalCorruptError, match=rf"^{url}/rollout/journal/{name}: {message}"):
        fn.load(-1)
    run = tmp_path / "shared" / "run-1"
    placed = [p for p in run.iterdir() if not p.name.startswith(".")] if run.exists() else []
    assert not placed, f"placed before the check: {placed}"
    assert not list((tmp_path / "shared").glob("**/etc/passwd"))


def test_the_journal_refuses_a_store_that_ignores_preconditions_at_open(
    s3rver_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = _env(monkeypatch, s3rver_s3)
    url = f"s3://{bucket}/unsafe"
    fn = FullyAsyncRolloutFn(_args(tmp_path, url, "run-0"), ListDataSource(_groups()), generate_sample=_gen)
    with pytest.raises(UnsafeStoreError, match=r"ignores If-None-Match: \*"):
        fn(0)
    assert not _journal_objects(_client(s3rver_s3, bucket), "unsafe")


def test_inspect_shows_the_journal_on_the_store(moto: Any, tmp_path: Path) -> None:
    """``rollout-bundle inspect <save URL>``, as a user runs it: the shipments read back."""
    import json
    import os
    import subprocess
    import sys

    server, bucket = moto
    url = f"s3://{bucket}/inspect"
    dead, _ = _crashed_run(tmp_path, url, steps=2)
    dead.ledger.journal.close()
    env = {**os.environ, **server.env}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", "inspect", url, "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)["journal"]
    assert state["path"] == f"{url}/rollout/journal"
    (lineage,) = state["lineages"]
    assert lineage["lineage"] == dead.ledger.lineage and lineage["records"] > 0
    assert lineage["synced_seq"] == lineage["last_seq"], "on a store every record read back was shipped"
    # One screenshot a graded sample, each journaled as a sample record (groups carry none).
    assert state["media_files"] == lineage["records_by_kind"]["sample"] >= 2 * 2 * SIZE


_PEAK = """
import runpy, sys
def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))
import trainer_hooks.cli
before = kib("VmRSS")
sys.argv = ["rollout-bundle", "inspect", sys.argv[1]]
try:
    runpy.run_module("trainer_hooks.cli", run_name="__main__")
except SystemExit as e:
    code = e.code
else:
    code = 0
print(f"peak {kib('VmHWM') - before} KiB over {before} KiB", file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.slow
def test_a_large_shipment_is_recovered_without_holding_it_in_memory(
    seaweed_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shipment of 192 MiB (a real segment and three 64 MiB media files) read back by
    ``rollout-bundle inspect``, as a resume reads it (downloaded, checked, unpacked), in a process
    of its own on SeaweedFS: its peak RSS grows by well under half the shipment (it grew by all of
    it when the download held every range at once and the media were checked in memory)."""
    import hashlib
    import os
    import re
    import subprocess
    import sys

    from trainer_hooks.journal._format import shipment_trailer

    bucket = _env(monkeypatch, seaweed_s3)
    client = _client(seaweed_s3, bucket)
    dead, _ = _crashed_run(tmp_path, f"s3://{bucket}/src", steps=1)
    dead.ledger.journal.close()
    name, data = _shipment(_journal_objects(client, "src"))
    hlen = struct.unpack_from("<I", data, len(data) - 9 - 8)[0]
    segment = data[: msgpack.unpackb(data[len(data) - 17 - hlen : len(data) - 17])["segment"]]
    blobs = [bytes([i]) * 64 * 2**20 for i in range(3)]
    media = [(hashlib.sha256(b).hexdigest() + ".png", len(b)) for b in blobs]
    size = len(segment) + sum(n for _, n in media)
    obstore.put(
        client,
        f"big/rollout/journal/{name}",
        b"".join([segment, *blobs, shipment_trailer(len(segment), media)]),
    )
    del blobs
    env = {**os.environ, **seaweed_s3.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, f"s3://{bucket}/big"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "media         3 file(s), 192.0 MiB" in proc.stdout, proc.stdout
    grown = int(re.search(r"peak (\d+) KiB over", proc.stderr).group(1)) * 1024  # type: ignore[union-attr]
    assert grown < size / 2, f"recovering a {size}-byte shipment grew the peak RSS by {grown} bytes"
