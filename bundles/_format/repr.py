"""The one bounded ``repr`` of an error message: :func:`bounded_repr`.

An error message shows the value it refuses, and the value is whatever the user gave: a YAML
alias bomb (a 371-byte document whose nested aliases expand to 9**8 references), a string of a
gigabyte, an int of a million digits. ``repr`` of such a value costs time and memory exponential
in the document (14.9 s and 1.36 GB for a run id, before this), or raises (an int past Python's
4300-digit limit). :func:`bounded_repr` looks at a bounded part of the value only: at most
:data:`MAX_ITEMS` items of a container, :data:`MAX_DEPTH` levels deep, :data:`MAX_CHARS` characters
of a string, and it never calls a foreign object's ``__repr__`` (it names its type): its cost does
not depend on the value's size.

:func:`display` is the one way a name or a text from an untrusted file (a path, a store key, a
manifest's meta value, a prompt) reaches a terminal or a page: control characters (an escape
sequence that moves the cursor, a newline that forges a line), bidirectional overrides, bytes
that are not UTF-8 and lone surrogates (valid JSON, ``"\\ud800"``; Python's ``surrogateescape``
of a non-UTF-8 file name) are shown as escapes, and the result is cut to a bound. Its output is
always encodable as UTF-8 and always one line. HTML escaping stays the templates' job
(autoescape): :func:`display` makes a text safe to *show*, not to splice into markup.
"""

from __future__ import annotations

import os
from itertools import islice
from typing import Any

from bundles._format.limits import MAX_SHOWN_NAME_CHARS

__all__ = ["bounded_repr", "display"]

#: Items of a list, tuple, set or dict shown; the rest are counted.
MAX_ITEMS = 4
#: Levels of nested containers shown; deeper ones are ``[...]``.
MAX_DEPTH = 3
#: Characters (or bytes) of a string shown.
MAX_CHARS = 40
# An int is shown in digits up to this many bits (about 77 digits), else by its size.
_MAX_INT_BITS = 256

_BRACKETS: dict[type, tuple[str, str]] = {
    list: ("[", "]"),
    tuple: ("(", ")"),
    set: ("{", "}"),
    frozenset: ("{", "}"),
    dict: ("{", "}"),
}


def bounded_repr(value: object, limit: int = 100) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters, in time bounded by the
    module's limits whatever the value's size. Example: ``bounded_repr("x" * 10**9)`` is
    ``'xxx…x'... (1000000000 characters)`` cut to ``limit``."""
    text = _brief(value, MAX_DEPTH)
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def _brief(v: Any, depth: int) -> str:
    if v is None or type(v) in (bool, float, complex):
        return repr(v)
    if isinstance(v, int):
        bits = v.bit_length()
        return int.__repr__(v) if bits <= _MAX_INT_BITS else f"<int of {bits} bits>"
    if isinstance(v, str):
        return _cut(str.__repr__(str(v[:MAX_CHARS])), len(v), "characters")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _cut(repr(bytes(v[:MAX_CHARS])), len(v), "bytes")
    if isinstance(v, os.PathLike):
        try:
            path = os.fspath(v)
        except Exception:  # a foreign PathLike's __fspath__ is not ours to trust
            return f"<{type(v).__name__} object>"
        return f"{type(v).__name__}({_brief(path, depth)})"
    for kind in (dict, list, tuple, set, frozenset):
        if isinstance(v, kind):
            return _container(v, kind, depth)
    return f"<{type(v).__name__} object>"


def _cut(shown: str, length: int, unit: str) -> str:
    return shown if length <= MAX_CHARS else f"{shown}... ({length} {unit})"


def _container(v: Any, kind: type, depth: int) -> str:
    open_, close = _BRACKETS[kind]
    if kind in (set, frozenset) and not v:
        return f"{kind.__name__}()"
    if depth <= 0:
        return f"{open_}...{close}"
    if kind is dict:
        parts = [f"{_brief(k, depth - 1)}: {_brief(x, depth - 1)}" for k, x in islice(v.items(), MAX_ITEMS)]
    else:
        parts = [_brief(x, depth - 1) for x in islice(v, MAX_ITEMS)]
    if len(v) > MAX_ITEMS:
        parts.append(f"... ({len(v)} items)")
    if kind is tuple and len(v) == 1:
        parts[0] += ","
    return open_ + ", ".join(parts) + close


# C0 controls, DEL, C1 controls; the bidirectional embeddings, overrides and isolates (a name that
# reverses the text after it); the line and paragraph separators (a line break to some terminals).
_UNSAFE = frozenset(
    [*range(0x00, 0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
)
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def display(
    value: str | bytes | os.PathLike[str] | os.PathLike[bytes], limit: int = MAX_SHOWN_NAME_CHARS
) -> str:
    """``value`` made safe to show on one terminal line or in one page element, at most about
    ``limit`` characters (a longer text is cut and says how long it was).

    Bytes (and a ``str`` holding ``surrogateescape``-d bytes, as :func:`os.listdir` returns for a
    non-UTF-8 name) show their undecodable bytes as ``\\xNN``; other lone surrogates as
    ``\\udNNN``; control and bidirectional-override characters as ``\\n``, ``\\x1b``,
    ``\\u202e``. Everything else, non-ASCII letters included, is shown as it is. Example:
    ``display("a\\x1b[2Jb\\nc")`` is ``'a\\x1b[2Jb\\nc'`` with the escapes spelled out."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    total = len(value)
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value[: limit * 4]).decode("utf-8", "surrogateescape")
    else:
        text = str(value)[:limit]
    out: list[str] = []
    for ch in text[:limit]:
        code = ord(ch)
        if code in _UNSAFE:
            out.append(_NAMED.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"))
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")  # a byte that was not UTF-8
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")  # a lone surrogate: no character, cannot be encoded
        else:
            out.append(ch)
    shown = "".join(out)
    if total > limit:
        unit = "bytes" if isinstance(value, (bytes, bytearray)) else "characters"
        shown += f"... ({total} {unit})"
    return shown
