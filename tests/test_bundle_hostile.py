"""Hostile bundles and packed files: each is refused with an error naming the file and field."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import msgpack
import pytest
import zstandard
from helpers import put_media

import bundles._local.sources as source
from bundles import (
    BundleFormatError,
    BundleNotFoundError,
    BundleVerificationError,
    UnsafeBundleError,
    open_bundle,
    pack_bundle,
    unpack_bundle,
    write_bundle,
)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    paths = [put_media(run, os.urandom(300)) for _ in range(3)]
    return write_bundle(tmp_path / "b", [{"i": i, "images": paths} for i in range(3)], media_roots=[run])


def edit_manifest(path: Path, change) -> None:
    m = path / "manifest.json"
    data = json.loads(m.read_text())
    change(data)
    os.chmod(m, 0o644)
    m.write_text(json.dumps(data))


def replace_file(path: Path, data: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(data)


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        (
            lambda m: m.update(format_version=2),
            BundleFormatError,
            "format_version: expected one of [1], found 2",
        ),
        (lambda m: m.update(format="zarr"), BundleFormatError, "format: expected 'rollout-bundle'"),
        (lambda m: m["shards"][0].update(path="../../etc/passwd"), UnsafeBundleError, "shards[0].path"),
        (lambda m: m["shards"][0].update(path="/etc/passwd"), UnsafeBundleError, "shards[0].path"),
        (lambda m: m["media"][0].update(suffix="/../../x"), UnsafeBundleError, "media[0].suffix"),
        (lambda m: m["media"][0].update(digest="sha256:../../x"), BundleFormatError, "media[0].digest"),
        (lambda m: m["shards"][0].update(raw_size=2**40), UnsafeBundleError, "shards[0].raw_size"),
        (lambda m: m.update(sample_count=5), BundleFormatError, "sample_count: 5 disagrees"),
        (lambda m: m.pop("media"), BundleFormatError, "media: required field is missing"),
        (lambda m: m["media"].append(dict(m["media"][0])), BundleFormatError, "is listed twice"),
    ],
)
def test_bad_manifests_are_refused_naming_the_field(bundle, change, error, field):
    edit_manifest(bundle, change)
    with pytest.raises(error) as e:
        open_bundle(bundle, verify="none")
    assert field in str(e.value) and "manifest.json" in str(e.value)


def test_manifest_over_the_size_cap_is_refused_before_parsing(bundle, monkeypatch):
    monkeypatch.setattr(source, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(UnsafeBundleError, match="exceeds the manifest cap of 100"):
        open_bundle(bundle, verify="none")


def test_invalid_json_and_nan_are_refused(bundle):
    replace_file(bundle / "manifest.json", b'{"format": NaN}')
    with pytest.raises(BundleFormatError, match="not valid JSON"):
        open_bundle(bundle)


def test_symlinks_and_special_files_inside_are_rejected(bundle, tmp_path):
    media = next((bundle / "media").iterdir())
    target = tmp_path / "secret"
    target.write_bytes(b"x" * media.stat().st_size)
    os.chmod(bundle / "media", 0o755)
    media.unlink()
    media.symlink_to(target)
    os.mkfifo(bundle / "media" / "fifo")
    with pytest.raises(BundleVerificationError) as e:
        open_bundle(bundle, verify="fast")
    problems = e.value.problems
    assert any(media.name in p and "found a symlink" in p for p in problems)
    assert any("fifo" in p and "found a FIFO" in p for p in problems)


def test_manifest_symlink_is_rejected(bundle, tmp_path):
    real = tmp_path / "m.json"
    real.write_bytes((bundle / "manifest.json").read_bytes())
    os.chmod(bundle, 0o755)
    (bundle / "manifest.json").unlink()
    (bundle / "manifest.json").symlink_to(real)
    with pytest.raises(UnsafeBundleError, match=r"manifest\.json: expected a regular file, found a symlink"):
        open_bundle(bundle, verify="none")


def test_every_bad_file_is_listed_not_just_the_first(bundle):
    media = sorted((bundle / "media").iterdir())
    for f in media[:2]:
        data = bytearray(f.read_bytes())
        data[0] ^= 0xFF
        replace_file(f, bytes(data))  # same size: only full verification sees it
    (bundle / "media" / media[2].name).chmod(0o644)
    os.truncate(media[2], 1)
    open(bundle / "stray.txt", "w").close()
    with pytest.raises(BundleVerificationError) as e:
        open_bundle(bundle, verify="full")
    problems = e.value.problems
    assert sum("digest: expected sha256:" in p for p in problems) == 2
    assert any(media[2].name in p and "size: expected 300 bytes, found 1" in p for p in problems)
    assert any("stray.txt: file is not listed" in p for p in problems)
    assert len(problems) == 4
    assert open_bundle(bundle, verify="none").problems(full=False) != []


def test_shard_digest_mismatch_is_caught_fast(bundle):
    shard = bundle / "samples" / "000000.msgpack.zst"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    replace_file(shard, bytes(data))
    with pytest.raises(BundleVerificationError, match=r"000000\.msgpack\.zst: digest: expected"):
        open_bundle(bundle, verify="fast")


def _rewrite_shard(bundle: Path, raw: bytes, raw_size: int | None = None) -> None:
    data = zstandard.ZstdCompressor().compress(raw)
    replace_file(bundle / "samples" / "000000.msgpack.zst", data)

    def change(m):
        m["shards"][0].update(
            size=len(data),
            digest="sha256:" + hashlib.sha256(data).hexdigest(),
            raw_size=len(raw) if raw_size is None else raw_size,
        )

    edit_manifest(bundle, change)


def test_decompression_bomb_stops_at_the_recorded_size(bundle):
    bomb = msgpack.packb({"x": b"\0" * 50_000_000}) * 3
    _rewrite_shard(bundle, bomb, raw_size=1000)
    b = open_bundle(bundle, verify="fast")
    with pytest.raises(
        UnsafeBundleError, match="raw_size: expected 1000 decompressed bytes, found more than 1000"
    ):
        list(b.samples())


def test_unknown_extension_types_are_refused(bundle):
    raw = b"".join(msgpack.packb({"x": msgpack.ExtType(99, b"whatever")}) for _ in range(3))
    _rewrite_shard(bundle, raw)
    with pytest.raises(BundleFormatError, match="unknown msgpack extension type 99"):
        list(open_bundle(bundle).samples())


def test_msgpack_timestamps_are_not_a_bundle_type(bundle):
    timestamp = b"\x81\xa1x\xd6\xff\x00\x00\x00\x00"  # {"x": ext -1 (a msgpack timestamp)}
    _rewrite_shard(bundle, timestamp * 3)
    with pytest.raises(BundleFormatError, match=r"samples\[0\]\.x: msgpack timestamps are not"):
        list(open_bundle(bundle).samples())


def test_reference_to_unlisted_media_names_the_key_path(bundle):
    ref = msgpack.ExtType(2, msgpack.packb(["sha256:" + "ab" * 32, 3, ".png"]))
    raw = b"".join(msgpack.packb({"i": i, "deep": {"imgs": [1, ref]}}) for i in range(3))
    _rewrite_shard(bundle, raw)
    with pytest.raises(BundleFormatError, match=r"samples\[0\]\.deep\.imgs\[1\]: references sha256:abab"):
        list(open_bundle(bundle).samples())


def test_array_with_inconsistent_byte_count_is_refused(bundle):
    arr = msgpack.ExtType(4, msgpack.packb(["<i4", [10]]) + b"\0" * 8)
    _rewrite_shard(bundle, b"".join(msgpack.packb({"a": arr}) for _ in range(3)))
    with pytest.raises(BundleFormatError, match=r"shape \(10,\) needs 40 bytes, found 8"):
        list(open_bundle(bundle).samples())


def test_object_dtype_in_a_file_is_refused(bundle):
    arr = msgpack.ExtType(4, msgpack.packb(["|O", [1]]) + b"\0" * 8)
    _rewrite_shard(bundle, b"".join(msgpack.packb({"a": arr}) for _ in range(3)))
    with pytest.raises(BundleFormatError, match="is not numeric or bool"):
        list(open_bundle(bundle).samples())


def test_staging_directories_and_files_are_not_bundles(bundle, tmp_path):
    staging = tmp_path / ".b.staging.host.123.abcd"
    staging.mkdir()
    with pytest.raises(BundleNotFoundError, match="staging directory of an unfinished write"):
        open_bundle(staging)
    with pytest.raises(BundleNotFoundError, match="does not exist"):
        open_bundle(tmp_path / "nope")
    packed = pack_bundle(bundle, tmp_path / "b.rbundle")
    with open_bundle(packed, verify="full") as b:  # read in place
        assert b.packed and len(b) == 3


# -- packed files ------------------------------------------------------------------------------


def _tar(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    out = tmp_path / "evil.rbundle"
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([(_member("/etc/cron.d/x"), b"x")], "absolute names are refused"),
        ([(_member("media/../../x"), b"x")], "names with '..'"),
        ([(_member("media/" + "ab" * 32 + ".png", tarfile.SYMTYPE, "/etc/passwd"), None)], "found a symlink"),
        (
            [(_member("media/" + "ab" * 32 + ".png", tarfile.LNKTYPE, "manifest.json"), None)],
            "found a hard link",
        ),
        ([(_member("samples/000000.msgpack.zst", tarfile.FIFOTYPE), None)], "found a FIFO"),
        ([(_member("manifest.json"), b"{}"), (_member("manifest.json"), b"{}")], "appears twice"),
        ([(_member("notes.txt"), b"x")], "not a name the bundle layout allows"),
    ],
)
def test_unpack_refuses_hostile_members_and_leaves_nothing(tmp_path, members, message):
    evil = _tar(tmp_path, members)
    with pytest.raises(UnsafeBundleError, match=message) as e:
        unpack_bundle(evil, tmp_path / "out")
    assert str(evil) in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["evil.rbundle"]


def test_unpack_fully_verifies(bundle, tmp_path):
    packed = pack_bundle(bundle, tmp_path / "b.rbundle")
    data = bytearray(packed.read_bytes())
    name = next((bundle / "media").iterdir()).name.encode()
    at = data.index(name)
    data[at + 512 + 10] ^= 0xFF  # first byte region of that media file's content block
    evil = tmp_path / "corrupt.rbundle"
    evil.write_bytes(bytes(data))
    with pytest.raises(BundleVerificationError) as e:
        unpack_bundle(evil, tmp_path / "out")
    (problem,) = e.value.problems  # the corrupted media file, and only it
    assert (
        f"/media/{name.decode()}: digest: expected sha256:{name.decode().split('.')[0]}, found sha256:"
        in problem
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("linked", ["media", "samples"])
def test_a_member_directory_that_is_a_symlink_is_never_read_through(tmp_path, linked):
    """Issue 36, item 10: ``O_NOFOLLOW`` stops at the last component only; a bundle whose
    ``media/`` or ``samples/`` is a symlink to a directory elsewhere must not read from there.
    The outside directory holds the genuine files (digests match): only the path tells."""
    from PIL import Image

    run = tmp_path / "run"
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(png, "PNG")
    b = write_bundle(tmp_path / "b", [{"i": 0, "shot": put_media(run, png.getvalue()),
                                       "img": Image.new("RGB", (4, 4), (9, 9, 9))}], media_roots=[run])  # fmt: skip
    outside = tmp_path / "outside"
    (b / linked).rename(outside)
    (b / linked).symlink_to(outside)
    mark = outside / "user-file.txt"  # a user's file beside what is linked: never touched
    mark.write_text("keep me")
    name = next(
        p.name for p in (outside if linked == "media" else b / "media").iterdir() if p.suffix == ".png"
    )
    with open_bundle(b, verify="none") as opened:
        with pytest.raises(UnsafeBundleError, match=rf"{b}/{linked}: expected a directory, found a symlink"):
            if linked == "media":
                opened.open_media(name)
            else:
                list(opened.samples())
        if linked == "media":  # an image read in place (PIL) goes through the same open
            with pytest.raises(BundleFormatError, match=rf"{b}/media: expected a directory, found a symlink"):
                list(opened.samples())
    member = f"media/{name}" if linked == "media" else f"samples/{next(outside.glob('*.zst')).name}"
    with pytest.raises(UnsafeBundleError, match=rf"{b}/{linked}: expected a directory, found a symlink"):
        source.open_regular_file(member, root=b)
    with pytest.raises(UnsafeBundleError, match=r"not a path below"):
        source.open_regular_file("media/../../outside/user-file.txt", root=b)
    assert mark.read_text() == "keep me"


@pytest.mark.parametrize("link", ["auto", "hardlink", "copy"])
def test_rehydrating_a_bundle_whose_media_links_outside_places_nothing(tmp_path, link):
    """Issue 36, item 10: rehydrate links media by path; a ``media/`` that is a symlink to a
    directory elsewhere is refused before anything is placed (the outside files would have been
    hard-linked into the run unhashed)."""
    run = tmp_path / "run"
    b = write_bundle(tmp_path / "b", [{"i": 0, "shot": put_media(run, os.urandom(300))}], media_roots=[run])
    outside = tmp_path / "outside"
    (b / "media").rename(outside)
    (b / "media").symlink_to(outside)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    target = tmp_path / "target"
    refused = pytest.raises(UnsafeBundleError, match=rf"{b}/media: expected a directory, found a symlink")
    with open_bundle(b, verify="none") as opened, refused:
        opened.rehydrate(target, link=link)
    assert not target.exists() or not list(target.iterdir())
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
