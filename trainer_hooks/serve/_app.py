"""The state behind the routes: :class:`ServeApp`, where a page's data comes from.

One per served root, built by :func:`~trainer_hooks.serve._routes.create_app`: the run
(:class:`~trainer_hooks.serve._run.Run`, its bundles found once and again on ``--follow``), their
indexes (:class:`~trainer_hooks.serve._index.Indexer`, built in the background), the pictures
(:class:`~trainer_hooks.serve._media.Pictures`, cached by digest), the samples a page shows
(:class:`SampleCache`: from the index, else read from the bundle), the replay report beside a
bundle (read once, checked to be of that bundle), the ``diff`` reports (:class:`DiffPool`, a
bounded pool), and the one Jinja2 environment of :mod:`trainer_hooks.pages`, its templates
compiled in the background at start. The pages (:mod:`~trainer_hooks.serve._pages`) ask it for
data and it never asks them anything.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import posixpath
import stat
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bundles
from bundles import BundleError
from bundles.support import LIMITS, display
from trainer_hooks.pages import SampleView, environment, finite, logprob_summary, sample_view
from trainer_hooks.serve._index import WANTED, Indexer
from trainer_hooks.serve._media import ImageInfo, Pictures, PixelBudget
from trainer_hooks.serve._query import PageError, not_found
from trainer_hooks.serve._run import BundleEntry, Run

__all__ = ["DiffPool", "SampleCache", "ServeApp", "ServeConfig", "default_cache_dir", "image_infos"]

#: Compiled in the background at start, a bundle's first page first (with what it extends and
#: imports: Jinja2 loads those when a page is rendered, not when it is compiled).
WARM_TEMPLATES = ("bundle.html.j2", "base.html.j2", "macros.html.j2", "run.html.j2", "sample.html.j2",
                  "sample_block.html.j2", "images.html.j2", "turn.html.j2", "error.html.j2", "prompt.html.j2")  # fmt: skip
DIFF_WORKERS = 2  # `rollout-bundle diff` processes at once; a compare past them is told to retry
DIFF_TIMEOUT_S = 300
DIFF_CACHE_BYTES = 16 * 1024 * 1024  # diff reports kept, by the bytes of their JSON


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


#: Bytes of sample views the cache keeps, all together (a view is cut to what a page shows, so
#: this holds hundreds of ordinary samples; a view larger than a quarter of it is not kept).
SAMPLE_CACHE_BYTES = 32 * 1024 * 1024


def view_size(v: SampleView) -> int:
    """About how many bytes ``v`` holds: its JSON text (what the index stores, uncompressed)."""
    fields = {f: getattr(v, f) for f in ("prompt", "response", "actions", "metadata", "other", "tool_calls")}
    text = json.dumps(fields, default=str, check_circular=False)
    return len(text) + 8 * len(v.logprobs or ()) + 200 * len(v.images) + 500


class SampleCache:
    """Samples as their views: from the index when it holds them (no shard read), else read from
    the bundle; the last few kept (a sample page opened twice reads nothing twice), at most
    ``capacity`` bytes of views in all (:func:`view_size`), least recently used first out."""

    def __init__(self, indexer: Indexer, capacity: int = SAMPLE_CACHE_BYTES) -> None:
        self.indexer = indexer
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, int], tuple[SampleView, int]] = (
            OrderedDict()
        )  # (identity, position)
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """Bytes of views kept now."""
        return self._bytes

    def _keep(self, key: tuple[str, int], v: SampleView) -> None:
        n = view_size(v)
        if n > self.capacity // 4:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes -= old[1] if old is not None else 0
            self._items[key] = (v, n)
            self._bytes += n
            while self._bytes > self.capacity and self._items:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def get(self, entry: BundleEntry, positions: Sequence[int]) -> dict[int, SampleView]:
        out: dict[int, SampleView] = {}
        missing = []
        with self._lock:
            for p in positions:
                kept = self._items.get((entry.identity, p))
                if kept is None:
                    missing.append(p)
                else:
                    self._items.move_to_end((entry.identity, p))
                    out[p] = kept[0]
        if missing:
            stored = self.indexer.views(entry, missing)
            out.update(stored)
            missing = [p for p in missing if p not in stored]
        if missing:
            prefix = entry.media_prefix()
            wanted = sorted(set(missing))
            for p, s in zip(wanted, entry.bundle.samples(indices=wanted), strict=True):
                v = sample_view(p, s, prefix)
                del s
                out[p] = v
                self._keep((entry.identity, p), v)
        return out


def image_infos(pictures: Pictures, entry: BundleEntry, views: Sequence[SampleView],
                budget: PixelBudget | None = None) -> dict[str, ImageInfo]:  # fmt: skip
    """The pictures of ``views``, decoded within ``budget`` (the page's: pass one page's budget to
    every call for that page)."""
    names = list(dict.fromkeys(img.name for v in views for img in v.images if img.name))
    budget = budget or PixelBudget()
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(names, pool.map(lambda n: pictures.info(entry, n, budget), names), strict=True))


class ServeApp:
    """The state behind the routes: the run, its indexer, pictures, a sample cache."""

    def __init__(self, config: ServeConfig, run: Run | None = None, others: Sequence[Run] = ()) -> None:
        self.config = config
        self.env = environment()
        self.run = run if run is not None else Run(config.root, config.storage_options)
        #: Every run served: ``run`` (the one ``/`` shows) first, then the others ``/runs`` compares it with.
        self.runs = [self.run, *others]
        config.cache_dir.mkdir(parents=True, exist_ok=True)
        self.indexer = Indexer(config.cache_dir, progress=config.progress)
        self.pictures = Pictures(config.cache_dir)
        self.samples = SampleCache(self.indexer)
        self._stop = threading.Event()
        for r in self.runs:
            r.listeners.append(lambda e: self.indexer.add(e, priority=WANTED + e.order))
            for e in r.ordered():
                self.indexer.add(e, priority=WANTED + e.order)
            if not r.listed.is_set() and not r.listing:  # the CLI's: listed while serving
                r.list_in_background(then=functools.partial(self._listed, r))
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
            for r in self.runs:
                try:
                    r.refresh()
                except Exception as e:  # a listing that failed (a store's hiccup): tried again next time
                    print(f"rollout-bundle serve: warning: listing {r.root} failed: {e}", file=sys.stderr)

    def _listed(self, run: Run) -> None:
        """Said on the terminal once the first listing is done (the server listened before it)."""
        print(f"rollout-bundle serve: {len(run.entries)} bundle(s) under {display(run.root)}",
              file=sys.stderr)  # fmt: skip
        for problem in list(run.problems.values()):
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
        for r in self.runs:
            r.close()

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
        e = next((e for r in self.runs if (e := r.get(bid)) is not None), None)
        if e is None:
            raise not_found("no bundle of this run has that id")
        return e

    def run_of(self, entry: BundleEntry) -> Run:
        """The served run that lists ``entry`` (the first, for an entry no run lists any more)."""
        return next((r for r in self.runs if r.get(entry.id) is entry), self.run)

    def entries(self) -> list[tuple[Run, BundleEntry]]:
        """Every bundle of every run served, each run's in its order."""
        return [(r, e) for r in self.runs for e in r.ordered()]

    def replay(self, entry: BundleEntry) -> dict[str, Any] | None:
        """The replay report lying beside a local bundle (``<bundle>.replay.json``, made by
        ``rollout-bundle replay --report``), checked to be of this bundle; read once."""
        if "replay" not in entry.extra:
            entry.extra["replay"] = None
            for candidate in _replay_candidates(entry.location):
                if (
                    not os.path.isfile(candidate)
                    or os.path.islink(candidate)
                    or not self.run_of(entry).inside(candidate)
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
                    "logprob": logprob_summary(report),
                }  # fmt: skip
                entry.extra["mismatch"] = _mismatch_figures(report)
                break
        return entry.extra["replay"]

    def mismatch(self, entry: BundleEntry, budget: dict[str, int] | None = None) -> dict[str, float] | None:
        """The bundle's log-prob mismatch figures (:func:`_mismatch_figures`) from the replay
        report beside it, for the run page's trend; None without one. The figures are kept when
        the bundle (and its report's samples) are let go, so a run page reads each report once;
        a report not there yet is looked for again (two ``stat`` calls) on the next page.

        With a ``budget`` (``{"bytes", "reads", "deferred"}``: the page's), a report is read only
        while the page has a read left (each read also opens the bundle to check the report is
        of it) and bytes for it: its size, at most ``MAX_REPORT_BYTES`` + 1 (what the reader
        reads); otherwise it is counted in ``deferred`` for a later load. A report the bundle
        page already read costs nothing; a file over ``MAX_REPORT_BYTES`` is refused unread (no
        point, and never deferred)."""
        if "mismatch" not in entry.extra and "replay" in entry.extra:
            entry.extra["mismatch"] = None  # read (by the bundle page) and refused
        if "mismatch" not in entry.extra:
            size = next(
                (n for n in map(_file_size, _replay_candidates(entry.location)) if n is not None), None
            )
            if size is None:
                return None
            if size > LIMITS["MAX_REPORT_BYTES"]:
                entry.extra["mismatch"] = None  # the reader would refuse it: no point
                return None
            if budget is not None:
                if size > budget["bytes"] or budget["reads"] <= 0:
                    budget["deferred"] += 1
                    return None
                budget["bytes"] -= size + 1
                budget["reads"] -= 1
            entry.extra["mismatch"] = None  # unless the report is of this bundle and read
            self.replay(entry)
        figures: dict[str, float] | None = entry.extra["mismatch"]
        return figures

    def image(self, entry: BundleEntry, name: str, width: int) -> bytes:
        out = self.pictures.jpeg(entry, name, width)
        if isinstance(out, str):
            raise not_found(out)
        return out


def _file_size(path: str) -> int | None:
    """The size of the regular file at ``path`` (not followed if a symlink), None otherwise."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _replay_candidates(location: str) -> list[str]:
    # ``replay --report`` writes beside the bundle: ``<bundle>.replay.json``, or for a packed
    # file the name without its extension (``run_3.rbundle`` -> ``run_3.replay.json``).
    stem = posixpath.splitext(location)[0]
    return list(dict.fromkeys([f"{location}.replay.json", f"{stem}.replay.json"]))


def _mismatch_figures(report: dict[str, Any]) -> dict[str, float] | None:
    """What the run page's trend draws of a report's ``summary.logprob``: the mean, p50, p99 and
    max of the samples' ``mean_abs`` and the k3 estimate, each a finite number or left out."""
    summary = report.get("summary")
    s = summary.get("logprob") if isinstance(summary, dict) else None
    if not isinstance(s, dict):
        return None
    dist: dict[str, Any] = s["mean_abs"] if isinstance(s.get("mean_abs"), dict) else {}
    figures = {k: finite(dist.get(k)) for k in ("mean", "p50", "p99", "max")} | {"k3": finite(s.get("k3"))}
    return {k: v for k, v in figures.items() if v is not None} or None
