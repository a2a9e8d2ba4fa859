"""Page assembly: one function per page, from the request's parsed values to its HTML.

Each page asks the state (:class:`~trainer_hooks.serve._app.ServeApp`) for its data (the run,
an index's rows, samples, pictures, a replay report, a ``diff`` report), builds its parts as
plain data (:mod:`~trainer_hooks.serve._parts`, and a sample's block in
:mod:`trainer_hooks.pages`) and renders its template through the one environment. What a page
costs is bounded here, by the page: :data:`RUN_PAGE` bundles, trends from :data:`TREND_BUNDLES`,
:data:`GROUP_COLUMNS` samples of a group, :data:`PROMPT_SAMPLES` a side, :data:`PICK_BUNDLES` to
compare with; a page whose bundle is not indexed yet waits :data:`FIRST_PAGE_WAIT_S` for its
first rows, then says how far the index is and refreshes itself.
"""

from __future__ import annotations

import math
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from trainer_hooks.pages import badge, fmt, mismatch_of, replay_block, reward_spread, size
from trainer_hooks.serve._app import ServeApp, image_infos
from trainer_hooks.serve._lookups import Query, group_rows, prompt_rows, row_at, statuses
from trainer_hooks.serve._lookups import groups_page as groups_after
from trainer_hooks.serve._media import PixelBudget
from trainer_hooks.serve._parts import (
    building_context,
    compare_context,
    sample_changes,
    sample_context,
    trend,
)
from trainer_hooks.serve._query import PAGE, PageError, not_found, parse_int, parse_query
from trainer_hooks.serve._rows import REPORT_SORTS, SORTS, prompt_key, prompt_text
from trainer_hooks.serve._run import BundleEntry

__all__ = [
    "bundle_page",
    "compare_page",
    "compare_samples_page",
    "group_page",
    "groups_page",
    "prompt_page",
    "run_page",
    "sample_page",
]

GROUP_COLUMNS = 16
PROMPT_SAMPLES = 4
FIRST_PAGE_WAIT_S = 1.5  # how long a bundle page waits for an unindexed bundle's first rows
RUN_PAGE = 100  # bundles per run page
TREND_BUNDLES = 400  # bundles the run page's trends are drawn from (spread evenly over the run)
#: Replay-report bytes, and reports, one run page load reads for its log-prob mismatch trend (a
#: report is up to MAX_REPORT_BYTES, and each read opens its bundle to check the report is of
#: it); the figures read are kept, so the next load reads the next reports.
TREND_REPORT_BYTES = 64 * 1024 * 1024
TREND_REPORT_READS = 40
PICK_BUNDLES = 100  # bundles a sample page offers to compare with (the nearest by step)


def img_url(entry: BundleEntry) -> Callable[[str, int], str]:
    return lambda name, w: f"/b/{entry.id}/img/{urllib.parse.quote(name)}?w={w}"


def crumb(entry: BundleEntry) -> tuple[str, str]:
    return (f"/b/{entry.id}", entry.rel)


def replay_note(app: ServeApp, entry: BundleEntry) -> str | None:
    r = app.replay(entry)
    if r is None:
        return None
    if r["error"]:
        return f"replay report beside the bundle not used: {r['error']}"
    counts = ", ".join(f"{k} {v}" for k, v in r["problems"].items()) or "none"
    line = f"replay report {os.path.basename(r['path'])}: {len(r['by_pos'])} samples replayed; problems: {counts}"
    return line + (f"; log-prob mismatch: {r['logprob']}" if r.get("logprob") else "")


def entry_stats(app: ServeApp, entry: BundleEntry) -> list[dict[str, str]]:
    b = entry.bundle
    return [{"value": str(len(b)), "label": "samples"}, {"value": str(len(b.manifest.media)), "label": "media files"},
            {"value": size(b.stored_bytes), "label": b.location}]  # fmt: skip


def run_page(app: ServeApp, params: Mapping[str, str] | None = None) -> str:
    """The run: :data:`RUN_PAGE` bundles from ``?from=N`` (an offset into the run's order: an
    in-memory sorted list), trends from at most :data:`TREND_BUNDLES` bundles spread over the
    run; what it costs is bounded by the page, not by how many bundles the run holds."""
    every = app.run.ordered()
    start = parse_int((params or {}).get("from") or "0", "from")
    if start and start >= len(every):
        raise not_found(f"the run holds {len(every)} bundles; there is none from {start}")
    shown = every[start : start + RUN_PAGE]
    rows = [_run_row(app, e) for e in shown]
    step = max(1, -(-len(every) // TREND_BUNDLES))  # at most TREND_BUNDLES of them
    sampled = every[::step]
    budget = {"bytes": TREND_REPORT_BYTES, "reads": TREND_REPORT_READS, "deferred": 0}
    trends = _trends(app, sampled, budget)
    pending = sum(1 for r in rows if not r["summary"] and not r["error"])
    total = sum(e.samples for e in every)
    stats = [{"value": str(len(every)), "label": "bundles"}, {"value": str(total), "label": "samples"}]
    name = os.path.basename(app.run.root.rstrip("/")) or app.run.root
    pages = {"first_href": "/" if start else None, "from": start + 1 if shown else 0, "to": start + len(shown),
             "next_href": f"/?from={start + RUN_PAGE}" if start + RUN_PAGE < len(every) else None,
             "prev_href": (f"/?from={max(0, start - RUN_PAGE)}" if start > RUN_PAGE else "/") if start else None,
             "trend_note": _trend_note(len(sampled), len(every), budget["deferred"])}  # fmt: skip
    listing = f"listing… {app.run.found} found so far" if app.run.listing else None
    return app.render("run.html.j2", title=name, root=app.run.root, root_name=name, rows=rows, trends=trends,
                       stats=stats, pending=pending, problems=list(app.run.problems.values())[:RUN_PAGE],
                       more_problems=max(0, len(app.run.problems) - RUN_PAGE), listing=listing, pages=pages,
                       follow=bool(app.config.follow), runs_href="/runs" if len(app.runs) > 1 else None,
                       refresh=5 if pending or listing or app.config.follow else None)  # fmt: skip


def _run_row(app: ServeApp, e: BundleEntry) -> dict[str, Any]:
    st = app.indexer.state(e)
    r: dict[str, Any] = {"id": e.id, "href": f"/b/{e.id}", "rel": e.rel, "kind": e.kind,
                         "step": "–" if e.step is None else e.step, "samples": e.samples,
                         "size": size(e.stored_bytes), "summary": st.summary, "error": st.error,
                         "rows": st.rows}  # fmt: skip
    if st.summary:
        s = st.summary
        r.update(reward_mean=fmt(s["reward_mean"], 3), reward_std=fmt(s["reward_std"], 3),
                 length=fmt(s["length_mean"], 4), turns=fmt(s["turns_mean"], 3),
                 truncated=f"{s['truncated']}", statuses=[(badge(k), n) for k, n in s["statuses"].items()])  # fmt: skip
    return r


def _trend_note(sampled: int, every: int, deferred: int) -> str | None:
    notes = [f"trends from {sampled} of {every} bundles, spread over the run"] if sampled < every else []
    if deferred:
        more = "1 more bundle is" if deferred == 1 else f"{deferred} more bundles are"
        notes.append(f"the log-prob mismatch of {more} read on the next loads (at most "
                     f"{TREND_REPORT_READS} replay reports, {TREND_REPORT_BYTES >> 20} MiB, a load)")  # fmt: skip
    return "; ".join(notes) or None


def _trends(app: ServeApp, entries: list[BundleEntry], budget: dict[str, int]) -> list[dict[str, Any]]:
    # One line per kind: a run's checkpoints and its debug dumps are two series, not one.
    points: dict[tuple[str, str], list[tuple[int, float]]] = {}
    bands: dict[str, list[tuple[int, float, float]]] = {}
    for e in entries:
        if e.step is not None:
            _mismatch_points(app, e, e.step, points, bands, budget)
        s = app.indexer.state(e).summary if e.step is not None else None
        if not s or e.step is None:
            continue
        measures = {"reward": s["reward_mean"], "length": s["length_mean"], "turns": s["turns_mean"],
                    "truncated": s["truncated"] / s["samples"] if s["samples"] else None}  # fmt: skip
        for name, value in measures.items():
            if value is not None:
                points.setdefault((e.kind, name), []).append((e.step, value))
        if s["reward_mean"] is not None:
            sd = s["reward_std"] or 0.0
            bands.setdefault(e.kind, []).append((e.step, s["reward_mean"] - sd, s["reward_mean"] + sd))
    kinds = sorted({kind for kind, _ in points})
    trends = []
    for kind in kinds:
        suffix = f" · {kind}" if len(kinds) > 1 else ""
        for name, title in (("reward", "reward mean ± std"), ("length", "response length (mean)"),
                            ("turns", "turns (mean)"), ("truncated", "truncated (fraction)"),
                            ("mismatch", "log-prob mismatch: mean |Δ| of the samples (band p50…p99)"),
                            ("k3", "log-prob mismatch: k3 KL estimate")):  # fmt: skip
            band = _by_step(bands.get(kind if name == "reward" else f"{kind}/{name}", [])) or None
            chart = trend(title + suffix, _by_step(points.get((kind, name), [])), band)
            if chart:
                trends.append(chart)
    return trends


def _mismatch_points(app: ServeApp, e: BundleEntry, step: int, points: dict[tuple[str, str], list[tuple[int, float]]],
                     bands: dict[str, list[tuple[int, float, float]]], budget: dict[str, int]) -> None:  # fmt: skip
    """The bundle's log-prob mismatch at its step (from the replay report beside it, when there is
    one): the mean of its samples' ``mean_abs`` in a p50…p99 band, and the k3 estimate. A report
    not read yet is read only while the page's ``budget`` of report bytes lasts."""
    m = app.mismatch(e, budget)
    if m is None:
        return
    if "mean" in m:
        points.setdefault((e.kind, "mismatch"), []).append((step, m["mean"]))
        bands.setdefault(f"{e.kind}/mismatch", []).append(
            (step, m.get("p50", m["mean"]), m.get("p99", m["mean"]))
        )
    if "k3" in m:
        points.setdefault((e.kind, "k3"), []).append((step, m["k3"]))


def bundle_page(app: ServeApp, entry: BundleEntry, params: Mapping[str, str]) -> str:
    q, shown = parse_query(params)
    replay = app.replay(entry)
    by_pos = replay["by_pos"] if replay is not None and not replay["error"] else None
    if q.sort in REPORT_SORTS and by_pos is None:
        raise PageError(400, "bad sort", f"sort: {q.sort} needs a replay report beside the bundle "
                        f"(rollout-bundle replay {entry.rel} --report); there is none")  # fmt: skip
    st = app.indexer.want(entry, FIRST_PAGE_WAIT_S)
    base_href = f"/b/{entry.id}"
    sorts = [k for k in SORTS if by_pos is not None or k not in REPORT_SORTS]
    ctx: dict[str, Any] = {"title": entry.rel, "kind": entry.kind, "step": entry.step, "name": entry.rel,
                           "location": entry.location, "stats": entry_stats(app, entry), "q": shown,
                           "sorts": sorts, "self_href": base_href, "replayed": by_pos is not None,
                           "groups_href": f"{base_href}/groups",
                           "mismatch_href": f"{base_href}?sort=mismatch&order=desc" if by_pos is not None else None,
                           "crumbs": [(None, entry.rel)], "total": entry.samples, "rows": [], "matching": 0,
                           "status_options": [], "first_href": None, "next_href": None, "partial": False,
                           "indexed": st.rows, "state_note": None, "state_error": False,
                           "filtered": any(v for k, v in shown.items() if k not in ("sort", "order")),
                           "replay_note": replay_note(app, entry)}  # fmt: skip
    if st.error:
        ctx.update(state_note=st.error, state_error=True)
        return app.render("bundle.html.j2", **ctx)
    if not st.complete:
        ctx.update(partial=True, refresh=3,
                   state_note=f"indexing: {st.rows} of {st.total} samples so far; this page refreshes itself; "
                   "a group's page waits until the bundle is indexed")  # fmt: skip
        if st.rows == 0:
            return app.render("bundle.html.j2", **ctx)
    rows, ctx["matching"], nxt, ctx["status_options"] = _query(app, entry, q, by_pos)
    for r in rows:
        _table_row(r, base_href, by_pos)
    ctx["rows"] = rows
    keep = {k: v for k, v in shown.items() if v not in ("", None)}
    if q.limit != PAGE:
        keep["limit"] = str(q.limit)
    if nxt is not None:
        ctx["next_href"] = base_href + "?" + urllib.parse.urlencode({**keep, "after": f"{nxt[0]!r}:{nxt[1]}"})
    if q.after is not None:
        ctx["first_href"] = base_href + ("?" + urllib.parse.urlencode(keep) if keep else "")
    return app.render("bundle.html.j2", **ctx)


def _query(app: ServeApp, entry: BundleEntry, q: Query, by_pos: Mapping[int, Any] | None) -> tuple[Any, ...]:
    """The bundle page's rows, how many match, the next page's cursor, and the statuses."""
    with app.indexer.connect(entry) as con:
        # The replay report's figure as SQL sees it (SORTS["mismatch"]), on this connection;
        # taken off again before the pooled connection goes back, so it keeps no report alive.
        con.create_function(
            "mismatch", 1, lambda pos: mismatch_of((by_pos or {}).get(pos)), deterministic=True
        )
        try:
            rows, matching, nxt = q.run(con)
            return rows, matching, nxt, statuses(con)
        except sqlite3.OperationalError as e:  # a search SQLite refuses (its words are quoted)
            raise PageError(400, "bad search", f"q: the search cannot be run: {e}") from None
        finally:
            con.create_function("mismatch", 1, None)


def _table_row(r: dict[str, Any], base_href: str, by_pos: Mapping[int, Any] | None) -> None:
    """One row of the bundle page's table, its values as the page shows them."""
    r["href"] = f"{base_href}/s/{r['pos']}"
    r["badge"] = badge(r["status"])
    r["reward"] = r["reward_text"] or "–"
    r["advantage"] = "–" if r["advantage"] is None else f"{r['advantage']:+.3g}"
    r["group_href"] = (
        None if r["grp"] is None else f"{base_href}/group?g={urllib.parse.quote(r['grp'], safe='')}"
    )
    r["prompt_href"] = f"/prompt?key={urllib.parse.quote(r['prompt_key'], safe='')}"
    for k in ("idx", "grp", "resp_len", "tokens", "turns"):
        r[k] = fmt(r[k])
    r["prompt_head"] = (r["prompt_head"] or "")[:120]
    r["mismatch"] = fmt(mismatch_of(by_pos.get(r["pos"]))) if by_pos is not None else None


def groups_page(app: ServeApp, entry: BundleEntry, params: Mapping[str, str]) -> str:
    st = app.indexer.want(entry, FIRST_PAGE_WAIT_S)
    after = params.get("after") or None
    ctx: dict[str, Any] = {"title": f"{entry.rel} groups", "kind": entry.kind, "name": entry.rel,
                           "bundle_href": f"/b/{entry.id}", "crumbs": [crumb(entry), (None, "groups")],
                           "groups": [], "next_href": None, "first_href": None,
                           "state_note": None if st.complete else st.error or "indexing: groups are shown once "
                           "the bundle is indexed"}  # fmt: skip
    if st.complete:
        with app.indexer.connect(entry) as con:
            groups = groups_after(con, after, PAGE + 1)
        for g in groups:
            g["href"] = f"/b/{entry.id}/group?g={urllib.parse.quote(g['grp'], safe='')}"
            g["flat"] = g["n"] > 1 and g["lo"] is not None and g["lo"] == g["hi"]
            g["range"] = "–" if g["lo"] is None else f"{g['lo']:.3g} … {g['hi']:.3g}"
            g["mean"] = fmt(g["mean"], 3)
        if len(groups) > PAGE:
            groups = groups[:PAGE]
            ctx["next_href"] = f"/b/{entry.id}/groups?" + urllib.parse.urlencode({"after": groups[-1]["grp"]})
        if after:
            ctx["first_href"] = f"/b/{entry.id}/groups"
        ctx["groups"] = groups
    else:
        ctx["refresh"] = 3
    return app.render("groups.html.j2", **ctx)


def group_page(app: ServeApp, entry: BundleEntry, group: str) -> str:
    st = app.indexer.want(entry, FIRST_PAGE_WAIT_S)
    if st.error:
        raise PageError(502, "cannot index the bundle", st.error)
    if not st.complete:  # a page that waits and refreshes itself, not a 503
        return app.render("building.html.j2", **building_context(entry, st, f"group {group}", "the group"))
    with app.indexer.connect(entry) as con:
        members = group_rows(con, group, GROUP_COLUMNS + 1)
        n = con.execute("SELECT count(*) FROM samples WHERE grp = ?", (group,)).fetchone()[0]
    if not members:
        raise not_found(f"no sample of {entry.rel} is in group {group[:80]!r}")
    members = members[:GROUP_COLUMNS]
    views = app.samples.get(entry, [m["pos"] for m in members])
    infos = image_infos(app.pictures, entry, list(views.values()))
    defs: dict[str, dict[str, Any]] = {}
    columns = [sample_context(views[m["pos"]], infos, img_url(entry), f"/b/{entry.id}/s/{m['pos']}", m, defs)
               for m in members]  # fmt: skip
    spread = reward_spread([m["reward"] for m in members if m["reward"] is not None])
    rows = list(range(max((len(c["turns"]) for c in columns), default=0)))
    return app.render("group.html.j2", title=f"group {group}", kind=entry.kind, name=entry.rel, group=group,
                       columns=columns, rows=rows, spread=spread, more=max(0, n - len(columns)),
                       crumbs=[crumb(entry), (f"/b/{entry.id}/groups", "groups"), (None, group)],
                       samples_with_turns=columns, defs=list(defs.values()))  # fmt: skip


def sample_page(app: ServeApp, entry: BundleEntry, pos: int) -> str:
    n = entry.samples
    if not 0 <= pos < n:
        raise not_found(f"{entry.rel} holds {n} samples (0..{n - 1}); there is no sample {pos}")
    view = app.samples.get(entry, [pos])[pos]
    row = _row(app, entry, pos)
    infos = image_infos(app.pictures, entry, [view])
    defs: dict[str, dict[str, Any]] = {}
    s = sample_context(view, infos, img_url(entry), f"/b/{entry.id}/s/{pos}", row, defs)
    replay = app.replay(entry)
    if replay is not None and not replay["error"]:
        s["replay"] = replay_block(replay["by_pos"].get(pos), view.logprobs)
    group_href = None
    if row is not None and row.get("grp") is not None:
        group_href = f"/b/{entry.id}/group?g={urllib.parse.quote(row['grp'], safe='')}"
    # Not indexed yet: the key from the sample itself (the same rule as the index's).
    key = (
        row["prompt_key"]
        if row is not None
        else prompt_key({"metadata": view.metadata}, prompt_text(view.prompt))
    )
    return app.render("sample.html.j2", title=f"{entry.rel} #{pos}", kind=entry.kind, name=entry.rel, pos=pos,
                       total=n, sample=s, bid=entry.id, bundle_href=f"/b/{entry.id}", group_href=group_href,
                       prompt_href=f"/prompt?key={urllib.parse.quote(key, safe='')}",
                       prev_href=f"/b/{entry.id}/s/{pos - 1}" if pos > 0 else None,
                       next_href=f"/b/{entry.id}/s/{pos + 1}" if pos + 1 < n else None,
                       bundles=_nearest(app, entry),
                       crumbs=[crumb(entry), (None, f"#{pos}")], samples_with_turns=[s],
                       defs=list(defs.values()))  # fmt: skip


def _nearest(app: ServeApp, entry: BundleEntry) -> list[dict[str, str]]:
    """The bundles a sample page offers to compare with: :data:`PICK_BUNDLES` around ``entry``."""
    every = app.run.ordered()
    lo = max(0, min(entry.order - PICK_BUNDLES // 2, len(every) - PICK_BUNDLES))
    return [{"id": e.id, "rel": e.rel} for e in every[lo : lo + PICK_BUNDLES]]


def _row(app: ServeApp, entry: BundleEntry, pos: int) -> dict[str, Any] | None:
    st = app.indexer.state(entry)
    if not st.complete and st.rows <= pos:
        return None
    with app.indexer.connect(entry) as con:
        return row_at(con, pos)


def prompt_page(app: ServeApp, params: Mapping[str, str]) -> str:
    key = params.get("key", "")
    if not key or len(key) > 400:
        raise PageError(400, "no prompt", "key: expected a prompt key from a bundle page's prompt link")
    rows, points, pending, head = [], [], 0, key
    holders: list[tuple[BundleEntry, list[dict[str, Any]]]] = []
    many = len(app.runs) > 1  # runs side by side: each bundle named with its run
    names: dict[str, str] = {}
    for run, e in app.entries():
        names[e.id] = f"{os.path.basename(run.root.rstrip('/')) or run.root} · {e.rel}" if many else e.rel
        st = app.indexer.state(e)
        if not st.complete:
            pending += 0 if st.error else 1
            if st.rows == 0:
                continue
        with app.indexer.connect(e) as con:
            found = prompt_rows(con, key, 64)
        if not found:
            continue
        head = found[0]["prompt_head"] or head
        rewards = [f["reward"] for f in found if f["reward"] is not None]
        mean = math.fsum(rewards) / len(rewards) if rewards else None
        counts: dict[str, int] = {}
        for f in found:
            counts[f["status"] or "no status"] = counts.get(f["status"] or "no status", 0) + 1
        rows.append({"step": "–" if e.step is None else e.step, "rel": names[e.id], "href": f"/b/{e.id}", "n": len(found),
                     "mean": fmt(mean, 3), "statuses": [(badge(k), v) for k, v in counts.items()],
                     "samples": [{"pos": f["pos"], "href": f"/b/{e.id}/s/{f['pos']}"} for f in found[:12]]})  # fmt: skip
        if e.step is not None and mean is not None and not many:
            points.append((e.step, mean))
        holders.append((e, found))
    choices = [
        {"id": e.id, "label": f"step {e.step} · {names[e.id]}" if e.step is not None else names[e.id]}
        for e, _ in holders
    ]
    a_id = params.get("a") or (holders[0][0].id if holders else None)
    b_id = params.get("b") or (holders[-1][0].id if holders else None)
    defs: dict[str, dict[str, Any]] = {}
    budget = PixelBudget()  # both sides' pictures together
    sides: list[list[dict[str, Any]]] = [[], []]
    labels = ["", ""]
    for k, bid in enumerate((a_id, b_id)):
        match = next(((e, f) for e, f in holders if e.id == bid), None)
        if match is None:
            continue
        e, found = match
        labels[k] = f"step {e.step} · {names[e.id]}" if e.step is not None else names[e.id]
        chosen = found[:PROMPT_SAMPLES]
        views = app.samples.get(e, [f["pos"] for f in chosen])
        infos = image_infos(app.pictures, e, list(views.values()), budget)
        sides[k] = [sample_context(views[f["pos"]], infos, img_url(e), f"/b/{e.id}/s/{f['pos']}", None, defs,
                                   uid=f"{'ab'[k]}{e.id[:4]}") for f in chosen]  # fmt: skip
    return app.render("prompt.html.j2", title="prompt across training", key=key, head=head[:160], rows=rows,
                       trend=trend("reward of this prompt by step (mean)", _by_step(points)), pending=pending,
                       choices=choices, a_id=a_id, b_id=b_id, left=sides[0], right=sides[1],
                       left_label=labels[0], right_label=labels[1], self_href="/prompt",
                       refresh=5 if pending else None, crumbs=[(None, "prompt")],
                       samples_with_turns=sides[0] + sides[1], defs=list(defs.values()))  # fmt: skip


def compare_page(app: ServeApp, a: BundleEntry, b: BundleEntry) -> str:
    # Samples matched by their index (`diff --by index`), as a trainer numbers them; by
    # position only where an index is missing or repeats, and the page says so.
    report, note = app.diffs.report(a, b, "index"), None
    if isinstance(report, str) and ("to match samples by" in report or "matching needs a key path" in report):
        report, note = app.diffs.report(a, b, None), f"matched by position: {report}"
    if isinstance(report, str):
        return app.render("compare.html.j2", title="compare", a=a, b=b, error=report, cmp=None,
                           crumbs=[(None, "compare")])  # fmt: skip
    cmp = compare_context(report, a, b, app.indexer, note)
    return app.render("compare.html.j2", title="compare", a=a, b=b, error=None, cmp=cmp,
                       crumbs=[(None, "compare")])  # fmt: skip


def compare_samples_page(app: ServeApp, a: BundleEntry, i: int, b: BundleEntry, j: int) -> str:
    for e, p in ((a, i), (b, j)):
        if not 0 <= p < e.samples:
            raise not_found(f"{e.rel} holds {e.samples} samples; there is no sample {p}")
    va = app.samples.get(a, [i])[i]
    vb = app.samples.get(b, [j])[j]
    defs: dict[str, dict[str, Any]] = {}
    budget = PixelBudget()  # both samples' pictures together
    ia = image_infos(app.pictures, a, [va], budget)
    ib = image_infos(app.pictures, b, [vb], budget)
    left = sample_context(va, ia, img_url(a), f"/b/{a.id}/s/{i}", _row(app, a, i), defs, uid="l")
    right = sample_context(vb, ib, img_url(b), f"/b/{b.id}/s/{j}", _row(app, b, j), defs, uid="r")
    changes = sample_changes(va, vb)
    return app.render("compare_samples.html.j2", title="compare samples", left=left, right=right,
                       left_name=a.rel, right_name=b.rel, changes=changes[:50], more=max(0, len(changes) - 50),
                       crumbs=[(None, "compare samples")], samples_with_turns=[left, right],
                       defs=list(defs.values()))  # fmt: skip


def _by_step(points: list[Any]) -> list[Any]:
    return sorted(points, key=lambda p: p[0])
