"""Number columns packed at C speed: a sample's list of numbers as the bytes of its column's C
type (int32, int8, float32), checked and converted by :mod:`struct` in one call a list, so that a
sample's 10^5 tokens cost no Python call each (``bundles._dataset.arrow`` hands the bytes to
Arrow). What struct lets through unfaithfully (a numpy complex, a NaN CPython 3.14 packs as an
infinity) is refused here too: such a list stays out of its column and in ``extra``."""

from __future__ import annotations

import math
import struct
from typing import Any

from bundles._format.codec import only_numbers

__all__ = ["PACK_CHUNK", "as_list", "float32_exact", "pack_numbers"]


def as_list(v: Any) -> list[Any] | None:
    """``v`` as a list when it is a sequence or an array of numbers (a tuple, a numpy array, a
    CPU tensor), else None."""
    if isinstance(v, (list, tuple)):
        return list(v)
    if hasattr(v, "shape") and callable(getattr(v, "tolist", None)):
        try:
            out = v.tolist()
        except Exception:  # a tensor on a device, a foreign array type: kept in extra
            return None
        return out if isinstance(out, list) else None
    return None


_PACKERS: dict[tuple[str, int], struct.Struct] = {}


def _packer(code: str, n: int) -> struct.Struct:
    """The ``struct.Struct`` packing ``n`` numbers of ``code`` (kept for the lengths met last)."""
    packer = _PACKERS.get((code, n))
    if packer is None:
        if len(_PACKERS) >= 1024:
            _PACKERS.clear()
        packer = _PACKERS[(code, n)] = struct.Struct(f"={n}{code}")
    return packer


def pack_numbers(v: Any, code: str) -> bytes | None:
    """``v`` as the bytes of its column's C type (``code``: ``i`` int32, ``b`` int8, ``f``
    float32), or None when it does not fit: a value that is not a number, an int out of range, or
    a finite float beyond float32's (float32 would make it +-inf; an infinity stays one).

    Checked and converted at C speed by :mod:`struct` (a value of another type, an int out of
    range or a float that overflows float32 raises; a bool is its int), so a sample's 10^5 tokens
    cost no Python call each; the batch's column is then these bytes, handed to Arrow without
    another pass (``bundles._dataset.arrow._Flat``)."""
    items = v if type(v) is list else as_list(v)
    if items is None:
        return None
    n = len(items)
    try:
        if n <= PACK_CHUNK:
            packed = _packer(code, n).pack(*items)
        else:
            # A long list a chunk at a time: ``pack(*items)`` passes its items as one tuple, which
            # for a sample's 16 M tokens would be 128 MB of pointers more.
            whole, rest = _packer(code, PACK_CHUNK), n % PACK_CHUNK
            parts = [whole.pack(*items[i : i + PACK_CHUNK]) for i in range(0, n - rest, PACK_CHUNK)]
            parts.append(_packer(code, rest).pack(*items[n - rest :]))
            packed = b"".join(parts)
    except (struct.error, TypeError, OverflowError, ValueError):
        return None
    if code == "f" and not float32_exact(items, packed):
        return None
    return packed


INFINITIES32 = (struct.pack("=f", math.inf), struct.pack("=f", -math.inf))


def float32_exact(items: list[Any], packed: bytes) -> bool:
    """Whether ``packed`` (``items`` as float32) dropped nothing :mod:`struct` lets through: a
    numpy complex's imaginary part (``__float__`` keeps the real part, with only a warning), or
    a NaN made an infinity (CPython 3.14 packs a signalling NaN keeping its bits, and one whose
    payload is in the low bits becomes +-inf: gh-141042). Costs ~3 ns an item for Python
    floats (:func:`only_numbers`); the rest only on a list holding numpy scalars or an infinity
    (a misaligned match of its bytes included)."""
    if not only_numbers(items):
        for x in items:
            dtype = getattr(x, "dtype", None)
            if dtype is not None and dtype.kind not in "biuf":
                return False
    if INFINITIES32[0] in packed or INFINITIES32[1] in packed:
        out = struct.unpack(f"={len(items)}f", packed)
        return not any(math.isinf(o) and not math.isinf(float(x)) for x, o in zip(items, out, strict=True))
    return True


#: Numbers packed at a time (see :func:`pack_numbers`).
PACK_CHUNK = 1 << 14
