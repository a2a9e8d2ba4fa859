"""Bundle.to_arrow: the schema of docs/DATASET.md, streamed, every field kept, screenshots read in
place (directory and packed file) and checked against their digest."""

from __future__ import annotations

import array
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.dataset_run import PER_STEP, make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bundles

pa = pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_run(tmp_path_factory.mktemp("dataset-arrow"))


def _step(run: dict[str, Any], step: int) -> Path:
    return run["run"] / "rollout" / f"fully_async_{step}"


def test_rows_follow_the_documented_schema_and_keep_every_other_field(run: dict[str, Any]) -> None:
    with bundles.open_bundle(_step(run, 1)) as b:
        batches = list(b.to_arrow(batch_rows=2))
        samples = list(b.samples())
    assert [x.num_rows for x in batches] == [2, 2, 1]  # batch_rows at a time, the last one short
    assert batches[0].schema.metadata[b"rollout_bundles.schema_version"] == b"1"
    types = {f.name: str(f.type) for f in batches[0].schema}
    assert types["tokens"] == "list<item: int32>"
    assert types["rollout_log_probs"] == "list<item: float>"
    assert types["loss_mask"] == "list<item: int8>"
    assert "images" not in types
    rows = [r for x in batches for r in x.to_pylist()]
    r = rows[2]
    assert r["kind"] == "rollout" and r["step"] == 1 and r["position"] == 2 and r["index"] == 102
    assert (r["group_index"], r["reward"], r["status"]) == (1, 0.3, "completed")
    assert r["tokens"] == [151644, 872, 9709] and r["loss_mask"] == [0, 1, 1]
    assert r["rollout_log_probs"] == [-0.25, -0.5, -0.125]
    assert json.loads(r["metadata"])["actions"] == ["click(2, 0)", "click(2, 1)"]
    digests = [t["media"] for t in r["turns"]]
    assert [t["action"] for t in r["turns"]] == ["click(2, 0)", "click(2, 1)"]
    stored = {ref.filename: ref.digest for ref in bundles.open_bundle(_step(run, 1)).media}
    shots = [os.path.basename(p) for p in samples[2]["multimodal_inputs"]["images"]]
    assert digests == [stored[name] for name in shots]
    extra = json.loads(r["extra"])
    # numpy arrays as lists with dtype and shape, never pickles; media paths relative to the bundle
    assert extra["advantages"] == {"dtype": "float32", "shape": [3], "data": [0.0, 3.0, 6.0]}
    assert extra["multimodal_inputs"]["images"] == [f"media/{n}" for n in shots]
    assert "label" in extra and extra["label"] is None
    assert rows[3]["status"] == "truncated" and rows[3]["turns"] == [{"action": None, "media": stored[
        os.path.basename(samples[3]["multimodal_inputs"]["images"][0])]}]  # fmt: skip
    ident = {x["bundle_id"] for x in rows}
    assert len(ident) == 1 and len(ident.pop()) == 64


def test_a_sample_lacking_fields_or_holding_odd_ones_exports_with_nulls_and_extra(
    run: dict[str, Any],
) -> None:
    with bundles.open_bundle(run["run"] / "debug" / "rollout_9.bundle") as b:
        empty, odd = [r for x in b.to_arrow() for r in x.to_pylist()]
    assert empty["reward"] is None and empty["tokens"] is None and empty["extra"] is None
    assert empty["turns"] == [] and empty["step"] == 9
    # a dict reward and a token id past int32 do not fit their columns: null there, kept in extra
    assert odd["reward"] is None and odd["tokens"] is None and odd["status"] == "completed"
    assert json.loads(odd["extra"]) == {"reward": {"score": 1.0}, "tokens": [2**40]}


def test_columns_pick_and_order_and_unknown_ones_are_named(run: dict[str, Any]) -> None:
    with bundles.open_bundle(_step(run, 0)) as b:
        (batch,) = list(b.to_arrow(columns=["reward", "position"]))
        assert batch.schema.names == ["reward", "position"] and batch.num_rows == PER_STEP
        with pytest.raises(bundles.BundleError, match=r"columns: expected names among .*found \['rewrd'\]"):
            next(b.to_arrow(columns=["rewrd"]))
        with pytest.raises(bundles.BundleError, match="'images' needs media=True"):
            next(b.to_arrow(columns=["images"]))
        with pytest.raises(bundles.BundleError, match="batch_rows: expected an int >= 1, found 0"):
            next(b.to_arrow(batch_rows=0))


def _images(b: bundles.Bundle) -> list[list[dict[str, Any]]]:
    return [r["images"] for x in b.to_arrow(columns=["images"], media=True) for r in x.to_pylist()]


def test_images_are_read_in_place_from_a_directory_and_a_packed_file(
    run: dict[str, Any], tmp_path: Path
) -> None:
    packed = tmp_path / "b.rbundle"
    bundles.pack_bundle(_step(run, 2), packed)
    with bundles.open_bundle(_step(run, 2)) as b:
        samples = list(b.samples())
        from_dir = _images(b)
    with bundles.open_bundle(packed) as p:
        assert _images(p) == from_dir
    for s, images in zip(samples, from_dir, strict=True):
        files = s["multimodal_inputs"]["images"]
        assert [i["path"] for i in images] == [f"media/{os.path.basename(f)}" for f in files]
        assert [i["bytes"] for i in images] == [Path(f).read_bytes() for f in files]
        for i in images:
            assert i["path"] == f"media/{hashlib.sha256(i['bytes']).hexdigest()}.png"


def test_an_image_whose_bytes_are_not_its_digest_is_refused_naming_it(
    run: dict[str, Any], tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(_step(run, 0), copy)
    with bundles.open_bundle(copy) as b:
        name = b.media[0].filename
    victim = copy / "media" / name
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with bundles.open_bundle(copy) as b, pytest.raises(bundles.BundleVerificationError) as e:
        _images(b)
    assert f"{copy}/media/{name}: expected {len(data)} bytes of digest sha256:{name[:-4]}" in str(e.value)


def test_a_sample_referencing_one_image_past_the_budget_is_refused_before_it_is_read(tmp_path: Path) -> None:
    media = tmp_path / "media"
    media.mkdir()
    shot = media / "big.bin"
    shot.write_bytes(os.urandom(1 << 20))  # 1 MiB, referenced 300 times: 300 MiB > 256 MiB
    bundles.write_bundle(tmp_path / "b", [{"multimodal_inputs": {"images": [str(shot)] * 300}}],
                         media_roots=[media])  # fmt: skip
    with bundles.open_bundle(tmp_path / "b") as b:
        assert [len(r["turns"]) for x in b.to_arrow() for r in x.to_pylist()] == [
            300
        ]  # no images asked: fine
        with pytest.raises(bundles.BundleError) as e:
            _images(b)
    assert str(e.value) == (
        f"{tmp_path / 'b'}: sample 0: multimodal_inputs.images: expected at most 268435456 bytes of "
        "screenshots (MAX_EXPORT_SAMPLE_IMAGE_BYTES), found more (300 references)"
    )


def test_a_bundle_path_that_is_not_utf8_is_written_as_its_escape(tmp_path: Path) -> None:
    """A name's undecodable byte (a lone surrogate in Python) cannot be Arrow text: it is escaped.
    (The writer refuses surrogates in samples, and a shard's strings are UTF-8 by the format.)"""
    where = tmp_path / os.fsdecode(b"b\xff")
    bundles.write_bundle(where, [{"response": "ok"}])
    with bundles.open_bundle(where) as b:
        (row,) = [r for x in b.to_arrow() for r in x.to_pylist()]
    assert row["bundle"] == f"{tmp_path}/b\\udcff" and row["response"] == "ok"


def test_a_log_prob_beyond_float32_is_kept_in_extra_never_written_infinite(tmp_path: Path) -> None:
    rows = [
        {"rollout_log_probs": [-0.5, -1e300]},
        {"rollout_log_probs": [float("-inf"), -3e38, float("nan")]},
    ]
    bundles.write_bundle(tmp_path / "b", rows)
    with bundles.open_bundle(tmp_path / "b") as b:
        big, edge = [r for x in b.to_arrow() for r in x.to_pylist()]
    assert big["rollout_log_probs"] is None
    assert json.loads(big["extra"]) == {"rollout_log_probs": [-0.5, -1e300]}
    assert edge["rollout_log_probs"][:2] == [float("-inf"), pytest.approx(-3e38)] and edge["extra"] is None


def test_number_columns_refuse_exactly_what_does_not_fit_their_type(tmp_path: Path) -> None:
    """At each number type's edge: float32's largest finite value and a float that rounds to it
    are written, one that rounds to infinity is not (null, kept in extra); int32 and int8 from
    their least to their greatest are written, one past either end is not; a bool is its int; the
    same for a list longer than a packing chunk."""
    flt_max = 3.4028234663852886e38
    rows = [
        {"rollout_log_probs": [flt_max, -3.402823566783216e38], "tokens": [-(2**31), 2**31 - 1],
         "loss_mask": [-128, 127, True]},
        {"rollout_log_probs": [3.4028235677973366e38], "tokens": [2**31], "loss_mask": [128]},
        {"rollout_log_probs": [-0.5, -3.4028235677973366e38], "tokens": [-(2**31) - 1], "loss_mask": [-129]},
    ]  # fmt: skip
    bundles.write_bundle(tmp_path / "b", rows)
    with bundles.open_bundle(tmp_path / "b") as b:
        fit, over, under = [r for x in b.to_arrow() for r in x.to_pylist()]
    assert fit["rollout_log_probs"] == [flt_max, -flt_max] and fit["extra"] is None
    assert fit["tokens"] == [-(2**31), 2**31 - 1] and fit["loss_mask"] == [-128, 127, 1]
    for row, want in ((over, rows[1]), (under, rows[2])):
        assert row["rollout_log_probs"] is None and row["tokens"] is None and row["loss_mask"] is None
        assert json.loads(row["extra"]) == want
    # lists longer than a packing chunk (2**14): whole, or refused for their last value
    long = [{"tokens": list(range(40_000))}, {"tokens": [7] * 40_000 + [2**31]}]
    bundles.write_bundle(tmp_path / "long", long)
    with bundles.open_bundle(tmp_path / "long") as b:
        whole, refused = [r for x in b.to_arrow() for r in x.to_pylist()]
    assert whole["tokens"] == long[0]["tokens"] and whole["extra"] is None
    assert refused["tokens"] is None and json.loads(refused["extra"]) == long[1]


def test_keys_1_and_str_1_are_both_kept_as_pairs(tmp_path: Path) -> None:
    rows = [{"metadata": {1: "int", "1": "str"}, 2: "top int", "2": "top str"}]
    bundles.write_bundle(tmp_path / "b", rows)
    with bundles.open_bundle(tmp_path / "b") as b:
        (row,) = [r for x in b.to_arrow() for r in x.to_pylist()]
    assert json.loads(row["metadata"]) == [[1, "int"], ["1", "str"]]
    assert json.loads(row["extra"]) == [[2, "top int"], ["2", "top str"]]


_NUMBER_LIST = st.one_of(
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6),
    st.lists(st.integers(-(2**40), 2**40), max_size=3),  # past int32: null, kept in extra
    st.lists(st.floats(allow_nan=False, width=32), max_size=4),
    st.lists(st.booleans(), max_size=3),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.fixed_dictionaries({"tokens": _NUMBER_LIST, "rollout_log_probs": _NUMBER_LIST}), max_size=7),
       batch_rows=st.integers(1, 4))  # fmt: skip
def test_number_columns_match_each_rows_own_values_in_any_batch(
    tmp_path: Path, rows: list[dict[str, Any]], batch_rows: int
) -> None:
    """The number columns are built from the rows' bytes (offsets, values, nulls): whatever mix of
    fitting, empty, missing and misfit values a batch holds, each row reads back its own."""
    where = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
    bundles.write_bundle(where, rows)
    with bundles.open_bundle(where) as b:
        got = [r for x in b.to_arrow(batch_rows=batch_rows) for r in x.to_pylist()]
    assert len(got) == len(rows)
    for row, want in zip(got, rows, strict=True):
        extra = json.loads(row["extra"]) if row["extra"] else {}
        tokens = want["tokens"]
        fits = isinstance(tokens, list) and all(
            type(t) in (int, bool) and -(2**31) <= t < 2**31 for t in tokens
        )
        assert row["tokens"] == ([int(t) for t in tokens] if fits else None)
        assert ("tokens" in extra) == (not fits and tokens is not None)
        lps = want["rollout_log_probs"]
        fits = isinstance(lps, list)
        assert row["rollout_log_probs"] == (array.array("f", lps).tolist() if fits else None)  # float32
        assert ("rollout_log_probs" in extra) == (not fits and lps is not None)


def test_a_log_prob_column_never_drops_what_struct_would(tmp_path: Path) -> None:
    """Two values :mod:`struct` packs as float32 without an error but not faithfully stay out
    of the column and in ``extra``: a numpy complex (its imaginary part dropped, with only a
    warning) and, checked where it is made, a NaN packed as an infinity (CPython 3.14 packs a
    signalling NaN with a low-bit payload as +-inf). A value too deep for a JSON column is
    named with its bundle and sample (a review)."""
    import struct
    import warnings

    import numpy as np

    from bundles._dataset import numbers

    signalling = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0]
    packed = numbers.pack_numbers([signalling, -0.5], "f")
    assert packed is not None and struct.unpack("=2f", packed)[0] != struct.unpack("=2f", packed)[0]  # a NaN
    assert numbers.float32_exact([signalling], struct.pack("=f", float("inf"))) is False  # as 3.14 packs it
    assert numbers.float32_exact([float("-inf")], struct.pack("=f", float("-inf"))) is True
    path = tmp_path / "b"
    bundles.write_bundle(path, [{"rollout_log_probs": [np.complex128(-0.5 + 3j), np.float32(-1.5)]}])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's ComplexWarning, from struct's __float__
        (row,) = next(bundles.open_bundle(path).to_arrow()).to_pylist()
    assert row["rollout_log_probs"] is None
    assert json.loads(row["extra"]) == {"rollout_log_probs": [{"repr": "(-0.5+3j)"}, -1.5]}
    deep = tmp_path / "deep"
    bundles.write_bundle(deep, [{"metadata": {"ok": 1}}, {"metadata": {"a": [np.zeros((1,) * 62)]}}])
    with pytest.raises(bundles.BundleError) as e:
        list(bundles.open_bundle(deep).to_arrow())
    assert str(e.value) == f"{deep}: sample 1: nested deeper than 64 levels"
