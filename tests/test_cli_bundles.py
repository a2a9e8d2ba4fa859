"""The bundle subcommands: inspect, verify, pack, unpack (in-process and as a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import put_media

from bundles import open_bundle, write_bundle
from bundles.cli import main


def make_bundle(tmp_path):
    run = tmp_path / "run"
    shared = put_media(run, b"a" * 4096)
    other = put_media(run, b"b" * 1024)
    samples = [{"images": [shared, other if i == 0 else shared]} for i in range(4)]
    return write_bundle(tmp_path / "b", samples, media_roots=[run], meta={"rollout_id": 3})


def test_inspect_reports_counts_bytes_dedup_and_meta(tmp_path, capsys):
    b = make_bundle(tmp_path)
    assert main(["inspect", str(b), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "debug_dump" and info["samples"] == 4
    assert info["media_files"] == 2 and info["media_bytes"] == 5120
    assert info["media_references"] == 8 and info["dedup_ratio"] == 4.0
    assert info["meta"] == {"rollout_id": 3}
    assert main(["inspect", str(b)]) == 0
    text = capsys.readouterr().out
    assert "dedup ratio 4.00x" in text and "5.0 KiB" in text


def test_verify_exits_1_listing_every_problem(tmp_path, capsys):
    b = make_bundle(tmp_path)
    assert main(["verify", str(b), "--full"]) == 0
    assert "OK (full verification" in capsys.readouterr().out
    for f in (b / "media").iterdir():
        os.chmod(f, 0o644)
        f.write_bytes(b"z" * f.stat().st_size)
    assert main(["verify", str(b)]) == 0  # fast verification does not hash media
    assert main(["verify", str(b), "--full"]) == 1
    err = capsys.readouterr().err
    assert err.count("digest: expected sha256:") == 2


def test_pack_unpack_round_trip_as_a_real_process(tmp_path):
    b = make_bundle(tmp_path)
    packed = tmp_path / "b.rbundle"
    cmd = [sys.executable, "-m", "bundles.cli"]
    r = subprocess.run([*cmd, "pack", str(b), "-o", str(packed)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [*cmd, "unpack", str(packed), "-o", str(tmp_path / "u")], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    assert "fully verified" in r.stdout
    from pathlib import Path

    assert [Path(s["images"][1]).read_bytes()[:1] for s in open_bundle(tmp_path / "u").samples()] == [
        b"b"
    ] + [b"a"] * 3
    r = subprocess.run(
        [*cmd, "unpack", str(packed), "-o", str(tmp_path / "u")], capture_output=True, text=True, check=False
    )
    assert r.returncode == 2 and "output exists" in r.stderr  # the caller's: pass --force


def test_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rollout-bundle inspect: error: ") and "missing" in err and "Traceback" not in err
