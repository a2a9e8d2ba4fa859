"""Writing a bundle to a store: upload without rename, verify, then publish its pointer
(FORMAT.md §9).

See :mod:`bundles._store` for the protocol. :func:`upload_bundle` uploads the media (skipping
those already present with the right size), the shards and the manifest of a new generation,
then proves every object the manifest lists before it puts the pointer, and after putting it
puts back what a concurrent ``rm`` or ``gc`` deleted: the rule and its costs are in
:mod:`bundles._store.verify` ("verify, then publish")."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleFormatError,
    BundleIOError,
    BundleVerificationError,
    MediaMissingError,
)
from bundles._format.layout import (
    DIGEST_PREFIX,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    SHARD_PATH_RE,
    SHARDS_DIR,
    STORE_GENERATION_RE,
    STORE_POINTER_NAME,
)
from bundles._format.media import sha256_file
from bundles._format.options import Verify
from bundles._local.faults import fault_point
from bundles._local.progress import Progress
from bundles._local.proof import DAMAGED_HINT, NotProven, Proof, judge_manifest, removable_names
from bundles._local.reader import open_local
from bundles._store.client import Store, get_store, naming, parallel
from bundles._store.pointer import (
    _PUBLISH_ATTEMPTS,
    MULTIPART_THRESHOLD,
    Pointer,
    _BundlePrefix,
    _new_generation,
    _read_pointer,
    examine_prefix,
    inside_generation,
)
from bundles._store.probe import check_preconditions
from bundles._store.verify import Listed, keep_published, prove_before_publish
from bundles._urls import StoreURL


# -- writing -------------------------------------------------------------------------------------
@dataclass
class UploadStats:
    """What one upload sent: for the benchmark and the trainer's log line."""

    media_uploaded: int = 0
    media_skipped: int = 0
    objects_read_back: int = 0  # proven by reading their bytes back before publishing
    objects_restored: int = 0  # put back after publishing (deleted by a concurrent rm or gc)
    bytes_uploaded: int = 0
    objects: int = 0
    seconds: float = 0.0
    generation: str = ""
    replaced: list[str] = field(default_factory=list)


def _check_absent(store: Store, url: StoreURL) -> Pointer | None:
    try:
        with naming(url, "look for an existing bundle"):
            return _read_pointer(store, url)
    except BundleFormatError:
        return Pointer(None, None, None, False)  # something is there, not ours to judge


def _refuse_unreplaceable(store: Store, url: StoreURL, overwrite: bool) -> None:
    """Before anything is uploaded: a destination holding a bundle needs ``overwrite``, and only
    a proven bundle (or nothing) is ever replaced: a user's ``bundle.json`` or ``manifest.json``,
    or a damaged bundle, is refused (FORMAT.md §5a), with nothing put; so is a destination inside
    a generation (:func:`inside_generation`)."""
    inside = inside_generation(url)
    if inside is not None:
        raise BundleExistsError(f"{inside}: refusing to write a bundle there")
    with naming(url, "look for an existing bundle"):
        found = examine_prefix(store, url)
    if isinstance(found, Proof):
        if not overwrite:
            raise BundleExistsError(f"{url}: destination exists; pass overwrite=True to replace it")
    elif found.damaged:
        raise BundleExistsError(
            f"{url}: destination holds a damaged bundle; refusing to replace it ({found.why}); {DAMAGED_HINT}"
        )
    elif not found.empty:
        raise BundleExistsError(f"{url}: destination is not a bundle; refusing to replace it ({found.why})")


def upload_bundle(
    bundle_path: str | os.PathLike[str],
    url_text: str,
    *,
    overwrite: bool = False,
    shared_media: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    read_back: bool = False,
) -> UploadStats:
    """Upload the local bundle directory at ``bundle_path`` to ``url`` with the commit protocol
    of the module docstring; return what was sent. Nothing is published that is not proven: the
    objects this writer did not upload (media already there) are read back and hashed first, and
    with ``read_back`` every object is (``cp``'s full verification, before publishing).

    Raises:
        BundleExistsError: a bundle is at ``url`` (without ``overwrite``), or another writer
            published one there first; nothing of theirs is touched.
        BundleVerificationError: an object the manifest lists holds other bytes on the store
            (named with the expected and found digests); nothing was published.
        BundleNotFoundError: the bucket does not exist.
        BundleIOError: the store refused a request after the retries, or no credentials; the
            bundle at ``url`` (if any) is unchanged.
    """
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    local = open_local(bundle_path, Verify.NONE)
    if local.packed:
        raise BundleError(
            f"{bundle_path}: upload_bundle takes a bundle directory; pack_bundle uploads a packed file"
        )
    _refuse_unreplaceable(store, url, overwrite)
    check_preconditions(store, url)  # publishing below is atomic only where they are honoured
    stats = UploadStats(generation=_new_generation())
    started = time.perf_counter()
    place = _BundlePrefix(url, store, Pointer(stats.generation, None, None, shared_media))
    root = Path(local.path)
    manifest_bytes = (root / MANIFEST_NAME).read_bytes()
    try:
        with naming(url, "upload the bundle"):
            listed, unproven = _upload(local, root, place, stats, progress, manifest_bytes)
        stats.objects_read_back = len(listed if read_back else unproven)
        prove_before_publish(place, listed if read_back else unproven)
        pointer = Pointer(stats.generation, len(manifest_bytes), _digest(manifest_bytes), shared_media)
        fault_point("store.before-publish")
        previous = _publish(place, pointer, overwrite)
    except BaseException as e:
        _discard_generation(place, stats.generation)
        if isinstance(e, OSError) and not isinstance(e, BundleError):  # the local disk's
            raise BundleIOError.wrap(url, "upload the bundle", e) from e
        raise
    _after_publish(place, stats, listed, previous)
    stats.seconds = time.perf_counter() - started
    return stats


def _after_publish(
    place: _BundlePrefix, stats: UploadStats, listed: list[Listed], previous: Pointer | None
) -> None:
    """Once the pointer names the new generation: put back what a racing ``rm`` or ``gc`` deleted
    of it, then retire the generation it replaced."""
    try:
        stats.objects_restored = keep_published(place, stats.generation, listed)
    except OSError as e:
        if isinstance(e, BundleError):
            raise
        raise BundleIOError.wrap(place.url, "put back the objects of the published bundle", e) from e
    if previous is not None:
        stats.replaced = _retire(place, previous)


def _upload(
    local: Any, root: Path, place: _BundlePrefix, stats: UploadStats, progress: bool | None, manifest: bytes
) -> tuple[list[Listed], list[Listed]]:
    """Put the media that are not there yet, the shards, then the manifest; return every object
    the manifest lists (for the check after publishing) and those this writer did not put
    itself (to be read back before publishing: :mod:`bundles._store.verify`)."""
    store = place.store
    listed, unproven, todo = _media_to_put(local, root, place, stats, manifest)
    shards = [(place.key(e["path"]), root / e["path"], e["size"]) for e in local.manifest["shards"]]
    digests = {place.key(e["path"]): e["digest"] for e in local.manifest["shards"]}
    listed += [Listed(key, path, size, digests[key]) for key, path, size in shards]
    by_key = {o.key: o for o in listed}
    total = sum(size for *_, size in todo + shards)
    lock = threading.Lock()

    with Progress(f"uploading {place.url.name}", total=total, unit="B", enabled=progress) as bar:

        def put_media(key: str, path: Path, size: int) -> None:
            if size > MULTIPART_THRESHOLD:
                _check_media(place, path, None)
                store.put_large(key, path)
            else:
                data = path.read_bytes()
                _check_media(place, path, data)
                if not store.put_create(key, data):
                    # Already there (another writer's, or our own retried request): proven by
                    # reading it back before publishing, like the media skipped above.
                    with lock:
                        unproven.append(by_key[key])
            fault_point("store.media")
            with lock:
                stats.media_uploaded += 1
                stats.bytes_uploaded += size
            bar.advance(size)

        def put_shard(key: str, path: Path, size: int) -> None:
            data = path.read_bytes()
            if len(data) != size or _digest(data) != digests[key]:
                raise BundleVerificationError(
                    local.path,
                    [
                        f"{path}: expected {size} bytes with {digests[key]}, found {len(data)} bytes with {_digest(data)}"
                    ],
                )
            _put_create_same(store, key, data)
            fault_point("store.shard")
            with lock:
                stats.bytes_uploaded += size
            bar.advance(size)

        jobs = [(put_media, t) for t in todo] + [(put_shard, t) for t in shards]
        parallel(lambda job: job[0](*job[1]), jobs)
    # The manifest last: a generation without one is never read (and gc removes it).
    _put_create_same(store, place.key(MANIFEST_NAME), manifest)
    stats.objects = len(todo) + len(shards) + 1
    return listed, unproven


def _media_to_put(
    local: Any, root: Path, place: _BundlePrefix, stats: UploadStats, manifest: bytes
) -> tuple[list[Listed], list[Listed], list[tuple[str, Path, int]]]:
    """The manifest and media as the manifest lists them; those of the media already on the store
    with their size (unproven: read back before publishing); and the media to put."""
    existing = {m["path"]: m["size"] for m in place.store.listing(place.media_prefix)}
    todo: list[tuple[str, Path, int]] = []
    unproven: list[Listed] = []
    listed = [Listed(place.key(MANIFEST_NAME), manifest, len(manifest), _digest(manifest))]
    for ref in local.media:
        key = f"{place.media_prefix}/{ref.filename}"
        listed.append(Listed(key, root / MEDIA_DIR / ref.filename, ref.size, ref.digest))
        if existing.get(key) == ref.size:
            stats.media_skipped += 1
            unproven.append(listed[-1])
            continue
        todo.append((key, root / MEDIA_DIR / ref.filename, ref.size))
    return listed, unproven, todo


def _check_media(place: _BundlePrefix, path: Path, data: bytes | None) -> None:
    """The key is the digest, and other bundles of a pool will trust it without uploading: bytes
    that disagree with their name (a hard-linked run file edited in place) must never be stored
    under it. Hashing costs ~0.5 s per GB against minutes of upload."""
    hexdigest = sha256_file(str(path))[0] if data is None else hashlib.sha256(data).hexdigest()
    if not path.name.startswith(hexdigest):
        raise MediaMissingError(
            f"{place.url}: {MEDIA_DIR}/{path.name}: the file's bytes hash to sha256:{hexdigest}, not the "
            "digest it is stored under (edited in place after it was linked?); not uploaded"
        )


def _digest(data: bytes) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def _put_create_same(store: Store, key: str, data: bytes) -> None:
    """A create-only put that also succeeds when the object already holds exactly ``data`` (a
    retried request whose first attempt was applied: the generation is ours alone)."""
    if not store.put_create(key, data):
        current, _ = store.get(key)
        if current != data:
            raise BundleError(f"{store.url_of(key)}: exists with other content")


def _publish(place: _BundlePrefix, pointer: Pointer, overwrite: bool) -> Pointer | None:
    """Make ``pointer`` the bundle's pointer; return the pointer it replaced (None if none).
    The pointer is read back once put: a writer whose put was overtaken learns it lost."""
    previous = _put_pointer(place, pointer, overwrite)
    _confirm(place, pointer, overwrite)
    return previous


def _put_pointer(place: _BundlePrefix, pointer: Pointer, overwrite: bool) -> Pointer | None:
    """The conditional put of the pointer (FORMAT.md §9), retried while other writers swap it."""
    store, url = place.store, place.url
    key = url.key_of(STORE_POINTER_NAME)
    body = pointer.to_bytes()

    def create() -> bool:
        """The create-only put of the pointer: False when an object is there already."""
        with naming(url, f"publish {STORE_POINTER_NAME}"):
            return store.put_create(key, body)

    for _ in range(_PUBLISH_ATTEMPTS):
        current = _check_absent(store, url)
        if current is None or (current.generation is None and not overwrite):
            if current is not None:
                raise BundleExistsError(f"{url}: destination exists; pass overwrite=True to replace it")
            if create():
                return None
            won = _check_absent(store, url)  # another put got there first
            if won is not None and won.generation == pointer.generation:
                return None  # our own retried request was applied
            if not overwrite:
                raise BundleExistsError(
                    f"{url}: another writer published a bundle here first (the create-only put of "
                    f"{STORE_POINTER_NAME} failed); nothing of theirs was changed"
                )
            continue
        if not overwrite:
            raise BundleExistsError(f"{url}: destination exists; pass overwrite=True to replace it")
        if current.generation is None:
            # A plain layout (no pointer yet): create the pointer, then retire the plain objects.
            if create():
                return current
            continue
        with naming(url, f"publish {STORE_POINTER_NAME}"):
            if store.put_swap(key, body, current.etag):
                return current
        # Another writer swapped the pointer since we read it: read it again and retry.
    raise BundleError(
        f"{url}: other writers kept replacing the bundle; gave up after {_PUBLISH_ATTEMPTS} tries"
    )


def _confirm(place: _BundlePrefix, pointer: Pointer, overwrite: bool) -> None:
    """Read the pointer just put back: it must name our generation. Where a store honoured the
    preconditions at the probe and drops them since (a proxy, a server replaced behind the
    endpoint), two racing puts both succeed and the later one silently replaces the earlier:
    the earlier writer finds the other's pointer here and is told it lost, rather than that it
    published. What this cannot see is in FORMAT.md §9 (a put that lands after the read)."""
    url = place.url
    fault_point("store.before-confirm", url)
    try:
        with naming(url, f"read {STORE_POINTER_NAME} back after publishing"):
            found: Pointer | None = _read_pointer(place.store, url)
    except BundleFormatError:
        found = Pointer(None, None, None, False)
    if found is not None and found.generation == pointer.generation:
        _confirm_generation(place, pointer)
        return
    what = f"names generation {found.generation}" if found and found.generation else "is gone"
    if found is not None and found.generation is None:
        what = "is not one this version reads"
    message = (
        f"{url}: this writer lost: read back right after it was put, {STORE_POINTER_NAME} {what}, "
        f"not ours ({pointer.generation}); another writer put it over ours (a store that drops "
        "If-None-Match/If-Match, or one that replaced the bundle at once), and our generation is "
        "removed. Nothing of theirs was changed"
    )
    raise (BundleError if overwrite else BundleExistsError)(message)


def _confirm_generation(place: _BundlePrefix, pointer: Pointer) -> None:
    """The generation the pointer just put names must still be there: a ``remove_bundle`` (or a
    gc) racing this write deletes every generation under the prefix, this unpublished one too, and
    the pointer would then name nothing. One HEAD of its manifest; a writer whose generation went
    is told so, not that it published (its media are not checked: the manifest goes first)."""
    url = place.url
    key = url.key_of(f"{pointer.generation}/{MANIFEST_NAME}")
    with naming(url, f"read back generation {pointer.generation}"):
        present = place.store.head(key) is not None
    if not present:
        raise BundleError(
            f"{url}: published, but generation {pointer.generation} was deleted meanwhile (a remove or "
            f"gc of {url} raced this write): {STORE_POINTER_NAME} names nothing readable; write the "
            "bundle again"
        )


def _discard_generation(place: _BundlePrefix, generation: str) -> None:
    """Best effort: remove an unpublished generation (it is invisible anyway; gc removes what a
    failure here leaves)."""
    try:
        prefix = place.url.key_of(generation)
        objs = place.store.listing(prefix)
        keys = sorted((m["path"] for m in objs), key=lambda k: not k.endswith("/" + MANIFEST_NAME))
        if keys:
            (place.store.delete(keys))
    except Exception:
        pass


def _retire(place: _BundlePrefix, previous: Pointer) -> list[str]:
    """Delete the replaced bundle's members its validated manifest lists, manifest first (the
    pointer no longer names it): the shards of the replaced generation, or of a plain copy (its
    media stay, as the new generation may list them; the rest is gc's). Nothing else under the
    prefix goes: a user's ``samples/notes.txt`` beside a plain copy, a bundle someone wrote inside
    the old generation's prefix. A manifest that no longer validates lists nothing (left for gc)."""
    url, store = place.url, place.store
    at = f"{previous.generation}/" if previous.generation is not None else ""
    try:
        raw, _ = store.get(url.key_of(at + MANIFEST_NAME), MAX_MANIFEST_BYTES, "manifest cap")
        judged = judge_manifest(raw, f"{url}/{at}{MANIFEST_NAME}")
        if isinstance(judged, NotProven):
            return []
        listed = {e.path for e in judged.shards}
        there = {f"{SHARDS_DIR}/{n}" for n in store.files(url.key_of(at + SHARDS_DIR))} & listed
        shards = [url.key_of(at + rel) for rel in sorted(there)]
        store.delete([url.key_of(at + MANIFEST_NAME)])  # first: a generation without one is never read
        if shards:
            store.delete(shards)
        return [url.key_of(at + MANIFEST_NAME), *shards]
    except Exception:
        return []  # left for gc: no pointer names it


def _rewrite_message(error: BaseException, local: str, url: str) -> None:
    """Name the URL, not the local scratch copy, in an error of the local writer."""
    if error.args and isinstance(error.args[0], str):
        error.args = (error.args[0].replace(local, url), *error.args[1:])


def remove_on_store(
    url_text: str, storage_options: Mapping[str, Any] | None = None, *, damaged: bool = False
) -> None:
    """Delete the bundle at ``url`` and nothing else (FORMAT.md §9), once proven
    (:func:`bundles._store.pointer.examine_prefix`; anything else is refused, nothing deleted):
    the pointer first (so no reader finds half of it), then the media in ``U/media`` that its
    manifests list (the live generation's and those of the other generations of ours under it),
    then those generations (``U/<generation>/`` holding only ``manifest.json`` and shards), each
    manifest first. A plain copy (no pointer) loses its ``manifest.json`` first, then the shards
    and media it lists. Everything else under ``U`` (a user's files, a medium no manifest lists,
    a nested bundle) is left, and so is the shared pool beside ``U``: its media are left to
    :func:`collect_garbage`.

    With ``damaged``, a bundle whose pointer or manifest claims the format but does not validate
    is removed too, by the names the format gives: its pointer and its generations, or, for a
    plain copy, ``manifest.json``, ``samples/NNNNNN.msgpack.zst`` and ``media/<64 hex><suffix>``."""
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    with naming(url, "look for a bundle"):
        found = examine_prefix(store, url)
    ours = removable_names(found, damaged)  # raises (nothing deleted) unless proven, or damaged=True
    with naming(url, "remove the bundle"):
        if isinstance(found, Proof) and found.generation is not None:
            _remove_generations(store, url, found)
            return
        if isinstance(found, NotProven) and store.head(url.key_of(STORE_POINTER_NAME)) is not None:
            store.delete([url.key_of(STORE_POINTER_NAME)])  # a damaged pointer (it claims the format)
            keys = _own_generations(store, url)
            if keys:
                store.delete(keys)
            return
        store.delete([url.key_of(MANIFEST_NAME)])  # a plain copy: its manifest first
        keys = []
        for sub in (SHARDS_DIR, MEDIA_DIR):
            keys += [url.key_of(f"{sub}/{n}") for n in store.files(url.key_of(sub)) if ours(f"{sub}/{n}")]
        if keys:
            store.delete(keys)


def _remove_generations(store: Store, url: StoreURL, proof: Proof) -> None:
    """Remove a proven bundle with a pointer: the pointer, the media its manifests list, then its
    generations (see :func:`remove_on_store`)."""
    store.delete([url.key_of(STORE_POINTER_NAME)])
    generations = _own_generations(store, url)
    listed = {m.filename for m in proof.manifest.media} if not proof.shared_media else set()
    for key in generations:
        rel = key[len(url.key_of("")) :]
        gen, _, name = rel.partition("/")
        if name == MANIFEST_NAME and gen != proof.generation:
            listed |= _media_listed(store, url, gen)
    media = url.key_of(MEDIA_DIR)
    keys = [f"{media}/{n}" for n in store.files(media) if n in listed]
    if keys:
        store.delete(keys)
    if generations:
        store.delete(generations)  # manifests first: a generation without one is never read


def _media_listed(store: Store, url: StoreURL, generation: str) -> set[str]:
    """The media another generation of ours under ``url`` lists (none where its manifest does not
    validate, or says its media are elsewhere: only names a validated manifest lists go)."""
    where = f"{url}/{generation}/{MANIFEST_NAME}"
    try:
        raw, _ = store.get(url.key_of(f"{generation}/{MANIFEST_NAME}"), MAX_MANIFEST_BYTES, "manifest cap")
    except BundleError:
        return set()
    judged = judge_manifest(raw, where)
    return set() if isinstance(judged, NotProven) else {m.filename for m in judged.media}


def _own_generations(store: Store, url: StoreURL) -> list[str]:
    """The keys of every generation of ours right under ``url`` (``U/<generation>/`` holding
    only ``manifest.json`` and shards), each manifest first. A generation-named prefix holding
    anything else (a nested bundle, a user's file) is not ours and is left whole."""
    keys: list[str] = []
    for name in store.children(url.key):
        if not STORE_GENERATION_RE.fullmatch(name):
            continue
        base = url.key_of(name) + "/"
        found = [m["path"] for m in store.listing(url.key_of(name))]
        if all(k[len(base) :] == MANIFEST_NAME or SHARD_PATH_RE.fullmatch(k[len(base) :]) for k in found):
            keys += sorted(found, key=lambda k: not k.endswith("/" + MANIFEST_NAME))
    return sorted(keys, key=lambda k: not k.endswith("/" + MANIFEST_NAME))
