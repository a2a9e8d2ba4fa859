"""``len(bundle)``, iteration, ``bundle[i]`` and ``bundle.samples(indices=...)``: one sample read
from the one shard that holds it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import put_media

import bundles._local.writer
from bundles import BundleFormatError, BundleIndexError, BundleVerificationError, open_bundle, write_bundle


@pytest.fixture
def sharded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Ten samples in five shards (the shard size target is lowered so that two samples fill one)."""
    monkeypatch.setattr(bundles._local.writer, "SHARD_TARGET_RAW_BYTES", 3000)
    run = tmp_path / "run"
    samples = [
        {"index": i, "pad": bytes([i]) * 2000, "images": [put_media(run, bytes([i % 3]) * 100)]}
        for i in range(10)
    ]
    path = write_bundle(tmp_path / "b", samples, media_roots=[run])
    assert len(open_bundle(path).manifest["shards"]) == 5
    return path


def test_len_iter_and_getitem_agree_with_samples(sharded: Path) -> None:
    b = open_bundle(sharded)
    everything = list(b.samples())
    assert len(b) == 10
    assert [s["index"] for s in b] == list(range(10))
    assert all(b[i] == everything[i] for i in range(10))
    assert b[-1] == everything[9] and b[-10] == everything[0]
    assert [s["index"] for s in b[3:8:2]] == [3, 5, 7]
    assert [s["index"] for s in b.samples(indices=[7, 2, 2, 9])] == [7, 2, 2, 9]
    assert Path(b[4]["images"][0]).read_bytes() == bytes([1]) * 100  # references resolved into the bundle


def test_getitem_reads_only_the_shard_holding_the_sample(sharded: Path) -> None:
    b = open_bundle(sharded)
    shards = [sharded / e["path"] for e in b.manifest["shards"]]
    os.chmod(shards[0], 0o644)
    shards[0].write_bytes(b"x" * shards[0].stat().st_size)  # same size: only its digest betrays it
    assert b[5]["index"] == 5  # shard 2 is read; the damaged shard 0 is not touched
    assert [s["index"] for s in b.samples(indices=[9, 8, 2])] == [9, 8, 2]
    with pytest.raises(BundleVerificationError, match=r"000000\.msgpack\.zst: digest: expected sha256:"):
        b[1]


@pytest.mark.parametrize("index", [10, -11, 1000])
def test_out_of_range_names_the_bundle_and_count(sharded: Path, index: int) -> None:
    b = open_bundle(sharded)
    with pytest.raises(
        BundleIndexError, match=rf"{sharded}: sample index {index} is out of range: the bundle holds 10"
    ):
        b[index]
    with pytest.raises(IndexError):  # the built-in too, so sequence idioms keep working
        list(b.samples(indices=[0, index]))


def test_empty_bundle(tmp_path: Path) -> None:
    b = open_bundle(write_bundle(tmp_path / "e", []))
    assert len(b) == 0 and list(b) == [] and b[:] == []
    with pytest.raises(BundleIndexError):
        b[0]


def test_from_dict_errors_name_the_bundle_index(sharded: Path) -> None:
    class Strict:
        @classmethod
        def from_dict(cls, d: dict) -> Strict:
            if d["index"] == 7:
                raise ValueError("no sevens")
            return cls()

    b = open_bundle(sharded)
    assert len(list(b.samples(Strict, indices=[3, 4]))) == 2
    with pytest.raises(BundleFormatError, match=r"samples\[7\]: .*Strict.from_dict: ValueError: no sevens"):
        list(b.samples(Strict, indices=[2, 7]))
