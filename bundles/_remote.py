"""Bundles on an object store: the commit protocol without rename, reading in place, gc.

A store has no rename and no directories, so the local protocol (stage, fsync, rename) cannot
apply. What it has, and what this protocol relies on, are atomic single-object puts, create-only
puts (``If-None-Match: *``) and compare-and-swap puts (``If-Match: <etag>``); docs/FORMAT.md §9
is the normative description. A bundle at URL ``U`` is:

``U/media/<hex><suffix>``  (or ``<parent of U>/.media/`` with ``shared_media``)
    content-addressed media, written create-only: a retry, or two writers uploading the same
    screenshot, store the same bytes once. Media already present are not uploaded again.
``U/<generation>/samples/NNNNNN.msgpack.zst``, ``U/<generation>/manifest.json``
    one *generation*, named ``g<UTC time>-<random>`` by its writer so that no two writers ever
    share a key: the shards, then the manifest last (create-only). The manifest lists every
    object with its size and digest, exactly as in a directory.
``U/bundle.json``  (:data:`~bundles._layout.STORE_POINTER_NAME`)
    the pointer: which generation is the bundle, the manifest's size and digest, and where the
    media are. Publishing is one conditional put of this small object: create-only for a new
    bundle (of two racing writers exactly one wins; the other gets :class:`BundleExistsError`
    and nothing of the winner's is touched), or, with ``overwrite=True``, a compare-and-swap on
    the pointer's ETag (a writer that loses the swap reads the pointer again and retries: the
    last writer wins, as with directories, and no writer's update is applied over one it did not
    see). The replaced generation is then deleted, manifest first.

A reader reads the pointer, then the manifest it names, and checks the manifest's digest
against the pointer: it never sees a torn bundle, only the old one or the new one. A prefix
without a pointer (a writer that died, or lost a race) is invisible, and ``gc`` removes it once
it is older than a limit. A bundle copied verbatim onto a store (``aws s3 sync bundle_dir
s3://b/x``: ``U/manifest.json`` with no pointer) is read too.

Writing. :func:`write_remote_bundle` writes the bundle into a local scratch directory with the
local writer (so every check, hash and error of ``write_bundle`` applies unchanged; the scratch
lies beside the first media root, so media are hard-linked, not copied) and then uploads it with
:func:`upload_bundle`, concurrently (:data:`~bundles._store.CONCURRENCY` requests in flight).

Reading. :class:`StoreSource` is a source for :class:`bundles._reader.Bundle`: the manifest and
shards are read with single GETs, media lazily with range reads (:class:`RangeFile`), sizes come
from one listing of the generation and of the media prefix. A packed ``.rbundle`` object is read
in place by :class:`StorePackedSource`: its tar headers are fetched by range reads, all at once
where the packer's deterministic layout predicts them, and checked by the same
:func:`bundles._source.read_tar_index` as a local packed file.

Garbage and reference accounting. Media in a shared pool belong to every bundle whose manifest
lists them, so nothing deletes them when one bundle goes: :func:`collect_garbage` marks the media
that the live generations under a prefix list, and sweeps the rest, along with generations that
no pointer names, once they are older than ``older_than`` (the grace period that protects a
writer that has uploaded media but not yet published its pointer). Stale multipart uploads are
not listed by obstore; writers use multipart only for media over
:data:`MULTIPART_THRESHOLD`, and a bucket lifecycle rule (``AbortIncompleteMultipartUpload``)
removes abandoned parts.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleFormatError,
    BundleIOError,
    BundleNotFoundError,
    BundleVerificationError,
    UnsafeBundleError,
)
from bundles._faults import fault_point
from bundles._fs import remove_tree
from bundles._layout import (
    DIGEST_PREFIX,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MEDIA_DIR,
    PACK_SUFFIX,
    SHARDS_DIR,
    STORE_GENERATION_RE,
    STORE_MEDIA_POOL,
    STORE_POINTER_FORMAT,
    STORE_POINTER_NAME,
    STORE_POINTER_VERSION,
)
from bundles._media import MediaRef
from bundles._progress import Progress
from bundles._source import LAYOUT_DIRS, Entry, layout_name_ok, read_tar_index
from bundles._store import Store, StoreURL, get_store, parallel, store_error

__all__ = [
    "collect_garbage",
    "is_remote_bundle",
    "list_remote_bundles",
    "open_remote_bundle",
    "pack_to_store",
    "remove_remote_bundle",
    "unpack_from_store",
    "upload_bundle",
    "write_remote_bundle",
]

MAX_POINTER_BYTES = 64 * 1024
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
class _Place:
    """Where the objects of one bundle lie."""

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
        data, meta = store.get(url.key_of(STORE_POINTER_NAME))
    except FileNotFoundError:
        if store.head(url.key_of(MANIFEST_NAME)) is not None:
            return Pointer(None, None, None, False)
        return None
    return parse_pointer(data, f"{url}/{STORE_POINTER_NAME}", meta.get("e_tag"))


def _place(url_text: str, storage_options: Mapping[str, Any] | None, what: str) -> _Place:
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    try:
        pointer = _read_pointer(store, url)
    except BundleError:
        raise
    except Exception as e:
        raise store_error(url, what, e) from e
    if pointer is None:
        raise BundleNotFoundError(f"{url}: no bundle here (no {STORE_POINTER_NAME} or {MANIFEST_NAME})")
    return _Place(url, store, pointer)


def list_remote_bundles(
    prefix_text: str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, StoreURL]:
    """The bundles right under ``prefix`` (one level), by name: one delimited listing, then one
    pointer lookup per child, concurrently. Names that are not bundles (a shared pool, a dead
    writer's unpublished prefix) are left out."""
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    try:
        names = [n for n in store.children(url.key) if n != STORE_MEDIA_POOL]
        found = parallel(lambda n: _safe_pointer(store, url.child(n)) is not None, names)
    except BundleError:
        raise
    except Exception as e:
        raise store_error(url, "list the bundles", e) from e
    return {n: url.child(n) for n, ok in zip(names, found, strict=True) if ok}


def _safe_pointer(store: Store, url: StoreURL) -> Pointer | None:
    try:
        return _read_pointer(store, url)
    except BundleFormatError:
        return None


def is_remote_bundle(url_text: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    try:
        return (_read_pointer(store, url)) is not None
    except BundleFormatError:
        return False
    except Exception as e:
        raise store_error(url, "look for a bundle", e) from e


# -- reading -------------------------------------------------------------------------------------
class RangeFile(io.RawIOBase):
    """A read-only binary file over ``size`` bytes at ``offset`` of one object, read with range
    requests of at least :data:`READ_WINDOW` bytes (a media file is usually one request)."""

    def __init__(self, store: Store, key: str, offset: int, size: int, where: str) -> None:
        super().__init__()
        self._store, self._key, self._offset, self._size, self._where = store, key, offset, size, where
        self._pos = 0
        self._buf = b""
        self._buf_start = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def _fill(self, want: int) -> None:
        start = self._pos
        end = min(self._size, start + max(want, READ_WINDOW))
        try:
            data = self._store.get_range(self._key, self._offset + start, self._offset + end)
        except FileNotFoundError:
            raise BundleVerificationError(
                self._where, [f"{self._where}: missing (removed while open?)"]
            ) from None
        except Exception as e:
            raise store_error(self._where, "read", e) from e
        if len(data) != end - start:
            raise UnsafeBundleError(
                f"{self._where}: truncated: asked for {end - start} bytes, got {len(data)}"
            )
        self._buf, self._buf_start = data, start

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        rel = self._pos - self._buf_start
        if not (rel >= 0 and rel + n <= len(self._buf)):
            self._fill(n)
            rel = 0
        memoryview(b).cast("B")[:n] = self._buf[rel : rel + n]
        self._pos += n
        return n

    def readall(self) -> bytes:
        n = self._size - self._pos
        if n <= 0:
            return b""
        out = bytearray(n)
        got = self.readinto(out)
        return bytes(out[:got])


class StoreSource:
    """A bundle on a store, as a source for :class:`bundles._reader.Bundle` (see the module
    docstring). ``path`` is the bundle's :class:`StoreURL`; names are bundle-relative."""

    packed = False
    remote = True

    def __init__(self, place: _Place) -> None:
        self._place = place
        self.path = place.url
        self._sizes: dict[str, int] | None = None
        self._listed_media: set[str] = set()

    def where(self, name: str) -> str:
        return f"{self.path}/{name}"

    def media_path(self, name: str) -> str:
        return self.where(name)

    def read_manifest(self) -> bytes:
        p = self._place
        try:
            data, _ = p.store.get(p.key(MANIFEST_NAME))
        except FileNotFoundError:
            raise BundleNotFoundError(
                f"{self.path}: not a bundle: {MANIFEST_NAME} of generation {p.pointer.generation} is missing "
                "(removed by a later overwrite?)"
            ) from None
        except Exception as e:
            raise store_error(self.path, f"read {MANIFEST_NAME}", e) from e
        if len(data) > MAX_MANIFEST_BYTES:
            raise UnsafeBundleError(
                f"{self.where(MANIFEST_NAME)}: exceeds the manifest cap of {MAX_MANIFEST_BYTES} bytes"
            )
        if p.pointer.manifest_digest is not None:
            digest = DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
            if digest != p.pointer.manifest_digest or len(data) != p.pointer.manifest_size:
                raise BundleVerificationError(
                    self.path,
                    [
                        f"{self.where(MANIFEST_NAME)}: digest: the pointer expects {p.pointer.manifest_digest}, found {digest}"
                    ],
                )
        try:  # which media names the listing should report (the pool also holds others' media)
            listed = json.loads(data).get("media", [])
            self._listed_media = {
                f"{e['digest'][len(DIGEST_PREFIX) :]}{e['suffix']}" for e in listed if isinstance(e, dict)
            }
        except Exception:
            self._listed_media = set()  # load_manifest names the problem
        return data

    def reload_manifest(self) -> Any:
        """The manifest the pointer names now (to tell a replaced bundle from a damaged one)."""
        from bundles._manifest import parse_manifest_bytes

        fresh = StoreSource(_place(str(self.path), None, "read the pointer"))
        fresh._place = _Place(self._place.url, self._place.store, fresh._place.pointer)
        return parse_manifest_bytes(fresh.read_manifest(), fresh.where(MANIFEST_NAME))

    def _list(self) -> dict[str, int]:
        p = self._place
        base = p.url.key_of(p.pointer.generation) if p.pointer.generation else p.url.key
        sizes: dict[str, int] = {}

        try:
            bundle_objects, media_objects = parallel(p.store.listing, [base, p.media_prefix])
        except Exception as e:
            raise store_error(self.path, "list the bundle's objects", e) from e
        for m in bundle_objects:
            rel = m["path"][len(base) + 1 :] if base else m["path"]
            if p.pointer.generation is None and (
                rel == STORE_POINTER_NAME or rel.startswith(MEDIA_DIR + "/") or STORE_GENERATION_RE.match(rel)
            ):
                continue  # a plain layout: media are listed below; other generations are not ours
            sizes[rel] = m["size"]
        for m in media_objects:
            name = m["path"][len(p.media_prefix) + 1 :]
            # The media prefix is shared (by a pool's bundles, or by the generations of one bundle):
            # only a plain layout owns its media/ alone, so only there is an unlisted file a problem.
            if name in self._listed_media or p.pointer.generation is None:
                sizes[f"{MEDIA_DIR}/{name}"] = m["size"]
        self._sizes = sizes
        return sizes

    def entries(self) -> Iterator[Entry]:
        for d in LAYOUT_DIRS:
            yield Entry(d, "dir", 0)
        for name, size in self._list().items():
            yield Entry(name, "file", size)

    def open(self, name: str) -> tuple[BinaryIO, int]:
        p = self._place
        key = p.key(name)
        size = (self._sizes or {}).get(name)
        if size is None:
            try:
                meta = p.store.head(key)
            except Exception as e:
                raise store_error(self.where(name), "read", e) from e
            if meta is None:
                raise FileNotFoundError(2, "listed in the manifest but missing", self.where(name))
            size = int(meta["size"])
        return RangeFile(p.store, key, 0, size, self.where(name)), size  # type: ignore[return-value]

    def hash(self, name: str) -> tuple[str, int]:
        f, _ = self.open(name)
        with f:
            data = f.read()
        return hashlib.sha256(data).hexdigest(), len(data)

    def rehydrate(
        self, media: Mapping[str, MediaRef], target: Path, progress: bool | None
    ) -> dict[str, MediaRef]:
        return _download_media(self, media, target, progress)

    def close(self) -> None:
        pass


class _StoreReader:
    """``pread`` over one object for :func:`read_tar_index`, served from prefetched header blocks
    where possible, else by a range read."""

    def __init__(self, store: Store, key: str, size: int, where: str) -> None:
        self.store, self.key, self.size, self.where = store, key, size, where
        self._blocks: dict[int, bytes] = {}
        self.requests = 0

    def prefetch(self, starts: list[int], length: int) -> None:
        starts = [s for s in starts if s + length <= self.size]
        if not starts:
            return
        # get_ranges keeps ~10 requests in flight; chunks of it in parallel keep more (a header
        # of every 1 MB screenshot is a request of its own).
        chunks = [starts[i : i + 16] for i in range(0, len(starts), 16)]
        try:
            fetched = parallel(lambda c: self.store.get_ranges(self.key, c, [s + length for s in c]), chunks)
        except Exception as e:
            raise store_error(self.where, "read the packed file's headers", e) from e
        self.requests += 1
        for chunk, blocks in zip(chunks, fetched, strict=True):
            self._blocks.update(zip(chunk, blocks, strict=True))

    def pread(self, n: int, pos: int) -> bytes:
        n = max(0, min(n, self.size - pos))
        for start, block in self._blocks.items():
            if start <= pos and pos + n <= start + len(block):
                return block[pos - start : pos - start + n]
        if n == 0:
            return b""
        self.requests += 1
        try:
            data = self.store.get_range(
                self.key, pos, pos + max(n, 4096) if pos + 4096 <= self.size else self.size
            )
        except Exception as e:
            raise store_error(self.where, "read", e) from e
        self._blocks[pos] = data
        return data[:n]


class StorePackedSource:
    """A packed ``.rbundle`` object read in place by member ranges (see the module docstring)."""

    packed = True
    remote = True

    def __init__(self, url: StoreURL, store: Store) -> None:
        self.path = url
        self._store = store
        try:
            meta = store.head(url.key)
        except Exception as e:
            raise store_error(url, "open the packed bundle", e) from e
        if meta is None:
            raise BundleNotFoundError(f"{url}: no bundle here (the object does not exist)")
        self.size = int(meta["size"])
        reader = _StoreReader(store, url.key, self.size, str(url))
        _prefetch_headers(reader)
        self.members = read_tar_index(reader, url)  # type: ignore[arg-type]
        self.index_requests = reader.requests

    def where(self, name: str) -> str:
        return f"{self.path}/{name}"

    def media_path(self, name: str) -> str:
        return self.where(name)

    def read_manifest(self) -> bytes:
        f, _ = self.open(MANIFEST_NAME)
        with f:
            return f.read()

    def entries(self) -> Iterator[Entry]:
        for m in self.members.values():
            yield Entry(m.name, "dir" if m.is_dir else "file", m.size)

    def open(self, name: str) -> tuple[BinaryIO, int]:
        m = self.members.get(name)
        if m is None:
            raise FileNotFoundError(2, "listed in the manifest but missing", self.where(name))
        if m.is_dir:
            raise UnsafeBundleError(f"{self.where(name)}: expected a regular file, found a directory")
        return RangeFile(self._store, self.path.key, m.offset, m.size, self.where(name)), m.size  # type: ignore[return-value]

    def hash(self, name: str) -> tuple[str, int]:
        f, _ = self.open(name)
        with f:
            data = f.read()
        return hashlib.sha256(data).hexdigest(), len(data)

    def rehydrate(
        self, media: Mapping[str, MediaRef], target: Path, progress: bool | None
    ) -> dict[str, MediaRef]:
        return _download_media(self, media, target, progress)

    def close(self) -> None:
        pass


def _prefetch_headers(reader: _StoreReader) -> None:
    """Fetch the tar headers where :mod:`bundles._pack`'s deterministic layout puts them, all at
    once (``get_ranges`` calls in parallel; obstore merges ranges under 1 MiB apart into one
    request): the first member is the manifest, which lists every other member's size.
    Only a prediction: :func:`read_tar_index` still checks every header it reads, and a header
    that is not where predicted is read on its own."""
    block = 512
    first = reader.pread(min(reader.size, 1024 * 1024), 0)
    try:
        import tarfile

        info = tarfile.TarInfo.frombuf(first[:block], "utf-8", "surrogateescape")
        if info.name != MANIFEST_NAME or block + info.size > len(first):
            return
        manifest = json.loads(first[block : block + info.size])
        sizes = [(MANIFEST_NAME, info.size), (MEDIA_DIR, 0)]
        sizes += sorted((f"{MEDIA_DIR}/{e['digest'][7:]}{e['suffix']}", e["size"]) for e in manifest["media"])
        sizes.append((SHARDS_DIR, 0))
        sizes += [(e["path"], e["size"]) for e in manifest["shards"]]
    except Exception:
        return  # not the usual layout: read_tar_index reads header by header
    starts, pos = [], 0
    for _, size in sizes:
        starts.append(pos)
        pos += block + -(-size // block) * block
    starts.append(pos)  # the end-of-archive blocks
    # From the byte before each header: tarfile reads it to check that the previous member's
    # data is all there.
    reader.prefetch([s - 1 for s in starts[2:]], block + 1)
    tail = max(pos, reader.size - 64 * 1024)
    reader.prefetch([tail], reader.size - tail)


def _download_one(source: Any, name: str, ref: MediaRef, target: Path, bar: Progress) -> MediaRef:
    dst = target / name
    try:
        if os.stat(dst).st_size == ref.size:
            bar.advance()
            return ref.with_path(str(dst))
    except FileNotFoundError:
        pass
    if isinstance(source, StorePackedSource):
        m = source.members[f"{MEDIA_DIR}/{name}"]
        data = source._store.get_range(source.path.key, m.offset, m.offset + m.size)
    else:
        data, _ = source._place.store.get(source._place.key(f"{MEDIA_DIR}/{name}"))
    digest = DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
    if digest != ref.digest or len(data) != ref.size:
        raise BundleVerificationError(
            source.path,
            [f"{source.where(MEDIA_DIR + '/' + name)}: digest: expected {ref.digest}, found {digest}"],
        )
    tmp = target / f".{name}.{os.getpid()}.{secrets.token_hex(3)}.rehydrate"
    with open(tmp, "xb") as f:
        f.write(data)
    os.chmod(tmp, 0o444)
    os.replace(tmp, dst)
    bar.advance()
    return ref.with_path(str(dst))


def _download_media(
    source: Any, media: Mapping[str, MediaRef], target: Path, progress: bool | None
) -> dict[str, MediaRef]:
    """Download every media file into ``target`` concurrently, each checked against its digest
    before it is renamed into place (a file already there with the right size is kept)."""

    def run() -> dict[str, MediaRef]:
        with Progress(
            f"rehydrating {source.path.name}", total=len(media), unit="files", enabled=progress
        ) as bar:
            refs = parallel(lambda item: _download_one(source, item[0], item[1], target, bar), media.items())
        return dict(zip(media, refs, strict=True))

    try:
        return run()
    except BundleError:
        raise
    except OSError as e:
        if isinstance(e, FileNotFoundError) and not os.path.isdir(target):
            raise BundleIOError.wrap(target, "rehydrate", e) from e
        if e.__class__.__module__.startswith("obstore") or isinstance(e, FileNotFoundError):
            raise store_error(source.path, "download media", e) from e
        raise BundleIOError.wrap(target, f"rehydrate {source.path}", e) from e
    except Exception as e:
        raise store_error(source.path, "download media", e) from e


def open_remote_bundle(
    url_text: str, *, verify: str = "fast", storage_options: Mapping[str, Any] | None = None
) -> Any:
    """:func:`bundles.open_bundle` for a URL: a bundle prefix, or a packed ``.rbundle`` object."""
    from bundles._reader import Bundle, load_manifest

    url = StoreURL(url_text)
    source: StoreSource | StorePackedSource
    if url.name.endswith(PACK_SUFFIX):
        source = StorePackedSource(url, get_store(url, storage_options))
    else:
        source = StoreSource(_place(url, storage_options, "read the pointer"))
    bundle = Bundle(source, load_manifest(source))  # type: ignore[arg-type]
    if verify != "none":
        bundle.verify(full=verify == "full", progress=False)
    return bundle


# -- writing -------------------------------------------------------------------------------------
@dataclass
class UploadStats:
    """What one upload sent: for the benchmark and the trainer's log line."""

    media_uploaded: int = 0
    media_skipped: int = 0
    bytes_uploaded: int = 0
    objects: int = 0
    seconds: float = 0.0
    generation: str = ""
    replaced: list[str] = field(default_factory=list)


def _check_absent(store: Store, url: StoreURL) -> Pointer | None:
    try:
        return _read_pointer(store, url)
    except BundleFormatError:
        return Pointer(None, None, None, False)  # something is there, not ours to judge
    except Exception as e:
        raise store_error(url, "look for an existing bundle", e) from e


def upload_bundle(
    bundle_path: str | os.PathLike[str],
    url_text: str,
    *,
    overwrite: bool = False,
    shared_media: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
) -> UploadStats:
    """Upload the local bundle directory at ``bundle_path`` to ``url`` with the commit protocol
    of the module docstring; return what was sent.

    Raises:
        BundleExistsError: a bundle is at ``url`` (without ``overwrite``), or another writer
            published one there first; nothing of theirs is touched.
        BundleNotFoundError: the bucket does not exist.
        BundleIOError: the store refused a request after the retries, or no credentials; the
            bundle at ``url`` (if any) is unchanged.
    """
    from bundles._reader import open_bundle

    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    local = open_bundle(bundle_path, verify="none")
    if local.packed:
        raise BundleError(
            f"{bundle_path}: upload_bundle takes a bundle directory; pack_bundle uploads a packed file"
        )
    existing = _check_absent(store, url)
    if existing is not None and not overwrite:
        raise BundleExistsError(f"{url}: destination exists; pass overwrite=True to replace it")
    stats = UploadStats(generation=_new_generation())
    started = time.perf_counter()
    place = _Place(url, store, Pointer(stats.generation, None, None, shared_media))
    root = Path(local.path)
    manifest_bytes = (root / MANIFEST_NAME).read_bytes()
    try:
        (_upload(local, root, place, stats, progress))
        pointer = Pointer(
            stats.generation,
            len(manifest_bytes),
            DIGEST_PREFIX + hashlib.sha256(manifest_bytes).hexdigest(),
            shared_media,
        )
        fault_point("store.before-publish")
        previous = _publish(place, pointer, overwrite)
    except BaseException as e:
        _discard_generation(place, stats.generation)
        if isinstance(e, BundleError) or not isinstance(e, Exception):
            raise
        raise store_error(url, "upload the bundle", e) from e
    if previous is not None:
        stats.replaced = _retire(place, previous)
    stats.seconds = time.perf_counter() - started
    return stats


def _upload(local: Any, root: Path, place: _Place, stats: UploadStats, progress: bool | None) -> None:
    store = place.store
    existing = {m["path"]: m["size"] for m in store.listing(place.media_prefix)}
    todo: list[tuple[str, Path, int]] = []
    for ref in local.media:
        key = f"{place.media_prefix}/{ref.filename}"
        if existing.get(key) == ref.size:
            stats.media_skipped += 1
            continue
        todo.append((key, root / MEDIA_DIR / ref.filename, ref.size))
    shards = [(place.key(e["path"]), root / e["path"], e["size"]) for e in local.manifest["shards"]]
    total = sum(size for *_, size in todo + shards)
    lock = threading.Lock()

    with Progress(f"uploading {place.url.name}", total=total, unit="B", enabled=progress) as bar:

        def put_media(key: str, path: Path, size: int) -> None:
            if size > MULTIPART_THRESHOLD:
                store.put_large(key, path)
            else:
                try:
                    store.put(key, path.read_bytes(), mode="create")
                except Exception as e:
                    # Already there: the same content, from another writer or our own retry.
                    if type(e).__name__ != "AlreadyExistsError":
                        raise
            fault_point("store.media")
            with lock:
                stats.media_uploaded += 1
                stats.bytes_uploaded += size
            bar.advance(size)

        def put_shard(key: str, path: Path, size: int) -> None:
            _put_create_same(store, key, path.read_bytes())
            fault_point("store.shard")
            with lock:
                stats.bytes_uploaded += size
            bar.advance(size)

        jobs = [(put_media, t) for t in todo] + [(put_shard, t) for t in shards]
        parallel(lambda job: job[0](*job[1]), jobs)
    # The manifest last: a generation without one is never read (and gc removes it).
    _put_create_same(store, place.key(MANIFEST_NAME), (root / MANIFEST_NAME).read_bytes())
    stats.objects = len(todo) + len(shards) + 1


def _put_create_same(store: Store, key: str, data: bytes) -> None:
    """A create-only put that also succeeds when the object already holds exactly ``data`` (a
    retried request whose first attempt was applied: the generation is ours alone)."""
    try:
        store.put(key, data, mode="create")
    except Exception as e:
        if type(e).__name__ != "AlreadyExistsError":
            raise
        current, _ = store.get(key)
        if current != data:
            raise BundleError(f"{store.scheme}://{store.bucket}/{key}: exists with other content") from None


def _publish(place: _Place, pointer: Pointer, overwrite: bool) -> Pointer | None:
    """Make ``pointer`` the bundle's pointer; return the pointer it replaced (None if none)."""
    store, url = place.store, place.url
    key = url.key_of(STORE_POINTER_NAME)
    body = pointer.to_bytes()
    for _ in range(_PUBLISH_ATTEMPTS):
        current = _check_absent(store, url)
        if current is None or (current.generation is None and not overwrite):
            if current is not None:
                raise BundleExistsError(f"{url}: destination exists; pass overwrite=True to replace it")
            try:
                (store.put(key, body, mode="create"))
                return None
            except Exception as e:
                if type(e).__name__ != "AlreadyExistsError":
                    raise store_error(url, f"publish {STORE_POINTER_NAME}", e) from e
                won = _check_absent(store, url)
                if won is not None and won.generation == pointer.generation:
                    return None  # our own retried request was applied
                if not overwrite:
                    raise BundleExistsError(
                        f"{url}: another writer published a bundle here first (the create-only put of "
                        f"{STORE_POINTER_NAME} failed); nothing of theirs was changed"
                    ) from None
                continue
        if not overwrite:
            raise BundleExistsError(f"{url}: destination exists; pass overwrite=True to replace it")
        if current.generation is None:
            # A plain layout (no pointer yet): create the pointer, then retire the plain objects.
            try:
                (store.put(key, body, mode="create"))
                return current
            except Exception as e:
                if type(e).__name__ != "AlreadyExistsError":
                    raise store_error(url, f"publish {STORE_POINTER_NAME}", e) from e
                continue
        try:
            (store.put(key, body, mode={"e_tag": current.etag}))
            return current
        except Exception as e:
            if type(e).__name__ not in ("PreconditionError", "AlreadyExistsError", "NotModifiedError"):
                raise store_error(url, f"publish {STORE_POINTER_NAME}", e) from e
            # Another writer swapped the pointer since we read it: read it again and retry.
    raise BundleError(
        f"{url}: other writers kept replacing the bundle; gave up after {_PUBLISH_ATTEMPTS} tries"
    )


def _discard_generation(place: _Place, generation: str) -> None:
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


def _retire(place: _Place, previous: Pointer) -> list[str]:
    """Delete the replaced generation, manifest first (the pointer no longer names it)."""
    url, store = place.url, place.store
    try:
        if previous.generation is None:
            objs = store.listing(url.key)
            keys = [
                m["path"]
                for m in objs
                if m["path"] == url.key_of(MANIFEST_NAME)
                or m["path"].startswith(url.key_of(SHARDS_DIR) + "/")
            ]
        else:
            objs = store.listing(url.key_of(previous.generation))
            keys = [m["path"] for m in objs]
        keys.sort(key=lambda k: not k.endswith(MANIFEST_NAME))
        (store.delete(keys))
        return keys
    except Exception:
        return []  # left for gc: no pointer names it


def _rewrite_message(error: BaseException, local: str, url: str) -> None:
    """Name the URL, not the local scratch copy, in an error of the local writer."""
    if error.args and isinstance(error.args[0], str):
        error.args = (error.args[0].replace(local, url), *error.args[1:])


def write_remote_bundle(
    url_text: str,
    samples: Iterable[Any],
    *,
    media_roots: Any = (),
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    shared_media: bool = False,
    **kwargs: Any,
) -> StoreURL:
    """:func:`bundles.write_bundle` for a URL (see the module docstring)."""
    from bundles._commit import scratch_dir
    from bundles._writer import _media_roots, write_bundle

    url = StoreURL(url_text)
    store = get_store(url, storage_options)
    if not overwrite and _check_absent(store, url) is not None:
        raise BundleExistsError(f"{url}: destination exists; pass overwrite=True to replace it")
    roots = _media_roots(media_roots, Path(url.name))
    # Beside the first media root: same filesystem, so the local writer hard-links media.
    beside = os.path.abspath(roots[0]) if roots else os.path.join(tempfile.gettempdir(), "rollout-bundles")
    scratch = scratch_dir(beside, "upload")
    try:
        local = scratch / url.name
        try:
            write_bundle(local, samples, media_roots=roots, progress=progress, **kwargs)
        except BundleError as e:
            _rewrite_message(e, str(local), str(url))
            raise
        upload_bundle(
            local,
            url,
            overwrite=overwrite,
            shared_media=shared_media,
            storage_options=storage_options,
            progress=progress,
        )
    finally:
        remove_tree(scratch)
    return url


def remove_remote_bundle(url_text: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the bundle at ``url``: the pointer first (so no reader finds half of it), then its
    generation and, unless shared, its media. Shared media are left to :func:`collect_garbage`."""
    place = _place(url_text, storage_options, "read the pointer")
    url, store = place.url, place.store
    try:
        if place.pointer.generation is None:
            (store.delete([url.key_of(MANIFEST_NAME)]))
        else:
            (store.delete([url.key_of(STORE_POINTER_NAME)]))
        objs = store.listing(url.key)
        keys = sorted((m["path"] for m in objs), key=lambda k: not k.endswith(MANIFEST_NAME))
        if keys:
            (store.delete(keys))
    except Exception as e:
        raise store_error(url, "remove the bundle", e) from e


# -- packed files --------------------------------------------------------------------------------
def pack_to_store(
    path: Any, url_text: str, *, overwrite: bool = False, progress: bool | None = None
) -> StoreURL:
    """:func:`bundles.pack_bundle` onto a store: packed locally, then uploaded in one atomic put
    (create-only unless ``overwrite``)."""
    from bundles._pack import pack_bundle

    url = StoreURL(url_text)
    store = get_store(url)
    if not overwrite:
        try:
            if (store.head(url.key)) is not None:
                raise BundleExistsError(f"{url}: output exists; pass overwrite=True to replace it")
        except BundleError:
            raise
        except Exception as e:
            raise store_error(url, "look for an existing object", e) from e
    with tempfile.TemporaryDirectory(prefix="rollout-bundles-pack-") as tmp:
        out = pack_bundle(path, Path(tmp) / url.name, progress=progress)
        try:
            if out.stat().st_size > MULTIPART_THRESHOLD:
                if not overwrite and (store.head(url.key)) is not None:
                    raise BundleExistsError(f"{url}: output exists; pass overwrite=True to replace it")
                (store.put_large(url.key, out))  # a multipart upload appears atomically at its end
            else:
                (store.put(url.key, out.read_bytes(), mode="overwrite" if overwrite else "create"))
        except BundleError:
            raise
        except Exception as e:
            if type(e).__name__ == "AlreadyExistsError":
                raise BundleExistsError(f"{url}: output appeared during the pack; not replaced") from None
            raise store_error(url, "upload the packed bundle", e) from e
    return url


def unpack_from_store(
    url_text: str, out_dir: Any, *, overwrite: bool = False, progress: bool | None = None
) -> Any:
    """:func:`bundles.unpack_bundle` from a packed object on a store: read in place, every member
    checked by the same rules, written to a local directory and fully verified there."""
    from bundles._commit import scratch_dir
    from bundles._pack import unpack_bundle

    url = StoreURL(url_text)
    dest = Path(os.path.abspath(out_dir))
    if os.path.lexists(dest) and not overwrite:
        raise BundleExistsError(f"{dest}: output exists; pass overwrite=True to replace it")
    source = StorePackedSource(url, get_store(url))
    scratch = scratch_dir(dest, "download")
    try:
        packed = scratch / url.name
        with open(packed, "xb") as f:
            data = (source._store.get(url.key))[0]
            f.write(data)
        try:
            return unpack_bundle(packed, dest, overwrite=overwrite, progress=progress)
        except BundleError as e:
            _rewrite_message(e, str(packed), str(url))
            raise
    finally:
        remove_tree(scratch)


def object_size(url_text: str, storage_options: Mapping[str, Any] | None = None) -> int:
    """The size of one object (a packed bundle on a store)."""
    url = StoreURL(url_text)
    try:
        meta = get_store(url, storage_options).head(url.key)
    except Exception as e:
        raise store_error(url, "read the object's size", e) from e
    if meta is None:
        raise BundleNotFoundError(f"{url}: no object here")
    return int(meta["size"])


# -- garbage -------------------------------------------------------------------------------------
@dataclass
class GarbageReport:
    """What :func:`collect_garbage` found (and removed, unless ``dry_run``)."""

    bundles: int = 0
    generations: list[str] = field(default_factory=list)  # unpublished or replaced generations
    media: list[str] = field(default_factory=list)  # unreferenced media of shared pools
    bytes: int = 0
    kept_young: int = 0  # garbage younger than the grace period, left alone
    dry_run: bool = False


def collect_garbage(
    prefix_text: str,
    *,
    older_than_s: float = 24 * 3600.0,
    dry_run: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> GarbageReport:
    """Remove, under ``prefix``, every generation that no pointer names and every media file of a
    pool that no live manifest lists, when older than ``older_than_s`` (see the module
    docstring). With ``dry_run``, only report them."""
    url = StoreURL(prefix_text)
    store = get_store(url, storage_options)
    report = GarbageReport(dry_run=dry_run)
    try:
        objects = store.listing(url.key)
    except Exception as e:
        raise store_error(url, "list", e) from e
    now = datetime.datetime.now(datetime.timezone.utc)
    by_key = {m["path"]: m for m in objects}
    live_gens: set[str] = set()  # "<bundle key>/<generation>"
    referenced: set[str] = set()  # media keys some live manifest lists
    pools: set[str] = set()
    unjudged: set[str] = set()
    for key in sorted(by_key):
        if not key.endswith("/" + STORE_POINTER_NAME) and key != STORE_POINTER_NAME:
            continue
        bundle_key = key[: -len(STORE_POINTER_NAME)].rstrip("/")
        bundle_url = StoreURL(f"{url.scheme}://{url.bucket}/{bundle_key}")
        try:
            data, meta = store.get(key)
            pointer = parse_pointer(data, f"{bundle_url}/{STORE_POINTER_NAME}", meta.get("e_tag"))
            place = _Place(bundle_url, store, pointer)
            manifest = json.loads((store.get(place.key(MANIFEST_NAME)))[0])
        except (FileNotFoundError, BundleError):
            # Removed meanwhile, or a pointer this version cannot read (a newer pointer_version):
            # not ours to judge, so nothing under that bundle is garbage.
            unjudged.add(bundle_key)
            continue
        except Exception as e:
            raise store_error(bundle_url, "read the bundle", e) from e
        report.bundles += 1
        live_gens.add(bundle_key.rstrip("/") + "/" + str(pointer.generation))
        pools.add(place.media_prefix)
        for entry in manifest.get("media", []):
            referenced.add(f"{place.media_prefix}/{entry['digest'][7:]}{entry['suffix']}")
    # Plain layouts (a directory bundle synced verbatim: U/manifest.json, no pointer) are live too.
    for key in sorted(by_key):
        if not key.endswith("/" + MANIFEST_NAME) or _GEN_KEY_RE.fullmatch(key):
            continue
        bundle_key = key[: -len(MANIFEST_NAME) - 1]
        if f"{bundle_key}/{STORE_POINTER_NAME}" in by_key:
            continue
        try:
            manifest = json.loads((store.get(key))[0])
            names = [f"{e['digest'][7:]}{e['suffix']}" for e in manifest.get("media", [])]
        except Exception:
            continue
        report.bundles += 1
        pools.add(f"{bundle_key}/{MEDIA_DIR}")
        referenced.update(f"{bundle_key}/{MEDIA_DIR}/{n}" for n in names)
    # The media/ of every bundle prefix (one with a pointer, or with generations: a writer that
    # died before publishing) hold only that bundle's media: unlisted ones are garbage.
    for key in by_key:
        g = _GEN_KEY_RE.fullmatch(key)
        if g:
            pools.add(f"{g['gen'].rpartition('/')[0]}/{MEDIA_DIR}".lstrip("/"))
    doomed: list[str] = []
    for key, m in by_key.items():
        if any(key.startswith(u + "/") for u in unjudged):
            continue
        age = (now - m["last_modified"]).total_seconds()
        g = _GEN_KEY_RE.fullmatch(key)
        parent, _, name = key.rpartition("/")
        if g:
            garbage = g["gen"] not in live_gens
            if garbage and age > older_than_s and g["gen"] not in report.generations:
                report.generations.append(g["gen"])
        else:
            in_pool = parent in pools or parent == STORE_MEDIA_POOL or parent.endswith("/" + STORE_MEDIA_POOL)
            garbage = in_pool and key not in referenced and layout_name_ok(f"{MEDIA_DIR}/{name}")
            if garbage and age > older_than_s:
                report.media.append(key)
        if garbage:
            if age > older_than_s:
                doomed.append(key)
                report.bytes += int(m["size"])
            else:
                report.kept_young += 1
    if not dry_run and doomed:
        doomed.sort(key=lambda k: not k.endswith("/" + MANIFEST_NAME))
        try:
            (store.delete(doomed))
        except Exception as e:
            raise store_error(url, "delete garbage", e) from e
    return report
