"""A JSON text read through a window: the manifest parsed without its text, or its bytes, whole.

A bundle with a screenshot per sample lists one media entry per sample: ~11 MB of manifest at
100,000 samples, which a reader held twice at its peak (the bytes read, and their text while
they were decoded) before the media table holding what it keeps was ~4 MB (issue 39, item 6).
:class:`TextWindow` gives the manifest's parser (``bundles._format.manifest``) the text a
window at a time, :data:`WINDOW_BYTES` read and decoded at once: memory holds the window, the
value being scanned and what the parser keeps, whatever the manifest's size.

**The protocol.** Indices are into :attr:`TextWindow.text`, which changes only in
:meth:`~TextWindow.more` (called by :meth:`~TextWindow.ws` and :meth:`~TextWindow.scan`, which
return indices into the new text): it drops the text before an index and appends what is read
next, so the window holds the value being scanned and what follows it. Every value is scanned
by ``json``'s own scanner (the grammar, escapes, numbers and messages are ``json.loads``'s): a
value that meets the window's end (a string or an object cut short, ``12`` of ``123``, ``1.5``
of ``1.5e-9``, which the scanner reads two characters back) fails or ends within
:data:`MARGIN` of it, and is scanned again with more text, the reads doubling, so a value
larger than the window costs O(its size) and is read whole. UTF-8 is decoded incrementally (a
character cut between two reads is decoded with the second) and strictly, as ``bytes.decode``
decodes it; a NUL byte raises :class:`WindowGaveUp`.

**Trade-off.** A window's indices are not the text's, so an error's position would not be
``json.loads``'s: the window never reports. Whatever goes wrong in it (a JSON error, bytes that
are not UTF-8, a NUL, nesting) makes the parser give up and parse the whole text instead, which
names the problem exactly as before. A manifest that parses is read once; a damaged one is read
twice, and held whole while its problem is found: bounded by MAX_MANIFEST_BYTES, as before. A JSON
error well inside the window (not at its cut) gives up at once, before the rest is read.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable
from typing import Any

__all__ = ["DECODER", "MARGIN", "SCAN", "WHITESPACE", "WINDOW_BYTES", "TextWindow", "WindowGaveUp"]

#: Bytes read and decoded at a time (a window holds about this much text, more for a larger
#: value). Below glibc's mmap threshold (128 KiB): a window's buffers come from the heap and go
#: back to it, and freeing them never raises the threshold, which would send the media table's
#: growing columns to the heap too (realloc there copies and leaves holes). Measured at 100,000
#: entries against windows of 256 KiB: 1.0 MB less peak RSS for the open, 1.4 MB less for a
#: second bundle opened after a first; the parse as fast (0.44 s).
WINDOW_BYTES = 1 << 16
#: A value that ends this close to the window's end is scanned again with more text (see above).
MARGIN = 8


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows a float64")
    return value


#: ``json.loads`` refusing ``NaN``, ``Infinity`` and a float that overflows (FORMAT.md §2).
DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
WHITESPACE = re.compile(r"[ \t\n\r]*")
#: The decoder's scanner: one JSON value at an index of a text, and the index past it.
SCAN: Callable[[str, int], tuple[Any, int]] = DECODER.scan_once  # type: ignore[attr-defined]


def _inside(e: BaseException, length: int) -> bool:
    """Whether the scanner's error ``e`` is one no more text can undo: a JSON error at a
    position well inside the text (a control character, a missing comma), so that a damaged
    manifest is given up at once, not read to its end first. Not "Unterminated string", which
    names where the string starts, nor any other error (a cut number, a cut literal)."""
    return (
        isinstance(e, json.JSONDecodeError)
        and not e.msg.startswith("Unterminated string")
        and e.pos + MARGIN < length
    )


class WindowGaveUp(Exception):
    """What the window leaves to the whole-text parse: a NUL byte (its checks name it)."""


class TextWindow:
    """The text the scanner reads: a whole text (``read`` None), or a window over the bytes that
    ``read(n)`` gives (up to ``n`` more, ``b""`` at the end); see the module docstring."""

    __slots__ = ("_decoder", "_read", "done", "text")

    def __init__(self, text: str, read: Callable[[int], bytes] | None = None) -> None:
        self.text, self._read, self.done = text, read, read is None
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def more(self, i: int, n: int) -> int:
        """Drop the text before ``i`` and append up to ``n`` more bytes' worth; return where
        ``i`` is now. Raises ``UnicodeDecodeError`` and :class:`WindowGaveUp`."""
        if self._read is None or self.done:
            return i
        chunk = self._read(n)
        if b"\x00" in chunk:
            raise WindowGaveUp
        self.done = not chunk
        self.text = self.text[i:] + self._decoder.decode(chunk, final=self.done)
        return 0

    def ws(self, i: int) -> int:
        """The index past the whitespace at ``i``: of a character, unless the text is all read."""
        while True:
            i = WHITESPACE.match(self.text, i).end()  # type: ignore[union-attr]
            if i < len(self.text) or self.done:
                return i
            i = self.more(i, WINDOW_BYTES)

    def scan(self, i: int) -> tuple[Any, int]:
        """The JSON value at ``i`` and the index past it; its error once the text is all read."""
        n = WINDOW_BYTES
        while True:
            try:
                value, end = SCAN(self.text, i)
            except (StopIteration, ValueError, RecursionError) as e:
                if self.done or _inside(e, len(self.text)):
                    raise
            else:
                if self.done or end + MARGIN < len(self.text):
                    return value, end
            i, n = self.more(i, n), 2 * n
