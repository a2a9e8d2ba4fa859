"""The committed vectors under tests/vectors/ pin the on-disk bytes of format_version 1.

If a test here fails, the writer's bytes changed. That must be deliberate: regenerate with
``python tests/vectors/generate.py``, bump FORMAT_VERSION if old readers would misread the new
files, and note it in CHANGELOG.md.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

from bundles import FORMAT_VERSION, MediaRef, open_bundle, pack_bundle, unpack_bundle

VECTORS = Path(__file__).resolve().parent / "vectors"
_spec = importlib.util.spec_from_file_location("vector_generator", VECTORS / "generate.py")
generator = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["vector_generator"] = generator  # its dataclasses look their module up
_spec.loader.exec_module(generator)  # type: ignore[union-attr]


def raw_shards(path: Path) -> list[bytes]:
    return [
        zstandard.ZstdDecompressor().decompressobj().decompress((path / e["path"]).read_bytes())
        for e in json.loads((path / "manifest.json").read_text())["shards"]
    ]


def comparable_manifest(path: Path) -> dict:
    m = json.loads((path / "manifest.json").read_text())
    m.pop("created_by")
    for e in m["shards"]:  # compressed bytes may differ between zstd releases; raw bytes may not
        e.pop("size")
        e.pop("digest")
    return m


def test_basic_vector_opens_verifies_and_decodes(tmp_path):
    bundle = open_bundle(VECTORS / "v1_basic", verify="full")
    assert bundle.manifest["format_version"] == FORMAT_VERSION == 1
    assert bundle.kind == "debug_dump" and bundle.meta == {"purpose": "test vector", "rollout_id": 7}
    media = generator.make_media(tmp_path / "run")
    expected = generator.basic_samples(media)
    loaded = list(bundle.samples())
    assert len(loaded) == 3
    for want, got in zip(expected, loaded, strict=True):
        png, ref = got["multimodal_inputs"]["images"]
        assert Path(png).read_bytes() == generator.MEDIA["screen-0.png"]
        assert isinstance(ref, MediaRef) and Path(ref.path).read_bytes() == generator.MEDIA["screen-1.jpg"]
        assert ref.digest == want["multimodal_inputs"]["images"][1].digest
        for key in (
            "group_index",
            "index",
            "prompt",
            "tokens",
            "response",
            "reward",
            "status",
            "raw",
            "big",
            5,
        ):
            assert got[key] == want[key], key
        assert got["reward"]["parts"] == (0.5, None, True)
        assert got["loss_mask"].dtype == np.int32 and (got["loss_mask"] == want["loss_mask"]).all()
        assert got["rollout_log_probs"].dtype == np.float32
        assert type(got["weight"]) is np.float64 and got["weight"] == 0.75


def test_todays_writer_reproduces_the_basic_vector(tmp_path):
    generator.write_vectors(tmp_path, tensors=False)
    assert comparable_manifest(tmp_path / "v1_basic") == comparable_manifest(VECTORS / "v1_basic")
    assert raw_shards(tmp_path / "v1_basic") == raw_shards(VECTORS / "v1_basic")


def test_packing_the_vector_reproduces_the_packed_vector(tmp_path):
    packed = pack_bundle(VECTORS / "v1_basic", tmp_path / "again.rbundle")
    assert packed.read_bytes() == (VECTORS / "v1_basic.rbundle").read_bytes()
    bundle = unpack_bundle(VECTORS / "v1_basic.rbundle", tmp_path / "unpacked")
    assert len(bundle) == 3 and len(bundle.media) == 2


@pytest.mark.torch
def test_tensor_vector_decodes_bfloat16_exactly(tmp_path):
    torch = pytest.importorskip("torch")
    (got,) = open_bundle(VECTORS / "v1_tensor", verify="full").samples()
    (want,) = generator.tensor_samples()
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    generator.write_vectors(tmp_path)
    assert raw_shards(tmp_path / "v1_tensor") == raw_shards(VECTORS / "v1_tensor")


def test_records_vector_decodes_registered_and_unregistered_records(tmp_path):
    from bundles import Record

    (got,) = open_bundle(VECTORS / "v1_records", verify="full").samples()
    (want,) = generator.records_samples()
    assert type(got["adapter"]) is generator.Adapter and got["adapter"] == want["adapter"]
    assert got["nested"] == want["nested"] and type(got["nested"][1]["inner"]) is generator.Adapter
    spec = got["spec"]
    assert type(spec) is Record and spec.name == "vector.Unregistered"
    assert spec.fields["rm_type"] == "math" and spec.fields["path"] is None
    assert spec.fields["weights"] == (1, 2) and type(spec.fields["weights"][1]) is np.int64


def test_todays_writer_reproduces_the_records_vector(tmp_path):
    generator.write_vectors(tmp_path, tensors=False)
    assert comparable_manifest(tmp_path / "v1_records") == comparable_manifest(VECTORS / "v1_records")
    assert raw_shards(tmp_path / "v1_records") == raw_shards(VECTORS / "v1_records")


def test_image_vector_decodes_to_pil_images():
    Image = pytest.importorskip("PIL.Image")
    (got,) = open_bundle(VECTORS / "v1_image", verify="full").samples()
    (want,) = generator.image_samples()
    for g, w in zip(got["multimodal_inputs"]["images"], want["multimodal_inputs"]["images"], strict=True):
        assert isinstance(g, Image.Image) and (g.mode, g.size) == (w.mode, w.size)
        assert g.tobytes() == w.tobytes()
        assert Path(g.filename).parent == VECTORS / "v1_image" / "media"
