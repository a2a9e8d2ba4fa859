"""The readers' memory does not grow with the bundle (issue 39, item 6), and a local shard,
decoded from a second read of its file, is refused when its bytes changed after the first.

The memory figure is tracemalloc's peak of traced Python allocations while a fresh subprocess
iterates a bundle: counted bytes, not time or RSS, so machine load cannot move it. A reader
that held a compressed shard (the one before) peaks at ~10x on the larger bundle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import bundles

ROOT = Path(__file__).resolve().parents[1]

# Iterate a bundle with tracemalloc on; print the peak of traced memory in bytes.
CHILD = """
import sys, tracemalloc
import bundles
b = bundles.open_bundle(sys.argv[1], verify="none")
tracemalloc.start()
count = sum(1 for _ in b.samples())
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
b.close()
print(count, peak)
"""


def _samples(n: int) -> Iterator[dict[str, Any]]:
    """Samples of ~1.7 KB that do not compress (a few objects each, so that tracing stays quick):
    2,000 fill a shard of a few MB, past the decoder's 1 MiB chunks, where its working set stops
    growing; 20,000 fill one of ~35 MB."""
    rng = np.random.default_rng(6)
    for i in range(n):
        yield {"index": i, "tokens": rng.integers(0, 151_000, 50).tolist(), "logits": rng.bytes(1536)}


def _peak(path: Path) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    count, peak = done.stdout.split()
    return int(count), int(peak)


@pytest.fixture(scope="module")
def small_and_large(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("readers-memory")
    return {n: Path(str(bundles.write_bundle(root / f"n{n}", _samples(n)))) for n in (2_000, 20_000)}


def test_iterating_ten_times_the_samples_peaks_at_about_the_same_traced_memory(
    small_and_large: dict[int, Path],
) -> None:
    small, large = small_and_large[2_000], small_and_large[20_000]
    shard = large / "samples" / "000000.msgpack.zst"
    assert os.stat(shard).st_size > 30 * 2**20  # the larger bundle's one shard
    (n_small, peak_small), (n_large, peak_large) = _peak(small), _peak(large)
    assert (n_small, n_large) == (2_000, 20_000)
    ratio = peak_large / peak_small
    assert ratio <= 1.5, json.dumps({"peak_2000": peak_small, "peak_20000": peak_large, "ratio": ratio})
    assert peak_large < os.stat(shard).st_size / 2  # not the compressed shard held whole


def test_a_shard_rewritten_between_its_check_and_its_decoding_is_refused_naming_it(tmp_path: Path) -> None:
    path = Path(str(bundles.write_bundle(tmp_path / "b", _samples(2_000))))
    shard = path / "samples" / "000000.msgpack.zst"
    size = os.stat(shard).st_size
    assert size > 3 * 2**20  # larger than what the decoder reads before the first sample (~1 MiB)
    with bundles.open_bundle(path, verify="none") as b:
        it = b.samples()
        assert next(it)["index"] == 0  # the shard's digest checked, its decoding begun
        os.chmod(shard, 0o644)
        with open(shard, "r+b") as f:  # the same size, the last KiB other bytes
            f.seek(size - 1024)
            tail = f.read()
            f.seek(size - 1024)
            f.write(bytes(255 - x for x in tail))
        with pytest.raises(bundles.BundleVerificationError) as e:
            for _ in it:
                pass
    assert f"{shard}: digest: expected sha256:" in str(e.value)
    assert "(the file changed while it was read)" in str(e.value)
