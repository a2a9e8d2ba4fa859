"""Which stored files a page may show, and the one rule that makes a picture of one.

A bundle may come from anyone, and its media files are its least trusted part: a file stored as
``media/<hex>.html`` may hold a valid PNG followed by a ``<script>`` that a browser would run if a
page linked to it. So only files whose stored suffix is in :data:`SHOWN_SUFFIXES` are read at all
(:func:`shown_suffix`); any other is shown as a named placeholder, never decoded, never linked (a
browser decides how to render a linked file by its suffix, so ``.svg``, ``.html``, ``.xhtml``...
must never be a link target), and none larger than :data:`MAX_MEDIA_BYTES` is read.
:func:`jpeg_bytes` is the one thumbnail rule of the report (``view``) and the server (``serve``):
a picture decoded by :func:`bundles.decode_image`, re-encoded as JPEG.
"""

from __future__ import annotations

import io
import os
from typing import Any

__all__ = ["MAX_MEDIA_BYTES", "SHOWN_SUFFIXES", "jpeg_bytes", "jpeg_size", "shown_suffix"]

#: Stored suffixes a page shows and links to: raster formats every browser renders as an image.
SHOWN_SUFFIXES = (".png", ".jpg", ".jpeg")
#: Largest stored file read for a picture (a 4K PNG screenshot is 5-25 MiB).
MAX_MEDIA_BYTES = 64 * 2**20


def shown_suffix(name: str) -> bool:
    """True when the stored file ``name`` may be decoded and linked: its suffix is a raster
    image's (case-insensitive), never one a browser renders as a document."""
    return os.path.splitext(name)[1].lower() in SHOWN_SUFFIXES


def jpeg_bytes(image: Any, width: int, *, quality: int, optimize: bool, progressive: bool) -> bytes:
    """A decoded image as JPEG at most ``width`` px wide (and at most 4:1 tall), transparency
    flattened onto white: the one thumbnail rule of ``view`` and ``serve``."""
    from PIL import Image

    im = image
    # A large picture is first reduced by an integer factor (a box filter, in its own mode): the
    # copies below (flattened, converted, resized) are then made of the reduced pixels, not of a
    # 9400x9400 RGBA screenshot's 350 MB each. The last step is still LANCZOS to the exact size.
    factor = int(max(im.width / width, im.height / (4 * width)) // 2)
    if factor >= 2 and im.mode in ("RGB", "RGBA", "L", "LA"):
        im = im.reduce(factor)
    if im.mode in ("RGBA", "LA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        im = flat
    elif im.mode != "RGB":
        im = im.convert("RGB")
    scale = min(1.0, width / im.width, 4 * width / im.height)  # a very tall image: at most 4:1
    if scale < 1.0:
        size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
        im = im.resize(size, Image.Resampling.LANCZOS, reducing_gap=2.0)
    out = io.BytesIO()
    im.save(out, "JPEG", quality=quality, optimize=optimize, progressive=progressive)
    return out.getvalue()


def jpeg_size(image: Any, width: int) -> tuple[int, int]:
    """The size :func:`jpeg_bytes` gives ``image`` at ``width`` (the same scale rule)."""
    scale = min(1.0, width / image.width, 4 * width / image.height)
    if scale >= 1.0:
        return image.width, image.height
    return max(1, round(image.width * scale)), max(1, round(image.height * scale))
