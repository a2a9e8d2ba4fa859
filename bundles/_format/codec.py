"""Sample encoding: msgpack with extension types, never pickle.

JSON-like values map to msgpack's own types; everything else the format supports becomes an
extension type (see ``_layout.EXT_*`` and docs/FORMAT.md §3):

* ``MediaRef`` anywhere, and ``str`` values that are absolute paths inside a media root, become
  references by digest. The writer decides which strings are references through a callback, so
  this module knows nothing about files.
* tuples, numpy arrays and scalars of numeric or bool dtype, and torch tensors of the dtypes in
  ``_layout.TORCH_DTYPES`` (bfloat16 included) round-trip exactly. torch is imported only when
  a tensor is met.

Extensions are dispatched through tables (:attr:`SampleEncoder.ext_by_type`,
:attr:`SampleEncoder.ext_by_class`, :attr:`SampleDecoder.ext`), so a new one is a new entry.

**Cost model: no Python call per element.** A sample of a long rollout is mostly three flat
lists (token ids, loss mask, log-probs) of thousands of numbers, and msgpack handles those at C
speed; the codec must not visit their elements in Python.

* Encoding walks the containers of a sample (dicts, lists, tuples), not the numbers in them. A
  list is proved to hold only numbers by :func:`only_numbers` (C speed) and handed to the packer
  as it is. The packer is msgspec's (``msgspec.msgpack.Encoder``): for every value the walk
  lets through it writes the bytes msgpack's ``packb(use_bin_type=True)`` writes (the smallest
  int width, float64, bin for bytes, maps in insertion order) at ~3x its speed, so bundles
  written before and after are the same bytes (tests/vectors and a property test pin it).
  Whatever could slip through the proof (an ``int`` subclass, an int beyond 64 bits) makes it
  raise; only then does a second walk, item by item, name the value. The one kind of int it
  packs as an int is an enum member (``IntEnum``, ``IntFlag``): the walk stores those as their
  values too, so one comes back as its int wherever it sat. Any other unsupported type raises
  :class:`UnsupportedValueError` naming the key path. Decoding stays with msgpack, whose hooks
  msgspec lacks and which decodes no slower.
* Decoding resolves extensions where msgpack meets them: ``ext_hook`` turns a reference into the
  stored file (looked up in the manifest's media once per distinct reference), and builds arrays,
  tensors and tuples. ``list_hook`` and ``object_hook`` run once per container: they count the
  sample's items, check map keys, refuse msgpack timestamps and compute each container's height
  from its children's (bottom-up, so no recursion), again proving number lists at C speed.
  A problem raises :class:`Defect` without a key path; the shard reader then decodes that one
  sample again leniently (problems become :class:`Bad` markers) and walks it to name the key path:
  the only walk over plain values, and it happens only on failure.

Decoding builds only the closed set of types above: opening a bundle cannot run code from the file.
Dict keys keep their insertion order: the same input gives the same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import sys
from collections.abc import Callable, Container, Iterator, Mapping
from typing import Any, BinaryIO

import msgpack
import msgspec
import numpy as np

from bundles._errors import BundleError, UnsupportedValueError
from bundles._format.images import open_image, pil_image_class
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
from bundles._format.records import Record, build_record, record_fields, registered_types


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while encoding or decoding many containers.

    Encoding and decoding build thousands of dicts and lists and no reference cycles; each
    allocation burst triggers collections that walk every tracked object of the process (with
    torch imported, hundreds of thousands), which made a save up to twice as slow. msgpack's own
    documentation recommends the same. The pause is process-wide and lasts one save or one sample.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_INT_MIN = -(2**63)
_UINT_MAX = 2**64 - 1
_NUMERIC_KINDS = frozenset("biufc")
_NUMBER_TYPES = frozenset({int, float, bool})
_SUM_TYPES = frozenset({int, float})
_KEY_TYPES = frozenset({str, int})
_CONTAINERS = frozenset({list, dict, tuple})
# Values whose presence in a container needs a closer look when decoding.
_NOTABLE = _CONTAINERS | {msgpack.Timestamp}
TIMESTAMP_MESSAGE = "msgpack timestamps are not a value bundles store"

StringRefResolver = Callable[[str, str], "MediaRef | None"]
MediaRefResolver = Callable[[MediaRef, str], MediaRef]
# Stores a PIL image as a media file and returns its complete reference (the writer's job).
ImageStore = Callable[[Any, str], MediaRef]


def only_numbers(items: list[Any]) -> bool:
    """True when ``items`` holds only ints, floats and bools; proved at C speed.

    Long lists are summed: ``sum()`` adds in C (fast paths for ints and floats, ~3 ns an item
    against ~20 for ``set(map(type, items))``), raises at the first str, None, bytes or container,
    and its result is an exact ``int`` or ``float`` only when every item is an int, float or bool
    (numpy scalars, arrays and tensors give numpy or torch values). Lists whose first, middle or
    last item is anything else are not summed, so a list of tensors is never added up. An ``int``
    subclass (say an ``IntEnum``) inside a long list passes; msgpack's strict packer refuses it,
    which is why the encoder has a second walk.

    A numpy scalar hidden elsewhere in a long list of Python numbers is summed with them: the
    result is a numpy value, so the answer is still False, but numpy may print an overflow
    warning for it (silencing that with ``np.errstate`` costs ~2 us a list, more than the sum).
    """
    n = len(items)
    if n < _SUM_FROM:
        return _NUMBER_TYPES.issuperset(map(type, items))
    if (
        type(items[0]) not in _NUMBER_TYPES
        or type(items[-1]) not in _NUMBER_TYPES
        or type(items[n // 2]) not in _NUMBER_TYPES
    ):
        return False
    try:
        return type(sum(items)) in _SUM_TYPES
    except Exception:  # TypeError at the first non-number; numpy/torch may raise others
        return False


# Below this length, checking each item's type costs less than a sum's setup.
_SUM_FROM = 64


# The ".key" / "[key]" part of a key path, per key: a save builds one key path per nested value
# of every sample, and samples repeat their keys. Bounded: arbitrary keys never grow it past this.
_KEY_PART_CACHE_MAX = 4096
_key_parts: dict[tuple[type, object], str] = {}


def key_path(parent: str, key: object) -> str:
    cache_key = (type(key), key)
    part = _key_parts.get(cache_key)
    if part is None:
        part = f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
        if len(_key_parts) < _KEY_PART_CACHE_MAX:
            _key_parts[cache_key] = part
    return parent + part


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


# -- encoding ------------------------------------------------------------------------------------
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
        # subclasses count and whose modules are imported lazily: (class getter, handler).
        self.ext_by_type: dict[type, Callable[[Any, str, int], Any]] = {
            tuple: self._tuple,
            MediaRef: self._media_ref,
            bytearray: self._buffer,
            memoryview: self._buffer,
            Record: self._record,
        }
        # Classes registered as records when the encoder is made (bundles._format.records).
        for cls in registered_types():
            self.ext_by_type[cls] = self._record
        self.ext_by_class: list[tuple[Callable[[], type | None], Callable[[Any, str, int], Any]]] = [
            (lambda: np.ndarray, self._ndarray),
            (lambda: np.generic, self._npscalar),
            (_torch_tensor_class, self._tensor),
            (pil_image_class, self._pil_image),
            (lambda: enum.Enum, self._enum_member),
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
        return handler(obj, where, depth)

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
        if arr.dtype.kind not in _NUMERIC_KINDS or arr.dtype.fields is not None:
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
            if len(self._array_headers) < _KEY_PART_CACHE_MAX:
                self._array_headers[key] = header
        return msgspec.msgpack.Ext(EXT_NDARRAY, header + arr.tobytes())

    def _npscalar(self, obj: np.generic, where: str, depth: int) -> msgspec.msgpack.Ext:
        dtype = obj.dtype
        if dtype.kind not in _NUMERIC_KINDS:
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
            if not _INT_MIN <= obj <= _UINT_MAX:
                raise UnsupportedValueError(f"{path}: int {obj} does not fit in 64 bits")
        elif t is dict:
            stack.extend(reversed([(v, key_path(path, k)) for k, v in obj.items()]))
        elif t is list or t is tuple:
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(obj)]))
        elif isinstance(obj, enum.Enum):
            # Stored as its value, so judged by it (``_enum_member`` refuses all but int and
            # float enums): an int enum's value must fit in 64 bits.
            value = encoder._enum_member(obj, path, 0)
            if type(value) is int and not _INT_MIN <= value <= _UINT_MAX:
                raise UnsupportedValueError(f"{path}: {obj!r}'s value {value} does not fit in 64 bits")
        elif not (t in _PASSTHROUGH or t is str or t in encoder.ext_by_type or encoder.has_class_ext(obj)):
            raise _unsupported_type(obj, path)


# -- decoding ------------------------------------------------------------------------------------
class Defect(Exception):
    """A problem inside one sample, raised from msgpack's hooks before its key path is known.

    ``locate`` is False for limits (items, size), where decoding the sample again to find a key
    path would cost what the limit is there to prevent.
    """

    def __init__(self, message: str, locate: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.locate = locate


class Bad:
    """What a lenient decode puts where a strict one raised, for :func:`find_defect` to locate."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


_TORCH_DTYPE_OBJECTS: dict[str, Any] = {}


def _torch_dtype(name: str) -> Any:
    """The torch dtype of an allowlisted name (a constant, never a name read from a file)."""
    if not _TORCH_DTYPE_OBJECTS:
        import torch

        for n in TORCH_DTYPES:
            dtype = getattr(torch, n, None)
            if isinstance(dtype, torch.dtype):
                _TORCH_DTYPE_OBJECTS[n] = dtype
    return _TORCH_DTYPE_OBJECTS.get(name)


class SampleDecoder:
    """Decodes the samples of one shard; references resolve to the files listed in ``media``.

    ``media`` maps a stored file name (``<hex><suffix>``) to its MediaRef with ``path`` set.
    One decoder serves one shard, sample after sample: call :meth:`sample_done` after each.
    A ``lenient`` decoder (used only to locate a problem) puts :class:`Bad` markers where the
    strict one raises, and lets timestamps, odd map keys and deep nesting through for
    :func:`find_defect`; it still enforces the limits on items and tuple depth.
    """

    def __init__(
        self,
        media: Mapping[str, MediaRef],
        lenient: bool = False,
        open_media: Callable[[str], BinaryIO] | None = None,
    ) -> None:
        self._media = media
        # A packed bundle's media are members, not files: open_media(name) opens one, read by
        # range when the pixels are needed (never copied into memory per reference).
        self._open_media = open_media
        self._lenient = lenient
        self._refs: dict[tuple[int, bytes], Any] = {}
        self._heights: dict[int, int] = {}  # id(container) -> height, for containers taller than 1
        self._items = 0
        self._tuple_depth = 0
        self.ext: dict[int, Callable[[bytes], Any]] = {
            EXT_MEDIA_REF: self._media_ref,
            EXT_PATH_REF: self._path_ref,
            EXT_TUPLE: self._tuple,
            EXT_NDARRAY: self._ndarray,
            EXT_NPSCALAR: self._npscalar,
            EXT_TENSOR: self._tensor,
            EXT_RECORD: self._record,
            EXT_IMAGE: self._image,
        }
        self.options: dict[str, Any] = {
            "ext_hook": self._ext_hook,
            "list_hook": self._list_hook,
            "object_hook": self._object_hook,
            "raw": False,
            "strict_map_key": False,
            "use_list": True,
        }

    def unpacker(self, buffer_size: int) -> msgpack.Unpacker:
        """A streaming unpacker whose own limits match the per-sample ones of the format."""
        return msgpack.Unpacker(
            **self.options,
            max_buffer_size=buffer_size,
            max_str_len=MAX_SAMPLE_RAW_BYTES,
            max_bin_len=MAX_SAMPLE_RAW_BYTES,
            max_ext_len=MAX_SAMPLE_RAW_BYTES,
            max_array_len=MAX_SAMPLE_ITEMS,
            max_map_len=MAX_SAMPLE_ITEMS,
        )

    def sample_done(self) -> None:
        self._heights.clear()
        self._items = 0

    # -- per-container hooks ----------------------------------------------------------------------
    def _too_many(self) -> None:
        raise Defect(
            f"more than {MAX_SAMPLE_ITEMS} items (list, tuple and map elements, plus one per container); "
            "the format's per-sample limit",
            locate=False,
        )

    def _list_hook(self, items: list[Any]) -> list[Any]:
        self._items += len(items) + 1
        if self._items > MAX_SAMPLE_ITEMS:
            self._too_many()
        if not only_numbers(items):
            self._check_children(items, items)
        return items

    def _object_hook(self, obj: dict[Any, Any]) -> dict[Any, Any]:
        self._items += len(obj) + 1
        if self._items > MAX_SAMPLE_ITEMS:
            self._too_many()
        if not self._lenient and not _KEY_TYPES.issuperset(map(type, obj)):
            key = next(k for k in obj if type(k) not in _KEY_TYPES)
            raise Defect(f"map key {key!r} is not a str or int")
        self._check_children(obj, obj.values())
        return obj

    def _check_children(self, container: Any, values: Any) -> None:
        """Refuse timestamps among ``values``; record the container's height if above 1."""
        types = set(map(type, values))
        if types.isdisjoint(_NOTABLE):
            return
        if msgpack.Timestamp in types and not self._lenient:
            raise Defect(TIMESTAMP_MESSAGE)
        heights = self._heights
        height = 1 + max((heights.get(id(v), 1) for v in values if type(v) in _CONTAINERS), default=0)
        if height > MAX_NESTING_DEPTH + 1 and not self._lenient:
            raise Defect(f"nesting deeper than {MAX_NESTING_DEPTH} levels")
        if height > 1:
            heights[id(container)] = height

    # -- extensions -------------------------------------------------------------------------------
    def _ext_hook(self, code: int, data: bytes) -> Any:
        handler = self.ext.get(code)
        try:
            if handler is None:
                raise Defect(f"unknown msgpack extension type {code}")
            return handler(data)
        except Defect as d:
            if self._lenient and d.locate:
                return Bad(d.message)
            raise

    def _ref(self, code: int, data: bytes) -> MediaRef:
        stored = self._refs.get((code, data))
        if stored is not None:
            return stored
        try:
            digest, size, suffix = msgpack.unpackb(data, raw=False)
            ref = MediaRef(digest, size, suffix)
        except Exception as e:
            raise Defect(f"malformed media reference: {e}") from None
        found = self._media.get(ref.filename)
        if found is None or found.size != ref.size:
            raise Defect(
                f"references {ref.digest}{ref.suffix} ({ref.size} bytes), which the manifest does not list"
            )
        self._refs[(code, data)] = found
        return found

    def _media_ref(self, data: bytes) -> MediaRef:
        return self._ref(EXT_MEDIA_REF, data)

    def _path_ref(self, data: bytes) -> str:
        return str(self._ref(EXT_PATH_REF, data).path)

    def _image(self, data: bytes) -> Any:
        """A PIL image opened lazily on the stored PNG; its MediaRef when Pillow is not installed."""
        ref = self._ref(EXT_IMAGE, data)
        opener = self._open_media
        try:
            image = open_image(str(ref.path), None if opener is None else opener(ref.filename))
        except (OSError, ValueError, SyntaxError) as e:
            raise Defect(f"stored image {ref.filename} cannot be read as a PNG: {e}") from None
        return ref if image is None else image

    def _record(self, data: bytes) -> Any:
        """A registered class rebuilt from ``[name, {field: value}]``, else a :class:`Record`."""
        items = self._nested(data, "record")
        if not (type(items) is list and len(items) == 2):
            raise Defect("record extension does not hold [name, fields]")
        name, fields = items
        height = self._heights.pop(id(fields), 1) if type(fields) is dict else 1
        try:
            # Locating a problem: fields holding a marker stay a Record, for find_defect to walk.
            located = self._lenient and type(fields) is dict and find_defect(fields, "") is not None
            result = build_record(name, fields, instantiate=not located)
        except (TypeError, ValueError) as e:
            raise Defect(str(e)) from None
        if height > 1:
            self._heights[id(result)] = height
        return result

    def _nested(self, data: bytes, what: str) -> Any:
        """Unpack an extension payload that holds values (a tuple's items, a record's fields)."""
        if self._tuple_depth >= MAX_NESTING_DEPTH:
            raise Defect(f"{what}s nested deeper than {MAX_NESTING_DEPTH} levels")
        self._tuple_depth += 1
        try:
            return msgpack.unpackb(data, **self.options)
        except Defect:
            raise
        except Exception as e:
            raise Defect(f"malformed {what}: {e}") from None
        finally:
            self._tuple_depth -= 1

    def _tuple(self, data: bytes) -> Any:
        items = self._nested(data, "tuple")
        if type(items) is not list:
            raise Defect("tuple extension does not hold an array")
        # The list's height becomes the tuple's; the list itself is freed now, and its id with it.
        height = self._heights.pop(id(items), 1)
        result = tuple(items)
        if height > 1:
            self._heights[id(result)] = height
        return result

    def _split_header(self, data: bytes) -> tuple[Any, memoryview]:
        up = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=max(len(data), 1))
        up.feed(data)
        try:
            header = up.unpack()
        except Exception as e:
            raise Defect(f"malformed extension header: {e}") from None
        return header, memoryview(data)[up.tell() :]

    def _ndarray(self, data: bytes) -> np.ndarray:
        header, raw = self._split_header(data)
        dtype, shape = self._dtype_and_shape(header)
        return self._array(dtype, shape, raw)

    def _npscalar(self, data: bytes) -> Any:
        header, raw = self._split_header(data)
        dtype, _ = self._dtype_and_shape([*header, []] if isinstance(header, list) else header)
        return self._array(dtype, [], raw)[()]

    def _dtype_and_shape(self, header: Any) -> tuple[np.dtype[Any], list[int]]:
        if not (isinstance(header, list) and len(header) == 2 and isinstance(header[0], str)):
            raise Defect(f"malformed array header {header!r}")
        try:
            dtype = np.dtype(header[0])
        except TypeError:
            raise Defect(f"unknown dtype {header[0]!r}") from None
        if dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None:
            raise Defect(f"dtype {header[0]!r} is not numeric or bool")
        return dtype, _shape(header[1])

    def _array(self, dtype: np.dtype[Any], shape: list[int], raw: memoryview) -> np.ndarray:
        count = _product(shape)
        if count * dtype.itemsize != len(raw):
            raise Defect(
                f"array of dtype {dtype} and shape {tuple(shape)} needs {count * dtype.itemsize} bytes, "
                f"found {len(raw)}"
            )
        # A private, writable copy: the shard buffer is reused after decoding.
        return np.frombuffer(raw, dtype=dtype).reshape(tuple(shape)).copy()

    def _tensor(self, data: bytes) -> Any:
        header, raw = self._split_header(data)
        if not (isinstance(header, list) and len(header) == 2 and isinstance(header[0], str)):
            raise Defect(f"malformed tensor header {header!r}")
        name = header[0]
        if name not in TORCH_DTYPES:
            raise Defect(f"unknown torch dtype {name!r}: not in the format's list (docs/FORMAT.md §3)")
        shape = _shape(header[1], "malformed tensor shape")
        try:
            import torch
        except ImportError:
            raise Defect(
                f"a torch tensor ({name}, shape {tuple(shape)}) needs torch to be read, and torch is not "
                "installed here"
            ) from None
        dtype = _torch_dtype(name)
        if dtype is None:
            raise Defect(f"torch dtype {name!r} is not available in torch {torch.__version__}")
        count = _product(shape)
        if count * dtype.itemsize != len(raw):
            raise Defect(
                f"tensor of dtype {name} and shape {tuple(shape)} needs {count * dtype.itemsize} bytes, "
                f"found {len(raw)}"
            )
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(tuple(shape))


def _shape(shape: Any, what: str = "malformed shape") -> list[int]:
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise Defect(f"{what} {shape!r}")
    return shape


def _product(shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def find_defect(sample: Any, path: str) -> tuple[str, str] | None:
    """The key path and message of the first problem in a leniently decoded sample, or None.

    Iterative (a file may nest far deeper than Python's recursion limit), in document order;
    only containers and markers are pushed, so long number lists cost one ``type()`` per item.
    """
    stack: list[tuple[Any, str, int]] = [(sample, path, 0)]
    while stack:
        obj, where, depth = stack.pop()
        t = type(obj)
        if t is Bad:
            return where, obj.message
        if t is msgpack.Timestamp:
            return where, TIMESTAMP_MESSAGE
        if depth > MAX_NESTING_DEPTH:
            return where, f"nesting deeper than {MAX_NESTING_DEPTH} levels"
        if t is dict:
            for k in obj:
                if type(k) is Bad:
                    return where, k.message
                if type(k) not in _KEY_TYPES:
                    return where, f"map key {k!r} is not a str or int"
            children = [(v, key_path(where, k), depth + 1) for k, v in obj.items() if type(v) in _FOUND]
        elif t is list or t is tuple:
            children = [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(obj) if type(v) in _FOUND]
        elif t is Record:
            children = [
                (v, key_path(where, k), depth + 1) for k, v in obj.fields.items() if type(v) in _FOUND
            ]
        else:
            continue
        stack.extend(reversed(children))
    return None


_FOUND = _NOTABLE | {Bad, Record}
