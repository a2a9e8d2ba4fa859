"""``rollout-bundle`` on object-store URLs, as a user runs it (a subprocess, configured by the
standard AWS environment, against moto or SeaweedFS on 127.0.0.1): inspect, show, verify, diff,
pack, unpack, gc, and ls, cp and rm (issue 30, item 19)."""

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

from bundles import open_bundle, upload_bundle, write_bundle

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


# -- ls, cp, rm (issue 30, item 19) ----------------------------------------------------------------
def _raw(server: Any, bucket: str) -> Any:
    from obstore.store import S3Store

    return S3Store(bucket, **server.options(), client_options={"allow_http": True})


def _local_bundle(tmp_path: Path, name: str = "local", n: int = 3) -> Path:
    run = tmp_path / f"m-{name}"
    paths = [put_media(run, hashlib.sha256(f"{name}{i}".encode()).digest() * 50) for i in range(n)]
    samples = [{"index": i, "image": p, "name": name} for i, p in enumerate(paths)]
    return Path(write_bundle(tmp_path / name, samples, media_roots=[run], meta={"who": name}))


def test_cp_up_and_down_ls_and_rm_on_seaweedfs(seaweed_s3: Any, tmp_path: Path) -> None:
    """Before: no command listed, copied or removed store bundles (``ls``, ``cp``, ``rm`` were
    "invalid choice")."""
    import obstore

    bucket = seaweed_s3.bucket()
    local = _local_bundle(tmp_path)
    url = f"s3://{bucket}/runs/r1"
    up = cli(seaweed_s3, "cp", str(local), url)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"copied {local} -> {url} (fully verified: 3 samples, 3 media files)"
    again = cli(seaweed_s3, "cp", str(local), url)
    assert again.returncode == 2 and "pass --force" in again.stderr, again.stderr
    assert cli(seaweed_s3, "cp", str(local), url, "--force").returncode == 0
    assert cli(seaweed_s3, "pack", url, "-o", f"s3://{bucket}/runs/r2.rbundle").returncode == 0

    listed = cli(seaweed_s3, "ls", f"s3://{bucket}/runs")
    assert listed.returncode == 0 and listed.stdout.splitlines() == [url, f"s3://{bucket}/runs/r2.rbundle"]
    long = json.loads(cli(seaweed_s3, "ls", f"s3://{bucket}/runs", "-l", "--json").stdout)
    assert [(r["location"], r["samples"], r["media_files"]) for r in long] == [
        (url, 3, 3),
        (f"s3://{bucket}/runs/r2.rbundle", 3, 3),
    ]

    down = cli(seaweed_s3, "cp", url, str(tmp_path / "back"), "--json")
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout) == {
        "source": url,
        "copy": str(tmp_path / "back"),
        "verified": "full",
        "samples": 3,
        "media_files": 3,
    }
    assert (tmp_path / "back" / "manifest.json").read_bytes() == (local / "manifest.json").read_bytes()
    assert [s["name"] for s in open_bundle(tmp_path / "back", verify="full")] == ["local"] * 3

    store = _raw(seaweed_s3, bucket)
    obstore.put(store, "runs/r1/README.txt", b"the user's")
    removed = cli(seaweed_s3, "rm", url)
    assert removed.returncode == 0 and removed.stdout.strip() == f"removed {url}", removed.stderr
    left = sorted(m["path"] for batch in obstore.list(store, "runs/") for m in batch)
    assert left == ["runs/r1/README.txt", "runs/r2.rbundle"]
    assert cli(seaweed_s3, "ls", f"s3://{bucket}/runs").stdout.splitlines() == [
        f"s3://{bucket}/runs/r2.rbundle"
    ]
    gone = cli(seaweed_s3, "rm", url)
    assert gone.returncode == 1 and "no bundle here" in gone.stderr


def test_cp_from_store_to_store_and_a_damaged_object_is_never_copied(seaweed_s3: Any, tmp_path: Path) -> None:
    import obstore

    bucket = seaweed_s3.bucket()
    local = _local_bundle(tmp_path)
    src, dst = f"s3://{bucket}/a", f"s3://{bucket}/pool/b"
    assert cli(seaweed_s3, "cp", str(local), src).returncode == 0
    copied = cli(seaweed_s3, "cp", src, dst, "--shared-media")
    assert copied.returncode == 0, copied.stderr
    assert len(open_bundle(dst, verify="full", storage_options=seaweed_s3.options())) == 3
    store = _raw(seaweed_s3, bucket)
    pooled = [m["path"] for batch in obstore.list(store, "pool/.media/") for m in batch]
    assert len(pooled) == 3
    obstore.put(
        store, pooled[0], b"x" * int(obstore.head(store, pooled[0])["size"])
    )  # same size, other bytes
    bad = cli(seaweed_s3, "cp", dst, str(tmp_path / "copy"))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert (
        bad.stderr.startswith(f"rollout-bundle cp: error: {dst}")
        and pooled[0].rsplit("/", 1)[1] in bad.stderr
    )
    assert not (tmp_path / "copy").exists() and not [p for p in tmp_path.iterdir() if ".staging." in p.name]


def test_unpack_of_a_directory_bundle_on_a_store_says_what_it_is(seaweed_s3: Any, tmp_path: Path) -> None:
    """Before: ``unpack s3://b/x`` of a bundle directory said "no bundle here"."""
    bucket = seaweed_s3.bucket()
    url = f"s3://{bucket}/dir"
    upload_bundle(_local_bundle(tmp_path), url, storage_options=seaweed_s3.options())
    out = cli(seaweed_s3, "unpack", url, "-o", str(tmp_path / "u"))
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"rollout-bundle unpack: error: {url}: a bundle directory on the store, not a packed file: copy it "
        f"with `rollout-bundle cp {url} DIR` (or read it in place: open_bundle('{url}'))"
    )
    missing = cli(seaweed_s3, "unpack", f"s3://{bucket}/nothing.rbundle", "-o", str(tmp_path / "u"))
    assert missing.returncode == 1 and "no bundle here (the object does not exist)" in missing.stderr


def test_ls_and_rm_of_local_directories(moto_s3: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    a = _local_bundle(root, "a")
    _local_bundle(root, "b")
    (root / "notes").mkdir()
    (a / "README.txt").write_text("mine")
    listed = cli(moto_s3, "ls", str(root))
    assert listed.returncode == 0 and listed.stdout.splitlines() == [str(root / "a"), str(root / "b")]
    assert cli(moto_s3, "ls", str(a)).stdout.splitlines() == [str(a)]  # a bundle names itself
    removed = cli(moto_s3, "rm", str(a))
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == f"removed {a} (the directory's other files are kept)"
    assert sorted(p.name for p in a.iterdir()) == ["README.txt"]
    assert cli(moto_s3, "ls", str(root)).stdout.splitlines() == [str(root / "b")]
    assert cli(moto_s3, "rm", str(root / "b")).stdout.strip() == f"removed {root / 'b'}"
    assert not (root / "b").exists()


def test_show_names_a_pooled_bundle_s_media_as_stored_files(
    moto_s3: Any, tmp_path: Path, monkeypatch
) -> None:
    """A bundle written with ``shared_media=True`` keeps its media in the parent's pool
    (``<parent>/.media/``), outside ``<bundle>/media/``: ``show`` still names each as the stored
    file it is, as for any bundle (before, it printed the pool URL as a plain string)."""
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "m"
    paths = [put_media(run, hashlib.sha256(bytes([i])).digest() * 50) for i in range(2)]
    url = f"s3://{moto_s3.bucket()}/run/b"
    write_bundle(url, [{"image": p} for p in paths], media_roots=[run], shared_media=True)
    shown = cli(moto_s3, "show", url)
    assert shown.returncode == 0, shown.stderr
    images = [item["sample"]["image"] for item in json.loads(shown.stdout)]
    assert images == [f"media/{Path(p).name}" for p in paths], images
