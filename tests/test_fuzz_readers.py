"""Fuzzing every reader: whatever the bytes, the only exception is a BundleError."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

import msgpack
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import BundleError, open_bundle, unpack_bundle, write_bundle

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _fresh(tmp_path_factory) -> Path:
    return write_bundle(tmp_path_factory.mktemp("fz") / "b", [{"i": 1, "t": (1, 2)}, {"i": 2}])


def _replace(path: Path, data: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(data)


def _read_all(path: Path) -> None:
    bundle = open_bundle(path, verify="fast")
    for _ in bundle.samples():
        pass


@FUZZ
@given(data=st.binary(max_size=2000))
def test_fuzz_manifest_bytes(tmp_path_factory, data):
    b = _fresh(tmp_path_factory)
    _replace(b / "manifest.json", data)
    with contextlib.suppress(BundleError):
        _read_all(b)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=20,
)


@FUZZ
@given(
    field=st.sampled_from(["format_version", "kind", "meta", "sample_count", "shards", "media"]),
    value=json_values,
)
def test_fuzz_manifest_fields(tmp_path_factory, field, value):
    b = _fresh(tmp_path_factory)
    m = json.loads((b / "manifest.json").read_text())
    m[field] = value
    _replace(b / "manifest.json", json.dumps(m).encode())
    with contextlib.suppress(BundleError):
        _read_all(b)


@FUZZ
@given(
    raw=st.binary(max_size=3000),
    compress=st.booleans(),
    msgpack_objs=st.lists(st.tuples(st.integers(0, 127), st.binary(max_size=60)), max_size=4),
)
def test_fuzz_shard_contents(tmp_path_factory, raw, compress, msgpack_objs):
    b = _fresh(tmp_path_factory)
    if msgpack_objs:
        raw = (
            b"".join(msgpack.packb({"x": msgpack.ExtType(code, payload)}) for code, payload in msgpack_objs)
            + raw
        )
    data = zstandard.ZstdCompressor().compress(raw) if compress else raw
    shard = b / "samples" / "000000.msgpack.zst"
    _replace(shard, data)
    m = json.loads((b / "manifest.json").read_text())
    m["shards"][0].update(
        size=len(data), digest="sha256:" + hashlib.sha256(data).hexdigest(), raw_size=len(raw)
    )
    _replace(b / "manifest.json", json.dumps(m).encode())
    with contextlib.suppress(BundleError):
        _read_all(b)


@FUZZ
@given(data=st.binary(max_size=4000))
def test_fuzz_packed_files(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("pk")
    (d / "x.rbundle").write_bytes(data)
    try:
        unpack_bundle(d / "x.rbundle", d / "out")
    except BundleError:
        assert not (d / "out").exists()
