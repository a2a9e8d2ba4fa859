"""Media references: ingestion, dedup, link modes, missing files and lying digests."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import put_media

from bundles import (
    BundleError,
    BundleVerificationError,
    MediaMissingError,
    MediaRef,
    open_bundle,
    write_bundle,
)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "shared_media" / "0123abcd"
    d.mkdir(parents=True)
    return d


def test_bundle_survives_deletion_of_the_run_directory(tmp_path, run_dir):
    blobs = [os.urandom(5000 + i) for i in range(4)]
    paths = [put_media(run_dir, b) for b in blobs]
    samples = [{"index": i, "multimodal_inputs": {"images": paths[: i + 1]}} for i in range(4)]
    dest = write_bundle(tmp_path / "dump", samples, media_roots=[run_dir])
    shutil.rmtree(tmp_path / "shared_media")
    bundle = open_bundle(dest, verify="full")
    for i, s in enumerate(bundle.samples()):
        assert [Path(p).read_bytes() for p in s["multimodal_inputs"]["images"]] == blobs[: i + 1]
        assert all(p.startswith(str(dest)) for p in s["multimodal_inputs"]["images"])


def test_one_file_referenced_by_many_samples_is_stored_once(tmp_path, run_dir):
    shared = put_media(run_dir, b"screenshot" * 1000)
    samples = [{"images": [shared, shared]} for _ in range(50)]
    dest = write_bundle(tmp_path / "b", samples, media_roots=[run_dir])
    bundle = open_bundle(dest)
    assert len(bundle.media) == 1
    assert bundle.media_references == 100
    assert len(os.listdir(dest / "media")) == 1


def test_strings_outside_media_roots_are_untouched(tmp_path, run_dir):
    inside = put_media(run_dir, b"x")
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"y")
    escaping = str(run_dir) + "/../other/file.png"
    sample = {
        "prompt": "click the button at /usr/share/icons",
        "outside": str(outside),
        "relative": "0123abcd/foo.png",
        "escaping": escaping,
        "root_itself": str(run_dir),
        "sibling_prefix": str(run_dir) + "-other/x.png",
        "inside": inside,
    }
    (loaded,) = open_bundle(
        write_bundle(tmp_path / "b", [sample], media_roots=[run_dir], outside_paths="keep")
    ).samples()
    for k in ("prompt", "outside", "relative", "escaping", "root_itself", "sibling_prefix"):
        assert loaded[k] == sample[k]
    assert loaded["inside"] != inside and Path(loaded["inside"]).read_bytes() == b"x"


def test_missing_media_names_sample_and_key_path_and_leaves_nothing(tmp_path, run_dir):
    good = put_media(run_dir, b"ok")
    samples = [{"images": [good]} for _ in range(3)]
    samples.append({"multimodal_inputs": {"images": [good, str(run_dir / "gone.png")]}})
    with pytest.raises(MediaMissingError) as e:
        write_bundle(tmp_path / "b", samples, media_roots=[run_dir])
    msg = str(e.value)
    assert (
        "samples[3].multimodal_inputs.images[1]" in msg and "gone.png" in msg and str(tmp_path / "b") in msg
    )
    assert isinstance(e.value, FileNotFoundError)
    assert sorted(os.listdir(tmp_path)) == ["shared_media"]  # no bundle, no staging directory


def test_media_ref_size_mismatch_is_an_error(tmp_path, run_dir):
    p = put_media(run_dir, b"12345")
    ref = MediaRef.from_file(p)
    bad = MediaRef(ref.digest, ref.size + 1, ref.suffix, p)
    with pytest.raises(MediaMissingError, match=r"samples\[0\]\.ref: MediaRef .* expects 6 bytes, found 5"):
        write_bundle(tmp_path / "b", [{"ref": bad}], media_roots=[run_dir])


def test_media_ref_without_path_is_found_in_the_media_roots(tmp_path, run_dir):
    p = put_media(run_dir, b"abc", ".jpg")
    ref = MediaRef.from_file(p).with_path(None)
    (loaded,) = open_bundle(write_bundle(tmp_path / "b", [{"r": ref}], media_roots=[run_dir])).samples()
    assert loaded["r"].digest == ref.digest and Path(loaded["r"].path).read_bytes() == b"abc"
    with pytest.raises(MediaMissingError, match="has no path"):
        write_bundle(tmp_path / "c", [{"r": ref}])
    other_root = tmp_path / "other-run"
    other_root.mkdir()
    with pytest.raises(MediaMissingError) as e:
        write_bundle(
            tmp_path / "d", [{"x": [0, {"r": ref}]}], media_roots=[other_root, str(run_dir) + "-gone/"]
        )
    assert str(e.value) == (
        f"{tmp_path / 'd'}: samples[0].x[1].r: MediaRef {ref.digest} has no path and no file {ref.filename} "
        f"exists in the media roots {[str(other_root), str(run_dir) + '-gone']}"
    )


def test_media_ref_from_a_missing_file_names_it(tmp_path):
    with pytest.raises(MediaMissingError) as e:
        MediaRef.from_file(tmp_path / "gone.png")
    assert str(e.value) == f"{tmp_path / 'gone.png'}: media file not found"
    assert isinstance(e.value, FileNotFoundError)


def test_copied_file_with_a_lying_name_fails_the_write(tmp_path, run_dir):
    liar = run_dir / (hashlib.sha256(b"other").hexdigest() + ".png")
    liar.write_bytes(b"not other")
    with pytest.raises(MediaMissingError, match=r"samples\[0\]\.img: .*expected digest sha256:"):
        write_bundle(tmp_path / "b", [{"img": str(liar)}], media_roots=[run_dir], link="copy")
    assert not (tmp_path / "b").exists()


def test_hardlinked_file_with_a_lying_name_fails_full_verification(tmp_path, run_dir):
    liar = run_dir / (hashlib.sha256(b"other").hexdigest() + ".png")
    liar.write_bytes(b"not other")
    dest = write_bundle(tmp_path / "b", [{"img": str(liar)}], media_roots=[run_dir], link="hardlink")
    open_bundle(dest, verify="fast")  # the name is trusted for speed ...
    with pytest.raises(BundleVerificationError) as e:
        open_bundle(dest, verify="full")  # ... and full verification catches the lie
    assert "digest: expected sha256:" in str(e.value) and liar.name in str(e.value)


def test_media_ref_with_wrong_digest_is_caught(tmp_path, run_dir):
    p = put_media(run_dir, b"real bytes")
    wrong = MediaRef("sha256:" + "0" * 64, 10, ".png", p)
    with pytest.raises(MediaMissingError, match="does not match its name or MediaRef"):
        write_bundle(tmp_path / "b", [{"r": wrong}], link="copy")


@pytest.mark.parametrize("link", ["auto", "hardlink", "copy"])
def test_link_modes_store_equal_read_only_files(tmp_path, run_dir, link):
    plain = run_dir / "unnamed.png"  # not content-addressed: must be hashed
    plain.write_bytes(b"plain bytes")
    named = put_media(run_dir, b"named bytes")
    dest = write_bundle(tmp_path / "b", [{"a": str(plain), "b": named}], media_roots=[run_dir], link=link)
    bundle = open_bundle(dest, verify="full")
    (s,) = bundle.samples()
    assert Path(s["a"]).read_bytes() == b"plain bytes" and Path(s["b"]).read_bytes() == b"named bytes"
    for ref in bundle.media:
        mode = os.stat(ref.path).st_mode
        assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        linked = os.stat(ref.path).st_nlink > 1
        assert linked == (link in ("auto", "hardlink"))  # this filesystem supports hardlinks


def _filesystem_can_reflink(directory: Path) -> bool:
    """Ask coreutils, not the code under test, whether ``directory`` supports reflinks."""
    src, dst = directory / ".reflink-probe-src", directory / ".reflink-probe-dst"
    src.write_bytes(b"probe")
    try:
        r = subprocess.run(["cp", "--reflink=always", str(src), str(dst)], capture_output=True, check=False)
        return r.returncode == 0
    finally:
        src.unlink()
        dst.unlink(missing_ok=True)


def test_reflink_is_probed_and_reported_when_unsupported(tmp_path, run_dir):
    p = put_media(run_dir, b"data")
    if _filesystem_can_reflink(tmp_path):
        dest = write_bundle(tmp_path / "b", [{"a": p}], media_roots=[run_dir], link="reflink")
        assert open_bundle(dest, verify="full").media[0].size == 4
        assert os.stat(open_bundle(dest).media[0].path).st_nlink == 1  # a clone, not a hard link
    else:  # ext4 and overlayfs (this machine) cannot clone: an error naming the file, no bundle
        with pytest.raises(BundleError, match=r"link='reflink' is not possible") as e:
            write_bundle(tmp_path / "b", [{"a": p}], media_roots=[run_dir], link="reflink")
        assert p in str(e.value)
        assert not (tmp_path / "b").exists()
        assert sorted(os.listdir(tmp_path)) == ["shared_media"]  # no staging directory either


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(BundleError) as e:
        write_bundle(tmp_path / "b", [], link="symlink")
    assert str(e.value) == "link: expected one of auto, hardlink, reflink, copy, found 'symlink'"
    with pytest.raises(BundleError) as e:
        write_bundle(tmp_path / "b", [], meta={"x": object()})
    assert (
        str(e.value)
        == f"{tmp_path / 'b'}: meta.x: expected a JSON-compatible value, found builtins.object (the manifest is JSON)"
    )
    with pytest.raises(BundleError) as e:
        write_bundle(tmp_path / "b", [], kind="Debug Dump")
    assert (
        str(e.value)
        == f"{tmp_path / 'b'}: kind: expected lowercase letters, digits and '_', found 'Debug Dump'"
    )
    with pytest.raises(BundleError) as e:
        MediaRef("md5:abc", 1, ".png")
    assert str(e.value) == "MediaRef.digest: expected 'sha256:<64 lowercase hex>', found 'md5:abc'"
    assert list(tmp_path.iterdir()) == []


def test_rehydrate_places_media_content_addressed(tmp_path, run_dir):
    blobs = [b"one", b"two"]
    paths = [put_media(run_dir, b) for b in blobs]
    ref = MediaRef.from_file(paths[1])
    dest = write_bundle(tmp_path / "b", [{"imgs": paths, "ref": ref}], media_roots=[run_dir])
    shutil.rmtree(run_dir)
    new_run = tmp_path / "shared_media" / "new-run"
    (s,) = open_bundle(dest).rehydrate(new_run)
    assert [Path(p).parent for p in s["imgs"]] == [new_run, new_run]
    assert [Path(p).read_bytes() for p in s["imgs"]] == blobs
    assert s["ref"].path == str(new_run / ref.filename)
    assert sorted(os.listdir(new_run)) == sorted(Path(p).name for p in paths)
    # Idempotent, and the bundle is untouched by a later removal of the new run directory.
    open_bundle(dest).rehydrate(new_run)
    shutil.rmtree(new_run)
    open_bundle(dest, verify="full")


def test_a_file_with_an_unusable_extension_is_stored_without_one(tmp_path, run_dir):
    odd = {"shot.p%g": b"percent", "shot." + "x" * 17: b"too long", "shot.a b": b"space"}
    for name, data in odd.items():
        (run_dir / name).write_bytes(data)
    sample = {"imgs": [str(run_dir / n) for n in odd]}
    dest = write_bundle(tmp_path / "b", [sample], media_roots=[run_dir])
    assert sorted(os.listdir(dest / "media")) == sorted(hashlib.sha256(d).hexdigest() for d in odd.values())
    shutil.rmtree(run_dir)
    (loaded,) = open_bundle(dest, verify="full").samples()
    assert [Path(p).read_bytes() for p in loaded["imgs"]] == list(odd.values())


def test_media_ref_fields_are_checked_and_paths_become_strings(tmp_path):
    digest = "sha256:" + "ab" * 32
    empty = MediaRef.from_bytes(b"", ".png")  # an empty file is a valid medium
    assert (empty.size, empty.digest) == (0, "sha256:" + hashlib.sha256(b"").hexdigest())
    for size in (-1, 1.5, True, "3"):
        with pytest.raises(BundleError) as e:
            MediaRef(digest, size, ".png")
        assert str(e.value) == f"MediaRef.size: expected a non-negative int, found {size!r}"
    ref = MediaRef(digest, 3, ".png", tmp_path / "x.png")
    assert ref.path == str(tmp_path / "x.png") and type(ref.path) is str
    assert MediaRef.from_bytes(b"abc", ".jpg", path=tmp_path / "y.jpg").path == str(tmp_path / "y.jpg")
    assert MediaRef(digest, 3, ".png", "/already/a/str").path == "/already/a/str"


def test_only_64_hex_names_are_taken_as_digests(tmp_path, run_dir):
    not_hex = run_dir / ("z" * 64 + ".png")  # 64 characters, not a digest: hashed like any name
    not_hex.write_bytes(b"zzz")
    dotted = put_media(run_dir, b"archive", ".tar.gz")  # <hex>.tar.gz: the digest is before the first dot
    dest = write_bundle(
        tmp_path / "b", [{"a": str(not_hex), "b": dotted}], media_roots=[run_dir], link="hardlink"
    )
    (s,) = open_bundle(dest, verify="full").samples()
    assert Path(s["a"]).name == hashlib.sha256(b"zzz").hexdigest() + ".png"
    assert Path(s["b"]).name == hashlib.sha256(b"archive").hexdigest() + ".gz"
    assert Path(s["b"]).read_bytes() == b"archive"
