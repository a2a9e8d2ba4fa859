"""Media references and the hashing they rely on."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from bundles._errors import BundleError, MediaMissingError
from bundles._format.layout import DIGEST_PREFIX, DIGEST_RE, HEX_DIGEST_RE, SUFFIX_RE

# Small enough to stay in cache between read and hash (measured: 256 KiB beats 4 MiB by ~20 %).
HASH_CHUNK = 256 * 1024
_buffers = threading.local()


@dataclass(frozen=True)
class MediaRef:
    """A reference to one media file by content.

    ``digest`` is ``"sha256:<64 lowercase hex>"``, ``size`` the file's length in bytes and
    ``suffix`` its extension (``".png"``). ``path`` locates the bytes on this machine; it is
    not stored in a bundle: a bundle rewrites it on write and sets it on open.
    """

    digest: str
    size: int
    suffix: str
    path: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.digest, str) or not DIGEST_RE.fullmatch(self.digest):
            raise BundleError(f"MediaRef.digest: expected 'sha256:<64 lowercase hex>', found {self.digest!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise BundleError(f"MediaRef.size: expected a non-negative int, found {self.size!r}")
        if not isinstance(self.suffix, str) or not SUFFIX_RE.fullmatch(self.suffix):
            raise BundleError(f"MediaRef.suffix: expected e.g. '.png', found {self.suffix!r}")
        if self.path is not None and not isinstance(self.path, str):
            object.__setattr__(self, "path", os.fspath(self.path))

    @property
    def hexdigest(self) -> str:
        return self.digest[len(DIGEST_PREFIX) :]

    @property
    def filename(self) -> str:
        """The content-addressed file name, ``<hex><suffix>``, used in bundles and run media dirs."""
        return self.hexdigest + self.suffix

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> MediaRef:
        """Hash ``path`` and return a reference to it (with ``path`` set to its absolute path)."""
        p = Path(path)
        try:
            hexdigest, size = sha256_file(p)
        except FileNotFoundError:
            raise MediaMissingError(f"{p}: media file not found") from None
        return cls(DIGEST_PREFIX + hexdigest, size, media_suffix(p.name), str(p.absolute()))

    @classmethod
    def from_bytes(
        cls, data: bytes, suffix: str = ".png", path: str | os.PathLike[str] | None = None
    ) -> MediaRef:
        """The reference of ``data`` (e.g. encoded PNG bytes) that would be stored as ``<hex><suffix>``."""
        return cls(sha256_bytes(data), len(data), suffix, None if path is None else os.fspath(path))

    def with_path(self, path: str | os.PathLike[str] | None) -> MediaRef:
        return MediaRef(self.digest, self.size, self.suffix, None if path is None else os.fspath(path))


def trusted_ref(digest: str, size: int, suffix: str) -> MediaRef:
    """A :class:`MediaRef` of values already validated (a digest from :func:`digest_from_name` or
    a hash, a suffix from :func:`media_suffix` or a MediaRef, a size from ``stat``), without
    validating them again: the writer makes one per stored file on its hot path."""
    ref = object.__new__(MediaRef)
    object.__setattr__(ref, "digest", digest)
    object.__setattr__(ref, "size", size)
    object.__setattr__(ref, "suffix", suffix)
    object.__setattr__(ref, "path", None)
    return ref


def media_suffix(name: str) -> str:
    """The suffix a media file keeps in content-addressed storage: its last extension, if sane."""
    suffix = os.path.splitext(name)[1]
    return suffix if SUFFIX_RE.fullmatch(suffix) else ""


def digest_from_name(name: str) -> str | None:
    """``"sha256:<hex>"`` when ``name`` is ``<64 lowercase hex><suffix>``, as content-addressed stores
    name files; otherwise None."""
    stem = name.split(".", 1)[0]
    if len(stem) == 64 and HEX_DIGEST_RE.fullmatch(stem):
        return DIGEST_PREFIX + stem
    return None


def sha256_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Hex sha256 and size of a file, read in large chunks with the GIL released by hashlib."""
    with open(path, "rb", buffering=0) as f:
        return sha256_stream(f)


def sha256_stream(f: BinaryIO | io.RawIOBase) -> tuple[str, int]:
    """Hex sha256 and size of what ``f.readinto`` gives until it returns 0 (a file, or a member
    of a packed bundle)."""
    h = hashlib.sha256()
    size = 0
    buf: bytearray | None = getattr(_buffers, "hash", None)
    if buf is None:
        buf = _buffers.hash = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    while True:
        n = f.readinto(buf)  # type: ignore[union-attr]
        if not n:
            break
        h.update(view[:n])
        size += n
    return h.hexdigest(), size


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
