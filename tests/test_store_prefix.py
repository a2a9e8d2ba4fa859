"""bundles.StorePrefix, the seam through which tools keep their own objects beside bundles (the
rollout journal's shipments), on moto at 127.0.0.1: names are one path component, reads are
bounded before anything is downloaded, downloads never write through a link or over a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import BundleError, BundleNotFoundError, StorePrefix


@pytest.fixture
def prefix(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> StorePrefix:
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto_s3.bucket()
    return StorePrefix(f"s3://{bucket}/tool")


def _raw(prefix: StorePrefix, moto: Any) -> S3Store:
    o = moto.options()
    return S3Store(
        prefix.url.bucket,
        endpoint=o["endpoint"],
        access_key_id=o["access_key_id"],
        secret_access_key=o["secret_access_key"],
        region="us-east-1",
        client_options={"allow_http": True},
    )


def test_at_tells_a_store_url_from_a_local_path(tmp_path: Path) -> None:
    assert StorePrefix.at(tmp_path) is None
    assert str(StorePrefix.at("s3://bucket/a/b")) == "s3://bucket/a/b"


def test_create_only_put_get_names_and_delete(prefix: StorePrefix) -> None:
    assert prefix.put_create("a.bin", b"first")
    assert not prefix.put_create("a.bin", b"second"), "a create-only put over an object must fail"
    assert prefix.get("a.bin", max_bytes=100) == b"first"
    assert prefix.child("sub").put_create("b.bin", b"below")
    assert prefix.names() == {"a.bin": 5}, "only the objects right under the prefix"
    prefix.delete(["a.bin", "never-there"])
    assert prefix.names() == {}
    with pytest.raises(BundleNotFoundError, match=r"s3://.*/tool/a\.bin: not found"):
        prefix.get("a.bin", max_bytes=100)


@pytest.mark.parametrize("name", ["../up", "a/b", "..", ".", ""])
def test_a_name_is_one_path_component(prefix: StorePrefix, name: str) -> None:
    with pytest.raises(BundleError, match="is not an object name"):
        prefix.put_create(name, b"x")


def test_reads_are_bounded_before_anything_is_downloaded(prefix: StorePrefix, tmp_path: Path) -> None:
    prefix.put_create("big", b"x" * 1000)
    with pytest.raises(BundleError, match=r"/big: 1000 bytes exceeds the limit of 999 bytes$"):
        prefix.get("big", max_bytes=999)
    with pytest.raises(BundleError, match=r"/big: 1000 bytes exceeds the limit of 999 bytes$"):
        prefix.download("big", tmp_path / "big", max_bytes=999)
    assert not (tmp_path / "big").exists()


def test_a_download_is_written_in_place_and_never_through_a_link(prefix: StorePrefix, tmp_path: Path) -> None:
    data = os.urandom(20 << 20)  # three ranges of 8 MiB
    prefix.put_create("blob", data)
    assert prefix.download("blob", tmp_path / "blob", max_bytes=len(data)) == len(data)
    assert (tmp_path / "blob").read_bytes() == data
    with pytest.raises(BundleError, match="cannot download into"):
        prefix.download("blob", tmp_path / "blob", max_bytes=len(data))  # never over a file
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(BundleError, match="cannot download into"):
        prefix.download("blob", tmp_path / "link", max_bytes=len(data))
    assert not (tmp_path / "target").exists()


def test_names_leave_out_what_cannot_be_a_file_name(prefix: StorePrefix, moto_s3: Any) -> None:
    raw = _raw(prefix, moto_s3)
    obstore.put(raw, "tool/ok", b"1")
    obstore.put(raw, "tool/deeper/x", b"2")
    assert prefix.names() == {"ok": 1}
