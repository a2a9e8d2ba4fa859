"""Checks a reader makes on every read, not only when a bundle is opened.

``open_bundle(verify="none")`` trusts nothing but the manifest; shards are checked when they are
read and media when they are copied out. Each test here builds the bad file with the public
writer plus plain byte edits and asserts the exact error: a check that went missing would hand
back wrong samples or wrong media bytes without a word.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import pytest
import zstandard
from helpers import put_media

from bundles import (
    BundleError,
    BundleFormatError,
    BundleIOError,
    BundleVerificationError,
    MediaRef,
    UnsafeBundleError,
    UnsupportedValueError,
    open_bundle,
    pack_bundle,
    write_bundle,
)

SHARD = "samples/000000.msgpack.zst"


def writable(path: Path) -> Path:
    os.chmod(path, 0o644)
    return path


def rewrite_shard(
    bundle: Path, raw: bytes, raw_size: int | None = None, *, compressed: bytes | None = None
) -> None:
    """Replace the first shard by ``raw`` (or by ``compressed`` as it is) and list it in the
    manifest with a matching digest, size and ``raw_size``, so that only the content is wrong."""
    data = zstandard.ZstdCompressor().compress(raw) if compressed is None else compressed
    writable(bundle / SHARD).write_bytes(data)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["shards"][0].update(
        size=len(data),
        digest="sha256:" + hashlib.sha256(data).hexdigest(),
        raw_size=len(raw) if raw_size is None else raw_size,
    )
    writable(bundle / "manifest.json").write_text(json.dumps(manifest))


# -- shards are checked when read ---------------------------------------------------------------


def test_a_shard_swapped_after_opening_without_verification_is_refused_when_read(tmp_path):
    # Two bundles whose shards have the same size (incompressible payloads of equal length):
    # the size check cannot tell them apart, only the digest can.
    a = write_bundle(tmp_path / "a", [{"i": 0, "blob": os.urandom(2000)}])
    b = write_bundle(tmp_path / "b", [{"i": 0, "blob": os.urandom(2000)}])
    swapped = (b / SHARD).read_bytes()
    assert len(swapped) == (a / SHARD).stat().st_size  # precondition of the test

    bundle = open_bundle(a, verify="none")
    os.chmod(a / "samples", 0o755)
    (a / SHARD).unlink()
    (a / SHARD).write_bytes(swapped)
    with pytest.raises(BundleVerificationError) as e:
        list(bundle.samples())
    expected = json.loads((a / "manifest.json").read_text())["shards"][0]["digest"]
    found = "sha256:" + hashlib.sha256(swapped).hexdigest()
    problem = f"{a / SHARD}: digest: expected {expected}, found {found}"
    assert e.value.problems == [problem] and e.value.path == a
    assert str(e.value) == f"{a}: bundle failed verification with 1 problem(s):\n  - {problem}"


def test_a_shard_truncated_or_removed_after_opening_is_refused_when_read(tmp_path):
    a = write_bundle(tmp_path / "a", [{"i": 0, "blob": os.urandom(2000)}])
    size = (a / SHARD).stat().st_size
    bundle = open_bundle(a, verify="none")
    os.truncate(writable(a / SHARD), 100)
    with pytest.raises(BundleVerificationError) as e:
        list(bundle.samples())
    assert e.value.path == a
    assert e.value.problems == [f"{a / SHARD}: size: expected {size} bytes, found 100"]
    os.chmod(a / "samples", 0o755)
    (a / SHARD).unlink()
    with pytest.raises(BundleVerificationError) as e:
        list(bundle.samples())
    assert e.value.path == a
    assert e.value.problems == [f"{a / SHARD}: listed in the manifest but missing"]


def test_a_shard_that_decompresses_past_its_recorded_size_is_refused(tmp_path):
    a = write_bundle(tmp_path / "a", [{"i": 0}])
    raw = msgpack.packb({"i": 0, "x": b"\0" * 10_000})
    rewrite_shard(a, raw, raw_size=100)
    with pytest.raises(UnsafeBundleError, match=r"000000\.msgpack\.zst: raw_size"):
        list(open_bundle(a, verify="fast").samples())


# A zstd bomb: a few kilobytes that decompress to BOMB_MIB MiB of zeros, listed with a raw_size
# of 1000 bytes. The reader must stop at the recorded size instead of inflating the stream; the
# child process measures its own peak RSS (ru_maxrss, KiB on Linux) before and after the read.
BOMB_MIB = 256
BOMB_READER = textwrap.dedent(
    """
    import json, resource, sys
    from bundles import UnsafeBundleError, open_bundle

    bundle = open_bundle(sys.argv[1], verify="fast")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        list(bundle.samples())
    except UnsafeBundleError as e:
        error = str(e)
    else:
        error = None
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kib": before, "after_kib": after, "error": error}))
    """
)


def _zero_bomb(mib: int) -> bytes:
    """msgpack of one map holding ``mib`` MiB of zeros, zstd-compressed without ever holding it."""
    cctx = zstandard.ZstdCompressor()
    comp = cctx.compressobj()
    out = [comp.compress(b"\x81\xa1x\xc6" + (mib * 2**20).to_bytes(4, "big"))]  # {"x": bin32 header}
    zeros = bytes(2**20)
    out += [comp.compress(zeros) for _ in range(mib)]
    out.append(comp.flush())
    return b"".join(out)


def test_a_zstd_bomb_is_refused_within_bounded_memory(tmp_path):
    a = write_bundle(tmp_path / "a", [{"i": 0}])
    rewrite_shard(a, b"", raw_size=1000, compressed=_zero_bomb(BOMB_MIB))
    assert (a / SHARD).stat().st_size < 64 * 1024
    r = subprocess.run(
        [sys.executable, "-c", BOMB_READER, str(a)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["error"] is not None and str(a / SHARD) in out["error"] and "raw_size" in out["error"], out
    grown_mib = (out["after_kib"] - out["before_kib"]) / 1024
    # Inflating the stream costs at least BOMB_MIB MiB; a bounded read stays within a few.
    assert grown_mib < 32, f"peak RSS grew by {grown_mib:.0f} MiB while refusing a {BOMB_MIB} MiB bomb"


# -- references are checked against the manifest ------------------------------------------------


def test_a_reference_with_the_wrong_size_is_refused(tmp_path):
    run = tmp_path / "run"
    data = os.urandom(300)
    a = write_bundle(tmp_path / "a", [{"img": put_media(run, data)}], media_roots=[run])
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    for code, size in ((1, 301), (2, 299)):  # a MediaRef and a path string, one byte off either way
        ref = msgpack.ExtType(code, msgpack.packb([digest, size, ".png"]))
        rewrite_shard(a, msgpack.packb({"deep": [0, {"img": ref}]}))
        with pytest.raises(BundleFormatError) as e:
            list(open_bundle(a, verify="fast").samples())
        assert str(e.value) == (
            f"{a / SHARD}: samples[0].deep[1].img: references {digest}.png ({size} bytes), "
            "which the manifest does not list"
        )


# -- media copied out are checked ----------------------------------------------------------------


def test_rehydrate_by_copy_refuses_corrupted_media_and_leaves_no_file(tmp_path):
    run = tmp_path / "run"
    good, bad = b"good bytes" * 30, b"other bytes" * 30
    paths = [put_media(run, good), put_media(run, bad)]
    a = write_bundle(tmp_path / "a", [{"imgs": paths}], media_roots=[run], link="copy")
    ref = MediaRef.from_file(paths[1])
    stored = a / "media" / ref.filename
    corrupted = bytearray(stored.read_bytes())
    corrupted[0] ^= 0xFF  # same size: only a digest sees it
    writable(stored).write_bytes(bytes(corrupted))

    target = tmp_path / "new-run"
    bundle = open_bundle(a, verify="fast")
    with pytest.raises(BundleVerificationError) as e:
        bundle.rehydrate(target, link="copy")
    found = "sha256:" + hashlib.sha256(corrupted).hexdigest()
    assert e.value.problems == [f"{stored}: digest: expected {ref.digest}, found {found}"]
    assert not (target / ref.filename).exists()
    assert [n for n in os.listdir(target) if n.startswith(".")] == []  # no temporary file left


def test_rehydrate_by_copy_of_sound_media_checks_and_places_every_file(tmp_path):
    run = tmp_path / "run"
    blobs = [os.urandom(100 + i) for i in range(3)]
    paths = [put_media(run, b) for b in blobs]
    a = write_bundle(tmp_path / "a", [{"imgs": paths}], media_roots=[run], link="copy")
    target = tmp_path / "new-run"
    (s,) = open_bundle(a, verify="fast").rehydrate(target, link="copy")
    assert [Path(p).read_bytes() for p in s["imgs"]] == blobs
    assert sorted(os.listdir(target)) == sorted(hashlib.sha256(b).hexdigest() + ".png" for b in blobs)
    assert all(os.stat(p).st_nlink == 1 for p in s["imgs"])  # copies, not links into the bundle


# -- decoded arrays and tensors are checked -----------------------------------------------------------------


def _tensor_ext(header: object, raw: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(6, msgpack.packb(header) + raw)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("header", "raw", "message"),
    [
        (["float32"], b"", "malformed tensor header ['float32']"),
        ([7, [1]], b"\0" * 4, "malformed tensor header [7, [1]]"),
        (
            ["Tensor", [1]],
            b"\0" * 4,
            "unknown torch dtype 'Tensor': not in the format's list (docs/FORMAT.md §3)",
        ),
        (
            ["no_such_dtype", [1]],
            b"\0" * 4,
            "unknown torch dtype 'no_such_dtype': not in the format's list (docs/FORMAT.md §3)",
        ),
        (["float32", 3], b"\0" * 12, "malformed tensor shape 3"),
        (["float32", [-1]], b"", "malformed tensor shape [-1]"),
        (["float32", [1.5]], b"\0" * 4, "malformed tensor shape [1.5]"),
        (
            ["float32", [2, 3]],
            b"\0" * 20,
            "tensor of dtype float32 and shape (2, 3) needs 24 bytes, found 20",
        ),
        (["bfloat16", [3]], b"\0" * 8, "tensor of dtype bfloat16 and shape (3,) needs 6 bytes, found 8"),
    ],
)
def test_a_malformed_tensor_in_a_shard_is_refused_naming_it(tmp_path, header, raw, message):
    pytest.importorskip("torch")
    a = write_bundle(tmp_path / "a", [{"i": 0}])
    rewrite_shard(a, msgpack.packb({"t": _tensor_ext(header, raw)}))
    with pytest.raises(BundleFormatError) as e:
        list(open_bundle(a, verify="fast").samples())
    assert str(e.value) == f"{a / SHARD}: samples[0].t: {message}"


@pytest.mark.parametrize(
    ("code", "header", "raw", "message"),
    [
        (4, 5, b"", "malformed array header 5"),
        (4, ["<i4"], b"\0" * 4, "malformed array header ['<i4']"),
        (4, [7, [1]], b"\0" * 4, "malformed array header [7, [1]]"),
        (4, ["no-such-dtype", [1]], b"\0" * 4, "unknown dtype 'no-such-dtype'"),
        (4, ["<U1", [1]], b"\0" * 4, "dtype '<U1' is not numeric or bool"),
        (4, ["|O", [1]], b"\0" * 8, "dtype '|O' is not numeric or bool"),
        (4, ["<i4", 3], b"\0" * 12, "malformed shape 3"),
        (4, ["<i4", [-1]], b"", "malformed shape [-1]"),
        (4, ["<i4", [True]], b"\0" * 4, "malformed shape [True]"),
        (4, ["<i4", [2, 3]], b"\0" * 20, "array of dtype int32 and shape (2, 3) needs 24 bytes, found 20"),
        (5, 5, b"", "malformed array header 5"),
        (5, [7], b"\0" * 4, "malformed array header [7, []]"),
        (5, ["<f8"], b"\0" * 4, "array of dtype float64 and shape () needs 8 bytes, found 4"),
    ],
)
def test_a_malformed_array_in_a_shard_is_refused_naming_it(tmp_path, code, header, raw, message):
    a = write_bundle(tmp_path / "a", [{"i": 0}])
    rewrite_shard(a, msgpack.packb({"deep": [{"a": msgpack.ExtType(code, msgpack.packb(header) + raw)}]}))
    with pytest.raises(BundleFormatError) as e:
        list(open_bundle(a, verify="fast").samples())
    assert str(e.value) == f"{a / SHARD}: samples[0].deep[0].a: {message}"


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_sparse_tensors_are_refused_naming_the_layout(tmp_path):
    torch = pytest.importorskip("torch")
    dense = torch.eye(3)
    for tensor, layout in (
        (dense.to_sparse(), "torch.sparse_coo"),
        (dense.to_sparse_csr(), "torch.sparse_csr"),
    ):
        with pytest.raises(UnsupportedValueError) as e:
            write_bundle(tmp_path / "b", [{"x": {"t": tensor}}])
        assert (
            str(e.value)
            == f"{tmp_path / 'b'}: samples[0].x.t: only dense tensors are stored, found layout {layout}"
        )
        assert not (tmp_path / "b").exists()


# -- rehydrate keeps what is right and replaces what is not ---------------------------------------


def test_rehydrate_keeps_a_right_file_replaces_a_wrong_sized_one_and_is_idempotent(tmp_path):
    run = tmp_path / "run"
    blobs = [b"first" * 40, b"second" * 40]
    paths = [put_media(run, b) for b in blobs]
    a = write_bundle(tmp_path / "a", [{"imgs": paths}], media_roots=[run])
    target = tmp_path / "new-run"
    target.mkdir()
    names = [Path(p).name for p in paths]
    (target / names[0]).write_bytes(blobs[0])  # already there, right size: kept as it is
    kept_inode = (target / names[0]).stat().st_ino
    (target / names[1]).write_bytes(b"truncated")  # wrong size: replaced
    bundle = open_bundle(a, verify="fast")
    for _ in range(2):  # the second call finds everything in place
        (s,) = bundle.rehydrate(target)
        assert s["imgs"] == [str(target / n) for n in names]
        assert [Path(p).read_bytes() for p in s["imgs"]] == blobs
        assert (target / names[0]).stat().st_ino == kept_inode
    assert sorted(os.listdir(target)) == sorted(names)


def test_rehydrate_errors_name_the_bundle_and_the_target(tmp_path):
    a = write_bundle(tmp_path / "a", [{"i": 0}])
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(BundleIOError) as e:
        open_bundle(a).rehydrate(tmp_path / "a-file")
    assert str(e.value).startswith(
        f"{a}: cannot rehydrate into {tmp_path / 'a-file'}: [Errno 17] File exists"
    )
    assert isinstance(e.value, OSError)


def test_a_packed_bundle_rehydrates_by_copy_and_refuses_links(tmp_path):
    run = tmp_path / "run"
    data = os.urandom(500)
    a = write_bundle(tmp_path / "a", [{"img": put_media(run, data)}], media_roots=[run])
    packed = open_bundle(pack_bundle(a, tmp_path / "a.rbundle"))
    for link in ("auto", "copy"):
        (s,) = packed.rehydrate(tmp_path / f"new-{link}", link=link)
        assert Path(s["img"]).parent == tmp_path / f"new-{link}" and Path(s["img"]).read_bytes() == data
    with pytest.raises(BundleError) as e:
        packed.rehydrate(tmp_path / "new-hardlink", link="hardlink")
    assert str(e.value) == (
        f"{tmp_path / 'a.rbundle'}: link='hardlink': the members of a packed bundle can only be copied; "
        "use link='auto' or 'copy'"
    )
    assert not (tmp_path / "new-hardlink").exists()


def test_rehydrate_by_copy_of_a_missing_media_file_names_it(tmp_path):
    run = tmp_path / "run"
    a = write_bundle(tmp_path / "a", [{"img": put_media(run, b"gone soon")}], media_roots=[run], link="copy")
    (stored,) = (a / "media").iterdir()
    os.chmod(a / "media", 0o755)
    stored.unlink()
    with pytest.raises(BundleIOError) as e:
        open_bundle(a, verify="none").rehydrate(tmp_path / "new-run", link="copy")
    assert str(e.value) == (
        f"{a}: cannot rehydrate into {tmp_path / 'new-run'}: [Errno 2] No such file or directory: '{stored}'"
    )
    assert os.listdir(tmp_path / "new-run") == []


# -- Bundle.verify levels -------------------------------------------------------------------------


def test_verify_levels_of_an_open_bundle(tmp_path):
    run = tmp_path / "run"
    a = write_bundle(
        tmp_path / "a", [{"img": put_media(run, b"pixels" * 50)}], media_roots=[run], link="copy"
    )
    (stored,) = (a / "media").iterdir()
    bundle = open_bundle(a, verify="fast")
    bundle.verify()
    assert bundle.problems() == []
    corrupted = bytearray(stored.read_bytes())
    corrupted[0] ^= 0xFF  # same size: only hashing sees it
    writable(stored).write_bytes(bytes(corrupted))
    problem = f"{stored}: digest: expected sha256:{stored.name.split('.')[0]}, found sha256:{hashlib.sha256(corrupted).hexdigest()}"
    for fast in (False, "fast"):
        bundle.verify(fast)  # sizes and shard digests only
    assert bundle.problems(full=False) == []
    for full in ((), (True,), ("full",)):  # the default is full
        with pytest.raises(BundleVerificationError) as e:
            bundle.verify(*full)
        assert e.value.path == a and e.value.problems == [problem]
    assert bundle.problems() == [problem]
    with pytest.raises(BundleError) as e:
        bundle.verify("thorough")
    assert str(e.value) == f"{a}: verify: expected 'fast' or 'full', found 'thorough'"
    (a / "samples" / "stray").mkdir()
    assert f"{a}/samples/stray: unexpected directory" in bundle.problems(full=False)
