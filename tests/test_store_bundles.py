"""Bundles on an object store, against real S3 servers on 127.0.0.1 (moto in-process; SeaweedFS,
disk-backed, where marked): write with the commit protocol without rename, read in place, verify,
rehydrate, overwrite by compare-and-swap, packed objects by member ranges, removal and gc."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

import bundles

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import (
    BundleExistsError,
    BundleNotFoundError,
    BundleVerificationError,
    MediaRef,
    is_bundle,
    open_bundle,
    pack_bundle,
    remove_bundle,
    unpack_bundle,
    write_bundle,
)


@pytest.fixture(params=["moto", pytest.param("seaweedfs", marks=pytest.mark.slow)])
def s3(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A server with a fresh bucket, configured through the standard environment."""
    server = request.getfixturevalue("moto_s3" if request.param == "moto" else "seaweed_s3")
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    server.current = server.bucket()
    return server


@pytest.fixture
def moto(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    moto_s3.current = moto_s3.bucket()
    return moto_s3


def raw_store(server: Any) -> Any:
    """An obstore client of the test's own (not the code under test's) to look at the bucket."""
    return S3Store(server.current, **server.options(), client_options={"allow_http": True})


def keys(server: Any, prefix: str = "") -> list[str]:
    return sorted(m["path"] for batch in obstore.list(raw_store(server), prefix or None) for m in batch)


def samples_with_media(
    tmp_path: Path, n: int = 3, seed: int = 0
) -> tuple[list[dict[str, Any]], Path, list[bytes]]:
    run = tmp_path / "run-media"
    blobs = [hashlib.sha256(f"{seed}-{i}".encode()).digest() * (100 + i) for i in range(n)]
    paths = [put_media(run, b) for b in blobs]
    samples = [
        {"index": i, "tokens": list(range(i, i + 10)), "image": p, "again": paths[0], "reward": 0.5 * i}
        for i, p in enumerate(paths)
    ]
    return samples, run, blobs


def test_write_open_verify_rehydrate_roundtrip(s3: Any, tmp_path: Path) -> None:
    samples, run, blobs = samples_with_media(tmp_path)
    url = f"s3://{s3.current}/runs/r1/step_1"
    out = write_bundle(url, samples, media_roots=[run], kind="rollout_checkpoint", meta={"step": 1})
    assert str(out) == url
    stored = keys(s3)
    assert "runs/r1/step_1/bundle.json" in stored
    assert sum(k.startswith("runs/r1/step_1/media/") for k in stored) == 3  # three files, once each
    assert not list(tmp_path.glob(".*staging*"))  # the local scratch copy is gone

    assert is_bundle(url) and not is_bundle(f"s3://{s3.current}/runs/r1/nothing")
    with open_bundle(url, verify="full") as b:
        assert len(b) == 3 and b.kind == "rollout_checkpoint" and b.meta == {"step": 1}
        got = list(b)
        assert [s["tokens"] for s in got] == [s["tokens"] for s in samples]
        assert got[1]["image"] == f"{url}/media/{hashlib.sha256(blobs[1]).hexdigest()}.png"
        with b.open_media(got[2]["image"]) as f:
            assert f.read() == blobs[2]
        placed = b.rehydrate(tmp_path / "new-run")
    for s, blob in zip(placed, blobs, strict=True):
        assert Path(s["image"]).read_bytes() == blob
        assert Path(s["again"]).read_bytes() == blobs[0]


def test_storage_options_override_the_environment(
    moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples, run, _ = samples_with_media(tmp_path, n=1)
    for k in moto.env:
        monkeypatch.delenv(k)
    url = f"s3://{moto.current}/x"
    write_bundle(url, samples, media_roots=[run], storage_options=moto.options())
    assert len(open_bundle(url, storage_options=moto.options())) == 1


def test_a_second_write_without_overwrite_is_refused(moto: Any, tmp_path: Path) -> None:
    samples, run, _ = samples_with_media(tmp_path)
    url = f"s3://{moto.current}/b"
    write_bundle(url, samples, media_roots=[run])
    before = keys(moto)
    with pytest.raises(BundleExistsError, match=rf"^{url}: destination exists; pass overwrite=True"):
        write_bundle(url, samples[:1], media_roots=[run])
    assert keys(moto) == before


def test_overwrite_swaps_the_pointer_and_removes_the_old_generation(s3: Any, tmp_path: Path) -> None:
    samples, run, _ = samples_with_media(tmp_path)
    url = f"s3://{s3.current}/b"
    write_bundle(url, samples, media_roots=[run])
    old = open_bundle(url)
    old_gen = json.loads(bytes(obstore.get(raw_store(s3), "b/bundle.json").bytes()))["generation"]
    write_bundle(url, samples[:2], media_roots=[run], overwrite=True, meta={"v": 2})
    new = open_bundle(url)
    assert len(new) == 2 and new.meta == {"v": 2}
    assert not any(k.startswith(f"b/{old_gen}/") for k in keys(s3))
    # The bundle opened before the swap tells that it was replaced, not damaged.
    from bundles import BundleReplacedError

    with pytest.raises(BundleReplacedError):
        list(old)


def test_two_writers_race_for_one_destination_exactly_one_wins(s3: Any, tmp_path: Path) -> None:
    """The create-only put of the pointer decides: the loser gets the named error, and the
    winner's bundle is complete and untouched."""
    a, run_a, _ = samples_with_media(tmp_path / "a", seed=1)
    b, run_b, _ = samples_with_media(tmp_path / "b", seed=2)
    url = f"s3://{s3.current}/race"
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def writer(name: str, samples: list[Any], run: Path) -> None:
        local = write_bundle(tmp_path / f"local-{name}", samples, media_roots=[run])
        barrier.wait()
        try:
            results[name] = bundles.upload_bundle(local, url)
        except BundleExistsError as e:
            results[name] = e

    threads = [
        threading.Thread(target=writer, args=("a", a, run_a)),
        threading.Thread(target=writer, args=("b", b, run_b)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [v for v in results.values() if isinstance(v, BundleExistsError)]
    assert len(errors) == 1, results
    assert str(errors[0]).startswith(f"{url}: ")
    winner = next(k for k, v in results.items() if not isinstance(v, BundleExistsError))
    got = open_bundle(url, verify="full")
    expected = a if winner == "a" else b
    assert [s["tokens"] for s in got] == [s["tokens"] for s in expected]
    with got.open_media(got[0]["image"]) as f:
        assert f.read() == Path(expected[0]["image"]).read_bytes()


def test_shared_media_pool_uploads_a_file_once_across_bundles(s3: Any, tmp_path: Path) -> None:
    samples, run, _ = samples_with_media(tmp_path, n=4)
    base = f"s3://{s3.current}/run/ckpt"
    first = bundles.upload_bundle(
        write_bundle(tmp_path / "l1", samples[:3], media_roots=[run]), f"{base}/iter_1", shared_media=True
    )
    second = bundles.upload_bundle(
        write_bundle(tmp_path / "l2", samples, media_roots=[run]), f"{base}/iter_2", shared_media=True
    )
    assert (first.media_uploaded, first.media_skipped) == (3, 0)
    assert (second.media_uploaded, second.media_skipped) == (1, 3)  # only the new screenshot
    assert sum(k.startswith("run/ckpt/.media/") for k in keys(s3)) == 4
    for name in ("iter_1", "iter_2"):
        b = open_bundle(f"{base}/{name}", verify="full")
        assert all(Path(s["image"]).name in {r.filename for r in b.media} for s in b)

    # Retention removes iter_1: the media iter_2 needs stay; gc removes none of them.
    remove_bundle(f"{base}/iter_1")
    report = bundles.collect_garbage(base, older_than_s=0)
    assert report.media == [] and report.bundles == 1
    open_bundle(f"{base}/iter_2", verify="full")
    # Once iter_2 goes too, no pointer beside the pool proves it is one of ours: gc leaves it and
    # says so (tests/test_store_gc.py holds the rest of gc's rule).
    remove_bundle(f"{base}/iter_2")
    done = bundles.collect_garbage(base, older_than_s=0)
    assert done.media == [] and [(k.where, k.objects) for k in done.skipped] == [(f"{base}/.media", 4)]
    assert sum(k.startswith("run/ckpt/.media/") for k in keys(s3)) == 4


def test_gc_removes_unpublished_generations_only(moto: Any, tmp_path: Path) -> None:
    samples, run, _ = samples_with_media(tmp_path)
    url = f"s3://{moto.current}/p/b"
    write_bundle(url, samples, media_roots=[run])
    store = raw_store(moto)
    orphan = "p/b/g20260101T000000000000Z-0123456789ab"
    obstore.put(store, f"{orphan}/samples/000000.msgpack.zst", b"partial")
    before = set(keys(moto))
    report = bundles.collect_garbage(f"s3://{moto.current}/p", older_than_s=0)
    assert report.generations == [orphan]
    assert set(keys(moto)) == before - {f"{orphan}/samples/000000.msgpack.zst"}
    open_bundle(url, verify="full")


def test_a_damaged_object_fails_verification_naming_it(moto: Any, tmp_path: Path) -> None:
    samples, run, blobs = samples_with_media(tmp_path)
    url = f"s3://{moto.current}/d"
    write_bundle(url, samples, media_roots=[run])
    name = hashlib.sha256(blobs[1]).hexdigest() + ".png"
    obstore.put(raw_store(moto), f"d/media/{name}", b"X" * len(blobs[1]))
    open_bundle(url)  # fast: sizes agree
    with pytest.raises(BundleVerificationError) as info:
        open_bundle(url, verify="full")
    assert info.value.problems == [
        f"{url}/media/{name}: digest: expected sha256:{hashlib.sha256(blobs[1]).hexdigest()}, "
        f"found sha256:{hashlib.sha256(b'X' * len(blobs[1])).hexdigest()}"
    ]


def test_a_bundle_synced_verbatim_is_read(moto: Any, tmp_path: Path) -> None:
    """``aws s3 sync bundle_dir s3://b/x`` (no pointer): read as a plain layout."""
    samples, run, _ = samples_with_media(tmp_path)
    local = write_bundle(tmp_path / "plain", samples, media_roots=[run])
    store = raw_store(moto)
    for f in local.rglob("*"):
        if f.is_file():
            obstore.put(store, f"plain/{f.relative_to(local)}", f.read_bytes())
    b = open_bundle(f"s3://{moto.current}/plain", verify="full")
    assert [s["tokens"] for s in b] == [s["tokens"] for s in samples]


def test_packed_object_is_read_in_place_by_member_ranges(s3: Any, tmp_path: Path) -> None:
    samples, run, blobs = samples_with_media(tmp_path, n=5)
    local = write_bundle(tmp_path / "b", samples, media_roots=[run])
    url = f"s3://{s3.current}/packs/b.rbundle"
    pack_bundle(local, url)
    with pytest.raises(BundleExistsError):
        pack_bundle(local, url)
    b = open_bundle(url, verify="full")
    assert b.packed
    got = list(b)
    assert [s["tokens"] for s in got] == [s["tokens"] for s in samples]
    with b.open_media(got[3]["image"]) as f:
        assert f.read() == blobs[3]
    placed = b.rehydrate(tmp_path / "m")
    assert Path(placed[4]["image"]).read_bytes() == blobs[4]
    out = unpack_bundle(url, tmp_path / "unpacked")
    assert len(out) == 5 and not out.packed


def test_missing_bucket_and_missing_bundle_are_named(moto: Any, tmp_path: Path) -> None:
    samples, run, _ = samples_with_media(tmp_path, n=1)
    with pytest.raises(
        BundleNotFoundError, match=r"^s3://no-such-bucket-x/b: .*the bucket 'no-such-bucket-x' does not exist"
    ):
        write_bundle("s3://no-such-bucket-x/b", samples, media_roots=[run])
    with pytest.raises(BundleNotFoundError, match=rf"^s3://{moto.current}/nothing: no bundle here"):
        open_bundle(f"s3://{moto.current}/nothing")


def test_missing_credentials_are_named(moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bundles import BundleIOError

    samples, run, _ = samples_with_media(tmp_path, n=1)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    # No instance-metadata service either: point it at a closed port on loopback.
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
    url = f"s3://{moto.current}/c"
    with pytest.raises(BundleIOError, match=rf"^{url}: .*no credentials: set AWS_ACCESS_KEY_ID"):
        write_bundle(url, samples, media_roots=[run])
    with pytest.raises(BundleIOError, match="no credentials"):
        open_bundle(url)


@pytest.mark.slow
def test_wrong_credentials_are_named(
    seaweed_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SeaweedFS checks signatures (moto does not)."""
    from bundles import BundleIOError

    for k, v in seaweed_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = seaweed_s3.bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    samples, run, _ = samples_with_media(tmp_path, n=1)
    with pytest.raises(
        BundleIOError, match=rf"^s3://{bucket}/w: cannot .*: access denied \(check the credentials\)"
    ):
        write_bundle(f"s3://{bucket}/w", samples, media_roots=[run])


def test_media_refs_without_paths_and_images(moto: Any, tmp_path: Path) -> None:
    _, run, blobs = samples_with_media(tmp_path, n=1)
    ref = MediaRef("sha256:" + hashlib.sha256(blobs[0]).hexdigest(), len(blobs[0]), ".png")
    url = f"s3://{moto.current}/refs"
    write_bundle(url, [{"ref": ref}], media_roots=[run])
    got = open_bundle(url)[0]["ref"]
    assert isinstance(got, MediaRef) and got.digest == ref.digest


def test_a_large_packed_object_is_indexed_in_three_requests(moto: Any, tmp_path: Path) -> None:
    """The headers lie past the first read: fetched together, where the packer's layout puts
    them (one request per header, one after another, before). Counted at a proxy."""
    from helpers.store import FaultProxy

    run = tmp_path / "big"
    blobs = [hashlib.sha256(bytes([i])).digest() * 12_500 for i in range(6)]  # 400 KB each
    paths = [put_media(run, b) for b in blobs]
    local = write_bundle(
        tmp_path / "b", [{"index": i, "image": p} for i, p in enumerate(paths)], media_roots=[run]
    )
    url = f"s3://{moto.current}/big.rbundle"
    pack_bundle(local, url)
    proxy = FaultProxy(moto.endpoint)
    try:
        b = open_bundle(url, verify="none", storage_options=moto.options(endpoint=proxy.endpoint))
        gets = [h for h in proxy.hits if h[0] == "GET"]
        # The first MiB, the headers (one get_ranges call: ranges under 1 MiB apart merged into
        # one request, the rest fetched concurrently), the end of the archive; 9 before.
        assert len(gets) <= 4, proxy.hits
        with b.open_media(b[5]["image"]) as f:
            assert f.read() == blobs[5]
        b.verify(full=True)
    finally:
        proxy.close()


def test_gc_leaves_a_bundle_whose_pointer_it_cannot_read(moto: Any, tmp_path: Path) -> None:
    """A pointer of a newer version: nothing under that bundle is judged garbage."""
    samples, run, _ = samples_with_media(tmp_path)
    write_bundle(f"s3://{moto.current}/p/b", samples, media_roots=[run], shared_media=True)
    store = raw_store(moto)
    pointer = json.loads(bytes(obstore.get(store, "p/b/bundle.json").bytes()))
    obstore.put(store, "p/b/bundle.json", json.dumps({**pointer, "pointer_version": 2}).encode())
    before = keys(moto)
    report = bundles.collect_garbage(f"s3://{moto.current}/p/b", older_than_s=0)
    assert report.generations == [] and keys(moto) == before


def test_list_remote_bundles_names_the_bundles_under_a_prefix(moto: Any, tmp_path: Path) -> None:
    samples, run, _ = samples_with_media(tmp_path, n=1)
    base = f"s3://{moto.current}/run/rollout"
    for name in ("fully_async_1", "fully_async_2"):
        write_bundle(f"{base}/{name}", samples, media_roots=[run], shared_media=True)
    obstore.put(raw_store(moto), "run/rollout/fully_async_3/g20260101T000000000000Z-0123456789ab/x", b"x")
    found = bundles.list_remote_bundles(base)
    assert found == {"fully_async_1": f"{base}/fully_async_1", "fully_async_2": f"{base}/fully_async_2"}
    assert bundles.list_remote_bundles(f"s3://{moto.current}/nothing") == {}


def test_media_whose_bytes_disagree_with_their_name_are_never_uploaded(moto: Any, tmp_path: Path) -> None:
    """A hard-linked run file edited in place after the local write: the pool would serve the
    wrong bytes under the digest to every later bundle that skips uploading it."""
    from bundles import MediaMissingError

    samples, run, blobs = samples_with_media(tmp_path, n=2)
    local = write_bundle(tmp_path / "l", samples, media_roots=[run])  # hard links into the run dir
    victim = Path(samples[1]["image"])
    victim.chmod(0o644)
    victim.write_bytes(b"Y" * len(blobs[1]))  # same size, other bytes: also the bundle's file
    with pytest.raises(MediaMissingError, match=rf"media/{victim.name}: the file's bytes hash to"):
        bundles.upload_bundle(local, f"s3://{moto.current}/run/x", shared_media=True)
    assert not any(victim.name in k for k in keys(moto))
