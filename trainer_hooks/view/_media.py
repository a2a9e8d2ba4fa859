"""The screenshots a page shows: each stored file read once, decoded only as PNG or JPEG.

A bundle may come from anyone, and its media files are its least trusted part: a file stored as
``media/<hex>.png`` may hold PostScript (which Pillow would hand to Ghostscript), and a file
stored as ``media/<hex>.html`` may hold a valid PNG followed by a ``<script>`` that a browser
would run if the page linked to it. So:

- Only files whose stored suffix is in :data:`SHOWN_SUFFIXES` are read at all; any other is
  shown as a named placeholder, never decoded, never linked (a browser decides how to render a
  linked file by its suffix, so ``.svg``, ``.html``, ``.xhtml``... must never be a link target).
- The bytes are decoded by :func:`bundles.decode_image`, the project's one decoder of untrusted
  images: PNG or JPEG told by magic bytes, the pixel count bounded before anything is allocated.
- Each distinct stored file (one digest) is read once per page, however many turns, samples or
  views show it, and its size is bounded (:data:`MAX_MEDIA_BYTES`) before it is read: a packed
  bundle whose one 8 MiB screenshot is referenced 150 times costs one 8 MiB read here. Its
  pictures (a small thumbnail; a large view when the page inlines one) are made in that one
  pass and the bytes are dropped before the next file is read by that worker.

A file that cannot be shown (missing, unreadable, another format, undecodable, too large) gets an
``error`` naming it; the page draws a placeholder with that text and the CLI warns once.
"""

from __future__ import annotations

import base64
import io
import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import bundles
from bundles import Bundle, BundleError, MediaMissingError
from bundles.support import Progress, read_at_most

__all__ = ["MAX_MEDIA_BYTES", "SHOWN_SUFFIXES", "Picture", "Shown", "pictures", "shown_suffix"]

#: Stored suffixes a page shows and links to: raster formats every browser renders as an image.
SHOWN_SUFFIXES = (".png", ".jpg", ".jpeg")
#: Largest stored file read for a picture (a 4K PNG screenshot is 5-25 MiB).
MAX_MEDIA_BYTES = 64 * 2**20
THUMB_QUALITY = 72
LARGE_QUALITY = 80
WORKERS = max(1, min(4, os.cpu_count() or 1))


def shown_suffix(name: str) -> bool:
    """True when the stored file ``name`` may be decoded and linked: its suffix is a raster
    image's (case-insensitive), never one a browser renders as a document."""
    return os.path.splitext(name)[1].lower() in SHOWN_SUFFIXES


@dataclass
class Picture:
    uri: str  # data:image/jpeg;base64,...
    width: int
    height: int
    bytes: int  # length of the uri


@dataclass
class Shown:
    """What a page knows of one stored media file."""

    name: str
    size: tuple[int, int] | None = None  # the stored image's width and height
    thumb: Picture | None = None
    large: Picture | None = None  # inlined large view, when the page inlines one
    linkable: bool = False  # a .png/.jpg/.jpeg file that decoded: the page may link to it
    error: str | None = None  # why it is not shown


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


def _jpeg(image: Any, width: int, quality: int, progressive: bool) -> Picture:
    data = jpeg_bytes(image, width, quality=quality, optimize=True, progressive=progressive)
    uri = "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
    w, h = _jpeg_size(image, width)
    return Picture(uri, w, h, len(uri))


def _jpeg_size(image: Any, width: int) -> tuple[int, int]:
    """The size :func:`jpeg_bytes` gives ``image`` at ``width`` (the same scale rule)."""
    scale = min(1.0, width / image.width, 4 * width / image.height)
    if scale >= 1.0:
        return image.width, image.height
    return max(1, round(image.width * scale)), max(1, round(image.height * scale))


def _read(bundle: Bundle, name: str, size: int) -> bytes:
    """The stored bytes of ``name``, at most ``size`` (its manifest size) + 1 read."""
    with bundle.open_media(name) as f:  # a directory's file, or a packed file's member (pread)
        return read_at_most(f, size + 1)


def _one(bundle: Bundle, name: str, size: int, thumb_width: int, large: Callable[[], int | None],
         spent: Callable[[int], None]) -> Shown:  # fmt: skip
    where = f"media/{name}"
    if not shown_suffix(name):
        return Shown(name, error=f"{where}: not shown: stored as {os.path.splitext(name)[1] or 'no suffix'!s}, "
                     f"only {'/'.join(SHOWN_SUFFIXES)} files are shown")  # fmt: skip
    if size > MAX_MEDIA_BYTES:
        return Shown(name, error=f"{where}: not shown: {size} bytes, over the {MAX_MEDIA_BYTES} bytes shown")
    try:
        data = _read(bundle, name, size)
    except MediaMissingError:
        return Shown(name, error=f"{where}: missing from the bundle")
    except (OSError, BundleError) as e:
        why = e.strerror if isinstance(e, OSError) and not isinstance(e, BundleError) and e.strerror else e
        return Shown(name, error=f"{where}: cannot read: {why}")
    if len(data) != size:
        return Shown(name, error=f"{where}: size: expected {size} bytes, found {len(data)}")
    try:
        image = bundles.decode_image(data, where=where)
    except BundleError as e:
        # Pillow names the in-memory file by its address; the page names the stored file.
        return Shown(name, error=re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "the stored bytes", str(e)))
    del data
    with image:
        shown = Shown(name, size=image.size, linkable=True)
        # Thumbnails are baseline JPEGs: a page decodes hundreds at load, and baseline decodes
        # faster; a large view is decoded when opened and is progressive (smaller).
        shown.thumb = _jpeg(image, thumb_width, THUMB_QUALITY, progressive=False)
        large_width = large()
        if large_width is not None:
            shown.large = _jpeg(image, large_width, LARGE_QUALITY, progressive=True)
            spent(shown.large.bytes)
    return shown


def pictures(
    bundle: Bundle,
    names: Sequence[str],
    *,
    thumb_width: int,
    large_width: int = 0,
    large_budget: int = 0,
    progress: bool | None = None,
) -> dict[str, Shown]:
    """What the page shows of each stored file in ``names`` (each distinct file read once).

    Each gets a thumbnail ``thumb_width`` wide; large views ``large_width`` wide are inlined too
    while their total stays within ``large_budget`` bytes (of data URI), in the order of
    ``names`` (the workers may overshoot it by the few views already being encoded).
    """
    sizes = {ref.filename: ref.size for ref in bundle.media}
    out: dict[str, Shown] = {}
    lock = threading.Lock()
    left = [large_budget]

    def large() -> int | None:
        with lock:
            return large_width if large_width > 0 and left[0] > 0 else None

    def spent(n: int) -> None:
        with lock:
            left[0] -= n

    def one(name: str) -> Shown:
        if name not in sizes:
            return Shown(name, error=f"media/{name}: not a media file of this bundle")
        return _one(bundle, name, sizes[name], thumb_width, large, spent)

    unique = list(dict.fromkeys(names))
    with (
        Progress("screenshots", total=len(unique), unit="images", enabled=progress) as bar,
        ThreadPoolExecutor(WORKERS) as pool,
    ):
        for name, shown in zip(unique, pool.map(one, unique), strict=True):
            out[name] = shown
            bar.advance()
    return out
