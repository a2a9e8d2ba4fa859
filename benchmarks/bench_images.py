"""PIL images through a bundle vs torch.save of the same samples (not a test).

    python benchmarks/bench_images.py [--images 20] [--samples 100] [--repeats 3] [--dir bench-out]

Samples as Miles' dataset path builds them: ``multimodal_inputs["images"]`` holds PIL images
(``--images`` distinct 1080p screenshot-like images, each referenced by 4 samples). Timed, page
cache warm, median of ``--repeats``:

* write: ``bundles.write_bundle`` (each distinct image object encoded once as PNG,
  ``compress_level=1``) vs ``torch.save`` of the same list (pickles every image's raw pixels);
* read: ``Bundle.samples()`` (images opened lazily: header only) vs ``torch.load(weights_only=False)``
  (unpickles every image's pixels), then the same plus touching every image's pixels;

and the floor measured in the same run: PNG encoding of the distinct images alone (what the
bundle write cannot avoid while it stores PNG).
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import bundles


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def screenshots(n: int) -> list[Any]:
    rng = np.random.default_rng(0)
    base = np.full((1080, 1920, 3), 235, np.uint8)
    base[100:980, 200:1700] = 250
    base[rng.integers(0, 1080, 20000), rng.integers(0, 1920, 20000)] = 20  # text-like detail
    return [Image.fromarray(np.roll(base, i * 7, axis=1)) for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="bench-out")
    ns = parser.parse_args(argv)
    import torch

    out = Path(ns.dir) / "images"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shots = screenshots(ns.images)
    samples = [
        {"index": i, "multimodal_inputs": {"images": [shots[(i + k) % ns.images] for k in range(4)]}}
        for i in range(ns.samples)
    ]

    def encode_floor() -> None:
        for s in shots:
            s.save(io.BytesIO(), format="PNG", compress_level=1)

    def write() -> None:
        bundles.write_bundle(out / "b", samples, overwrite=True)

    def torch_write() -> None:
        torch.save({"samples": samples}, out / "samples.pt")

    floor = median_time(encode_floor, ns.repeats)
    w_bundle = median_time(write, ns.repeats)
    w_torch = median_time(torch_write, ns.repeats)

    def read() -> list[Any]:
        return list(bundles.open_bundle(out / "b").samples())

    def torch_read() -> Any:
        return torch.load(out / "samples.pt", weights_only=False)["samples"]

    def touch(rows: list[Any]) -> None:
        for r in rows:
            for img in r["multimodal_inputs"]["images"]:
                img.load()

    r_bundle = median_time(read, ns.repeats)
    r_torch = median_time(torch_read, ns.repeats)
    rt_bundle = median_time(lambda: touch(read()), ns.repeats)
    rt_torch = median_time(lambda: touch(torch_read()), ns.repeats)
    size_bundle = sum(p.stat().st_size for p in (out / "b").rglob("*") if p.is_file())
    size_torch = (out / "samples.pt").stat().st_size
    refs = ns.samples * 4
    print(f"{ns.samples} samples, {refs} image references to {ns.images} distinct 1080p images")
    print(f"PNG encode floor ({ns.images} images):   {floor:7.2f} s")
    print(f"write  bundle:                      {w_bundle:7.2f} s  ({w_bundle / floor:.2f}x the floor)")
    print(f"write  torch.save:                  {w_torch:7.2f} s  (bundle/torch {w_bundle / w_torch:.2f}x)")
    print(
        f"read   bundle (lazy):               {r_bundle:7.3f} s  ({r_bundle / refs * 1e6:.0f} us per image)"
    )
    print(f"read   torch.load:                  {r_torch:7.3f} s  (bundle/torch {r_bundle / r_torch:.3f}x)")
    print(f"read + pixels  bundle:              {rt_bundle:7.2f} s")
    print(
        f"read + pixels  torch.load:          {rt_torch:7.2f} s  (bundle/torch {rt_bundle / rt_torch:.2f}x)"
    )
    print(f"size   bundle {size_bundle / 1e6:.1f} MB, torch.save {size_torch / 1e6:.1f} MB")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
