"""URL locations: any scheme that is not served (or whose extra is missing) is refused in one line
naming the scheme and the extra, at every entry point, and is never taken for a local path (before
this, ``write_bundle("s3://bucket/x", ...)`` wrote the local directory ``./s3:/bucket/x``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bundles import (
    BundleError,
    UnsupportedLocationError,
    check_location,
    is_bundle,
    is_store_url,
    open_bundle,
    pack_bundle,
    remove_bundle,
    unpack_bundle,
    write_bundle,
)
from bundles.support import scratch_dir

ROOT = Path(__file__).resolve().parents[1]
UNSUPPORTED = ["hdfs://namenode/run/x", "http://example.invalid/x", "ftp://host/x.rbundle", "file:///tmp/x"]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _local_bundle(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "b", [{"index": 0, "tokens": [1, 2, 3]}])


@pytest.mark.parametrize("url", UNSUPPORTED)
def test_every_entry_point_refuses_an_unsupported_scheme_and_creates_nothing(
    url: str, in_tmp: Path, tmp_path: Path
) -> None:
    local = _local_bundle(tmp_path)
    scheme = url.split(":", 1)[0]
    calls = [
        lambda: write_bundle(url, [{"index": 0}]),
        lambda: write_bundle(url, [{"index": 0}], overwrite=True),
        lambda: open_bundle(url),
        lambda: pack_bundle(local, url),
        lambda: pack_bundle(url, tmp_path / "out.rbundle"),
        lambda: unpack_bundle(url, tmp_path / "unpacked"),
        lambda: remove_bundle(url),
        lambda: is_bundle(url),
        lambda: check_location(url, "--save"),
    ]
    for call in calls:
        with pytest.raises(UnsupportedLocationError) as info:
            call()
        msg = str(info.value)
        assert "\n" not in msg
        assert f"unsupported URL scheme {scheme!r}" in msg and "s3://, gs://, az://" in msg, msg
        # The install hint only where the extra is missing: where it is installed, installing it
        # changes nothing (the light tox envs have no obstore, and there the hint belongs).
        assert ("pip install" in msg) == (importlib.util.find_spec("obstore") is None), msg
        assert url in msg
    assert list(in_tmp.iterdir()) == []  # no ./hdfs:/... directory
    assert not (tmp_path / "out.rbundle").exists() and not (tmp_path / "unpacked").exists()


def test_a_url_is_refused_where_only_a_local_path_makes_sense(tmp_path: Path, in_tmp: Path) -> None:
    local = _local_bundle(tmp_path)
    with pytest.raises(UnsupportedLocationError, match="expected a local path"):
        unpack_bundle(tmp_path / "x.rbundle", "s3://bucket/out")
    with pytest.raises(UnsupportedLocationError, match="expected a local path"):
        open_bundle(local).rehydrate("s3://bucket/media")
    with pytest.raises(UnsupportedLocationError, match="expected a local path"):
        scratch_dir("gs://bucket/x")
    assert list(in_tmp.iterdir()) == []


def test_a_store_url_collapsed_by_pathlib_is_refused_not_written_locally(in_tmp: Path) -> None:
    collapsed = Path("s3://bucket/x")  # pathlib makes this s3:/bucket/x
    with pytest.raises(UnsupportedLocationError, match=r"collapsed.*s3://bucket/x"):
        write_bundle(collapsed, [{"index": 0}])
    with pytest.raises(UnsupportedLocationError, match="collapsed"):
        open_bundle(collapsed)
    assert list(in_tmp.iterdir()) == []


def test_store_urls_are_recognised_whatever_the_case_of_the_scheme() -> None:
    assert is_store_url("s3://b/x") and is_store_url("GS://b/x") and is_store_url("az://c/x")
    assert not is_store_url("/tmp/s3://x") and not is_store_url("relative/dir")
    assert not is_store_url("hdfs://x")


def test_local_only_arguments_are_refused_for_urls() -> None:
    with pytest.raises(BundleError, match="apply to object-store URLs only"):
        open_bundle("/nonexistent/b", storage_options={"endpoint": "http://127.0.0.1:1"})


_WITHOUT_OBSTORE = """
import os, sys
sys.modules["obstore"] = None  # as if the extra were not installed: import obstore raises ImportError
os.chdir(sys.argv[1])
from bundles import UnsupportedLocationError, write_bundle, open_bundle
for call in (
    lambda: write_bundle("s3://bucket/run/x", [{"index": 0}]),
    lambda: open_bundle("gs://bucket/x"),
    lambda: open_bundle("http://example.invalid/x"),
):
    try:
        call()
    except UnsupportedLocationError as e:
        print(e)
    else:
        print("NOT REFUSED")
print(sorted(os.listdir(".")))
"""


def test_a_store_url_without_the_extra_names_obstore_and_the_extra(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OBSTORE, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    assert out[0].startswith(
        "s3://bucket/run/x: bundle: the s3:// scheme needs the optional dependency obstore"
    )
    assert "pip install 'rollout-bundles[s3]'" in out[0]
    assert out[1].startswith("gs://bucket/x: bundle: the gs:// scheme needs")
    # Without the extra, an unsupported scheme's message says which schemes it would serve.
    assert out[2] == (
        "http://example.invalid/x: bundle: unsupported URL scheme 'http'; a bundle is a local path or an "
        "s3://, gs://, az:// URL (pip install 'rollout-bundles[s3]')"
    )
    assert out[3] == "[]"


@pytest.mark.parametrize("url", ["hdfs://nn/x", "http://example.invalid/x"])
@pytest.mark.parametrize("command", [["inspect"], ["verify"], ["show"], ["pack", "-o", "/tmp/never.rbundle"]])
def test_the_cli_refuses_an_unsupported_scheme_in_one_line(
    command: list[str], url: str, in_tmp: Path
) -> None:
    """One line naming the scheme; no advice to install the extra, which is installed here."""
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "trainer_hooks.cli", command[0], url, *command[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr  # the caller's URL: tests/test_cli_exit_codes.py
    lines = proc.stderr.strip().splitlines()
    scheme = url.split(":", 1)[0]
    assert len(lines) == 1 and f"{url}: bundle: unsupported URL scheme {scheme!r}" in lines[0], proc.stderr
    assert "pip install" not in lines[0] and "Traceback" not in proc.stderr
    assert list(in_tmp.iterdir()) == []


@pytest.mark.parametrize(
    "option", ["--save", "--load", "--save-debug-rollout-data", "--load-debug-rollout-data"]
)
def test_trainer_options_refuse_an_unsupported_scheme(option: str, in_tmp: Path) -> None:
    from trainer_hooks import parse_args

    with pytest.raises(ValueError, match=rf"^hdfs://nn/x: {option}: unsupported URL scheme 'hdfs'"):
        parse_args(
            [option, "hdfs://nn/x", "--shared-media-dir", str(in_tmp / "m"), "--rollout-batch-size", "1"]
        )
    assert list(in_tmp.iterdir()) == []


def test_child_location_names_a_location_below_any_root(tmp_path) -> None:
    import os

    from bundles import StoreURL, child_location

    here = child_location(os.path.relpath(tmp_path), "rollout/fully_async_3")
    assert here == tmp_path / "rollout" / "fully_async_3" and here.is_absolute()
    there = child_location("s3://bucket/run/", "rollout/fully_async_3")
    assert isinstance(there, StoreURL) and there == "s3://bucket/run/rollout/fully_async_3"
    assert child_location("s3://bucket/run", "") == "s3://bucket/run"
    with pytest.raises(UnsupportedLocationError, match="unsupported URL scheme 'hdfs'"):
        child_location("hdfs://x/y", "z")


def stored_name(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest() + path.suffix


def test_shared_media_changes_nothing_in_a_directory(tmp_path) -> None:
    """Bundles of one run in a directory share media by hard links already."""
    import os

    from bundles import write_bundle

    media = tmp_path / "run"
    media.mkdir()
    shot = media / "a.png"
    shot.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    b = write_bundle(
        tmp_path / "b", [{"image": str(shot)}], media_roots=[media], shared_media=True, missing_media="error"
    )
    assert os.path.basename(open_bundle(b, verify="full")[0]["image"]) == stored_name(shot)
    (stored,) = (b / "media").iterdir()
    assert stored.stat().st_ino == shot.stat().st_ino


@pytest.mark.parametrize("url", ["s3://b//x", "s3://b//", "s3://b/a//x", "s3://b/x//", "gs://b//x/y"])
def test_an_empty_key_part_is_refused_at_every_entry(url: str, in_tmp: Path) -> None:
    """On S3 ``s3://b//x`` is the key ``/x``, another object than ``x``: it is refused, never read
    as ``s3://b/x`` (nor is any other empty part); nothing is asked of a store (the endpoint is
    closed), and nothing is written locally."""
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    from bundles import StoreURL

    closed = {"endpoint": "http://127.0.0.1:1", "allow_http": True, "max_retries": 0}
    expected = rf"^{url}: key parts must not be empty, '\.' or '\.\.', found ''$"
    for call in (
        lambda: StoreURL(url),
        lambda: open_bundle(url, storage_options=closed),
        lambda: write_bundle(url, [{"index": 0}], storage_options=closed),
        lambda: remove_bundle(url, storage_options=closed),
        lambda: is_bundle(url, storage_options=closed),
    ):
        with pytest.raises(BundleError, match=expected):
            call()
    assert list(in_tmp.iterdir()) == []


def test_one_trailing_slash_names_the_same_prefix() -> None:
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    from bundles import StoreURL

    assert StoreURL("s3://b/x/") == "s3://b/x" and StoreURL("s3://b/x/").key == "x"
    assert StoreURL("s3://b/") == "s3://b" and StoreURL("s3://b/").key == ""
    assert StoreURL("s3://b/x").child("") == "s3://b/x"
