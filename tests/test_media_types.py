"""Media keep their type through a bundle: a path string comes back a path string, a MediaRef a
MediaRef (issue 9, item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from media_helpers import put_media

from bundles import BundleError, MediaMissingError, MediaRef, open_bundle, write_bundle


def test_path_strings_and_media_refs_keep_their_type(tmp_path):
    run = tmp_path / "run"
    path = put_media(run, b"\x89PNG shot")
    ref = MediaRef.from_file(put_media(run, b"\x89PNG other"))
    write_bundle(tmp_path / "b", [{"images": [path, ref], "note": "plain"}], media_roots=[run])
    (row,) = open_bundle(tmp_path / "b").samples()
    got_path, got_ref = row["images"]
    assert type(got_path) is str and Path(got_path).read_bytes() == b"\x89PNG shot"
    assert Path(got_path).is_relative_to(tmp_path / "b")
    assert type(got_ref) is MediaRef and got_ref.digest == ref.digest
    assert row["note"] == "plain"


def test_missing_media_keep_leaves_the_string(tmp_path):
    run = tmp_path / "run"
    present = put_media(run, b"there")
    gone = str(run / "gone.png")
    with pytest.raises(MediaMissingError, match=r"samples\[0\]\.images\[1\]: media file .*gone\.png does not exist"):
        write_bundle(tmp_path / "b", [{"images": [present, gone]}], media_roots=[run])
    write_bundle(tmp_path / "b", [{"images": [present, gone]}], media_roots=[run], missing_media="keep")
    (row,) = open_bundle(tmp_path / "b").samples()
    assert row["images"][1] == gone and Path(row["images"][0]).read_bytes() == b"there"
    with pytest.raises(BundleError, match="missing_media: expected 'error' or 'keep'"):
        write_bundle(tmp_path / "c", [], missing_media="drop")
