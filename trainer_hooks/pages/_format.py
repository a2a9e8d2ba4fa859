"""How a value is written on a page: text bounds, status badges, number formats.

Its one reason to change is how a value reads: every function returns plain text (or a small dict
of plain text) that a template escapes; none writes HTML. ``rollout-bundle view`` and
``rollout-bundle serve`` both write through these, so a status colour (:data:`STATUS_CLASS`, whose
classes ``style.css`` colours), the number of characters of a text a page shows
(:data:`MAX_TEXT`) or how a reward is printed is changed here, once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from bundles.support import human_bytes

__all__ = [
    "MAX_TEXT",
    "STATUS_CLASS",
    "badge",
    "chips",
    "compact",
    "finite",
    "fmt",
    "num",
    "pretty",
    "px",
    "ratio",
    "reward_text",
    "short",
    "size",
    "text",
]

MAX_TEXT = 20_000  # characters of a prompt or response shown before the rest is cut
#: A sample's status -> the badge's class (``ok`` green, ``warn`` amber, ``bad`` red, ``info`` blue).
STATUS_CLASS = {"completed": "ok", "truncated": "warn", "aborted": "warn", "failed": "bad", "pending": "info"}


def num(x: Any) -> str:
    """A number as text: a float with 4 significant digits, anything else as ``str`` cut at 40
    characters (an integer of a thousand digits is named by its length)."""
    if isinstance(x, float):
        return f"{x:.4g}"
    text = str(x)
    return text if len(text) <= 40 else text[:20] + "…" + f" ({len(text)} digits)"


def fmt(v: Any, digits: int = 4) -> str:
    """A value of a table cell: ``–`` for None, a float with ``digits`` significant digits, else
    :func:`num`."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return num(v) if isinstance(v, int) else str(v)


def finite(v: Any) -> float | None:
    """``v`` as a finite float when it is a number (a numpy scalar included, a bool not); else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        item = getattr(v, "item", None)  # a numpy scalar
        if not (callable(item) and getattr(v, "shape", None) == ()):
            return None
        try:
            v = item()
        except Exception:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
    try:
        f = float(v)
    except OverflowError:  # a JSON integer beyond any float
        return None
    return f if math.isfinite(f) else None


def px(x: float) -> str:
    """A coordinate or length with at most one decimal and no trailing zeros."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


def size(n: Any) -> str:
    """A byte count from a report or a manifest as ``1.5 MiB``; any other value as text."""
    if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**80:
        return str(human_bytes(n))
    return f"{num(n)} bytes"


def ratio(a: Any, b: Any) -> str | None:
    try:
        r = float(a) / float(b)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return f"{r:.2f}×" if math.isfinite(r) else None


def compact(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, sort_keys=True, default=str)


def short(v: Any, limit: int = 60) -> str:
    """``v`` as compact JSON cut to ``limit`` characters (``–`` for None)."""
    if v is None:
        return "–"
    t = compact(v)
    return t if len(t) <= limit else t[: limit - 3] + "..."


def pretty(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, indent=2, default=str)


def reward_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else compact(v)


def text(s: str, more: int = 0) -> dict[str, Any]:
    """A long text cut at MAX_TEXT characters: ``{"text", "more"}`` (characters left out, with
    ``more`` already cut by :func:`~trainer_hooks.pages.sample_view`)."""
    return {"text": s[:MAX_TEXT], "more": max(0, len(s) - MAX_TEXT) + more}


def badge(status: str | None) -> dict[str, str]:
    """A status as the ``badge`` macro draws it: its class (:data:`STATUS_CLASS`) and its text."""
    if status is None:
        return {"cls": "", "text": "no status"}
    return {"cls": STATUS_CLASS.get(status.lower(), ""), "text": status}


def chips(d: Any) -> dict[str, Any]:
    """A small mapping as ``key value`` chips (nested values as compact JSON), else one code span."""
    if not isinstance(d, Mapping) or not d:
        return {"code": compact(d)}
    return {"chips": [(str(k), v if isinstance(v, str) else compact(v)) for k, v in d.items()]}
