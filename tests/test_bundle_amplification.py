"""Reading a packed bundle in place costs no copy of a member per reference (issue 16 item 4).

One image referenced many times by one sample used to be read into its own bytes object per
reference (one 8 MiB PNG x 150 references = 1.25 GB); FORMAT.md §8 bounds a sample's decoding
cost by its own size. Images now read their member by range when their pixels are needed.
benchmarks/bench_amplification.py measures the peak RSS of samples(), show and view.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from bundles import open_bundle, pack_bundle, write_bundle

PIL = pytest.importorskip("PIL.Image", reason="needs Pillow (images in samples)")

REFS = 100


def _noise_image(side: int = 600):
    pixels = np.random.default_rng(1).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return PIL.fromarray(pixels, "RGB")


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, Path, int]:
    image = _noise_image()
    directory = write_bundle(tmp_path / "b", [{"images": [image] * REFS}], kind="debug_dump", meta={})
    (media,) = (directory / "media").iterdir()
    return directory, pack_bundle(directory, tmp_path / "b.rbundle"), media.stat().st_size


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_many_references_to_one_member_allocate_no_copy_each(packed):
    _, path, png_size = packed
    assert png_size > 1_000_000  # noise does not compress: ~1 MiB per copy
    with open_bundle(path) as bundle:
        tracemalloc.start()
        try:
            (sample,) = bundle.samples()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(sample["images"]) == REFS
    # Before the fix: REFS copies (~100 MiB). Now a small file object per image.
    assert peak < 2 * png_size, f"decoding one sample allocated {peak} bytes"


def test_images_read_by_range_decode_the_same_pixels_even_after_close(packed):
    directory, path, _ = packed
    with open_bundle(directory) as d:
        (expected,) = d.samples()
        want = expected["images"][0].tobytes()
    fds_before = _open_fds()
    with open_bundle(path) as bundle:
        (sample,) = bundle.samples()
    # The bundle is closed: the images hold one shared descriptor, not one each.
    assert _open_fds() <= fds_before + 1
    images = sample["images"]
    assert images[0].filename == f"{path}/media/{Path(expected['images'][0].filename).name}"
    assert images[0].tobytes() == want and images[-1].tobytes() == want
    del sample, images
    import gc

    gc.collect()
    assert _open_fds() <= fds_before  # the last image gone, the duplicate is closed


def test_images_keep_reading_the_file_that_was_opened(packed, tmp_path):
    directory, path, _ = packed
    with open_bundle(directory) as d:
        want = next(iter(d))["images"][0].tobytes()
    with open_bundle(path) as bundle:
        (sample,) = bundle.samples()
    # A new pack is renamed over the path before the pixels are read: they still come from the
    # file that was indexed, never from a mix of two files.
    other = write_bundle(tmp_path / "other", [{"images": [_noise_image(400)]}], kind="debug_dump", meta={})
    pack_bundle(other, path, overwrite=True)
    assert sample["images"][5].tobytes() == want
