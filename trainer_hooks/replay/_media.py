"""Where replay gets an image's bytes: :class:`MediaReader`, and the one decode path, :func:`load_image`.

A bundle may come from anyone (docs/RELIABILITY.md, "Untrusted input"). What a sample names as
an image is therefore resolved, never opened as given:

* **In a bundle** (``MediaReader(bundle)``): a ``MediaRef``, a path string or a PIL image's
  ``filename`` is accepted only when it names one of the bundle's *own* stored media files
  (the paths the reader set on its references, or ``<bundle>/media/<hex><suffix>``); the bytes
  are read through :meth:`bundles.Bundle.open_media` (a directory or a packed file read in place
  alike), at most the size the manifest lists. Anything else (an absolute path, a ``../`` path,
  ``/etc/passwd``, ``/dev/stdin``, a FIFO) is refused *without touching the filesystem*: no
  existence oracle, no hang, nothing outside the bundle in a report or a payload.
* **Outside files** only when the caller says so (``allow_outside=True``; ``rollout-bundle
  replay --allow-outside-media``; the trainer's own run media, where the paths are its own): opened
  with ``O_NONBLOCK`` and refused unless ``fstat`` says regular file, so a FIFO or a device
  neither hangs nor streams; read up to :data:`MAX_MEDIA_BYTES`.

Every image is then decoded by :func:`bundles.decode_image` (PNG or JPEG by magic, pixel count
bounded before a pixel is allocated) and converted to RGB as Miles converts it. Errors are
``ValueError``/``BundleError`` naming the sample index, the image index and what was found; the
reason a file could not be read is its own (``permission denied`` is not "missing").
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from bundles import Bundle, BundleError, MediaRef, decode_image

__all__ = ["MAX_MEDIA_BYTES", "MediaReader", "check_small_file", "load_image", "to_rgb"]

#: Largest media file replay reads (bytes): 1 GiB, far above any screenshot (a 4K PNG is ~25 MB).
MAX_MEDIA_BYTES = 1 << 30
_PIL_MODULE = "PIL.Image"


def _is_pil(item: Any) -> bool:
    import sys

    module = sys.modules.get(_PIL_MODULE)
    return module is not None and isinstance(item, module.Image)


def to_rgb(image: Any) -> Any:
    """``image`` in RGB, as Miles converts it (``image.convert("RGB")`` for every other mode)."""
    return image if image.mode == "RGB" else image.convert("RGB")


class MediaReader:
    """Resolve a sample's image items (``MediaRef``, path string, PIL image) to bytes.

    Args:
        bundle: the bundle the samples came from; only its stored media are read. None: no
            bundle (a trainer's own samples): paths are read as files (``allow_outside`` implied).
        allow_outside: also read files outside the bundle that a sample names (regular files only).
    """

    def __init__(self, bundle: Bundle | None = None, *, allow_outside: bool = False) -> None:
        self.bundle = bundle
        self.allow_outside = allow_outside or bundle is None
        self._own: dict[str, str] = {}
        if bundle is not None:
            prefix = os.path.join(str(bundle.path), "media")
            for ref in bundle.media:
                self._own[str(ref.path)] = ref.filename
                self._own[os.path.join(prefix, ref.filename)] = ref.filename
            self._sizes = {ref.filename: ref.size for ref in bundle.media}

    def _stored_name(self, item: Any) -> str | None:
        """The stored file name ``<hex><suffix>`` of ``item`` when it is one of the bundle's media."""
        if isinstance(item, MediaRef):
            path = item.path
            if path is None or self._own.get(str(path)) != item.filename:
                return None
            return item.filename
        path = _path_of(item)
        return None if path is None else self._own.get(path)

    def read(self, item: Any, where: str) -> bytes:
        """The bytes of ``item``; ``ValueError`` naming ``where`` when it may not or cannot be read."""
        if self.bundle is not None:
            name = self._stored_name(item)
            if name is not None:
                return self._read_stored(name, where)
        path = _path_of(item)
        if path is None:
            raise ValueError(
                f"{where}: expected a media reference, a path or a PIL image, found {type(item).__name__}"
            )
        if not self.allow_outside:
            raise ValueError(
                f"{where}: {_short(path)} is not a media file stored in the bundle; replay reads only the "
                "bundle's own media (pass --allow-outside-media to read files a sample names)"
            )
        return _read_outside(path, where)

    def _read_stored(self, name: str, where: str) -> bytes:
        assert self.bundle is not None
        size = self._sizes[name]
        if size > MAX_MEDIA_BYTES:
            raise ValueError(f"{where}: media/{name}: {size} bytes, over the {MAX_MEDIA_BYTES}-byte limit")
        try:
            with self.bundle.open_media(name) as f:
                data = f.read(size + 1)
        except BundleError as e:
            raise ValueError(f"{where}: media/{name}: {_reason(e)}") from None
        except OSError as e:
            raise ValueError(f"{where}: media/{name}: cannot read: {_reason(e)}") from None
        if len(data) != size:
            raise ValueError(
                f"{where}: media/{name}: expected {size} bytes as the manifest lists, found {len(data)}"
            )
        return bytes(data)

    def image(self, item: Any, where: str) -> Any:
        """``item`` as a decoded RGB PIL image (see :func:`load_image`). Without a bundle a PIL
        image in memory is the caller's own and is used as it is; from a bundle, even a PIL image
        is decoded again from the stored bytes its ``filename`` names."""
        if self.bundle is None and _is_pil(item):
            return to_rgb(item)
        return to_rgb(load_image(self.read(item, where), where))


def load_image(data: bytes, where: str) -> Any:
    """Decode image bytes through :func:`bundles.decode_image` (PNG/JPEG only, size bounded)."""
    return decode_image(data, where=where)


def _path_of(item: Any) -> str | None:
    if isinstance(item, MediaRef):
        return None if item.path is None else str(item.path)
    if isinstance(item, (str, os.PathLike)):
        try:
            return os.fspath(item)
        except TypeError:
            return None
    if _is_pil(item):
        filename = getattr(item, "filename", None)
        return filename if isinstance(filename, str) and filename else None
    return None


def _short(path: str, limit: int = 200) -> str:
    text = repr(path)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and not isinstance(e, BundleError):
        if e.errno == errno.EACCES or e.errno == errno.EPERM:
            return "permission denied"
        if e.errno == errno.ENOENT:
            return "not found"
        return e.strerror or str(e)
    return str(e)


def check_small_file(fd: int, label: str, limit: int, *, note: str = "", limit_of: str = "") -> None:
    """Refuse, naming ``label``, what ``fd`` (opened with ``O_NONBLOCK``, so the open itself never
    hangs) holds unless ``fstat`` says a regular file of at most ``limit`` bytes: a FIFO, a device
    or a directory is never read, nor a file too large to hold. ``note`` follows the first message,
    ``limit_of`` the second."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{label}: not a regular file{note}")
    if st.st_size > limit:
        raise ValueError(f"{label}: {st.st_size} bytes, over the {limit}-byte limit{limit_of}")


def _read_outside(path: str, where: str) -> bytes:
    """A regular file named by a sample, with the caller's leave: never blocks, never streams."""
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ValueError(f"{where}: {_short(path)}: {_reason(e)}") from None
    try:
        check_small_file(
            fd, f"{where}: {_short(path)}", MAX_MEDIA_BYTES, note="; only regular files are read"
        )
        chunks, left = [], MAX_MEDIA_BYTES + 1
        while left > 0:
            try:
                chunk = os.read(fd, min(left, 1 << 20))
            except OSError as e:
                raise ValueError(f"{where}: {_short(path)}: cannot read: {_reason(e)}") from None
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_MEDIA_BYTES:
            raise ValueError(f"{where}: {_short(path)}: over the {MAX_MEDIA_BYTES}-byte limit")
        return data
    finally:
        os.close(fd)
