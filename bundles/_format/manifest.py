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
One item differs from the stored JSON: ``media`` is a :class:`~bundles._format.mediatable.MediaTable`
(the entries as columns, ~44 bytes a file, parsed an entry at a time), which ``json.dumps``
still writes as the stored list (:meth:`Manifest.items`).

**Memory** (issue 39, item 6). The manifest is read through a window
(:mod:`bundles._format.textwindow`): :func:`parse_manifest_file` reads a file a window at a
time, never whole; :func:`parse_manifest_bytes` decodes bytes a window at a time, never to one
text. Either parse still reads every byte before the manifest is trusted (the "Extra data" check
at the end, a bad media entry anywhere, a repeat). Only where the window gives up (any error) is
the whole text parsed, so that a refusal's message and position are ``json.loads``'s, as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from bundles._errors import BundleError, BundleFormatError, UnsafeBundleError
from bundles._format import textwindow
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
from bundles._format.limits import MAX_MANIFEST_BYTES, MAX_MEDIA_BYTES, MAX_MEDIA_COUNT
from bundles._format.mediatable import MediaEntry, MediaTable
from bundles._format.textwindow import DECODER, WHITESPACE, TextWindow, WindowGaveUp

__all__ = [
    "Manifest",
    "MediaEntry",
    "ShardEntry",
    "decode_manifest_json",
    "nesting_depth_exceeds",
    "parse_format_version",
    "parse_manifest_bytes",
    "parse_manifest_file",
]


@dataclass(frozen=True)
class ShardEntry:
    """One entry of ``manifest["shards"]`` (FORMAT.md §2), validated."""

    path: str  #: ``samples/NNNNNN.msgpack.zst``, numbered from 0 without gaps
    samples: int  #: samples in the shard
    size: int  #: compressed bytes
    raw_size: int  #: decompressed bytes (bounded by MAX_SHARD_RAW_BYTES)
    digest: str  #: ``sha256:<hex>`` of the compressed bytes


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
    #: the entries as columns (:class:`MediaTable`, a ``Sequence[MediaEntry]``), also ``self["media"]``
    media: MediaTable
    #: ``"rollout-bundles <version>"`` of the writer, when recorded
    created_by: str | None
    #: how many media references the samples hold, when recorded
    media_references: int | None

    @classmethod
    def parse(cls, raw: bytes, where: object) -> Manifest:
        """Validate the manifest bytes ``raw`` (read from ``where``, which messages name)."""
        return parse_manifest_bytes(raw, where)

    def items(self) -> Any:
        """The items, ``media`` as the stored list of objects: ``json.dumps`` of a dict subclass
        takes its items from here, so the manifest dumps as the JSON it was read from."""
        return [(k, v.as_json() if isinstance(v, MediaTable) else v) for k, v in super().items()]


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


def _manifest_text(raw: bytes, where: object) -> str:
    """``raw`` as text: UTF-8 without a byte order mark (see the module docstring)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise BundleFormatError(
            f"{where}: starts with a byte order mark; the manifest must be UTF-8 without one"
        )
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in raw:
        raise BundleFormatError(
            f"{where}: not UTF-8 (a NUL byte or a UTF-16/32 byte order mark); the manifest must be UTF-8 JSON"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleFormatError(f"{where}: not UTF-8: {e}") from None


def decode_manifest_json(raw: bytes, where: object) -> Any:
    """The JSON value in ``raw``, refusing what FORMAT.md §2 refuses (see the module docstring)."""
    return _decoded(_manifest_text(raw, where), where, None)


def _decoded(text: str, where: object, media: _MediaSink | None) -> Any:
    """The JSON value in ``text``; with ``media``, a top-level object's ``media`` array is handed
    to it an entry at a time (:func:`_members`) and stands as ``media`` in the result."""
    try:
        start = WHITESPACE.match(text).end()  # type: ignore[union-attr]
        if media is None or not text.startswith("{", start):
            value = DECODER.decode(text)
            if nesting_depth_exceeds(value, MAX_NESTING_DEPTH):
                raise RecursionError
            return value
        return _members(TextWindow(text), start + 1, media)
    except RecursionError:
        raise BundleFormatError(f"{where}: nested deeper than {MAX_NESTING_DEPTH} levels") from None
    except StopIteration as e:  # the scanner found no value where one must be
        raise BundleFormatError(
            f"{where}: not valid JSON: {_error('Expecting value', text, e.value)}"
        ) from None
    except ValueError as e:  # json.JSONDecodeError, a huge int, a non-finite number
        raise BundleFormatError(f"{where}: not valid JSON: {e}") from None


def _decoded_window(read: Callable[[int], bytes], media: _MediaSink) -> dict[str, Any] | None:
    """The manifest object that ``read(n)`` (up to ``n`` more bytes, ``b""`` at the end) yields,
    read through a window (:class:`~bundles._format.textwindow.TextWindow`), its ``media``
    handed to ``media``; None where the whole-text parse must decide (anything short of a
    manifest object that parses whole: its message and the position it names are then
    ``json.loads``'s, never a window's)."""
    try:
        text = TextWindow("", read)
        text.more(0, textwindow.WINDOW_BYTES)
        if text.text.startswith("\ufeff"):  # a byte order mark: refused by the whole-text checks
            return None
        start = text.ws(0)
        if not text.text.startswith("{", start):
            return None
        return _members(text, start + 1, media)
    except BundleError:
        raise  # the manifest cap, counted as the bytes are read
    except (WindowGaveUp, ValueError, StopIteration, RecursionError):  # UnicodeDecodeError is one
        return None


def _error(message: str, text: str, at: int) -> json.JSONDecodeError:
    return json.JSONDecodeError(message, text, at)


def _members(text: TextWindow, i: int, media: _MediaSink) -> dict[str, Any]:
    """The top-level object whose ``{`` ends before ``i``, decoded member by member with the
    ``json`` module's own scanner (the grammar, escapes, numbers and errors are ``json.loads``'s,
    a repeated key keeps its last value as there): the ``media`` array is scanned an entry at a
    time into ``media``, so that no list of parsed entries exists at any moment (issue 39, item
    6). Nesting is checked per value, counting the levels above it."""
    out: dict[str, Any] = {}
    i = text.ws(i)
    if text.text.startswith("}", i):
        i += 1
    else:
        while True:
            if not text.text.startswith('"', i):
                raise _error("Expecting property name enclosed in double quotes", text.text, i)
            key, i = text.scan(i)
            i = text.ws(i)
            if not text.text.startswith(":", i):
                raise _error("Expecting ':' delimiter", text.text, i)
            i = text.ws(i + 1)
            if key == "media" and text.text.startswith("[", i):
                i = _entries(text, i + 1, media)
                out[key] = media
            else:
                out[key], i = text.scan(i)
                if nesting_depth_exceeds(out[key], MAX_NESTING_DEPTH - 1):
                    raise RecursionError
            i = text.ws(i)
            if text.text.startswith("}", i):
                i += 1
                break
            if not text.text.startswith(",", i):
                raise _error("Expecting ',' delimiter", text.text, i)
            i = text.ws(i + 1)
    end = text.ws(i)
    if end != len(text.text):
        raise _error("Extra data", text.text, end)
    return out


def _entries(text: TextWindow, i: int, media: _MediaSink) -> int:
    """Scan the array whose ``[`` ends before ``i`` into ``media``; return the index past its ``]``."""
    media.start()
    i = text.ws(i)
    if text.text.startswith("]", i):
        return i + 1
    while True:
        value, i = text.scan(i)
        if nesting_depth_exceeds(value, MAX_NESTING_DEPTH - 2):  # the object, the array above
            raise RecursionError
        media.add(value)
        i = text.ws(i)
        if text.text.startswith("]", i):
            return i + 1
        if not text.text.startswith(",", i):
            raise _error("Expecting ',' delimiter", text.text, i)
        i = text.ws(i + 1)


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
    place a manifest is parsed. The bytes are decoded through a window (:class:`~bundles._format.textwindow.TextWindow`): the
    parse holds them and the media table, never their text as well."""
    at = 0

    def read(n: int) -> bytes:
        nonlocal at
        at += n
        return raw[at - n : at]

    return _parse(read, lambda: raw, where)


def parse_manifest_file(f: BinaryIO, where: object) -> Manifest:
    """:func:`parse_manifest_bytes` of what the binary file ``f`` holds from its position on,
    read a window at a time (issue 39, item 6: a manifest of 100,000 screenshots, ~11 MB, is
    never in memory whole, as bytes or as text); more than MAX_MANIFEST_BYTES is refused as it
    is read. Only a manifest the window cannot parse is read again whole, from the same file
    (``f`` must be seekable), for the whole-text parse to name its problem."""
    start, total = f.tell(), 0

    def read(n: int) -> bytes:
        nonlocal total
        chunk = _read_up_to(f, min(n, MAX_MANIFEST_BYTES + 1 - total))  # never past the cap + 1
        total += len(chunk)
        if total > MAX_MANIFEST_BYTES:
            raise UnsafeBundleError(f"{where}: exceeds the manifest cap of {MAX_MANIFEST_BYTES} bytes")
        return chunk

    def whole() -> bytes:
        nonlocal total
        f.seek(start)
        total, data = 0, bytearray()
        while chunk := read(textwindow.WINDOW_BYTES):
            data += chunk
        return bytes(data)

    return _parse(read, whole, where)


def _read_up_to(f: BinaryIO, n: int) -> bytes:
    """``n`` bytes of ``f``, fewer only at its end (one read may return less)."""
    chunk = f.read(n)
    while chunk and len(chunk) < n:
        rest = f.read(n - len(chunk))
        if not rest:
            break
        chunk += rest
    return chunk


def _parse(read: Callable[[int], bytes], whole: Callable[[], bytes], where: object) -> Manifest:
    """The manifest read through a window; the whole-text parse of ``whole()`` where the window
    leaves it the decision (:func:`_decoded_window`): the same result and the same refusals,
    the refusals with json.loads's positions. A window that parsed has read every byte: a bad
    entry at the end, or a repeat, refuses the manifest all the same."""
    sink = _MediaSink(where)
    manifest = _decoded_window(read, sink)
    if manifest is None:
        sink = _MediaSink(where)  # the window's table let go before the whole text is made
        manifest = _decoded(_manifest_text(whole(), where), where, sink)
    if not isinstance(manifest, dict):
        raise BundleFormatError(f"{where}: expected a JSON object, found {type(manifest).__name__}")
    kind = _check_top_fields(manifest, where)
    shards = _parse_shards(manifest, where)
    media = sink.finish(manifest["media"])
    manifest["media"] = media
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


class _MediaSink:
    """The ``media`` entries as the parser scans them: each validated (FORMAT.md §2: an object,
    the digest's shape, the suffix, a size in bounds, the pair listed once, at most
    MAX_MEDIA_COUNT of them) and added to a :class:`MediaTable`. The first problem is kept, not
    raised, until :meth:`finish`: the top-level fields, checked after the scan, are reported
    first, as when the manifest was parsed whole."""

    def __init__(self, where: object) -> None:
        self.where = where
        self.start()

    def start(self) -> None:  # a repeated ``media`` key: the last one counts, as in json.loads
        self.table = MediaTable()
        self.count = 0
        self.error: BundleError | None = None
        self.previous: tuple[bytes, str] | None = None
        self.ordered = True

    def add(self, ent: Any) -> None:
        i, self.count = self.count, self.count + 1
        if self.error is None:
            try:
                self._add(ent, i)
            except BundleError as e:
                self.error = e

    def _add(self, ent: Any, i: int) -> None:
        where, field = self.where, f"media[{i}]"
        if i >= MAX_MEDIA_COUNT:  # before an entry more is held
            raise UnsafeBundleError(f"{where}: media: more than MAX_MEDIA_COUNT, {MAX_MEDIA_COUNT}, entries")
        if not isinstance(ent, dict):
            raise BundleFormatError(f"{where}: {field}: expected an object, found {type(ent).__name__}")
        _digest_field(ent, field, where)
        suffix = ent.get("suffix")
        if not isinstance(suffix, str) or not SUFFIX_RE.fullmatch(suffix):
            raise UnsafeBundleError(f"{where}: {field}.suffix: expected e.g. '.png', found {_short(suffix)}")
        size = _int_field(ent, "size", field, where)
        if size > MAX_MEDIA_BYTES:  # before any reader sizes a buffer or a loop from it
            raise UnsafeBundleError(
                f"{where}: {field}.size: {size} exceeds MAX_MEDIA_BYTES, the cap of {MAX_MEDIA_BYTES} bytes"
            )
        key = (bytes.fromhex(ent["digest"][7:]), suffix)
        if self.previous is not None and key <= self.previous:
            if key == self.previous:  # listed in order, a repeat follows its first
                raise BundleFormatError(f"{where}: {field}: {ent['digest']}{suffix} is listed twice")
            self.ordered = False  # not as FORMAT.md §2 sorts it: repeats are looked for at the end
        extra = None if len(ent) == 3 else {k: v for k, v in ent.items() if k not in _MEDIA_KEYS}
        self.table.append(key[0], size, suffix, extra)
        self.previous = key

    def finish(self, value: Any) -> MediaTable:
        """The validated table, ``value`` being what the manifest holds as ``media``."""
        if value is not self:
            raise BundleFormatError(f"{self.where}: media: expected a list, found {type(value).__name__}")
        if not self.ordered:
            repeat = self.table.first_duplicate()  # before any error kept: it comes later
            if repeat is not None:
                table = self.table
                raise BundleFormatError(
                    f"{self.where}: media[{repeat}]: {table.digest(repeat)}{table.suffix(repeat)} is listed twice"
                )
        if self.error is not None:
            raise self.error
        return self.table.seal()


_MEDIA_KEYS = frozenset(("digest", "size", "suffix"))
