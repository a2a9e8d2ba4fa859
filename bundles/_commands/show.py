"""Samples as JSON a person can read: what ``rollout-bundle show`` prints and ``diff`` compares.

A decoded sample holds plain values, tuples, bytes, numpy arrays and scalars, torch tensors and
media (``MediaRef`` objects, or path strings into the bundle). :func:`to_json` maps them to JSON:

- media become their path inside the bundle, ``media/<sha256 hex><suffix>``, which names the
  content and is the same in every bundle that stores it;
- arrays and tensors become ``{"type": "ndarray"|"tensor", "dtype", "shape"}`` and, with
  ``full``, ``"data"`` (nested lists); long lists of numbers (token ids, masks, log-probs) become
  ``{"type": "list", "length", "head"}`` unless ``full``; bytes become ``{"type": "bytes",
  "size"}`` (plus ``"base64"`` with ``full``); tuples become lists;
- floats that JSON cannot hold (NaN, infinities) become the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"``; map keys become strings.

:func:`fingerprint` is the form ``diff`` compares: like ``to_json``, but arrays, tensors and
bytes carry the sha256 of their bytes instead of their data, so equal content compares equal
without holding two copies of a large array as lists.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from bundles._errors import BundleError
from bundles._format.images import pil_image_class
from bundles._format.layout import MEDIA_DIR
from bundles._format.media import MediaRef
from bundles._format.records import Record, record_fields, record_name

__all__ = ["dumps_pretty", "fingerprint", "parse_key_paths", "select", "summarise", "to_json"]

LONG_LIST = 32  # lists of more numbers than this are summarised unless full
HEAD = 8


def _float(v: float) -> Any:
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def _plain(v: Any) -> Any:
    """Python numbers (from ``tolist()``) to JSON: complex as ``[re, im]``, non-finite floats named."""
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, complex):
        return [_float(v.real), _float(v.imag)]
    return v


def _is_torch_tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "dtype") and hasattr(v, "shape")


def _tensor_numpy(t: Any) -> np.ndarray:
    t = t.detach().cpu()
    name = str(t.dtype).removeprefix("torch.")
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        t = t.float()
    return np.asarray(t.numpy())


def _tensor_bytes(t: Any) -> bytes:
    import torch

    flat = t.detach().cpu().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else b""


def _numbers(v: list[Any] | tuple[Any, ...]) -> bool:
    return all(type(x) in (int, float, bool) for x in v)


def summarise(v: list[Any] | tuple[Any, ...]) -> dict[str, Any]:
    """A long list of numbers as ``{"type": "list", "length", "head"}``."""
    return {"type": "list", "length": len(v), "head": _plain(list(v[:HEAD]))}


class _Converter:
    def __init__(
        self, media_prefix: str, full: bool, hashes: bool, media_paths: Mapping[str, str] | None = None
    ) -> None:
        self.media_prefix = media_prefix
        self.media_paths = media_paths or {}
        self.full = full
        self.hashes = hashes

    def stored(self, path: str) -> str | None:
        """The stored name ``path`` refers to, or None: by the bundle's own media paths (a pooled
        bundle's lie outside it), else by the prefix."""
        name = self.media_paths.get(path)
        if name is None and self.media_prefix and path.startswith(self.media_prefix):
            name = path[len(self.media_prefix) :]
        return name

    def media(self, name: str) -> str:
        return f"{MEDIA_DIR}/{name}"

    def __call__(self, v: Any) -> Any:
        t = type(v)
        if v is None or t is bool or t is int or t is str:
            name = self.stored(v) if t is str else None
            return v if name is None else self.media(name)
        if t is float:
            return _float(v)
        if t is dict:
            return {str(k): self(x) for k, x in v.items()}
        if t is list or t is tuple:
            if not self.full and not self.hashes and len(v) > LONG_LIST and _numbers(v):
                return summarise(v)
            return [self(x) for x in v]
        if isinstance(v, MediaRef):
            return self.media(v.filename)
        if t is bytes or t is bytearray:
            out = {"type": "bytes", "size": len(v)}
            if self.hashes:
                out["sha256"] = hashlib.sha256(v).hexdigest()
            elif self.full:
                out["base64"] = base64.b64encode(v).decode()
            return out
        if isinstance(v, np.ndarray):
            out = {
                "type": "ndarray",
                "dtype": v.dtype.name if v.dtype.isnative else v.dtype.str,
                "shape": list(v.shape),
            }
            if self.hashes:
                out["sha256"] = hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
            elif self.full:
                out["data"] = _plain(v.tolist())
            return out
        if isinstance(v, np.generic):
            return _plain(v.item())
        if _is_torch_tensor(v):
            out = {"type": "tensor", "dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
            if self.hashes:
                out["sha256"] = hashlib.sha256(_tensor_bytes(v)).hexdigest()
            elif self.full:
                out["data"] = _plain(_tensor_numpy(v).tolist())
            return out
        if t is Record or record_name(t) is not None:
            name, fields = record_fields(v)
            return {"type": "record", "name": name, "fields": {k: self(x) for k, x in fields.items()}}
        pil = pil_image_class()
        if pil is not None and isinstance(v, pil):
            filename = getattr(v, "filename", "") or ""
            image: Any = v
            out = {"type": "image", "mode": image.mode, "size": list(image.size)}
            name = self.stored(filename) if filename else None
            if name is not None:
                out["media"] = self.media(name)
            return out
        return repr(v)  # not a type decoding produces; shown rather than refused


def to_json(
    value: Any, *, media_prefix: str = "", full: bool = False, media_paths: Mapping[str, str] | None = None
) -> Any:
    """``value`` as JSON-able data (see the module docstring).

    ``media_paths`` maps each stored media path of the bundle (``MediaRef.path``, in a shared
    pool too) to its stored name; ``media_prefix`` (``"<bundle path>/media/"``) catches the rest.
    """
    return _Converter(media_prefix, full, hashes=False, media_paths=media_paths)(value)


def fingerprint(value: Any, *, media_prefix: str = "") -> Any:
    """The comparable form of ``value``: arrays, tensors and bytes as dtype, shape and the sha256
    of their bytes; lists (long ones too) in full, so a difference can be named by index."""
    return _Converter(media_prefix, full=False, hashes=True)(value)


def parse_key_paths(text: str) -> list[list[str]]:
    """``"reward,multimodal_inputs.images"`` -> ``[["reward"], ["multimodal_inputs", "images"]]``."""
    paths = [p.strip() for p in text.split(",") if p.strip()]
    if not paths:
        raise BundleError(
            f"--keys: expected comma-separated key paths such as 'reward,status', found {text!r}"
        )
    return [p.split(".") for p in paths]


def select(
    sample: dict[Any, Any], paths: Iterable[list[str]], matched: set[int] | None = None
) -> dict[Any, Any]:
    """The parts of ``sample`` at ``paths``, nested as in the sample; absent paths are left out.
    The positions (in ``paths``) of the paths found are added to ``matched``."""
    out: dict[Any, Any] = {}
    for n, parts in enumerate(paths):
        node: Any = sample
        for part in parts:
            if not isinstance(node, dict):
                break
            key: Any = part
            if key not in node and part.lstrip("-").isdigit() and int(part) in node:
                key = int(part)  # int map keys, e.g. per-turn dicts
            if key not in node:
                break
            node = node[key]
        else:
            dst = out
            for part in parts[:-1]:
                dst = dst.setdefault(part, {})
            dst[parts[-1]] = node
            if matched is not None:
                matched.add(n)
    return out


# What json.dumps(ensure_ascii=False) leaves raw that a terminal acts on or cannot encode: DEL and
# the C1 controls, the bidirectional embeddings, overrides and isolates, the line and paragraph
# separators, and lone surrogates (a meta value of "\ud800" is valid JSON). The C0 controls are
# escaped by json.dumps already. Written as \uXXXX escapes, the JSON is the same value.
_RAW_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _json(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``, with nothing a terminal would act on left raw."""
    return _RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))


def _scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(x is None or isinstance(x, (bool, int, float, str)) for x in v)


def dumps_pretty(obj: Any, indent: int = 2, _level: int = 0) -> str:
    """JSON indented like ``json.dumps(indent=2)``, but lists and small objects of scalars kept
    on one line, so a sample reads as a page rather than a column of numbers. Text is kept as it
    is (non-ASCII letters included), except what a terminal would act on: see :func:`_json`."""
    pad = " " * (indent * (_level + 1))
    end = " " * (indent * _level)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if all(not isinstance(v, (dict, list)) or _scalar_list(v) for v in obj.values()):
            one_line = _json(obj)
            if len(one_line) + len(pad) <= 100:
                return one_line
        items = [f"{pad}{_json(k)}: {dumps_pretty(v, indent, _level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(obj, list):
        if not obj:
            return "[]"
        if _scalar_list(obj):
            return _json(obj)
        items = [pad + dumps_pretty(v, indent, _level + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + end + "]"
    return _json(obj)
