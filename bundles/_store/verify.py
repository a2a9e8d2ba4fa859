"""Verify, then publish: what a store writer proves before it puts the pointer, and what it
checks after (docs/FORMAT.md §9). Used by :func:`bundles._store.write.upload_bundle`, which
``write_bundle`` to a URL, ``Location.stage`` and ``rollout-bundle cp`` go through.

**Before the pointer.** The pointer is the commit point: once it is put, the replaced
generation is retired and readers trust every object the manifest lists. So every one of them
is proven first, and a generation that cannot be proven is never published (the old pointer
stays, the new generation is removed, the error names the object and the expected and found
size and digest):

* an object this writer put itself (a shard, the manifest, a medium it uploaded) is proven by
  the bytes it sent: they were hashed against the manifest's digest before the put, and a
  create-only put that succeeded stored exactly them;
* an object it did *not* put (a medium already present, skipped as "already there"; a medium
  whose create-only put found one: another writer's, or our own retried request) is proven by
  reading its bytes back and hashing them: one GET of the object (windows of
  :data:`~bundles._store.pointer.READ_WINDOW` for one over
  :data:`~bundles._store.pointer.MULTIPART_THRESHOLD`, never held whole in memory). A
  missing one is uploaded from the local copy (create-only) and proven again; one with other
  bytes is a refusal, and is left as it is.
* With ``read_back`` (``cp``, whose copy is "fully verified"), the objects it put are read back
  and hashed too, before the pointer: what ``cp`` used to check after publishing, when a failure
  had already replaced the bundle.

Why read back and not re-put a skipped object: a re-put of an object that exists cannot be
create-only, so it would be a blind overwrite of a key other bundles of the pool trust, cost a
full upload (the very thing skipping saves; uploads are usually the slower and dearer
direction), and silently mend a damaged pool instead of reporting it. A read-back costs one GET
of the object's bytes and names what is wrong.

**After the pointer.** A concurrent ``rm U`` or ``gc`` decides from what it listed, and its
deletes may land after this writer published: media it skipped as "already there", or even its
new generation (``rm`` deletes every generation under ``U``). So once the pointer is read back as
ours (:func:`bundles._store.write._confirm`), the writer lists its generation and its media
prefix and puts back, from its local copy, every object its manifest lists that is missing (or
has another size), and looks again, until nothing is missing (:func:`keep_published`). It stops
without re-putting when the pointer no longer names its generation (a later ``rm`` or
replacement: not its to undo). ``rm`` and ``gc`` read the pointers again just before deleting
(§9), so what is left is a delete decided before the pointer was put whose request lands after
the writer's last look; FORMAT.md §9 says so. Cost: two listings (the generation, the media
prefix) per publish, and a put per object found missing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from bundles._errors import (
    BundleError,
    BundleFormatError,
    BundleVerificationError,
    ObjectNotFoundError,
    ObjectTooLargeError,
)
from bundles._format.layout import DIGEST_PREFIX, STORE_POINTER_NAME
from bundles._local.faults import fault_point
from bundles._store.client import Store, naming, parallel
from bundles._store.pointer import MULTIPART_THRESHOLD, READ_WINDOW, _BundlePrefix, _read_pointer

#: How often an object that keeps vanishing is put back before the writer gives up.
RESTORE_ROUNDS = 4


@dataclass(frozen=True)
class Listed:
    """One object the manifest lists: its key on the store, the local file (or bytes) holding
    what it must hold, its size and digest (``sha256:<hex>``)."""

    key: str
    source: Path | bytes
    size: int
    digest: str

    def data(self) -> bytes:
        return self.source if isinstance(self.source, bytes) else self.source.read_bytes()


def put_local(store: Store, obj: Listed, *, create: bool) -> bool:
    """Put ``obj`` from its local copy: create-only (False when one is there) or overwriting (a
    content-addressed key, or a key of this writer's own generation)."""
    if isinstance(obj.source, Path) and obj.size > MULTIPART_THRESHOLD:
        store.put_large(obj.key, obj.source)  # multipart cannot be create-only; content-addressed
        return True
    if create:
        return store.put_create(obj.key, obj.data())
    store.put(obj.key, obj.data())
    return True


def stored_digest(store: Store, key: str, size: int) -> tuple[int, str] | None:
    """The size and digest of the object at ``key`` (None if there is none), read with one GET,
    or in windows for an object over :data:`MULTIPART_THRESHOLD`; an object longer than ``size``
    is reported by its size without its body being read."""
    if size <= MULTIPART_THRESHOLD:
        try:
            data, _ = store.get(key, size, "size the manifest lists")
        except ObjectNotFoundError:
            return None
        except ObjectTooLargeError:
            meta = store.head(key)
            return None if meta is None else (int(meta["size"]), "(not read)")
        return len(data), DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
    meta = store.head(key)
    if meta is None:
        return None
    if int(meta["size"]) != size:
        return int(meta["size"]), "(not read)"
    h, n = hashlib.sha256(), 0
    for start in range(0, size, READ_WINDOW):  # lazily: the size is a manifest's
        chunk = store.get_range(key, start, min(size, start + READ_WINDOW))
        h.update(chunk)
        n += len(chunk)
        if len(chunk) < min(READ_WINDOW, size - start):
            break  # shorter than it said: replaced meanwhile
    return n, DIGEST_PREFIX + h.hexdigest()


def _prove(store: Store, obj: Listed) -> str | None:
    """Read ``obj`` back; upload it where it is missing. A problem line, or None when proven."""
    for _ in range(RESTORE_ROUNDS):
        found = stored_digest(store, obj.key, obj.size)
        if found is None:
            if put_local(store, obj, create=True):
                return None  # ours now: proven by the bytes we sent
            continue  # another writer put it meanwhile: read that one
        if found == (obj.size, obj.digest):
            return None
        return (
            f"{store.url_of(obj.key)}: expected {obj.size} bytes with {obj.digest}, found {found[0]} bytes "
            f"with {found[1]} (an object this writer did not upload; left as it is)"
        )
    return f"{store.url_of(obj.key)}: kept vanishing while it was read back ({RESTORE_ROUNDS} tries)"


def prove_before_publish(place: _BundlePrefix, objects: list[Listed]) -> None:
    """Read back and hash ``objects`` (the ones the writer did not put, or all with ``read_back``);
    raise :class:`BundleVerificationError` naming every object that is not what the manifest
    says, before anything is published."""
    fault_point("store.before-verify", place.url)
    with naming(place.url, "verify the objects before publishing"):
        problems = [p for p in parallel(lambda o: _prove(place.store, o), objects) if p]
    if problems:
        raise BundleVerificationError(f"{place.url} (not published; the bundle there is unchanged)", problems)


def _still_ours(place: _BundlePrefix, generation: str) -> bool:
    try:
        pointer = _read_pointer(place.store, place.url)
    except BundleFormatError:
        return False
    return pointer is not None and pointer.generation == generation


def keep_published(place: _BundlePrefix, generation: str, objects: list[Listed]) -> int:
    """After the pointer naming ``generation`` was put and read back: put back every object of
    ``objects`` that a concurrent ``rm`` or ``gc`` deleted, until none is missing; return how
    many were put back. See the module docstring."""
    store, url = place.store, place.url
    restored = 0
    for _ in range(RESTORE_ROUNDS):
        fault_point("store.after-publish", url)
        with naming(url, "check the published bundle"):
            sizes = {m["path"]: m["size"] for m in store.listing(url.key_of(generation))}
            sizes.update({m["path"]: m["size"] for m in store.listing(place.media_prefix)})
            missing = [o for o in objects if sizes.get(o.key) != o.size]
            if not missing or not _still_ours(place, generation):
                return restored
            parallel(lambda o: put_local(store, o, create=False), missing)
        restored += len(missing)
    raise BundleError(
        f"{url}: published, but objects its manifest lists kept being deleted ({restored} put back over "
        f"{RESTORE_ROUNDS} rounds: a remove or gc of {url} racing this write); {STORE_POINTER_NAME} names "
        f"generation {generation}: write the bundle again"
    )
