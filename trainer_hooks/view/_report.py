"""One self-contained HTML page for a bundle: :func:`write_html_report`.

The page is a single file a person can mail or attach to a bug: the stylesheet is inlined, the
screenshots are small JPEG thumbnails inlined as ``data:`` URIs, and a Content-Security-Policy
forbids scripts and every network fetch, so opening it never reaches anything.

Each stored screenshot is inlined once, as an SVG ``<image>`` in one hidden ``<defs>``, and every
turn that shows it draws it with ``<use href="#m7">``: a trajectory's samples often repeat the
same screenshots (a dump with one sample per turn and all earlier turns' images repeats each one
several times), and inlining per occurrence made a 600-screenshot dump a 32 MiB page instead of
about 8. No script is needed for that, so the page still runs none. Every string that
comes from the bundle (prompts, responses, actions, metadata, even file names) is untrusted and
goes through :func:`html.escape`.

A thumbnail links to the full-size image by a relative path when the bundle is a directory, so
the link works while the bundle sits where it was next to the report (move them together). A
packed bundle has no files to link to; its thumbnails are all there is.

Samples are read one shard at a time and reduced to what the page shows before the next is read,
so a dump that holds processor tensors does not have to fit in memory. Thumbnails are made once
per stored image (a screenshot shared by several samples is encoded once), in a few threads.

With a replay report (``rollout-bundle replay --report``), each sample also shows its guard and
token-check problems, per-image vision and placeholder token counts and the rebuilt tensors'
shapes, and the log-prob differences when the report has them.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import bundles
from bundles import Bundle, BundleError, BundleIOError, BundleVerificationError, MediaRef, open_bundle
from bundles.support import MANIFEST_NAME, MEDIA_DIR, human_bytes
from trainer_hooks.replay import REPORT_FORMAT as REPLAY_FORMAT
from trainer_hooks.replay import ReportError, check_replay_report, load_replay_report
from trainer_hooks.view._media import Shown, pictures, shown_suffix
from trainer_hooks.view._style import CSS

__all__ = [
    "REPLAY_FORMAT",
    "THUMB_WIDTH",
    "ReportError",
    "ReportWritten",
    "load_replay_report",
    "write_html_report",
]

THUMB_WIDTH = 400  # px; a 1080p screenshot becomes a ~15-25 KB JPEG
INDEX_OPEN_MAX = 60  # samples listed unfolded in the index table
MAX_TEXT = 20_000  # characters of a prompt or response shown before the rest is cut
DEFAULT_MERGE_SIZE = 2  # Qwen2-VL: 2x2 patches make one vision token
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
_SHOWN_KEYS = {
    "index", "group_index", "status", "reward", "tokens", "response", "response_length", "prompt",
    "multimodal_inputs", "metadata", "loss_mask", "rollout_log_probs",
}  # fmt: skip


@dataclass(frozen=True)
class ReportWritten:
    path: Path
    samples: int  # samples shown
    images: int  # thumbnails shown (occurrences)
    bytes: int  # size of the HTML file
    not_shown: list[str] = field(default_factory=list)  # one line per stored file that cannot be shown
    missing: list[str] = field(default_factory=list)  # media files listed in the manifest but missing


@dataclass
class _Image:
    name: str | None  # <hex><suffix> inside the bundle, or None when the sample names a file outside it
    shown_as: str  # what the caption says when there is no picture
    grid: list[int] | None = None  # (t, h, w) from multimodal_train_inputs.image_grid_thw


@dataclass
class _SampleView:
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
    images: list[_Image]
    actions: list[str] | None
    metadata: Any
    other: dict[str, Any] = field(default_factory=dict)


# -- JSON-able summaries of sample values (for metadata and the other fields) -------------------------------


def _jsonable(v: Any, depth: int = 0) -> Any:
    if depth > 20:
        return "..."
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        if len(v) > 32 and all(isinstance(x, (int, float)) for x in v):
            return f"[{len(v)} numbers: {', '.join(_num(x) for x in v[:6])}, ...]"
        return [_jsonable(x, depth + 1) for x in v]
    if isinstance(v, MediaRef):
        return f"{MEDIA_DIR}/{v.filename}"
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    if isinstance(v, np.generic):
        return _jsonable(v.item(), depth)
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        kind = "tensor" if type(v).__module__.startswith("torch") else "ndarray"
        try:
            shape = [int(d) for d in v.shape]
        except (TypeError, ValueError):
            shape = "?"
        return f"<{kind} {str(v.dtype).removeprefix('torch.')} {shape}>"
    return _short_repr(v)


def _short_repr(v: Any) -> str:
    try:
        text = repr(v)
    except Exception as e:  # a foreign object's __repr__ is not ours to trust
        text = f"<{type(v).__name__}: repr failed: {type(e).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."


def _empty(v: Any) -> bool:
    """None or an empty list/dict/tuple; never asks an array for its truth value."""
    return v is None or (isinstance(v, (list, tuple, dict, str)) and len(v) == 0)


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    text = str(x)
    return text if len(text) <= 40 else text[:20] + "…" + f" ({len(text)} digits)"


def _size(n: Any) -> str:
    """A byte count from a report or a manifest as ``1.5 MiB``; any other value as text."""
    if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**80:
        return human_bytes(n)
    return f"{_num(n)} bytes"


def _ratio(a: Any, b: Any) -> str | None:
    try:
        r = float(a) / float(b)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return f"{r:.2f}×" if math.isfinite(r) else None


def _as_list(v: Any) -> list[Any] | None:
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
    rows = _as_list(mti.get("image_grid_thw"))
    if not rows:
        return None
    out = []
    for r in rows:
        r = _as_list(r)
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


def _view(position: int, sample: Mapping[str, Any], media_prefix: str) -> _SampleView:
    mm = sample.get("multimodal_inputs")
    raw_images = (mm.get("images") if isinstance(mm, Mapping) else None) or []
    grids = _grid_rows(sample) or []
    images: list[_Image] = []
    for j, img in enumerate(raw_images if isinstance(raw_images, (list, tuple)) else [raw_images]):
        if isinstance(img, MediaRef):
            name: str | None = img.filename
            shown = f"{MEDIA_DIR}/{img.filename}"
        elif isinstance(img, str) and img.startswith(media_prefix):
            name = img[len(media_prefix) :]
            shown = f"{MEDIA_DIR}/{name}"
        elif isinstance(getattr(img, "filename", None), str) and img.filename.startswith(media_prefix):
            # A PIL image read from the bundle: opened on the stored PNG.
            name = img.filename[len(media_prefix) :]
            shown = f"{MEDIA_DIR}/{name}"
        else:
            name, shown = (
                None,
                f"not stored in the bundle: {_short_repr(img) if not isinstance(img, str) else img[:200]}",
            )
        images.append(_Image(name, shown, grids[j] if j < len(grids) else None))
    metadata = sample.get("metadata")
    actions = metadata.get("actions") if isinstance(metadata, Mapping) else None
    tokens = _as_list(sample.get("tokens"))
    mask = _as_list(sample.get("loss_mask"))
    logprobs = _as_list(sample.get("rollout_log_probs"))
    finite = [float(x) for x in logprobs or [] if isinstance(x, (int, float)) and math.isfinite(float(x))]
    response = sample.get("response")
    return _SampleView(
        position=position,
        index=_jsonable(sample.get("index")),
        group_index=_jsonable(sample.get("group_index")),
        status=_status(sample.get("status")),
        reward=_jsonable(sample.get("reward")),
        tokens=len(tokens) if tokens is not None else None,
        response_length=_jsonable(sample.get("response_length")),
        loss_mask=f"{sum(1 for x in mask if x is True or (isinstance(x, (int, float)) and x != 0))}/{len(mask)}"
        if mask is not None
        else None,
        logprob_mean=sum(finite) / len(finite) if finite else None,
        prompt=_jsonable(sample.get("prompt")),
        response=None
        if response is None
        else response
        if isinstance(response, str)
        else _pretty(_jsonable(response)),
        images=images,
        actions=[str(a) for a in actions] if isinstance(actions, (list, tuple)) else None,
        metadata=None if _empty(metadata) else _jsonable(metadata),
        other={str(k): _jsonable(v) for k, v in sample.items() if k not in _SHOWN_KEYS and not _empty(v)},
    )


# -- HTML ------------------------------------------------------------------------------------------------


def e(v: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape(str(v), quote=True)


def _compact(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, sort_keys=True, default=str)


def _pretty(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, indent=2, default=str)


def _text(s: str) -> str:
    if len(s) <= MAX_TEXT:
        return e(s)
    return e(s[:MAX_TEXT]) + f'\n<span class="muted">… {len(s) - MAX_TEXT} more characters</span>'


_STATUS_CLASS = {
    "completed": "ok",
    "truncated": "warn",
    "aborted": "warn",
    "failed": "bad",
    "pending": "info",
}


def _badge(status: str | None) -> str:
    if status is None:
        return '<span class="badge">no status</span>'
    return f'<span class="badge {_STATUS_CLASS.get(status.lower(), "")}">{e(status)}</span>'


def _reward(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else _compact(v)


def _chips(d: Any) -> str:
    """A small mapping as ``key value`` chips (nested values as compact JSON)."""
    if not isinstance(d, Mapping) or not d:
        return f"<code>{e(_compact(d))}</code>"
    cells = []
    for k, v in d.items():
        shown = v if isinstance(v, str) else _compact(v)
        cells.append(f'<span class="chip"><span class="k">{e(k)}</span>{e(shown)}</span>')
    return f'<span class="chips">{"".join(cells)}</span>'


def _stat(value: str, label: str) -> str:
    return f'<div class="card stat"><div class="v">{value}</div><div class="k">{label}</div></div>'


def _facts(rows: Iterable[tuple[str, Any]]) -> str:
    cells = "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<dl class="card facts">{cells}</dl>'


def _bundle_bytes(bundle: Bundle) -> int:
    if bundle.packed:
        return bundle.path.stat().st_size
    shards = sum(int(s["size"]) for s in bundle.manifest["shards"])
    try:
        manifest = (bundle.path / MANIFEST_NAME).stat().st_size
    except OSError:
        manifest = 0
    return manifest + shards + bundle.media_bytes


def _header(bundle: Bundle, views: list[_SampleView], shown_images: int, distinct: int,
            replay: dict[str, Any] | None, replay_name: str | None) -> str:  # fmt: skip
    meta = bundle.meta
    refs, stored = bundle.media_references, len(bundle.media)
    statuses = Counter(v.status or "no status" for v in views)
    rewards = [
        v.reward for v in views if isinstance(v.reward, (int, float)) and not isinstance(v.reward, bool)
    ]
    out = ['<header class="top">', f'<div class="eyebrow">{e(bundle.kind)}</div>', f"<h1>{e(bundle.path.name)}</h1>",
           f'<div class="path">{e(bundle.path)}</div>', '<div class="stats">']  # fmt: skip
    out.append(
        _stat(
            f"{len(views)}<span class='muted' style='font-size:14px'> / {len(bundle)}</span>", "samples shown"
        )
    )
    out.append(_stat(str(stored), "media files stored"))
    out.append(_stat(str(refs), "media references"))
    out.append(_stat(f"{refs / stored:.2f}×" if stored else "–", "dedup ratio"))
    out.append(_stat(human_bytes(bundle.media_bytes), "media"))
    out.append(
        _stat(human_bytes(_bundle_bytes(bundle)), "packed file" if bundle.packed else "bundle on disk")
    )
    finite = [float(r) for r in rewards if abs(r) < 1e300 and math.isfinite(float(r))]
    if finite:
        out.append(_stat(f"{math.fsum(finite) / len(finite):.3g}", "mean reward"))
    out.append(_stat(str(shown_images), f"screenshots shown, {distinct} distinct"))
    out.append("</div>")
    processor = meta.get("processor")
    rows: list[tuple[str, Any]] = [
        ("run", e(meta.get("run_uuid", "–"))),
        ("rollout id", e(meta.get("rollout_id", "–"))),
        ("training dtype", e(meta.get("training_dtype", "–"))),
        ("processor", _chips(processor) if processor else '<span class="muted">not recorded</span>'),
        ("statuses", " ".join(f"{_badge(s)} {n}" for s, n in sorted(statuses.items()))),
        (
            "format",
            e(f"format_version {bundle.manifest.get('format_version')}, {bundle.manifest.get('created_by')}"),
        ),
    ]
    if meta.get("metadata"):
        rows.append(("metadata", _chips(meta["metadata"])))
    extra = {
        k: v
        for k, v in meta.items()
        if k not in ("run_uuid", "rollout_id", "training_dtype", "processor", "metadata")
    }
    if extra:
        rows.append(("other meta", _chips(extra)))
    out.append(_facts(rows))
    if replay is not None:
        out.append(_replay_summary(replay, replay_name or "replay report"))
    out.append("</header>")
    return "".join(out)


def _replay_summary(replay: dict[str, Any], name: str) -> str:
    s = replay.get("summary") or {}
    problems = s.get("problems") or {}
    before, after = s.get("bytes_before_cast"), s.get("bytes_after_cast")
    cast = "–"
    if before is not None or after is not None:
        ratio = _ratio(after, before)
        cast = f"{_size(before)} → {_size(after)}" + (f" ({ratio})" if ratio else "")
    proc = replay.get("processor") or {}
    rows: list[tuple[str, Any]] = [
        ("report", e(name)),
        ("replayed bundle", e(replay.get("bundle", "–"))),
        ("dtype", e(replay.get("dtype", "–"))),
        ("processor", _chips(proc)),
        ("samples / images", e(f"{s.get('samples', '–')} / {s.get('images', '–')}")),
        ("vision tokens", e(s.get("vision_tokens", "–"))),
        ("tensor bytes", e(cast)),
        ("peak RSS", e(_size(s["peak_rss_bytes"])) if s.get("peak_rss_bytes") is not None else "–"),
        ("problems", " ".join(f'<span class="badge bad">{e(k)} {e(n)}</span>' for k, n in problems.items())
         or '<span class="badge ok">none</span>'),
    ]  # fmt: skip
    return "<h3>Replay</h3>" + _facts(rows)


def _index_table(views: list[_SampleView], replay_by_pos: dict[int, dict[str, Any]] | None) -> str:
    head = ("<tr><th class='num'>#</th><th class='num'>index</th><th class='num'>group</th><th>status</th>"
            "<th class='num'>reward</th><th class='num'>tokens</th><th class='num'>response</th>"
            "<th class='num'>images</th>" + ("<th class='num'>problems</th>" if replay_by_pos is not None else "")
            + "</tr>")  # fmt: skip
    rows = []
    for v in views:
        cells = [
            f"<td class='num'><a href='#s{v.position}'>{v.position}</a></td>",
            f"<td class='num'>{e(_dash(v.index))}</td>",
            f"<td class='num'>{e(_dash(v.group_index))}</td>",
            f"<td>{_badge(v.status)}</td>",
            f"<td class='num'>{e(_reward(v.reward))}</td>",
            f"<td class='num'>{e(_dash(v.tokens))}</td>",
            f"<td class='num'>{e(_dash(v.response_length))}</td>",
            f"<td class='num'>{len(v.images)}</td>",
        ]
        if replay_by_pos is not None:
            entry = replay_by_pos.get(v.position)
            n = len(entry.get("problems") or []) if entry else None
            cells.append(
                "<td class='num'>"
                + ("<span class='muted'>not replayed</span>" if n is None else
                   f"<span class='badge {'bad' if n else 'ok'}'>{n}</span>")
                + "</td>"
            )  # fmt: skip
        rows.append("<tr>" + "".join(cells) + "</tr>")
    table = f'<table class="index"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    # A long index starts folded, so the samples themselves are a scroll away, not a page of rows.
    if len(views) <= INDEX_OPEN_MAX:
        return f'<div class="card section">{table}</div>'
    return f'<div class="card section"><details><summary>all {len(views)} samples</summary>{table}</details></div>'


def _dash(v: Any) -> str:
    return "–" if v is None else str(v)


def _prompt(prompt: Any) -> str:
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return f'<h3>Prompt</h3><pre class="text">{_text(prompt)}</pre>'
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        parts = []
        for m in prompt:
            content = m.get("content")
            if isinstance(content, list):
                text = "\n".join(
                    str(c.get("text", "")) if isinstance(c, dict) and c.get("type") == "text" else
                    f"[{c.get('type', 'part')}]" if isinstance(c, dict) else str(c)
                    for c in content
                )  # fmt: skip
            else:
                text = "" if content is None else str(content)
            parts.append(
                f'<div class="msg"><div class="role">{e(m["role"])}</div><pre class="text">{_text(text)}</pre></div>'
            )
        return "<h3>Prompt</h3>" + "".join(parts)
    return f'<h3>Prompt</h3><pre class="text">{_text(_pretty(prompt))}</pre>'


def _turns(v: _SampleView, thumbs: dict[str, Shown], refs: dict[str, str], link_base: str | None, merge: int,
           replay_images: dict[int, dict[str, Any]]) -> str:  # fmt: skip
    if not v.images:
        return ""
    items = []
    for j, img in enumerate(v.images):
        thumb = thumbs.get(img.name) if img.name else None
        if thumb is not None and thumb.thumb is not None and img.name in refs:
            tw, th = thumb.thumb.width, thumb.thumb.height
            picture = (
                f'<svg class="thumb" viewBox="0 0 {tw} {th}" width="{tw}" height="{th}" role="img" '
                f'aria-label="turn {j}"><use href="#{refs[img.name]}"/></svg>'
            )
            # Only a stored .png/.jpg/.jpeg that decoded is a link target: a browser renders a
            # linked file by its suffix, and .html/.svg/... would run outside this page's CSP.
            if link_base is not None and img.name and thumb.linkable and shown_suffix(img.name):
                href = link_base + urllib.parse.quote(img.name)
                picture = f'<a class="shot" href="{e(href)}" title="open the full-size image">{picture}</a>'
            else:
                picture = f'<span class="shot">{picture}</span>'
        else:
            why = thumb.error if thumb is not None and thumb.error else img.shown_as
            picture = f'<div class="noimg">{e(why)}</div>'
        cap = [f'<span class="t">turn {j}</span>']
        if thumb is not None and thumb.size:
            cap.append(f'<span class="muted"> · {thumb.size[0]}×{thumb.size[1]}</span>')
        cap.append(_vision_tokens(img, merge, replay_images.get(j)))
        if v.actions is not None and j < len(v.actions):
            cap.append(f'<code class="action">{e(v.actions[j])}</code>')
        if img.name:
            cap.append(f'<span class="muted mono" style="display:block;font-size:11px" title="{e(img.shown_as)}">'
                       f"{e(img.name[:16])}…</span>")  # fmt: skip
        items.append(f'<li class="turn">{picture}<div class="cap">{"".join(cap)}</div></li>')
    return f'<h3>Turns ({len(v.images)} screenshots)</h3><ol class="turns">{"".join(items)}</ol>'


def _vision_tokens(img: _Image, merge: int, replayed: dict[str, Any] | None) -> str:
    if replayed is not None and isinstance(replayed.get("vision_tokens"), int):
        vt = replayed["vision_tokens"]
        ph = replayed.get("placeholder_tokens")
        if isinstance(ph, int) and ph != vt:
            out = f'<span class="mismatch"> · {vt} vision tokens ≠ {e(ph)} placeholders</span>'
        else:
            out = f" · {vt} vision tokens" + (" = placeholders" if isinstance(ph, int) else "")
        pv = replayed.get("pixel_values")
        if isinstance(pv, dict) and pv.get("shape") is not None:
            out += f'<span class="sub">pixel_values {e(pv.get("dtype", ""))} {e(pv.get("shape"))}</span>'
        return out
    if img.grid is not None and merge > 0:
        t, h, w = img.grid
        return f'<span title="from image_grid_thw {e(img.grid)} / merge {merge}²"> · ≈{t * h * w // (merge * merge)} vision tokens</span>'
    return ""


def _sample(v: _SampleView, thumbs: dict[str, Shown], refs: dict[str, str], link_base: str | None, merge: int,
            replayed: dict[str, Any] | None, replay_given: bool) -> str:  # fmt: skip
    head = [
        f'<span class="pos">#{v.position}</span>',
        f'<span class="kv">index <b>{e(_dash(v.index))}</b></span>',
        f'<span class="kv">group <b>{e(_dash(v.group_index))}</b></span>',
        _badge(v.status),
        f'<span class="kv">reward <b>{e(_reward(v.reward))}</b></span>',
        f'<span class="kv">tokens <b>{e(_dash(v.tokens))}</b></span>',
        f'<span class="kv">response <b>{e(_dash(v.response_length))}</b></span>',
    ]
    if v.loss_mask is not None:
        head.append(f'<span class="kv">loss mask <b>{e(v.loss_mask)}</b></span>')
    if v.logprob_mean is not None:
        head.append(f'<span class="kv">mean log-prob <b>{v.logprob_mean:.4g}</b></span>')
    body = []
    replay_images: dict[int, dict[str, Any]] = {}
    if replayed is not None:
        for im in replayed.get("images") or []:
            if isinstance(im, dict) and isinstance(im.get("image"), int):
                replay_images[im["image"]] = im
        body.append(_replay_block(replayed))
    elif replay_given:
        body.append('<p class="muted">not in the replay report</p>')
    body.append(_prompt(v.prompt))
    body.append(_turns(v, thumbs, refs, link_base, merge, replay_images))
    if v.response:  # a pending sample has none yet
        body.append(f'<h3>Response</h3><pre class="text">{_text(v.response)}</pre>')
    if v.metadata:
        body.append(
            f'<details><summary>metadata</summary><pre class="text">{_text(_pretty(v.metadata))}</pre></details>'
        )
    if v.other:
        body.append(f'<details><summary>other fields ({len(v.other)})</summary>'
                    f'<pre class="text">{_text(_pretty(v.other))}</pre></details>')  # fmt: skip
    return (f'<section class="card sample" id="s{v.position}"><div class="sample-head">{"".join(head)}</div>'
            f'<div class="sample-body">{"".join(body)}</div></section>')  # fmt: skip


def _replay_block(r: dict[str, Any]) -> str:
    out = ["<h3>Replay</h3>"]
    problems = [p for p in r.get("problems") or [] if isinstance(p, dict)]
    if problems:
        items = []
        for p in problems:
            where = f" (image {p['image']})" if p.get("image") is not None else ""
            items.append(
                f'<li><span class="kind">{e(p.get("kind", "problem"))}</span>{e(p.get("message", ""))}{e(where)}</li>'
            )
        out.append(f'<ul class="problems">{"".join(items)}</ul>')
    else:
        out.append('<span class="badge ok">guard and token checks passed</span> ')
    diff = r.get("logprob_diff")
    if isinstance(diff, dict):
        out.append(
            '<span class="kv">log-prob difference: max <b>{}</b> · mean <b>{}</b> over <b>{}</b> tokens</span>'.format(
                e(_num(diff.get("max_abs"))), e(_num(diff.get("mean_abs"))), e(diff.get("tokens"))
            )
        )
    else:
        out.append('<span class="muted">no log-prob comparison (needs a scoring engine)</span>')
    return "".join(out)


# -- the entry point -----------------------------------------------------------------------------------------


def _merge_size(bundle: Bundle, replay: dict[str, Any] | None) -> int:
    for source in ((replay or {}).get("processor"), (bundle.meta.get("processor") or {}).get("mm_process_config")
                   if isinstance(bundle.meta.get("processor"), dict) else None):  # fmt: skip
        if (
            isinstance(source, dict)
            and isinstance(source.get("merge_size"), int)
            and source["merge_size"] > 0
        ):
            return int(source["merge_size"])
    return DEFAULT_MERGE_SIZE


def _open(path: str | os.PathLike[str]) -> tuple[Bundle, list[str]]:
    """Open the bundle for viewing; media files listed but missing are returned, not refused.

    A page is still useful when a few screenshots are gone (a copy that lost a file, a partial
    download): those turns show a placeholder naming the file. Any other problem (a shard
    missing or damaged, a size that disagrees) refuses the bundle as ``open_bundle`` does.
    """
    try:
        return open_bundle(path, verify="fast"), []
    except BundleVerificationError as e:
        missing = [
            p
            for p in e.problems
            if f"/{MEDIA_DIR}/" in p and p.endswith(": listed in the manifest but missing")
        ]
        if len(missing) != len(e.problems):
            raise
    return open_bundle(path, verify="none"), missing


def _write(out: Path, data: bytes) -> None:
    """Replace ``out`` with ``data`` atomically (a temporary file beside it, then a rename)."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        # Name the file the user asked for, never the temporary one.
        raise BundleIOError.wrap(out, "write the report", OSError(err.errno, err.strerror)) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_html_report(
    bundle: Bundle | str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    replay: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    limit: int | None = None,
    samples: Sequence[int] | None = None,
    thumb_width: int = THUMB_WIDTH,
    progress: bool | None = None,
) -> ReportWritten:
    """Write one self-contained HTML page describing ``bundle`` to ``output`` (atomically).

    Args:
        bundle: an open bundle, or the path of a bundle directory or packed file.
        output: the HTML file to write; its directory must exist.
        replay: a replay report (``rollout-bundle replay --report``), as a dict or a JSON path.
        limit: show at most this many samples (after ``samples``); at least 1, None for all.
        samples: positions of the samples to show, in this order (default: all, in order).
        thumb_width: thumbnail width in pixels.
        progress: draw a progress line while making thumbnails (default: on a terminal).

    Raises:
        BundleError: the bundle cannot be read, a position is out of range, or the replay report
            is not one (:class:`ReportError`).
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise BundleError(f"limit must be at least 1; omit it for every sample (found {limit!r})")
    out = Path(os.path.abspath(output))
    if out.is_dir():
        raise BundleError(f"{out}: is a directory; name the file to write")
    if not out.parent.is_dir():
        raise BundleError(f"{output}: directory {out.parent} does not exist")
    b, missing = (bundle, []) if isinstance(bundle, Bundle) else _open(bundle)
    report: dict[str, Any] | None
    replay_name: str | None = None
    if replay is None:
        report = None
    elif isinstance(replay, Mapping):
        report = dict(replay)
        check_replay_report(report, "replay report")
    else:
        report = load_replay_report(replay)
        replay_name = str(replay)
    n = len(b)
    positions = list(range(n)) if samples is None else [int(i) for i in samples]
    for i in positions:
        if not 0 <= i < n:
            raise bundles.BundleIndexError(
                f"{b.path}: sample {i} is out of range: the bundle holds {n} (0..{n - 1})"
            )
    if limit is not None:
        positions = positions[:limit]

    prefix = f"{b.path}/{MEDIA_DIR}/"
    views = [_view(p, s, prefix) for p, s in zip(positions, b.samples(indices=positions), strict=True)]
    names = list(dict.fromkeys(img.name for v in views for img in v.images if img.name))
    thumbs = pictures(b, names, thumb_width=thumb_width, progress=progress)
    link_base = None  # a packed bundle has no files to link to
    if not b.packed:
        rel = os.path.relpath(b.path / MEDIA_DIR, out.parent)
        link_base = "/".join(urllib.parse.quote(part) for part in Path(rel).parts) + "/"
    merge = _merge_size(b, report)
    by_pos = {s["position"]: s for s in report["samples"]} if report is not None else None

    defs: list[str] = []
    refs: dict[str, str] = {}
    for name in names:
        t = thumbs[name].thumb
        if t is not None:
            refs[name] = f"m{len(defs)}"
            defs.append(f'<image id="{refs[name]}" width="{t.width}" height="{t.height}" href="{t.uri}"/>')
    shown_images = sum(1 for v in views for img in v.images if img.name in refs)
    parts = [
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">",
        "<meta name='referrer' content='no-referrer'>",
        f"<title>{e(b.kind)} · {e(b.path.name)}</title><style>{CSS}</style></head><body><div class='wrap'>",
        _header(b, views, shown_images, len(defs), report, replay_name),
        "<h3>Samples</h3>",
        _index_table(views, by_pos),
    ]
    for v in views:
        parts.append(_sample(v, thumbs, refs, link_base, merge, by_pos.get(v.position) if by_pos is not None else None,
                             by_pos is not None))  # fmt: skip
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(
        f"<footer>rollout-bundles {e(bundles.__version__)} · rollout-bundle view · {e(stamp)}</footer>"
    )
    parts.append("</div>")
    parts.append(
        f'<svg class="defs" width="0" height="0" aria-hidden="true"><defs>{"".join(defs)}</defs></svg>'
    )
    parts.append("</body></html>\n")
    data = "".join(parts).encode("utf-8")
    _write(out, data)
    not_shown = [t.error for name in names if (t := thumbs[name]).error]
    return ReportWritten(out, len(views), shown_images, len(data), not_shown, missing)
