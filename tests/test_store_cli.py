"""``rollout-bundle`` on object-store URLs, as a user runs it (a subprocess, configured by the
standard AWS environment, against moto on 127.0.0.1): inspect, show, verify, diff, pack, unpack
and gc."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

from bundles import open_bundle, write_bundle

ROOT = Path(__file__).resolve().parents[1]


def cli(server: Any, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **server.env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # replay imports transformers: slow on a loaded machine
    )


def test_the_bundle_commands_take_urls(moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto_s3.bucket()
    run = tmp_path / "m"
    paths = [put_media(run, hashlib.sha256(bytes([i])).digest() * 50) for i in range(3)]
    url = f"s3://{bucket}/b"
    write_bundle(
        url, [{"index": i, "image": p} for i, p in enumerate(paths)], media_roots=[run], meta={"k": 1}
    )

    info = json.loads(cli(moto_s3, "inspect", url, "--json").stdout)
    assert (
        info["path"] == url and info["samples"] == 3 and info["media_files"] == 3 and info["meta"] == {"k": 1}
    )
    shown = json.loads(cli(moto_s3, "show", url, "1").stdout)
    assert shown[0]["sample"]["index"] == 1
    ok = cli(moto_s3, "verify", url, "--full")
    assert ok.returncode == 0 and ok.stdout.startswith(f"{url}: OK (full verification: 3 samples"), ok.stderr
    packed = f"s3://{bucket}/b.rbundle"
    done = cli(moto_s3, "pack", url, "-o", packed, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == packed and json.loads(done.stdout)["bytes"] > 0
    diff = cli(moto_s3, "diff", url, packed)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    out = cli(moto_s3, "unpack", packed, "-o", str(tmp_path / "local"))
    assert out.returncode == 0, out.stderr
    assert len(open_bundle(tmp_path / "local", verify="full")) == 3

    gc = cli(moto_s3, "gc", f"s3://{bucket}", "--older-than", "0", "--dry-run", "--json")
    assert gc.returncode == 0 and json.loads(gc.stdout)["bundles"] == 1, gc.stderr
    missing = cli(moto_s3, "inspect", f"s3://{bucket}/nothing")
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        == f"rollout-bundle inspect: error: s3://{bucket}/nothing: no bundle here (no bundle.json or manifest.json)"
    )


def test_gc_refuses_a_local_path(moto_s3: Any, tmp_path: Path) -> None:
    proc = cli(moto_s3, "gc", str(tmp_path))
    assert proc.returncode == 2 and "gc takes an object-store URL" in proc.stderr


def _trainer_like_bundle(moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from trainer_hooks.testing import png_bytes

    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto_s3.bucket()
    path = put_media(tmp_path / "m", png_bytes(16, 16, (1, 2, 3)))
    sample = {
        "index": 0,
        "prompt": "x",
        "tokens": [1, 2],
        "response": "y",
        "response_length": 1,
        "reward": 1.0,
        "loss_mask": [1],
        "status": "completed",
        "multimodal_inputs": {"images": [path]},
    }
    url = f"s3://{bucket}/dump"
    write_bundle(url, [sample], media_roots=[tmp_path / "m"])
    return url


def test_view_renders_a_bundle_on_a_store(
    moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _trainer_like_bundle(moto_s3, tmp_path, monkeypatch)
    out = tmp_path / "report.html"
    proc = cli(moto_s3, "view", url, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert url.split("//", 1)[1] in page and "on the object store" in page
    assert "data:image/" in page and 'href="s3:' not in page  # inlined: no files beside the page


@pytest.mark.processor
def test_replay_reads_a_bundle_on_a_store(
    moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _trainer_like_bundle(moto_s3, tmp_path, monkeypatch)
    report = tmp_path / "replay.json"
    proc = cli(moto_s3, "replay", url, "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["bundle"] == url
