"""Typed seams of the format API (issue 17 item 3): the Manifest type, the Verify and LinkMode
vocabularies, OutsidePolicy defined once. No behaviour or on-disk change: the old strings and
item access keep working."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
from helpers import put_media

from bundles import (
    BundleError,
    BundleFormatError,
    LinkMode,
    Manifest,
    MediaEntry,
    ShardEntry,
    Verify,
    open_bundle,
    pack_bundle,
    write_bundle,
)
from trainer_hooks.arguments import BUNDLE_LINK_MODES, BUNDLE_VERIFY_MODES

ROOT = Path(__file__).resolve().parent.parent


def _bundle(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    a = put_media(run, b"\x89PNG first")
    b = put_media(run, b"\x89PNG second")
    samples = [{"i": i, "image": a if i % 2 else b} for i in range(5)]
    return write_bundle(tmp_path / "b", samples, media_roots=[run], kind="debug_dump", meta={"step": 3})


def test_the_manifest_is_typed_and_still_the_stored_json_object(tmp_path):
    path = _bundle(tmp_path)
    with open_bundle(path) as bundle:
        m = bundle.manifest
    assert isinstance(m, Manifest) and isinstance(m, dict)
    stored = json.loads((path / "manifest.json").read_text())
    assert m == stored and json.loads(json.dumps(m)) == stored  # item access and JSON as before
    assert (m.format_version, m.kind, m.meta, m.sample_count) == (1, "debug_dump", {"step": 3}, 5)
    assert m.created_by == stored["created_by"] and m.media_references == stored["media_references"] == 5
    assert all(type(s) is ShardEntry for s in m.shards)
    assert [(s.path, s.samples, s.size, s.raw_size, s.digest) for s in m.shards] == [
        (s["path"], s["samples"], s["size"], s["raw_size"], s["digest"]) for s in stored["shards"]
    ]
    assert all(type(e) is MediaEntry for e in m.media)
    assert sorted(e.filename for e in m.media) == sorted(r.filename for r in bundle.media)
    with pytest.raises(AttributeError):
        m.shards[0].size = 1  # entries are frozen
    assert pickle.loads(pickle.dumps(m)).shards == m.shards


def test_a_packed_bundle_parses_to_the_same_manifest(tmp_path):
    path = _bundle(tmp_path)
    packed = pack_bundle(path, tmp_path / "b.rbundle")
    with open_bundle(path) as a, open_bundle(packed) as b:
        assert a.manifest == b.manifest and a.manifest.shards == b.manifest.shards
        assert a.manifest.media == b.manifest.media


def test_manifest_parse_validates_in_one_place():
    with pytest.raises(BundleFormatError, match=r"manifest: sample_count: expected an int"):
        Manifest.parse(
            json.dumps(
                {
                    "format": "rollout-bundle",
                    "format_version": 1,
                    "kind": "x",
                    "meta": {},
                    "sample_count": "5",
                    "shards": [],
                    "media": [],
                }
            ).encode(),
            "manifest",
        )


def test_verify_and_link_mode_are_str_enums_that_accept_the_old_strings(tmp_path):
    assert Verify.values() == ("none", "fast", "full")
    assert LinkMode.values() == ("auto", "hardlink", "reflink", "copy")
    assert Verify.FAST == "fast" and str(Verify.FULL) == "full" and f"{LinkMode.COPY}" == "copy"
    assert json.dumps([Verify.NONE, LinkMode.AUTO]) == '["none", "auto"]'
    assert Verify.parse("full") is Verify.FULL and Verify.parse(Verify.FAST) is Verify.FAST
    assert Verify.parse("FULL") is None and Verify.parse(True) is None and LinkMode.parse(["auto"]) is None
    path = _bundle(tmp_path)
    for level in [*Verify, *Verify.values()]:
        assert len(open_bundle(path, verify=level)) == 5
    for i, mode in enumerate((LinkMode.COPY, "copy", LinkMode.AUTO)):
        write_bundle(tmp_path / f"c{i}", [{"x": 1}], kind="t", meta={}, link=mode)
    with open_bundle(path) as bundle:
        assert len(bundle.rehydrate(tmp_path / "media", link=LinkMode.COPY)) == 5
        bundle.verify(Verify.FULL)


def test_unknown_levels_and_modes_are_refused_as_before(tmp_path):
    path = _bundle(tmp_path)
    with pytest.raises(BundleFormatError, match=r"verify: expected one of none, fast, full, found 'quick'"):
        open_bundle(path, verify="quick")
    with pytest.raises(BundleError, match=r"verify: expected 'fast' or 'full', found 'none'"):
        open_bundle(path).verify("none")
    with pytest.raises(
        BundleError, match=r"link: expected one of auto, hardlink, reflink, copy, found 'symlink'"
    ):
        write_bundle(tmp_path / "d", [{"x": 1}], kind="t", meta={}, link="symlink")
    packed = pack_bundle(path, tmp_path / "p.rbundle")
    with open_bundle(packed) as bundle, pytest.raises(BundleError, match=r"link='hardlink': the members"):
        bundle.rehydrate(tmp_path / "m", link=LinkMode.HARDLINK)


def test_the_trainer_options_take_their_choices_from_bundles():
    assert LinkMode.values() == BUNDLE_LINK_MODES
    assert Verify.values() == BUNDLE_VERIFY_MODES


def test_outside_policy_is_defined_once():
    definitions = [
        f"{p.relative_to(ROOT)}:{n}"
        for top in ("bundles", "trainer_hooks")
        for p in sorted((ROOT / top).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.match(r"\s*OutsidePolicy\s*=", line)
    ]
    assert definitions == ["bundles/_format/options.py:" + definitions[0].rpartition(":")[2]]
