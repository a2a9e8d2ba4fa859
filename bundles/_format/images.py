"""PIL images in samples: stored losslessly as PNG media files, read back as PIL images, lazily.

Writing: a ``PIL.Image.Image`` anywhere in a sample is encoded as PNG (``compress_level=1``:
PNG is lossless at every level, and level 1 is several times faster than the default) and stored
as a media file like any other, named by its digest; the sample holds an image reference
(extension type ``EXT_IMAGE``, docs/FORMAT.md). Only the modes PNG holds exactly are accepted
(:data:`PNG_MODES`); an image of another mode (``CMYK``, ``F``, ``I``, …) or with several frames is
refused naming the key path, rather than stored changed.

Reading: an image reference becomes ``PIL.Image.open`` of the stored file, which reads the header
only; pixels are decoded on first access. The file is not held open in between (a dump of
thousands of screenshots would otherwise hold thousands of descriptors): the image reads through
:class:`ReopeningFile`, which closes the file after the header and opens it again when Pillow
reads pixels; Pillow drops it after loading. ``image.filename`` is the stored file's path. When
Pillow is not installed, an image reference is returned as a :class:`~bundles.MediaRef`.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

from bundles._format.limits import MAX_DECODE_PIXELS

__all__ = [
    "DECODABLE_IMAGE_FORMATS",
    "MAX_DECODE_PIXELS",
    "PNG_MODES",
    "decode_image",
    "open_image",
    "pil_image_class",
    "png_bytes",
]

#: Image modes Pillow writes to PNG and reads back unchanged.
PNG_MODES = frozenset({"1", "L", "LA", "I;16", "I;16B", "P", "RGB", "RGBA"})


#: The only image formats decoded from a bundle's bytes (Pillow names): a bundle may come from
#: anyone, and Pillow opens dozens of formats (EPS runs Ghostscript). PNG is what the format
#: stores; JPEG is what screenshot pipelines commonly write.
DECODABLE_IMAGE_FORMATS = ("PNG", "JPEG")
#: Largest image :func:`decode_image` decodes by default: 16384 x 16384 (a 4K screenshot has 8.3 M).

_MAGIC = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}


def _decodable_format(data: bytes, where: str) -> str:
    """The format ``data``'s magic bytes name, one of :data:`DECODABLE_IMAGE_FORMATS`; any other
    start is refused."""
    from bundles._errors import BundleFormatError

    fmt = next((name for magic, name in _MAGIC.items() if bytes(data[: len(magic)]) == magic), None)
    if fmt is None:
        head = bytes(data[:8])
        raise BundleFormatError(
            f"{where}: not a {' or '.join(DECODABLE_IMAGE_FORMATS)} image (starts with {head!r}); "
            "no other format is decoded from a bundle"
        )
    return fmt


def decode_image(
    data: bytes,
    *,
    where: str,
    max_pixels: int = MAX_DECODE_PIXELS,
    reserve: Callable[[int, int], None] | None = None,
) -> Any:
    """Decode untrusted image bytes: only :data:`DECODABLE_IMAGE_FORMATS`, at most ``max_pixels``.

    The one decoder of images taken from a bundle for display or processing (view's thumbnails,
    replay's rebuild). The format is told by its magic bytes *and* Pillow is told to try only
    that format, so a file holding PostScript, SVG or anything else is never handed to another
    decoder; the size is checked from the header before a pixel is allocated. Returns the
    loaded ``PIL.Image.Image`` (mode as stored). Raises :class:`~bundles.BundleFormatError`
    naming ``where`` and what was found; :class:`~bundles.BundleError` when Pillow is missing.

    ``reserve(width, height)``, when given, is called with the header's size once it is within
    ``max_pixels`` and before a pixel is allocated: a caller spending a budget over several images
    (a page's pictures) takes its share there, or raises to decode nothing (its exception
    propagates unchanged, so it should not be an ``OSError`` or ``ValueError``).
    """
    from bundles._errors import BundleError, BundleFormatError

    try:
        import warnings

        from PIL import Image
    except ImportError:
        raise BundleError(f"{where}: decoding images needs Pillow: pip install pillow") from None
    fmt = _decodable_format(data, where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[fmt])
            width, height = image.size
            if width <= 0 or height <= 0 or width * height > max_pixels:
                raise BundleFormatError(
                    f"{where}: {fmt} image of {width}x{height} pixels exceeds the decode limit of "
                    f"{max_pixels} pixels"
                )
            if reserve is not None:
                reserve(width, height)
            image.load()
    except BundleFormatError:
        raise
    except (
        OSError,
        ValueError,
        SyntaxError,
        EOFError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
        MemoryError,
    ) as e:
        raise BundleFormatError(f"{where}: cannot decode as {fmt}: {e}") from None
    return image


def pil_image_class() -> type | None:
    """``PIL.Image.Image`` if PIL was imported (an image cannot exist otherwise), else None."""
    module = sys.modules.get("PIL.Image")
    return None if module is None else module.Image


def png_bytes(image: Any, where: str) -> bytes:
    """The PNG encoding of ``image``; ``ValueError`` naming ``where`` when PNG cannot hold it exactly."""
    if image.mode not in PNG_MODES:
        raise ValueError(
            f"{where}: PIL image of mode {image.mode!r} cannot be stored losslessly as PNG (modes "
            f"{', '.join(sorted(PNG_MODES))}); convert it first"
        )
    if getattr(image, "n_frames", 1) != 1:
        raise ValueError(
            f"{where}: PIL image with {image.n_frames} frames: only single-frame images are stored"
        )
    buf = io.BytesIO()
    try:
        image.save(buf, format="PNG", compress_level=1)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: PIL image (mode {image.mode}) cannot be written as PNG: {e}") from None
    return buf.getvalue()


class ReopeningFile(io.RawIOBase):
    """A read-only file that holds no descriptor between uses: opened on the first read or seek
    after :meth:`suspend`, at the position it had."""

    def __init__(self, path: str, opener: Callable[[], BinaryIO] | None = None) -> None:
        super().__init__()
        self.name = path
        self._pos = 0
        self._f: Any = None
        # How the file is (re)opened: a bundle directory's member is opened as every member is
        # (``DirSource.open``: no symlink on the way, regular files only), never by a plain open.
        self._opener = opener

    def _file(self) -> Any:
        if self._f is None:
            self._f = self._opener() if self._opener is not None else open(self.name, "rb")  # noqa: SIM115
            self._f.seek(self._pos)
        return self._f

    def open_now(self) -> None:
        """Open the file now (its opener's errors are raised here, not at the first read)."""
        self._file()

    def suspend(self) -> None:
        if self._f is not None:
            self._pos = self._f.tell()
            self._f.close()
            self._f = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return int(self._file().readinto(b))

    def read(self, size: int = -1) -> bytes:
        return bytes(self._file().read(size))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return int(self._file().seek(offset, whence))

    def tell(self) -> int:
        return self._pos if self._f is None else int(self._f.tell())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        super().close()


def open_image(path: str, member: BinaryIO | None = None) -> Any:
    """``PIL.Image.open`` of a stored PNG, header read, no descriptor kept; None without Pillow.

    ``member`` is the file to read where ``path`` is not a file (a member of a packed bundle read
    in place, see ``PackedSource.open_detached``): the image reads its header now and its pixels
    by range when they are needed, so an image costs no copy of its file however many times a
    sample references it. ``OSError``/``ValueError`` when the file is not an image Pillow reads."""
    try:
        from PIL import Image
    except ImportError:
        if member is not None:
            member.close()
        return None
    if member is not None:
        image = Image.open(member, formats=["PNG"])
        if isinstance(member, ReopeningFile):
            member.suspend()  # a directory's file: no descriptor kept between uses
        image.filename = path
        return image
    f = ReopeningFile(path)
    image = Image.open(f, formats=["PNG"])  # type: ignore[arg-type]  # a binary file object
    f.suspend()
    # Pillow names images opened from a path only; PNG pixels go through its zlib decoder, never
    # a memory map of ``filename``, so naming the stored file is all this does.
    image.filename = path
    return image
