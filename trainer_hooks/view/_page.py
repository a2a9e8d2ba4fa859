"""The page: what it shows, as plain data, rendered by Jinja2 templates with autoescaping.

Nothing here writes HTML. :func:`page_context` turns the bundle, the samples' views, the stored
screenshots' pictures and the replay report into dicts and lists of plain strings and numbers;
``templates/report.html.j2`` lays them out. The environment escapes every ``{{ value }}``
(``autoescape=True``, for every template, whatever its name), so a prompt, an action, a file name
or a replay message from a stranger's bundle lands as text, and no template uses ``|safe``
(``tests/test_view_templates.py`` checks both, with hostile strings in every field). Undefined
names are errors (``StrictUndefined``), so a typo in a template fails the tests, not the page.

The Content-Security-Policy in the page's ``<meta>`` forbids every script and every fetch except
images from ``data:`` URIs and the stored files beside the page (``'self'``).
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from typing import Any

import bundles
from bundles import Bundle
from bundles.support import MANIFEST_NAME, human_bytes
from trainer_hooks.view._media import Shown, shown_suffix
from trainer_hooks.view._samples import SampleView, num

__all__ = ["CSP", "environment", "page_context", "render_page"]

CSP = (
    "default-src 'none'; img-src data: 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
)
INDEX_OPEN_MAX = 60  # samples listed unfolded in the index table
MAX_TEXT = 20_000  # characters of a prompt or response shown before the rest is cut
DEFAULT_MERGE_SIZE = 2  # Qwen2-VL: 2x2 patches make one vision token
STATUS_CLASS = {"completed": "ok", "truncated": "warn", "aborted": "warn", "failed": "bad", "pending": "info"}


@functools.cache
def environment() -> Any:
    """The one Jinja2 environment of the page: templates shipped in the package, autoescaped."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trainer_hooks.view", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return env


def render_page(context: Mapping[str, Any]) -> str:
    return str(environment().get_template("report.html.j2").render(**context))


# -- small formatting helpers (return plain text; the template escapes it) -----------------------------


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


def pretty(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, indent=2, default=str)


def dash(v: Any) -> str:
    return "–" if v is None else num(v) if isinstance(v, (int, float)) else str(v)


def reward_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else compact(v)


def text(s: str) -> dict[str, Any]:
    """A long text cut at MAX_TEXT characters: ``{"text", "more"}`` (characters left out)."""
    return {"text": s[:MAX_TEXT], "more": max(0, len(s) - MAX_TEXT)}


def badge(status: str | None) -> dict[str, str]:
    if status is None:
        return {"cls": "", "text": "no status"}
    return {"cls": STATUS_CLASS.get(status.lower(), ""), "text": status}


def chips(d: Any) -> dict[str, Any]:
    """A small mapping as ``key value`` chips (nested values as compact JSON), else one code span."""
    if not isinstance(d, Mapping) or not d:
        return {"code": compact(d)}
    return {"chips": [(str(k), v if isinstance(v, str) else compact(v)) for k, v in d.items()]}


# -- sections -----------------------------------------------------------------------------------------------


def _bundle_bytes(bundle: Bundle) -> int:
    if bundle.packed:
        return bundle.path.stat().st_size
    shards = sum(int(s["size"]) for s in bundle.manifest["shards"])
    try:
        manifest = (bundle.path / MANIFEST_NAME).stat().st_size
    except OSError:
        manifest = 0
    return manifest + shards + bundle.media_bytes


def _header(bundle: Bundle, views: list[SampleView], shown_images: int, distinct: int) -> dict[str, Any]:
    meta = bundle.meta
    refs, stored = bundle.media_references, len(bundle.media)
    statuses = Counter(v.status or "no status" for v in views)
    rewards = [
        float(v.reward)
        for v in views
        if isinstance(v.reward, (int, float)) and not isinstance(v.reward, bool)
    ]
    finite = [r for r in rewards if math.isfinite(r)]
    stats = [
        {"value": str(len(views)), "of": str(len(bundle)), "label": "samples shown"},
        {"value": str(stored), "label": "media files stored"},
        {"value": str(refs), "label": "media references"},
        {"value": f"{refs / stored:.2f}×" if stored else "–", "label": "dedup ratio"},
        {"value": size(bundle.media_bytes), "label": "media"},
        {"value": size(_bundle_bytes(bundle)), "label": "packed file" if bundle.packed else "bundle on disk"},
    ]
    if finite:
        stats.append({"value": f"{math.fsum(finite) / len(finite):.3g}", "label": "mean reward"})
    stats.append({"value": str(shown_images), "label": f"screenshots shown, {distinct} distinct"})
    processor = meta.get("processor")
    facts: list[dict[str, Any]] = [
        {"k": "run", "v": {"plain": dash(meta.get("run_uuid"))}},
        {"k": "rollout id", "v": {"plain": dash(meta.get("rollout_id"))}},
        {"k": "training dtype", "v": {"plain": dash(meta.get("training_dtype"))}},
        {"k": "processor", "v": chips(processor) if processor else {"muted": "not recorded"}},
        {"k": "statuses", "v": {"badges": [(badge(s), n) for s, n in sorted(statuses.items())]}},
        {"k": "format", "v": {"plain": f"format_version {bundle.manifest.get('format_version')}, "
                                       f"{bundle.manifest.get('created_by')}"}},
    ]  # fmt: skip
    if meta.get("metadata"):
        facts.append({"k": "metadata", "v": chips(meta["metadata"])})
    extra = {
        k: v
        for k, v in meta.items()
        if k not in ("run_uuid", "rollout_id", "training_dtype", "processor", "metadata")
    }
    if extra:
        facts.append({"k": "other meta", "v": chips(extra)})
    return {
        "kind": bundle.kind,
        "name": bundle.path.name,
        "path": str(bundle.path),
        "stats": stats,
        "facts": facts,
    }


def _replay_summary(replay: Mapping[str, Any], name: str) -> dict[str, Any]:
    s = replay.get("summary") or {}
    problems = s.get("problems") or {}
    before, after = s.get("bytes_before_cast"), s.get("bytes_after_cast")
    cast = "–"
    if before is not None or after is not None:
        r = ratio(after, before)
        cast = f"{size(before)} → {size(after)}" + (f" ({r})" if r else "")
    proc = replay.get("processor") or {}
    return {"facts": [
        {"k": "report", "v": {"plain": name}},
        {"k": "replayed bundle", "v": {"plain": dash(replay.get("bundle"))}},
        {"k": "dtype", "v": {"plain": dash(replay.get("dtype"))}},
        {"k": "processor", "v": chips(proc)},
        {"k": "samples / images", "v": {"plain": f"{dash(s.get('samples'))} / {dash(s.get('images'))}"}},
        {"k": "vision tokens", "v": {"plain": dash(s.get("vision_tokens"))}},
        {"k": "tensor bytes", "v": {"plain": cast}},
        {"k": "peak RSS", "v": {"plain": size(s["peak_rss_bytes"]) if s.get("peak_rss_bytes") is not None else "–"}},
        {"k": "problems", "v": {"problems": [(str(k), dash(n)) for k, n in problems.items()]}},
    ]}  # fmt: skip


def _prompt(prompt: Any) -> list[dict[str, Any]] | None:
    """The prompt as messages ``{"role", "text"}`` (role None for a plain string or other value)."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return [{"role": None, **text(prompt)}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        out = []
        for m in prompt:
            content = m.get("content")
            if isinstance(content, list):
                body = "\n".join(
                    str(c.get("text", "")) if isinstance(c, dict) and c.get("type") == "text" else
                    f"[{c.get('type', 'part')}]" if isinstance(c, dict) else str(c)
                    for c in content
                )  # fmt: skip
            else:
                body = "" if content is None else content if isinstance(content, str) else compact(content)
            out.append({"role": str(m["role"]), **text(body)})
        return out
    return [{"role": None, **text(pretty(prompt))}]


def _vision_tokens(
    grid: list[int] | None, merge: int, replayed: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    if replayed is not None and isinstance(replayed.get("vision_tokens"), int):
        vt, ph = replayed["vision_tokens"], replayed.get("placeholder_tokens")
        pv = replayed.get("pixel_values")
        return {
            "replayed": True,
            "tokens": dash(vt),
            "placeholders": dash(ph) if isinstance(ph, int) else None,
            "mismatch": isinstance(ph, int) and ph != vt,
            "pixel_values": f"{dash(pv.get('dtype', ''))} {dash(pv.get('shape'))}"
            if isinstance(pv, dict) and pv.get("shape") is not None else None,
        }  # fmt: skip
    if grid is not None and merge > 0:
        t, h, w = grid
        return {
            "replayed": False,
            "tokens": str(t * h * w // (merge * merge)),
            "grid": str(grid),
            "merge": merge,
        }
    return None


def _turns(v: SampleView, shown: Mapping[str, Shown], refs: Mapping[str, str], link_base: str | None,
           merge: int, replay_images: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    turns = []
    for j, img in enumerate(v.images):
        s = shown.get(img.name) if img.name else None
        turn: dict[str, Any] = {"j": j, "ref": None, "href": None, "why": img.shown_as, "size": None}
        if s is not None and s.thumb is not None and img.name in refs:
            turn["ref"], turn["w"], turn["h"] = refs[img.name], s.thumb.width, s.thumb.height
            # Only a stored .png/.jpg/.jpeg that decoded is a link target: a browser renders a
            # linked file by its suffix, and .html/.svg/... would run outside this page's CSP.
            if link_base is not None and img.name and s.linkable and shown_suffix(img.name):
                turn["href"] = link_base + urllib.parse.quote(img.name)
        elif s is not None and s.error:
            turn["why"] = s.error
        if s is not None and s.size:
            turn["size"] = f"{s.size[0]}×{s.size[1]}"
        turn["vision"] = _vision_tokens(img.grid, merge, replay_images.get(j))
        turn["action"] = v.actions[j] if v.actions is not None and j < len(v.actions) else None
        turn["name"] = img.name
        turn["title"] = img.shown_as
        turns.append(turn)
    return turns


def _replay_block(r: Mapping[str, Any]) -> dict[str, Any]:
    problems = []
    for p in r.get("problems") or []:
        if isinstance(p, dict):
            where = f" (image {dash(p['image'])})" if p.get("image") is not None else ""
            problems.append(
                {"kind": dash(p.get("kind", "problem")), "message": dash(p.get("message", "")) + where}
            )
    diff = r.get("logprob_diff")
    d = None
    if isinstance(diff, dict):
        d = {
            "max": num(diff.get("max_abs")),
            "mean": num(diff.get("mean_abs")),
            "tokens": dash(diff.get("tokens")),
        }
    return {"problems": problems, "diff": d}


def merge_size(bundle: Bundle, replay: Mapping[str, Any] | None) -> int:
    processor = bundle.meta.get("processor")
    recorded = processor.get("mm_process_config") if isinstance(processor, dict) else None
    for source in ((replay or {}).get("processor"), recorded):
        m = source.get("merge_size") if isinstance(source, dict) else None
        if isinstance(m, int) and not isinstance(m, bool) and 0 < m < 2**16:
            return m
    return DEFAULT_MERGE_SIZE


def page_context(
    bundle: Bundle,
    views: list[SampleView],
    shown: Mapping[str, Shown],
    *,
    link_base: str | None,
    replay: Mapping[str, Any] | None,
    replay_name: str | None,
) -> dict[str, Any]:
    """Everything the template shows, as plain data."""
    names = list(dict.fromkeys(img.name for v in views for img in v.images if img.name))
    defs, refs = [], {}
    for name in names:
        t = shown[name].thumb
        if t is not None:
            refs[name] = f"m{len(defs)}"
            defs.append({"id": refs[name], "w": t.width, "h": t.height, "uri": t.uri})
    shown_images = sum(1 for v in views for img in v.images if img.name in refs)
    merge = merge_size(bundle, replay)
    by_pos = {s["position"]: s for s in replay["samples"]} if replay is not None else None
    samples = []
    for v in views:
        entry = by_pos.get(v.position) if by_pos is not None else None
        replay_images = {}
        if entry is not None:
            for im in entry.get("images") or []:
                if isinstance(im, dict) and isinstance(im.get("image"), int):
                    replay_images[im["image"]] = im
        head = [("index", dash(v.index)), ("group", dash(v.group_index))]
        tail = [
            ("reward", reward_text(v.reward)),
            ("tokens", dash(v.tokens)),
            ("response", dash(v.response_length)),
        ]
        if v.loss_mask is not None:
            tail.append(("loss mask", v.loss_mask))
        if v.logprob_mean is not None:
            tail.append(("mean log-prob", f"{v.logprob_mean:.4g}"))
        samples.append({
            "pos": v.position,
            "head": head,
            "badge": badge(v.status),
            "tail": tail,
            "index_row": [dash(v.index), dash(v.group_index), reward_text(v.reward), dash(v.tokens),
                          dash(v.response_length), str(len(v.images))],
            "problems": None if entry is None else len(entry.get("problems") or []),
            "replay": None if entry is None else _replay_block(entry),
            "prompt": _prompt(v.prompt),
            "turns": _turns(v, shown, refs, link_base, merge, replay_images),
            "response": text(v.response) if v.response else None,
            "metadata": text(pretty(v.metadata)) if v.metadata else None,
            "other": text(pretty(v.other)) if v.other else None,
            "other_count": len(v.other),
        })  # fmt: skip
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "csp": CSP,
        "title": f"{bundle.kind} · {bundle.path.name}",
        "header": _header(bundle, views, shown_images, len(defs)),
        "replay": None if replay is None else _replay_summary(replay, replay_name or "replay report"),
        "replay_given": replay is not None,
        "samples": samples,
        "index_open": len(samples) <= INDEX_OPEN_MAX,
        "defs": defs,
        "shown_images": shown_images,
        "version": bundles.__version__,
        "stamp": stamp,
    }
