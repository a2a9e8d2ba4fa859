"""Screenshots for the pages: decoded once, resized on demand, cached by media digest.

A route never serves a stored file's bytes. It serves a JPEG made from them here, so whatever a
hostile bundle stored under ``media/<hex>.png`` (HTML, SVG, PostScript, a PNG with a script
after it) reaches the browser only as pixels:

- the name must be a content-addressed media name (:func:`bundles.support.media_name_ok`),
  listed in the bundle's manifest, with a shown suffix (:func:`trainer_hooks.pages.shown_suffix`)
  and a size under :data:`trainer_hooks.pages.MAX_MEDIA_BYTES`; it is read through
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
transparency is flattened (:func:`trainer_hooks.pages.jpeg_bytes`).

``<cache>/thumbs/<hex[:2]>/<hex>.json`` records the image's size, ``<hex>.<width>.jpg`` each
picture made. A screenshot shared by a checkpoint and a dump (one digest) is decoded and resized
once.

What is cached under a digest is only what the server made from bytes it hashed itself and found
to be that digest: never what a manifest claims, and never an error. Why a picture cannot be
shown (its file is a symlink, a FIFO, missing, of another digest, not a PNG) is one bundle's
copy's problem, or the problem of bytes another bundle may hold sound: it is kept in memory for
that bundle only (:attr:`Pictures._failed`, keyed by the bundle's id and the media name, bounded)
and asked again by the next server. A hostile bundle in another run sharing this cache (same
HOME) whose ``media/<hex>.png`` is a FIFO cannot refuse a genuine bundle's screenshot of that
digest; an ``error`` entry an older release wrote is read as no entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bundles
from bundles import BundleError, MediaMissingError
from bundles.support import LIMITS, atomic_write, display, media_name_ok, read_at_most
from trainer_hooks.pages import MAX_MEDIA_BYTES, jpeg_bytes, shown_suffix
from trainer_hooks.serve._run import BundleEntry

__all__ = ["THUMB", "WIDTHS", "ImageInfo", "Pictures", "PixelBudget"]

THUMB = 320
LARGE = 1280
WIDTHS = (THUMB, LARGE, 1920)
QUALITY = {THUMB: 72, LARGE: 80, 1920: 85}
MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]
MAX_FAILED = 4096  # (bundle, media name) -> why it cannot be shown, kept in memory
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
        # (bundle id, media name) -> why that bundle's copy cannot be shown: never on disk, never
        # under the digest alone (another bundle's copy of the digest may be sound).
        self._failed: OrderedDict[tuple[str, str], str] = OrderedDict()

    def _failure(self, entry: BundleEntry, name: str) -> str | None:
        with self._guard:
            return self._failed.get((entry.id, name))

    def _fail(self, entry: BundleEntry, name: str, error: str) -> str:
        with self._guard:
            self._failed[(entry.id, name)] = error
            while len(self._failed) > MAX_FAILED:
                self._failed.popitem(last=False)
        return error

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
            return ImageInfo(name, size=(int(raw["w"]), int(raw["h"])))
        except (OSError, ValueError, TypeError, KeyError):  # absent, damaged, or an old error entry
            return None

    def info(self, entry: BundleEntry, name: str, budget: PixelBudget | None = None) -> ImageInfo:
        """The picture's size, decoding it (and writing its thumbnail) the first time, within
        ``budget`` (the page's; by default one of its own)."""
        why = self.check(entry, name)
        if why is not None:
            return ImageInfo(name, error=why)
        cached = self._cached_info(name)
        if cached is not None:
            return cached
        error = self._failure(entry, name) or self._make(entry, name, (THUMB,), budget or PixelBudget())
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
        err = self._failure(entry, name) or self._make(entry, name, (width,), PixelBudget())
        if err:
            return err
        try:
            return path.read_bytes()
        except OSError as e:
            return f"media/{name}: cannot read the picture: {e.strerror or e}"

    def _make(
        self, entry: BundleEntry, name: str, widths: tuple[int, ...], budget: PixelBudget
    ) -> str | None:
        """Read, verify, decode (within ``budget``) and cache ``name``'s pictures; why not
        (remembered for ``entry`` only, see the module's docstring), or None when made."""
        d, hexd = self._paths(name)
        with _DECODING, self._lock(hexd):  # at most DECODES_AT_ONCE pictures in memory, every page together
            todo = [w for w in widths if not (d / f"{hexd}.{w}.jpg").exists()]
            if not todo and self._cached_info(name) is not None:
                return None
            image, error, verified = self._decode(entry, name, budget)
            if image is None:
                error = error or f"media/{name}: cannot be shown"
                # Bytes of the digest that do not decode stay so: remembered (for this bundle).
                # A file missing, unsafe, cut short or of other bytes may be put right (a copy
                # still arriving): asked again next time, which costs one open or one bounded read.
                return self._fail(entry, name, error) if verified else error
            d.mkdir(parents=True, exist_ok=True)
            with image:  # bytes of this digest, hashed here: safe to share under it
                for w in todo:
                    atomic_write(d / f"{hexd}.{w}.jpg", _jpeg(image, w))
                atomic_write(d / f"{hexd}.json", json.dumps({"w": image.width, "h": image.height}).encode())
            return None

    def _decode(self, entry: BundleEntry, name: str, budget: PixelBudget) -> tuple[Any, str | None, bool]:
        """(the decoded image, None, True) from bytes whose sha256 is the digest ``name`` says,
        else (None, why not, whether the bytes were that digest's). A picture past what is left of
        ``budget`` is not drawn: the page's budget, not the picture's fault, so not remembered."""
        where = f"media/{name}"
        size = media_sizes(entry)[name]
        try:
            with entry.bundle.open_media(name) as f:
                data = read_at_most(f, size + 1)
        except MediaMissingError:
            return None, f"{where}: missing from the bundle", False
        except BundleError as e:
            return None, display(str(e), MAX_SHOWN_CHARS), False
        except OSError as e:
            return None, f"{where}: cannot read: {e.strerror or e}", False
        if len(data) != size:
            return None, f"{where}: size: expected {size} bytes, found {len(data)}", False
        if hashlib.sha256(data).hexdigest() != name.partition(".")[0]:
            return None, f"{where}: its bytes are not the digest it is stored under", False
        try:
            return bundles.decode_image(data, where=where, reserve=budget.take), None, True
        except OverBudget as e:
            return None, f"{where}: not drawn: {e}", False
        except BundleError as e:
            return (
                None,
                display(str(e).replace("<_io.BytesIO object", "<the stored bytes"), MAX_SHOWN_CHARS),
                True,
            )
