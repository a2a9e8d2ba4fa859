"""Generate the hostile corpus for ``rollout-bundle view``: ``python tests/vectors/hostile/generate_view.py``.

Unlike the reader's vectors next to this script (refused with a ``BundleError``), these are
bundles a reader accepts, written by ``write_bundle`` from ordinary inputs, that once made
``view`` run Ghostscript, link a page that runs a script, crash with a traceback, or refuse the
whole bundle. Each lives under ``view/`` and ``view/expected.json`` says what the page must do:

- ``not_shown``: fragments, each found in one of the page's "cannot be shown" lines (the CLI
  warns with them; the page draws a placeholder naming the file);
- ``present`` / ``absent``: fragments that must / must not appear in the HTML;
- ``replay``: a replay report (JSON next to the bundle) passed with ``--replay``.

``tests/test_view_hostile.py`` reads the table. Run this again when the table changes.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bundles import MediaRef, write_bundle

HERE = Path(__file__).resolve().parent / "view"
TABLE = HERE / "expected.json"

# A minimal EPS whose PostScript writes a file when Ghostscript runs it: a decoder that hands
# it to Pillow's EpsImagePlugin (which runs `gs`) is caught by a `gs` stand-in on PATH.
EPS = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n"
    b"(ran-ghostscript) print flush\nnewpath 0 0 moveto 16 16 lineto stroke\nshowpage\n%%EOF\n"
)
SCRIPT = b"<script>document.title='pwned'</script>"


def png(w: int = 64, h: int = 36, color: tuple[int, int, int] = (40, 90, 160)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (w, h), color).save(out, "PNG")
    return out.getvalue()


def _bundle(dest: Path, samples: list[dict[str, Any]], media: dict[str, bytes]) -> list[MediaRef]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        refs = []
        for name, data in media.items():
            (run / name).write_bytes(data)
            refs.append(MediaRef.from_file(run / name))
        for s in samples:
            mm = s.get("multimodal_inputs")
            if isinstance(mm, dict) and isinstance(mm.get("images"), list):
                mm["images"] = [refs[i] if isinstance(i, int) else i for i in mm["images"]]
        write_bundle(
            dest, samples, media_roots=[run], kind="debug_dump", meta={"note": "hostile view vector"}
        )
    return refs


def _sample(images: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "index": 0,
        "group_index": 0,
        "prompt": "open the file",
        "response": "<tool_call>click(10, 10)</tool_call>",
        "reward": 1.0,
        "status": "completed",
        "multimodal_inputs": {"images": images},
        **extra,
    }


VECTORS: dict[str, dict[str, Any]] = {}


def vector(name: str, **expect: Any):
    def register(make):
        VECTORS[name] = {"make": make, "path": name, "not_shown": [], "present": [], "absent": [],
                         "replay": None, **expect}  # fmt: skip
        return make

    return register


@vector("view-eps-as-png", not_shown=["not a PNG or JPEG image (starts with b'%!PS-Ado')"])
def _eps(dest: Path) -> None:
    _bundle(dest, [_sample([0])], {"shot.png": EPS})


@vector(
    "view-html-suffix",
    not_shown=["stored as .html, only .png/.jpg/.jpeg files are shown"],
    absent=["<script>document.title"],
)
def _html(dest: Path) -> None:
    _bundle(dest, [_sample([0, 1])], {"page.html": png() + SCRIPT, "ok.png": png(color=(200, 20, 20))})


@vector(
    "view-svg-suffix",
    not_shown=["stored as .svg, only .png/.jpg/.jpeg files are shown"],
    absent=["<script>document.title"],
)
def _svg(dest: Path) -> None:
    svg = b'<svg xmlns="http://www.w3.org/2000/svg">' + SCRIPT + b"</svg>"
    _bundle(dest, [_sample([0])], {"shot.svg": svg})


@vector("view-xhtml-suffix", not_shown=["stored as .xhtml"])
def _xhtml(dest: Path) -> None:
    _bundle(dest, [_sample([0])], {"shot.xhtml": png() + SCRIPT})


@vector("view-corrupt-png", not_shown=["cannot decode as PNG"])
def _corrupt(dest: Path) -> None:
    _bundle(dest, [_sample([0, 1])], {"bad.png": png()[:40] + b"\0" * 64, "good.png": png()})


@vector("view-media-missing", not_shown=["missing from the bundle"], present=["missing from the bundle"])
def _missing(dest: Path) -> None:
    refs = _bundle(dest, [_sample([0, 1])], {"gone.png": png(color=(1, 2, 3)), "kept.png": png()})
    (dest / "media" / refs[0].filename).unlink()


@vector(
    "view-legal-odd-values",
    present=["&lt;ndarray float32 [5]&gt;", "&lt;script&gt;"],
    absent=["<script>alert"],
)
def _odd(dest: Path) -> None:
    samples = [
        _sample([0], advantages=np.arange(5, dtype=np.float32), reward=np.float32(0.5), step=np.int64(3),
                multimodal_train_inputs={"image_grid_thw": [["1", "a", "<script>alert(1)</script>"]]}),
        _sample([0], index=1, multimodal_train_inputs={"image_grid_thw": [[1.0, float("inf"), 2.0]]}),
        _sample([0], index=2, multimodal_train_inputs={"image_grid_thw": np.array([[-1, 2**40, 3]])},
                metadata=np.zeros(3), response=np.arange(3)),
    ]  # fmt: skip
    _bundle(dest, samples, {"ok.png": png()})


@vector("view-replay-overflow", replay="view-replay-overflow.json", present=["bytes"])
def _overflow(dest: Path) -> None:
    _bundle(dest, [_sample([0])], {"ok.png": png()})
    from bundles import open_bundle
    from trainer_hooks.replay import bundle_identity

    report = {
        "format": "rollout-bundle-replay",
        "version": 1,
        "bundle": str(dest.name),
        "bundle_id": bundle_identity(open_bundle(dest)),
        "summary": {"bytes_before_cast": 10**400, "bytes_after_cast": 10**401, "peak_rss_bytes": 10**400,
                    "vision_tokens": 10**400, "problems": {}},
        "samples": [{"position": 0, "problems": [], "images": [{"image": 0, "vision_tokens": 10**400,
                                                                 "placeholder_tokens": 1}],
                     "logprob_diff": {"max_abs": 10**400, "mean_abs": 1e308, "tokens": 10**400}}],
    }  # fmt: skip
    (HERE / "view-replay-overflow.json").write_text(json.dumps(report))


def table() -> dict[str, dict[str, Any]]:
    return {name: {k: v for k, v in row.items() if k != "make"} for name, row in sorted(VECTORS.items())}


def main() -> int:
    if HERE.exists():
        shutil.rmtree(HERE)
    HERE.mkdir(parents=True)
    for row in VECTORS.values():
        row["make"](HERE / row["path"])
    TABLE.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(VECTORS)} view vectors under {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
