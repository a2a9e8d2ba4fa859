"""A bundle's samples as Arrow record batches: the schema of docs/DATASET.md and the conversion.

:func:`to_arrow` (``Bundle.to_arrow``) streams: it reads the bundle shard by shard through
``Bundle.samples`` (one compressed shard and one sample decoded at a time) and yields a
``pyarrow.RecordBatch`` every ``batch_rows`` samples, or sooner when the batch's screenshots reach
:data:`BATCH_IMAGE_BYTES`; memory holds one shard and one batch, whatever the bundle's size.

Mapping (DATASET.md is the spec, :data:`SCHEMA_VERSION` its version): the fields a trainer's
``Sample`` has become typed columns (``tokens`` ``list<int32>``, ``rollout_log_probs``
``list<float32>``, ``loss_mask`` ``list<int8>``, a numeric ``reward`` ``float64``); a field whose
value does not fit its column (a dict reward, a token id past int32, a string where a list is
expected) is null there and kept, with every field no column names, in the ``extra`` column
(JSON text): nothing is dropped. numpy arrays and torch tensors become lists (in ``extra``,
``{"dtype", "shape", "data"}``), never pickles; a sample that is not a dict is all nulls and its
value in ``extra`` under ``"sample"``.

Screenshots (``media=True``): ``images`` holds the sample's stored screenshots in turn order,
each the ``{bytes, path}`` struct ``datasets.Image()`` decodes, ``path`` = ``media/<digest><suffix>``.
The bytes are read in place (``Bundle.open_media``: a directory, a packed file's member, a store
object), at most the manifest's size plus one, and hashed: a file whose digest is not its name is
a :class:`BundleVerificationError`, never exported. A screenshot the bundle does not store (a
path outside it) is no image, its turn's ``media`` null. A sample's screenshots together are
bounded by ``MAX_EXPORT_SAMPLE_IMAGE_BYTES`` (a sample may reference one stored file a million
times).

This module imports only the format (``bundles._format``): the local reader delegates to it, and
it reads a bundle through the reader's public methods.
"""

from __future__ import annotations

import array
import base64
import hashlib
import json
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from bundles._dataset.numbers import as_list, pack_numbers
from bundles._errors import BundleError, BundleVerificationError
from bundles._format.layout import MEDIA_DIR
from bundles._format.limits import MAX_EXPORT_SAMPLE_IMAGE_BYTES
from bundles._format.media import MediaRef

__all__ = [
    "BATCH_IMAGE_BYTES",
    "COLUMNS",
    "SCHEMA_VERSION",
    "identity",
    "schema",
    "step_of",
    "to_arrow",
]

#: The version of the columns below (docs/DATASET.md): a change a reader must know of bumps it.
SCHEMA_VERSION = 1
#: A batch is cut early once its screenshots reach this many bytes.
BATCH_IMAGE_BYTES = 64 * 1024 * 1024

#: The columns, in order; ``images`` only with ``media=True``.
COLUMNS = (
    "bundle_id", "bundle", "kind", "step", "position", "index", "group_index", "prompt", "response",
    "reward", "status", "response_length", "tokens", "rollout_log_probs", "loss_mask", "turns",
    "metadata", "extra", "images",
)  # fmt: skip
#: Sample fields that have a column of their own (every other field goes to ``extra``).
_TYPED = {"index", "group_index", "prompt", "response", "reward", "status", "response_length",
          "tokens", "rollout_log_probs", "loss_mask", "metadata"}  # fmt: skip


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise BundleError(
            "to_arrow: pyarrow is not installed: expected the rollout-bundles[data] extra "
            "(pip install 'rollout-bundles[data]')"
        ) from None
    return pyarrow


def schema(media: bool = False, columns: Sequence[str] | None = None) -> Any:
    """The ``pyarrow.Schema`` of :func:`to_arrow`'s batches (DATASET.md), its version in the
    schema's metadata (``rollout_bundles.schema_version``)."""
    pa = _pa()
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    types = {
        "bundle_id": pa.string(), "bundle": pa.string(), "kind": pa.string(), "step": pa.int64(),
        "position": pa.int64(), "index": pa.int64(), "group_index": pa.int64(),
        "prompt": pa.string(), "response": pa.string(), "reward": pa.float64(), "status": pa.string(),
        "response_length": pa.int64(), "tokens": pa.list_(pa.int32()),
        "rollout_log_probs": pa.list_(pa.float32()), "loss_mask": pa.list_(pa.int8()),
        "turns": pa.list_(pa.struct([("action", pa.string()), ("media", pa.string())])),
        "metadata": pa.string(), "extra": pa.string(), "images": pa.list_(image),
    }  # fmt: skip
    names = _columns(columns, media)
    return pa.schema(
        [(n, types[n]) for n in names],
        metadata={"rollout_bundles.schema_version": str(SCHEMA_VERSION)},
    )


def _columns(columns: Sequence[str] | None, media: bool) -> list[str]:
    if columns is None:
        return [c for c in COLUMNS if c != "images" or media]
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise BundleError(f"to_arrow: columns: expected names among {', '.join(COLUMNS)}, found {unknown!r}")
    if "images" in columns and not media:
        raise BundleError("to_arrow: columns: 'images' needs media=True")
    return list(dict.fromkeys(columns))


def identity(bundle: Any) -> str:
    """A bundle's identity (the ``bundle_id`` column; what export skips by): the sha256 of its
    manifest's kind, meta, format version, sample and media counts and every shard's digest. Two
    copies of one bundle (a directory, its packed file, on a store) share it."""
    m = bundle.manifest
    head = {"kind": m.kind, "meta": m.meta, "samples": m.sample_count, "media": len(m.media),
            "format_version": m.format_version, "shards": [s.digest for s in m.shards]}  # fmt: skip
    text = json.dumps(head, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(f"dataset-v{SCHEMA_VERSION}\n{text}".encode("utf-8", "surrogatepass")).hexdigest()


def _int(v: Any, bits: int = 63) -> int | None:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        return None
    try:
        k = v.__index__()
    except Exception:  # a foreign object's __index__ is not ours to trust
        return None
    return k if -(2**bits) <= k < 2**bits else None


def step_of(bundle: Any) -> int | None:
    """The bundle's step: its meta's ``rollout_id``, ``step`` or ``global_step`` (the first that is a
    non-negative int), else ``meta.metadata.step``; None when none is."""
    meta = bundle.meta
    nested = meta.get("metadata")
    candidates = [meta.get(k) for k in ("rollout_id", "step", "global_step")]
    candidates.append(nested.get("step") if isinstance(nested, Mapping) else None)
    for v in candidates:
        k = _int(v)
        if k is not None and k >= 0:
            return k
    return None


def _float(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: The number columns: their :mod:`struct` code (int32, int8 and float32, standard sizes in the
#: machine's byte order, which is Arrow's).
_NUMBER_COLUMNS = {"tokens": "i", "rollout_log_probs": "f", "loss_mask": "b"}


#: Values jsonable keeps as they are.
_KEPT = frozenset({int, bool, type(None)})


def _plain(x: Any, stored: Mapping[str, MediaRef] | None) -> bool:
    """Whether jsonable keeps ``x`` as it is: a str that names no stored file, a finite float."""
    t = type(x)
    if t is str:
        return not (stored and x in stored)
    return t is float and x - x == 0.0  # inf - inf and nan - nan are nan


def jsonable(v: Any, depth: int = 0, stored: Mapping[str, MediaRef] | None = None) -> Any:
    """``v`` as JSON (``extra``, ``metadata``): arrays as ``{"dtype", "shape", "data"}``, bytes as
    ``{"base64"}``, a media reference (or a path ``stored`` names) as its ``media/<name>``,
    non-finite floats as their text, a mapping with a key that is not a string as
    ``[[key, value], ...]`` pairs (both keys of ``{1: .., "1": ..}`` kept).

    A dict's or list's ints, bools, Nones and strings that name no stored file are kept without a
    call each (a sample's metadata is mostly those); deeper than 64 levels is refused all the same."""
    if depth > 64:
        raise BundleError("nested deeper than 64 levels")
    t = type(v)
    if t is str:  # the common types first, by identity (their subclasses take the long way)
        return f"{MEDIA_DIR}/{stored[v].filename}" if stored and v in stored else v
    if t is int or t is bool or v is None:
        return v
    inner = depth < 64  # a child at depth + 1 is refused by the call, so it must be made
    if t is dict and all(type(k) is str for k in v):
        return {
            k: x if inner and (type(x) in _KEPT or _plain(x, stored)) else jsonable(x, depth + 1, stored)
            for k, x in v.items()
        }
    if t is list:
        return [
            x if inner and (type(x) in _KEPT or _plain(x, stored)) else jsonable(x, depth + 1, stored)
            for x in v
        ]
    if isinstance(v, str) and stored and v in stored:
        return f"{MEDIA_DIR}/{stored[v].filename}"
    if isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, Mapping):
        if all(isinstance(k, str) for k in v):
            return {k: jsonable(x, depth + 1, stored) for k, x in v.items()}
        # a key that is not a string (1 beside "1", None, a tuple): [key, value] pairs, never
        # str(key), which would merge 1 and "1" and lose a value
        return [[jsonable(k, depth + 1, stored), jsonable(x, depth + 1, stored)] for k, x in v.items()]
    if isinstance(v, (list, tuple)):
        return [jsonable(x, depth + 1, stored) for x in v]
    if isinstance(v, MediaRef):
        return f"{MEDIA_DIR}/{v.filename}"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        data = as_list(v)
        if data is None and hasattr(v, "item"):
            return jsonable(v.item(), depth + 1)  # a numpy scalar
        return {"dtype": str(v.dtype).removeprefix("torch."), "shape": [int(d) for d in v.shape],
                "data": jsonable(data, depth + 1)}  # fmt: skip
    if hasattr(v, "value") and isinstance(getattr(v, "value", None), (str, int)):
        return v.value  # an enum (a Sample's Status)
    return {"repr": repr(v)[:1000]}


def _utf8(text: str) -> str:
    """``text`` as Arrow can hold it: a lone surrogate (legal in a Python string, and in a JSON or
    msgpack one) is written as its escape ``\\udXXX``, every other character as it is."""
    if text.isascii():  # most text: checked in C without encoding it
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


#: jsonable's output is plain JSON values without cycles: no check for them on each call.
_JSON = json.JSONEncoder(ensure_ascii=False, check_circular=False)
#: ``_JSON``'s C encoder, made once: ``JSONEncoder.encode`` makes it anew on every call (~1 us, more
#: than encoding a sample's metadata). The arguments are the ones ``JSONEncoder.iterencode`` passes
#: it (the same on CPython 3.10 to 3.13); without the C module, ``_JSON`` itself.
_C_JSON = None if c_make_encoder is None else c_make_encoder(
    None, _JSON.default, encode_basestring, None, _JSON.key_separator, _JSON.item_separator,
    False, False, True,
)  # fmt: skip


def _dumps(v: Any, stored: Mapping[str, MediaRef] | None = None) -> str:
    value = jsonable(v, 0, stored)
    return _utf8(_JSON.encode(value) if _C_JSON is None else "".join(_C_JSON(value, 0)))


def _text(v: Any) -> str | None:
    """A text column's value: a string as it is, anything else as JSON text."""
    if v is None:
        return None
    return _utf8(v) if isinstance(v, str) else _dumps(v)


def _row(
    sample: Any, stored: Mapping[str, MediaRef]
) -> tuple[dict[str, Any], dict[Any, Any], list[MediaRef]]:
    """One sample read into the columns: its typed values (and ``turns``), its ``extra`` (every
    field no column names, then each value that did not fit its column, kept whole) and the
    stored screenshots it names. The common types are tested by identity first: this runs once
    a sample, and its checks, not the numbers, are what Python spends here."""
    if not isinstance(sample, Mapping):
        return {"turns": []}, {"sample": sample}, []
    extra = {k: v for k, v in sample.items() if k not in _TYPED}
    get = sample.get
    values: dict[str, Any] = {}
    for key in ("index", "group_index", "response_length"):
        v = get(key)
        k = v if type(v) is int and -(2**63) <= v < 2**63 else _int(v)
        values[key] = k
        if k is None and v is not None:
            extra[key] = v  # did not fit its column: kept whole
    v = get("reward")
    if type(v) is float or type(v) is int:
        values["reward"] = float(v)
    else:
        values["reward"] = _reward(v)
        if values["reward"] is None and v is not None:
            extra["reward"] = v
    v = get("status")
    status = v if type(v) is str else getattr(v, "value", v)
    values["status"] = _utf8(status) if isinstance(status, str) else None
    if values["status"] is None and v is not None:
        extra["status"] = v
    for key in ("prompt", "response"):
        v = get(key)
        values[key] = _utf8(v) if type(v) is str else _text(v)
    metadata = get("metadata")
    values["metadata"] = None if metadata is None else _dumps(metadata)
    for key, code in _NUMBER_COLUMNS.items():
        v = get(key)
        values[key] = numbers = None if v is None else pack_numbers(v, code)
        if numbers is None and v is not None:
            extra[key] = v
    values["turns"], images = _turns(sample, metadata, stored)
    return values, extra, images


def _reward(v: Any) -> float | None:
    """A reward that is not a plain float or int: a number (an int or float subclass, not a bool)
    or a numpy scalar holding one, as a float; None for anything else."""
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    scalar = hasattr(v, "dtype") and getattr(v, "shape", None) == () and hasattr(v, "item")
    return float(v) if number or (scalar and _float(v.item())) else None


def _turns(
    s: Mapping[str, Any], md: Any, stored: Mapping[str, MediaRef]
) -> tuple[list[dict[str, Any]], list[MediaRef]]:
    """The ``turns`` column (an action and a screenshot's digest a turn) and the stored
    screenshots of ``multimodal_inputs.images`` in turn order."""
    mm = s.get("multimodal_inputs")
    raw = mm.get("images") if isinstance(mm, Mapping) else None
    items = raw if type(raw) is list else as_list(raw)  # read, never changed: no copy of a list
    if items is None:
        items = [] if raw is None else [raw]
    get = stored.get
    refs: list[MediaRef | None] = [get(x) if type(x) is str else _stored_ref(x, stored) for x in items]
    actions = md.get("actions") if isinstance(md, Mapping) else None
    actions = (actions if type(actions) is list else as_list(actions)) or []
    n_refs, n_actions = len(refs), len(actions)
    turns = [
        {
            "action": _text(actions[j]) if j < n_actions else None,
            "media": refs[j].digest if j < n_refs and refs[j] is not None else None,  # type: ignore[union-attr]
        }
        for j in range(max(n_refs, n_actions))
    ]
    return turns, [r for r in refs if r is not None]


def _stored_ref(item: Any, stored: Mapping[str, MediaRef]) -> MediaRef | None:
    """The bundle's stored file an image of a sample names (a MediaRef, a path string, an image
    opened on the stored file), or None for anything the bundle does not store."""
    if isinstance(item, MediaRef):
        return stored.get(item.filename)
    name = item if isinstance(item, str) else getattr(item, "filename", None)
    if not isinstance(name, str):
        return None
    return stored.get(name)


def _stored(bundle: Any) -> dict[str, MediaRef]:
    """Every name a sample may call a stored file by (its path as the reader resolves it, its
    stored name) -> its reference."""
    out: dict[str, MediaRef] = {}
    for ref in bundle.media:
        out[ref.filename] = ref
        if ref.path is not None:
            out[str(ref.path)] = ref
    return out


def _read_image(bundle: Any, ref: MediaRef) -> bytes:
    """The stored file's bytes, read in place and checked against its digest."""
    where = f"{bundle.path}/{MEDIA_DIR}/{ref.filename}"
    with bundle.open_media(ref) as f:
        data = f.read(ref.size + 1)
    found = "sha256:" + hashlib.sha256(data).hexdigest()
    if len(data) != ref.size or found != ref.digest:
        raise BundleVerificationError(
            bundle.path,
            [f"{where}: expected {ref.size} bytes of digest {ref.digest}, found {len(data)} of {found}"],
        )
    return data


class _Flat:
    """A number column being filled: every row's values in one buffer and the rows' offsets
    into it, handed to Arrow as buffers (no Python object per value)."""

    def __init__(self, code: str) -> None:
        self.values = bytearray()
        self.size = struct.calcsize("=" + code)
        self.count = 0
        self.offsets = array.array("i", [0])
        self.nulls: list[bool] = []

    def add(self, v: bytes | None) -> int:
        """Add a row (None: null); the number of values it holds."""
        n = 0
        if v is not None:
            self.values += v
            n = len(v) // self.size
            self.count += n
        self.offsets.append(self.count)
        self.nulls.append(v is None)
        return n

    def arrow(self, pa: Any, typ: Any) -> Any:
        n = len(self.nulls)
        offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(self.offsets)])
        values = pa.Array.from_buffers(typ.value_type, self.count, [None, pa.py_buffer(self.values)])
        mask = pa.array(self.nulls, pa.bool_()) if any(self.nulls) else None
        return pa.ListArray.from_arrays(offsets, values, type=typ, mask=mask)


#: A batch is cut early once its number columns hold this many values together (Arrow's list
#: offsets are 32-bit; a sample may hold up to MAX_SAMPLE_ITEMS).
_BATCH_VALUES = 2**30


class _Batch:
    """Columns being filled, cut into a RecordBatch; ``head`` holds the columns every row of a
    bundle shares (its identity, path, kind and step), made whole when the batch is cut."""

    def __init__(self, names: list[str], head: Mapping[str, Any]) -> None:
        self.head = {n: head[n] for n in names if n in head}
        self.data: dict[str, list[Any]] = {n: [] for n in names if n not in _NUMBER_COLUMNS and n not in head}
        self.flat = {n: _Flat(_NUMBER_COLUMNS[n]) for n in names if n in _NUMBER_COLUMNS}
        self.rows = 0
        self.image_bytes = 0
        self.values = 0  # in the number columns together

    def add(self, row: dict[str, Any]) -> None:
        for n, column in self.data.items():
            column.append(row.get(n))
        for n, flat in self.flat.items():
            self.values += flat.add(row.get(n))
        self.rows += 1

    def column(self, pa: Any, name: str, typ: Any) -> Any:
        if name in self.flat:
            return self.flat[name].arrow(pa, typ)
        if name in self.head:
            return pa.array([self.head[name]] * self.rows, typ)
        return pa.array(self.data[name], typ)


def _images(bundle: Any, images: list[MediaRef], position: int) -> tuple[list[dict[str, Any]], int]:
    cache: dict[str, bytes] = {}
    total = 0
    out = []
    for ref in images:
        total += ref.size
        if total > MAX_EXPORT_SAMPLE_IMAGE_BYTES:
            raise BundleError(
                f"{bundle.path}: sample {position}: multimodal_inputs.images: expected at most "
                f"{MAX_EXPORT_SAMPLE_IMAGE_BYTES} bytes of screenshots (MAX_EXPORT_SAMPLE_IMAGE_BYTES), "
                f"found more ({len(images)} references)"
            )
        if ref.filename not in cache:
            cache[ref.filename] = _read_image(bundle, ref)
        out.append({"bytes": cache[ref.filename], "path": f"{MEDIA_DIR}/{ref.filename}"})
    return out, total


def _record_batch(pa: Any, batch: _Batch, sch: Any, bundle: Any, last: int) -> Any:
    try:
        arrays = [batch.column(pa, f.name, f.type) for f in sch]
        return pa.RecordBatch.from_arrays(arrays, schema=sch)
    except (pa.ArrowException, ValueError, TypeError) as e:  # a value no check above foresaw
        raise BundleError(
            f"{bundle.path}: samples {last + 1 - batch.rows}..{last}: cannot be made Arrow columns: {e}"
        ) from None


def _selected(bundle: Any, shards: Sequence[int] | None) -> Iterator[tuple[int, Any]]:
    """The samples of the shards ``shards`` names (all by default), each with its position:
    a selection is read through ``samples(indices=...)``, each shard streamed once (its wanted
    samples held until the shard is read: one decoded shard, bounded by ``MAX_SHARD_RAW_BYTES``)."""
    if shards is None:
        return enumerate(bundle.samples())
    entries = bundle.manifest.shards
    picked = sorted(set(shards))
    bad = [k for k in picked if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(entries)]
    if bad:
        raise BundleError(
            f"{bundle.path}: to_arrow: shards: expected numbers 0..{len(entries) - 1}, found {bad!r}"
        )
    starts = [0]
    for e in entries:
        starts.append(starts[-1] + e.samples)
    indices = [i for k in picked for i in range(starts[k], starts[k + 1])]
    return zip(indices, bundle.samples(indices=indices), strict=True)


def to_arrow(
    bundle: Any,
    columns: Sequence[str] | None = None,
    batch_rows: int = 1024,
    media: bool = False,
    shards: Sequence[int] | None = None,
) -> Iterator[Any]:
    """Yield ``bundle``'s samples as ``pyarrow.RecordBatch``es of :func:`schema` (see the module's
    docstring); ``columns`` picks and orders the columns; ``shards`` (numbers of the manifest's
    shards) reads only those, ``position`` still the sample's index in the bundle (a Ray Data read
    task reads one shard: :func:`bundles.read_bundles`)."""
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise BundleError(f"{bundle.path}: to_arrow: batch_rows: expected an int >= 1, found {batch_rows!r}")
    pa = _pa()
    sch = schema(media, columns)
    names = list(sch.names)
    head = {
        "bundle_id": identity(bundle),
        "bundle": _utf8(str(bundle.path)),
        "kind": _utf8(bundle.kind),
        "step": step_of(bundle),
    }
    stored = _stored(bundle)
    batch = _Batch(names, head)
    want_extra, want_images = "extra" in names, "images" in names
    for position, sample in _selected(bundle, shards):
        try:
            values, extra, images = _row(sample, stored)
        except BundleError as e:  # a value too deep for its JSON column, named where it is
            raise BundleError(f"{bundle.path}: sample {position}: {e}") from None
        values["position"] = position
        if want_extra:
            try:
                values["extra"] = _dumps(extra, stored) if extra else None
            except BundleError as e:
                raise BundleError(f"{bundle.path}: sample {position}: extra: {e}") from None
        if want_images:
            values["images"], size = _images(bundle, images, position)
            batch.image_bytes += size
        batch.add(values)
        if (
            batch.rows >= batch_rows
            or batch.image_bytes >= BATCH_IMAGE_BYTES
            or batch.values >= _BATCH_VALUES
        ):
            yield _record_batch(pa, batch, sch, bundle, position)
            batch = _Batch(names, head)
    if batch.rows:
        yield _record_batch(pa, batch, sch, bundle, position)
