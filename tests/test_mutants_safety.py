"""The safety core's answers pinned exactly: tests written for the mutants that survived
``make mutants-safety`` (issue 36, "Checks"; docs/TESTING.md "Mutation testing").

The bundle proof (:mod:`bundles._proof`, ``examine_prefix``), the deletion primitive
(:mod:`bundles._commit`, ``remove_on_store``) and the publish path (:mod:`bundles._remote._verify`,
``upload_bundle``) were mostly tested by what they do to a user's files; a mutant that changed a
reason, a flag of a refusal (``damaged``, ``empty``) or a count in ``UploadStats`` went unseen.
Here each answer is compared whole: the :class:`NotProven` (where, reason, damaged, empty), the
message of a refusal, the objects left on a real S3 server (moto on 127.0.0.1). Every test that
deletes plants a user's file and checks it survives.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from helpers import put_media

from bundles import BundleFormatError, BundleNotFoundError, is_bundle, write_bundle
from bundles._layout import MAX_MANIFEST_BYTES
from bundles._proof import (
    DAMAGED_HINT,
    NotProven,
    Proof,
    claims_format,
    examine_directory,
    judge_manifest,
    removable_names,
)
from bundles._source import layout_name_ok

WEB = b'{"name": "My App", "start_url": "/"}\n'


def local_bundle(tmp_path: Path, name: str = "b", tag: str = "a") -> Path:
    run = tmp_path / f"run-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 30) for i in range(2)]
    return Path(
        write_bundle(tmp_path / name, [{"i": i, "image": p} for i, p in enumerate(paths)], media_roots=[run])
    )


# -- the proof: bundles/_proof.py ---------------------------------------------------------------
def test_a_proven_directory_names_its_members_shards_first(tmp_path: Path) -> None:
    b = local_bundle(tmp_path)
    found = examine_directory(b)
    assert isinstance(found, Proof)
    media = sorted(os.listdir(b / "media"))
    assert found.members() == ["samples/000000.msgpack.zst", *(f"media/{m}" for m in media)]
    assert (found.where, found.generation, found.shared_media, found.etag) == (str(b), None, False, None)
    assert examine_directory(str(b) + "/") == found  # the same directory, by any spelling


def test_examine_directory_says_exactly_why_a_directory_is_no_bundle(tmp_path: Path) -> None:
    b = local_bundle(tmp_path)
    staging = tmp_path / ".b.staging.host.1a2b.4026.77.0f"
    staging.mkdir()
    link = tmp_path / "link"
    link.symlink_to(b)
    plain = tmp_path / "file"
    plain.write_text("mine\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    gone = tmp_path / "gone"
    assert examine_directory(staging) == NotProven(
        str(staging), f"{staging}: a staging or retired directory of a writer, not a bundle"
    )
    assert examine_directory(link) == NotProven(str(link), f"{link}: a symlink, not a bundle directory")
    assert examine_directory(gone) == NotProven(
        str(gone), f"{gone}: no bundle here (path does not exist)", empty=True
    )
    assert examine_directory(plain) == NotProven(str(plain), f"{plain}: not a directory")
    assert examine_directory(plain / "x") == NotProven(str(plain / "x"), f"{plain / 'x'}: not a directory")
    assert examine_directory(empty) == NotProven(
        str(empty), f"{empty}: not a bundle (manifest.json is missing)", empty=True
    )
    assert examine_directory(other) == NotProven(
        str(other), f"{other}: not a bundle (manifest.json is missing)"
    )
    assert (other / "notes.txt").read_text() == "mine\n" and b.is_dir()


@pytest.mark.parametrize("kind", ["dir", "link", "fifo"])
def test_a_manifest_that_is_not_a_regular_file_is_no_bundle(tmp_path: Path, kind: str) -> None:
    b = local_bundle(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    m = d / "manifest.json"
    if kind == "dir":
        m.mkdir()
    elif kind == "link":
        m.symlink_to(b / "manifest.json")  # a valid manifest, but reached through a link
    else:
        os.mkfifo(m)
    assert examine_directory(d) == NotProven(str(d), f"{m}: not a regular file: not a bundle")
    assert not is_bundle(d)  # a directory named manifest.json raised IsADirectoryError here


@pytest.mark.parametrize(
    ("raw", "damaged", "reason"),
    [
        (WEB, False, "not a rollout-bundle manifest (format: expected 'rollout-bundle', found None)"),
        (
            b"not json",
            False,
            "not a rollout-bundle manifest (not valid JSON: Expecting value: line 1 column 1 (char 0))",
        ),
        (
            b'{"format" :  "rollout-bundle"}',
            True,
            "format_version: expected one of [1], found None; a newer rollout-bundles may read it",
        ),
    ],
)
def test_a_manifest_that_does_not_validate_is_judged_damaged_only_when_it_claims_the_format(
    tmp_path: Path, raw: bytes, damaged: bool, reason: str
) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "manifest.json").write_bytes(raw)
    where = f"{d}/manifest.json"
    assert examine_directory(d) == NotProven(str(d), f"{where}: {reason}", damaged=damaged)
    assert judge_manifest(raw, where) == NotProven(where, f"{where}: {reason}", damaged=damaged)
    assert examine_directory(d).why == f"{where}: {reason}"  # the reason names the manifest, not d
    with pytest.raises((BundleFormatError, BundleNotFoundError)):
        removable_names(examine_directory(d), damaged=False)
    assert (d / "manifest.json").read_bytes() == raw


@pytest.mark.parametrize("claim", [False, True])
def test_a_manifest_over_the_cap_is_no_bundle_and_damaged_when_it_claims_the_format(
    tmp_path: Path, claim: bool
) -> None:
    d = tmp_path / "d"
    d.mkdir()
    head = b'{"format": "rollout-bundle", "x": "' if claim else b'{"x": "'
    with open(d / "manifest.json", "wb") as f:
        f.write(head)
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: one byte over the cap
    where = f"{d}/manifest.json"
    assert examine_directory(d) == NotProven(
        str(d), f"{where}: more than {MAX_MANIFEST_BYTES} bytes, the manifest cap", damaged=claim
    )
    with open(d / "manifest.json", "r+b") as f:
        f.truncate(MAX_MANIFEST_BYTES)  # at the cap: read whole, judged by what it holds
    assert examine_directory(d).reason != f"{where}: more than {MAX_MANIFEST_BYTES} bytes, the manifest cap"


def test_claims_format_is_the_formats_name_as_format_and_nothing_else() -> None:
    assert claims_format(b'{"format":"rollout-bundle"}')
    assert claims_format(b'{"a": 1, "format" :\n "rollout-bundle-pointer"}')
    assert not claims_format(b'{"format": "rollout-bundles"}')
    assert not claims_format(b'{"format": "rollout"}')
    assert not claims_format(b'{"name": "rollout-bundle"}')
    assert not claims_format(WEB)


def test_not_proven_why_drops_only_its_own_location() -> None:
    assert NotProven("/x", "/x: gone").why == "gone"
    assert NotProven("/x", "/y: gone").why == "/y: gone"
    assert NotProven("/x", "/x:gone").why == "/x:gone"
    assert NotProven("/x", "why").why == "why"
    assert (NotProven("/x", "r").damaged, NotProven("/x", "r").empty) == (False, False)


def test_removable_names_allows_the_listed_members_or_the_layout_or_refuses_by_reason(tmp_path: Path) -> None:
    b = local_bundle(tmp_path)
    proof = examine_directory(b)
    assert isinstance(proof, Proof)
    ours = removable_names(proof, damaged=False)
    assert [n for n in proof.members() if ours(n)] == proof.members()
    assert not ours("manifest.json") and not ours("samples/000001.msgpack.zst") and not ours("notes.txt")
    assert removable_names(proof, damaged=True)("samples/000000.msgpack.zst")
    damaged = NotProven("/d", "/d/manifest.json: broken", damaged=True)
    assert removable_names(damaged, damaged=True) is layout_name_ok
    with pytest.raises(BundleFormatError) as e:
        removable_names(damaged, damaged=False)
    assert str(e.value) == f"/d/manifest.json: broken: a damaged bundle, not removed; {DAMAGED_HINT}"
    with pytest.raises(BundleNotFoundError) as e:
        removable_names(NotProven("/e", "/e: nothing", empty=True), damaged=True)
    assert str(e.value) == "/e: nothing"
    with pytest.raises(BundleNotFoundError) as e:
        removable_names(NotProven("/f", "/f: not a bundle"), damaged=True)
    assert str(e.value) == "/f: not a bundle; refusing to remove it"
    assert DAMAGED_HINT == (
        "`rollout-bundle rm --damaged` (remove_bundle(..., damaged=True)) removes only the names the format "
        "writes (manifest.json, samples/NNNNNN.msgpack.zst, media/<64 hex><suffix>)"
    )
