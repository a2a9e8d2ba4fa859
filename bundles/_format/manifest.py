"""Parsing and validating ``manifest.json`` exactly as docs/FORMAT.md §2 says.

The bytes must be UTF-8 (no byte order mark; UTF-16 and UTF-32, which ``json.loads`` would
otherwise detect and accept, are refused), hold one JSON object with no ``NaN``, ``Infinity`` or
float that overflows to infinity, nested no deeper than 64 levels. Every field the reader uses is
type- and range-checked here (ints are below 2**63, so ``len()`` and arithmetic on them cannot
overflow), so a manifest that parses is one that ``inspect`` and the reader can use without
meeting a value of the wrong type later.

The result is a :class:`Manifest`: the JSON object as stored (it *is* a ``dict``, so
``bundle.manifest["kind"]``, ``json.dumps(bundle.manifest)`` and comparisons keep working) with
its fields also as typed, named attributes (``manifest.kind``, ``manifest.shards[0].digest``),
set once here from the validated values. Code in this project reads the attributes; the item
access is for compatibility with callers that treated the manifest as the dict it used to be.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from bundles._errors import BundleFormatError, UnsafeBundleError
from bundles._format.layout import (
    DIGEST_RE,
    FORMAT_NAME,
    KIND_RE,
    MANIFEST_KEYS_REQUIRED,
    MAX_INT,
    MAX_NESTING_DEPTH,
    MAX_SHARD_RAW_BYTES,
    SHARD_NAME_FORMAT,
    SHARD_PATH_RE,
    SHARDS_DIR,
    SUFFIX_RE,
    SUPPORTED_FORMAT_VERSIONS,
)
from bundles._format.limits import MAX_MEDIA_BYTES

__all__ = [
    "Manifest",
    "MediaEntry",
    "ShardEntry",
    "decode_manifest_json",
    "nesting_depth_exceeds",
    "parse_format_version",
    "parse_manifest_bytes",
]


@dataclass(frozen=True)
class ShardEntry:
    """One entry of ``manifest["shards"]`` (FORMAT.md §2), validated."""

    path: str  #: ``samples/NNNNNN.msgpack.zst``, numbered from 0 without gaps
    samples: int  #: samples in the shard
    size: int  #: compressed bytes
    raw_size: int  #: decompressed bytes (bounded by MAX_SHARD_RAW_BYTES)
    digest: str  #: ``sha256:<hex>`` of the compressed bytes


@dataclass(frozen=True)
class MediaEntry:
    """One entry of ``manifest["media"]`` (FORMAT.md §2), validated."""

    digest: str  #: ``sha256:<hex>``
    size: int
    suffix: str  #: e.g. ``.png``; may be empty

    @property
    def filename(self) -> str:
        """The stored name, ``<hex><suffix>``, under ``media/``."""
        return self.digest[7:] + self.suffix


class Manifest(dict[str, Any]):
    """A validated manifest: the stored JSON object, with typed fields as attributes.

    Built only by :func:`parse_manifest_bytes` (``Manifest.parse``); see the module docstring.
    The attributes are set once from the validated values; treat the object as read-only.
    """

    format_version: int
    kind: str
    meta: dict[str, Any]
    sample_count: int
    shards: tuple[ShardEntry, ...]
    media: tuple[MediaEntry, ...]
    #: ``"rollout-bundles <version>"`` of the writer, when recorded
    created_by: str | None
    #: how many media references the samples hold, when recorded
    media_references: int | None

    @classmethod
    def parse(cls, raw: bytes, where: object) -> Manifest:
        """Validate the manifest bytes ``raw`` (read from ``where``, which messages name)."""
        return parse_manifest_bytes(raw, where)


def parse_format_version(manifest: dict[str, Any], where: object) -> int:
    version = manifest.get("format_version")
    if type(version) is not int or version not in SUPPORTED_FORMAT_VERSIONS:
        raise BundleFormatError(
            f"{where}: format_version: expected one of {sorted(SUPPORTED_FORMAT_VERSIONS)}, found {_short(version)}; "
            "a newer rollout-bundles may read it"
        )
    return version


def nesting_depth_exceeds(value: Any, limit: int) -> bool:
    """True when ``value`` (JSON-like) holds containers nested deeper than ``limit`` levels (a
    top-level container is level 1). Iterative: a hostile depth cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        obj, depth = stack.pop()
        items = obj.values() if type(obj) is dict else obj if type(obj) is list else None
        if items is None:
            continue
        if depth > limit:
            return True
        stack.extend((v, depth + 1) for v in items if type(v) is dict or type(v) is list)
    return False


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_INT


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows a float64")
    return value


def decode_manifest_json(raw: bytes, where: object) -> Any:
    """The JSON value in ``raw``, refusing what FORMAT.md §2 refuses (see the module docstring)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise BundleFormatError(
            f"{where}: starts with a byte order mark; the manifest must be UTF-8 without one"
        )
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in raw:
        raise BundleFormatError(
            f"{where}: not UTF-8 (a NUL byte or a UTF-16/32 byte order mark); the manifest must be UTF-8 JSON"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleFormatError(f"{where}: not UTF-8: {e}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise BundleFormatError(f"{where}: nested deeper than {MAX_NESTING_DEPTH} levels") from None
    except ValueError as e:  # json.JSONDecodeError, a huge int, a non-finite number
        raise BundleFormatError(f"{where}: not valid JSON: {e}") from None
    if nesting_depth_exceeds(value, MAX_NESTING_DEPTH):
        raise BundleFormatError(f"{where}: nested deeper than {MAX_NESTING_DEPTH} levels")
    return value


def _int_field(ent: dict[str, Any], key: str, field: str, where: object) -> int:
    value: Any = ent.get(key)
    if not _is_int(value):
        raise BundleFormatError(
            f"{where}: {field}.{key}: expected an int in [0, 2**63), found {_short(value)}"
        )
    return int(value)


def _digest_field(ent: dict[str, Any], field: str, where: object) -> None:
    digest = ent.get("digest")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise BundleFormatError(
            f"{where}: {field}.digest: expected 'sha256:<64 lowercase hex>', found {_short(digest)}"
        )


def parse_manifest_bytes(raw: bytes, where: object) -> Manifest:
    """Validate the manifest bytes ``raw`` (read from ``where``, which messages name); the one
    place a manifest is parsed."""
    manifest = decode_manifest_json(raw, where)
    if not isinstance(manifest, dict):
        raise BundleFormatError(f"{where}: expected a JSON object, found {type(manifest).__name__}")
    kind = _check_top_fields(manifest, where)
    shards = _parse_shards(manifest, where)
    media = _parse_media(manifest, where)
    out = Manifest(manifest)
    out.format_version = manifest["format_version"]
    out.kind = kind
    out.meta = manifest["meta"]
    out.sample_count = manifest["sample_count"]
    out.shards = shards
    out.media = media
    out.created_by = manifest.get("created_by")
    out.media_references = manifest.get("media_references")
    return out


def _check_top_fields(manifest: dict[str, Any], where: object) -> str:
    """Check the manifest's scalar fields (FORMAT.md §2) in the order the spec lists them, so
    the first error is the same one every reader reports; return the kind."""
    if manifest.get("format") != FORMAT_NAME:
        raise BundleFormatError(
            f"{where}: format: expected {FORMAT_NAME!r}, found {_short(manifest.get('format'))}"
        )
    parse_format_version(manifest, where)
    for key in MANIFEST_KEYS_REQUIRED:
        if key not in manifest:
            raise BundleFormatError(f"{where}: {key}: required field is missing")
    kind = manifest["kind"]
    if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
        raise BundleFormatError(
            f"{where}: kind: expected lowercase letters, digits and '_' ([a-z][a-z0-9_]{{0,63}}), found {_short(kind)}"
        )
    if not isinstance(manifest["meta"], dict):
        raise BundleFormatError(f"{where}: meta: expected an object, found {type(manifest['meta']).__name__}")
    if not _is_int(manifest["sample_count"]):
        raise BundleFormatError(
            f"{where}: sample_count: expected an int in [0, 2**63), found {_short(manifest['sample_count'])}"
        )
    for key in ("media_references",):
        if key in manifest and not _is_int(manifest[key]):
            raise BundleFormatError(
                f"{where}: {key}: expected an int in [0, 2**63), found {_short(manifest[key])}"
            )
    if "created_by" in manifest and not isinstance(manifest["created_by"], str):
        raise BundleFormatError(
            f"{where}: created_by: expected a string, found {_short(manifest['created_by'])}"
        )
    return kind


def _parse_shards(manifest: dict[str, Any], where: object) -> tuple[ShardEntry, ...]:
    """The validated ``shards`` list; their sample counts must add up to ``sample_count``."""
    shards = manifest["shards"]
    if not isinstance(shards, list):
        raise BundleFormatError(f"{where}: shards: expected a list, found {type(shards).__name__}")
    entries = tuple(_parse_shard(ent, i, where) for i, ent in enumerate(shards))
    total = sum(entry.samples for entry in entries)
    if total != manifest["sample_count"]:
        raise BundleFormatError(
            f"{where}: sample_count: {manifest['sample_count']} disagrees with the shards' total of {total}"
        )
    return entries


def _parse_shard(ent: Any, i: int, where: object) -> ShardEntry:
    field = f"shards[{i}]"
    if not isinstance(ent, dict):
        raise BundleFormatError(f"{where}: {field}: expected an object, found {type(ent).__name__}")
    p = ent.get("path")
    # A path that could escape the bundle is unsafe; a well-formed one out of sequence is
    # merely malformed.
    if not isinstance(p, str) or not SHARD_PATH_RE.fullmatch(p):
        raise UnsafeBundleError(
            f"{where}: {field}.path: expected 'samples/NNNNNN.msgpack.zst', found {_short(p)}"
        )
    expected_path = f"{SHARDS_DIR}/{SHARD_NAME_FORMAT.format(index=i)}"
    if p != expected_path:
        raise BundleFormatError(
            f"{where}: {field}.path: expected {expected_path!r} (shards are numbered from 0 without gaps), found {p!r}"
        )
    samples = _int_field(ent, "samples", field, where)
    size = _int_field(ent, "size", field, where)
    raw_size = _int_field(ent, "raw_size", field, where)
    if raw_size > MAX_SHARD_RAW_BYTES:
        raise UnsafeBundleError(
            f"{where}: {field}.raw_size: {raw_size} exceeds the cap of {MAX_SHARD_RAW_BYTES} bytes"
        )
    if samples > raw_size:
        raise BundleFormatError(
            f"{where}: {field}.samples: {samples} samples cannot fit in raw_size {raw_size} bytes (each takes at least one)"
        )
    _digest_field(ent, field, where)
    return ShardEntry(p, samples, size, raw_size, ent["digest"])


def _parse_media(manifest: dict[str, Any], where: object) -> tuple[MediaEntry, ...]:
    """The validated ``media`` list, each stored name listed once."""
    media = manifest["media"]
    if not isinstance(media, list):
        raise BundleFormatError(f"{where}: media: expected a list, found {type(media).__name__}")
    seen: set[str] = set()
    entries: list[MediaEntry] = []
    for i, ent in enumerate(media):
        field = f"media[{i}]"
        if not isinstance(ent, dict):
            raise BundleFormatError(f"{where}: {field}: expected an object, found {type(ent).__name__}")
        _digest_field(ent, field, where)
        suffix = ent.get("suffix")
        if not isinstance(suffix, str) or not SUFFIX_RE.fullmatch(suffix):
            raise UnsafeBundleError(f"{where}: {field}.suffix: expected e.g. '.png', found {_short(suffix)}")
        entry = MediaEntry(ent["digest"], _int_field(ent, "size", field, where), suffix)
        if entry.size > MAX_MEDIA_BYTES:  # before any reader sizes a buffer or a loop from it
            raise UnsafeBundleError(
                f"{where}: {field}.size: {entry.size} exceeds MAX_MEDIA_BYTES, the cap of {MAX_MEDIA_BYTES} bytes"
            )
        if entry.filename in seen:
            raise BundleFormatError(f"{where}: {field}: {ent['digest']}{suffix} is listed twice")
        seen.add(entry.filename)
        entries.append(entry)
    return tuple(entries)
