"""PIL images found in sample dicts become content-addressed PNG media files."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from bundles import BundleError, MediaRef
from trainer_hooks._snapshot import _SCALAR_TYPES, _pil_image_type

__all__ = ["ImageSink"]


class ImageSink:
    """Encodes PIL images found in samples as PNG files, content-addressed, in one directory.

    The directory is meant to be a bundle's media root for one write and removed afterwards
    (the bundle holds its own link or copy). ``replace`` never mutates its input: containers on
    the path to an image are rebuilt, everything else is shared.
    """

    def __init__(self, media_dir: Path) -> None:
        self.media_dir = media_dir
        self.count = 0

    def _store(self, image: Any, where: str) -> MediaRef:
        buf = io.BytesIO()
        try:
            image.save(buf, format="PNG")
        except (OSError, ValueError, KeyError) as e:
            raise BundleError(
                f"{where}: PIL image (mode {image.mode}) cannot be written as PNG: {e}"
            ) from None
        data = buf.getvalue()
        ref = MediaRef.from_bytes(data, ".png")
        path = self.media_dir / ref.filename
        if not path.exists():
            self.media_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        self.count += 1
        return ref.with_path(str(path))

    def replace(self, value: Any, where: str) -> Any:
        pil = _pil_image_type()
        if pil is None:
            return value
        return self._walk(value, where, pil)

    def _walk(self, value: Any, where: str, pil: type) -> Any:
        t = type(value)
        if t in _SCALAR_TYPES:
            return value
        if isinstance(value, pil):
            return self._store(value, where)
        if t is dict:
            new = {k: self._walk(v, f"{where}.{k}", pil) for k, v in value.items()}
            return value if all(new[k] is value[k] for k in value) else new
        if t is list or t is tuple:
            items = [self._walk(v, f"{where}[{i}]", pil) for i, v in enumerate(value)]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items if t is list else tuple(items)
        return value
