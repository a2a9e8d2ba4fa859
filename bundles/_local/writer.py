"""``write_bundle``: encode samples, ingest the media they reference, commit atomically.

Cost model. Hashing is the expensive part of a save (sha256 runs at ~1.4 GB/s; a hardlink costs
microseconds), so the writer avoids hashing bytes it does not copy:

* a file whose name is already its digest (``<64 hex><suffix>``, as run media stores name files)
  or a ``MediaRef`` that carries its digest is trusted *when it is hardlinked or reflinked*: the
  bundle then holds exactly the bytes that were named, so a lying name makes ``verify="full"``
  fail; it can never produce a bundle that fully verifies with wrong content;
* a copied file is hashed while it is copied, and a mismatch with its name or ``MediaRef`` is an
  error at write time;
* a linked file with no digest in its name is hashed once (after linking, from the page cache).

Each distinct source path is ingested once per bundle, and each digest stored once.
The commit protocol is described in :mod:`bundles._local.commit`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import zstandard

from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleIOError,
    UnsupportedValueError,
)
from bundles._format.codec import gc_paused
from bundles._format.encoder import SampleEncoder
from bundles._format.layout import (
    DIGEST_PREFIX,
    FORMAT_NAME,
    FORMAT_VERSION,
    KIND_RE,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_NESTING_DEPTH,
    MEDIA_DIR,
    SHARD_NAME_FORMAT,
    SHARD_TARGET_RAW_BYTES,
    SHARDS_DIR,
    ZSTD_LEVEL,
)
from bundles._format.manifest import nesting_depth_exceeds
from bundles._format.options import OUTSIDE_PATHS, LinkMode, OutsidePolicy
from bundles._local.commit import commit, create_staging
from bundles._local.faults import fault_point
from bundles._local.fs import (
    Durability,
    check_link_mode,
    make_read_only,
    remove_tree,
)
from bundles._local.ingest import MediaIngester
from bundles._local.progress import Progress
from bundles._version import __version__


def _package_version() -> str:
    return __version__


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """Canonical JSON: sorted keys, compact, ASCII, no NaN, one trailing newline.

    Compact output keeps json's C encoder in play (``indent`` falls back to pure Python, ~10x
    slower on a manifest listing thousands of media files)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode()


def _find_non_json(value: Any, where: str, depth: int = 0) -> str | None:
    """The key path and reason of the first value in ``value`` that JSON would not give back as it
    went in (a non-finite float, a non-string key, any other type), or None."""
    if depth > MAX_NESTING_DEPTH:
        return f"{where}: nested deeper than {MAX_NESTING_DEPTH} levels (counting the manifest)"
    if value is None or isinstance(value, (str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where}: expected a finite number, found {value!r}"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where}: keys must be strings, found {k!r}"
            found = _find_non_json(v, f"{where}.{k}", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _find_non_json(v, f"{where}[{i}]", depth + 1)
            if found:
                return found
        return None
    t = type(value)
    return f"{where}: expected a JSON-compatible value, found {t.__module__}.{t.__qualname__}"


def _check_meta(meta: Any, dest: Path) -> dict[str, Any]:
    """``meta`` as the manifest will hold it; anything JSON would not give back as it went in is
    refused naming its key path (``meta.metadata.step``)."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise BundleError(f"{dest}: meta: expected a JSON-compatible dict, found {type(meta).__name__}")
    problem = _find_non_json(meta, "meta")
    if problem:
        raise BundleError(f"{dest}: {problem} (the manifest is JSON)")
    text = json.dumps(meta, allow_nan=False)
    if len(text) > MAX_MANIFEST_BYTES:  # before any sample is written: no reader would open it
        raise BundleError(
            f"{dest}: meta: {len(text)} bytes of JSON, over the manifest cap of {MAX_MANIFEST_BYTES} "
            "(MAX_MANIFEST_BYTES: no reader would open the bundle)"
        )
    clean = dict(json.loads(text))
    # The manifest is level 1 and meta level 2: what readers accept (docs/FORMAT.md §2).
    if nesting_depth_exceeds(clean, MAX_NESTING_DEPTH - 1):
        raise BundleError(
            f"{dest}: meta: nested deeper than {MAX_NESTING_DEPTH} levels (counting the manifest)"
        )
    return clean


# Raw bytes of a shard below which it is compressed on the calling thread (see _ShardWriter).
_THREADED_FROM = 4 * 1024 * 1024


class _ShardWriter:
    """Streams encoded samples into zstandard frames, one shard file per ~64 MiB of samples.

    A shard's first :data:`_THREADED_FROM` raw bytes are held back. A shard that ends below it
    (a save of a few hundred samples) is compressed on the calling thread at the flush: zstd's
    worker would get less than one of its jobs, and the save would wait for all of it at the
    flush with nothing to overlap. A longer shard streams through zstd's own worker thread
    (``threads=1``) while Python encodes the next samples, so compression costs the save almost
    nothing. Which of the two a shard gets depends on its raw size alone, and zstd's threaded
    output does not depend on the machine's core count: the same samples give the same bytes
    everywhere.
    """

    def __init__(self, shards_dir: Path, durability: Durability) -> None:
        self.shards_dir = shards_dir
        self.durability = durability
        self.entries: list[dict[str, Any]] = []
        self._threaded = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, threads=1)
        self._inline = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        self._start_shard()

    def _start_shard(self) -> None:
        self._stream: Any = None  # None while the shard's samples are held back
        self._held: list[bytes] = []
        self._chunks: list[bytes] = []
        self._raw = 0
        self._count = 0

    def _open_stream(self, compressor: Any) -> None:
        self._stream = compressor.compressobj()
        for encoded in self._held:
            self._compress(encoded)
        self._held = []

    def _compress(self, encoded: bytes) -> None:
        chunk = self._stream.compress(encoded)
        if chunk:
            self._chunks.append(chunk)

    def add(self, encoded: bytes) -> None:
        self._raw += len(encoded)
        self._count += 1
        if self._stream is not None:
            self._compress(encoded)
        else:
            self._held.append(encoded)
            if self._raw >= _THREADED_FROM:
                self._open_stream(self._threaded)
        if self._raw >= SHARD_TARGET_RAW_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._count:
            return
        if self._stream is None:
            self._open_stream(self._inline)
        self._chunks.append(self._stream.flush())
        name = SHARD_NAME_FORMAT.format(index=len(self.entries))
        path = self.shards_dir / name
        # The chunks are written and hashed one by one: joining them first copied the shard.
        digest = hashlib.sha256()
        with open(path, "xb") as f:
            for chunk in self._chunks:
                f.write(chunk)
                digest.update(chunk)
        fault_point("write.shard")
        make_read_only(str(path))
        self.durability.add(str(path))
        self.entries.append(
            {
                "path": f"{SHARDS_DIR}/{name}",
                "samples": self._count,
                "size": sum(map(len, self._chunks)),
                "raw_size": self._raw,
                "digest": DIGEST_PREFIX + digest.hexdigest(),
            }
        )
        self._start_shard()


def _as_dict(sample: Any, dest: Path, index: int) -> dict[Any, Any]:
    if isinstance(sample, dict):
        return sample
    to_dict = getattr(sample, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, dict):
            return d
    raise UnsupportedValueError(
        f"{dest}: samples[{index}]: expected a dict or an object with to_dict(), found {type(sample).__name__}"
    )


def write_local(
    dest: str | os.PathLike[str],
    samples: Iterable[Any],
    *,
    media_roots: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    kind: str,
    meta: Mapping[str, Any] | None,
    link: LinkMode | str,
    overwrite: bool,
    progress: bool | None,
    missing_media: str,
    outside_paths: OutsidePolicy,
) -> Path:
    """:func:`bundles.write_bundle` into a local directory (its arguments, errors and protocol).
    Every option is passed: their defaults are write_bundle's, stated once there."""
    dest = Path(os.path.abspath(dest))
    link = check_link_mode(link)
    roots = resolve_media_roots(media_roots, dest)
    if not callable(outside_paths) and outside_paths not in OUTSIDE_PATHS:
        raise BundleError(
            f"{dest}: outside_paths: expected one of {', '.join(OUTSIDE_PATHS)} or a callable, found {outside_paths!r}"
        )
    if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
        raise BundleError(f"{dest}: kind: expected lowercase letters, digits and '_', found {kind!r}")
    meta_clean = _check_meta(meta, dest)
    if isinstance(samples, (str, bytes, Mapping)) or not isinstance(samples, Iterable):
        raise UnsupportedValueError(
            f"{dest}: samples: expected an iterable of sample dicts, found {type(samples).__name__}"
        )
    if missing_media not in ("error", "keep"):
        raise BundleError(f"{dest}: missing_media: expected 'error' or 'keep', found {missing_media!r}")
    if os.path.lexists(dest) and not overwrite:
        raise BundleExistsError(f"{dest}: destination exists; pass overwrite=True to replace it")

    try:
        return _write(
            dest, samples, roots, kind, meta_clean, link, overwrite, progress, missing_media, outside_paths
        )
    except OSError as e:
        if isinstance(e, BundleError):
            raise
        raise BundleIOError.wrap(dest, "write the bundle", e) from e


def _manifest_bytes_of(
    dest: Path, kind: str, meta_clean: dict[str, Any], count: int, shards: _ShardWriter, media: MediaIngester
) -> bytes:
    """The manifest of what was written, serialized; refused (nothing committed) when a reader
    would refuse it for its size."""
    stored = sorted(media.stored.values(), key=lambda r: (r.digest, r.suffix))
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "created_by": f"rollout-bundles {_package_version()}",
        "meta": meta_clean,
        "sample_count": count,
        "shards": shards.entries,
        "media": [{"digest": r.digest, "size": r.size, "suffix": r.suffix} for r in stored],
        "media_references": media.references,
    }
    fault_point("write.manifest")
    raw = manifest_bytes(manifest)
    if len(raw) > MAX_MANIFEST_BYTES:  # a reader refuses it: never commit what no one can open
        raise BundleError(
            f"{dest}: the manifest would be {len(raw)} bytes ({len(stored)} media files, "
            f"{len(shards.entries)} shards), over the cap of {MAX_MANIFEST_BYTES} (MAX_MANIFEST_BYTES); "
            "nothing was written: split the samples into several bundles"
        )
    return raw


def _write(
    dest: Path,
    samples: Iterable[Any],
    media_roots: Sequence[str],
    kind: str,
    meta_clean: dict[str, Any],
    link: str,
    overwrite: bool,
    progress: bool | None,
    missing_media: str = "error",
    outside_paths: OutsidePolicy = "warn",
) -> Path:
    staging = create_staging(dest)
    try:
        (staging / SHARDS_DIR).mkdir()
        (staging / MEDIA_DIR).mkdir()
        media = MediaIngester(
            dest, staging, media_roots, link, outside_paths, keep_missing=missing_media == "keep"
        )
        encoder = SampleEncoder(
            media.resolve_string, media.resolve_ref, media.string_prefixes, store_image=media.store_image
        )
        shards = _ShardWriter(staging / SHARDS_DIR, media.durability)
        count = 0
        with gc_paused(), Progress(f"writing {dest.name}", unit="samples", enabled=progress) as bar:
            for index, sample in enumerate(samples):
                try:
                    encoded = encoder.encode(_as_dict(sample, dest, index), f"samples[{index}]")
                except UnsupportedValueError as e:
                    if str(e).startswith(str(dest)):
                        raise
                    raise UnsupportedValueError(f"{dest}: {e}") from None
                shards.add(encoded)
                count += 1
                bar.advance()
            shards.flush()
        raw = _manifest_bytes_of(dest, kind, meta_clean, count, shards, media)
        with open(staging / MANIFEST_NAME, "xb") as f:
            f.write(raw)
        make_read_only(str(staging / MANIFEST_NAME))
        media.durability.add(str(staging / MANIFEST_NAME))
        fault_point("write.durability")
        media.durability.sync([staging / SHARDS_DIR, staging / MEDIA_DIR, staging])
        commit(staging, dest, overwrite)
    except BaseException:
        if staging.exists():
            remove_tree(staging)
        raise
    media.warn_outside()
    return dest


def resolve_media_roots(media_roots: Any, dest: object) -> list[str]:
    """``media_roots`` as a list of path strings: one path (``str`` or path-like) is one root; an
    iterable gives one root per item. A bare ``str`` must never be iterated: its characters
    would make ``/`` a root, and every absolute path in a sample a reference."""
    if isinstance(media_roots, (str, os.PathLike)):
        items: list[Any] = [media_roots]
    elif isinstance(media_roots, (bytes, bytearray, Mapping)) or not isinstance(media_roots, Iterable):
        raise BundleError(
            f"{dest}: media_roots: expected a path or an iterable of paths, found {type(media_roots).__name__}"
        )
    else:
        items = list(media_roots)
    roots = []
    for i, r in enumerate(items):
        if not isinstance(r, (str, os.PathLike)):
            raise BundleError(
                f"{dest}: media_roots[{i}]: expected a str or path-like, found {type(r).__name__} {r!r}"
            )
        path = os.fspath(r)
        if not isinstance(path, str) or not path:
            raise BundleError(f"{dest}: media_roots[{i}]: expected a non-empty str path, found {path!r}")
        roots.append(path)
    return roots
