"""Typed records (extension 7): registered frozen dataclasses round-trip, unknown names come back
as plain ``Record``s, hostile payloads are refused naming the sample, nothing named by a file is
ever imported."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
import zstandard

from bundles import (
    BundleFormatError,
    Record,
    UnsupportedValueError,
    open_bundle,
    register_record_type,
    write_bundle,
)
from bundles._format.layout import EXT_RECORD

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Slot:
    name: str
    slot: int


@dataclass(frozen=True)
class Checked:
    value: int

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError("value must be >= 0")


@dataclass(frozen=True)
class NotRegistered:
    x: int


@dataclass
class Mutable:
    x: int


register_record_type(Slot, "test_records.Slot")
register_record_type(Checked, "test_records.Checked")


def test_registered_records_round_trip_anywhere_in_a_sample(tmp_path):
    sample = {
        "adapter": Slot("math", 1),
        "list": [Slot("a", 0), (Slot("b", 2),)],
        "map": {"deep": {"deeper": Slot("c", 3)}},
        "status": "completed",
    }
    write_bundle(tmp_path / "b", [sample])
    (got,) = open_bundle(tmp_path / "b", verify="full").samples()
    assert got == sample
    assert type(got["adapter"]) is Slot and type(got["list"][1][0]) is Slot


def test_an_unknown_name_comes_back_as_a_plain_record_that_writes_back_unchanged(tmp_path):
    rec = Record("elsewhere.Thing", {"a": 1, "b": [Slot("x", 1)]})
    write_bundle(tmp_path / "b", [{"r": rec}])
    (got,) = open_bundle(tmp_path / "b").samples()
    assert type(got["r"]) is Record and got["r"] == rec
    assert repr(got["r"]) == "Record('elsewhere.Thing', {'a': 1, 'b': [Slot(name='x', slot=1)]})"
    write_bundle(tmp_path / "c", [got])
    shard = "samples/000000.msgpack.zst"
    assert (tmp_path / "b" / shard).read_bytes() == (tmp_path / "c" / shard).read_bytes()


def test_registered_name_with_other_fields_is_an_error_naming_both(tmp_path):
    write_bundle(
        tmp_path / "b", [{"ok": 1}, {"meta": {"adapter": Record("test_records.Slot", {"name": "x"})}}]
    )
    rows = open_bundle(tmp_path / "b").samples()
    assert next(rows) == {"ok": 1}
    with pytest.raises(BundleFormatError) as e:
        next(rows)
    msg = str(e.value)
    assert "samples[1].meta.adapter" in msg
    assert "record 'test_records.Slot': expected fields ['name', 'slot']" in msg and "found ['name']" in msg


def test_a_class_refusing_the_stored_values_is_an_error(tmp_path):
    write_bundle(tmp_path / "b", [{"c": Record("test_records.Checked", {"value": -1})}])
    with pytest.raises(
        BundleFormatError, match=r"samples\[0\]\.c: record 'test_records.Checked': .*value must be >= 0"
    ):
        list(open_bundle(tmp_path / "b").samples())


def test_writing_unregistered_or_mutable_dataclasses_is_refused(tmp_path):
    with pytest.raises(
        UnsupportedValueError, match=r"samples\[0\]\.x: .*NotRegistered.*register_record_type"
    ):
        write_bundle(tmp_path / "b", [{"x": NotRegistered(1)}])
    with pytest.raises(TypeError, match="not frozen"):
        register_record_type(Mutable, "test_records.Mutable")
    with pytest.raises(TypeError, match="expected a dataclass"):
        register_record_type(dict, "test_records.Dict")
    with pytest.raises(ValueError, match=r"is registered as 'test_records\.Slot' already"):
        register_record_type(Slot, "test_records.Other")
    with pytest.raises(ValueError, match="expected a dotted identifier"):
        register_record_type(NotRegistered, "../etc")
    register_record_type(Slot, "test_records.Slot")  # again, same name: nothing happens
    assert not (tmp_path / "b").exists()


def _bundle_with_raw_sample(tmp_path: Path, raw: bytes) -> Path:
    """A bundle whose one shard holds ``raw`` (msgpack of one sample), manifest updated."""
    path = write_bundle(tmp_path / "h", [{"placeholder": 0}])
    data = zstandard.ZstdCompressor(write_checksum=True).compress(raw)
    shard = path / "samples" / "000000.msgpack.zst"
    os.chmod(shard, 0o644)
    shard.write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["shards"][0].update(
        size=len(data), digest="sha256:" + hashlib.sha256(data).hexdigest(), raw_size=len(raw)
    )
    os.chmod(path / "manifest.json", 0o644)
    (path / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
    return path


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (msgpack.packb(["os.system", {"a": 1}, 3]), "record extension does not hold \\[name, fields\\]"),
        (msgpack.packb({"name": "x"}), "record extension does not hold \\[name, fields\\]"),
        (msgpack.packb([7, {}]), "record name: expected a dotted identifier"),
        (msgpack.packb(["a/../b", {}]), "record name: expected a dotted identifier"),
        (msgpack.packb(["x" * 201, {}]), "record name: expected a dotted identifier"),
        (msgpack.packb(["ok.Name", [1, 2]]), "record 'ok.Name': expected a map of field names"),
        (msgpack.packb(["ok.Name", {1: 2}]), "record 'ok.Name': expected a map of field names"),
        (b"\xc1", "malformed record"),
    ],
)
def test_hostile_record_payloads_are_refused_naming_the_sample(tmp_path, payload, message):
    raw = msgpack.packb({"r": msgpack.ExtType(EXT_RECORD, payload)})
    bundle = open_bundle(_bundle_with_raw_sample(tmp_path, raw), verify="full")
    with pytest.raises(BundleFormatError, match=r"samples\[0\]\.r: " + message):
        list(bundle.samples())


def test_a_name_from_the_file_is_never_imported(tmp_path):
    """A record named after an importable module comes back as a Record; the module stays unloaded."""
    script = f"""
import sys
from bundles import Record, open_bundle, write_bundle
write_bundle({str(tmp_path / "b")!r}, [{{"r": Record("antigravity.Thing", {{}}), "s": Record("this", {{}})}}])
(row,) = open_bundle({str(tmp_path / "b")!r}).samples()
assert type(row["r"]) is Record and type(row["s"]) is Record
assert "antigravity" not in sys.modules and "this" not in sys.modules
print("ok")
"""
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_problem_inside_a_records_fields_is_named_by_its_key_path(tmp_path):
    inner = msgpack.packb(["x.Y", {"a": [1, msgpack.ExtType(99, b"zz")]}])
    raw = msgpack.packb({"r": msgpack.ExtType(EXT_RECORD, inner)})
    bundle = open_bundle(_bundle_with_raw_sample(tmp_path, raw), verify="full")
    with pytest.raises(
        BundleFormatError, match=r"samples\[0\]\.r\.a\[1\]: unknown msgpack extension type 99"
    ):
        list(bundle.samples())
