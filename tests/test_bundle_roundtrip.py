"""Round trips of sample values through write_bundle/open_bundle, without pickle."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import put_media
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import MediaRef, UnsupportedValueError, open_bundle, write_bundle

NUMPY_DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    ">i4",
    ">f8",
]


def assert_same(a, b, where="sample"):
    """Exact equality that also compares types, dtypes and NaN payload positions."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(NUMPY_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    raw = draw(
        st.binary(
            min_size=int(np.prod(shape)) * dtype.itemsize, max_size=int(np.prod(shape)) * dtype.itemsize
        )
    )
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if draw(st.booleans()) and arr.size:
        return arr.reshape(-1)[0]  # a numpy scalar
    return arr


leaves = json_leaves | arrays()
values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), children, max_size=4)
    ),
    max_leaves=25,
)
samples_strategy = st.lists(st.dictionaries(st.text(max_size=10), values, max_size=6), max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(samples=samples_strategy)
def test_generated_samples_round_trip_exactly(tmp_path_factory, samples):
    dest = tmp_path_factory.mktemp("rt") / "bundle"
    write_bundle(dest, samples)
    bundle = open_bundle(dest, verify="full")
    assert len(bundle) == len(samples)
    assert_same(list(bundle.samples()), samples)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payloads=st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=6, unique=True),
    picks=st.lists(
        st.tuples(st.integers(0, 100), st.sampled_from(["list", "tuple", "dict", "ref"])),
        min_size=1,
        max_size=12,
    ),
)
def test_nested_references_resolve_after_run_dir_is_deleted(tmp_path_factory, payloads, picks):
    root = tmp_path_factory.mktemp("refs")
    run = root / "shared" / "run-a"
    paths = [put_media(run, p) for p in payloads]
    by_path = dict(zip(paths, payloads, strict=True))
    samples = []
    for i, (n, how) in enumerate(picks):
        p = paths[n % len(paths)]
        if how == "list":
            value = {"images": [p, "not a path", p]}
        elif how == "tuple":
            value = {"deep": ({"x": [p]}, 3)}
        elif how == "dict":
            value = {"d": {"e": {"f": p}}}
        else:
            value = {"ref": MediaRef.from_file(p)}
        samples.append({"index": i, "mm": value})
    dest = write_bundle(root / "bundle", samples, media_roots=[run])
    shutil.rmtree(root / "shared")
    bundle = open_bundle(dest, verify="full")
    assert len(bundle.media) == len({paths[n % len(paths)] for n, _ in picks})

    def check(original, loaded):
        if isinstance(original, str) and original in by_path:
            assert loaded.startswith(str(dest) + "/media/")
            assert Path(loaded).read_bytes() == by_path[original]
        elif isinstance(original, MediaRef):
            assert isinstance(loaded, MediaRef)
            assert (loaded.digest, loaded.size, loaded.suffix) == (
                original.digest,
                original.size,
                original.suffix,
            )
            assert Path(loaded.path).read_bytes() == by_path[original.path]
        elif isinstance(original, dict):
            assert list(original) == list(loaded)
            for k in original:
                check(original[k], loaded[k])
        elif isinstance(original, (list, tuple)):
            assert type(original) is type(loaded) and len(original) == len(loaded)
            for x, y in zip(original, loaded, strict=True):
                check(x, y)
        else:
            assert original == loaded

    for original, loaded in zip(samples, bundle.samples(), strict=True):
        check(original, loaded)


@pytest.mark.torch
def test_torch_tensors_of_every_dtype_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    dtypes = [
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        torch.complex64,
    ]
    g = torch.Generator().manual_seed(0)
    sample = {f"t_{d}": (torch.randn(3, 5, generator=g) * 100).to(d) for d in dtypes}
    sample["pixel_values"] = torch.randn(16, 1176, generator=g)
    sample["image_grid_thw"] = torch.tensor([[1, 2, 2]], dtype=torch.int64)
    sample["scalar"] = torch.tensor(3.5, dtype=torch.bfloat16)
    sample["empty"] = torch.zeros(0, 4, dtype=torch.float16)
    sample["strided"] = torch.arange(12).reshape(3, 4).t()
    write_bundle(tmp_path / "b", [sample])
    (loaded,) = open_bundle(tmp_path / "b").samples()
    for k, t in sample.items():
        assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape, k
        assert torch.equal(loaded[k], t), k


def test_numpy_int32_expert_routes_round_trip(tmp_path):
    routed = np.random.default_rng(0).integers(0, 64, size=(7, 2, 8), dtype=np.int32)
    write_bundle(tmp_path / "b", [{"rollout_routed_experts": routed, "rollout_indexer_topk": routed[:, 0]}])
    (loaded,) = open_bundle(tmp_path / "b").samples()
    assert_same(loaded["rollout_routed_experts"], routed)
    loaded["rollout_routed_experts"][0, 0, 0] = -1  # arrays come back writable and private


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        ({"a": [1, {"b": Opaque()}]}, "samples[0].a[1].b", "Opaque"),
        ({"a": {1.5: 2}}, "samples[0].a", "dict keys must be str or int"),
        ({"a": 2**64}, "samples[0].a", "does not fit in 64 bits"),
        ({"a": np.array(["x"], dtype=object)}, "samples[0].a", "not numeric or bool"),
        ({"a": {"b": {1, 2}}}, "samples[0].a.b", "set"),
        ({"a": bytearray(b"x")}, "samples[0].a", "bytearray"),
    ],
)
def test_unsupported_values_name_the_key_path_and_write_nothing(tmp_path, value, where, what):
    with pytest.raises(UnsupportedValueError) as e:
        write_bundle(tmp_path / "b", [value])
    assert where in str(e.value) and what in str(e.value)
    assert str(tmp_path / "b") in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_objects_with_to_dict_are_accepted(tmp_path):
    class S:
        def to_dict(self):
            return {"tokens": [1, 2], "status": "completed"}

    write_bundle(tmp_path / "b", [S(), {"tokens": [3]}])
    assert list(open_bundle(tmp_path / "b").samples()) == [
        {"tokens": [1, 2], "status": "completed"},
        {"tokens": [3]},
    ]


def test_deep_nesting_is_refused(tmp_path):
    v: object = 1
    for _ in range(70):
        v = [v]
    with pytest.raises(UnsupportedValueError, match="nesting deeper than 64"):
        write_bundle(tmp_path / "b", [{"v": v}])


def test_many_samples_split_into_shards_and_stream_back(tmp_path, monkeypatch):
    import bundles._local.writer as writer

    monkeypatch.setattr(writer, "SHARD_TARGET_RAW_BYTES", 10_000)
    samples = [{"i": i, "blob": bytes([i % 256]) * 3000} for i in range(40)]
    write_bundle(tmp_path / "b", samples)
    bundle = open_bundle(tmp_path / "b", verify="full")
    assert len(bundle.manifest["shards"]) > 5
    assert list(bundle.samples()) == samples


def test_big_int_inside_a_long_token_list_is_named(tmp_path):
    tokens = [1] * 100 + [2**64] + [2] * 10
    with pytest.raises(UnsupportedValueError, match=r"samples\[1\]\.tokens\[100\]: int 18446744073709551616"):
        write_bundle(tmp_path / "b", [{"tokens": [1] * 10}, {"tokens": tokens}])
    assert list(tmp_path.iterdir()) == []


def test_big_int_inside_a_tuple_is_named(tmp_path):
    with pytest.raises(UnsupportedValueError, match=r"samples\[0\]\.t\[1\]\[0\]: int -9223372036854775809"):
        write_bundle(tmp_path / "b", [{"t": (1, (-(2**63) - 1,))}])


@pytest.mark.torch
def test_cuda_tensors_are_stored_and_come_back_on_the_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    t = torch.randn(4, 1176, device="cuda").to(torch.bfloat16)
    write_bundle(tmp_path / "b", [{"pixel_values": t}])
    (loaded,) = open_bundle(tmp_path / "b").samples()
    assert loaded["pixel_values"].device.type == "cpu"
    assert torch.equal(loaded["pixel_values"], t.cpu())


def test_the_extreme_64_bit_ints_round_trip_and_the_first_int_beyond_them_is_named(tmp_path):
    extremes = {"t": [2**64 - 1, -(2**63), 0, 2**63 - 1, -1]}
    write_bundle(tmp_path / "ok", [extremes])
    assert list(open_bundle(tmp_path / "ok").samples()) == [extremes]
    # Each out-of-range int sits right after the extreme that is still allowed: the message names it.
    for bad, value in (
        ([2**64 - 1, 2**64], "18446744073709551616"),
        ([-(2**63), -(2**63) - 1], "-9223372036854775809"),
    ):
        with pytest.raises(UnsupportedValueError) as e:
            write_bundle(tmp_path / "b", [{"t": bad}])
        assert str(e.value) == f"{tmp_path / 'b'}: samples[0].t[1]: int {value} does not fit in 64 bits"
