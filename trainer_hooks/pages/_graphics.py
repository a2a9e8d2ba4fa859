"""The page's pictures: SVG shapes over screenshots, inline-SVG histograms, log-prob PNG strips.

Its one reason to change is how something is drawn. Everything here returns plain numbers and
strings (coordinates already formatted, a PNG as a ``data:`` URI) that the templates place; it
knows nothing of bundles or of the page's layout.
"""

from __future__ import annotations

import math
from typing import Any

from bundles.support import LIMITS
from trainer_hooks.pages._actions import Action
from trainer_hooks.pages._format import finite, num, px

__all__ = [
    "OVERLAY_COLOR",
    "bin_of",
    "bins",
    "histogram",
    "logprob_strip",
    "mismatch_strips",
    "overlay",
    "px",
]

OVERLAY_COLOR = "#ff2bd6"  # drawn over screenshots; tests look for it
STRIP_PIXELS = 2048  # pixels of a log-prob strip at most: beyond, one pixel is the mean of a run of tokens
#: Tokens of one sample a strip reads: the response's text is cut at this many characters on a page
#: (a token is at least one), so no strip reads further than the text it stands beside.
MAX_STRIP_TOKENS = LIMITS["MAX_SHOWN_CHARS"]


def overlay(
    action: Action | None, size: tuple[int, int], screen: tuple[float, float] | None
) -> list[dict[str, Any]]:
    """SVG shapes for ``action`` in the screenshot's own pixels (``size``), scaled from the
    ``screen`` space the agent's coordinates are in (default: the screenshot's)."""
    if action is None or action.kind == "text":
        return []
    w, h = size
    sx, sy = (w / screen[0], h / screen[1]) if screen else (1.0, 1.0)
    unit = max(w, h) / 100  # 19 px on a 1920 px screenshot
    pts = [(x * sx, y * sy) for x, y in action.points]
    shapes: list[dict[str, Any]] = []
    label = action.describe()

    def ring(x: float, y: float, r: float) -> None:
        shapes.append({"t": "ring", "cx": px(x), "cy": px(y), "r": px(r), "sw": px(unit * 0.35)})

    if action.kind == "drag" and len(pts) == 2:
        (x1, y1), (x2, y2) = pts
        shapes.append(
            {"t": "line", "x1": px(x1), "y1": px(y1), "x2": px(x2), "y2": px(y2), "sw": px(unit * 0.35)}
        )
        ring(x1, y1, unit * 1.2)
        ring(x2, y2, unit * 2)
        anchor = (x2, y2)
    elif pts:
        x, y = pts[-1]
        ring(x, y, unit * 2.2)
        if action.kind in ("double_click", "triple_click"):
            ring(x, y, unit * 1.3)
        shapes.append({"t": "dot", "cx": px(x), "cy": px(y), "r": px(unit * 0.45)})
        anchor = (x, y)
    else:
        anchor = (w / 2, h / 2) if action.kind == "scroll" else (unit * 2, unit * 2)
    if action.kind == "scroll" and action.scroll is not None:
        dx, dy = action.scroll
        norm = math.hypot(dx, dy) or 1.0
        x, y = anchor
        length = unit * 8
        shapes.append({"t": "line", "x1": px(x), "y1": px(y), "x2": px(x + dx / norm * length),
                       "y2": px(y + dy / norm * length), "sw": px(unit * 0.6)})  # fmt: skip
    # The label sits beside the anchor, kept inside the picture.
    lx = min(max(anchor[0] + unit * 3, unit), max(unit, w - len(label[:120]) * unit * 1.36 - unit * 2))
    ly = min(max(anchor[1] - unit * 2.5, unit * 3), h - unit)
    shapes.append({"t": "label", "x": px(lx), "y": px(ly), "fs": px(unit * 2.2), "text": label[:120],
                   "bw": px(len(label[:120]) * unit * 1.36 + unit * 1.5), "bh": px(unit * 3)})  # fmt: skip
    return shapes


def bins(values: list[float], *, max_bins: int = 8, integers: bool = False) -> list[tuple[float, float, str]]:
    """Histogram bins ``(low, high, label)``: one per distinct value when there are few, else
    ``max_bins`` equal-width bins from the smallest to the largest value (the last one closed)."""
    distinct = sorted(set(values))
    if not distinct:
        return []
    if len(distinct) <= max_bins:
        return [(v, v, num(int(v) if integers and v.is_integer() else v)) for v in distinct]
    lo, hi = distinct[0], distinct[-1]
    step = (hi - lo) / max_bins
    out = []
    for k in range(max_bins):
        a, b = lo + k * step, hi if k == max_bins - 1 else lo + (k + 1) * step
        fa, fb = (
            (f"{math.ceil(a)}", f"{math.floor(b) if k == max_bins - 1 else math.ceil(b) - 1}")
            if integers
            else (f"{a:.3g}", f"{b:.3g}")
        )
        out.append((a, b, f"{fa}–{fb}"))
    return out


def bin_of(v: float | None, edges: list[tuple[float, float, str]]) -> int | None:
    if v is None:
        return None
    for k, (a, b, _) in enumerate(edges):
        if (a == b and v == a) or (a <= v < b) or (k == len(edges) - 1 and a <= v <= b):
            return k
    return None


def histogram(
    title: str, edges: list[tuple[float, float, str]], counts: list[int], ids: list[str]
) -> dict[str, Any]:
    """An inline-SVG bar chart: bars scaled to the largest count."""
    width, height, gap = 240, 64, 2
    top = max(counts) if counts else 0
    n = max(1, len(counts))
    bar_w = (width - gap * (n - 1)) / n
    bars = []
    for k, (c, (_, _, label)) in enumerate(zip(counts, edges, strict=True)):
        bh = 0 if not top else max(1.0 if c else 0.0, height * c / top)
        bars.append({"x": px(k * (bar_w + gap)), "y": px(height - bh), "w": px(bar_w), "h": px(bh),
                     "label": label, "count": c, "id": ids[k]})  # fmt: skip
    return {"title": title, "w": width, "h": height, "bars": bars,
            "first": edges[0][2] if edges else "", "last": edges[-1][2] if edges else ""}  # fmt: skip


def logprob_strip(values: list[float | None] | None, *, diff: bool = False) -> dict[str, Any] | None:
    """A one-pixel-high PNG, one pixel per token (means of runs beyond 2048 tokens), coloured by
    log-prob (green 0, yellow -1, red -6 and below; grey when not a number), as a data URI the
    page scales up. With ``diff``, the values are |differences| (white 0, red 0.5 and above)."""
    if not values:
        return None
    import base64
    import io

    from PIL import Image

    n = len(values)
    width = min(n, STRIP_PIXELS)
    pixels = []
    for k in range(width):
        chunk = [v for v in values[k * n // width : (k + 1) * n // width] if v is not None]
        if not chunk:
            pixels.append((160, 160, 170))
            continue
        v = math.fsum(chunk) / len(chunk)
        pixels.append(_diff_color(v) if diff else _logprob_color(v))
    im = Image.new("RGB", (width, 1))
    im.putdata(pixels)
    out = io.BytesIO()
    im.save(out, "PNG", optimize=True)
    finite = [v for v in values if v is not None]
    return {
        "uri": "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii"),
        "tokens": n,
        "min": f"{min(finite):.3g}" if finite else "–",
        "mean": f"{math.fsum(finite) / len(finite):.3g}" if finite else "–",
    }


def _mix(c1: tuple[int, int, int], c2: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    t = min(1.0, max(0.0, t))
    return tuple(round(a + (b - a) * t) for a, b in zip(c1, c2, strict=True))  # type: ignore[return-value]


def _logprob_color(v: float) -> tuple[int, int, int]:
    green, yellow, red = (46, 160, 67), (240, 200, 40), (200, 30, 30)
    if v >= -1:
        return _mix(green, yellow, -v)
    return _mix(yellow, red, (-v - 1) / 5)


def _diff_color(v: float) -> tuple[int, int, int]:
    return _mix((255, 255, 255), (200, 30, 30), abs(v) / 0.5)


def mismatch_strips(
    recorded: list[float | None] | None, recomputed: Any, first_over: Any
) -> dict[str, Any] | None:
    """A sample's recorded log-probs against the replay's (``logprob_diff.recomputed`` of a replay
    report: one per response token), as three strips drawn one above the other on the same token
    scale: the recorded ones, the recomputed ones and their |difference|; ``mark`` is where the
    first token over the replay's threshold (``first_over``) sits on them, in percent of the width.

    Both lists are read to :data:`MAX_STRIP_TOKENS` at most (``cut``: the tokens left out). None
    when there is nothing to draw; ``note`` says why two lists of different lengths are not
    compared token by token. Every value comes from a file anyone may have written: a non-number
    is drawn grey, an offset out of range draws no mark."""
    if not isinstance(recomputed, list) or not recomputed:
        return None
    n = len(recomputed)
    cap = min(n, MAX_STRIP_TOKENS)
    theirs = [finite(x) for x in recomputed[:cap]]
    out: dict[str, Any] = {"tokens": n, "cut": n - cap, "recomputed": logprob_strip(theirs), "recorded": None,
                           "diff": None, "mark": None, "note": None}  # fmt: skip
    if recorded is None:
        out["note"] = "the sample records no rollout_log_probs: nothing to compare the replay's with"
        return out
    if len(recorded) != n:
        out["note"] = (
            f"the replay recomputed {n} log-probs, the sample records {len(recorded)}: not compared token by token"
        )
        return out
    ours = recorded[:cap]
    out["recorded"] = logprob_strip(ours)
    diffs = [None if a is None or b is None else abs(a - b) for a, b in zip(ours, theirs, strict=True)]
    out["diff"] = logprob_strip(diffs, diff=True)
    offset = first_over.get("offset") if isinstance(first_over, dict) else None
    if type(offset) is int and 0 <= offset < cap:
        width = min(cap, STRIP_PIXELS)
        # The pixel whose run of tokens holds it: pixel k draws tokens k*cap//width .. (k+1)*cap//width.
        pixel = ((offset + 1) * width + cap - 1) // cap - 1
        shown = {k: "–" if (x := first_over.get(k)) is None else num(x) for k in ("turn", "token")}
        out["mark"] = {"left": f"{(pixel + 0.5) * 100 / width:.3f}", "offset": offset, **shown,
                       "abs": num(finite(first_over.get("abs")) or 0.0)}  # fmt: skip
    return out
