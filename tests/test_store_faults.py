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


def _cli(env: dict[str, str | None], *argv: str) -> Any:
    """``rollout-bundle <argv>`` in a subprocess, the store configured by ``env`` alone (None: unset)."""
    import os
    import subprocess
    import sys

    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "AZURITE_", "GOOGLE_"))
    }
    base.update({k: v for k, v in env.items() if v is not None})
    base["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", *argv],
        capture_output=True,
        text=True,
        env=base,
        timeout=120,
    )


def _one_line_about(proc: Any, command: str, url: str, cause: str) -> None:
    """One line, naming the URL given (no journal path it never named) and the cause in our words
    (none of obstore's own text)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith(f"rollout-bundle {command}: error: {url}: cannot "), line
    assert cause in line, line
    for raw in ("journal", "Generic", "builder error", "Error performing", "Debug"):
        assert raw not in line, line


CAUSES = {
    "secret": "access denied (check the credentials) [403 Forbidden (SignatureDoesNotMatch)]",
    "http": "is plain http, which is refused unless allowed: set AWS_ALLOW_HTTP=true",
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["secret", "http"])
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_refused_store_is_one_line_about_the_url_given(
    seaweed_s3: Any, tmp_path: Path, fault: str, command: str
) -> None:
    """A wrong secret (SeaweedFS checks signatures) or an http:// endpoint without AWS_ALLOW_HTTP:
    ``inspect`` (which looks for a rollout journal beside the URL too) says what ``verify`` says."""
    bucket = seaweed_s3.bucket()
    url = f"s3://{bucket}/x"
    write_bundle(url, [{"index": 0}], storage_options=seaweed_s3.options())
    assert _cli(seaweed_s3.env, command, url).returncode == 0
    wrong: dict[str, str | None] = dict(seaweed_s3.env)
    if fault == "secret":
        wrong["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    else:
        wrong["AWS_ALLOW_HTTP"] = None
    proc = _cli(wrong, command, url)
    _one_line_about(proc, command, url, CAUSES[fault])
    if fault == "http":
        assert f"the endpoint {seaweed_s3.endpoint} is plain http" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_wrong_azure_key_is_one_line_about_the_url_given(
    azurite_az: Any, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    url = f"az://{azurite_az.container()}/x"
    for k, v in azurite_az.env.items():
        monkeypatch.setenv(k, v)
    write_bundle(url, [{"index": 0}])
    assert _cli(azurite_az.env, command, url).returncode == 0
    wrong = {**azurite_az.env, "AZURE_STORAGE_ACCOUNT_KEY": base64.b64encode(b"not the key" * 6).decode()}
    proc = _cli(wrong, command, url)
    _one_line_about(
        proc, command, url, "access denied (check the credentials) [403 Forbidden (AuthorizationFailure)]"
    )
