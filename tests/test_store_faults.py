"""Faults between a writer or reader and a real S3 server (moto on 127.0.0.1), injected by a proxy
on loopback (tests/helpers/store.py ``FaultProxy``): 503 answers and connections dropped mid-upload
are retried with backoff; what the retries cannot fix is a BundleError naming the URL, and no
reader ever finds a partial bundle."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import BundleIOError, BundleNotFoundError, open_bundle, write_bundle


@pytest.fixture(scope="module")
def proxy(moto_s3: Any) -> Iterator[Any]:
    from helpers.store import FaultProxy

    p = FaultProxy(moto_s3.endpoint)
    yield p
    p.close()


@pytest.fixture
def via_proxy(moto_s3: Any, proxy: Any) -> Any:
    proxy.clear()
    bucket = moto_s3.bucket()
    return bucket, moto_s3.options(endpoint=proxy.endpoint)


def _samples(tmp_path: Path, n: int = 4) -> tuple[list[dict[str, Any]], Path]:
    run = tmp_path / "media"
    paths = [put_media(run, hashlib.sha256(bytes([i])).digest() * 400) for i in range(n)]
    return [{"index": i, "image": p, "tokens": [i] * 50} for i, p in enumerate(paths)], run


def test_503_answers_are_retried_and_the_bundle_is_whole(via_proxy: Any, proxy: Any, tmp_path: Path) -> None:
    bucket, options = via_proxy
    samples, run = _samples(tmp_path)
    url = f"s3://{bucket}/retry"
    proxy.add("PUT", "/media/", ("status", 503), times=3)
    proxy.add("PUT", "/manifest.json", ("status", 503), times=2)
    proxy.add("PUT", "/bundle.json", ("status", 500), times=2)
    proxy.add("GET", "/bundle.json", ("status", 503), times=1)
    write_bundle(url, samples, media_roots=[run], storage_options=options)
    b = open_bundle(url, verify="full", storage_options=options)
    assert [s["tokens"] for s in b] == [s["tokens"] for s in samples]
    injected = [h for h in proxy.hits if h[2].startswith("answered")]
    assert len(injected) == 8, proxy.hits


def test_a_connection_dropped_mid_upload_is_retried(via_proxy: Any, proxy: Any, tmp_path: Path) -> None:
    bucket, options = via_proxy
    samples, run = _samples(tmp_path)
    url = f"s3://{bucket}/drop"
    proxy.add("PUT", "/media/", ("drop_request", 1000), times=2)
    proxy.add("PUT", "/samples/", ("drop_request", 10), times=1)
    write_bundle(url, samples, media_roots=[run], storage_options=options)
    assert sum("dropped" in h[2] for h in proxy.hits) == 3
    open_bundle(url, verify="full", storage_options=options)


def test_a_read_cut_mid_answer_is_retried_or_named(via_proxy: Any, proxy: Any, tmp_path: Path) -> None:
    bucket, options = via_proxy
    samples, run = _samples(tmp_path)
    url = f"s3://{bucket}/cut"
    write_bundle(url, samples, media_roots=[run], storage_options=options)
    proxy.add("GET", "/manifest.json", ("drop_response", 200), times=1)
    b = open_bundle(url, verify="full", storage_options=options)
    assert len(b) == 4
    assert any("cut" in h[2] for h in proxy.hits), proxy.hits


def test_persistent_failure_is_a_bundle_error_naming_the_url_and_nothing_is_visible(
    via_proxy: Any, proxy: Any, tmp_path: Path, moto_s3: Any
) -> None:
    bucket, options = via_proxy
    options = {**options, "max_retries": 2, "retry_timeout": 5}
    samples, run = _samples(tmp_path)
    url = f"s3://{bucket}/never"
    proxy.add("PUT", "/bundle.json", ("status", 503), times=None)
    started = time.monotonic()
    with pytest.raises(BundleIOError, match=rf"^{url}: cannot publish bundle.json: .*503"):
        write_bundle(url, samples, media_roots=[run], storage_options=options)
    assert time.monotonic() - started < 20
    proxy.clear()
    with pytest.raises(BundleNotFoundError, match=rf"^{url}: no bundle here"):
        open_bundle(url, storage_options=options)
    # The unpublished generation was removed as well (gc would, otherwise); media may stay.
    raw = S3Store(bucket, **moto_s3.options(), client_options={"allow_http": True})
    left = [m["path"] for batch in obstore.list(raw, "never/") for m in batch]
    assert all(k.startswith("never/media/") for k in left), left


def test_uploads_that_keep_dropping_fail_naming_the_url(via_proxy: Any, proxy: Any, tmp_path: Path) -> None:
    bucket, options = via_proxy
    options = {**options, "max_retries": 1, "retry_timeout": 5}
    samples, run = _samples(tmp_path)
    url = f"s3://{bucket}/dropping"
    proxy.add("PUT", "/samples/", ("drop_request", 5), times=None)
    with pytest.raises(BundleIOError, match=rf"^{url}: cannot upload the bundle: "):
        write_bundle(url, samples, media_roots=[run], storage_options=options)
    proxy.clear()
    with pytest.raises(BundleNotFoundError):
        open_bundle(url, storage_options=options)
