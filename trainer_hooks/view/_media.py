"""The screenshots a page shows: each stored file read once, decoded only as PNG or JPEG.

A bundle may come from anyone, and its media files are its least trusted part: a file stored as
``media/<hex>.png`` may hold PostScript (which Pillow would hand to Ghostscript), and a file
stored as ``media/<hex>.html`` may hold a valid PNG followed by a ``<script>`` that a browser
would run if the page linked to it. So:

- Only files whose stored suffix is in :data:`trainer_hooks.pages.SHOWN_SUFFIXES` are read at
  all (:func:`trainer_hooks.pages.shown_suffix`, which says why); any other is shown as a named
  placeholder, never decoded, never linked.
- The bytes are decoded by :func:`bundles.decode_image`, the project's one decoder of untrusted
  images: PNG or JPEG told by magic bytes, the pixel count bounded before anything is allocated.
- Each distinct stored file (one digest) is read once per page, however many turns, samples or
  views show it, and its size is bounded (:data:`trainer_hooks.pages.MAX_MEDIA_BYTES`) before it is read: a packed
  bundle whose one 8 MiB screenshot is referenced 150 times costs one 8 MiB read here. Its
  pictures (a small thumbnail; a large view when the page inlines one) are made in that one
  pass and the bytes are dropped before the next file is read by that worker.

A file that cannot be shown (missing, unreadable, another format, undecodable, too large) gets an
``error`` naming it; the page draws a placeholder with that text and the CLI warns once.
"""

from __future__ import annotations

import base64
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
from trainer_hooks.pages import MAX_MEDIA_BYTES, SHOWN_SUFFIXES, jpeg_bytes, jpeg_size, shown_suffix

__all__ = ["Picture", "Shown", "pictures"]

THUMB_QUALITY = 72
LARGE_QUALITY = 80
WORKERS = max(1, min(4, os.cpu_count() or 1))


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


def _jpeg(image: Any, width: int, quality: int, progressive: bool) -> Picture:
    data = jpeg_bytes(image, width, quality=quality, optimize=True, progressive=progressive)
    uri = "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
    w, h = jpeg_size(image, width)
    return Picture(uri, w, h, len(uri))


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
