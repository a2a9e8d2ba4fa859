"""Encoding one sample: :class:`SampleEncoder` walks its containers and hands the rest to msgspec's
packer (the cost model and the extension types: :mod:`bundles._format.codec`)."""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable, Container
from typing import Any

import msgpack
import msgspec
import numpy as np

from bundles._errors import BundleError, UnsupportedValueError
from bundles._format.codec import (
    INT_MIN,
    KEY_PART_CACHE_MAX,
    NUMERIC_KINDS,
    UINT_MAX,
    ImageStore,
    MediaRefResolver,
    StringRefResolver,
    key_path,
    only_numbers,
)
from bundles._format.images import pil_image_class
from bundles._format.layout import (
    EXT_IMAGE,
    EXT_MEDIA_REF,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_PATH_REF,
    EXT_RECORD,
    EXT_TENSOR,
    EXT_TUPLE,
    MAX_NESTING_DEPTH,
    MAX_SAMPLE_ITEMS,
    MAX_SAMPLE_RAW_BYTES,
    TORCH_DTYPES,
)
from bundles._format.media import MediaRef
from bundles._format.records import Record, record_fields, registered_types


def _pack_header_and_bytes(header: list[Any], data: bytes | np.ndarray) -> bytes:
    """The packed header followed by the raw bytes of ``data`` (bytes or a numpy view)."""
    return msgpack.packb(header) + (data if isinstance(data, bytes) else data.tobytes())


def _unsupported_type(obj: Any, where: str) -> UnsupportedValueError:
    t = type(obj)
    hint = ""
    if dataclasses.is_dataclass(t):
        hint = (
            f"; a frozen dataclass is stored once its class is registered: "
            f"bundles.register_record_type({t.__qualname__}, name)"
        )
    return UnsupportedValueError(
        f"{where}: values of type {t.__module__}.{t.__qualname__} cannot be stored without pickle; "
        "expected None, bool, int, float, str, bytes, list, tuple, dict, MediaRef, a numpy array or "
        "scalar of numeric/bool dtype, a torch tensor, a PIL image or a registered record" + hint
    )


_PASSTHROUGH = frozenset({type(None), bool, int, float, bytes})


class SampleEncoder:
    """Turns one sample into msgpack bytes, collecting the media references it holds.

    ``resolve_string(value, where)`` returns a MediaRef for strings that reference media, else
    None; ``resolve_ref(ref, where)`` checks a MediaRef and returns it complete (digest known).
    Both are given the key path so that their errors can name it.
    """

    def __init__(
        self,
        resolve_string: StringRefResolver,
        resolve_ref: MediaRefResolver,
        string_prefixes: tuple[str, ...] | None = None,
        store_image: ImageStore | None = None,
    ) -> None:
        self._resolve_string = resolve_string
        self._store_image = store_image
        self._resolve_ref = resolve_ref
        # Strings that cannot be references (no media-root prefix) skip the resolver call; None
        # means every string is offered to it.
        self._prefixes = string_prefixes
        # msgspec's packer: the same bytes as msgpack's for every value that reaches it (smallest
        # int width, float64, bin for bytes, maps in insertion order; checked against
        # tests/vectors), at ~3x its speed. It refuses int and float subclasses and ints beyond
        # 64 bits as msgpack's strict packer did; it packs enum members as their values, which is
        # what the walk does too (see ``_enum_member``).
        self._packer = msgspec.msgpack.Encoder()
        self._ext_cache: dict[tuple[int, str, int, str], msgspec.msgpack.Ext] = {}
        self._array_headers: dict[tuple[str, tuple[int, ...]], bytes] = {}
        self._items = 0
        self._number_lists: Container[int] = ()
        # Extensions by exact type (one dict lookup), then by isinstance for types whose
        # subclasses count and whose modules are imported lazily: (class getter, handler). The
        # handlers are the class's functions, called with the encoder: an encoder holding its own
        # bound methods would be a reference cycle, keeping what it holds (the writer's
        # resolvers and their state) alive until the garbage collector runs.
        cls_ = type(self)
        self.ext_by_type: dict[type, Callable[[Any, Any, str, int], Any]] = {
            tuple: cls_._tuple,
            MediaRef: cls_._media_ref,
            bytearray: cls_._buffer,
            memoryview: cls_._buffer,
            Record: cls_._record,
        }
        # Classes registered as records when the encoder is made (bundles._format.records).
        for cls in registered_types():
            self.ext_by_type[cls] = cls_._record
        self.ext_by_class: list[tuple[Callable[[], type | None], Callable[[Any, Any, str, int], Any]]] = [
            (lambda: np.ndarray, cls_._ndarray),
            (lambda: np.generic, cls_._npscalar),
            (_torch_tensor_class, cls_._tensor),
            (pil_image_class, cls_._pil_image),
            (lambda: enum.Enum, cls_._enum_member),
        ]

    def encode(self, sample: Any, where: str, number_lists: Container[int] = ()) -> bytes:
        """``number_lists``: ids of lists inside ``sample`` the caller has proved to hold only
        ints, floats and bools (with :func:`only_numbers`); they are packed without a second
        proof. The caller keeps them alive and unchanged until this returns."""
        self._items = 0
        self._number_lists = number_lists
        try:
            data: bytes = self._packer.encode(self._convert(sample, where, 0))
        except BundleError:
            raise
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as e:
            # Something inside a list passed as it is: an int beyond 64 bits or a subclass of
            # int or float. Name it (the only per-item walk, and only on failure).
            _explain(sample, where, self)
            raise UnsupportedValueError(f"{where}: cannot be packed: {e}") from None
        finally:
            self._number_lists = ()  # ids are reused once their lists are freed
        if self._items > MAX_SAMPLE_ITEMS:
            raise UnsupportedValueError(
                f"{where}: the sample holds {self._items} items (list, tuple and map elements, plus one "
                f"per container); the format allows at most {MAX_SAMPLE_ITEMS} per sample: store long "
                "numeric data as numpy arrays or tensors"
            )
        if len(data) > MAX_SAMPLE_RAW_BYTES:
            raise UnsupportedValueError(
                f"{where}: the sample encodes to {len(data)} bytes; the format allows at most "
                f"{MAX_SAMPLE_RAW_BYTES} bytes per sample"
            )
        return data

    def has_class_ext(self, obj: Any) -> bool:
        for get_class, _ in self.ext_by_class:
            cls = get_class()
            if cls is not None and isinstance(obj, cls):
                return True
        return False

    def _ref_ext(self, code: int, ref: MediaRef) -> msgspec.msgpack.Ext:
        key = (code, ref.digest, ref.size, ref.suffix)
        ext = self._ext_cache.get(key)
        if ext is None:
            ext = self._ext_cache[key] = msgspec.msgpack.Ext(
                code, msgpack.packb([ref.digest, ref.size, ref.suffix])
            )
        return ext

    def _plain(self, v: Any) -> bool:
        """True when ``v`` is stored as it is: scalars, bytes, and strings that cannot be references."""
        tv = type(v)
        if tv in _PASSTHROUGH:
            return True
        return tv is str and self._prefixes is not None and not v.startswith(self._prefixes)

    def _convert(self, obj: Any, where: str, depth: int) -> Any:
        """``obj`` as the packer takes it (extensions built, references resolved), its items counted.

        One function on purpose, so it cannot be split: it runs once per container of every
        sample, and its dict and list loops are inlined (the codec's cost model: no Python call
        per element, and none more per container than this one)."""
        if depth > MAX_NESTING_DEPTH:
            raise UnsupportedValueError(f"{where}: nesting deeper than {MAX_NESTING_DEPTH} levels")
        t = type(obj)
        if t in _PASSTHROUGH:
            return obj
        if t is str:
            ref = self._resolve_string(obj, where)
            return obj if ref is None else self._ref_ext(EXT_PATH_REF, ref)
        if t is dict:
            self._items += len(obj) + 1
            out = {}
            prefixes = self._prefixes
            numbers = self._number_lists
            for k, v in obj.items():
                tk = type(k)
                if tk is not str and tk is not int:
                    raise UnsupportedValueError(
                        f"{where}: dict keys must be str or int, found {tk.__name__} {k!r}"
                    )
                # Inlined for the common values of a sample (this loop runs for every key):
                # scalars and plain strings as they are, number lists without a key path.
                tv = type(v)
                if tv in _PASSTHROUGH or (tv is str and prefixes is not None and not v.startswith(prefixes)):
                    out[k] = v
                elif tv is list and depth < MAX_NESTING_DEPTH and (id(v) in numbers or only_numbers(v)):
                    self._items += len(v) + 1
                    out[k] = v
                else:
                    out[k] = self._convert(v, key_path(where, k), depth + 1)
            return out
        if t is list:
            self._items += len(obj) + 1
            if id(obj) in self._number_lists or only_numbers(obj):
                return obj  # token ids, masks, log-probs: msgpack packs them as they are
            if depth >= MAX_NESTING_DEPTH:  # any item needing conversion is refused as too deep
                return [
                    v if self._plain(v) else self._convert(v, f"{where}[{i}]", depth + 1)
                    for i, v in enumerate(obj)
                ]
            # Inlined for a list of media paths (a sample's screenshots: thousands per save):
            # scalars as they are, a string straight to the resolver, containers recursed into.
            out_list = []
            prefixes = self._prefixes
            resolve = self._resolve_string
            for i, v in enumerate(obj):
                tv = type(v)
                if tv in _PASSTHROUGH:
                    out_list.append(v)
                elif tv is str:
                    if prefixes is not None and not v.startswith(prefixes):
                        out_list.append(v)
                    else:
                        ref = resolve(v, f"{where}[{i}]")
                        out_list.append(v if ref is None else self._ref_ext(EXT_PATH_REF, ref))
                else:
                    out_list.append(self._convert(v, f"{where}[{i}]", depth + 1))
            return out_list
        handler = self.ext_by_type.get(t)
        if handler is None:
            for get_class, by_class in self.ext_by_class:
                cls = get_class()
                if cls is not None and isinstance(obj, cls):
                    handler = by_class
                    break
            else:
                raise _unsupported_type(obj, where)
        return handler(self, obj, where, depth)

    # -- extension handlers: (value, key path, depth) -> msgspec.msgpack.Ext ------------------------
    def _tuple(self, obj: tuple[Any, ...], where: str, depth: int) -> msgspec.msgpack.Ext:
        self._items += len(obj) + 1
        items = [
            v if self._plain(v) else self._convert(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj)
        ]
        return msgspec.msgpack.Ext(EXT_TUPLE, self._packer.encode(items))

    def _media_ref(self, obj: MediaRef, where: str, depth: int) -> msgspec.msgpack.Ext:
        return self._ref_ext(EXT_MEDIA_REF, self._resolve_ref(obj, where))

    def _record(self, obj: Any, where: str, depth: int) -> msgspec.msgpack.Ext:
        name, fields = record_fields(obj)
        self._items += len(fields) + 1
        converted = {
            k: v if self._plain(v) else self._convert(v, key_path(where, k), depth + 1)
            for k, v in fields.items()
        }
        return msgspec.msgpack.Ext(EXT_RECORD, self._packer.encode([name, converted]))

    def _pil_image(self, obj: Any, where: str, depth: int) -> msgspec.msgpack.Ext:
        if self._store_image is None:
            raise UnsupportedValueError(f"{where}: a PIL image can only be stored by a bundle writer")
        return self._ref_ext(EXT_IMAGE, self._store_image(obj, where))

    def _enum_member(self, obj: enum.Enum, where: str, depth: int) -> Any:
        """A member of an ``int`` or ``float`` enum (``IntEnum``, ``IntFlag``) is stored as its
        value, as the packer stores one that passed inside a long number list (only a walk over
        every item could tell it from a plain number there): it comes back as that int or
        float, equal to the member. Other enums are refused."""
        for base in (int, float):
            if isinstance(obj, base):
                return base(obj)
        raise _unsupported_type(obj, where)

    def _buffer(self, obj: Any, where: str, depth: int) -> msgspec.msgpack.Ext:
        raise UnsupportedValueError(f"{where}: {type(obj).__name__} is not stored; convert it to bytes")

    def _ndarray(self, arr: np.ndarray, where: str, depth: int) -> msgspec.msgpack.Ext:
        if arr.dtype.kind not in NUMERIC_KINDS or arr.dtype.fields is not None:
            raise UnsupportedValueError(
                f"{where}: numpy array of dtype {arr.dtype} is not numeric or bool; object and "
                "structured arrays are not stored"
            )
        # One packed header per (dtype, shape): a save holds thousands of arrays of a few shapes.
        # ``tobytes()`` is the C-order bytes whatever the array's layout (0-d arrays included).
        key = (arr.dtype.str, arr.shape)
        header = self._array_headers.get(key)
        if header is None:
            header = msgpack.packb([key[0], list(key[1])])
            if len(self._array_headers) < KEY_PART_CACHE_MAX:
                self._array_headers[key] = header
        return msgspec.msgpack.Ext(EXT_NDARRAY, header + arr.tobytes())

    def _npscalar(self, obj: np.generic, where: str, depth: int) -> msgspec.msgpack.Ext:
        dtype = obj.dtype
        if dtype.kind not in NUMERIC_KINDS:
            raise UnsupportedValueError(f"{where}: numpy scalar of dtype {dtype} is not numeric or bool")
        return msgspec.msgpack.Ext(EXT_NPSCALAR, _pack_header_and_bytes([dtype.str], obj.tobytes()))

    def _tensor(self, tensor: Any, where: str, depth: int) -> msgspec.msgpack.Ext:
        torch = sys.modules["torch"]
        if tensor.is_sparse or tensor.layout != torch.strided:
            raise UnsupportedValueError(
                f"{where}: only dense tensors are stored, found layout {tensor.layout}"
            )
        dtype_name = str(tensor.dtype).removeprefix("torch.")
        if dtype_name not in TORCH_DTYPES:
            raise UnsupportedValueError(
                f"{where}: tensors of dtype {tensor.dtype} are not stored; the format stores {', '.join(TORCH_DTYPES)}"
            )
        # Raw bytes through a uint8 view: numpy has no bfloat16/float8, and bytes are bytes.
        try:
            raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        except (RuntimeError, TypeError) as e:
            raise UnsupportedValueError(
                f"{where}: tensor of dtype {tensor.dtype} cannot be stored: {e}"
            ) from None
        return msgspec.msgpack.Ext(EXT_TENSOR, _pack_header_and_bytes([dtype_name, list(tensor.shape)], raw))


def _torch_tensor_class() -> type | None:
    torch = sys.modules.get("torch")  # a tensor cannot exist unless torch was imported
    return None if torch is None else torch.Tensor


def _explain(sample: Any, where: str, encoder: SampleEncoder) -> None:
    """Raise :class:`UnsupportedValueError` naming the first value the packer refused.

    Walks every item (iteratively: nesting is already bounded by the encoder's first pass), so it
    runs only after the packer failed. Returns if it finds nothing to name.
    """
    stack: list[tuple[Any, str]] = [(sample, where)]
    while stack:
        obj, path = stack.pop()
        t = type(obj)
        if t is int:
            if not INT_MIN <= obj <= UINT_MAX:
                raise UnsupportedValueError(f"{path}: int {obj} does not fit in 64 bits")
        elif t is dict:
            stack.extend(reversed([(v, key_path(path, k)) for k, v in obj.items()]))
        elif t is list or t is tuple:
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(obj)]))
        elif isinstance(obj, enum.Enum):
            # Stored as its value, so judged by it (``_enum_member`` refuses all but int and
            # float enums): an int enum's value must fit in 64 bits.
            value = encoder._enum_member(obj, path, 0)
            if type(value) is int and not INT_MIN <= value <= UINT_MAX:
                raise UnsupportedValueError(f"{path}: {obj!r}'s value {value} does not fit in 64 bits")
        elif not (t in _PASSTHROUGH or t is str or t in encoder.ext_by_type or encoder.has_class_ext(obj)):
            raise _unsupported_type(obj, path)
