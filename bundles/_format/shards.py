"""Reading one sample shard as a stream: verified bytes in, one sample at a time out.

**Verify first.** No sample is decoded before the shard's compressed bytes have been checked
against the manifest's digest: no sample of a damaged or tampered shard is ever yielded.
(Hashing only while decoding would hand out samples before the damage is known.) A shard on an
object store is copied once, in ranges, into an unnamed temporary file (``spill_shard`` in
``bundles/_local/reader.py``), then read as a local shard is, below: memory holds a range, the
disk the shard.

**A local shard: verified by a first pass, decoded from a second.** A shard in a directory or a
packed file is never held in memory: the reader hashes it in chunks of :data:`HASH_CHUNK`
(:func:`digest_problem`) and, when it matches, decodes it from the same open file read again from
its start (:class:`Rehashed`), hashing it once more on the way; bytes that differ from the ones
verified (the file rewritten between the passes) raise :class:`BundleVerificationError` at the
shard's end, or when a decoding error makes the reader hash the file again. Samples yielded
before that came from the bytes read then, each whole. So memory holds a chunk, never the
compressed shard (~50 MB at the writer's shard size; before issue 39, item 6 the reader held it,
and its peak grew with the bundle until its first shard was full), at the price of reading the
file twice, from the page cache (sha256 runs at ~1.4 GB/s against msgpack's ~100 MB/s of samples).

**Then stream.** The bytes are decompressed in chunks of :data:`FEED_CHUNK` into a streaming
msgpack ``Unpacker`` and samples come out one by one, so memory holds (a store's compressed
shard and) one chunk and one sample, never the decompressed shard: a small shard that declares (or really holds)
gigabytes costs no more than its largest sample. Checked on the way: the decompressed total never
passes the shard's ``raw_size`` (a zstd bomb stops there) and equals it at the end; one sample
holds at most ``MAX_SAMPLE_RAW_BYTES`` bytes and ``MAX_SAMPLE_ITEMS`` items (docs/FORMAT.md §8).

A problem found later in a shard (an unlisted reference in its 900th sample, a sample count that
disagrees with the manifest) is raised when the reader reaches it; the samples yielded before it
came from verified bytes and are whole.

**Key paths on failure only.** Decoding raises :class:`~bundles._format.decoder.Defect` without a key
path; this module then decodes that one sample again leniently and walks it to name the path
(:func:`~bundles._format.decoder.find_defect`).
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import msgpack
import zstandard

from bundles._errors import BundleError, BundleFormatError, UnsafeBundleError
from bundles._format.decoder import Defect, SampleDecoder, find_defect
from bundles._format.layout import MAX_SAMPLE_ITEMS, MAX_SAMPLE_RAW_BYTES
from bundles._format.manifest import ShardEntry
from bundles._format.media import MediaRef

# Decompressed bytes fed to msgpack at a time: large enough that the per-chunk Python work is
# noise, small enough to stay in cache.
FEED_CHUNK = 1 << 20
#: Compressed bytes of a local shard read (and hashed) at a time.
HASH_CHUNK = 1 << 20

#: A shard's verified compressed bytes, or a function giving them again as a fresh stream from
#: their start (a :class:`Rehashed` local file); :func:`iter_shard` takes either.
ShardData = bytes | Callable[[], Any]


def digest_problem(f: BinaryIO, entry: ShardEntry, where: str) -> str | None:
    """The first pass over a local shard: ``f`` hashed from its start in chunks (at most one
    byte past ``entry.size``: a file that grew differs), the problem in words or None."""
    digest, _ = _hash_from_start(f, entry.size)
    if digest != entry.digest:
        return f"{where}: digest: expected {entry.digest}, found {digest}"
    return None


def _hash_from_start(f: BinaryIO, size: int) -> tuple[str, int]:
    f.seek(0)
    h = hashlib.sha256()
    total = 0
    while total <= size:
        chunk = f.read(min(HASH_CHUNK, size + 1 - total))
        if not chunk:
            break
        h.update(chunk)
        total += len(chunk)
    return "sha256:" + h.hexdigest(), total


class Rehashed:
    """The second pass over a local shard: ``f`` read again from its start for the decoder and
    hashed on the way; at its end (or one byte past ``entry.size``) the digest must be the one
    the first pass verified, else ``changed(message)`` is raised (the file was rewritten
    between the passes; the samples yielded before came from the bytes read then)."""

    def __init__(self, f: BinaryIO, entry: ShardEntry, where: str, changed: Callable[[str], Exception]):
        f.seek(0)
        self._f, self._entry, self._where, self._changed = f, entry, where, changed
        self._hash = hashlib.sha256()
        self._total = 0

    def read(self, n: int = -1) -> bytes:
        left = self._entry.size + 1 - self._total
        chunk = self._f.read(min(HASH_CHUNK if n < 0 else n, left)) if left > 0 else b""
        self._hash.update(chunk)
        self._total += len(chunk)
        if not chunk or self._total > self._entry.size:
            digest = "sha256:" + self._hash.hexdigest()
            if digest != self._entry.digest or self._total != self._entry.size:
                raise self._changed(
                    f"{self._where}: digest: expected {self._entry.digest}, found {digest} "
                    "(the file changed while it was read)"
                )
        return chunk


def iter_shard(
    data: ShardData,
    entry: ShardEntry,
    where: str,
    media: Mapping[str, MediaRef],
    first_index: int,
    open_media: Callable[[str], BinaryIO] | None = None,
) -> Iterator[dict[Any, Any]]:
    """Yield the samples of one shard from its verified compressed bytes ``data`` (the bytes, or
    a function giving a fresh stream of them, see :data:`ShardData`).

    ``entry`` is the shard's manifest entry (its ``samples`` and ``raw_size``), ``where`` names
    the file in errors, ``media`` maps stored file names to their MediaRefs (with ``path``) and
    ``first_index`` is the index of the shard's first sample in the bundle. ``open_media(name)``
    opens a stored file where ``media`` paths are not files (a packed bundle).
    """
    expected = entry.samples
    index = first_index
    try:
        for obj in _objects(
            data, entry.raw_size, where, SampleDecoder(media, open_media=open_media), first_index
        ):
            if type(obj) is not dict:
                raise BundleFormatError(
                    f"{where}: samples[{index}]: expected a map, found {type(obj).__name__}"
                )
            if index - first_index == expected:
                raise BundleFormatError(f"{where}: samples: expected {expected}, found more")
            yield obj
            index += 1
    except Defect as d:
        raise _located(d, data, entry, where, media, first_index, index, open_media) from None
    if index - first_index != expected:
        raise BundleFormatError(f"{where}: samples: expected {expected}, found {index - first_index}")


def _objects(
    data: ShardData, limit: int, where: str, decoder: SampleDecoder, first_index: int, skip: int = 0
) -> Iterator[Any]:
    """The decoded msgpack objects of a shard, one at a time; the first ``skip`` are skipped
    without being built."""
    # The buffer holds the unfinished sample's bytes that msgpack has not consumed yet (at most
    # the sample limit, see below) plus one chunk.
    unpacker = decoder.unpacker(MAX_SAMPLE_RAW_BYTES + 2 * FEED_CHUNK)
    stream = data if isinstance(data, bytes) else data()
    reader = zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True, closefd=False)
    total = 0  # decompressed bytes so far
    start = 0  # where the current sample begins in the decompressed stream
    index = first_index
    while True:
        chunk = _feed(reader, unpacker, limit, total, where, index)
        total += len(chunk)
        while True:
            # The collector is paused while a sample is built (see gc_paused; inlined: this runs
            # once per sample).
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                obj = unpacker.skip() if skip else unpacker.unpack()
            except msgpack.OutOfData:
                break  # every byte after ``start`` belongs to the unfinished sample
            except (Defect, BundleError):
                raise
            except MemoryError:
                raise BundleError(
                    f"{where}: samples[{index}]: out of memory while decoding it (one sample within the "
                    "format's limits may need up to ~3.5 GiB, docs/FORMAT.md §8)"
                ) from None
            except Exception as e:  # msgpack's ValueError subclasses, TypeError (unhashable keys)
                raise _malformed(where, index, e) from None
            finally:
                if gc_was_enabled:
                    gc.enable()
            decoder.sample_done()
            end = unpacker.tell()
            if end - start > MAX_SAMPLE_RAW_BYTES:
                raise _too_large(where, index)
            start = end
            if skip:
                skip -= 1
            else:
                yield obj
            index += 1
        if total - start > MAX_SAMPLE_RAW_BYTES:
            raise _too_large(where, index)
        if not chunk:
            break
    if total != limit:
        raise UnsafeBundleError(f"{where}: raw_size: expected {limit} decompressed bytes, found {total}")
    if start != total:  # bytes after the last whole sample: msgpack holds a partial one
        raise BundleFormatError(f"{where}: samples[{index}]: truncated: the shard ends inside a sample")


def _feed(reader: Any, unpacker: msgpack.Unpacker, limit: int, total: int, where: str, index: int) -> bytes:
    """The next chunk of decompressed bytes after the ``total`` read so far, fed to ``unpacker``:
    empty at the stream's end; a byte beyond the shard's raw size ``limit`` is refused."""
    try:
        chunk = reader.read(min(FEED_CHUNK, limit + 1 - total))
    except zstandard.ZstdError as e:
        raise BundleFormatError(f"{where}: not a valid zstandard stream: {e}") from None
    if total + len(chunk) > limit:
        raise UnsafeBundleError(
            f"{where}: raw_size: expected {limit} decompressed bytes, found more than {limit}"
        )
    try:
        unpacker.feed(chunk)
    except msgpack.BufferFull:
        raise _too_large(where, index) from None
    except MemoryError:
        raise BundleError(
            f"{where}: samples[{index}]: out of memory while buffering it (one sample within the "
            "format's limits may need up to ~3.5 GiB, docs/FORMAT.md §8)"
        ) from None
    return chunk


def _too_large(where: str, index: int) -> UnsafeBundleError:
    return UnsafeBundleError(
        f"{where}: samples[{index}]: more than {MAX_SAMPLE_RAW_BYTES} bytes; the format's per-sample limit"
    )


def _malformed(where: str, index: int, e: Exception) -> BundleFormatError:
    if "exceeds max_" in str(e):  # msgpack's own length limits, set to the per-sample ones
        return UnsafeBundleError(
            f"{where}: samples[{index}]: {e}: beyond the format's per-sample limits of "
            f"{MAX_SAMPLE_RAW_BYTES} bytes and {MAX_SAMPLE_ITEMS} items"
        )
    return BundleFormatError(f"{where}: samples[{index}]: malformed msgpack: {e}")


def _located(
    defect: Defect,
    data: ShardData,
    entry: ShardEntry,
    where: str,
    media: Mapping[str, MediaRef],
    first_index: int,
    index: int,
    open_media: Callable[[str], BinaryIO] | None = None,
) -> BundleFormatError:
    """The error for ``defect`` in sample ``index``, with the key path when it can be found by
    decoding that sample again leniently (a second pass, only on failure)."""
    path = f"samples[{index}]"
    if not defect.locate:
        return UnsafeBundleError(f"{where}: {path}: {defect.message}")
    found = None
    lenient = SampleDecoder(media, lenient=True, open_media=open_media)
    try:
        sample = next(_objects(data, entry.raw_size, where, lenient, first_index, skip=index - first_index))
        found = find_defect(sample, path)
    except Exception:
        pass  # the lenient pass failed otherwise: report what the strict one found, at the sample
    if found is None:
        return BundleFormatError(f"{where}: {path}: {defect.message}")
    return BundleFormatError(f"{where}: {found[0]}: {found[1]}")
