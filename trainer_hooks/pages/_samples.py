"""A sample read down to what the page shows: :func:`sample_view`.

Every value comes from a bundle anyone may have written, and any legal value must be shown, not
crash the page: a top-level numpy array (an ``advantages`` field), numpy scalars, an
``image_grid_thw`` of strings or with ``inf``, a foreign object whose ``repr`` raises. Values are
turned into JSON-able summaries (arrays as ``<ndarray float32 [5]>``, long number lists cut),
never asked for their truth value, and strings are kept as they are: escaping is the template
engine's job (the templates of :mod:`trainer_hooks.pages`).

A view costs what a page shows, not what the sample holds (``bundles.support.LIMITS``): the
response and every string are cut to ``MAX_SHOWN_CHARS`` characters before anything parses them
(the full length is kept: ``response_chars``, or ``… (N characters)`` after a cut string), every
list or mapping summarised to ``MAX_SHOWN_TURNS`` items, and at most ``MAX_SHOWN_TURNS`` turns
(screenshots, actions) kept, their number in ``turns``. A 100 MiB response or a sample of 10^6
turns is read once, by the bundle's reader, and its view stays small: a cache holds views, and
the index stores them.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bundles import Bundle, MediaRef
from bundles.support import LIMITS, MEDIA_DIR
from trainer_hooks.pages._actions import tool_calls
from trainer_hooks.pages._format import finite, num

__all__ = [
    "MEDIA_DIR",
    "Image",
    "SampleView",
    "as_list",
    "jsonable",
    "sample_view",
    "short_repr",
    "stored_media",
]

MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]
MAX_SHOWN_TURNS = LIMITS["MAX_SHOWN_TURNS"]

_SHOWN_KEYS = {
    "index", "group_index", "status", "reward", "tokens", "response", "response_length", "prompt",
    "multimodal_inputs", "metadata", "loss_mask", "rollout_log_probs",
}  # fmt: skip


@dataclass
class Image:
    name: str | None  # <hex><suffix> inside the bundle, or None when the sample names a file outside it
    shown_as: str  # what the caption says when there is no picture
    grid: list[int] | None = None  # (t, h, w) from multimodal_train_inputs.image_grid_thw


@dataclass
class SampleView:
    position: int
    index: Any
    group_index: Any
    status: str | None
    reward: Any
    tokens: int | None
    response_length: Any
    loss_mask: str | None
    logprob_mean: float | None
    prompt: Any
    response: str | None
    images: list[Image]
    actions: list[str] | None
    metadata: Any
    other: dict[str, Any] = field(default_factory=dict)
    logprobs: list[float | None] | None = None  # rollout_log_probs, non-numbers and non-finite as None
    screen: tuple[float, float] | None = None  # metadata.screen: the coordinate space of the actions
    tool_calls: list[str] = field(default_factory=list)  # the response's <tool_call> texts, in order
    turns: int | None = None  # the sample's turns (screenshots), of which ``images`` holds the first few
    response_chars: int | None = None  # the response's length, of which ``response`` holds the first few

    @property
    def turn_count(self) -> int:
        """How many turns the sample has (``images`` holds at most ``MAX_SHOWN_TURNS`` of them)."""
        return len(self.images) if self.turns is None else self.turns

    @property
    def more_turns(self) -> int:
        """Turns of the sample not in ``images``."""
        return max(0, self.turn_count - len(self.images))

    @property
    def more_response(self) -> int:
        """Characters of the response not in ``response``."""
        if self.response is None or self.response_chars is None:
            return 0
        return max(0, self.response_chars - len(self.response))


def cut(text: str) -> str:
    """``text`` cut to ``MAX_SHOWN_CHARS`` characters, saying how long it was."""
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}… ({len(text)} characters)"


# -- JSON-able summaries of sample values (for metadata and the other fields) -------------------------------


def jsonable(v: Any, depth: int = 0) -> Any:
    if depth > 20:
        return "..."
    if isinstance(v, str):
        return cut(v)
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, Mapping):
        out = {cut(str(k)): jsonable(x, depth + 1) for k, x in itertools.islice(v.items(), MAX_SHOWN_TURNS)}
        if len(v) > MAX_SHOWN_TURNS:
            out["…"] = f"{len(v) - MAX_SHOWN_TURNS} more keys"
        return out
    if isinstance(v, (list, tuple)):
        if len(v) > 32 and all(isinstance(x, (int, float)) for x in v):
            return f"[{len(v)} numbers: {', '.join(num(x) for x in v[:6])}, ...]"
        items = [jsonable(x, depth + 1) for x in v[:MAX_SHOWN_TURNS]]
        if len(v) > MAX_SHOWN_TURNS:
            items.append(f"… {len(v) - MAX_SHOWN_TURNS} more items")
        return items
    if isinstance(v, MediaRef):
        return f"{MEDIA_DIR}/{v.filename}"
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    if isinstance(v, np.generic):
        return jsonable(v.item(), depth)
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        kind = "tensor" if type(v).__module__.startswith("torch") else "ndarray"
        try:
            shape: Any = [int(d) for d in v.shape]
        except (TypeError, ValueError):
            shape = "?"
        return f"<{kind} {str(v.dtype).removeprefix('torch.')} {shape}>"
    return short_repr(v)


def short_repr(v: Any) -> str:
    try:
        text = repr(v)
    except Exception as e:  # a foreign object's __repr__ is not ours to trust
        text = f"<{type(v).__name__}: repr failed: {type(e).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."


def _empty(v: Any) -> bool:
    """None or an empty list/dict/tuple; never asks an array for its truth value."""
    return v is None or (isinstance(v, (list, tuple, dict, str)) and len(v) == 0)


def as_list(v: Any) -> list[Any] | None:
    """A list, tuple, numpy array or tensor as a Python list (None for anything else)."""
    if isinstance(v, (list, tuple)):
        return list(v)
    tolist = getattr(v, "tolist", None)
    if callable(tolist) and hasattr(v, "shape"):
        try:
            out = tolist()
        except Exception:  # a tensor on a device, a foreign array type: not shown as a list
            return None
        return out if isinstance(out, list) else None
    return None


# -- reading a sample down to what the page shows ---------------------------------------------------------


def _status(v: Any) -> str | None:
    if v is None:
        return None
    return str(getattr(v, "value", v))


def _grid_rows(sample: Mapping[str, Any]) -> list[list[int] | None] | None:
    mti = sample.get("multimodal_train_inputs")
    if not isinstance(mti, Mapping):
        return None
    rows = as_list(mti.get("image_grid_thw"))
    if not rows:
        return None
    out: list[list[int] | None] = []
    for row in rows:
        r = as_list(row)
        # A legal sample may hold anything here (strings, inf, negative): such a row has no count.
        if r is None or len(r) != 3 or not all(_grid_int(x) for x in r):
            out.append(None)
        else:
            out.append([int(x) for x in r])
    return out


def _grid_int(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return 0 <= x < 2**31
    return isinstance(x, float) and math.isfinite(x) and x.is_integer() and 0 <= x < 2**31


def stored_media(bundle: Bundle) -> dict[str, str]:
    """Where a bundle's samples name its stored files, mapped to each file's stored name: the
    ``media`` of :func:`sample_view`. A directory's and a packed file's are under the bundle
    (``<bundle>/media/<hex>.png``), a pooled store bundle's in its parent's pool
    (``<parent>/.media/<hex>.png``): they are the bundle's media all the same."""
    return {str(ref.path): ref.filename for ref in bundle.media if ref.path is not None}


def _stored_name(value: Any, media: str | Mapping[str, str]) -> str | None:
    if not isinstance(value, str):
        return None
    if isinstance(media, str):
        return value[len(media) :] if value.startswith(media) else None
    return media.get(value)


def _images(sample: Mapping[str, Any], media: str | Mapping[str, str]) -> tuple[list[Image], int]:
    """The first ``MAX_SHOWN_TURNS`` screenshots of ``sample`` (each named by its stored file,
    or saying why it is not one of the bundle's), and how many the sample has."""
    mm = sample.get("multimodal_inputs")
    raw_images = mm.get("images") if isinstance(mm, Mapping) else None
    items = as_list(raw_images)
    if items is None:
        items = [] if _empty(raw_images) else [raw_images]
    grids = _grid_rows(sample) or []
    images: list[Image] = []
    for j, img in enumerate(items[:MAX_SHOWN_TURNS]):
        name: str | None
        if isinstance(img, MediaRef):
            name = img.filename
            shown = f"{MEDIA_DIR}/{img.filename}"
        elif (
            name := _stored_name(img, media) or _stored_name(getattr(img, "filename", None), media)
        ) is not None:
            # A path string, or a PIL image read from the bundle (opened on the stored PNG).
            shown = f"{MEDIA_DIR}/{name}"
        else:
            name, shown = (
                None,
                f"not stored in the bundle: {short_repr(img) if not isinstance(img, str) else img[:200]}",
            )
        images.append(Image(name, shown, grids[j] if j < len(grids) else None))
    return images, len(items)


def _screen(metadata: Any) -> tuple[float, float] | None:
    """``metadata.screen`` (``[w, h]``, the space of the actions' coordinates) when it is two
    positive finite numbers."""
    screen = as_list(metadata.get("screen") if isinstance(metadata, Mapping) else None)
    if screen is not None and len(screen) == 2:
        w, h = finite(screen[0]), finite(screen[1])
        if w and h and w > 0 and h > 0:
            return (w, h)
    return None


def sample_view(position: int, sample: Mapping[str, Any], media: str | Mapping[str, str]) -> SampleView:
    """What a page shows of ``sample`` (at ``position`` in its bundle). ``media`` tells which
    strings name the bundle's stored files: :func:`stored_media` of the bundle (or, as before, the
    prefix ``"<bundle>/media/"``, which misses a pooled store bundle's media)."""
    images, turns = _images(sample, media)
    metadata = sample.get("metadata")
    actions = metadata.get("actions") if isinstance(metadata, Mapping) else None
    tokens = as_list(sample.get("tokens"))
    mask = as_list(sample.get("loss_mask"))
    logprobs = as_list(sample.get("rollout_log_probs"))
    numbers = [finite(x) for x in logprobs] if logprobs is not None else None
    known = [x for x in numbers or [] if x is not None]
    response = sample.get("response")
    response_text = (
        None
        if response is None
        else response
        if isinstance(response, str)
        else json.dumps(jsonable(response), ensure_ascii=False, indent=2)
    )
    return SampleView(
        position=position,
        index=jsonable(sample.get("index")),
        group_index=jsonable(sample.get("group_index")),
        status=_status(sample.get("status")),
        reward=jsonable(sample.get("reward")),
        tokens=len(tokens) if tokens is not None else None,
        response_length=jsonable(sample.get("response_length")),
        loss_mask=f"{sum(1 for x in mask if x is True or (isinstance(x, (int, float)) and x != 0))}/{len(mask)}"
        if mask is not None
        else None,
        logprob_mean=sum(known) / len(known) if known else None,
        prompt=jsonable(sample.get("prompt")),
        response=None if response_text is None else response_text[:MAX_SHOWN_CHARS],
        images=images,
        actions=[cut(a) if isinstance(a, str) else short_repr(a) for a in actions[:MAX_SHOWN_TURNS]]
        if isinstance(actions, (list, tuple))
        else None,
        metadata=None if _empty(metadata) else jsonable(metadata),
        other={cut(str(k)): jsonable(v) for k, v in sample.items() if k not in _SHOWN_KEYS and not _empty(v)},
        logprobs=numbers,
        screen=_screen(metadata),
        tool_calls=tool_calls(response) if isinstance(response, str) else [],  # reads MAX_SHOWN_CHARS at most
        turns=turns,
        response_chars=None if response_text is None else len(response_text),
    )
