"""Regenerate the test vectors: ``python tests/vectors/generate.py``.

Run this only for a deliberate change of the on-disk bytes (with a FORMAT_VERSION bump where
readers would misread old files) and say so in CHANGELOG.md. tests/test_vectors.py loads the
committed files and checks that today's writer still produces the same bytes.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bundles import MediaRef, Record, pack_bundle, register_record_type, write_bundle

HERE = Path(__file__).resolve().parent
MEDIA = {
    "screen-0.png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4,
    "screen-1.jpg": b"\xff\xd8\xff" + b"jpeg" * 100,
}


def make_media(root: Path) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, data in MEDIA.items():
        (root / name).write_bytes(data)
        out[name] = str(root / name)
    return out


def basic_samples(media: dict[str, str]) -> list[dict]:
    ref = MediaRef.from_file(media["screen-1.jpg"])
    return [
        {
            "group_index": 0,
            "index": i,
            "prompt": "Open the settings window",
            "tokens": [151644, 8948, 198, i],
            "multimodal_inputs": {"images": [media["screen-0.png"], ref]},
            "response": "click(10, 20)",
            "reward": {"score": 1.0 - i / 2, "parts": (0.5, None, True)},
            "status": "completed",
            "loss_mask": np.array([0, 1, 1], dtype=np.int32),
            "rollout_log_probs": np.array([-0.25, -1.5], dtype=np.float32),
            "weight": np.float64(0.75),
            "raw": b"\x00\x01\x02",
            "big": 2**63 + i,
            5: "int key",
        }
        for i in range(3)
    ]


@dataclass(frozen=True)
class Adapter:
    """A record type of the vector's writer (registered as "vector.Adapter")."""

    name: str
    slot: int


register_record_type(Adapter, "vector.Adapter")


def records_samples() -> list[dict]:
    """Extension 7: a registered record (nested values included) and one nobody registers."""
    return [
        {
            "adapter": Adapter("math-lora", 2),
            "spec": Record(
                "vector.Unregistered", {"rm_type": "math", "weights": (1, np.int64(2)), "path": None}
            ),
            "nested": [Adapter("a", 0), {"inner": Adapter("b", 1)}],
            "status": "completed",
        }
    ]


def image_samples() -> list[dict]:
    """Extension 8: a PIL image (stored as PNG; Pillow's zlib output may differ between builds,
    so this vector is checked by decoding, not by reproducing its bytes)."""
    from PIL import Image

    img = Image.new("RGB", (4, 3))
    img.putdata([(r * 60, g * 80, 7) for g in range(3) for r in range(4)])
    return [{"multimodal_inputs": {"images": [img, img.convert("L")]}, "status": "completed"}]


def tensor_samples() -> list[dict]:
    import torch

    return [
        {
            "pixel_values": torch.arange(12, dtype=torch.float32).reshape(2, 6).to(torch.bfloat16),
            "image_grid_thw": torch.tensor([[1, 2, 2]], dtype=torch.int64),
            "mask": torch.tensor([True, False]),
        }
    ]


def nested_checkpoint_samples() -> list[dict]:
    """One completed nested group (Miles' list[list[Sample]]): two trajectories and a bare sample."""
    return [
        {
            "group_index": 0,
            "index": index,
            "prompt": "Open the settings window",
            "response": response,
            "status": "completed",
        }
        for index, response in ((0, "look"), (0, "click"), (1, "look"), (2, "type"))
    ]


#: The rollout_checkpoint meta of the nested vector (docs/FORMAT.md, appendix A, version 2).
NESTED_META = {
    "checkpoint_version": 2,
    "rollout_id": 0,
    "run_uuid": None,
    "training_dtype": "fp32",
    "processor": None,
    "pending_group_sizes": [],
    "completed_group_sizes": [[2, 1, None]],
    "recycled_group_sizes": [],
    "data_source": {
        "sample_offset": 1,
        "epoch_id": 0,
        "sample_group_index": 1,
        "sample_index": 3,
        "metadata": {},
    },
}


def write_nested_vector(out: Path) -> None:
    write_bundle(
        out / "v2_nested" / "rollout" / "fully_async_0",
        nested_checkpoint_samples(),
        kind="rollout_checkpoint",
        meta=NESTED_META,
    )


def write_vectors(out: Path, tensors: bool = True) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        media = make_media(Path(tmp) / "run")
        write_bundle(
            out / "v1_basic",
            basic_samples(media),
            media_roots=[Path(tmp) / "run"],
            meta={"purpose": "test vector", "rollout_id": 7},
        )
    pack_bundle(out / "v1_basic", out / "v1_basic.rbundle")
    write_bundle(out / "v1_records", records_samples(), meta={"purpose": "records vector"})
    write_nested_vector(out)
    if tensors:
        write_bundle(out / "v1_tensor", tensor_samples(), kind="rollout_checkpoint")
        write_bundle(out / "v1_image", image_samples(), meta={"purpose": "image vector"})


if __name__ == "__main__":
    for name in ("v1_basic", "v1_tensor", "v1_records", "v1_image", "v1_basic.rbundle", "v2_nested"):
        p = HERE / name
        if p.is_dir():
            from bundles._local.fs import remove_tree

            remove_tree(p)
        elif p.exists():
            p.unlink()
    write_vectors(HERE)
    print("wrote", *sorted(p.name for p in HERE.iterdir()), file=sys.stderr)
    shutil.rmtree(HERE / "__pycache__", ignore_errors=True)
