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
``U/bundle.json``  (:data:`~bundles._format.layout.STORE_POINTER_NAME`)
    the pointer: which generation is the bundle, the manifest's size and digest, and where the
    media are. Publishing is one conditional put of this small object: create-only for a new
    bundle (of two racing writers exactly one wins; the other gets :class:`BundleExistsError`
    and nothing of the winner's is touched), or, with ``overwrite=True``, a compare-and-swap on
    the pointer's ETag (a writer that loses the swap reads the pointer again and retries: the
    last writer wins, as with directories, and no writer's update is applied over one it did not
    see). The writer then reads the pointer back: one that names another generation means its
    put was overtaken (a store that dropped the preconditions after the probe), and it is told it
    lost. The replaced generation is then deleted, manifest first.

Verify, then publish (:mod:`bundles._store.verify`): before the pointer is put, every object
the manifest lists is proven (what the writer put, by the bytes it hashed and sent; what it
skipped as already there, by reading it back and hashing it), so a generation that cannot be
proven is never published; after the pointer, the writer puts back what a racing ``rm`` or
``gc`` deleted.

A reader reads the pointer, then the manifest it names, and checks the manifest's digest
against the pointer: it never sees a torn bundle, only the old one or the new one. A prefix
without a pointer (a writer that died, or lost a race) is invisible, and ``gc`` removes it once
it is older than a limit. A bundle copied verbatim onto a store (``aws s3 sync bundle_dir
s3://b/x``: ``U/manifest.json`` with no pointer) is read too.

Writing. ``Location.stage`` (:mod:`bundles._api.location`) writes the bundle into a local scratch
directory with the local writer (so every check, hash and error of ``write_bundle`` applies
unchanged; the scratch lies beside the first media root, so media are hard-linked, not copied)
and then uploads it with :func:`upload_bundle`, concurrently (:data:`~bundles._store.client.CONCURRENCY` requests in flight).

Reading. :class:`StoreSource` is a source for :class:`bundles._local.reader.Bundle`: the manifest is
read with a single GET, a shard once in 8 MiB ranges into an unnamed temporary file that is then
hashed and decoded as a local shard (never held in memory), media lazily with range reads
(:class:`RangeFile`), sizes from one listing of the generation and of the media prefix (of a
shared pool, only the names the manifest's media table finds). A packed ``.rbundle`` object is read
in place by :class:`StorePackedSource`: its tar headers are fetched by range reads, all at once
where the packer's deterministic layout predicts them, and checked by the same
:func:`bundles._local.archive.read_tar_index` as a local packed file.

Garbage and reference accounting. Media in a shared pool belong to every bundle whose manifest
lists them, so nothing deletes them when one bundle goes: :func:`collect_garbage` sweeps, once
they are older than ``older_than`` on the store's own clock (the grace period that protects a writer that has uploaded
media but not yet published its pointer), the generations that no pointer names and the media
that no live manifest lists, and nothing it cannot prove a writer of ours wrote: a pool
``A/.media`` only against every bundle ``A/<name>`` (a prefix inside a pool or a generation is
refused, :class:`~bundles._errors.GarbagePrefixError`), only when one of their pointers names
``../.media``, and not at all while one of them cannot be read; objects of others that look like
media by name are left and reported. The rule, and why it holds, is in :mod:`bundles._store.gc`.
A missing bucket is a :class:`~bundles._errors.BucketNotFoundError` naming it, on reads as on
writes; nothing creates buckets. Stale multipart uploads are not listed by obstore; writers use
multipart only for media over :data:`MULTIPART_THRESHOLD`, and a bucket lifecycle rule
(``AbortIncompleteMultipartUpload``) removes abandoned parts.
"""

from __future__ import annotations

# One module per part of the protocol, importing one way: _pointer <- _read <- _write <- _packed,
# and _gc on _pointer.
from bundles._store.gc import GarbageReport, collect_garbage
from bundles._store.packed import (
    list_packed_objects,
    object_exists,
    object_size,
    pack_on_store,
    remove_packed_object,
    unpack_on_store,
)
from bundles._store.pointer import (
    examine_on_store,
    has_bundle_on_store,
    inside_generation,
    list_remote_bundles,
)
from bundles._store.prefix import StorePrefix
from bundles._store.read import open_on_store
from bundles._store.write import UploadStats, remove_on_store, upload_bundle

__all__ = [
    "GarbageReport",
    "StorePrefix",
    "UploadStats",
    "collect_garbage",
    "examine_on_store",
    "has_bundle_on_store",
    "inside_generation",
    "list_packed_objects",
    "list_remote_bundles",
    "object_exists",
    "object_size",
    "open_on_store",
    "pack_on_store",
    "remove_on_store",
    "remove_packed_object",
    "unpack_on_store",
    "upload_bundle",
]
