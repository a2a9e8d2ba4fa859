"""``rollout-bundle gc`` never loses data, against real S3 servers on 127.0.0.1 (moto; SeaweedFS
where marked): a prefix inside a pool is refused, a pool is collected only against every bundle
beside it, objects gc did not write survive (the store layouts of tests/vectors/hostile/store/),
pooled media are named where they lie, and a missing bucket is named on reads (issue 24)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

import bundles
from bundles import (
    BucketNotFoundError,
    BundleVerificationError,
    GarbagePrefixError,
    MediaRef,
    open_bundle,
    remove_bundle,
    write_bundle,
)
from bundles.cli import main
from bundles.support import on_fault_point

STORE_VECTORS = Path(__file__).resolve().parent / "vectors" / "hostile" / "store"
TABLE: dict[str, dict[str, Any]] = json.loads((STORE_VECTORS / "expected.json").read_text())


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


def contents(server: Any, prefix: str = "") -> dict[str, bytes]:
    store = raw_store(server)
    keys = sorted(m["path"] for batch in obstore.list(store, prefix or None) for m in batch)
    return {k: bytes(obstore.get(store, k).bytes()) for k in keys}


def image(seed: str) -> bytes:
    return hashlib.sha256(seed.encode()).digest() * 64


def pooled_name(seed: str) -> str:
    return hashlib.sha256(image(seed)).hexdigest() + ".png"


def write(server: Any, tmp_path: Path, key: str, seeds: list[str], shared: bool = True) -> str:
    run = tmp_path / "run-media"
    samples = [{"index": i, "image": put_media(run, image(s))} for i, s in enumerate(seeds)]
    url = f"s3://{server.current}/{key}"
    write_bundle(url, samples, media_roots=[run], shared_media=shared)
    return url


def gc(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["gc", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def verify_full(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify", url, "--full"])
    out, err = capsys.readouterr()
    return code, out + err


# -- the hostile store layouts --------------------------------------------------------------------
def test_the_store_table_lists_every_vector() -> None:
    assert {p.name for p in STORE_VECTORS.iterdir()} - {"expected.json"} == {
        row["path"] for row in TABLE.values()
    }


def _lay_out(server: Any, tmp_path: Path, vector: dict[str, Any]) -> list[str]:
    urls = [write(server, tmp_path, b["key"], b["images"], b["shared_media"]) for b in vector["bundles"]]
    store = raw_store(server)
    for obj in vector["objects"]:
        obstore.put(store, obj["key"], obj["text"].encode())
    return urls


@pytest.mark.parametrize("name", sorted(TABLE))
def test_gc_of_each_store_vector_deletes_nothing_live_and_nothing_not_its_own(
    s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Item 1 (``gc <pool>`` deleted every medium its bundles list, exit 0; the default 24 h
    removed every pool object older than a day) and R7 (the user's objects named like pool media
    were deleted): every gc of the vector, dry run and real, is refused in one line (exit 2) or
    removes nothing, and every bundle still verifies in full."""
    vector = json.loads((STORE_VECTORS / TABLE[name]["path"]).read_text())
    urls = _lay_out(s3, tmp_path, vector)
    first = json.loads(
        bytes(obstore.get(raw_store(s3), f"{vector['bundles'][0]['key']}/bundle.json").bytes())
    )
    before = contents(s3)
    for run in vector["gc"]:
        prefix = run["prefix"].format(generation=first["generation"])
        url = f"s3://{s3.current}/{prefix}" if prefix else f"s3://{s3.current}"
        for dry in (["--dry-run"], []):
            older = ["--older-than", run["older_than"]] if run["older_than"] is not None else []
            code, out, err = gc(capsys, url, *older, *dry)
            if "refused" in run:
                expected = run["refused"].format(bucket=s3.current)
                assert code == 2, (prefix, out, err)
                assert err.startswith(f"rollout-bundle gc: error: {url}: ") and expected in err, err
                assert len(err.strip().splitlines()) == 1 and out == ""
            else:
                assert code == 0, (prefix, out, err)
                verb = "would remove" if dry else "removed"
                assert f"{verb} 0 generation(s) and 0 media file(s)" in out and run["removes"] == 0, out
            assert contents(s3) == before, (prefix, dry)
    for url in urls:
        code, text = verify_full(capsys, url)
        assert code == 0, text


def test_the_media_of_a_bundle_copied_verbatim_are_never_collected(moto: Any, tmp_path: Path) -> None:
    """``aws s3 sync bundle_dir s3://b/x`` and a file of the user's beside its media: no pointer
    of ours vouches for any of it (before: the unlisted file was deleted)."""
    run = tmp_path / "run-media"
    local = Path(write_bundle(tmp_path / "plain", [{"image": put_media(run, image("a"))}], media_roots=[run]))
    store = raw_store(moto)
    for f in local.rglob("*"):
        if f.is_file():
            obstore.put(store, f"mix/synced/{f.relative_to(local)}", f.read_bytes())
    obstore.put(store, f"mix/synced/media/{pooled_name('mine')}", image("mine"))
    before = contents(moto)
    report = bundles.collect_garbage(f"s3://{moto.current}/mix", older_than_s=0)
    assert report.media == [] and report.bundles == 1 and contents(moto) == before
    assert [(k.where, k.objects) for k in report.skipped] == [(f"s3://{moto.current}/mix/synced/media", 1)]
    assert len(open_bundle(f"s3://{moto.current}/mix/synced", verify="none")) == 1


def test_gc_of_the_pool_is_refused_in_the_library_too(moto: Any, tmp_path: Path) -> None:
    """Item 1 through the API: ``collect_garbage`` raises, naming the prefix to give instead."""
    url = write(moto, tmp_path, "run-7/rollout/fully_async_40", ["a", "b", "c"])
    before = contents(moto)
    pool = f"s3://{moto.current}/run-7/rollout/.media"
    for older in (0.0, 24 * 3600.0):
        with pytest.raises(
            GarbagePrefixError, match=rf"give the pool's parent, s3://{moto.current}/run-7/rollout$"
        ):
            bundles.collect_garbage(pool, older_than_s=older)
    assert contents(moto) == before
    open_bundle(url, verify="full")


# -- what gc removes ------------------------------------------------------------------------------
def test_gc_of_the_parent_removes_only_unreferenced_old_pool_media(
    s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After retention removes a bundle, gc of the pool's parent removes exactly the media no
    remaining bundle lists, once past the grace period; the dry run lists what the run removes,
    each line naming the object's URL."""
    base = f"s3://{s3.current}/run-7/rollout"
    write(s3, tmp_path, "run-7/rollout/fully_async_40", ["a", "b", "c"])
    kept = write(s3, tmp_path, "run-7/rollout/fully_async_41", ["c", "d"])
    remove_bundle(f"{base}/fully_async_40")
    pool = "run-7/rollout/.media"
    young = bundles.collect_garbage(base, older_than_s=3600)
    assert young.media == [] and young.kept_young == 2 and young.bundles == 1
    doomed = sorted(f"{pool}/{pooled_name(s)}" for s in ("a", "b"))
    code, dry, _ = gc(capsys, base, "--older-than", "0s", "--dry-run")
    assert code == 0 and sorted(line for line in dry.splitlines() if line.startswith("would remove")) == [
        f"would remove media s3://{s3.current}/{k}" for k in doomed
    ]
    assert sorted(k for k in contents(s3, pool)) == sorted(
        [*doomed, *(f"{pool}/{pooled_name(s)}" for s in "cd")]
    )
    report = bundles.collect_garbage(base, older_than_s=0)
    assert sorted(report.media) == doomed and report.generations == [] and report.skipped == []
    assert sorted(contents(s3, pool)) == sorted(f"{pool}/{pooled_name(s)}" for s in "cd")
    open_bundle(kept, verify="full")


def test_an_unreadable_pointer_beside_a_pool_keeps_the_whole_pool(
    moto: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fail safe: a bundle whose pointer this version cannot read may use any medium of the pool
    beside it, so none is removed (before: only objects under that bundle were kept, and the
    pooled media only it lists were deleted); the CLI says what it kept and why."""
    base = f"s3://{moto.current}/r"
    write(moto, tmp_path, "r/a", ["a"])
    write(moto, tmp_path, "r/newer", ["e"])
    store = raw_store(moto)
    pointer = json.loads(bytes(obstore.get(store, "r/newer/bundle.json").bytes()))
    obstore.put(store, "r/newer/bundle.json", json.dumps({**pointer, "pointer_version": 2}).encode())
    before = contents(moto)
    report = bundles.collect_garbage(base, older_than_s=0)
    assert report.media == [] and report.bundles == 1
    assert [(k.where, k.objects) for k in report.skipped] == [(f"{base}/.media", 2), (f"{base}/newer", 2)]
    code, out, _ = gc(capsys, base, "--older-than", "0s")
    assert code == 0 and out.splitlines()[0] == (
        f"kept 4 object(s) in 2 place(s) ({base}/.media, {base}/newer): a pointer or manifest beside it "
        "cannot be read or checked: everything it may use is kept"
    )
    assert contents(moto) == before


def test_a_pool_left_by_its_last_bundle_is_reported_not_removed(moto: Any, tmp_path: Path) -> None:
    """No pointer beside a pool proves it is one of ours any more: gc leaves it, and says so."""
    base = f"s3://{moto.current}/r"
    write(moto, tmp_path, "r/only", ["a", "b"])
    remove_bundle(f"{base}/only")
    report = bundles.collect_garbage(base, older_than_s=0)
    assert report.media == [] and [(k.where, k.objects) for k in report.skipped] == [(f"{base}/.media", 2)]
    assert "not a pool gc can prove it wrote" in report.skipped[0].reason
    assert len(contents(moto, "r/.media")) == 2


def test_a_bundle_published_while_gc_runs_keeps_the_media_it_reuses(moto: Any, tmp_path: Path) -> None:
    """A writer that finds a pooled object present does not upload it again: if it publishes
    between gc's reading of the pointers and its deletion, gc sees the pointers changed and leaves
    the pool to the next run."""
    base = f"s3://{moto.current}/r"
    write(moto, tmp_path, "r/old", ["a", "b"])
    write(moto, tmp_path, "r/keep", ["c"])
    remove_bundle(f"{base}/old")
    published: list[str] = []

    def publish(pool: str) -> None:
        if not published:
            published.append(write(moto, tmp_path, "r/new", ["a"]))  # reuses the pooled "a"

    with on_fault_point("gc.before-recheck", publish):
        report = bundles.collect_garbage(base, older_than_s=0)
    assert report.media == [] and [k.where for k in report.skipped] == [f"{base}/.media"]
    open_bundle(published[0], verify="full")
    again = bundles.collect_garbage(base, older_than_s=0)
    assert again.media == [f"r/.media/{pooled_name('b')}"]
    open_bundle(published[0], verify="full")


def test_a_writer_about_to_publish_keeps_the_pooled_media_it_reused(moto: Any, tmp_path: Path) -> None:
    """A writer that finds a pooled object present skips it; if gc runs between its manifest and
    its pointer, the manifest (not yet live) protects what it lists."""
    import time

    base = f"s3://{moto.current}/r"
    write(moto, tmp_path, "r/old", ["a", "b"])
    write(moto, tmp_path, "r/keep", ["c"])
    remove_bundle(f"{base}/old")
    time.sleep(2.5)  # "a" and "b" past the grace period below; the new generation within it
    # (ages are whole seconds of the store's clock: 2.5 s is at least 2, a fresh object at most 1)
    run = tmp_path / "run-media"
    local = write_bundle(tmp_path / "local", [{"image": put_media(run, image("a"))}], media_roots=[run])
    reports: list[Any] = []
    with on_fault_point(
        "store.before-publish", lambda *_: reports.append(bundles.collect_garbage(base, older_than_s=2.0))
    ):
        stats = bundles.upload_bundle(local, f"{base}/new", shared_media=True)
    assert stats.media_skipped == 1  # "a" was reused, not uploaded again
    assert reports[0].media == [f"r/.media/{pooled_name('b')}"] and reports[0].generations == []
    open_bundle(f"{base}/new", verify="full")


# -- pooled media are named where they lie ---------------------------------------------------------
def test_pooled_media_are_named_where_they_lie(
    moto: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 2: ``MediaRef.path`` and verify's messages named ``<bundle>/media/<hex>.png`` while
    the object is ``<parent>/.media/<hex>.png``."""
    url = write(moto, tmp_path, "run-7/rollout/fully_async_40", ["a", "b"])
    pool = f"s3://{moto.current}/run-7/rollout/.media"
    b = open_bundle(url)
    assert sorted(str(r.path) for r in b.media) == sorted(f"{pool}/{pooled_name(s)}" for s in "ab")
    assert b[1]["image"] == f"{pool}/{pooled_name('b')}"
    obstore.delete(raw_store(moto), f"run-7/rollout/.media/{pooled_name('b')}")
    with pytest.raises(BundleVerificationError) as info:
        open_bundle(url, verify="full")
    assert info.value.problems == [f"{pool}/{pooled_name('b')}: listed in the manifest but missing"]
    code, text = verify_full(capsys, url)
    assert code == 1 and f"{pool}/{pooled_name('b')}: listed in the manifest but missing" in text
    assert isinstance(b.media[0], MediaRef)


# -- a missing bucket is named on reads ------------------------------------------------------------
def test_reading_from_a_missing_bucket_names_the_bucket(
    moto: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 6: reads said only "no bundle here"."""
    url = "s3://nonexistent-bucket/x"
    expected = "the bucket 'nonexistent-bucket' does not exist (create it first"
    for target in (url, f"{url}.rbundle"):
        with pytest.raises(
            BucketNotFoundError, match=rf"^{re.escape(target)}: cannot .*{re.escape(expected)}"
        ):
            open_bundle(target)
    with pytest.raises(BucketNotFoundError, match=re.escape(expected)):
        bundles.is_bundle(url)
    for argv in (["verify", url, "--full"], ["inspect", url]):
        capsys.readouterr()
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 1 and len(err.strip().splitlines()) == 1 and expected in err, err


# -- ages come from the store's clock (issue 30, item 5) -----------------------------------------
@contextlib.contextmanager
def local_clock_ahead(monkeypatch: pytest.MonkeyPatch, seconds: float) -> Iterator[None]:
    """This process's clock ``seconds`` ahead of the store's, for gc's reading of "now" only:
    ``time.time`` and the ``datetime`` gc's module holds (the store, a real SeaweedFS, keeps its
    own clock)."""
    import datetime as real
    import time
    import types

    from bundles._store import gc as _gc

    class Ahead(real.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return real.datetime.now(tz) + real.timedelta(seconds=seconds)

    clock = types.SimpleNamespace(datetime=Ahead, timezone=real.timezone, timedelta=real.timedelta)
    true_time = time.time
    with monkeypatch.context() as m:
        m.setattr(_gc, "datetime", clock)
        m.setattr(time, "time", lambda: true_time() + seconds)
        yield


def test_gc_on_a_machine_whose_clock_is_ahead_keeps_an_upload_in_flight(
    weed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: with the collecting machine 20 minutes ahead, retention's gc (grace 15 min) run
    while a pooled upload was between its manifest and its pointer removed the upload's 2 new
    media and its generation; the bundle then published and failed ``verify --full``."""
    base = f"s3://{weed.current}/run/rollout"
    write(weed, tmp_path, "run/rollout/fully_async_1", ["c"])
    run = tmp_path / "run-media"
    local = write_bundle(
        tmp_path / "local", [{"image": put_media(run, image(s))} for s in "cde"], media_roots=[run]
    )
    reports: list[Any] = []

    def collect(*_: Any) -> None:
        with local_clock_ahead(monkeypatch, 20 * 60):
            reports.append(bundles.collect_garbage(base, older_than_s=15 * 60))

    with on_fault_point("store.before-publish", collect):
        stats = bundles.upload_bundle(local, f"{base}/fully_async_2", shared_media=True)
    assert stats.media_uploaded == 2 and stats.media_skipped == 1
    assert reports[0].media == [] and reports[0].generations == [] and reports[0].clock == "store"
    assert reports[0].kept_young == 2  # the upload's generation (manifest, shard); its media are pending
    for name in ("fully_async_1", "fully_async_2"):
        open_bundle(f"{base}/{name}", verify="full")


def test_a_generation_whose_pointer_appears_while_gc_runs_is_never_deleted(weed: Any, tmp_path: Path) -> None:
    """gc read no pointer for the upload (so its generation and new media were garbage, past a
    grace period of 0), and the writer published before gc deleted: the pointer is read again
    just before deleting, and the bundle it now names is left whole."""
    base = f"s3://{weed.current}/r"
    write(weed, tmp_path, "r/keep", ["c"])
    run = tmp_path / "run-media"
    local = write_bundle(tmp_path / "local", [{"image": put_media(run, image("n"))}], media_roots=[run])
    at_publish, published = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            bundles.upload_bundle(local, f"{base}/new", shared_media=False)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)
        published.set()

    def pause(*_: Any) -> None:
        at_publish.set()
        assert released.wait(60)

    def release(*_: Any) -> None:
        released.set()
        assert published.wait(60)

    released = threading.Event()
    with on_fault_point("store.before-publish", pause), on_fault_point("gc.before-delete", release):
        writer = threading.Thread(target=upload)
        writer.start()
        try:
            assert at_publish.wait(60)
            report = bundles.collect_garbage(base, older_than_s=0)
        finally:
            released.set()
            writer.join(60)
    assert errors == []
    assert report.generations == [] and report.media == []
    assert [k.where for k in report.skipped] == [f"{base}/new"]
    assert "pointer appeared or changed" in report.skipped[0].reason
    open_bundle(f"{base}/new", verify="full")
    open_bundle(f"{base}/keep", verify="full")
