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

import base64
import datetime
import html
import io
import json
import math
import os
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import bundles
from bundles import Bundle, BundleError, MediaRef, open_bundle
from bundles.support import MANIFEST_NAME, MEDIA_DIR, human_bytes
from trainer_hooks.replay import REPORT_FORMAT as REPLAY_FORMAT
from trainer_hooks.replay import ReportError, check_replay_report, load_replay_report
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
THUMB_QUALITY = 72
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


@dataclass
class _Thumb:
    ref: str | None = None  # the id of its <image> in the page's <defs>, once it has a uri
    uri: str | None = None
    size: tuple[int, int] | None = None  # the original's width and height
    thumb: tuple[int, int] | None = None
    error: str | None = None


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
        return f"<{kind} {str(v.dtype).removeprefix('torch.')} {list(v.shape)}>"
    return repr(v)


def _num(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _as_list(v: Any) -> list[Any] | None:
    """A list, tuple, numpy array or tensor as a Python list (None for anything else)."""
    if isinstance(v, (list, tuple)):
        return list(v)
    tolist = getattr(v, "tolist", None)
    if callable(tolist) and hasattr(v, "shape"):
        out = tolist()
        return out if isinstance(out, list) else None
    return None


# -- reading a sample down to what the page shows ---------------------------------------------------------


def _status(v: Any) -> str | None:
    if v is None:
        return None
    return str(getattr(v, "value", v))


def _grid_rows(sample: Mapping[str, Any]) -> list[list[int]] | None:
    mti = sample.get("multimodal_train_inputs")
    if not isinstance(mti, Mapping):
        return None
    rows = _as_list(mti.get("image_grid_thw"))
    if not rows or not all(isinstance(r, list) and len(r) == 3 for r in rows):
        return None
    return [[int(x) for x in r] for r in rows]


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
            name, shown = None, f"not stored in the bundle: {str(img)[:200]}"
        images.append(_Image(name, shown, grids[j] if j < len(grids) else None))
    metadata = sample.get("metadata")
    actions = metadata.get("actions") if isinstance(metadata, Mapping) else None
    tokens = _as_list(sample.get("tokens"))
    mask = _as_list(sample.get("loss_mask"))
    logprobs = _as_list(sample.get("rollout_log_probs"))
    finite = [float(x) for x in logprobs or [] if isinstance(x, (int, float)) and math.isfinite(x)]
    response = sample.get("response")
    return _SampleView(
        position=position,
        index=sample.get("index"),
        group_index=sample.get("group_index"),
        status=_status(sample.get("status")),
        reward=_jsonable(sample.get("reward")),
        tokens=len(tokens) if tokens is not None else None,
        response_length=sample.get("response_length"),
        loss_mask=f"{sum(1 for x in mask if x)}/{len(mask)}" if mask is not None else None,
        logprob_mean=sum(finite) / len(finite) if finite else None,
        prompt=_jsonable(sample.get("prompt")),
        response=None if response is None else str(response),
        images=images,
        actions=[str(a) for a in actions] if isinstance(actions, (list, tuple)) else None,
        metadata=_jsonable(metadata) if metadata else None,
        other={
            str(k): _jsonable(v)
            for k, v in sample.items()
            if k not in _SHOWN_KEYS and v not in (None, {}, [])
        },
    )


# -- thumbnails -----------------------------------------------------------------------------------------


def _thumbnail(data: bytes, width: int) -> _Thumb:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            size = im.size
            im.draft("RGB", (width, max(1, width * size[1] // max(size[0], 1))))  # JPEG: decode at 1/2^k
            if im.mode in ("RGBA", "LA") or (im.mode == "P" and "transparency" in im.info):
                rgba = im.convert("RGBA")
                flat = Image.new("RGB", rgba.size, (255, 255, 255))
                flat.paste(rgba, mask=rgba.getchannel("A"))
                im2 = flat
            else:
                im2 = im.convert("RGB")
            im2.thumbnail((width, width * 4), Image.Resampling.LANCZOS, reducing_gap=2.0)
            out = io.BytesIO()
            im2.save(out, "JPEG", quality=THUMB_QUALITY, optimize=True, progressive=True)
    except UnidentifiedImageError:
        return _Thumb(error="cannot decode: not an image format Pillow reads")
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        return _Thumb(error=f"cannot decode: {e}")
    uri = "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")
    return _Thumb(uri=uri, size=size, thumb=im2.size)


def _read_media(bundle: Bundle, name: str) -> bytes:
    with bundle.open_media(name) as f:  # a directory's file, or a packed file's member (pread)
        return bytes(f.read())


def _thumbnails(bundle: Bundle, names: Sequence[str], width: int, progress: bool | None) -> dict[str, _Thumb]:
    from bundles.support import Progress

    def one(name: str) -> _Thumb:
        try:
            data = _read_media(bundle, name)
        except (OSError, BundleError) as e:
            return _Thumb(error=f"cannot read: {e}")
        return _thumbnail(data, width)

    out: dict[str, _Thumb] = {}
    with (
        Progress("thumbnails", total=len(names), unit="images", enabled=progress) as bar,
        ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool,
    ):
        for name, thumb in zip(names, pool.map(one, names), strict=True):
            out[name] = thumb
            bar.advance()
    return out


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
    if rewards:
        out.append(_stat(f"{sum(rewards) / len(rewards):.3g}", "mean reward"))
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
    if isinstance(before, int) and isinstance(after, int):
        cast = f"{human_bytes(before)} → {human_bytes(after)}" + (
            f" ({after / before:.2f}×)" if before else ""
        )
    proc = replay.get("processor") or {}
    rows: list[tuple[str, Any]] = [
        ("report", e(name)),
        ("replayed bundle", e(replay.get("bundle", "–"))),
        ("dtype", e(replay.get("dtype", "–"))),
        ("processor", _chips(proc)),
        ("samples / images", e(f"{s.get('samples', '–')} / {s.get('images', '–')}")),
        ("vision tokens", e(s.get("vision_tokens", "–"))),
        ("tensor bytes", e(cast)),
        ("peak RSS", e(human_bytes(s["peak_rss_bytes"])) if isinstance(s.get("peak_rss_bytes"), int) else "–"),
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


def _turns(v: _SampleView, thumbs: dict[str, _Thumb], link_base: str | None, merge: int,
           replay_images: dict[int, dict[str, Any]]) -> str:  # fmt: skip
    if not v.images:
        return ""
    items = []
    for j, img in enumerate(v.images):
        thumb = thumbs.get(img.name) if img.name else None
        if thumb is not None and thumb.ref and thumb.thumb:
            tw, th = thumb.thumb
            picture = (
                f'<svg class="thumb" viewBox="0 0 {tw} {th}" width="{tw}" height="{th}" role="img" '
                f'aria-label="turn {j}"><use href="#{thumb.ref}"/></svg>'
            )
            if link_base is not None and img.name:
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
    if img.grid is not None:
        t, h, w = img.grid
        return f'<span title="from image_grid_thw {e(img.grid)} / merge {merge}²"> · ≈{t * h * w // (merge * merge)} vision tokens</span>'
    return ""


def _sample(v: _SampleView, thumbs: dict[str, _Thumb], link_base: str | None, merge: int,
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
    body.append(_turns(v, thumbs, link_base, merge, replay_images))
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
        output: the HTML file to write (its directory is created).
        replay: a replay report (``rollout-bundle replay --report``), as a dict or a JSON path.
        limit: show at most this many samples (after ``samples``).
        samples: positions of the samples to show, in this order (default: all, in order).
        thumb_width: thumbnail width in pixels.
        progress: draw a progress line while making thumbnails (default: on a terminal).

    Raises:
        BundleError: the bundle cannot be read, a position is out of range, or the replay report
            is not one (:class:`ReportError`).
    """
    b = bundle if isinstance(bundle, Bundle) else open_bundle(bundle, verify="fast")
    out = Path(os.path.abspath(output))
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
    if limit is not None and limit < 0:
        raise BundleError(f"limit: expected an int >= 0, found {limit}")
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
    thumbs = _thumbnails(b, names, thumb_width, progress)
    link_base = None  # a packed bundle has no files to link to
    if not b.packed:
        rel = os.path.relpath(b.path / MEDIA_DIR, out.parent)
        link_base = "/".join(urllib.parse.quote(part) for part in Path(rel).parts) + "/"
    merge = _merge_size(b, report)
    by_pos = {s["position"]: s for s in report["samples"]} if report is not None else None

    defs: list[str] = []
    for name in names:
        t = thumbs[name]
        if t.uri and t.thumb:
            t.ref = f"m{len(defs)}"
            defs.append(f'<image id="{t.ref}" width="{t.thumb[0]}" height="{t.thumb[1]}" href="{t.uri}"/>')
    shown_images = sum(
        1 for v in views for img in v.images if img.name and thumbs.get(img.name, _Thumb()).uri
    )
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
        parts.append(_sample(v, thumbs, link_base, merge, by_pos.get(v.position) if by_pos is not None else None,
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

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ReportWritten(out, len(views), shown_images, len(data))
