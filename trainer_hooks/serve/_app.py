"""The web application: :func:`create_app` (Starlette), every route read-only and escaped.

Routes (all ``GET``/``HEAD``; any other method is refused with a page):

- ``/``: the run, one row per bundle and trend plots across steps;
- ``/b/<id>``: a bundle's samples, filtered, sorted and paged on the server from its index
  (``q``, ``status``, ``group``, ``reward_min/max``, ``length_min/max``, ``turns_min/max``,
  ``sort``, ``order``, ``after``); ``/b/<id>/groups`` and ``/b/<id>/group?g=`` the GRPO groups;
- ``/b/<id>/s/<pos>``: one sample, every turn's screenshot with its action drawn over it;
- ``/b/<id>/img/<name>?w=320|1280|1920``: a stored screenshot, decoded and re-encoded as JPEG;
- ``/prompt?key=...&a=<id>&b=<id>``: one prompt across training;
- ``/compare?a=<id>&b=<id>`` (what ``rollout-bundle diff`` reports) and
  ``/compare/samples?a=<id>&i=<pos>&b=<id>&j=<pos>``.

Safety, route by route: a bundle is named by its opaque id and nothing else
(:meth:`trainer_hooks.serve._run.Run.get`), a picture by a media name its manifest lists
(:class:`trainer_hooks.serve._media.Pictures`), so no URL text reaches a filesystem path or a
store key. Every value from a bundle reaches the page through Jinja2's autoescaping (no
``|safe``), pages carry no script, and every response has a strict Content-Security-Policy
(``default-src 'none'``; images and the stylesheet from the server itself only), ``nosniff``,
no referrer, no framing. Errors are HTML pages; a traceback goes to the terminal, never to the
browser. Beyond loopback, :class:`Guard` asks for the token printed at start (Jupyter's way:
``?token=`` once, then a cookie).
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import math
import os
import posixpath
import secrets
import sqlite3
import subprocess
import sys
import threading
import traceback
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bundles
from bundles import BundleError
from bundles.support import LIMITS, display
from trainer_hooks import pages
from trainer_hooks.pages import badge, environment, fmt, package_text, replay_block, reward_spread, size
from trainer_hooks.serve import _index as ix
from trainer_hooks.serve._index import Indexer, Query
from trainer_hooks.serve._media import WIDTHS, Pictures, PixelBudget
from trainer_hooks.serve._pages import (
    SampleCache,
    building_context,
    compare_context,
    image_infos,
    sample_context,
    trend,
)
from trainer_hooks.serve._run import BundleEntry, Run

__all__ = [
    "CSP",
    "SECURITY_HEADERS",
    "TOKEN_COOKIE",
    "Guard",
    "ServeConfig",
    "create_app",
    "default_cache_dir",
]

CSP = ("default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")  # fmt: skip
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
TOKEN_COOKIE = "rollout_bundle_serve_token"  # + "_<port>": cookies are shared by every port of a host
PAGE = 50
MAX_PAGE = 500
GROUP_COLUMNS = 16
PROMPT_SAMPLES = 4
#: Compiled in the background at start, a bundle's first page first (with what it extends and
#: imports: Jinja2 loads those when a page is rendered, not when it is compiled).
WARM_TEMPLATES = ("bundle.html.j2", "base.html.j2", "macros.html.j2", "run.html.j2", "sample.html.j2",
                  "sample_block.html.j2", "images.html.j2", "turn.html.j2", "error.html.j2", "prompt.html.j2")  # fmt: skip
FIRST_PAGE_WAIT_S = 1.5  # how long a bundle page waits for an unindexed bundle's first rows
MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]  # of an error message on a page
RUN_PAGE = 100  # bundles per run page
TREND_BUNDLES = 400  # bundles the run page's trends are drawn from (spread evenly over the run)
PICK_BUNDLES = 100  # bundles a sample page offers to compare with (the nearest by step)
DIFF_WORKERS = 2  # `rollout-bundle diff` processes at once; a compare past them is told to retry
DIFF_TIMEOUT_S = 300
DIFF_CACHE_BYTES = 16 * 1024 * 1024  # diff reports kept, by the bytes of their JSON


@functools.cache
def stylesheet() -> bytes:
    """What ``/static/style.css`` serves: the pages' stylesheet (:func:`trainer_hooks.pages.stylesheet`),
    then serve's own rules (``templates/serve.css``)."""
    return (pages.stylesheet() + package_text("trainer_hooks.serve", "serve.css")).encode("utf-8")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rollout-bundles" / "serve"


@dataclass
class ServeConfig:
    root: str
    cache_dir: Path
    token: str | None = None  # required on every request when set (a host beyond loopback)
    follow: float | None = None  # seconds between listings of ROOT (None: list once)
    progress: bool | None = None
    storage_options: dict[str, Any] | None = None
    allowed_hosts: list[str] | None = None  # Host headers accepted (DNS rebinding); None: any
    extra: dict[str, Any] = field(default_factory=dict)


class PageError(Exception):
    def __init__(self, status: int, heading: str, message: str) -> None:
        super().__init__(message)
        self.status, self.heading, self.message = status, heading, message


def _not_found(what: str) -> PageError:
    return PageError(404, "not found", what)


# -- the guard: methods, host, token, headers, errors -----------------------------------------------


class Guard:
    """ASGI middleware around the app: only ``GET``/``HEAD``; the ``Host`` header checked on
    loopback (a page elsewhere cannot reach the server by rebinding a name to 127.0.0.1); the
    token when one is set; the security headers on every response."""

    def __init__(self, app: Any, *, token: str | None, allowed_hosts: list[str] | None,
                 error_page: Callable[[int, str, str], bytes]) -> None:  # fmt: skip
        self.app, self.token, self.allowed_hosts, self.error_page = app, token, allowed_hosts, error_page

    async def _page(self, send: Any, status: int, heading: str, message: str,
                    extra: list[tuple[bytes, bytes]] | None = None) -> None:  # fmt: skip
        body = self.error_page(status, heading, message)
        headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store")] + (extra or [])  # fmt: skip
        headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await self._page(send, 405, "read-only", f"this server only reads: {scope['method']} is not served",
                             [(b"allow", b"GET, HEAD")])  # fmt: skip
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.allowed_hosts is not None and headers.get("host", "").lower() not in self.allowed_hosts:
            await self._page(send, 400, "unknown host", "this server answers only to the address it printed")
            return
        if self.token is not None:
            query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = (query.get("token") or [None])[0]
            if given is not None:
                if not hmac.compare_digest(given.encode(), self.token.encode()):
                    await self._page(
                        send, 403, "wrong token", "the token does not match the one the server printed"
                    )
                    return
                rest = {k: v for k, v in query.items() if k != "token"}
                # One leading slash: "//host/..." would be another site's address.
                target = "/" + (scope.get("root_path", "") + scope["path"]).lstrip("/")
                if rest:
                    target += "?" + urllib.parse.urlencode(rest, doseq=True)
                body = b""
                await send({"type": "http.response.start", "status": 303, "headers": [
                    (b"location", urllib.parse.quote(target, safe="/?=&%").encode()),
                    (b"set-cookie", f"{cookie_name(scope)}={self.token}; HttpOnly; SameSite=Strict; Path=/".encode()),
                    (b"content-length", b"0"), (b"cache-control", b"no-store"),
                    *[(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
            cookie = _cookie(headers.get("cookie", ""), cookie_name(scope))
            if cookie is None or not hmac.compare_digest(cookie.encode(), self.token.encode()):
                await self._page(send, 403, "token required", "open the address with ?token=... that "
                                 "`rollout-bundle serve` printed when it started")  # fmt: skip
                return
        started = False

        async def guarded(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {k.lower() for k, _ in message.get("headers", [])}
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + [
                    (k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items() if k.encode() not in names
                ]
            await send(message)

        try:
            await self.app(scope, receive, guarded)
        except Exception:  # the page says "internal error"; the traceback is the terminal's
            traceback.print_exc(file=sys.stderr)
            if not started:
                await self._page(send, 500, "internal error", "the server failed on this page; "
                                 "its terminal shows why")  # fmt: skip


def cookie_name(scope: Mapping[str, Any]) -> str:
    """The token cookie of the server answering ``scope``: :data:`TOKEN_COOKIE` and its port."""
    server = scope.get("server") or ("", 0)
    return f"{TOKEN_COOKIE}_{server[1]}"


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


# -- the diff pool ------------------------------------------------------------------------------------


class DiffPool:
    """``rollout-bundle diff A B --json``, the command itself, at most ``workers`` at once.

    A compare page runs a subprocess reading both bundles whole; forty at once (forty clicks, a
    crawler) were forty processes, and every other page waited behind them. Past ``workers``, a
    compare page is answered at once with a 503 that says to retry (a page thread never waits
    for a slot: Starlette's pool of page threads is shared by every route). Reports are kept by
    the pair's identities, at most ``capacity`` bytes of their JSON, least recently used out.
    """

    def __init__(self, workers: int, capacity: int = DIFF_CACHE_BYTES) -> None:
        self.workers = workers
        self.capacity = capacity
        self._slots = threading.BoundedSemaphore(workers)
        self._kept: OrderedDict[tuple[str, str, str | None], tuple[dict[str, Any], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def report(self, a: BundleEntry, b: BundleEntry, by: str | None = None) -> dict[str, Any] | str:
        """The report (``--by by`` when given), or why there is none; :class:`PageError` 503 when
        every slot is taken."""
        key = (a.identity, b.identity, by)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept[0]
        if not self._slots.acquire(blocking=False):
            raise PageError(503, "busy", f"{self.workers} comparisons are running; retry in a moment")
        try:
            cmd = [sys.executable, "-m", "trainer_hooks.cli", "diff", a.location, b.location, "--json"]
            cmd += ["--by", by] if by else []
            try:
                done = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=DIFF_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired:
                return f"rollout-bundle diff took more than {DIFF_TIMEOUT_S} s"
        finally:
            self._slots.release()
        if done.returncode not in (0, 1):
            return (done.stderr.strip().splitlines() or ["rollout-bundle diff failed"])[-1]
        try:
            report = json.loads(done.stdout)
        except ValueError:
            return "rollout-bundle diff printed no report"
        if not isinstance(report, dict):
            return "rollout-bundle diff printed no report"
        self._keep(key, report, len(done.stdout))
        return report

    def _keep(self, key: tuple[str, str, str | None], report: dict[str, Any], n: int) -> None:
        if n > self.capacity // 4:
            return
        with self._lock:
            old = self._kept.pop(key, None)
            self._bytes += n - (old[1] if old is not None else 0)
            self._kept[key] = (report, n)
            while self._bytes > self.capacity and self._kept:
                _, (_, dropped) = self._kept.popitem(last=False)
                self._bytes -= dropped


# -- the application --------------------------------------------------------------------------------


class ServeApp:
    """The state behind the routes: the run, its indexer, pictures, a sample cache."""

    def __init__(self, config: ServeConfig, run: Run | None = None) -> None:
        self.config = config
        self.env = environment()
        self.run = run if run is not None else Run(config.root, config.storage_options)
        config.cache_dir.mkdir(parents=True, exist_ok=True)
        self.indexer = Indexer(config.cache_dir, progress=config.progress)
        self.pictures = Pictures(config.cache_dir)
        self.samples = SampleCache(self.indexer)
        self.run.listeners.append(lambda e: self.indexer.add(e, priority=ix.WANTED + e.order))
        for e in self.run.ordered():
            self.indexer.add(e, priority=ix.WANTED + e.order)
        self._stop = threading.Event()
        if not self.run.listed.is_set() and not self.run.listing:  # the CLI's: listed while serving
            self.run.list_in_background(then=self._listed)
        self.diffs = DiffPool(DIFF_WORKERS)
        # Compiling a page's templates costs ~50 ms, once: done while the server starts and the
        # browser opens, not on the first page. The lock keeps a page from compiling a template
        # the warm-up is compiling (never held across more than one template's compilation).
        self._compiling = threading.Lock()
        threading.Thread(target=self._warm_templates, name="serve-templates", daemon=True).start()
        self._follower: threading.Thread | None = None
        if config.follow:
            self._follower = threading.Thread(target=self._follow, name="serve-follow", daemon=True)
            self._follower.start()

    def _follow(self) -> None:
        assert self.config.follow
        while not self._stop.wait(self.config.follow):
            try:
                self.run.refresh()
            except Exception as e:  # a listing that failed (a store's hiccup): tried again next time
                print(
                    f"rollout-bundle serve: warning: listing {self.config.root} failed: {e}", file=sys.stderr
                )

    def _listed(self) -> None:
        """Said on the terminal once the first listing is done (the server listened before it)."""
        print(f"rollout-bundle serve: {len(self.run.entries)} bundle(s) under {display(self.run.root)}",
              file=sys.stderr)  # fmt: skip
        for problem in list(self.run.problems.values()):
            print(
                f"rollout-bundle serve: warning: not served: {display(problem, limit=2000)}", file=sys.stderr
            )

    def _warm_templates(self) -> None:
        for name in WARM_TEMPLATES:
            if self._stop.is_set():
                return
            with self._compiling, contextlib.suppress(Exception):  # a broken one is the page's error to show
                self.env.get_template(name)

    def close(self) -> None:
        self._stop.set()
        self.indexer.close()
        self.run.close()

    # -- helpers --------------------------------------------------------------------------------------
    def render(self, template: str, **context: Any) -> str:
        context.setdefault("base", "")
        context.setdefault("crumbs", [])
        context.setdefault("refresh", None)
        context.setdefault("version", bundles.__version__)
        context.setdefault("samples_with_turns", [])
        context.setdefault("defs", [])
        with self._compiling:
            compiled = self.env.get_template(template)
        return str(compiled.render(**context))

    def error_page(self, status: int, heading: str, message: str) -> bytes:
        return self.render("error.html.j2", title=heading, status=status, heading=heading,
                           message=message).encode("utf-8")  # fmt: skip

    def entry(self, bid: str) -> BundleEntry:
        e = self.run.get(bid)
        if e is None:
            raise _not_found("no bundle of this run has that id")
        return e

    def img_url(self, entry: BundleEntry) -> Callable[[str, int], str]:
        return lambda name, w: f"/b/{entry.id}/img/{urllib.parse.quote(name)}?w={w}"

    def crumb(self, entry: BundleEntry) -> tuple[str, str]:
        return (f"/b/{entry.id}", entry.rel)

    def replay(self, entry: BundleEntry) -> dict[str, Any] | None:
        """The replay report lying beside a local bundle (``<bundle>.replay.json``, made by
        ``rollout-bundle replay --report``), checked to be of this bundle; read once."""
        if "replay" not in entry.extra:
            entry.extra["replay"] = None
            for candidate in _replay_candidates(entry.location):
                if (
                    not os.path.isfile(candidate)
                    or os.path.islink(candidate)
                    or not self.run.inside(candidate)
                ):
                    continue
                from trainer_hooks.replay import check_report_bundle, load_replay_report

                try:
                    report = load_replay_report(candidate)
                    check_report_bundle(report, entry.bundle, candidate)
                except BundleError as e:
                    entry.extra["replay"] = {"path": candidate, "error": str(e), "by_pos": {}, "problems": {}}
                    break
                summary = report.get("summary") or {}
                entry.extra["replay"] = {
                    "path": candidate, "error": None,
                    "by_pos": {s["position"]: s for s in report["samples"]},
                    "problems": summary.get("problems") if isinstance(summary.get("problems"), dict) else {},
                }  # fmt: skip
                break
        return entry.extra["replay"]

    def replay_note(self, entry: BundleEntry) -> str | None:
        r = self.replay(entry)
        if r is None:
            return None
        if r["error"]:
            return f"replay report beside the bundle not used: {r['error']}"
        counts = ", ".join(f"{k} {v}" for k, v in r["problems"].items()) or "none"
        return f"replay report {os.path.basename(r['path'])}: {len(r['by_pos'])} samples replayed; problems: {counts}"

    def entry_stats(self, entry: BundleEntry) -> list[dict[str, str]]:
        b = entry.bundle
        return [{"value": str(len(b)), "label": "samples"}, {"value": str(len(b.manifest.media)), "label": "media files"},
                {"value": size(b.stored_bytes), "label": b.location}]  # fmt: skip

    # -- pages ----------------------------------------------------------------------------------------
    def run_page(self, params: Mapping[str, str] | None = None) -> str:
        """The run: :data:`RUN_PAGE` bundles from ``?from=N`` (an offset into the run's order: an
        in-memory sorted list), trends from at most :data:`TREND_BUNDLES` bundles spread over the
        run; what it costs is bounded by the page, not by how many bundles the run holds."""
        every = self.run.ordered()
        start = _int((params or {}).get("from") or "0", "from")
        if start and start >= len(every):
            raise _not_found(f"the run holds {len(every)} bundles; there is none from {start}")
        shown = every[start : start + RUN_PAGE]
        rows = [self._run_row(e) for e in shown]
        step = max(1, -(-len(every) // TREND_BUNDLES))  # at most TREND_BUNDLES of them
        sampled = every[::step]
        trends = self._trends(sampled)
        pending = sum(1 for r in rows if not r["summary"] and not r["error"])
        total = sum(e.samples for e in every)
        stats = [{"value": str(len(every)), "label": "bundles"}, {"value": str(total), "label": "samples"}]
        name = os.path.basename(self.run.root.rstrip("/")) or self.run.root
        pages = {"first_href": "/" if start else None, "from": start + 1 if shown else 0, "to": start + len(shown),
                 "next_href": f"/?from={start + RUN_PAGE}" if start + RUN_PAGE < len(every) else None,
                 "prev_href": (f"/?from={max(0, start - RUN_PAGE)}" if start > RUN_PAGE else "/") if start else None,
                 "trend_note": f"trends from {len(sampled)} of {len(every)} bundles, spread over the run"
                 if step > 1 else None}  # fmt: skip
        listing = f"listing… {self.run.found} found so far" if self.run.listing else None
        return self.render("run.html.j2", title=name, root=self.run.root, root_name=name, rows=rows, trends=trends,
                           stats=stats, pending=pending, problems=list(self.run.problems.values())[:RUN_PAGE],
                           more_problems=max(0, len(self.run.problems) - RUN_PAGE), listing=listing, pages=pages,
                           follow=bool(self.config.follow),
                           refresh=5 if pending or listing or self.config.follow else None)  # fmt: skip

    def _run_row(self, e: BundleEntry) -> dict[str, Any]:
        st = self.indexer.state(e)
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

    def _trends(self, entries: list[BundleEntry]) -> list[dict[str, Any]]:
        # One line per kind: a run's checkpoints and its debug dumps are two series, not one.
        points: dict[tuple[str, str], list[tuple[int, float]]] = {}
        bands: dict[str, list[tuple[int, float, float]]] = {}
        for e in entries:
            s = self.indexer.state(e).summary if e.step is not None else None
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
                                ("turns", "turns (mean)"), ("truncated", "truncated (fraction)")):  # fmt: skip
                band = _by_step(bands.get(kind, [])) if name == "reward" else None
                chart = trend(title + suffix, _by_step(points.get((kind, name), [])), band)
                if chart:
                    trends.append(chart)
        return trends

    def bundle_page(self, entry: BundleEntry, params: Mapping[str, str]) -> str:
        q, shown = _query(params)
        st = self.indexer.want(entry, FIRST_PAGE_WAIT_S)
        base_href = f"/b/{entry.id}"
        ctx: dict[str, Any] = {"title": entry.rel, "kind": entry.kind, "step": entry.step, "name": entry.rel,
                               "location": entry.location, "stats": self.entry_stats(entry), "q": shown,
                               "sorts": list(ix.SORTS), "self_href": base_href, "groups_href": f"{base_href}/groups",
                               "crumbs": [(None, entry.rel)], "total": entry.samples, "rows": [], "matching": 0,
                               "status_options": [], "first_href": None, "next_href": None, "partial": False,
                               "indexed": st.rows, "state_note": None, "state_error": False,
                               "filtered": any(v for k, v in shown.items() if k not in ("sort", "order")),
                               "replay_note": self.replay_note(entry)}  # fmt: skip
        if st.error:
            ctx.update(state_note=st.error, state_error=True)
            return self.render("bundle.html.j2", **ctx)
        if not st.complete:
            ctx.update(partial=True, refresh=3,
                       state_note=f"indexing: {st.rows} of {st.total} samples so far; this page refreshes itself; "
                       "a group's page waits until the bundle is indexed")  # fmt: skip
            if st.rows == 0:
                return self.render("bundle.html.j2", **ctx)
        with self.indexer.connect(entry) as con:
            try:
                rows, matching, nxt = q.run(con)
            except sqlite3.OperationalError as e:  # a search SQLite refuses (its words are quoted)
                raise PageError(400, "bad search", f"q: the search cannot be run: {e}") from None
            ctx["status_options"] = ix.statuses(con)
        ctx["matching"] = matching
        for r in rows:
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
        ctx["rows"] = rows
        keep = {k: v for k, v in shown.items() if v not in ("", None)}
        if q.limit != PAGE:
            keep["limit"] = str(q.limit)
        if nxt is not None:
            ctx["next_href"] = (
                base_href + "?" + urllib.parse.urlencode({**keep, "after": f"{nxt[0]!r}:{nxt[1]}"})
            )
        if q.after is not None:
            ctx["first_href"] = base_href + ("?" + urllib.parse.urlencode(keep) if keep else "")
        return self.render("bundle.html.j2", **ctx)

    def groups_page(self, entry: BundleEntry, params: Mapping[str, str]) -> str:
        st = self.indexer.want(entry, FIRST_PAGE_WAIT_S)
        after = params.get("after") or None
        ctx: dict[str, Any] = {"title": f"{entry.rel} groups", "kind": entry.kind, "name": entry.rel,
                               "bundle_href": f"/b/{entry.id}", "crumbs": [self.crumb(entry), (None, "groups")],
                               "groups": [], "next_href": None, "first_href": None,
                               "state_note": None if st.complete else st.error or "indexing: groups are shown once "
                               "the bundle is indexed"}  # fmt: skip
        if st.complete:
            with self.indexer.connect(entry) as con:
                groups = ix.groups_page(con, after, PAGE + 1)
            for g in groups:
                g["href"] = f"/b/{entry.id}/group?g={urllib.parse.quote(g['grp'], safe='')}"
                g["flat"] = g["n"] > 1 and g["lo"] is not None and g["lo"] == g["hi"]
                g["range"] = "–" if g["lo"] is None else f"{g['lo']:.3g} … {g['hi']:.3g}"
                g["mean"] = fmt(g["mean"], 3)
            if len(groups) > PAGE:
                groups = groups[:PAGE]
                ctx["next_href"] = f"/b/{entry.id}/groups?" + urllib.parse.urlencode(
                    {"after": groups[-1]["grp"]}
                )
            if after:
                ctx["first_href"] = f"/b/{entry.id}/groups"
            ctx["groups"] = groups
        else:
            ctx["refresh"] = 3
        return self.render("groups.html.j2", **ctx)

    def group_page(self, entry: BundleEntry, group: str) -> str:
        st = self.indexer.want(entry, FIRST_PAGE_WAIT_S)
        if st.error:
            raise PageError(502, "cannot index the bundle", st.error)
        if not st.complete:  # a page that waits and refreshes itself, not a 503
            return self.render(
                "building.html.j2", **building_context(entry, st, f"group {group}", "the group")
            )
        with self.indexer.connect(entry) as con:
            members = ix.group_rows(con, group, GROUP_COLUMNS + 1)
            n = con.execute("SELECT count(*) FROM samples WHERE grp = ?", (group,)).fetchone()[0]
        if not members:
            raise _not_found(f"no sample of {entry.rel} is in group {group[:80]!r}")
        members = members[:GROUP_COLUMNS]
        views = self.samples.get(entry, [m["pos"] for m in members])
        infos = image_infos(self.pictures, entry, list(views.values()))
        defs: dict[str, dict[str, Any]] = {}
        columns = [sample_context(views[m["pos"]], infos, self.img_url(entry), f"/b/{entry.id}/s/{m['pos']}", m, defs)
                   for m in members]  # fmt: skip
        spread = reward_spread([m["reward"] for m in members if m["reward"] is not None])
        rows = list(range(max((len(c["turns"]) for c in columns), default=0)))
        return self.render("group.html.j2", title=f"group {group}", kind=entry.kind, name=entry.rel, group=group,
                           columns=columns, rows=rows, spread=spread, more=max(0, n - len(columns)),
                           crumbs=[self.crumb(entry), (f"/b/{entry.id}/groups", "groups"), (None, group)],
                           samples_with_turns=columns, defs=list(defs.values()))  # fmt: skip

    def sample_page(self, entry: BundleEntry, pos: int) -> str:
        n = entry.samples
        if not 0 <= pos < n:
            raise _not_found(f"{entry.rel} holds {n} samples (0..{n - 1}); there is no sample {pos}")
        view = self.samples.get(entry, [pos])[pos]
        row = self._row(entry, pos)
        infos = image_infos(self.pictures, entry, [view])
        defs: dict[str, dict[str, Any]] = {}
        s = sample_context(view, infos, self.img_url(entry), f"/b/{entry.id}/s/{pos}", row, defs)
        replay = self.replay(entry)
        if replay is not None and not replay["error"]:
            s["replay"] = replay_block(replay["by_pos"].get(pos))
        group_href = None
        if row is not None and row.get("grp") is not None:
            group_href = f"/b/{entry.id}/group?g={urllib.parse.quote(row['grp'], safe='')}"
        # Not indexed yet: the key from the sample itself (the same rule as the index's).
        key = (
            row["prompt_key"]
            if row is not None
            else ix.prompt_key({"metadata": view.metadata}, ix.prompt_text(view.prompt))
        )
        return self.render("sample.html.j2", title=f"{entry.rel} #{pos}", kind=entry.kind, name=entry.rel, pos=pos,
                           total=n, sample=s, bid=entry.id, bundle_href=f"/b/{entry.id}", group_href=group_href,
                           prompt_href=f"/prompt?key={urllib.parse.quote(key, safe='')}",
                           prev_href=f"/b/{entry.id}/s/{pos - 1}" if pos > 0 else None,
                           next_href=f"/b/{entry.id}/s/{pos + 1}" if pos + 1 < n else None,
                           bundles=self._nearest(entry),
                           crumbs=[self.crumb(entry), (None, f"#{pos}")], samples_with_turns=[s],
                           defs=list(defs.values()))  # fmt: skip

    def _nearest(self, entry: BundleEntry) -> list[dict[str, str]]:
        """The bundles a sample page offers to compare with: :data:`PICK_BUNDLES` around ``entry``."""
        every = self.run.ordered()
        lo = max(0, min(entry.order - PICK_BUNDLES // 2, len(every) - PICK_BUNDLES))
        return [{"id": e.id, "rel": e.rel} for e in every[lo : lo + PICK_BUNDLES]]

    def _row(self, entry: BundleEntry, pos: int) -> dict[str, Any] | None:
        st = self.indexer.state(entry)
        if not st.complete and st.rows <= pos:
            return None
        with self.indexer.connect(entry) as con:
            return ix.row_at(con, pos)

    def image(self, entry: BundleEntry, name: str, width: int) -> bytes:
        out = self.pictures.jpeg(entry, name, width)
        if isinstance(out, str):
            raise _not_found(out)
        return out

    def prompt_page(self, params: Mapping[str, str]) -> str:
        key = params.get("key", "")
        if not key or len(key) > 400:
            raise PageError(400, "no prompt", "key: expected a prompt key from a bundle page's prompt link")
        rows, points, pending, head = [], [], 0, key
        holders: list[tuple[BundleEntry, list[dict[str, Any]]]] = []
        for e in self.run.ordered():
            st = self.indexer.state(e)
            if not st.complete:
                pending += 0 if st.error else 1
                if st.rows == 0:
                    continue
            with self.indexer.connect(e) as con:
                found = ix.prompt_rows(con, key, 64)
            if not found:
                continue
            head = found[0]["prompt_head"] or head
            rewards = [f["reward"] for f in found if f["reward"] is not None]
            mean = math.fsum(rewards) / len(rewards) if rewards else None
            counts: dict[str, int] = {}
            for f in found:
                counts[f["status"] or "no status"] = counts.get(f["status"] or "no status", 0) + 1
            rows.append({"step": "–" if e.step is None else e.step, "rel": e.rel, "href": f"/b/{e.id}", "n": len(found),
                         "mean": fmt(mean, 3), "statuses": [(badge(k), v) for k, v in counts.items()],
                         "samples": [{"pos": f["pos"], "href": f"/b/{e.id}/s/{f['pos']}"} for f in found[:12]]})  # fmt: skip
            if e.step is not None and mean is not None:
                points.append((e.step, mean))
            holders.append((e, found))
        choices = [
            {"id": e.id, "label": f"step {e.step} · {e.rel}" if e.step is not None else e.rel}
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
            labels[k] = f"step {e.step} · {e.rel}" if e.step is not None else e.rel
            chosen = found[:PROMPT_SAMPLES]
            views = self.samples.get(e, [f["pos"] for f in chosen])
            infos = image_infos(self.pictures, e, list(views.values()), budget)
            sides[k] = [sample_context(views[f["pos"]], infos, self.img_url(e), f"/b/{e.id}/s/{f['pos']}", None, defs,
                                       uid=f"{'ab'[k]}{e.id[:4]}") for f in chosen]  # fmt: skip
        return self.render("prompt.html.j2", title="prompt across training", key=key, head=head[:160], rows=rows,
                           trend=trend("reward of this prompt by step (mean)", _by_step(points)), pending=pending,
                           choices=choices, a_id=a_id, b_id=b_id, left=sides[0], right=sides[1],
                           left_label=labels[0], right_label=labels[1], self_href="/prompt",
                           refresh=5 if pending else None, crumbs=[(None, "prompt")],
                           samples_with_turns=sides[0] + sides[1], defs=list(defs.values()))  # fmt: skip

    def compare_page(self, a: BundleEntry, b: BundleEntry) -> str:
        # Samples matched by their index (`diff --by index`), as a trainer numbers them; by
        # position only where an index is missing or repeats, and the page says so.
        report, note = self._diff(a, b, "index"), None
        if isinstance(report, str) and (
            "to match samples by" in report or "matching needs a key path" in report
        ):
            report, note = self._diff(a, b, None), f"matched by position: {report}"
        if isinstance(report, str):
            return self.render("compare.html.j2", title="compare", a=a, b=b, error=report, cmp=None,
                               crumbs=[(None, "compare")])  # fmt: skip
        cmp = compare_context(report, a, b, self.indexer, note)
        return self.render("compare.html.j2", title="compare", a=a, b=b, error=None, cmp=cmp,
                           crumbs=[(None, "compare")])  # fmt: skip

    def _diff(self, a: BundleEntry, b: BundleEntry, by: str | None = None) -> dict[str, Any] | str:
        """What ``rollout-bundle diff A B [--by KEY] --json`` reports: :attr:`diffs`' (a bounded pool)."""
        return self.diffs.report(a, b, by)

    def compare_samples_page(self, a: BundleEntry, i: int, b: BundleEntry, j: int) -> str:
        for e, p in ((a, i), (b, j)):
            if not 0 <= p < e.samples:
                raise _not_found(f"{e.rel} holds {e.samples} samples; there is no sample {p}")
        va = self.samples.get(a, [i])[i]
        vb = self.samples.get(b, [j])[j]
        defs: dict[str, dict[str, Any]] = {}
        budget = PixelBudget()  # both samples' pictures together
        ia = image_infos(self.pictures, a, [va], budget)
        ib = image_infos(self.pictures, b, [vb], budget)
        left = sample_context(va, ia, self.img_url(a), f"/b/{a.id}/s/{i}", self._row(a, i), defs, uid="l")
        right = sample_context(vb, ib, self.img_url(b), f"/b/{b.id}/s/{j}", self._row(b, j), defs, uid="r")
        changes = _sample_changes(va, vb)
        return self.render("compare_samples.html.j2", title="compare samples", left=left, right=right,
                           left_name=a.rel, right_name=b.rel, changes=changes[:50], more=max(0, len(changes) - 50),
                           crumbs=[(None, "compare samples")], samples_with_turns=[left, right],
                           defs=list(defs.values()))  # fmt: skip


def _replay_candidates(location: str) -> list[str]:
    # ``replay --report`` writes beside the bundle: ``<bundle>.replay.json``, or for a packed
    # file the name without its extension (``run_3.rbundle`` -> ``run_3.replay.json``).
    stem = posixpath.splitext(location)[0]
    return list(dict.fromkeys([f"{location}.replay.json", f"{stem}.replay.json"]))


def _by_step(points: list[Any]) -> list[Any]:
    return sorted(points, key=lambda p: p[0])


def _sample_changes(a: Any, b: Any) -> list[str]:
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


def _query(params: Mapping[str, str]) -> tuple[Query, dict[str, str]]:
    """The bundle page's query string as a :class:`Query`; a value that does not parse is a 400."""
    shown = {k: params.get(k, "") for k in ("q", "status", "group", "reward_min", "reward_max", "length_min",
                                            "length_max", "turns_min", "turns_max", "sort", "order")}  # fmt: skip
    q = Query()
    q.search = shown["q"][:400] or None
    q.status = shown["status"][:64] or None
    q.group = shown["group"][:200] or None

    def number(name: str, integer: bool) -> Any:
        text = shown[name].strip()
        if not text:
            return None
        try:
            v = int(text) if integer else float(text)
        except ValueError:
            raise PageError(400, "bad filter", f"{name}: expected {'an integer' if integer else 'a number'}, "
                            f"found {text[:40]!r}") from None  # fmt: skip
        if not integer and not math.isfinite(v):
            raise PageError(400, "bad filter", f"{name}: expected a finite number, found {text[:40]!r}")
        if integer and abs(v) >= 2**62:
            raise PageError(400, "bad filter", f"{name}: out of range")
        return v

    q.reward_min, q.reward_max = number("reward_min", False), number("reward_max", False)
    q.length_min, q.length_max = number("length_min", True), number("length_max", True)
    q.turns_min, q.turns_max = number("turns_min", True), number("turns_max", True)
    sort = shown["sort"] or "position"
    if sort not in ix.SORTS:
        raise PageError(400, "bad sort", f"sort: expected one of {', '.join(ix.SORTS)}, found {sort[:40]!r}")
    q.sort, shown["sort"] = sort, sort
    order = shown["order"] or "asc"
    if order not in ("asc", "desc"):
        raise PageError(400, "bad order", f"order: expected asc or desc, found {order[:40]!r}")
    q.desc, shown["order"] = order == "desc", order
    after = params.get("after")
    if after:
        value, _, pos = after.rpartition(":")
        try:
            v, p = float(value), int(pos)
        except ValueError:
            raise PageError(
                400, "bad page", f"after: expected <value>:<position>, found {after[:60]!r}"
            ) from None
        if not math.isfinite(v) or not 0 <= p < 2**62:  # SQLite's integers end at 2**63
            raise PageError(400, "bad page", f"after: out of range: {after[:60]!r}")
        q.after = (v, p)
    limit = params.get("limit")
    if limit:
        try:
            q.limit = max(1, min(MAX_PAGE, int(limit)))
        except ValueError:
            raise PageError(400, "bad limit", f"limit: expected an integer, found {limit[:20]!r}") from None
    else:
        q.limit = PAGE
    return q, shown


# -- Starlette ------------------------------------------------------------------------------------------


def create_app(
    root: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    follow: float | None = None,
    progress: bool | None = False,
    storage_options: dict[str, Any] | None = None,
    allowed_hosts: list[str] | None = None,
    list_in_background: bool = False,
) -> Any:
    """The ASGI application serving the run (or bundle) at ``root``, read-only.

    Args:
        root: a run directory, a bundle (directory or packed file), or a store URL.
        cache_dir: where indexes and thumbnails are kept (default ``~/.cache/rollout-bundles/serve``).
        token: when set, every request must carry it (``?token=`` once, then a cookie).
        follow: list ``root`` again every ``follow`` seconds, adding bundles committed since.
        progress: draw a progress line while an index builds (None: on a terminal).
        storage_options: for a store URL, as :func:`bundles.open_bundle` takes them.
        allowed_hosts: ``Host`` headers answered (``["127.0.0.1:8000", "localhost:8000"]``);
            None answers any.
        list_in_background: list ``root`` in a thread, as ``rollout-bundle serve`` does (the
            app answers at once; the run page says how many bundles were found so far);
            False lists it before this returns.

    Returns:
        A Starlette application; ``app.state.serve`` is the state behind it (its ``close()``
        stops the background threads; the app's shutdown calls it).
    """
    from starlette.applications import Starlette  # noqa: F401  (the [serve] extra, checked first)

    config = ServeConfig(str(os.fspath(root)), Path(cache_dir) if cache_dir is not None else default_cache_dir(),
                         token=token, follow=follow, progress=progress, storage_options=storage_options,
                         allowed_hosts=allowed_hosts)  # fmt: skip
    run = Run(config.root, storage_options, list_now=not list_in_background)
    return asgi_app(ServeApp(config, run))


def asgi_app(state: ServeApp) -> Any:
    """The Starlette application over ``state`` (what :func:`create_app` returns).

    Its routes are :func:`_page_routes` (HTML pages) and :func:`_asset_routes` (pictures, the
    stylesheet); an unknown address or a refused method is :func:`_http_error`'s page; the app's
    shutdown closes ``state``; :class:`Guard` wraps it all.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        state.close()

    app = Starlette(routes=[*_page_routes(state), *_asset_routes(state)],
                    exception_handlers={HTTPException: _http_error(state)}, lifespan=lifespan)  # fmt: skip
    app.state.serve = state
    app.add_middleware(
        Guard, token=state.config.token, allowed_hosts=state.config.allowed_hosts, error_page=state.error_page
    )
    return app


def _html(text: str, status: int = 200) -> Any:
    """An HTML response never cached (pages follow the index as it grows)."""
    from starlette.responses import HTMLResponse

    return HTMLResponse(text, status_code=status, headers={"cache-control": "no-store"})


def _error_html(state: ServeApp, status: int, heading: str, message: str) -> Any:
    return _html(state.error_page(status, heading, message).decode(), status)


def _page(state: ServeApp, fn: Callable[[Any], str]) -> Callable[[Any], Any]:
    """An endpoint answering ``fn(request)``'s HTML; a refused request or an unreadable bundle is a page."""

    def endpoint(request: Any) -> Any:
        try:
            return _html(fn(request))
        except PageError as e:
            return _error_html(state, e.status, e.heading, e.message)
        except BundleError as e:  # the bundle's problem, named: a page, not a traceback
            return _error_html(state, 502, "cannot read the bundle", display(str(e), MAX_SHOWN_CHARS))
        except sqlite3.DatabaseError:  # a cached index damaged after it was opened; its path is not shown
            return _error_html(state, 503, "index unreadable", "this bundle's cached index cannot be read; "
                               "delete serve's cache (--cache-dir) to have it built again")  # fmt: skip

    return endpoint


def _page_routes(state: ServeApp) -> list[Any]:
    """The HTML pages: the run, a bundle (its groups, a group, a sample), a prompt, the comparisons."""
    from starlette.routing import Route

    def bundle_id(request: Any) -> BundleEntry:
        return state.entry(request.path_params["bid"])

    def group(request: Any) -> str:
        g = request.query_params.get("g", "")
        if not g or len(g) > 200:
            raise PageError(400, "no group", "g: expected a group name from the groups page")
        return state.group_page(bundle_id(request), g)

    def sample(request: Any) -> str:
        return state.sample_page(bundle_id(request), _int(request.path_params["pos"], "position"))

    def compare(request: Any) -> str:
        p = request.query_params
        return state.compare_page(state.entry(p.get("a", "")), state.entry(p.get("b", "")))

    def compare_samples(request: Any) -> str:
        p = request.query_params
        return state.compare_samples_page(state.entry(p.get("a", "")), _int(p.get("i", ""), "i"),
                                          state.entry(p.get("b", "")), _int(p.get("j", ""), "j"))  # fmt: skip

    pages: list[tuple[str, Callable[[Any], str]]] = [
        ("/", lambda request: state.run_page(request.query_params)),
        ("/b/{bid}", lambda request: state.bundle_page(bundle_id(request), request.query_params)),
        ("/b/{bid}/groups", lambda request: state.groups_page(bundle_id(request), request.query_params)),
        ("/b/{bid}/group", group),
        ("/b/{bid}/s/{pos}", sample),
        ("/prompt", lambda request: state.prompt_page(request.query_params)),
        ("/compare", compare),
        ("/compare/samples", compare_samples),
    ]
    return [Route(path, _page(state, fn)) for path, fn in pages]


def _asset_routes(state: ServeApp) -> list[Any]:
    """What a page loads: a bundle's pictures as JPEG, the stylesheet, and no favicon."""
    from starlette.responses import Response
    from starlette.routing import Route

    def image(request: Any) -> Any:
        try:
            entry = state.entry(request.path_params["bid"])
            w = _int(request.query_params.get("w", "320"), "w")
            if w not in WIDTHS:
                raise PageError(
                    400, "bad width", f"w: expected one of {', '.join(map(str, WIDTHS))}, found {w}"
                )
            data = state.image(entry, request.path_params["name"], w)
        except PageError as e:
            return _error_html(state, e.status, e.heading, e.message)
        except BundleError as e:
            return _error_html(state, 502, "cannot read the picture", display(str(e), MAX_SHOWN_CHARS))
        return Response(
            data, media_type="image/jpeg", headers={"cache-control": "private, max-age=86400, immutable"}
        )

    def style(request: Any) -> Any:
        return Response(stylesheet(), media_type="text/css; charset=utf-8",
                        headers={"cache-control": "private, max-age=3600"})  # fmt: skip

    return [
        Route("/static/style.css", style),
        Route("/favicon.ico", lambda request: Response(status_code=204)),  # no icon; no 404 in the console
        Route("/b/{bid}/img/{name}", image),
    ]


def _http_error(state: ServeApp) -> Callable[[Any, Exception], Any]:
    """The handler of Starlette's HTTP exceptions (no route, a refused method): a page."""
    from starlette.exceptions import HTTPException

    def handler(request: Any, exc: Exception) -> Any:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        heading = "not found" if status == 404 else "refused"
        return _error_html(state, status, heading, "no page of this server has that address")

    return handler


def _int(text: str, name: str) -> int:
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise PageError(400, "bad number", f"{name}: expected an integer, found {str(text)[:40]!r}") from None
    if n < 0 or n >= 2**62:
        raise PageError(404, "not found", f"{name}: {n} is out of range")
    return n


def new_token() -> str:
    return secrets.token_urlsafe(32)
