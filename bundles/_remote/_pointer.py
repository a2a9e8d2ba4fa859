"""The pointer object that publishes a bundle on a store, and where a bundle's objects live.

See :mod:`bundles._remote` for the protocol."""

from __future__ import annotations

import datetime
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bundles._errors import (
    BundleFormatError,
    BundleNotFoundError,
    UnsafeBundleError,
)
from bundles._layout import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    STORE_GENERATION_RE,
    STORE_MEDIA_POOL,
    STORE_POINTER_FORMAT,
    STORE_POINTER_NAME,
    STORE_POINTER_VERSION,
)
from bundles._limits import MAX_POINTER_BYTES
from bundles._store import ObjectNotFoundError, Store, StoreURL, get_store, naming, parallel

# Media above this size are uploaded in parts (a create-only put must be a single request, whose
# body obstore holds in memory); content addressing makes the plain overwrite of a part upload safe.
MULTIPART_THRESHOLD = 64 * 1024 * 1024
# Range reads of a media file or member are served from windows of at least this size.
READ_WINDOW = 8 * 1024 * 1024
_PUBLISH_ATTEMPTS = 16
# A key inside a generation: "<bundle key>/<generation>/<rest>".
_GEN_KEY_RE = re.compile(r"(?P<gen>(?:.+/)?g[0-9]{8}T[0-9]{12}Z-[0-9a-f]{12})/.+")


# -- the pointer ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pointer:
    """The parsed ``bundle.json``: which generation is the bundle and where its media are."""

    generation: str | None  # None: a plain layout (U/manifest.json, no pointer)
    manifest_size: int | None
    manifest_digest: str | None
    shared_media: bool
    etag: str | None = None

    def to_bytes(self) -> bytes:
        body = {
            "format": STORE_POINTER_FORMAT,
            "pointer_version": STORE_POINTER_VERSION,
            "generation": self.generation,
            "manifest": {"size": self.manifest_size, "digest": self.manifest_digest},
            "media": f"../{STORE_MEDIA_POOL}" if self.shared_media else MEDIA_DIR,
        }
        return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode()


def parse_pointer(data: bytes, where: str, etag: str | None = None) -> Pointer:
    """Check every field of an untrusted pointer; raise :class:`BundleFormatError` naming it."""
    if len(data) > MAX_POINTER_BYTES:
        raise UnsafeBundleError(f"{where}: {len(data)} bytes exceeds the pointer cap of {MAX_POINTER_BYTES}")
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BundleFormatError(f"{where}: not a JSON pointer: {e}") from None
    if not isinstance(body, dict) or body.get("format") != STORE_POINTER_FORMAT:
        raise BundleFormatError(f"{where}: format: expected {STORE_POINTER_FORMAT!r}")
    if body.get("pointer_version") != STORE_POINTER_VERSION:
        raise BundleFormatError(
            f"{where}: pointer_version: expected {STORE_POINTER_VERSION}, found {body.get('pointer_version')!r}"
        )
    gen = body.get("generation")
    if not isinstance(gen, str) or not STORE_GENERATION_RE.fullmatch(gen):
        raise BundleFormatError(f"{where}: generation: expected g<time>-<hex>, found {gen!r}")
    man = body.get("manifest")
    size = man.get("size") if isinstance(man, dict) else None
    digest = man.get("digest") if isinstance(man, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_MANIFEST_BYTES:
        raise BundleFormatError(f"{where}: manifest.size: expected 1..{MAX_MANIFEST_BYTES}, found {size!r}")
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise BundleFormatError(f"{where}: manifest.digest: expected sha256:<64 hex>, found {digest!r}")
    media = body.get("media")
    if media not in (MEDIA_DIR, f"../{STORE_MEDIA_POOL}"):
        # Only two places: a pointer can never send a reader elsewhere in the bucket.
        raise BundleFormatError(
            f"{where}: media: expected {MEDIA_DIR!r} or '../{STORE_MEDIA_POOL}', found {media!r}"
        )
    return Pointer(gen, size, digest, media != MEDIA_DIR, etag)


def _new_generation() -> str:
    return f"g{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(6)}"


@dataclass
class _BundlePrefix:
    """The prefix of one bundle on a store, with the pointer read there: where its objects lie
    (the generation the pointer names, its media under ``U/media`` or the pool beside ``U``)."""

    url: StoreURL
    store: Store
    pointer: Pointer

    @property
    def media_prefix(self) -> str:
        if self.pointer.shared_media:
            return self.url.parent.key_of(STORE_MEDIA_POOL)
        return self.url.key_of(MEDIA_DIR)

    def key(self, name: str) -> str:
        """The key of a bundle-relative name (``manifest.json``, ``samples/...``, ``media/...``)."""
        if name.startswith(MEDIA_DIR + "/"):
            return f"{self.media_prefix}/{name[len(MEDIA_DIR) + 1 :]}"
        if self.pointer.generation is None:
            return self.url.key_of(name)
        return self.url.key_of(f"{self.pointer.generation}/{name}")


def _read_pointer(store: Store, url: StoreURL) -> Pointer | None:
    """The bundle's pointer; a plain-layout pointer when only ``U/manifest.json`` exists; None
    when neither does."""
    try:
        # A GET's 404 body tells a missing bucket (BucketNotFoundError, raised) from a missing object.
        data, meta = store.get(url.key_of(STORE_POINTER_NAME), MAX_POINTER_BYTES, "pointer cap")
    except ObjectNotFoundError:
        if store.head(url.key_of(MANIFEST_NAME)) is not None:
            return Pointer(None, None, None, False)
        return None
    return parse_pointer(data, f"{url}/{STORE_POINTER_NAME}", meta.get("e_tag"))


def _bundle_prefix(url_text: str, storage_options: Mapping[str, Any] | None, what: str) -> _BundlePrefix:
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    with naming(url, what):
        pointer = _read_pointer(store, url)
    if pointer is None:
        raise BundleNotFoundError(f"{url}: no bundle here (no {STORE_POINTER_NAME} or {MANIFEST_NAME})")
    return _BundlePrefix(url, store, pointer)


def list_remote_bundles(
    prefix_text: str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, StoreURL]:
    """The bundles right under ``prefix`` (one level), by name: one delimited listing, then one
    pointer lookup per child, concurrently. Names that are not bundles (a shared pool, a dead
    writer's unpublished prefix, a generation) are left out."""
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    with naming(url, "list the bundles"):
        # A generation (the live one, or a dead writer's) holds a manifest.json, so it would pass
        # for a plain layout; it is part of the bundle above it, never a bundle of its own.
        names = [
            n
            for n in store.children(url.key)
            if n != STORE_MEDIA_POOL and not STORE_GENERATION_RE.fullmatch(n)
        ]
        found = parallel(lambda n: _safe_pointer(store, url.child(n)) is not None, names)
    return {n: url.child(n) for n, ok in zip(names, found, strict=True) if ok}


def _safe_pointer(store: Store, url: StoreURL) -> Pointer | None:
    try:
        return _read_pointer(store, url)
    except BundleFormatError:
        return None


def has_bundle_on_store(url_text: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    try:
        with naming(url, "look for a bundle"):
            return _read_pointer(store, url) is not None
    except BundleFormatError:
        return False
