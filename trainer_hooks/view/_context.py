"""The page's data: what the report shows, as plain data, for ``templates/report.html.j2``.

Its one reason to change is what the page shows. Nothing here writes HTML: :func:`page_context`
turns the bundle, the samples' views, the stored screenshots' pictures and the replay report into
dicts and lists of plain strings and numbers; the template lays them out, escaped by the one
environment of :mod:`trainer_hooks.pages`. A sample's block (its turns, its replay verdicts) is
the presentation layer's (:func:`trainer_hooks.pages.sample_block`), as are the pictures
(:func:`trainer_hooks.pages.overlay`, histograms, log-prob strips) and every number format; what
is the report's own here is its header, the replay summary, the filters and sorts, the inlined
pictures' ids and the GRPO groups side by side.

The Content-Security-Policy in the page's ``<meta>`` forbids every script and every fetch except
images from ``data:`` URIs and the stored files beside the page (``'self'``).
"""

from __future__ import annotations

import datetime
import math
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from typing import Any

import bundles
from bundles import Bundle
from trainer_hooks.pages import (
    OVERLAY_COLOR,
    SampleView,
    advantages,
    badge,
    bin_of,
    bins,
    chips,
    compact,
    draw_turn,
    finite,
    fmt,
    histogram,
    link_turns,
    logprob_summary,
    mismatch_of,
    new_turn,
    px,
    ratio,
    replay_block,
    reward_spread,
    reward_text,
    sample_block,
    shown_suffix,
    size,
)
from trainer_hooks.view._media import Shown

__all__ = ["CSP", "page_context"]

CSP = (
    "default-src 'none'; img-src data: 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
)
INDEX_OPEN_MAX = 60  # samples listed unfolded in the index table
DEFAULT_MERGE_SIZE = 2  # Qwen2-VL: 2x2 patches make one vision token


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
        finite(v.reward)
        for v in views
        if isinstance(v.reward, (int, float)) and not isinstance(v.reward, bool)
    ]
    known = [r for r in rewards if r is not None]
    stats = [
        {"value": str(len(views)), "of": str(len(bundle)), "label": "samples shown"},
        {"value": str(stored), "label": "media files stored"},
        {"value": str(refs), "label": "media references"},
        {"value": f"{refs / stored:.2f}×" if stored else "–", "label": "dedup ratio"},
        {"value": size(bundle.media_bytes), "label": "media"},
        {"value": size(bundle.stored_bytes), "label": _WHERE_LABEL.get(bundle.location, bundle.location)},
    ]
    if known:
        stats.append({"value": f"{math.fsum(known) / len(known):.3g}", "label": "mean reward"})
    stats.append({"value": str(shown_images), "label": f"screenshots shown, {distinct} distinct"})
    processor = meta.get("processor")
    facts: list[dict[str, Any]] = [
        {"k": "run", "v": {"plain": fmt(meta.get("run_uuid"))}},
        {"k": "rollout id", "v": {"plain": fmt(meta.get("rollout_id"))}},
        {"k": "training dtype", "v": {"plain": fmt(meta.get("training_dtype"))}},
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
        {"k": "replayed bundle", "v": {"plain": fmt(replay.get("bundle"))}},
        {"k": "dtype", "v": {"plain": fmt(replay.get("dtype"))}},
        {"k": "processor", "v": chips(proc)},
        {"k": "samples / images", "v": {"plain": f"{fmt(s.get('samples'))} / {fmt(s.get('images'))}"}},
        {"k": "vision tokens", "v": {"plain": fmt(s.get("vision_tokens"))}},
        {"k": "tensor bytes", "v": {"plain": cast}},
        {"k": "peak RSS", "v": {"plain": size(s["peak_rss_bytes"]) if s.get("peak_rss_bytes") is not None else "–"}},
        {"k": "problems", "v": {"problems": [(str(k), fmt(n)) for k, n in problems.items()]}},
        {"k": "log-prob mismatch", "v": {"plain": logprob_summary(replay) or "–"}},
    ]}  # fmt: skip


def _vision_tokens(
    grid: list[int] | None, merge: int, replayed: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    if replayed is not None and isinstance(replayed.get("vision_tokens"), int):
        vt, ph = replayed["vision_tokens"], replayed.get("placeholder_tokens")
        pv = replayed.get("pixel_values")
        return {
            "replayed": True,
            "tokens": fmt(vt),
            "placeholders": fmt(ph) if isinstance(ph, int) else None,
            "mismatch": isinstance(ph, int) and ph != vt,
            "pixel_values": f"{fmt(pv.get('dtype', ''))} {fmt(pv.get('shape'))}"
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
        turn, action = new_turn(v, j)
        if s is not None and s.thumb is not None and s.size and img.name is not None and img.name in refs:
            w, h = s.size
            draw_turn(turn, v, action, refs[img.name], (w, h), (s.thumb.width, s.thumb.height))
            # Only a stored .png/.jpg/.jpeg that decoded is a link target: a browser renders a
            # linked file by its suffix, and .html/.svg/... would run outside this page's CSP.
            if link_base is not None and img.name and s.linkable and shown_suffix(img.name):
                turn["href"] = link_base + urllib.parse.quote(img.name)
            if img.name in large_refs and s.large is not None:
                turn["large"] = {
                    "kind": "inline",
                    "ref": large_refs[img.name],
                    "scale": px(w / s.large.width),
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
        turns.append(turn)
    return link_turns(turns)


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

    numeric("rw", "reward", {v.position: finite(v.reward) for v in views}, False)
    numeric("ln", "response length", {v.position: finite(v.response_length) for v in views}, True)
    numeric("tn", "turns", {v.position: float(v.turn_count) for v in views}, True)
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
                kinds.setdefault(fmt(p.get("kind", "problem")), []).append(v.position)
        options = [("with problems", with_p), ("clean", clean), ("not replayed", missing)]
        options += [(f"kind: {k}", sorted(set(m))) for k, m in sorted(kinds.items())[:12]]
        add("rp", "replay", options)
    return groups, charts, classes


SORTS = [
    ("reward ↓", lambda v, a: (finite(v.reward) is None, -(finite(v.reward) or 0))),
    ("reward ↑", lambda v, a: (finite(v.reward) is None, finite(v.reward) or 0)),
    ("|advantage| ↓", lambda v, a: (a is None, -abs(a or 0))),
    ("length ↓", lambda v, a: (finite(v.response_length) is None, -(finite(v.response_length) or 0))),
    ("turns ↓", lambda v, a: (0, -v.turn_count)),
    ("mean log-prob ↑", lambda v, a: (v.logprob_mean is None, v.logprob_mean or 0)),
]  # fmt: skip
#: With a replay report: the samples furthest from the trainer's log-probs first (not compared: last).
MISMATCH_SORT = "log-prob mismatch ↓"


def _pictures(views: list[SampleView], shown: Mapping[str, Shown]) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, str]]:  # fmt: skip
    """The hidden ``<defs>`` (each stored screenshot once, its large view after it) and the ids
    a turn draws them by: thumbnails ``m<k>``, large views ``L<k>``."""
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
    return defs, refs, large_refs


def _grpo_groups(views: list[SampleView]) -> tuple[dict[str, list[SampleView]], dict[int, float | None]]:
    """Samples sharing a group_index, in bundle order, and each one's GRPO advantage."""
    group_of: dict[str, list[SampleView]] = {}
    for v in views:
        if v.group_index is not None:
            group_of.setdefault(compact(v.group_index), []).append(v)
    advantage: dict[int, float | None] = {}
    for members in group_of.values():
        for v, a in zip(members, advantages([finite(m.reward) for m in members]), strict=True):
            advantage[v.position] = a
    return group_of, advantage


def _sample(v: SampleView, entry: Mapping[str, Any] | None, advantage: float | None, turns: list[dict[str, Any]],
            classes: list[str], order: list[int], replay_given: bool) -> dict[str, Any]:  # fmt: skip
    """One sample's section of the page (``entry``: its row of the replay report, if any)."""
    sample = sample_block(v, turns, advantage)
    sample.update(
        classes=classes, order=order, replay=replay_block(entry, v.logprobs) if replay_given else None,
        index_row=[fmt(v.index), fmt(v.group_index), reward_text(v.reward), fmt(v.tokens),
                   fmt(v.response_length), str(v.turn_count)],
        problems=None if entry is None else len(entry.get("problems") or []),
        mismatch=fmt(mismatch_of(entry)),
    )  # fmt: skip
    return sample


def _replay_images(entry: Mapping[str, Any] | None) -> dict[int, Mapping[str, Any]]:
    out: dict[int, Mapping[str, Any]] = {}
    for im in (entry.get("images") or []) if entry is not None else []:
        if isinstance(im, dict) and isinstance(im.get("image"), int):
            out[im["image"]] = im
    return out


def _group_block(members: list[SampleView], by_position: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
    """One GRPO group side by side: its samples' columns, row per turn, and its reward spread."""
    spread = reward_spread([r for r in (finite(m.reward) for m in members) if r is not None])
    columns: list[dict[str, Any]] = [by_position[m.position] for m in members]
    rows = max(len(c["turns"]) for c in columns)
    return {"label": fmt(members[0].group_index), "columns": columns, "rows": list(range(rows)),
            "spread": spread, "n": len(members)}  # fmt: skip


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
    defs, refs, large_refs = _pictures(views, shown)
    shown_images = sum(1 for v in views for img in v.images if img.name in refs)
    merge = merge_size(bundle, replay)
    by_pos = {s["position"]: s for s in replay["samples"]} if replay is not None else None
    group_of, advantage = _grpo_groups(views)
    filters, charts, classes = _filters(views, by_pos)
    sorts = list(SORTS)
    if by_pos is not None:
        mismatch = {v.position: mismatch_of(by_pos.get(v.position)) for v in views}
        sorts.append(
            (MISMATCH_SORT, lambda v, a: (mismatch[v.position] is None, -(mismatch[v.position] or 0)))
        )
    ranks: dict[int, list[int]] = {v.position: [] for v in views}
    for _, key in sorts:
        for rank, v in enumerate(sorted(views, key=lambda v: key(v, advantage.get(v.position)))):
            ranks[v.position].append(rank)
    samples, by_position = [], {}
    for v in views:
        entry = by_pos.get(v.position) if by_pos is not None else None
        turns = _turns(v, shown, refs, large_refs, link_base, merge, _replay_images(entry))
        sample = _sample(
            v,
            entry,
            advantage.get(v.position),
            turns,
            classes[v.position],
            ranks[v.position],
            replay is not None,
        )
        samples.append(sample)
        by_position[v.position] = sample
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "csp": CSP,
        "title": f"{bundle.kind} · {bundle.path.name}",
        "header": _header(bundle, views, shown_images, len(refs)),
        "replay": None if replay is None else _replay_summary(replay, replay_name or "replay report"),
        "replay_given": replay is not None,
        "samples": samples,
        "groups": [_group_block(members, by_position) for members in group_of.values()],
        "filters": filters,
        "charts": charts,
        "sorts": [label for label, _ in sorts],
        "index_open": len(samples) <= INDEX_OPEN_MAX,
        "defs": defs,
        "shown_images": shown_images,
        "overlay_color": OVERLAY_COLOR,
        "version": bundles.__version__,
        "stamp": stamp,
    }
