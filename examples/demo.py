"""Walk-through of a bundle surviving the teardown of its run (``make demo``).

A multimodal RL run keeps its screenshots content-addressed under
``<shared_media_dir>/<run_uuid>/`` and deletes that directory as its last teardown step. This
demo plays that out:

1. render a few 1920x1080 desktop screenshots into a run media directory;
2. build samples shaped like Miles' ``Sample.to_dict()`` that reference them by absolute path;
3. write a debug-dump bundle from them;
4. tear the run down: delete the run media directory;
5. open the bundle with full verification and check every image against the original bytes;
6. print a summary.

Each step is a function over one shared ``Demo`` state, so later walk-throughs (checkpoint
resume, replay, ...) append steps instead of rewriting this file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for screenshots.py beside this file

from screenshots import render_into

import bundles


@dataclass
class Demo:
    out_dir: Path
    n_screenshots: int
    shared_media_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="shared-media-")))
    run_uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    originals: dict[str, str] = field(default_factory=dict)  # absolute path -> sha256 hex of its bytes
    samples: list[dict[str, Any]] = field(default_factory=list)
    bundle_path: Path | None = None
    bundle: bundles.Bundle | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.shared_media_dir / self.run_uuid


def step_render_screenshots(d: Demo) -> None:
    """The environment's screenshots, stored as the run media store stores them: ``<sha256>.png``."""
    for i in range(d.n_screenshots):
        path = render_into(d.run_dir, seed=1000 + i)
        d.originals[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    total = sum(Path(p).stat().st_size for p in d.originals)
    print(f"  {len(d.originals)} screenshots, {total / 1e6:.1f} MB, in {d.run_dir}")


def step_build_samples(d: Demo) -> None:
    """One trajectory: turn k sees every screenshot so far, as a multi-turn agent's prompt does."""
    shots = list(d.originals)
    for k in range(len(shots)):
        images = shots[: k + 1]
        n_tokens = 64 + 16 * k
        d.samples.append(
            {
                "group_index": 0,
                "index": k,
                "prompt": f"<|im_start|>user\nTurn {k}: click the OK button.<|im_end|>",
                "tokens": list(range(100, 100 + n_tokens)),
                "multimodal_inputs": {"images": images},
                "multimodal_train_inputs": {
                    # Qwen2-VL's processor output: one (t, h, w) row per image.
                    "image_grid_thw": np.tile(np.array([[1, 78, 138]], dtype=np.int64), (len(images), 1)),
                },
                "response": "<tool_call>click(960, 540)</tool_call>",
                "response_length": 12,
                "label": None,
                "reward": 1.0 if k == len(shots) - 1 else 0.0,
                "loss_mask": [1] * 12,
                "rollout_log_probs": np.linspace(-2.0, -0.1, 12, dtype=np.float32),
                "status": "completed",
                "metadata": {"env": "desktop-sim", "turn": k, "screen": (1920, 1080)},
            }
        )
    refs = sum(len(s["multimodal_inputs"]["images"]) for s in d.samples)
    print(f"  {len(d.samples)} samples holding {refs} image paths into the run directory")


def step_write_bundle(d: Demo) -> None:
    d.bundle_path = d.out_dir / "debug_dump.bundle"
    t = time.perf_counter()
    bundles.write_bundle(
        d.bundle_path,
        d.samples,
        media_roots=[d.run_dir],
        kind="debug_dump",
        meta={"run_uuid": d.run_uuid, "rollout_id": 0, "source": "examples/demo.py"},
        overwrite=True,
    )
    d.timings["write"] = time.perf_counter() - t
    print(f"  wrote {d.bundle_path} in {d.timings['write'] * 1e3:.0f} ms")


def step_teardown_run(d: Demo) -> None:
    """The run's last teardown step: its media directory goes away, and every path above dangles."""
    shutil.rmtree(d.shared_media_dir)
    dangling = sum(not Path(p).exists() for p in d.originals)
    print(f"  deleted {d.shared_media_dir}; {dangling}/{len(d.originals)} original paths now dangle")


def step_open_and_verify(d: Demo) -> None:
    assert d.bundle_path is not None
    t = time.perf_counter()
    d.bundle = bundles.open_bundle(d.bundle_path, verify="full")
    d.timings["verify"] = time.perf_counter() - t
    checked = 0
    for original, sample in zip(d.samples, d.bundle.samples(), strict=True):
        for old, new in zip(
            original["multimodal_inputs"]["images"], sample["multimodal_inputs"]["images"], strict=True
        ):
            new_path = Path(new)
            if not new_path.is_relative_to(d.bundle_path):
                raise SystemExit(f"reference {new!r} does not point into the bundle")
            digest = hashlib.sha256(new_path.read_bytes()).hexdigest()
            if digest != d.originals[old]:
                raise SystemExit(f"{new}: bytes differ from the original {old}")
            checked += 1
        # Everything that is not a media reference comes back as it went in.
        np.testing.assert_array_equal(sample["rollout_log_probs"], original["rollout_log_probs"])
        np.testing.assert_array_equal(
            sample["multimodal_train_inputs"]["image_grid_thw"],
            original["multimodal_train_inputs"]["image_grid_thw"],
        )
        if sample["tokens"] != original["tokens"] or sample["metadata"] != original["metadata"]:
            raise SystemExit(f"sample {original['index']} did not round-trip")
    _check_images_decode(d)
    print(
        f"  opened with verify='full' in {d.timings['verify'] * 1e3:.0f} ms; {checked} image references match the originals"
    )


def _check_images_decode(d: Demo) -> None:
    """Every stored screenshot still decodes as a 1920x1080 image."""
    from PIL import Image

    assert d.bundle is not None
    for ref in d.bundle.media:
        assert ref.path is not None
        with Image.open(ref.path) as im:
            im.load()
            if im.size != (1920, 1080):
                raise SystemExit(f"{ref.path}: expected 1920x1080, found {im.size}")


def step_summary(d: Demo) -> None:
    assert d.bundle is not None
    b = d.bundle
    stored = len(b.media)
    print(f"  bundle         {b.path}")
    print(f"  kind           {b.kind}")
    print(f"  samples        {len(b)}")
    print(f"  media          {stored} files, {b.media_bytes / 1e6:.1f} MB")
    print(f"  references     {b.media_references} (dedup ratio {b.media_references / max(stored, 1):.2f}x)")
    print(f"  write + verify {(d.timings['write'] + d.timings['verify']) * 1e3:.0f} ms")
    # The CLI lives beside this interpreter (.venv/bin under `make demo`), which may not be on PATH.
    cli = "rollout-bundle"
    if shutil.which(cli) is None:
        cli = os.path.relpath(Path(sys.executable).with_name(cli))
    print(f"  try:           {cli} inspect {b.path}")


STEPS: list[tuple[str, Callable[[Demo], None]]] = [
    ("render screenshots into the run media directory", step_render_screenshots),
    ("build samples that reference them", step_build_samples),
    ("write a debug-dump bundle", step_write_bundle),
    ("tear the run down (delete its media directory)", step_teardown_run),
    ("open the bundle, fully verify, compare bytes", step_open_and_verify),
    ("summary", step_summary),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="where the bundle is written")
    parser.add_argument("--screenshots", type=int, default=4)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    d = Demo(out_dir=args.out.resolve(), n_screenshots=args.screenshots)
    start = time.perf_counter()
    try:
        for i, (title, step) in enumerate(STEPS, 1):
            print(f"[{i}/{len(STEPS)}] {title}")
            step(d)
    finally:
        shutil.rmtree(d.shared_media_dir, ignore_errors=True)
    print(f"demo OK in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
