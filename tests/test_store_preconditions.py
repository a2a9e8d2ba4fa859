"""Stores that ignore the commit protocol's preconditions are detected before the first commit
(bundles/_store/probe.py): a real server that ignores them (s3rver, npm, on 127.0.0.1) and a
loopback proxy that strips ``If-None-Match``/``If-Match`` in front of moto are refused in one line
naming the endpoint and what was ignored, unless the single-writer opt-in is given; servers
that honour them (moto, SeaweedFS) are probed once per endpoint and bucket, then trusted."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import BundleError, UnsafeStoreError, UnsafeStoreWarning, open_bundle, pack_bundle, write_bundle
from bundles.support import SINGLE_WRITER_ENV

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_verdicts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from bundles._store.probe import forget_verdicts

    monkeypatch.delenv(SINGLE_WRITER_ENV, raising=False)
    forget_verdicts()
    yield
    forget_verdicts()


@pytest.fixture
def stripping_proxy(moto_s3: Any) -> Iterator[Any]:
    from helpers.store import FaultProxy

    proxy = FaultProxy(moto_s3.endpoint, strip=frozenset({"If-None-Match", "If-Match"}))
    yield proxy
    proxy.close()


def _samples(tmp_path: Path, n: int = 3) -> tuple[list[dict[str, Any]], Path]:
    run = tmp_path / "media"
    paths = [put_media(run, hashlib.sha256(bytes([i])).digest() * 300) for i in range(n)]
    return [{"index": i, "image": p, "tokens": [i] * 20} for i, p in enumerate(paths)], run


def _keys(options: dict[str, Any], bucket: str) -> list[str]:
    store = S3Store(
        bucket,
        endpoint=options["endpoint"],
        access_key_id=options["access_key_id"],
        secret_access_key=options["secret_access_key"],
        region="us-east-1",
        client_options={"allow_http": True},
    )
    return sorted(m["path"] for batch in obstore.list(store) for m in batch)


def test_s3rver_ignores_create_only_puts_for_real(s3rver_s3: Any) -> None:
    # The premise of the suite, checked on the server itself rather than assumed.
    bucket = s3rver_s3.bucket()
    o = s3rver_s3.options()
    store = S3Store(
        bucket,
        endpoint=o["endpoint"],
        access_key_id=o["access_key_id"],
        secret_access_key=o["secret_access_key"],
        region="us-east-1",
        client_options={"allow_http": True},
    )
    obstore.put(store, "k", b"1", mode="create")
    obstore.put(store, "k", b"2", mode="create")  # succeeds: the header is ignored
    assert bytes(obstore.get(store, "k").bytes()) == b"2"


def test_a_commit_to_s3rver_is_refused_in_one_line_and_leaves_nothing(s3rver_s3: Any, tmp_path: Path) -> None:
    bucket = s3rver_s3.bucket()
    options = s3rver_s3.options()
    samples, run = _samples(tmp_path)
    url = f"s3://{bucket}/run/ckpt"
    with pytest.raises(UnsafeStoreError) as caught:
        write_bundle(url, samples, media_roots=[run], storage_options=options)
    message = str(caught.value)
    assert "\n" not in message
    assert s3rver_s3.endpoint in message and f"s3://{bucket}" in message
    assert "If-None-Match" in message and "If-Match" in message
    assert SINGLE_WRITER_ENV in message
    assert _keys(options, bucket) == []  # no media, no generation, no probe key left


def test_the_single_writer_opt_in_writes_with_a_warning(
    s3rver_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3rver_s3.bucket()
    samples, run = _samples(tmp_path)
    by_option = {**s3rver_s3.options(), "single_writer": True}
    with pytest.warns(UnsafeStoreWarning, match="single-writer opt-in"):
        write_bundle(f"s3://{bucket}/a", samples, media_roots=[run], storage_options=by_option)
    assert [
        s["tokens"] for s in open_bundle(f"s3://{bucket}/a", verify="full", storage_options=by_option)
    ] == [s["tokens"] for s in samples]
    monkeypatch.setenv(SINGLE_WRITER_ENV, "1")
    with pytest.warns(UnsafeStoreWarning):
        write_bundle(f"s3://{bucket}/b", samples, media_roots=[run], storage_options=s3rver_s3.options())
    assert len(open_bundle(f"s3://{bucket}/b", storage_options=s3rver_s3.options())) == len(samples)


def test_a_packed_bundle_is_not_put_on_s3rver(s3rver_s3: Any, tmp_path: Path) -> None:
    bucket = s3rver_s3.bucket()
    samples, run = _samples(tmp_path)
    local = write_bundle(tmp_path / "b", samples, media_roots=[run])
    env = {**os.environ, **s3rver_s3.env, "PYTHONPATH": str(ROOT)}
    env.pop(SINGLE_WRITER_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", "pack", str(local), "-o", f"s3://{bucket}/b.rbundle"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ignores If-None-Match" in lines[0] and "Traceback" not in done.stderr
    assert _keys(s3rver_s3.options(), bucket) == []


def test_a_proxy_that_strips_the_headers_is_refused(
    moto_s3: Any, stripping_proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_s3.bucket()
    options = moto_s3.options(endpoint=stripping_proxy.endpoint)
    samples, run = _samples(tmp_path)
    with pytest.raises(UnsafeStoreError, match=r"If-None-Match.*If-Match"):
        write_bundle(f"s3://{bucket}/x", samples, media_roots=[run], storage_options=options)
    assert any("stripped if-none-match" in h[2].lower() for h in stripping_proxy.hits)
    for k, v in moto_s3.env.items():  # pack_bundle takes its store from the environment
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", stripping_proxy.endpoint)
    with pytest.raises(UnsafeStoreError):
        pack_bundle(write_bundle(tmp_path / "local", samples, media_roots=[run]), f"s3://{bucket}/x.rbundle")


def test_two_writers_racing_through_a_stripping_proxy_are_never_both_told_they_published(
    moto_s3: Any, stripping_proxy: Any, tmp_path: Path
) -> None:
    # The review's attack: both racers used to be told they had published one destination.
    bucket = moto_s3.bucket()
    options = moto_s3.options(endpoint=stripping_proxy.endpoint)
    samples, run = _samples(tmp_path)
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def race(tag: int) -> None:
        barrier.wait()
        try:
            write_bundle(
                f"s3://{bucket}/contested",
                [{**s, "writer": tag} for s in samples],
                media_roots=[run],
                storage_options=options,
            )
            outcomes.append("published")
        except UnsafeStoreError:
            outcomes.append("refused")
        except BundleError as e:
            outcomes.append(f"other: {e}")

    threads = [threading.Thread(target=race, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert outcomes == ["refused", "refused"]


def test_an_honest_server_is_probed_once_per_endpoint_and_bucket(moto_s3: Any, tmp_path: Path) -> None:
    from helpers.store import FaultProxy

    proxy = FaultProxy(moto_s3.endpoint)  # counts requests, changes nothing
    try:
        bucket = moto_s3.bucket()
        options = moto_s3.options(endpoint=proxy.endpoint)
        samples, run = _samples(tmp_path)
        write_bundle(f"s3://{bucket}/one", samples, media_roots=[run], storage_options=options)
        probes = [h for h in proxy.hits if ".rollout-bundle-probe-" in h[1]]
        assert [h[0] for h in probes] == ["PUT", "PUT", "PUT"]  # two creates and the If-Match
        assert not [k for k in _keys(options, bucket) if "probe" in k]  # deleted (a bulk POST)
        proxy.clear()
        write_bundle(f"s3://{bucket}/two", samples, media_roots=[run], storage_options=options)
        assert not [h for h in proxy.hits if ".rollout-bundle-probe-" in h[1]]
        other = moto_s3.bucket()
        write_bundle(f"s3://{other}/one", samples, media_roots=[run], storage_options=options)
        assert [h for h in proxy.hits if ".rollout-bundle-probe-" in h[1]]
    finally:
        proxy.close()


def test_seaweedfs_honours_both_preconditions(seaweed_s3: Any, tmp_path: Path) -> None:
    bucket = seaweed_s3.bucket()
    samples, run = _samples(tmp_path)
    url = f"s3://{bucket}/ok"
    write_bundle(url, samples, media_roots=[run], storage_options=seaweed_s3.options())
    assert len(open_bundle(url, verify="full", storage_options=seaweed_s3.options())) == len(samples)


# -- a store that drops the headers after the probe (issue 30, item 6) -----------------------------
@pytest.fixture
def turning_proxy(seaweed_s3: Any) -> Iterator[Any]:
    from helpers.precondition_proxy import StripAfterProbeProxy

    proxy = StripAfterProbeProxy(seaweed_s3.endpoint)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_writers_on_a_store_that_drops_the_headers_after_the_probe_are_never_both_told_they_published(
    seaweed_s3: Any, turning_proxy: Any, tmp_path: Path, overwrite: bool
) -> None:
    """Before: SeaweedFS behind a proxy that honours the probe and strips ``If-None-Match`` and
    ``If-Match`` afterwards: both racers returned success, one pointer silently replacing the
    other. Now each reads its pointer back: exactly one publishes, the other is told it lost, and
    the bundle there is the winner's, whole, with no generation of the loser's left."""
    bucket = seaweed_s3.bucket()
    options = seaweed_s3.options(endpoint=turning_proxy.endpoint)
    samples, run = _samples(tmp_path)
    dest = f"s3://{bucket}/contested"
    first = dest if overwrite else f"s3://{bucket}/first"  # probed here; then the proxy turns
    write_bundle(
        first, [{**s, "writer": "first"} for s in samples], media_roots=[run], storage_options=options
    )
    assert turning_proxy.stripping
    turning_proxy.arm()
    outcomes: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def race(tag: str) -> None:
        barrier.wait()
        try:
            write_bundle(
                dest,
                [{**s, "writer": tag} for s in samples],
                media_roots=[run],
                storage_options=options,
                overwrite=overwrite,
            )
            outcomes[tag] = "published"
        except BundleError as e:
            outcomes[tag] = str(e)

    threads = [threading.Thread(target=race, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert turning_proxy.pointer_puts == 2 and any(
        h[2] == "if-none-match" or h[2] == "if-match" for h in turning_proxy.stripped
    )
    winners = [t for t, o in outcomes.items() if o == "published"]
    assert len(winners) == 1, outcomes
    (loser,) = {"a", "b"} - set(winners)
    assert outcomes[loser].startswith(f"{dest}: this writer lost: read back right after it was put")
    bundle = open_bundle(dest, verify="full", storage_options=options)
    assert {s["writer"] for s in bundle} == {winners[0]}
    generations = {
        k.split("/")[1] for k in _keys(seaweed_s3.options(), bucket) if k.startswith("contested/g")
    }
    assert len(generations) == 1  # the loser's is removed, and a replaced one retired


def test_the_probes_verdict_is_asked_again_after_its_time(
    seaweed_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: cached for the process's life. A writer that outlives VERDICT_TTL_S probes again,
    and a store that turned meanwhile is refused."""
    from helpers.precondition_proxy import StripAfterProbeProxy

    from bundles._store import probe as _probe

    proxy = StripAfterProbeProxy(seaweed_s3.endpoint, hold_first_pointer=False)
    try:
        bucket = seaweed_s3.bucket()
        options = seaweed_s3.options(endpoint=proxy.endpoint)
        samples, run = _samples(tmp_path)
        write_bundle(f"s3://{bucket}/one", samples, media_roots=[run], storage_options=options)
        assert proxy.stripping
        write_bundle(f"s3://{bucket}/two", samples, media_roots=[run], storage_options=options)  # trusted
        monkeypatch.setattr(_probe, "VERDICT_TTL_S", 0.0)
        with pytest.raises(UnsafeStoreError, match=r"If-None-Match.*If-Match"):
            write_bundle(f"s3://{bucket}/three", samples, media_roots=[run], storage_options=options)
    finally:
        proxy.close()


def test_two_packers_on_a_store_that_drops_the_headers_after_the_probe_are_never_both_told_they_published(
    seaweed_s3: Any, tmp_path: Path
) -> None:
    """The same attack on a packed object (one create-only put): the overtaken packer sees
    another ETag when it reads the object back."""
    from helpers.precondition_proxy import StripAfterProbeProxy

    proxy = StripAfterProbeProxy(seaweed_s3.endpoint, held_suffix=".rbundle")
    try:
        bucket = seaweed_s3.bucket()
        options = seaweed_s3.options(endpoint=proxy.endpoint)
        samples, run = _samples(tmp_path)
        local = {
            t: write_bundle(tmp_path / t, [{**s, "writer": t} for s in samples], media_roots=[run])
            for t in "ab"
        }
        pack_bundle(local["a"], f"s3://{bucket}/first.rbundle", storage_options=options)  # probed here
        assert proxy.stripping
        proxy.arm()
        outcomes: dict[str, str] = {}
        barrier = threading.Barrier(2)

        def race(tag: str) -> None:
            barrier.wait()
            try:
                pack_bundle(local[tag], f"s3://{bucket}/contested.rbundle", storage_options=options)
                outcomes[tag] = "published"
            except BundleError as e:
                outcomes[tag] = str(e)

        threads = [threading.Thread(target=race, args=(t,)) for t in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert proxy.pointer_puts == 2
        winners = [t for t, o in outcomes.items() if o == "published"]
        assert len(winners) == 1, outcomes
        (loser,) = {"a", "b"} - set(winners)
        assert outcomes[loser].startswith(f"s3://{bucket}/contested.rbundle: this writer lost: read back")
        packed = open_bundle(f"s3://{bucket}/contested.rbundle", verify="full", storage_options=options)
        assert {s["writer"] for s in packed} == {winners[0]}
    finally:
        proxy.close()
