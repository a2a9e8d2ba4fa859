"""The pointer object that publishes a bundle on a store, and where a bundle's objects live.

See :mod:`bundles._store` for the protocol."""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bundles._errors import (
    BundleFormatError,
    BundleNotFoundError,
    ObjectNotFoundError,
    UnsafeBundleError,
)
from bundles._format.layout import (
    DIGEST_PREFIX,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    STORE_GENERATION_RE,
    STORE_MEDIA_POOL,
    STORE_POINTER_FORMAT,
    STORE_POINTER_NAME,
    STORE_POINTER_VERSION,
)
from bundles._format.limits import MAX_POINTER_BYTES
from bundles._local.proof import NotProven, Proof, claims_format, judge_manifest
from bundles._store.client import Store, get_store, naming, parallel
from bundles._urls import StoreURL

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


def _bundle_prefix(
    url_text: str, storage_options: Mapping[str, Any] | None, what: str, store: Store | None = None
) -> _BundlePrefix:
    """The bundle at ``url_text`` as its pointer names it now, through ``store`` (a reader's
    own, with its credentials) or one made from ``storage_options``."""
    url = StoreURL(url_text)
    store = store if store is not None else get_store(url, storage_options)
    with naming(url, what):
        pointer = _read_pointer(store, url)
    if pointer is None:
        raise BundleNotFoundError(f"{url}: no bundle here (no {STORE_POINTER_NAME} or {MANIFEST_NAME})")
    return _BundlePrefix(url, store, pointer)


def inside_generation(url: StoreURL) -> str | None:
    """Why ``url`` (a prefix or a packed object) lies inside a generation of a bundle, or None. A
    generation holds only what its manifest lists (``verify`` says so of anything else) and its
    bundle's overwrite and ``gc`` judge it whole: nothing under it is a bundle, and no bundle is
    ever written there."""
    parts = url.key.split("/") if url.key else []
    for i, part in enumerate(parts[:-1]):
        if STORE_GENERATION_RE.fullmatch(part):
            owner = StoreURL(f"{url.scheme}://{url.bucket}/{'/'.join(parts[:i])}")
            return (
                f"{url}: inside the generation {part} of the bundle {owner}, part of that one, never a bundle"
            )
    return None


def examine_prefix(store: Store, url: StoreURL) -> Proof | NotProven:
    """Prove that the prefix ``url`` holds a bundle (the rule of :mod:`bundles._local.proof`), or say
    why not: a pointer that parses and names a generation of this prefix whose manifest has the
    size and digest the pointer records and validates; with no pointer, a ``manifest.json`` right
    here that validates (a plain copy). A generation-named prefix is never a bundle (a valid
    pointer names nothing else, so "a prefix its parent's pointer names" is one too). Cost: one
    GET of the pointer (at most :data:`MAX_POINTER_BYTES`), one of the manifest (at most
    :data:`MAX_MANIFEST_BYTES`)."""
    if STORE_GENERATION_RE.fullmatch(url.name):
        return NotProven(
            str(url), f"{url}: a generation of the bundle {url.parent}, not a bundle (it is part of that one)"
        )
    inside = inside_generation(url)
    if inside is not None:
        return NotProven(str(url), inside)
    where = f"{url}/{STORE_POINTER_NAME}"
    try:
        data, meta = store.get(url.key_of(STORE_POINTER_NAME), MAX_POINTER_BYTES, "pointer cap")
    except ObjectNotFoundError:
        return _examine_plain(store, url)
    except UnsafeBundleError as e:  # over the cap: not a pointer of ours, whatever it holds
        return NotProven(str(url), f"{e}: {where} is not a bundle pointer")
    try:
        pointer = parse_pointer(data, where, meta.get("e_tag"))
    except BundleFormatError as e:
        if claims_format(data):
            return NotProven(str(url), f"{e}", damaged=True)
        detail = str(e)[len(where) + 2 :] if str(e).startswith(f"{where}: ") else str(e)
        return NotProven(str(url), f"{where}: holds a file that is not a bundle pointer ({detail})")
    mwhere = f"{url}/{pointer.generation}/{MANIFEST_NAME}"
    try:
        raw, _ = store.get(
            url.key_of(f"{pointer.generation}/{MANIFEST_NAME}"), MAX_MANIFEST_BYTES, "manifest cap"
        )
    except ObjectNotFoundError:
        return NotProven(str(url), f"{mwhere}: the manifest {where} names is missing", damaged=True)
    except UnsafeBundleError as e:
        return NotProven(str(url), f"{e}", damaged=True)
    if (
        len(raw) != pointer.manifest_size
        or DIGEST_PREFIX + hashlib.sha256(raw).hexdigest() != pointer.manifest_digest
    ):
        return NotProven(
            str(url), f"{mwhere}: not the manifest {where} names (size or digest differ)", damaged=True
        )
    judged = judge_manifest(raw, mwhere)
    if isinstance(judged, NotProven):  # the pointer claims the format: damaged either way
        return NotProven(str(url), judged.reason, damaged=True)
    return Proof(
        str(url), judged, generation=pointer.generation, shared_media=pointer.shared_media, etag=pointer.etag
    )


def _examine_plain(store: Store, url: StoreURL) -> Proof | NotProven:
    """A prefix without a pointer: a bundle copied verbatim when ``manifest.json`` validates."""
    where = f"{url}/{MANIFEST_NAME}"
    try:
        raw, _ = store.get(url.key_of(MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
    except ObjectNotFoundError:
        return NotProven(
            str(url), f"{url}: no bundle here (no {STORE_POINTER_NAME} or {MANIFEST_NAME})", empty=True
        )
    except UnsafeBundleError as e:
        return NotProven(str(url), f"{e}", damaged=False)
    judged = judge_manifest(raw, where)
    if isinstance(judged, NotProven):
        return NotProven(str(url), judged.reason, judged.damaged)
    return Proof(str(url), judged)


def examine_on_store(url_text: str, storage_options: Mapping[str, Any] | None = None) -> Proof | NotProven:
    """:func:`examine_prefix` of the URL ``url_text`` (its cost)."""
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    with naming(url, "look for a bundle"):
        return examine_prefix(store, url)


def list_remote_bundles(
    prefix_text: str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, StoreURL]:
    """The bundles right under ``prefix`` (one level), by name: one delimited listing, then one
    proof per child (:func:`examine_prefix`), concurrently. Names that are not bundles (a shared
    pool, a dead writer's unpublished prefix, a generation, a web app's ``manifest.json``, a
    damaged bundle) are left out."""
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    with naming(url, "list the bundles"):
        names = [n for n in store.children(url.key) if n != STORE_MEDIA_POOL]
        found = parallel(lambda n: isinstance(examine_prefix(store, url.child(n)), Proof), names)
    return {n: url.child(n) for n, ok in zip(names, found, strict=True) if ok}


def has_bundle_on_store(url_text: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when a bundle is proven at ``url`` (:func:`examine_prefix`, its cost)."""
    return isinstance(examine_on_store(url_text, storage_options), Proof)
