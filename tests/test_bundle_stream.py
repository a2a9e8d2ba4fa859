"""Shard decoding: streamed one sample at a time with bounded memory, per-sample limits, the
torch dtype allowlist, nesting limits, and key paths for problems found while decoding."""

from __future__ import annotations

import enum
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
from hypothesis import given, settings
from hypothesis import strategies as st

import bundles._format.shards as shards
from bundles import (
    BundleError,
    BundleFormatError,
    BundleVerificationError,
    OutsidePathWarning,
    UnsafeBundleError,
    UnsupportedValueError,
    open_bundle,
    write_bundle,
)

ROOT = Path(__file__).resolve().parents[1]
MAX_ITEMS = 2**24  # docs/FORMAT.md §8
MAX_BYTES = 2**30


def ext(code: int, payload: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(code, payload)


def tensor_ext(dtype: str, shape: list[int], raw: bytes) -> msgpack.ExtType:
    return ext(6, msgpack.packb([dtype, shape]) + raw)


def set_shard(bundle: Path, data: bytes, raw_size: int, samples: int) -> None:
    """Make ``data`` (compressed) the bundle's only shard, with a manifest entry that matches it."""
    shard = bundle / "samples" / "000000.msgpack.zst"
    os.chmod(shard, 0o644)
    shard.write_bytes(data)
    m = json.loads((bundle / "manifest.json").read_text())
    m["shards"][0].update(
        size=len(data),
        digest="sha256:" + hashlib.sha256(data).hexdigest(),
        raw_size=raw_size,
        samples=samples,
    )
    m["sample_count"] = samples
    os.chmod(bundle / "manifest.json", 0o644)
    (bundle / "manifest.json").write_text(json.dumps(m))


def shard_of(tmp_path: Path, samples: list[bytes]) -> Path:
    """A bundle whose shard holds exactly these encoded samples."""
    bundle = write_bundle(tmp_path / "b", [{"i": 0}])
    raw = b"".join(samples)
    set_shard(bundle, zstandard.ZstdCompressor().compress(raw), len(raw), len(samples))
    return bundle


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


# -- memory: one sample at a time -------------------------------------------------------------------
def test_a_shard_of_half_a_gigabyte_decodes_in_bounded_memory(tmp_path):
    """512 samples of 1 MiB each (~50 KB compressed, 512 MiB decompressed): the reader's peak RSS
    grows by a few MiB, not by the shard (it grew ~3x the shard's size when shards were decoded
    whole)."""
    bundle = write_bundle(tmp_path / "b", [{"i": 0}])
    n, blob = 512, b"\0" * 2**20
    cctx = zstandard.ZstdCompressor(level=1).compressobj()
    chunks, raw_size = [], 0
    for i in range(n):
        encoded = msgpack.packb({"i": i, "blob": blob})
        raw_size += len(encoded)
        chunks.append(cctx.compress(encoded))
    chunks.append(cctx.flush())
    data = b"".join(chunks)
    assert len(data) < 2**20
    set_shard(bundle, data, raw_size, n)
    result = run_python(
        f"""
        import resource
        from bundles import open_bundle
        bundle = open_bundle({str(bundle)!r}, verify="fast")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        count = 0
        for s in bundle.samples():
            assert s["i"] == count and len(s["blob"]) == 2**20
            count += 1
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(count, (after - before) // 1024)
        """
    )
    assert result.returncode == 0, result.stderr
    count, grown_mib = map(int, result.stdout.split())
    assert count == n
    assert grown_mib < 64, f"peak RSS grew by {grown_mib} MiB while streaming a 512 MiB shard"


def test_a_shard_declaring_4_gib_is_read_in_bounded_memory_and_refused(tmp_path):
    raw = b"".join(msgpack.packb({"i": i}) for i in range(3))
    bundle = write_bundle(tmp_path / "b", [{"i": 0}])
    set_shard(bundle, zstandard.ZstdCompressor().compress(raw), 4 * 2**30, 3)
    result = run_python(
        f"""
        import resource
        from bundles import open_bundle, UnsafeBundleError
        bundle = open_bundle({str(bundle)!r}, verify="fast")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            list(bundle.samples())
        except UnsafeBundleError as e:
            print(e)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
        """
    )
    assert result.returncode == 0, result.stderr
    message, grown_mib = result.stdout.strip().rsplit("\n", 1)
    assert f"raw_size: expected {4 * 2**30} decompressed bytes, found {len(raw)}" in message
    assert int(grown_mib) < 32


def test_running_out_of_memory_on_one_sample_is_a_bundle_error(tmp_path):
    """A legal 600 MB sample read under an address-space limit that cannot hold it."""
    bundle = write_bundle(tmp_path / "b", [{"i": 0}])
    cctx = zstandard.ZstdCompressor(level=1).compressobj()
    raw = b"\x81\xa1b\xc6" + (600 * 2**20).to_bytes(4, "big")  # {"b": bin32 of 600 MiB}
    chunks = [cctx.compress(raw)] + [cctx.compress(b"\0" * 2**20) for _ in range(600)] + [cctx.flush()]
    set_shard(bundle, b"".join(chunks), len(raw) + 600 * 2**20, 1)
    result = run_python(
        f"""
        import resource
        from bundles import open_bundle, BundleError
        bundle = open_bundle({str(bundle)!r})
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + 300 * 2**20, resource.RLIM_INFINITY))
        try:
            list(bundle.samples())
        except BundleError as e:
            print(type(e).__name__, e)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "samples[0]: out of memory while" in result.stdout, result.stdout


def test_samples_stream_out_before_a_later_problem_is_reached(tmp_path):
    unlisted = ext(2, msgpack.packb(["sha256:" + "ab" * 32, 3, ".png"]))
    bundle = shard_of(
        tmp_path, [msgpack.packb({"i": 0}), msgpack.packb({"i": 1}), msgpack.packb({"x": [unlisted]})]
    )
    samples = open_bundle(bundle).samples()
    assert next(samples) == {"i": 0}
    assert next(samples) == {"i": 1}
    with pytest.raises(
        BundleFormatError, match=r"000000\.msgpack\.zst: samples\[2\]\.x\[0\]: references sha256:abab"
    ):
        next(samples)


def test_a_shard_that_fails_its_digest_yields_nothing(tmp_path):
    bundle = write_bundle(tmp_path / "b", [{"i": i} for i in range(3)])
    opened = open_bundle(bundle, verify="fast")
    shard = bundle / "samples" / "000000.msgpack.zst"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    os.chmod(shard, 0o644)
    shard.write_bytes(bytes(data))
    samples = opened.samples()
    with pytest.raises(BundleVerificationError, match=r"000000\.msgpack\.zst: digest: expected"):
        next(samples)


def test_truncated_sample_at_the_end_of_a_shard_is_named(tmp_path):
    whole = msgpack.packb({"i": 0})
    bundle = shard_of(tmp_path, [whole, msgpack.packb({"tokens": list(range(100))})[:-5]])
    with pytest.raises(BundleFormatError, match=r"samples\[1\]: truncated"):
        list(open_bundle(bundle).samples())


# -- per-sample limits ----------------------------------------------------------------------------
def test_an_array_declaring_more_items_than_the_limit_is_refused_from_its_header(tmp_path):
    header = b"\x81\xa1x\xdd" + (MAX_ITEMS + 1).to_bytes(4, "big")  # {"x": array32 of 2**24 + 1}
    bundle = shard_of(tmp_path, [header + b"\0" * 100])
    with pytest.raises(UnsafeBundleError, match=r"samples\[0\]: .*exceeds max_array_len"):
        list(open_bundle(bundle).samples())


def test_items_are_counted_across_a_sample(tmp_path):
    half = [0] * (MAX_ITEMS // 2)  # each list fits; together they pass the per-sample limit
    bundle = shard_of(tmp_path, [msgpack.packb({"a": half, "b": half})])
    with pytest.raises(UnsafeBundleError, match=rf"samples\[0\]: more than {MAX_ITEMS} items"):
        list(open_bundle(bundle).samples())
    # 2**24 list items, one per list and three for the map ({"a", "b"} and itself): on both sides
    with pytest.raises(UnsupportedValueError, match=rf"samples\[0\]: the sample holds {MAX_ITEMS + 5} items"):
        write_bundle(tmp_path / "c", [{"a": half, "b": half}])


@pytest.mark.parametrize(
    "big",
    [
        {"s": ["x" * 1000] * 20},  # many small strings: consumed as they come
        {"b": b"\0" * 20_000},  # one payload: waits in msgpack's buffer until it is whole
        {"t": (b"\0" * 20_000,)},  # inside an extension
    ],
)
def test_the_decompressed_bytes_of_one_sample_are_capped(tmp_path, monkeypatch, big):
    monkeypatch.setattr(shards, "MAX_SAMPLE_RAW_BYTES", 10_000)
    monkeypatch.setattr(shards, "FEED_CHUNK", 4096)
    packed = (
        msgpack.packb(big) if "t" not in big else msgpack.packb({"t": ext(3, msgpack.packb(list(big["t"])))})
    )
    bundle = shard_of(tmp_path, [msgpack.packb({"i": 0}), packed, msgpack.packb({"i": 2})])
    samples = open_bundle(bundle).samples()
    assert next(samples) == {"i": 0}
    with pytest.raises(
        UnsafeBundleError, match=r"samples\[1\]: more than 10000 bytes; the format's per-sample limit"
    ):
        next(samples)


# -- what decoding refuses, with the key path ---------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "path", "message"),
    [
        (
            [1] * 100 + [msgpack.Timestamp(0)] + [2] * 10,
            r"samples\[0\]\.v\[100\]",
            "msgpack timestamps are not",
        ),
        ({"k": {1.5: 2}}, r"samples\[0\]\.v\.k", "map key 1.5 is not a str or int"),
        (
            [ext(4, msgpack.packb(["<i4", [10]]) + b"\0" * 8)],
            r"samples\[0\]\.v\[0\]",
            r"needs 40 bytes, found 8",
        ),
        ((1, [2, ext(99, b"")]), r"samples\[0\]\.v\[1\]\[1\]", "unknown msgpack extension type 99"),
        (
            {"t": tensor_ext("_inductor", [1], b"\0")},
            r"samples\[0\]\.v\.t",
            "unknown torch dtype '_inductor': not in the format's list",
        ),
    ],
)
def test_problems_inside_a_sample_name_the_key_path(tmp_path, value, path, message):
    def encode(v):  # tuples as the format stores them (extension 3)
        if type(v) is tuple:  # (ExtType is a namedtuple)
            return ext(3, msgpack.packb([encode(x) for x in v]))
        if isinstance(v, list):
            return [encode(x) for x in v]
        return v

    bundle = shard_of(tmp_path, [msgpack.packb({"v": encode(value)})])
    with pytest.raises(BundleFormatError, match=rf"000000\.msgpack\.zst: {path}: .*{message}"):
        list(open_bundle(bundle).samples())


@pytest.mark.parametrize("name", ["_inductor", "has_cuda", "qint8", "bits8", "complex32", "Tensor", "float"])
def test_torch_dtype_names_outside_the_allowlist_import_nothing(tmp_path, name):
    bundle = shard_of(tmp_path, [msgpack.packb({"t": tensor_ext(name, [1], b"\0" * 4)})])
    result = run_python(
        f"""
        import sys
        from bundles import open_bundle, BundleFormatError
        try:
            list(open_bundle({str(bundle)!r}).samples())
        except BundleFormatError as e:
            print(e)
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
        """
    )
    assert result.returncode == 0, result.stderr
    message, modules = result.stdout.strip().rsplit("\n", 1)
    assert f"samples[0].t: unknown torch dtype {name!r}: not in the format's list" in message
    assert modules == "[]"  # refused before torch (let alone torch._inductor) was imported


def test_a_reader_without_torch_says_torch_is_needed_for_that_value(tmp_path):
    pixel_values = tensor_ext("float32", [2, 3], b"\0" * 24)
    bundle = shard_of(
        tmp_path, [msgpack.packb({"i": 0}), msgpack.packb({"mti": {"pixel_values": pixel_values}})]
    )
    result = run_python(
        f"""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        from bundles import open_bundle, BundleError
        samples = open_bundle({str(bundle)!r}).samples()
        print(next(samples))
        try:
            next(samples)
        except BundleError as e:
            print(type(e).__name__, e)
        """
    )
    assert result.returncode == 0, result.stderr
    first, error = result.stdout.strip().split("\n")
    assert first == "{'i': 0}"
    assert "samples[1].mti.pixel_values: a torch tensor (float32, shape (2, 3)) needs torch" in error
    assert "malformed" not in error


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_the_writer_refuses_torch_dtypes_outside_the_allowlist(tmp_path):
    torch = pytest.importorskip("torch")
    with pytest.raises(UnsupportedValueError, match=r"samples\[0\]\.t: tensors of dtype torch.complex32"):
        write_bundle(tmp_path / "b", [{"t": torch.zeros(2, dtype=torch.complex32)}])
    assert not (tmp_path / "b").exists()


# -- nesting ------------------------------------------------------------------------------------
def nested_lists(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"


def test_the_deepest_nesting_a_writer_accepts_reads_back(tmp_path):
    v: object = 1
    for _ in range(64):
        v = [v]
    write_bundle(tmp_path / "b", [{"v": v, "t": (((1,),),)}])
    assert list(open_bundle(tmp_path / "b").samples()) == [{"v": v, "t": (((1,),),)}]
    with pytest.raises(UnsupportedValueError, match="nesting deeper than 64"):
        write_bundle(tmp_path / "c", [{"v": [v]}])


@pytest.mark.parametrize("depth", [65, 70, 900, 5000])
def test_lists_nested_too_deep_are_a_format_error(tmp_path, depth):
    bundle = shard_of(tmp_path, [b"\x81\xa1v" + nested_lists(depth)])
    with pytest.raises(BundleFormatError) as e:
        list(open_bundle(bundle).samples())
    assert "samples[0]" in str(e.value)
    if depth < 1000:  # msgpack's own stack ends deeper nesting first
        assert "nesting deeper than 64 levels" in str(e.value)
        assert "samples[0].v" + "[0]" * 64 in str(e.value)


def test_tuples_of_lists_nested_60_deep_are_a_format_error_not_a_recursion_error(tmp_path):
    inner = msgpack.packb(1)
    for _ in range(60):
        inner = b"\x91" + msgpack.packb(ext(3, b"\x91" + inner))  # [ (x,) ]
    bundle = shard_of(tmp_path, [b"\x81\xa1v" + inner])
    with pytest.raises(BundleFormatError, match=r"samples\[0\]\.v(\[0\])+: nesting deeper than 64 levels"):
        list(open_bundle(bundle).samples())


def test_tuples_nested_in_tuples_stop_at_the_limit(tmp_path):
    inner = msgpack.packb(1)
    for _ in range(200):
        inner = msgpack.packb(ext(3, b"\x91" + inner))
    bundle = shard_of(tmp_path, [b"\x81\xa1v" + inner])
    with pytest.raises(BundleFormatError, match=r"samples\[0\]\.v(\[0\])+: tuples nested deeper than 64"):
        list(open_bundle(bundle).samples())


# -- the encoder's C-speed checks ----------------------------------------------------------------------
class Color(enum.IntEnum):
    RED = 1


class Count(int):
    """An int subclass that is no enum: nothing says what it would come back as."""


class Shade(enum.Enum):
    DARK = "dark"


@pytest.mark.parametrize(
    ("value", "path", "what"),
    [
        ([1] * 100 + [Count(7)] + [2], r"samples\[0\]\.v\[100\]", "Count"),
        ([1.0] * 100 + [Count(7)] + [2.0], r"samples\[0\]\.v\[100\]", "Count"),
        ([1.0] * 100 + ["/etc/passwd"] + [2.0], None, "warns"),  # a string, offered to the writer
        ([1] * 100 + [[2, 3]] + [4], None, None),  # a nested list: walked
    ],
)
def test_long_number_lists_hide_nothing(tmp_path, value, path, what):
    if path is None:
        if what == "warns":  # the writer saw the path hidden in the number list: outside its roots
            with pytest.warns(OutsidePathWarning, match=r"samples\[0\]\.v\[100\] = '/etc/passwd'"):
                write_bundle(tmp_path / "b", [{"v": value}])
        else:
            write_bundle(tmp_path / "b", [{"v": value}])
        assert list(open_bundle(tmp_path / "b").samples()) == [{"v": value}]
    else:
        with pytest.raises(
            UnsupportedValueError, match=rf"{path}: values of type .*{what}.* cannot be stored"
        ):
            write_bundle(tmp_path / "b", [{"v": value}])


@pytest.mark.parametrize(
    "value",
    [[1] * 100 + [Color.RED] + [2], [1, Color.RED, 2], Color.RED, {"k": [Color.RED] * 100}],
    ids=["long list", "short list", "scalar", "only members"],
)
def test_an_int_enum_member_is_stored_as_its_value_wherever_it_is(tmp_path, value):
    # The packer would pass one inside a long number list that a sum proved numeric; the walk
    # stores the others the same way, so where a member sits never decides what comes back.
    write_bundle(tmp_path / "b", [{"v": value}])
    (back,) = open_bundle(tmp_path / "b").samples()
    assert back == {"v": value}

    def types(x):
        return (
            [t for y in x for t in types(y)]
            if isinstance(x, list)
            else (types(list(x.values())) if isinstance(x, dict) else [type(x)])
        )

    assert set(types(back["v"])) == {int}


class Huge(enum.IntEnum):
    X = 2**70


@pytest.mark.parametrize("value", [Huge.X, [Huge.X], [0] * 100 + [Huge.X]], ids=["scalar", "short", "long"])
def test_an_int_enum_beyond_64_bits_is_refused_naming_its_key_path(tmp_path, value):
    with pytest.raises(
        UnsupportedValueError, match=r"samples\[0\]\.v(\[\d+\])?: <Huge\.X: \d+>'s value \d+ does not fit"
    ):
        write_bundle(tmp_path / "b", [{"v": value}])


def test_an_enum_of_other_values_is_refused(tmp_path):
    with pytest.raises(
        UnsupportedValueError, match=r"samples\[0\]\.v: values of type .*Shade.* cannot be stored"
    ):
        write_bundle(tmp_path / "b", [{"v": Shade.DARK}])


def test_a_media_path_inside_a_long_list_is_still_a_reference(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    png = run / ("ab" * 32 + ".png")
    png.write_bytes(b"png")
    write_bundle(tmp_path / "b", [{"v": [1] * 100 + [str(png)] + [2]}], media_roots=[run])
    (sample,) = open_bundle(tmp_path / "b").samples()
    assert sample["v"][100] == str(tmp_path / "b" / "media" / png.name)
    assert sample["v"][:100] == [1] * 100 and sample["v"][101] == 2


def test_every_error_of_a_hostile_shard_is_a_bundle_error(tmp_path):
    # A few shapes the hooks see: timestamps as keys, containers as keys, extensions as keys.
    for raw in [
        b"\x81\xd6\xff\x00\x00\x00\x00\x01",  # {timestamp: 1}
        b"\x81\x91\x01\x01",  # {[1]: 1}
        b"\x81" + msgpack.packb(ext(3, b"\x91\x01")) + b"\x01",  # {(1,): 1}
        b"\x81" + msgpack.packb(ext(4, msgpack.packb(["<i4", [1]]) + b"\0" * 4)) + b"\x01",  # {ndarray: 1}
    ]:
        bundle = shard_of(tmp_path / str(len(list(tmp_path.iterdir()))), [raw])
        with pytest.raises(BundleError):
            list(open_bundle(bundle).samples())


# -- the packer's bytes ----------------------------------------------------------------------------
_plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40).filter(lambda t: not t.startswith("/"))
    | st.binary(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=80)
        | st.dictionaries(st.text(max_size=8) | st.integers(-(2**40), 2**40), inner, max_size=8)
    ),
    max_leaves=200,
)


@settings(max_examples=300, deadline=None)
@given(value=_plain_values)
def test_the_encoder_writes_msgpacks_own_bytes(value):
    """The encoder packs with msgspec; its bytes must be those msgpack's strict packer wrote for
    every value (smallest int widths, float64, bin, insertion-ordered maps, long number lists as
    they are), or bundles written before would not be reproduced (tests/vectors pins a few)."""
    from bundles import encode_sample

    assert encode_sample(value) == msgpack.packb(value, use_bin_type=True, strict_types=True)


def test_the_encoder_writes_msgpacks_bytes_at_every_width_boundary():
    from bundles import encode_sample

    edges = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1]
    edges += [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
    value = {
        "ints": edges * 8,  # summed: a long number list packed as it is
        "short": edges[:5],
        "floats": [0.0, -0.0, 1.5, float("inf"), float("-inf"), 5e-324] * 20,
        "strings": ["", "a" * 31, "a" * 32, "a" * 255, "a" * 256, "a" * 65536],
        "bytes": [b"", b"x" * 255, b"x" * 256, b"x" * 65536],
        "maps": [{str(i): i for i in range(n)} for n in (0, 15, 16)],
        "lists": [list(range(n)) for n in (15, 16, 65536)],
    }
    assert encode_sample(value) == msgpack.packb(value, use_bin_type=True, strict_types=True)
