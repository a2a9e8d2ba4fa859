"""Verify, then publish (issue 36, items 3, 4, 7 and 9): a store writer publishes only what it
proved, and a writer told it published has every object its manifest lists whatever a racing
``rm`` or ``gc`` did; a forged size costs one request, not memory; a SIGKILLed ``cp`` leaves no
scratch for ever. Real SeaweedFS on 127.0.0.1, a loopback proxy that holds a DELETE or a PUT
where the test wants it (tests/helpers/hold_proxy.py), fault points, real subprocesses."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

from bundles import (
    BundleError,
    BundleVerificationError,
    collect_garbage,
    open_bundle,
    remove_bundle,
    upload_bundle,
    write_bundle,
)
from bundles.support import LIMITS, on_fault_point

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def s3(seaweed_s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in seaweed_s3.env.items():
        monkeypatch.setenv(k, v)
    return seaweed_s3


@pytest.fixture
def proxy(seaweed_s3: Any) -> Iterator[Any]:
    from helpers.hold_proxy import HoldProxy

    p = HoldProxy(seaweed_s3.endpoint)
    yield p
    for h in p.holds:
        h.release()
    p.close()


def _client(server: Any) -> Any:
    from helpers.store import _boto

    return _boto(server.endpoint)


def _keys(server: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    c = _client(server)
    found = c.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in found}


def _media(tmp_path: Path, tag: str, n: int = 3) -> tuple[Path, list[str]]:
    run = tmp_path / f"run-{tag}"
    return run, [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 300) for i in range(n)]


def _local(tmp_path: Path, name: str, images: list[str], run: Path, v: int) -> Path:
    out = tmp_path / name
    write_bundle(out, [{"v": v, "i": i, "image": p} for i, p in enumerate(images)], media_roots=[run])
    return out


def cli(server: Any, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **server.env, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=300,
    )


# -- item 3: a skipped pool object is proven before the pointer goes -----------------------------
def test_cp_force_shared_media_never_publishes_over_a_pool_object_with_other_bytes(
    s3: Any, tmp_path: Path
) -> None:
    """`cp SRC U --force --shared-media` where the pool holds one of SRC's media with the right
    size and other bytes: refused before publishing, naming the object and both digests; the
    bundle at U is the old one, whole; the new generation is gone; a user's file stays."""
    bucket = s3.bucket()
    url = f"s3://{bucket}/run/x"
    run_old, old_images = _media(tmp_path, "old", 1)
    write_bundle(url, [{"v": 1, "image": old_images[0]}], media_roots=[run_old], shared_media=True)
    run, images = _media(tmp_path, "new")
    src = _local(tmp_path, "src", images, run, 2)
    c = _client(s3)
    c.put_object(Bucket=bucket, Key="run/x/notes.txt", Body=b"mine")
    victim = Path(images[1]).name
    good = Path(images[1]).read_bytes()
    bad = bytes(b ^ 0xFF for b in good)  # same size, other bytes
    c.put_object(Bucket=bucket, Key=f"run/.media/{victim}", Body=bad)
    before = _keys(s3, bucket, "run/x/")

    proc = cli(s3, "cp", str(src), url, "--force", "--shared-media")

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _keys(s3, bucket, "run/x/") == before  # pointer, generation, notes.txt: untouched
    where = f"s3://{bucket}/run/.media/{victim}"
    expected = f"expected {len(good)} bytes with sha256:{hashlib.sha256(good).hexdigest()}"
    found = f"found {len(bad)} bytes with sha256:{hashlib.sha256(bad).hexdigest()}"
    assert f"{where}: {expected}, {found}" in proc.stderr, proc.stderr
    assert "not published" in proc.stderr
    with open_bundle(url, verify="full") as b:
        assert [s["v"] for s in b] == [1]
    assert _keys(s3, bucket, f"run/.media/{victim}")[f"run/.media/{victim}"] == bad  # left, reported


def test_an_upload_reading_back_a_skipped_object_with_other_bytes_publishes_nothing(
    s3: Any, tmp_path: Path
) -> None:
    """The same rule for every writer (write_bundle to a URL, Location.stage, the trainer): what
    it skips as "already there" is read back and hashed before the pointer."""
    bucket = s3.bucket()
    url = f"s3://{bucket}/b"
    run, images = _media(tmp_path, "m")
    write_bundle(url, [{"v": 1, "image": images[0]}], media_roots=[run])
    _client(s3).put_object(
        Bucket=bucket, Key=f"b/media/{Path(images[2]).name}", Body=b"\0" * Path(images[2]).stat().st_size
    )
    before = _keys(s3, bucket, "b/")
    src = _local(tmp_path, "src", images, run, 2)
    with pytest.raises(BundleVerificationError, match=rf"b/media/{Path(images[2]).name}: expected") as e:
        upload_bundle(src, url, overwrite=True)
    assert "(not published; the bundle there is unchanged)" in str(e.value)
    after = _keys(s3, bucket, "b/")
    assert {k: after.get(k) for k in before} == before  # pointer, generation: untouched
    # What it uploaded (content-addressed media, now unlisted) is left to gc, as after any failure.
    assert {k for k in after if k not in before} <= {f"b/media/{Path(p).name}" for p in images}
    with open_bundle(url, verify="full") as b:
        assert [s["v"] for s in b] == [1]


def test_skipped_objects_are_read_back_and_what_went_missing_is_uploaded(s3: Any, tmp_path: Path) -> None:
    bucket = s3.bucket()
    run, images = _media(tmp_path, "m")
    src = _local(tmp_path, "src", images, run, 1)
    first = upload_bundle(src, f"s3://{bucket}/a/one", shared_media=True)
    assert (first.media_uploaded, first.media_skipped, first.objects_read_back) == (3, 0, 0)

    def delete_one(*_: object) -> None:  # between the skip and the read-back
        _client(s3).delete_object(Bucket=bucket, Key=f"a/.media/{Path(images[0]).name}")

    with on_fault_point("store.before-verify", delete_one):
        second = upload_bundle(src, f"s3://{bucket}/a/two", shared_media=True)
    for u in ("one", "two"):
        with open_bundle(f"s3://{bucket}/a/{u}", verify="full") as b:
            assert len(b.media) == 3
    assert (second.media_uploaded, second.media_skipped, second.objects_read_back) == (0, 3, 3)


# -- item 4: rm and gc racing a writer -----------------------------------------------------------
def test_rm_racing_a_writer_of_the_same_screenshots_leaves_it_every_object(
    s3: Any, proxy: Any, tmp_path: Path
) -> None:
    """`rm U` (another process) while a writer replaces U with the same screenshots: the writer
    skipped the media as already there; rm's deletes are held at the proxy until the writer has
    put and read back its pointer, then land. The writer, told it published, finds them gone
    and puts them back: U verifies in full; a user's file beside the bundle stays."""
    bucket = s3.bucket()
    url = f"s3://{bucket}/run/step"
    run, images = _media(tmp_path, "m")
    write_bundle(url, [{"v": 1, "i": i, "image": p} for i, p in enumerate(images)], media_roots=[run])
    _client(s3).put_object(Bucket=bucket, Key="run/notes.txt", Body=b"mine")
    src = _local(tmp_path, "src", images, run, 2)
    held = proxy.hold("POST", "?delete", nth=2)  # rm's first delete is the pointer's
    errors: list[BaseException] = []

    def rm() -> None:
        try:
            remove_bundle(url, storage_options=s3.options(endpoint=proxy.endpoint))
        except BaseException as e:  # reported by the test
            errors.append(e)

    remover = threading.Thread(target=rm)

    def rm_starts(*_: object) -> None:
        remover.start()
        held.wait_arrived()  # rm read the old pointer, deleted it, chose what to delete

    def rm_lands(*_: object) -> None:
        if not held.released.is_set():
            held.release()
            remover.join(60)

    try:
        with (
            on_fault_point("store.before-publish", rm_starts),
            on_fault_point("store.after-publish", rm_lands),
        ):
            stats = upload_bundle(src, url, overwrite=True)
    finally:
        held.release()
        remover.join(60)
    assert not errors and not remover.is_alive()
    with open_bundle(url, verify="full") as b:
        assert [s["v"] for s in b] == [2, 2, 2] and len(b.media) == 3
    assert stats.media_skipped == 3 and stats.objects_restored >= 3
    assert _keys(s3, bucket, "run/notes.txt") == {"run/notes.txt": b"mine"}


def _orphaned_pool(s3: Any, bucket: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """``A/one`` once listed three pooled media and no longer does: they are gc's garbage."""
    run, images = _media(tmp_path, "m")
    write_bundle(
        f"s3://{bucket}/A/one",
        [{"i": i, "image": p} for i, p in enumerate(images)],
        media_roots=[run],
        shared_media=True,
    )
    write_bundle(f"s3://{bucket}/A/one", [{"i": 0}], shared_media=True, overwrite=True)
    _client(s3).put_object(Bucket=bucket, Key="A/notes.txt", Body=b"mine")
    return run, images


def test_gc_during_a_writers_slow_shard_upload_cannot_take_the_media_it_reuses(
    s3: Any, proxy: Any, tmp_path: Path
) -> None:
    """The writer reuses orphaned pool media; its shard PUT is held at the proxy while gc runs
    and deletes them (nothing of the writer's lists them yet). The writer finds them missing
    when it reads them back, uploads them, and publishes a whole bundle."""
    bucket = s3.bucket()
    run, images = _orphaned_pool(s3, bucket, tmp_path)
    src = _local(tmp_path, "src", images, run, 2)
    held = proxy.hold("PUT", "/samples/")
    result: list[Any] = []

    def write() -> None:
        try:
            result.append(
                upload_bundle(
                    src,
                    f"s3://{bucket}/A/two",
                    shared_media=True,
                    storage_options=s3.options(endpoint=proxy.endpoint),
                )
            )
        except BaseException as e:  # reported by the test
            result.append(e)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        held.wait_arrived()
        report = collect_garbage(f"s3://{bucket}/A", older_than_s=0)
        assert sorted(k.rpartition("/")[2] for k in report.media) == sorted(Path(p).name for p in images)
    finally:
        held.release()
        writer.join(120)
    (stats,) = result
    assert isinstance(stats, object) and not isinstance(stats, BaseException), stats
    assert stats.media_skipped == 3
    with open_bundle(f"s3://{bucket}/A/two", verify="full") as b:
        assert len(b.media) == 3
    with open_bundle(f"s3://{bucket}/A/one", verify="full") as b:
        assert len(b) == 1
    assert _keys(s3, bucket, "A/notes.txt") == {"A/notes.txt": b"mine"}


def test_a_gc_delete_landing_after_the_writer_published_is_put_back(
    s3: Any, proxy: Any, tmp_path: Path
) -> None:
    """gc judged the orphaned pool media garbage before the writer started; its DELETE is held at
    the proxy until the writer has published (having read the media back whole), then lands. The
    writer's check after publishing finds them gone and puts them back."""
    bucket = s3.bucket()
    run, images = _orphaned_pool(s3, bucket, tmp_path)
    src = _local(tmp_path, "src", images, run, 2)
    held = proxy.hold("POST", "?delete", nth=2)  # gc's first delete is its clock reference's
    reports: list[Any] = []
    gc = threading.Thread(
        target=lambda: reports.append(
            collect_garbage(
                f"s3://{bucket}/A", older_than_s=0, storage_options=s3.options(endpoint=proxy.endpoint)
            )
        )
    )
    gc.start()

    def gc_lands(*_: object) -> None:
        if not held.released.is_set():
            held.release()
            gc.join(60)

    try:
        held.wait_arrived()
        with on_fault_point("store.after-publish", gc_lands):
            stats = upload_bundle(src, f"s3://{bucket}/A/two", shared_media=True)
    finally:
        held.release()
        gc.join(60)
    assert len(reports[0].media) == 3  # gc did delete them
    with open_bundle(f"s3://{bucket}/A/two", verify="full") as b:
        assert len(b.media) == 3
    assert stats.media_skipped == 3 and stats.objects_read_back == 3 and stats.objects_restored == 3
    assert _keys(s3, bucket, "A/notes.txt") == {"A/notes.txt": b"mine"}


def test_a_writer_whose_bundle_was_removed_after_it_published_puts_nothing_back(
    s3: Any, tmp_path: Path
) -> None:
    """A remove that came after the publication is not undone: the check stops when the pointer
    no longer names the writer's generation."""
    bucket = s3.bucket()
    url = f"s3://{bucket}/b"
    run, images = _media(tmp_path, "m")
    src = _local(tmp_path, "src", images, run, 1)

    def removed(*_: object) -> None:
        remove_bundle(url)

    with on_fault_point("store.after-publish", removed):
        stats = upload_bundle(src, url)
    assert stats.objects_restored == 0
    assert not [k for k in _keys(s3, bucket, "b/") if "/media/" in k or k.endswith("bundle.json")]


# -- item 7: a forged size is refused before it is spent -----------------------------------------
RSS_CHILD = """
import resource, sys
from trainer_hooks.cli import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    code = main(["cp", sys.argv[1], sys.argv[2]])
except SystemExit as e:
    code = e.code
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RSS_GROWTH_KIB", after - before, "EXIT", code)
"""


@pytest.mark.parametrize(
    ("field", "size"),
    [("media", 2**47), ("media", 2**62), ("shards", 2**62)],
    ids=["media-2^47", "media-2^62", "shard-2^62"],
)
def test_a_forged_size_is_refused_at_once_in_bounded_memory(
    s3: Any, tmp_path: Path, field: str, size: int
) -> None:
    bucket = s3.bucket()
    url = f"s3://{bucket}/forged"
    image = put_media(tmp_path / "run", b"\x89PNG" + b"x" * 76)  # an 80-byte object
    write_bundle(url, [{"image": image}], media_roots=[tmp_path / "run"])
    c = _client(s3)
    pointer = json.loads(c.get_object(Bucket=bucket, Key="forged/bundle.json")["Body"].read())
    key = f"forged/{pointer['generation']}/manifest.json"
    manifest = json.loads(c.get_object(Bucket=bucket, Key=key)["Body"].read())
    manifest[field][0]["size"] = size
    raw = json.dumps(manifest, sort_keys=True).encode()
    c.put_object(Bucket=bucket, Key=key, Body=raw)
    pointer["manifest"] = {"size": len(raw), "digest": "sha256:" + hashlib.sha256(raw).hexdigest()}
    c.put_object(Bucket=bucket, Key="forged/bundle.json", Body=json.dumps(pointer).encode())

    proc = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, url, str(tmp_path / "copy")],
        capture_output=True,
        text=True,
        env={**os.environ, **s3.env, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert "RSS_GROWTH_KIB" in proc.stdout, proc.stderr[-2000:]
    growth = int(proc.stdout.split("RSS_GROWTH_KIB ")[1].split()[0])
    assert proc.stdout.strip().endswith("EXIT 1"), proc.stdout + proc.stderr
    assert growth < 64 * 1024, f"RSS grew {growth} KiB"
    if field == "media":
        limit = LIMITS["MAX_MEDIA_BYTES"]
        assert (
            f"{url}/manifest.json: media[0].size: {size} exceeds MAX_MEDIA_BYTES, the cap of {limit} bytes"
            in proc.stderr
        ), proc.stderr
    else:
        assert f"{url}/samples/000000.msgpack.zst: expected {size} bytes" in proc.stderr, proc.stderr
    assert not (tmp_path / "copy").exists()


# -- item 9: a SIGKILLed store-to-store cp leaves nothing for ever --------------------------------
def test_a_sigkilled_store_to_store_cp_scratch_is_removed_by_the_next_cp(s3: Any, tmp_path: Path) -> None:
    bucket = s3.bucket()
    run, images = _media(tmp_path, "m")
    write_bundle(f"s3://{bucket}/src", [{"image": p} for p in images], media_roots=[run])
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    (tmp / "notes.txt").write_text("mine")
    (tmp / "rollout-bundle-cp-mine").mkdir()  # a user's directory named like the old scratch
    (tmp / "rollout-bundle-cp-mine" / "keep.txt").write_text("mine")
    env = {"TMPDIR": str(tmp)}

    killed = cli(
        s3,
        "cp",
        f"s3://{bucket}/src",
        f"s3://{bucket}/dst",
        env={**env, "ROLLOUT_BUNDLES_KILL_AT": "store.shard"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = sorted(set(os.listdir(tmp)) - {"notes.txt", "rollout-bundle-cp-mine"})
    assert len(left) == 1 and (tmp / left[0] / "bundle" / "manifest.json").is_file(), left

    done = cli(s3, "cp", f"s3://{bucket}/src", f"s3://{bucket}/dst", env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp)) == ["notes.txt", "rollout-bundle-cp-mine"]
    assert (tmp / "rollout-bundle-cp-mine" / "keep.txt").read_text() == "mine"
    with open_bundle(f"s3://{bucket}/dst", verify="full") as b:
        assert len(b.media) == 3


def test_a_scratch_of_a_live_cp_is_left_alone(s3: Any, tmp_path: Path) -> None:
    """Only a provably dead writer's scratch goes: one named after a live process stays."""
    bucket = s3.bucket()
    run, images = _media(tmp_path, "m")
    write_bundle(f"s3://{bucket}/src", [{"image": p} for p in images], media_roots=[run])
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    from bundles.support import scratch_dir

    live = scratch_dir(tmp / "rollout-bundle-cp", "copy")  # this process: alive
    done = cli(s3, "cp", f"s3://{bucket}/src", f"s3://{bucket}/dst", env={"TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr
    assert os.listdir(tmp) == [live.name]


def test_a_packed_object_is_verified_before_its_put_and_its_scratch_outlives_no_sigkill(
    s3: Any, tmp_path: Path
) -> None:
    """`pack -o URL`: the put is the publication, of a file every member of which was hashed as it
    was packed: a bundle with a medium of other bytes (same size) never replaces the object. A
    packer SIGKILLed before its put leaves a scratch that the next pack removes."""
    bucket = s3.bucket()
    url = f"s3://{bucket}/run/b.rbundle"
    run, images = _media(tmp_path, "m")
    good = _local(tmp_path, "good", images, run, 1)
    assert cli(s3, "pack", str(good), "-o", url).returncode == 0
    before = _keys(s3, bucket, "run/")
    bad = _local(tmp_path, "bad", images[:1], run, 2)
    medium = bad / "media" / Path(images[0]).name
    data = medium.read_bytes()
    medium.unlink()  # a hard link of the run's file (and of good's): a new file, not an edit
    medium.write_bytes(bytes(b ^ 1 for b in data))
    refused = cli(s3, "pack", str(bad), "-o", url, "--force")
    assert refused.returncode == 1 and f"media/{medium.name}" in refused.stderr, refused.stderr
    assert _keys(s3, bucket, "run/") == before

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    (tmp / "notes.txt").write_text("mine")
    env = {"TMPDIR": str(tmp)}
    other = f"s3://{bucket}/run/c.rbundle"
    killed = cli(
        s3, "pack", str(good), "-o", other, env={**env, "ROLLOUT_BUNDLES_KILL_AT": "store.before-put"}
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(os.listdir(tmp)) == 2
    assert cli(s3, "pack", str(good), "-o", other, env=env).returncode == 0
    assert os.listdir(tmp) == ["notes.txt"]
    with open_bundle(other, verify="full") as b:
        assert len(b) == 3


def test_a_local_manifest_listing_an_oversize_medium_is_refused_when_parsed(tmp_path: Path) -> None:
    """The cap is the manifest parser's, so every reader has it (a directory here, not a store)."""
    run, images = _media(tmp_path, "m", 1)
    out = _local(tmp_path, "b", images, run, 1)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["media"][0]["size"] = LIMITS["MAX_MEDIA_BYTES"] + 1
    (out / "manifest.json").chmod(0o644)
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
    with pytest.raises(
        BundleError, match=rf"media\[0\]\.size: {LIMITS['MAX_MEDIA_BYTES'] + 1} exceeds MAX_MEDIA_BYTES"
    ):
        open_bundle(out, verify="none")


@pytest.mark.parametrize("threshold", [1 << 20, 16], ids=["one-get", "windows"])
def test_reading_back_an_object_reports_what_is_there(
    s3: Any, monkeypatch: pytest.MonkeyPatch, threshold: int
) -> None:
    """The read-back's verdicts, by one GET and (above the multipart threshold, made small here)
    in windows: the right bytes, other bytes, longer, shorter, missing."""
    from bundles._store import verify as _verify
    from bundles._store.client import get_store
    from bundles._urls import StoreURL

    monkeypatch.setattr(_verify, "MULTIPART_THRESHOLD", threshold)
    monkeypatch.setattr(_verify, "READ_WINDOW", 5)
    bucket = s3.bucket()
    store = get_store(StoreURL(f"s3://{bucket}/x"))
    data = bytes(range(23))
    _client(s3).put_object(Bucket=bucket, Key="x/obj", Body=data)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert _verify.stored_digest(store, "x/obj", 23) == (23, digest)
    assert _verify.stored_digest(store, "x/obj", 22) == (23, "(not read)")  # longer than listed
    shorter = _verify.stored_digest(store, "x/obj", 24)
    assert shorter is not None and shorter[0] == 23  # its size tells
    assert _verify.stored_digest(store, "x/none", 23) is None
