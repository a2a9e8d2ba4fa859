"""Media for the tests: content-addressed files as a run media store writes them, PNGs, digests."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from trainer_hooks.testing import png_bytes  # a single-colour PNG without Pillow

__all__ = ["digest_of", "noise_png", "png_bytes", "put_media", "tree_snapshot"]


def put_media(run_dir: Path, data: bytes, suffix: str = ".png") -> str:
    """Store ``data`` as a run media store does, ``<sha256 hex><suffix>``; return its absolute path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / (hashlib.sha256(data).hexdigest() + suffix)
    if not path.exists():
        path.write_bytes(data)
    return str(path)


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def digest_of(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``, from hashlib: never from the code under test."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def noise_png(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG of seeded random pixels (Pillow, numpy): images that differ in every pixel, as
    screenshots do, so fingerprints and processor outputs tell them apart."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()
