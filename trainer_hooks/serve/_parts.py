"""Parts of pages as plain data for ``templates/``: a sample, a trend, a comparison; no HTML, no I/O.

Samples are drawn as ``rollout-bundle view`` draws them, by the presentation layer
(:mod:`trainer_hooks.pages`): read down by :func:`~trainer_hooks.pages.sample_view`, a sample's
block built by :func:`~trainer_hooks.pages.sample_block` (its actions parsed and drawn over the
screenshots) and laid out by the same macros (``sample_block.html.j2``, ``turn.html.j2``). The
one difference: a picture is a same-origin JPEG the server makes (``/b/<id>/img/<name>?w=...``),
not an inlined ``data:`` URI.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from trainer_hooks.pages import (
    SampleView,
    draw_turn,
    link_turns,
    new_turn,
    px,
    sample_block,
    short,
    size,
)
from trainer_hooks.serve._index import Indexer, IndexState
from trainer_hooks.serve._lookups import positions_of
from trainer_hooks.serve._media import LARGE, THUMB, ImageInfo
from trainer_hooks.serve._run import BundleEntry

__all__ = ["building_context", "compare_context", "sample_changes", "sample_context", "trend"]

MAX_COMPARE_ROWS = 200  # samples changed, only in A, only in B: each listed up to this many


def sample_context(
    v: SampleView,
    infos: Mapping[str, ImageInfo],
    img_url: Callable[[str, int], str],
    href: str,
    row: Mapping[str, Any] | None,
    defs: dict[str, dict[str, Any]],
    uid: str = "",
) -> dict[str, Any]:
    """One sample as the ``sample_block`` macro draws it; its pictures are added to ``defs``."""
    turns = []
    for j, img in enumerate(v.images):
        info = infos.get(img.name) if img.name else None
        turn, action = new_turn(v, j, uid)
        if info is not None and info.size is not None and img.name:
            w, h = info.size
            tw, th = info.thumb_size(THUMB)
            ref = "m" + img.name.partition(".")[0][:16]
            defs.setdefault(ref, {"id": ref, "w": tw, "h": th, "uri": img_url(img.name, THUMB)})
            draw_turn(turn, v, action, ref, (w, h), (tw, th))
            turn["size"] = f"{w}×{h}"
            turn["href"] = img_url(img.name, LARGE)
            turn["large"] = {"kind": "link", "href": turn["href"]}
        elif info is not None and info.error:
            turn["why"] = info.error
        turns.append(turn)
    advantage = row.get("advantage") if row is not None else None
    sample = sample_block(v, link_turns(turns), advantage)
    sample["href"] = href
    return sample


def trend(title: str, points: list[tuple[int, float]], band: list[tuple[int, float, float]] | None = None,
          digits: int = 3) -> dict[str, Any] | None:  # fmt: skip
    """An inline-SVG line chart of ``(step, value)``; ``band`` (step, low, high) shades a spread."""
    if not points:
        return None
    w, h, pad = 300.0, 120.0, 6.0
    steps = [s for s, _ in points]
    values = [v for _, v in points] + [x for _, a, b in band or [] for x in (a, b)]
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    s0, s1 = min(steps), max(steps)
    span = (s1 - s0) or 1

    def x(s: int) -> float:
        return w / 2 if s1 == s0 else pad + (w - 2 * pad) * (s - s0) / span

    def y(v: float) -> float:
        return h - pad - (h - 2 * pad) * (v - lo) / (hi - lo)

    out: dict[str, Any] = {
        "title": title, "w": int(w), "h": int(h),
        "points": " ".join(f"{px(x(s))},{px(y(v))}" for s, v in points),
        "dots": [{"x": px(x(s)), "y": px(y(v)), "step": s, "label": f"{v:.{digits}g}"} for s, v in points],
        "first": s0, "last": s1, "lo": f"{lo:.{digits}g}", "hi": f"{hi:.{digits}g}", "band": None,
    }  # fmt: skip
    if band:
        upper = [f"{px(x(s))},{px(y(b))}" for s, _, b in band]
        lower = [f"{px(x(s))},{px(y(a))}" for s, a, _ in reversed(band)]
        out["band"] = " ".join(upper + lower)
    return out


def building_context(entry: BundleEntry, st: IndexState, heading: str, what: str) -> dict[str, Any]:
    """A page that needs its bundle's complete index (a group), while the index builds: how far
    it is, and a refresh (a meta refresh: no script, which the CSP allows)."""
    percent = int(100 * st.rows / st.total) if st.total else 100
    return {"title": heading, "heading": heading, "kind": entry.kind, "name": entry.rel, "percent": percent,
            "rows": st.rows, "total": st.total, "what": what, "bundle_href": f"/b/{entry.id}", "refresh": 2,
            "crumbs": [(f"/b/{entry.id}", entry.rel), (None, heading)]}  # fmt: skip


def _positions(indexer: Indexer, entry: BundleEntry, by: str, keys: list[Any]) -> dict[Any, int]:
    """Where the samples named by ``keys`` sit in ``entry``: the keys themselves when matched by
    position, else looked up in the index (none while it is not built)."""
    if by == "position":
        return {k: k for k in keys if isinstance(k, int) and 0 <= k < len(entry.bundle)}
    if by != "index" or not keys or not indexer.state(entry).complete:
        return {}
    with indexer.connect(entry) as con:
        return positions_of(con, keys)


def compare_context(report: Mapping[str, Any], a: BundleEntry, b: BundleEntry, indexer: Indexer,
                    note: str | None) -> dict[str, Any]:  # fmt: skip
    """What ``rollout-bundle diff A B --by index --json`` reported, as the compare page's table:
    one row per sample changed, removed or added, each with links to the sample on either side
    and to the two side by side."""
    by = str(report.get("by") or "position")
    samples = report.get("samples") or {}
    media = report.get("media") or {}
    changed = list(samples.get("changed") or [])[:MAX_COMPARE_ROWS]
    removed = list(samples.get("removed") or [])[:MAX_COMPARE_ROWS]
    added = list(samples.get("added") or [])[:MAX_COMPARE_ROWS]
    in_a, in_b = _positions(indexer, a, by, removed), _positions(indexer, b, by, added)
    rows: list[dict[str, Any]] = []
    for c in changed:
        i, j = c.get("position_a"), c.get("position_b")
        lines = [_change(x) for x in c.get("changes") or []] + (
            [f"… and {c['more']} more"] if c.get("more") else []
        )
        rows.append({"key": short(c.get("key")), "what": "changed", "cls": "warn", "changes": lines,
                     "a_href": f"/b/{a.id}/s/{i}", "b_href": f"/b/{b.id}/s/{j}", "a_pos": i, "b_pos": j,
                     "both_href": f"/compare/samples?a={a.id}&i={i}&b={b.id}&j={j}"})  # fmt: skip
    for keys, side, found, entry in ((removed, "a", in_a, a), (added, "b", in_b, b)):
        for k in keys:
            p = found.get(k)
            row: dict[str, Any] = {"key": short(k), "what": f"only in {side.upper()}", "cls": "bad" if side == "a" else "ok",
                   "changes": [], "a_href": None, "b_href": None, "a_pos": None, "b_pos": None, "both_href": None}  # fmt: skip
            if p is not None:
                row[f"{side}_href"], row[f"{side}_pos"] = f"/b/{entry.id}/s/{p}", p
            rows.append(row)
    counts: dict[str, Any] = {"changed": len(samples.get("changed") or []), "removed": len(samples.get("removed") or []),
                              "added": len(samples.get("added") or []), "unchanged": samples.get("unchanged")}  # fmt: skip
    meta = [_change(c) for c in (report.get("meta") or {}).get("changes", [])]
    kind = report.get("kind")
    return {"same": bool(report.get("same")), "by": by, "note": note, "rows": rows, "counts": counts,
            "more": max(0, counts["changed"] + counts["removed"] + counts["added"] - len(rows)),
            "meta": meta, "kind": f"{kind.get('a')} -> {kind.get('b')}" if isinstance(kind, Mapping) else None,
            "media_a": [_media_line(m) for m in list(media.get("only_in_a") or [])[:MAX_COMPARE_ROWS]],
            "media_b": [_media_line(m) for m in list(media.get("only_in_b") or [])[:MAX_COMPARE_ROWS]],
            "media_common": media.get("common")}  # fmt: skip


def _media_line(m: Any) -> str:
    return f"{m.get('path')} ({size(int(m.get('size') or 0))})" if isinstance(m, Mapping) else short(m)


def _change(c: Any) -> str:
    if not isinstance(c, Mapping):
        return short(c)
    if "items_differ" in c:
        return f"{c.get('path')}: {c['items_differ']} of {c.get('length')} items differ, first at [{c.get('first')}]"
    return f"{c.get('path')}: {short(c.get('a'), 100)} -> {short(c.get('b'), 100)}"


def quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def sample_changes(a: Any, b: Any) -> list[str]:
    out = []
    for name in ("status", "reward", "index", "group_index", "tokens", "response_length", "loss_mask"):
        x, y = getattr(a, name), getattr(b, name)
        if x != y:
            out.append(f"{name}: {x!r} -> {y!r}"[:300])
    if a.prompt != b.prompt:
        out.append("prompt: differs")
    if a.response != b.response or a.response_chars != b.response_chars:
        # The views hold the first MAX_SHOWN_CHARS characters; their full lengths are counted.
        ra, rb = a.response or "", b.response or ""
        k = next((i for i, (p, q) in enumerate(zip(ra, rb, strict=False)) if p != q), min(len(ra), len(rb)))
        na, nb = a.response_chars or len(ra), b.response_chars or len(rb)
        out.append(f"response: differs from character {k} ({na} -> {nb} characters)")
    na, nb = [i.name for i in a.images], [i.name for i in b.images]
    if a.turn_count != b.turn_count:
        out.append(f"screenshots: {a.turn_count} -> {b.turn_count}")
    for j, (x, y) in enumerate(zip(na, nb, strict=False)):
        if x != y:
            out.append(f"turn {j}: another screenshot ({(x or '?')[:12]}… -> {(y or '?')[:12]}…)")
    aa, ab = a.actions or [], b.actions or []
    for j, (x, y) in enumerate(zip(aa, ab, strict=False)):
        if x != y:
            out.append(f"turn {j} action: {x[:80]!r} -> {y[:80]!r}")
    if a.metadata != b.metadata:
        out.append("metadata: differs")
    return out
