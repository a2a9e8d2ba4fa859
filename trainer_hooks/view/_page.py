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
from bundles import Bundle, BundleError
from bundles.support import human_bytes
from trainer_hooks.view._actions import Action, parse_action
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
    try:
        import jinja2
    except ImportError:
        raise BundleError(
            "view writes its page from Jinja2 templates: pip install 'rollout-bundles[view]'"
        ) from None

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


_WHERE_LABEL = {
    "directory": "bundle on disk",
    "packed file": "packed file",
    "object store": "on the object store",
    "packed file on an object store": "packed, on the object store",
}


def _header(bundle: Bundle, views: list[SampleView], shown_images: int, distinct: int) -> dict[str, Any]:
    meta = bundle.meta
    refs, stored = bundle.media_references, len(bundle.media)
    statuses = Counter(v.status or "no status" for v in views)
    rewards = [
        _reward_number(v.reward)
        for v in views
        if isinstance(v.reward, (int, float)) and not isinstance(v.reward, bool)
    ]
    finite = [r for r in rewards if r is not None]
    stats = [
        {"value": str(len(views)), "of": str(len(bundle)), "label": "samples shown"},
        {"value": str(stored), "label": "media files stored"},
        {"value": str(refs), "label": "media references"},
        {"value": f"{refs / stored:.2f}×" if stored else "–", "label": "dedup ratio"},
        {"value": size(bundle.media_bytes), "label": "media"},
        {"value": size(bundle.stored_bytes), "label": _WHERE_LABEL.get(bundle.location, bundle.location)},
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


def _turns(v: SampleView, shown: Mapping[str, Shown], refs: Mapping[str, str], large_refs: Mapping[str, str],
           link_base: str | None, merge: int, replay_images: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    turns = []
    for j, img in enumerate(v.images):
        s = shown.get(img.name) if img.name else None
        turn: dict[str, Any] = {"j": j, "id": f"v{v.position}-{j}", "ref": None, "href": None, "why": img.shown_as,
                                "size": None, "large": None, "shapes": [], "mark": None}  # fmt: skip
        text = v.actions[j] if v.actions is not None and j < len(v.actions) else None
        if text is None and v.actions is None and j < len(v.tool_calls):
            text = v.tool_calls[j]
        action = parse_action(text) if text is not None else None
        turn["action"] = text
        turn["action_desc"] = action.describe() if action is not None and action.kind != "text" else None
        if s is not None and s.thumb is not None and s.size and img.name is not None and img.name in refs:
            w, h = s.size
            turn.update(ref=refs[img.name], w=w, h=h, tw=s.thumb.width, th=s.thumb.height,
                        scale=_f(w / s.thumb.width))  # fmt: skip
            turn["shapes"] = overlay(action, (w, h), v.screen)
            # A thumbnail shows only where the pointer went (one ring); the large view has it all.
            ring = next((sh for sh in reversed(turn["shapes"]) if sh["t"] == "ring"), None)
            turn["mark"] = {"cx": ring["cx"], "cy": ring["cy"], "r": _f(max(w, h) / 40)} if ring else None
            # Only a stored .png/.jpg/.jpeg that decoded is a link target: a browser renders a
            # linked file by its suffix, and .html/.svg/... would run outside this page's CSP.
            if link_base is not None and img.name and s.linkable and shown_suffix(img.name):
                turn["href"] = link_base + urllib.parse.quote(img.name)
            if img.name in large_refs and s.large is not None:
                turn["large"] = {
                    "kind": "inline",
                    "ref": large_refs[img.name],
                    "scale": _f(w / s.large.width),
                }
            elif turn["href"]:
                turn["large"] = {"kind": "link", "href": turn["href"]}
            else:
                turn["large"] = {"kind": "thumb"}
        elif s is not None and s.error:
            turn["why"] = s.error
        if s is not None and s.size:
            turn["size"] = f"{s.size[0]}×{s.size[1]}"
        turn["vision"] = _vision_tokens(img.grid, merge, replay_images.get(j))
        turn["name"] = img.name
        turn["title"] = img.shown_as
        turns.append(turn)
    for k, t in enumerate(turns):
        t["prev"] = turns[k - 1]["id"] if k > 0 and turns[k - 1]["large"] else None
        t["next"] = turns[k + 1]["id"] if k + 1 < len(turns) and turns[k + 1]["large"] else None
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


def _filters(
    views: list[SampleView], replay_by_pos: Mapping[int, Any] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[int, list[str]]]:
    """The filter groups (radio buttons, CSS only), the histograms, and each sample's classes."""
    classes: dict[int, list[str]] = {v.position: [] for v in views}
    groups: list[dict[str, Any]] = []
    charts: list[dict[str, Any]] = []

    def add(key: str, label: str, options: list[tuple[str, list[int]]]) -> list[str]:
        ids = [f"f{key}{k}" for k in range(len(options))]
        opts = []
        for oid, (text, members) in zip(ids, options, strict=True):
            for pos in members:
                classes[pos].append(oid)
            opts.append({"id": oid, "label": text, "count": len(members)})
        if len(options) > 1 or key == "rp":
            groups.append({"key": key, "label": label, "all": f"f{key}-all", "options": opts})
        return ids

    statuses = Counter(v.status or "no status" for v in views)
    order = [s for s, _ in statuses.most_common()]
    add("st", "status", [(s, [v.position for v in views if (v.status or "no status") == s]) for s in order])

    def numeric(key: str, label: str, values: dict[int, float | None], integers: bool) -> None:
        edges = bins([x for x in values.values() if x is not None], integers=integers)
        members: list[list[int]] = [[] for _ in edges]
        for pos, x in values.items():
            k = bin_of(x, edges)
            if k is not None:
                members[k].append(pos)
        ids = add(key, label, [(e[2], m) for e, m in zip(edges, members, strict=True)])
        if edges:
            charts.append(histogram(label, edges, [len(m) for m in members], ids))

    numeric("rw", "reward", {v.position: _reward_number(v.reward) for v in views}, False)
    numeric("ln", "response length", {v.position: _reward_number(v.response_length) for v in views}, True)
    numeric("tn", "turns", {v.position: float(len(v.images)) for v in views}, True)
    if replay_by_pos is not None:
        with_p: list[int] = []
        clean: list[int] = []
        missing: list[int] = []
        kinds: dict[str, list[int]] = {}
        for v in views:
            entry = replay_by_pos.get(v.position)
            if entry is None:
                missing.append(v.position)
                continue
            problems = [p for p in entry.get("problems") or [] if isinstance(p, dict)]
            (with_p if problems else clean).append(v.position)
            for p in problems:
                kinds.setdefault(dash(p.get("kind", "problem")), []).append(v.position)
        options = [("with problems", with_p), ("clean", clean), ("not replayed", missing)]
        options += [(f"kind: {k}", sorted(set(m))) for k, m in sorted(kinds.items())[:12]]
        add("rp", "replay", options)
    return groups, charts, classes


SORTS = [
    ("reward ↓", lambda v, a: (_reward_number(v.reward) is None, -(_reward_number(v.reward) or 0))),
    ("reward ↑", lambda v, a: (_reward_number(v.reward) is None, _reward_number(v.reward) or 0)),
    ("|advantage| ↓", lambda v, a: (a is None, -abs(a or 0))),
    ("length ↓", lambda v, a: (_reward_number(v.response_length) is None, -(_reward_number(v.response_length) or 0))),
    ("turns ↓", lambda v, a: (0, -len(v.images))),
    ("mean log-prob ↑", lambda v, a: (v.logprob_mean is None, v.logprob_mean or 0)),
]  # fmt: skip


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
    defs: list[dict[str, Any]] = []
    refs: dict[str, str] = {}
    large_refs: dict[str, str] = {}
    for name in names:
        t, big = shown[name].thumb, shown[name].large
        if t is not None:
            refs[name] = f"m{len(defs)}"
            defs.append({"id": refs[name], "w": t.width, "h": t.height, "uri": t.uri})
        if big is not None and t is not None:
            large_refs[name] = f"L{len(defs)}"
            defs.append({"id": large_refs[name], "w": big.width, "h": big.height, "uri": big.uri})
    shown_images = sum(1 for v in views for img in v.images if img.name in refs)
    merge = merge_size(bundle, replay)
    by_pos = {s["position"]: s for s in replay["samples"]} if replay is not None else None

    # GRPO groups: samples sharing a group_index, in bundle order.
    group_of: dict[str, list[SampleView]] = {}
    for v in views:
        if v.group_index is not None:
            group_of.setdefault(compact(v.group_index), []).append(v)
    advantage: dict[int, float | None] = {}
    for members in group_of.values():
        for v, a in zip(members, advantages([_reward_number(m.reward) for m in members]), strict=True):
            advantage[v.position] = a
    filters, charts, classes = _filters(views, by_pos)
    ranks: dict[int, list[int]] = {v.position: [] for v in views}
    for _, key in SORTS:
        for rank, v in enumerate(sorted(views, key=lambda v: key(v, advantage.get(v.position)))):
            ranks[v.position].append(rank)

    samples, by_position = [], {}
    for v in views:
        entry = by_pos.get(v.position) if by_pos is not None else None
        replay_images = {}
        if entry is not None:
            for im in entry.get("images") or []:
                if isinstance(im, dict) and isinstance(im.get("image"), int):
                    replay_images[im["image"]] = im
        head = [("index", dash(v.index)), ("group", dash(v.group_index))]
        tail = [("reward", reward_text(v.reward))]
        if advantage.get(v.position) is not None:
            tail.append(("advantage", f"{advantage[v.position]:+.3g}"))
        tail += [("tokens", dash(v.tokens)), ("response", dash(v.response_length))]
        if v.loss_mask is not None:
            tail.append(("loss mask", v.loss_mask))
        if v.logprob_mean is not None:
            tail.append(("mean log-prob", f"{v.logprob_mean:.4g}"))
        diff = entry.get("logprob_diff") if entry is not None else None
        recomputed = diff.get("recomputed") if isinstance(diff, dict) else None
        diff_values = None
        if isinstance(recomputed, list) and v.logprobs is not None and len(recomputed) == len(v.logprobs):
            diff_values = [None if a is None or (fb := _reward_number(b)) is None else a - fb
                           for a, b in zip(v.logprobs, recomputed, strict=True)]  # fmt: skip
        sample = {
            "pos": v.position,
            "classes": classes[v.position],
            "order": ranks[v.position],
            "head": head,
            "badge": badge(v.status),
            "tail": tail,
            "index_row": [dash(v.index), dash(v.group_index), reward_text(v.reward), dash(v.tokens),
                          dash(v.response_length), str(len(v.images))],
            "problems": None if entry is None else len(entry.get("problems") or []),
            "replay": None if entry is None else _replay_block(entry),
            "prompt": _prompt(v.prompt),
            "turns": _turns(v, shown, refs, large_refs, link_base, merge, replay_images),
            "response": text(v.response) if v.response else None,
            "strip": logprob_strip(v.logprobs),
            "diff_strip": logprob_strip(diff_values, diff=True) if diff_values else None,
            "metadata": text(pretty(v.metadata)) if v.metadata else None,
            "other": text(pretty(v.other)) if v.other else None,
            "other_count": len(v.other),
        }  # fmt: skip
        samples.append(sample)
        by_position[v.position] = sample

    groups = []
    for members in group_of.values():
        rewards = [r for r in (_reward_number(m.reward) for m in members) if r is not None]
        spread = None
        if rewards:
            mean = math.fsum(rewards) / len(rewards)
            std = (
                math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
                if len(rewards) > 1
                else 0.0
            )
            spread = {"mean": f"{mean:.3g}", "std": f"{std:.3g}", "min": f"{min(rewards):.3g}",
                      "max": f"{max(rewards):.3g}", "flat": len(rewards) > 1 and std == 0}  # fmt: skip
        columns: list[dict[str, Any]] = [by_position[m.position] for m in members]
        rows = max(len(c["turns"]) for c in columns)
        groups.append({"label": dash(members[0].group_index), "columns": columns, "rows": list(range(rows)),
                       "spread": spread, "n": len(members)})  # fmt: skip

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "csp": CSP,
        "title": f"{bundle.kind} · {bundle.path.name}",
        "header": _header(bundle, views, shown_images, len(refs)),
        "replay": None if replay is None else _replay_summary(replay, replay_name or "replay report"),
        "replay_given": replay is not None,
        "samples": samples,
        "groups": groups,
        "filters": filters,
        "charts": charts,
        "sorts": [label for label, _ in SORTS],
        "index_open": len(samples) <= INDEX_OPEN_MAX,
        "defs": defs,
        "shown_images": shown_images,
        "overlay_color": OVERLAY_COLOR,
        "version": bundles.__version__,
        "stamp": stamp,
    }


# -- issue 21: overlays, large views, groups, filters, sorting, charts ---------------------------------------

OVERLAY_COLOR = "#ff2bd6"  # drawn over screenshots; tests look for it


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
        shapes.append({"t": "ring", "cx": _f(x), "cy": _f(y), "r": _f(r), "sw": _f(unit * 0.35)})

    if action.kind == "drag" and len(pts) == 2:
        (x1, y1), (x2, y2) = pts
        shapes.append(
            {"t": "line", "x1": _f(x1), "y1": _f(y1), "x2": _f(x2), "y2": _f(y2), "sw": _f(unit * 0.35)}
        )
        ring(x1, y1, unit * 1.2)
        ring(x2, y2, unit * 2)
        anchor = (x2, y2)
    elif pts:
        x, y = pts[-1]
        ring(x, y, unit * 2.2)
        if action.kind in ("double_click", "triple_click"):
            ring(x, y, unit * 1.3)
        shapes.append({"t": "dot", "cx": _f(x), "cy": _f(y), "r": _f(unit * 0.45)})
        anchor = (x, y)
    else:
        anchor = (w / 2, h / 2) if action.kind == "scroll" else (unit * 2, unit * 2)
    if action.kind == "scroll" and action.scroll is not None:
        dx, dy = action.scroll
        norm = math.hypot(dx, dy) or 1.0
        x, y = anchor
        length = unit * 8
        shapes.append({"t": "line", "x1": _f(x), "y1": _f(y), "x2": _f(x + dx / norm * length),
                       "y2": _f(y + dy / norm * length), "sw": _f(unit * 0.6)})  # fmt: skip
    # The label sits beside the anchor, kept inside the picture.
    lx = min(max(anchor[0] + unit * 3, unit), max(unit, w - len(label[:120]) * unit * 1.36 - unit * 2))
    ly = min(max(anchor[1] - unit * 2.5, unit * 3), h - unit)
    shapes.append({"t": "label", "x": _f(lx), "y": _f(ly), "fs": _f(unit * 2.2), "text": label[:120],
                   "bw": _f(len(label[:120]) * unit * 1.36 + unit * 1.5), "bh": _f(unit * 3)})  # fmt: skip
    return shapes


def _f(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _reward_number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # a JSON integer beyond any float
        return None
    return f if math.isfinite(f) else None


def advantages(rewards: list[float | None]) -> list[float | None]:
    """GRPO advantages as Miles computes them (``_normalize_rewards_by_rollout``): reward minus
    the group mean, divided by the group's unbiased standard deviation + 1e-6 when the group has
    more than one sample and that deviation is not 0 (``--disable-grpo-std-normalization`` off)."""
    known = [r for r in rewards if r is not None]
    if not known:
        return [None] * len(rewards)
    mean = math.fsum(known) / len(known)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in known) / (len(known) - 1)) if len(known) > 1 else 0.0
    return [None if r is None else (r - mean) / (std + 1e-6) if std > 0 else r - mean for r in rewards]


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
        bars.append({"x": _f(k * (bar_w + gap)), "y": _f(height - bh), "w": _f(bar_w), "h": _f(bh),
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
    width = min(n, 2048)
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


# -- the search page: the one page with a script ------------------------------------------------------------

SEARCH_TEXT = 2000  # characters of a prompt and of a response the search page holds
_HASH_SLOT = "__SCRIPT_AND_STYLE_HASHES__"


def search_rows(views: list[SampleView]) -> list[dict[str, str]]:
    rows = []
    for v in views:
        prompt = " ".join(m["text"] for m in _prompt(v.prompt) or [])
        rows.append({"pos": str(v.position), "status": v.status or "no status", "reward": reward_text(v.reward),
                     "prompt": prompt[:SEARCH_TEXT], "response": (v.response or "")[:SEARCH_TEXT]})  # fmt: skip
    return rows


def render_search(rows: list[dict[str, str]], title: str, report_href: str) -> str:
    """The search page: a table of every sample's prompt and response (text, escaped by the
    template engine) and one small script, ``templates/search.js``, that hides the rows not
    holding every typed word. Its CSP allows exactly that script and that stylesheet, by their
    SHA-256 hashes, and nothing else (no other script, no fetch, no image): the bundle's text is
    only ever read by the script as ``textContent``, never run or parsed as HTML."""
    import base64
    import hashlib
    import re

    page = str(environment().get_template("search.html.j2").render(
        csp=f"default-src 'none'; {_HASH_SLOT}; base-uri 'none'; form-action 'none'",
        title=title, rows=rows, report_href=report_href))  # fmt: skip

    def digest(body: str) -> str:
        return (
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode("ascii") + "'"
        )

    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(scripts) == 1 and len(styles) == 1, "the search page has one script and one style, ours"
    return page.replace(_HASH_SLOT, f"script-src {digest(scripts[0])}; style-src {digest(styles[0])}", 1)
