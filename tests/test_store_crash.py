"""A writer killed with SIGKILL mid-upload, at seeded points (a real subprocess, a real S3 server
on 127.0.0.1): no reader ever sees a partial bundle, a bundle being replaced stays whole, and gc
removes what the dead writer left."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

import bundles

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import BundleError, BundleNotFoundError, open_bundle, write_bundle

ROOT = Path(__file__).resolve().parents[1]
N_MEDIA = 12
WRITER = """
import sys
from bundles import write_bundle
url, run, overwrite = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
import os
paths = sorted(os.path.join(run, n) for n in os.listdir(run))
samples = [{"index": i, "image": p, "tokens": [i] * 100} for i, p in enumerate(paths)]
write_bundle(url, samples, media_roots=[run], overwrite=overwrite, meta={"writer": "new"})
print("COMMITTED")
"""


def _media(tmp_path: Path, tag: str) -> Path:
    run = tmp_path / f"media-{tag}"
    for i in range(N_MEDIA):
        put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 2000)
    return run


def _points() -> list[str]:
    rng = random.Random(20)  # seeded: the same kill points on every run
    return [
        f"store.media@{rng.randint(1, N_MEDIA)}",
        "store.shard@1",
        "store.before-publish",
    ]


@pytest.mark.parametrize("overwrite", [False, True], ids=["new", "replacing"])
@pytest.mark.parametrize("point", _points())
def test_sigkill_mid_upload_never_shows_a_partial_bundle(
    moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, overwrite: bool
) -> None:
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto_s3.bucket()
    url = f"s3://{bucket}/ckpt"
    if overwrite:
        old_run = _media(tmp_path, "old")
        write_bundle(
            url,
            [{"index": 0, "image": str(next(old_run.iterdir()))}],
            media_roots=[old_run],
            meta={"writer": "old"},
        )
    run = _media(tmp_path, "new")

    seen: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                b = open_bundle(url, verify="full")
                seen.append(b.meta["writer"])
                assert len(list(b)) == len(b)
            except BundleNotFoundError:
                seen.append("none")
            except BundleError as e:  # a replaced bundle mid-read is named, never torn
                seen.append(type(e).__name__)

    t = threading.Thread(target=reader)
    t.start()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ROLLOUT_BUNDLES_KILL_AT": point}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", WRITER, url, str(run), "1" if overwrite else "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop.set()
        t.join()
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "COMMITTED" not in proc.stdout
    if overwrite:
        b = open_bundle(url, verify="full")  # the previous bundle, whole
        assert b.meta == {"writer": "old"} and len(b) == 1
        assert set(seen) <= {"old"}, seen
    else:
        with pytest.raises(BundleNotFoundError):
            open_bundle(url)
        assert set(seen) <= {"none"}, seen

    bundles.collect_garbage(f"s3://{bucket}", older_than_s=0)
    # After gc, only the live bundle's objects remain (nothing at all for a new bundle).
    raw = S3Store(bucket, **moto_s3.options(), client_options={"allow_http": True})
    left = sorted(m["path"] for batch in obstore.list(raw) for m in batch)
    if overwrite:
        b = open_bundle(url)
        gen = json.loads(bytes(obstore.get(raw, "ckpt/bundle.json").bytes()))["generation"]
        needed = {"ckpt/bundle.json", f"ckpt/{gen}/manifest.json", f"ckpt/{gen}/samples/000000.msgpack.zst"}
        needed |= {f"ckpt/media/{r.filename}" for r in b.media}
        assert set(left) == needed
    else:
        assert left == []
    # A new write after the crash succeeds.
    write_bundle(url, [{"index": 1}], overwrite=True)
    assert len(open_bundle(url, verify="full")) == 1
