"""Generate the hostile corpus of ``rollout-bundle replay``: ``python tests/vectors/hostile/generate_replay.py``.

Each vector is a *well-formed* bundle (it opens and verifies at ``full``) whose samples or
recorded settings attack the replay: an image reference naming a file outside the bundle, an
EPS file stored as ``media/<hex>.png``, processor settings that would divide by zero, allocate
gigabytes or rebuild empty tensors, a model family replay cannot rebuild. They live in
``tests/vectors/hostile/replay/`` with ``expected.json`` there, which says what replay must do:

* ``"outcome": "refused"``: exit 1 with one line ``rollout-bundle replay: error: ...`` holding
  ``message`` (no traceback, no report);
* ``"outcome": "problem"``: exit 1 with a ``kind`` problem whose message holds ``message``, and
  nothing of what the sample names outside the bundle in the report or the payloads.

``tests/test_replay_untrusted.py`` reads the table. The vectors are inputs: a later change of
the writer's bytes does not require regenerating them (run this again when the table changes).
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "replay"
TABLE = HERE / "expected.json"

# A PostScript file: Pillow would hand it to Ghostscript if asked to open it as any format.
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n(/etc/passwd) (r) file pop\nshowpage\n"
GOOD = {"model_path": "Qwen/Qwen2-VL-7B-Instruct", "image_processor_backend": "pil"}


def _png(width: int = 28, height: int = 28) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 200)).save(buf, format="PNG")
    return buf.getvalue()


def _sample(images: list[Any] | None = None) -> dict[str, Any]:
    return {
        "index": 0, "group_index": 0, "tokens": [151644, 872, 198, 9707, 11], "response_length": 2,
        "loss_mask": [1, 1], "reward": 1.0, "rollout_log_probs": [-0.5, -0.5], "status": "completed",
        "multimodal_inputs": {"images": images} if images is not None else None,
    }  # fmt: skip


def _processor(image: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    return {**GOOD, "mm_process_config": {"image": image} if image is not None else None, **over}


def vectors() -> dict[str, dict[str, Any]]:
    """name -> {samples (callable of a scratch dir -> (samples, media_roots)), meta, expected row}."""

    def outside(path: str) -> Any:
        return lambda _tmp: ([_sample([path])], [])

    def eps(tmp: Path) -> Any:
        from bundles import MediaRef

        (tmp / "run").mkdir()
        p = tmp / "run" / "shot.png"
        p.write_bytes(EPS)
        return [_sample([MediaRef.from_file(p)])], [tmp / "run"]

    def one_png(tmp: Path) -> Any:
        from bundles import MediaRef

        (tmp / "run").mkdir()
        p = tmp / "run" / "shot.png"
        p.write_bytes(_png())
        return [_sample([MediaRef.from_file(p)])], [tmp / "run"]

    def tokens_text(tmp: Path) -> Any:
        samples, roots = one_png(tmp)
        samples[0]["tokens"] = "151644 872 198"  # found by tests/test_fuzz_untrusted.py (was a TypeError)
        return samples, roots

    where = "meta.processor.mm_process_config.image"
    out: dict[str, dict[str, Any]] = {
        "absolute-path": (outside("/etc/passwd"), _processor(), "problem", "rebuild",
                          "'/etc/passwd' is not a media file stored in the bundle"),
        "relative-traversal": (outside("../../private/shot.png"), _processor(), "problem", "rebuild",
                               "'../../private/shot.png' is not a media file stored in the bundle"),
        "dev-stdin": (outside("/dev/stdin"), _processor(), "problem", "rebuild",
                      "'/dev/stdin' is not a media file stored in the bundle"),
        "eps-as-png": (eps, _processor(), "problem", "rebuild",
                       "multimodal_inputs.images[0]: not a PNG or JPEG image (starts with b'%!PS-Ado')"),
        "min-pixels-4e8": (one_png, _processor({"min_pixels": 4e8}), "refused", None,
                           f"{where}.min_pixels: expected an int in 0..33554432, found 400000000.0"),
        "patch-size-0": (one_png, _processor({"patch_size": 0}), "refused", None,
                         f"{where}.patch_size: expected an int in 1..128, found 0"),
        "merge-size-0": (one_png, _processor({"merge_size": 0}), "refused", None,
                         f"{where}.merge_size: expected an int in 1..16, found 0"),
        "temporal-patch-size-0": (one_png, _processor({"temporal_patch_size": 0}), "refused", None,
                                  f"{where}.temporal_patch_size: expected an int in 1..16, found 0"),
        "max-pixels-abc": (one_png, _processor({"max_pixels": "abc"}), "refused", None,
                           f"{where}.max_pixels: expected an int in 1..33554432, found 'abc'"),
        "max-pixels-1e12": (one_png, _processor({"max_pixels": 1e12}), "refused", None,
                            f"{where}.max_pixels: expected an int in 1..33554432, found 1000000000000.0"),
        "min-above-max": (one_png, _processor({"min_pixels": 1000000, "max_pixels": 3136}), "refused", None,
                          "min_pixels 1000000 is above max_pixels 3136"),
        "family-gemma": (one_png, _processor(model_path="google/gemma-3-4b-it"), "refused", None,
                         "meta.processor.model_path: model 'google/gemma-3-4b-it': not a model family replay "
                         "can rebuild (Qwen2.5-VL, Qwen3-VL, Qwen2-VL)"),
        "model-path-not-a-string": (one_png, _processor(model_path=["Qwen2-VL"]), "refused", None,
                                    "meta.processor.model_path: expected a string or null"),
        "patch-size-null": (one_png, _processor({"patch_size": None}), "refused", None,
                            f"{where}.patch_size: expected an int in 1..128, found None"),
        "tokens-not-a-list": (tokens_text, _processor(), "problem", "payload",
                              "sample index 0: tokens: expected a list of token ids, found str"),
        "null-processor": (one_png, None, "problem", "processor",
                           "meta.processor is null: the bundle recorded no processor settings"),
    }  # fmt: skip
    rows = {}
    for name, (make, processor, outcome, kind, message) in out.items():
        rows[name] = {
            "make": make,
            "meta": {"processor": processor, "training_dtype": "bf16"},
            "row": {"outcome": outcome, "kind": kind, "message": message, "path": name},
        }
    return rows


def table() -> dict[str, dict[str, Any]]:
    return {name: v["row"] for name, v in sorted(vectors().items())}


def write(name: str, spec: dict[str, Any], dest: Path, scratch: Path) -> None:
    from bundles import write_bundle

    samples, roots = spec["make"](scratch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # outside paths are the point of some vectors
        write_bundle(
            dest, samples, media_roots=roots, kind="debug_dump", meta=spec["meta"], outside_paths="keep"
        )


def main() -> None:
    import tempfile

    if HERE.exists():
        shutil.rmtree(HERE)
    HERE.mkdir(parents=True)
    for name, spec in sorted(vectors().items()):
        with tempfile.TemporaryDirectory() as scratch:
            write(name, spec, HERE / name, Path(scratch))
    TABLE.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(vectors())} vectors under {HERE}", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    main()
