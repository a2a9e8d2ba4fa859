"""Packed bundles read in place: samples, verify, inspect and rehydrate straight from the tar,
by member offsets, with the same member rules as unpack."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from helpers import put_media

from bundles import (
    BundleError,
    BundleVerificationError,
    MediaMissingError,
    MediaRef,
    UnsafeBundleError,
    open_bundle,
    pack_bundle,
    unpack_bundle,
    write_bundle,
)
from bundles.cli import main


def _make(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    run = tmp_path / "run"
    blobs = [os.urandom(3000 + i) for i in range(4)]
    paths = [put_media(run, b) for b in blobs]
    samples = [
        {"i": i, "images": [paths[i], paths[(i + 1) % 4]], "ref": MediaRef.from_file(paths[i]), "t": (i, "x")}
        for i in range(4)
    ]
    bundle = write_bundle(tmp_path / "b", samples, media_roots=[run], meta={"rollout_id": 5})
    packed = pack_bundle(bundle, tmp_path / "b.rbundle")
    by_digest = {"sha256:" + hashlib.sha256(b).hexdigest(): b for b in blobs}
    return bundle, packed, by_digest


def _flip_member_byte(packed: Path, member: str, out: Path) -> Path:
    with tarfile.open(packed) as tar:
        info = tar.getmember(member)
    data = bytearray(packed.read_bytes())
    data[info.offset_data + info.size // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    return out


def test_samples_of_a_packed_bundle_equal_the_directory_s_without_extracting(tmp_path):
    bundle, packed, by_digest = _make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with open_bundle(packed, verify="full") as pb:
        assert pb.packed and pb.path == packed and len(pb) == 4
        got = list(pb.samples())
        assert pb.meta == {"rollout_id": 5} and pb.kind == "debug_dump"
        for s in got:
            ref = s["ref"]
            assert ref.path == f"{packed}/media/{ref.filename}"  # names the member; not a file
            with pb.open_media(ref) as f:
                assert f.read() == by_digest[ref.digest]
            for p in s["images"]:
                assert p.startswith(f"{packed}/media/")
                with pb.open_media(p) as f:
                    assert hashlib.sha256(f.read()).hexdigest() == Path(p).name.split(".")[0]
    assert sorted(os.listdir(tmp_path)) == before  # no extraction, no temporary copy
    unpacked = list(open_bundle(bundle).samples())

    def strip(s):
        return {**s, "images": [Path(p).name for p in s["images"]], "ref": s["ref"].with_path(None)}

    assert [strip(s) for s in got] == [strip(s) for s in unpacked]


def test_full_verification_in_place_names_the_corrupt_member(tmp_path):
    bundle, packed, _ = _make(tmp_path)
    name = sorted(os.listdir(bundle / "media"))[1]
    evil = _flip_member_byte(packed, f"media/{name}", tmp_path / "evil.rbundle")
    open_bundle(evil, verify="fast").close()  # same size: only a full verify hashes media
    with pytest.raises(BundleVerificationError) as e:
        open_bundle(evil, verify="full")
    assert e.value.problems == [
        f"{evil}/media/{name}: digest: expected sha256:{name.split('.')[0]}, found "
        + e.value.problems[0].split("found ")[1]
    ]
    assert main(["verify", str(evil), "--full"]) == 1


def test_a_corrupt_shard_fails_fast_verification_and_reading(tmp_path):
    _, packed, _ = _make(tmp_path)
    evil = _flip_member_byte(packed, "samples/000000.msgpack.zst", tmp_path / "evil.rbundle")
    with pytest.raises(
        BundleVerificationError, match=r"evil\.rbundle/samples/000000\.msgpack\.zst: digest: expected"
    ):
        open_bundle(evil, verify="fast")
    b = open_bundle(evil, verify="none")
    with pytest.raises(BundleVerificationError, match=r"000000\.msgpack\.zst: digest"):
        list(b.samples())


def test_rehydrate_from_a_packed_bundle_copies_and_checks_every_member(tmp_path):
    bundle, packed, by_digest = _make(tmp_path)
    target = tmp_path / "newrun"
    with open_bundle(packed) as pb:
        rows = pb.rehydrate(target)
        with pytest.raises(BundleError, match="can only be copied"):
            pb.rehydrate(tmp_path / "other", link="hardlink")
    assert sorted(os.listdir(target)) == sorted(os.listdir(bundle / "media"))
    for row in rows:
        assert Path(row["ref"].path).read_bytes() == by_digest[row["ref"].digest]
        assert all(Path(p).parent == target for p in row["images"])
    name = sorted(os.listdir(bundle / "media"))[2]
    evil = _flip_member_byte(packed, f"media/{name}", tmp_path / "evil.rbundle")
    fresh = tmp_path / "fresh"
    with pytest.raises(BundleVerificationError, match=f"media/{name}: digest: expected"):
        open_bundle(evil, verify="fast").rehydrate(fresh)
    assert name not in os.listdir(fresh) and not [n for n in os.listdir(fresh) if n.startswith(".")]


def test_inspect_and_verify_commands_read_packed_files(tmp_path, capsys):
    _, packed, _ = _make(tmp_path)
    assert main(["inspect", str(packed), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == str(packed) and info["samples"] == 4 and info["media_files"] == 4
    assert info["media_references"] == 12 and info["meta"] == {"rollout_id": 5}
    assert main(["verify", str(packed), "--full"]) == 0
    assert "OK (full verification: 4 samples, 4 media files)" in capsys.readouterr().out


def test_an_open_packed_bundle_keeps_reading_the_file_it_indexed(tmp_path):
    """pack --force renames a new file over the path; the open bundle's held descriptor still
    reads the old one, never a mix of two files' offsets."""
    _, packed, _ = _make(tmp_path)
    pb = open_bundle(packed)
    first = list(pb.samples())
    other = write_bundle(tmp_path / "other", [{"x": "y" * 5000}] * 3)
    pack_bundle(other, packed, overwrite=True)
    assert list(pb.samples()) == first
    pb.verify("full")
    pb.close()
    with pytest.raises(BundleError, match="closed"):
        list(pb.samples())
    assert len(open_bundle(packed)) == 3


def test_repacking_a_packed_bundle_gives_the_same_bytes(tmp_path):
    _, packed, _ = _make(tmp_path)
    again = pack_bundle(packed, tmp_path / "again.rbundle")
    assert again.read_bytes() == packed.read_bytes()


def test_open_media_refuses_names_the_bundle_does_not_list(tmp_path):
    _, packed, _ = _make(tmp_path)
    with open_bundle(packed) as pb, pytest.raises(MediaMissingError, match="not a media file of this bundle"):
        pb.open_media("../../etc/passwd")


# The member rules are one implementation (bundles._local.archive.read_tar_index): unpack and the
# in-place reader refuse the same files with the same message.
def _tar(path: Path, members: list[tuple[str, bytes, bytes | None]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "manifest.json"
            if data is not None:
                info.size = len(data)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return path


MEDIA = "media/" + "ab" * 32 + ".png"


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("../x", tarfile.REGTYPE, b"x")], "names with '..'"),
        ([(MEDIA, tarfile.SYMTYPE, None)], "found a symlink"),
        ([(MEDIA, tarfile.CHRTYPE, None)], "found a character device"),
        ([("media", tarfile.REGTYPE, b"x")], "expected the directory media/, found a regular file"),
        ([("manifest.json", tarfile.DIRTYPE, None)], "expected a regular file, found a directory"),
        ([(MEDIA, tarfile.REGTYPE, b"a"), (MEDIA, tarfile.REGTYPE, b"b")], "appears twice"),
        ([(MEDIA, tarfile.GNUTYPE_SPARSE, b"")], "found a sparse file"),
    ],
)
def test_in_place_reader_and_unpack_refuse_the_same_members(tmp_path, members, message):
    evil = _tar(tmp_path / "evil.rbundle", members)
    for attempt in (lambda: open_bundle(evil, verify="none"), lambda: unpack_bundle(evil, tmp_path / "out")):
        with pytest.raises(UnsafeBundleError, match=message) as e:
            attempt()
        assert str(evil) in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["evil.rbundle"]


def test_every_truncation_point_is_refused_by_both_readers(tmp_path):
    _, packed, _ = _make(tmp_path)
    data = packed.read_bytes()
    with tarfile.open(packed) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512 + 1024  # through the two end-of-archive blocks
    cut = tmp_path / "cut.rbundle"
    # Every block boundary and the middle of every block up to the end-of-archive blocks; the
    # record padding after them is not part of the archive.
    points = sorted({*range(0, end, 256)})
    for n in points:
        cut.write_bytes(data[:n])
        for attempt in (
            lambda: open_bundle(cut, verify="full"),
            lambda: unpack_bundle(cut, tmp_path / "out"),
        ):
            with pytest.raises(UnsafeBundleError) as e:
                attempt()
            assert str(cut) in str(e.value), n
        assert not (tmp_path / "out").exists()
    cut.write_bytes(data[:end])
    assert len(open_bundle(cut, verify="full")) == 4


def test_a_member_file_outlives_its_bundle_object_and_refuses_reads_after_close(tmp_path):
    # open_bundle(p).open_media(ref): the Bundle is gone at once; its descriptor must not be
    # closed (and its number reused by the next open) under the member file still reading it.
    _, packed, by_digest = _make(tmp_path)
    ref = open_bundle(packed).media[0]
    f = open_bundle(packed).open_media(ref)
    with open(__file__, "rb") as other:  # would take the freed descriptor number
        other.read(1)
        assert f.read() == by_digest[ref.digest]
    with open_bundle(packed) as bundle:
        g = bundle.open_media(ref)
    with (
        open(__file__, "rb"),
        pytest.raises(BundleError, match=r"b\.rbundle/media/.*: cannot read: the bundle was closed"),
    ):
        g.read()


def _open_descriptors(path: Path) -> int:
    """How many of this process's descriptors are open on ``path`` (its whole name)."""
    found = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            found += os.readlink(fd) == str(path)
        except OSError:
            continue
    return found


def _bundles_garbage() -> list[str]:
    """Type names of the objects of ``bundles`` that only the garbage collector would free (a
    reference cycle), among all cyclic garbage now: other libraries' garbage does not count."""
    import gc

    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("bundles")]
    finally:
        gc.garbage.clear()
        gc.set_debug(flags)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count descriptors")
@pytest.mark.parametrize(
    "use",
    [
        lambda b: list(b.samples()),
        lambda b: list(b.samples(indices=[1, 0])),
        lambda b: next(b.samples()),  # a stream left half read
        lambda b: b[1],
    ],
    ids=["samples", "indices", "half-read", "getitem"],
)
def test_a_packed_bundles_descriptor_goes_with_its_last_reference(tmp_path: Path, use) -> None:
    # A server lets a replaced bundle go by dropping its reference (it cannot close a bundle a
    # page may still read): the descriptor must close then, not when the garbage collector next
    # runs. The sample decoder held its own bound methods (a reference cycle holding the
    # bundle): a run under `serve --follow` kept replaced files open until a collection.
    import gc

    _, packed, _ = _make(tmp_path)
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        bundle = open_bundle(packed, verify="none")
        assert _open_descriptors(packed) == 1
        use(bundle)
        del bundle
        assert _open_descriptors(packed) == 0
        # writing and reading leave no cycle of bundles' own objects either
        write_bundle(tmp_path / "again", [{"index": 0, "t": (1, 2), "response": "x"}])
        assert _bundles_garbage() == []
    finally:
        if was_enabled:
            gc.enable()
