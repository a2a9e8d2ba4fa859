"""Screenshots for the pages: decoded once, resized on demand, cached by media digest.

A route never serves a stored file's bytes. It serves a JPEG made from them here, so whatever a
hostile bundle stored under ``media/<hex>.png`` (HTML, SVG, PostScript, a PNG with a script
after it) reaches the browser only as pixels:

- the name must be a content-addressed media name (:func:`bundles.support.media_name_ok`),
  listed in the bundle's manifest, with a shown suffix (:func:`trainer_hooks.view.shown_suffix`)
  and a size under :data:`trainer_hooks.view.MAX_MEDIA_BYTES`; it is read through
  :meth:`bundles.Bundle.open_media` (a file, a packed member or a store object by range), at
  most its listed size + 1 bytes;
- its sha256 must be the digest it is listed under: the cache is keyed by digest and shared by
  every bundle of every run, so a bundle lying about a digest must not plant its picture under
  another bundle's screenshot;
- the bytes are decoded by :func:`bundles.decode_image` (PNG/JPEG by magic bytes, pixels
  bounded before allocation) and re-encoded as JPEG at one of :data:`WIDTHS`.

Cost: a page decodes its pictures within one :class:`PixelBudget` (``MAX_PAGE_PIXELS`` of
``bundles.support.LIMITS``, all its pictures together, taken from each header before a pixel is
allocated); a picture past what is left is named on the page ("not drawn"), never decoded, and
that refusal is not cached (another page, with budget left, draws it). At most
:data:`DECODES_AT_ONCE` pictures are decoded at once, whatever the number of requests. A picture already made is
read from the cache and costs nothing. A large picture is reduced by an integer factor before its
transparency is flattened (:func:`trainer_hooks.view.jpeg_bytes`).

``<cache>/thumbs/<hex[:2]>/<hex>.json`` records the image's size (or why it cannot be shown),
``<hex>.<width>.jpg`` each picture made. A screenshot shared by a checkpoint and a dump (one
digest) is decoded and resized once.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bundles
from bundles import BundleError, MediaMissingError
from bundles.support import LIMITS, atomic_write, media_name_ok, read_at_most
from trainer_hooks.serve._run import BundleEntry
from trainer_hooks.view import MAX_MEDIA_BYTES, jpeg_bytes, shown_suffix

__all__ = ["THUMB", "WIDTHS", "ImageInfo", "Pictures", "PixelBudget"]

THUMB = 320
LARGE = 1280
WIDTHS = (THUMB, LARGE, 1920)
QUALITY = {THUMB: 72, LARGE: 80, 1920: 85}
#: Pictures decoded at once, by every page and picture request together: each within its page's
#: budget, so the server's pixels in memory are bounded by this many budgets, whatever the number
#: of requests (forty at once are forty page threads).
DECODES_AT_ONCE = 2
_DECODING = threading.BoundedSemaphore(DECODES_AT_ONCE)


class OverBudget(Exception):
    """A picture's pixels are past what is left of its page's :class:`PixelBudget`."""


class PixelBudget:
    """Pixels one page may decode, all its pictures together (thread-safe: a page's pictures are
    decoded by a few threads)."""

    def __init__(self, pixels: int | None = None) -> None:
        self.total = LIMITS["MAX_PAGE_PIXELS"] if pixels is None else pixels
        self.left = self.total
        self._lock = threading.Lock()

    def take(self, width: int, height: int) -> None:
        """Take ``width * height`` pixels, or raise :class:`OverBudget` taking nothing."""
        with self._lock:
            if width * height > self.left:
                raise OverBudget(f"{width}×{height} pixels, past this page's budget of {self.total} pixels")
            self.left -= width * height


@dataclass
class ImageInfo:
    name: str
    size: tuple[int, int] | None = None
    error: str | None = None

    def thumb_size(self, width: int = THUMB) -> tuple[int, int]:
        assert self.size is not None
        w, h = self.size
        scale = min(1.0, width / w, 4 * width / h)
        return (max(1, round(w * scale)), max(1, round(h * scale))) if scale < 1.0 else (w, h)


def media_sizes(entry: BundleEntry) -> dict[str, int]:
    sizes: dict[str, int] | None = entry.extra.get("media_sizes")
    if sizes is None:
        sizes = entry.extra["media_sizes"] = {r.filename: r.size for r in entry.bundle.media}
    return sizes


def _jpeg(image: Any, width: int) -> bytes:
    return jpeg_bytes(
        image, width, quality=QUALITY.get(width, 80), optimize=width <= THUMB, progressive=width > THUMB
    )


class Pictures:
    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(cache_dir) / "thumbs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, hexd: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(hexd, threading.Lock())

    def _paths(self, name: str) -> tuple[Path, str]:
        hexd = name.partition(".")[0]
        return self.dir / hexd[:2], hexd

    def check(self, entry: BundleEntry, name: str) -> str | None:
        """Why ``name`` is not a picture this bundle may show (None when it may be)."""
        if not media_name_ok(name):
            return "not a media name"
        size = media_sizes(entry).get(name)
        if size is None:
            return f"media/{name}: not a media file of this bundle"
        if not shown_suffix(name):
            suffix = os.path.splitext(name)[1] or "no suffix"
            return f"media/{name}: not shown: stored as {suffix}, only .png/.jpg/.jpeg files are shown"
        if size > MAX_MEDIA_BYTES:
            return f"media/{name}: not shown: {size} bytes, over the {MAX_MEDIA_BYTES} bytes shown"
        return None

    def _cached_info(self, name: str) -> ImageInfo | None:
        d, hexd = self._paths(name)
        try:
            raw = json.loads((d / f"{hexd}.json").read_text())
        except (OSError, ValueError):
            return None
        if raw.get("error"):
            return ImageInfo(name, error=str(raw["error"]))
        return ImageInfo(name, size=(int(raw["w"]), int(raw["h"])))

    def info(self, entry: BundleEntry, name: str, budget: PixelBudget | None = None) -> ImageInfo:
        """The picture's size, decoding it (and writing its thumbnail) the first time, within
        ``budget`` (the page's; by default one of its own)."""
        why = self.check(entry, name)
        if why is not None:
            return ImageInfo(name, error=why)
        cached = self._cached_info(name)
        if cached is not None:
            return cached
        error = self._make(entry, name, (THUMB,), budget or PixelBudget())
        if error is not None:
            return ImageInfo(name, error=error)
        return self._cached_info(name) or ImageInfo(name, error=f"media/{name}: cannot be shown")

    def jpeg(self, entry: BundleEntry, name: str, width: int) -> bytes | str:
        """The JPEG of ``name`` at ``width`` (one of :data:`WIDTHS`), or why there is none."""
        if width not in WIDTHS:
            return f"width: expected one of {WIDTHS}, found {width}"
        why = self.check(entry, name)
        if why is not None:
            return why
        d, hexd = self._paths(name)
        path = d / f"{hexd}.{width}.jpg"
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        info = self._cached_info(name)
        if info is not None and info.error:
            return info.error
        err = self._make(entry, name, (width,), PixelBudget())
        if err:
            return err
        try:
            return path.read_bytes()
        except OSError as e:
            return f"media/{name}: cannot read the picture: {e.strerror or e}"

    def _make(
        self, entry: BundleEntry, name: str, widths: tuple[int, ...], budget: PixelBudget
    ) -> str | None:
        d, hexd = self._paths(name)
        where = f"media/{name}"
        with _DECODING, self._lock(hexd):  # at most DECODES_AT_ONCE pictures in memory, every page together
            todo = [w for w in widths if not (d / f"{hexd}.{w}.jpg").exists()]
            if not todo and self._cached_info(name) is not None:
                return None
            size = media_sizes(entry)[name]
            error: str | None = None
            image = None
            try:
                with entry.bundle.open_media(name) as f:
                    data = read_at_most(f, size + 1)
                if len(data) != size:
                    error = f"{where}: size: expected {size} bytes, found {len(data)}"
                elif hashlib.sha256(data).hexdigest() != hexd:
                    error = f"{where}: its bytes are not the digest it is stored under"
                else:
                    image = bundles.decode_image(data, where=where, reserve=budget.take)
            except OverBudget as e:
                return f"{where}: not drawn: {e}"  # this page's budget, not the picture's fault: not cached
            except MediaMissingError:
                return f"{where}: missing from the bundle"  # this copy's problem: not cached
            except BundleError as e:
                error = str(e).replace("<_io.BytesIO object", "<the stored bytes")
            except OSError as e:
                return f"{where}: cannot read: {e.strerror or e}"
            d.mkdir(parents=True, exist_ok=True)
            if error is not None and image is None and ("digest it is stored" in error or "size:" in error):
                return error  # another copy of this digest may be sound: nothing cached
            if error is not None:
                atomic_write(d / f"{hexd}.json", json.dumps({"error": error}).encode())
                return error
            assert image is not None
            with image:
                for w in todo:
                    atomic_write(d / f"{hexd}.{w}.jpg", _jpeg(image, w))
                atomic_write(d / f"{hexd}.json", json.dumps({"w": image.width, "h": image.height}).encode())
            return None
