"""Decoding one sample: :class:`SampleDecoder`'s msgpack hooks resolve extensions and check limits
where msgpack meets them; :func:`find_defect` names the key path of a problem, on failure only (the
cost model and the extension types: :mod:`bundles._format.codec`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import msgpack
import numpy as np

from bundles._format.codec import (
    CONTAINERS,
    KEY_TYPES,
    NOTABLE,
    NUMERIC_KINDS,
    TIMESTAMP_MESSAGE,
    key_path,
    only_numbers,
)
from bundles._format.images import open_image
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
from bundles._format.records import Record, build_record


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


#: References resolved per decoder before its cache starts over: the references a shard repeats
#: resolve once (a binary search of the manifest's media table and a ``MediaRef`` each), while a
#: shard of distinct screenshots (one a sample) holds no more than this many (~600 bytes each).
REF_CACHE = 1024


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

    # The extension table and the unpacker's hooks are built per call, never kept on the
    # decoder: a decoder holding its own bound methods is a reference cycle, and a cycle keeps
    # what the decoder holds (``open_media``: the bundle, a packed bundle's descriptor) alive
    # until the garbage collector happens to run, not when the last sample is read.
    @property
    def ext(self) -> dict[int, Callable[[bytes], Any]]:
        """Extension code -> its decoder (bound to this decoder): one entry per extension type."""
        return {code: getattr(self, fn.__name__) for code, fn in _EXT_HANDLERS.items()}

    @property
    def options(self) -> dict[str, Any]:
        """The keyword arguments of msgpack's unpacking: this decoder's hooks."""
        return {
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
        if not self._lenient and not KEY_TYPES.issuperset(map(type, obj)):
            key = next(k for k in obj if type(k) not in KEY_TYPES)
            raise Defect(f"map key {key!r} is not a str or int")
        self._check_children(obj, obj.values())
        return obj

    def _check_children(self, container: Any, values: Any) -> None:
        """Refuse timestamps among ``values``; record the container's height if above 1."""
        types = set(map(type, values))
        if types.isdisjoint(NOTABLE):
            return
        if msgpack.Timestamp in types and not self._lenient:
            raise Defect(TIMESTAMP_MESSAGE)
        heights = self._heights
        height = 1 + max((heights.get(id(v), 1) for v in values if type(v) in CONTAINERS), default=0)
        if height > MAX_NESTING_DEPTH + 1 and not self._lenient:
            raise Defect(f"nesting deeper than {MAX_NESTING_DEPTH} levels")
        if height > 1:
            heights[id(container)] = height

    # -- extensions -------------------------------------------------------------------------------
    def _ext_hook(self, code: int, data: bytes) -> Any:
        handler = _EXT_HANDLERS.get(code)
        try:
            if handler is None:
                raise Defect(f"unknown msgpack extension type {code}")
            return handler(self, data)
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
        if len(self._refs) >= REF_CACHE:  # distinct references: one a sample's screenshot, say
            self._refs.clear()
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
        if dtype.kind not in NUMERIC_KINDS or dtype.fields is not None:
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
                if type(k) not in KEY_TYPES:
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


_FOUND = NOTABLE | {Bad, Record}


#: Extension code -> the (unbound) method decoding it; see :attr:`SampleDecoder.ext`.
_EXT_HANDLERS: dict[int, Callable[[SampleDecoder, bytes], Any]] = {
    EXT_MEDIA_REF: SampleDecoder._media_ref,
    EXT_PATH_REF: SampleDecoder._path_ref,
    EXT_TUPLE: SampleDecoder._tuple,
    EXT_NDARRAY: SampleDecoder._ndarray,
    EXT_NPSCALAR: SampleDecoder._npscalar,
    EXT_TENSOR: SampleDecoder._tensor,
    EXT_RECORD: SampleDecoder._record,
    EXT_IMAGE: SampleDecoder._image,
}
