"""Sample encoding: msgpack with extension types, never pickle.

Encoding walks a sample once. JSON-like values map to msgpack's own types; everything else the
format supports becomes an extension type (see ``_layout.EXT_*`` and docs/FORMAT.md):

* ``MediaRef`` anywhere, and ``str`` values that are absolute paths inside a media root, become
  references by digest. The writer decides which strings are references through a callback, so
  this module knows nothing about files.
* tuples, ``bytes``, numpy arrays and scalars of numeric or bool dtype, and torch tensors of any
  dtype (bfloat16 included) round-trip exactly. torch is imported only when a tensor is met.

Any other type raises :class:`UnsupportedValueError` naming the key path. Decoding only ever
builds the same closed set of types, so opening a bundle cannot run code from the file.

Dict keys keep their insertion order: the same input gives the same bytes.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import numpy as np

from bundles._errors import BundleFormatError, UnsupportedValueError
from bundles._layout import (
    EXT_MEDIA_REF,
    EXT_NDARRAY,
    EXT_NPSCALAR,
    EXT_PATH_REF,
    EXT_TENSOR,
    EXT_TUPLE,
    MAX_NESTING_DEPTH,
)
from bundles._media import MediaRef


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while encoding or decoding many containers.

    Encoding and decoding build thousands of dicts and lists and no reference cycles; each
    allocation burst triggers collections that walk every tracked object of the process (with
    torch imported, hundreds of thousands), which made a save up to twice as slow. msgpack's own
    documentation recommends the same. The pause is process-wide and lasts one save or one shard.
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

# (digest, size, suffix) of a media file, or None when the string is not a reference.
StringRefResolver = Callable[[str, str], "MediaRef | None"]
MediaRefResolver = Callable[[MediaRef, str], MediaRef]


class PathRef:
    """A decoded plain-string reference, before the reader turns it back into a path string."""

    __slots__ = ("ref",)

    def __init__(self, ref: MediaRef) -> None:
        self.ref = ref


# Stored as they are; ints beyond 64 bits make the packer raise, and encode() then names them.
_PASSTHROUGH = frozenset({type(None), bool, int, float, bytes})
_INT_TYPES = frozenset({int, bool})
_FLOAT_TYPES = frozenset({float, bool})


def _is_flat_numbers(items: list[Any]) -> bool:
    """True for a list of only ints or only floats, checked at C speed.

    Walking such lists item by item in Python was most of a save's cost (a 1,024-token sample
    is 1,024 calls). An int beyond 64 bits makes the packer raise; :meth:`SampleEncoder.encode`
    then walks the sample item by item to name it.
    """
    types = set(map(type, items))
    return types <= _FLOAT_TYPES or types <= _INT_TYPES


def key_path(parent: str, key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{parent}.{key}"
    return f"{parent}[{key!r}]"


def _torch_module() -> Any:
    return sys.modules.get("torch")


def _pack_header_and_bytes(header: list[Any], data: bytes | np.ndarray) -> bytes:
    """The packed header followed by the raw bytes of ``data`` (bytes or a numpy view)."""
    return msgpack.packb(header) + (data if isinstance(data, bytes) else data.tobytes())


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
    ) -> None:
        self._resolve_string = resolve_string
        self._resolve_ref = resolve_ref
        # Strings that cannot be references (no media-root prefix) skip the resolver call; None
        # means every string is offered to it.
        self._prefixes = string_prefixes
        self._packer = msgpack.Packer(use_bin_type=True, strict_types=True, autoreset=True)
        self._ext_cache: dict[tuple[int, str, int, str], msgpack.ExtType] = {}

    def encode(self, sample: Any, where: str) -> bytes:
        try:
            return self._packer.pack(self._convert(sample, where, 0))  # tuples are packed inside
        except OverflowError:
            # An int beyond 64 bits (ints are not range-checked on the way): name it.
            self._check_ints(sample, where)
            raise  # pragma: no cover - _check_ints always finds it

    def _check_ints(self, obj: Any, where: str) -> None:
        t = type(obj)
        if t is int and not _INT_MIN <= obj <= _UINT_MAX:
            raise UnsupportedValueError(f"{where}: int {obj} does not fit in 64 bits")
        if t is dict:
            for k, v in obj.items():
                self._check_ints(v, key_path(where, k))
        elif t is list or t is tuple:
            for i, v in enumerate(obj):
                self._check_ints(v, f"{where}[{i}]")

    def _ref_ext(self, code: int, ref: MediaRef) -> msgpack.ExtType:
        key = (code, ref.digest, ref.size, ref.suffix)
        ext = self._ext_cache.get(key)
        if ext is None:
            ext = self._ext_cache[key] = msgpack.ExtType(
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
            out = {}
            for k, v in obj.items():
                tk = type(k)
                if tk is not str and tk is not int:
                    raise UnsupportedValueError(
                        f"{where}: dict keys must be str or int, found {tk.__name__} {k!r}"
                    )
                out[k] = v if self._plain(v) else self._convert(v, key_path(where, k), depth + 1)
            return out
        if t is list:
            if len(obj) > 4 and _is_flat_numbers(obj):
                return obj  # token ids, masks, log-probs: msgpack packs them as they are
            return [
                v if self._plain(v) else self._convert(v, f"{where}[{i}]", depth + 1)
                for i, v in enumerate(obj)
            ]
        if t is tuple:
            items = [
                v if self._plain(v) else self._convert(v, f"{where}[{i}]", depth + 1)
                for i, v in enumerate(obj)
            ]
            return msgpack.ExtType(EXT_TUPLE, self._packer.pack(items))
        if t is bytearray or t is memoryview:
            raise UnsupportedValueError(f"{where}: {t.__name__} is not stored; convert it to bytes")
        if t is MediaRef:
            return self._ref_ext(EXT_MEDIA_REF, self._resolve_ref(obj, where))
        if isinstance(obj, np.ndarray):
            return self._ndarray(obj, where)
        if isinstance(obj, np.generic):
            dtype = obj.dtype
            if dtype.kind not in _NUMERIC_KINDS:
                raise UnsupportedValueError(f"{where}: numpy scalar of dtype {dtype} is not numeric or bool")
            return msgpack.ExtType(EXT_NPSCALAR, _pack_header_and_bytes([dtype.str], obj.tobytes()))
        torch = _torch_module()
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj, where, torch)
        raise UnsupportedValueError(
            f"{where}: values of type {t.__module__}.{t.__qualname__} cannot be stored without pickle; "
            "expected None, bool, int, float, str, bytes, list, tuple, dict, MediaRef, a numpy array or "
            "scalar of numeric/bool dtype, or a torch tensor"
        )

    def _ndarray(self, arr: np.ndarray, where: str) -> msgpack.ExtType:
        if arr.dtype.kind not in _NUMERIC_KINDS or arr.dtype.fields is not None:
            raise UnsupportedValueError(
                f"{where}: numpy array of dtype {arr.dtype} is not numeric or bool; object and "
                "structured arrays are not stored"
            )
        # np.ascontiguousarray would turn a 0-d array into a 1-d one.
        data = arr if arr.flags.c_contiguous else arr.copy(order="C")
        return msgpack.ExtType(
            EXT_NDARRAY,
            _pack_header_and_bytes([data.dtype.str, list(data.shape)], data.reshape(-1).view(np.uint8)),
        )

    def _tensor(self, tensor: Any, where: str, torch: Any) -> msgpack.ExtType:
        if tensor.is_sparse or tensor.layout != torch.strided:
            raise UnsupportedValueError(
                f"{where}: only dense tensors are stored, found layout {tensor.layout}"
            )
        dtype_name = str(tensor.dtype).removeprefix("torch.")
        # Raw bytes through a uint8 view: numpy has no bfloat16/float8, and bytes are bytes.
        try:
            raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        except (RuntimeError, TypeError) as e:
            raise UnsupportedValueError(
                f"{where}: tensor of dtype {tensor.dtype} cannot be stored: {e}"
            ) from None
        return msgpack.ExtType(EXT_TENSOR, _pack_header_and_bytes([dtype_name, list(tensor.shape)], raw))


class SampleDecoder:
    """Decodes shard bytes; references come back as ``MediaRef`` (path None) or ``PathRef``."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._tuple_depth = 0

    def unpacker(self, data: bytes) -> msgpack.Unpacker:
        up = msgpack.Unpacker(
            ext_hook=self._ext_hook,
            raw=False,
            strict_map_key=False,
            use_list=True,
            max_buffer_size=max(len(data), 1),
        )
        up.feed(data)
        return up

    def _fail(self, what: str) -> BundleFormatError:
        return BundleFormatError(f"{self._where}: {what}")

    def _split_header(self, data: bytes) -> tuple[Any, memoryview]:
        up = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=max(len(data), 1))
        up.feed(data)
        try:
            header = up.unpack()
        except Exception as e:
            raise self._fail(f"malformed extension header: {e}") from None
        return header, memoryview(data)[up.tell() :]

    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code in (EXT_MEDIA_REF, EXT_PATH_REF):
            try:
                digest, size, suffix = msgpack.unpackb(data, raw=False)
                ref = MediaRef(digest, size, suffix)
            except Exception as e:
                raise self._fail(f"malformed media reference: {e}") from None
            return ref if code == EXT_MEDIA_REF else PathRef(ref)
        if code == EXT_TUPLE:
            self._tuple_depth += 1
            try:
                if self._tuple_depth > MAX_NESTING_DEPTH:
                    raise self._fail(f"tuples nested deeper than {MAX_NESTING_DEPTH} levels")
                items = msgpack.unpackb(data, ext_hook=self._ext_hook, raw=False, strict_map_key=False)
            except BundleFormatError:
                raise
            except Exception as e:
                raise self._fail(f"malformed tuple: {e}") from None
            finally:
                self._tuple_depth -= 1
            if not isinstance(items, list):
                raise self._fail("tuple extension does not hold an array")
            return tuple(items)
        if code == EXT_NDARRAY:
            header, raw = self._split_header(data)
            dtype, shape = self._dtype_and_shape(header, 2)
            return self._array(dtype, shape, raw)
        if code == EXT_NPSCALAR:
            header, raw = self._split_header(data)
            dtype, _ = self._dtype_and_shape([*header, []] if isinstance(header, list) else header, 2)
            return self._array(dtype, [], raw)[()]
        if code == EXT_TENSOR:
            header, raw = self._split_header(data)
            return self._tensor(header, raw)
        raise self._fail(f"unknown msgpack extension type {code}")

    def _dtype_and_shape(self, header: Any, n: int) -> tuple[np.dtype[Any], list[int]]:
        if not (isinstance(header, list) and len(header) == n and isinstance(header[0], str)):
            raise self._fail(f"malformed array header {header!r}")
        try:
            dtype = np.dtype(header[0])
        except TypeError:
            raise self._fail(f"unknown dtype {header[0]!r}") from None
        if dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None:
            raise self._fail(f"dtype {header[0]!r} is not numeric or bool")
        shape = header[1]
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise self._fail(f"malformed shape {shape!r}")
        return dtype, shape

    def _array(self, dtype: np.dtype[Any], shape: list[int], raw: memoryview) -> np.ndarray:
        count = 1
        for d in shape:
            count *= d
        if count * dtype.itemsize != len(raw):
            raise self._fail(
                f"array of dtype {dtype} and shape {tuple(shape)} needs {count * dtype.itemsize} bytes, "
                f"found {len(raw)}"
            )
        # A private, writable copy: the shard buffer is freed after decoding.
        return np.frombuffer(raw, dtype=dtype).reshape(tuple(shape)).copy()

    def _tensor(self, header: Any, raw: memoryview) -> Any:
        if not (isinstance(header, list) and len(header) == 2 and isinstance(header[0], str)):
            raise self._fail(f"malformed tensor header {header!r}")
        import torch

        dtype = getattr(torch, header[0], None)
        if not isinstance(dtype, torch.dtype):
            raise self._fail(f"unknown torch dtype {header[0]!r}")
        shape = header[1]
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise self._fail(f"malformed tensor shape {shape!r}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = 1
        for d in shape:
            count *= d
        if count * itemsize != len(raw):
            raise self._fail(
                f"tensor of dtype {header[0]} and shape {tuple(shape)} needs {count * itemsize} bytes, "
                f"found {len(raw)}"
            )
        buf = bytearray(raw)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(tuple(shape))
