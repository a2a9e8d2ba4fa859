"""One self-contained HTML page for a bundle: :func:`write_html_report`.

The page is a single file a person can mail or attach to a bug: the stylesheet is inlined, the
screenshots are small JPEG thumbnails inlined as ``data:`` URIs, and a Content-Security-Policy
forbids scripts and every network fetch, so opening it never reaches anything.

Each stored screenshot is inlined once, as an SVG ``<image>`` in one hidden ``<defs>``, and every
turn that shows it draws it with ``<use href="#m7">``: a trajectory's samples often repeat the
same screenshots, and inlining per occurrence made a 600-screenshot dump a 32 MiB page instead of
about 8. No script is needed for that, so the page still runs none.

The work is split by concern: :func:`trainer_hooks.pages.sample_view` reads each sample down to
what the page shows (any legal value, never a crash), :mod:`~trainer_hooks.view._media` reads and
decodes each stored screenshot once (PNG/JPEG only, through :func:`bundles.decode_image`),
:mod:`~trainer_hooks.view._context` turns both into plain data, and Jinja2 templates with
autoescaping write the HTML (``templates/report.html.j2``, drawing each sample with the
presentation layer's ``sample_block``, through :func:`trainer_hooks.pages.render`), so no string
from the bundle is escaped by hand.

A thumbnail links to the full-size image by a relative path when the bundle is a directory, so
the link works while the bundle sits where it was next to the report (move them together); only
stored ``.png``/``.jpg``/``.jpeg`` files that decoded are linked. A packed bundle has no files to
link to; its inlined pictures are all there is.

Samples are read one shard at a time and reduced to what the page shows before the next is read,
so a dump that holds processor tensors does not have to fit in memory.

A large bundle is written as pages of ``page_size`` samples (default 500: ``report.html``,
``report-2.html``, ...), each linked to the others and to ``rollout-bundle serve``, rather than
cut at a cap. Why pages: the static export is what one attaches to a bug or copies off a cluster,
and a cap would silently drop the samples one may have come for (the failing one is rarely among
the first 1,000); pages keep every sample in the export while each page stays the size a browser
draws at once. One page of 10,000 samples was 42 MB, took Chromium 14 s to load and the writer
914 MB of memory; as 20 pages of 500 each is 2.1 MB and loads in 0.6 s, and the writer holds one
page's samples and pictures at a time (135 MB peak), for the same total time (30 s, linear in the
bundle). What pages give up is the whole-bundle view: each page's filters, sorting, histograms and
groups act on its own samples (a GRPO group cut by a page boundary shows its part on each page),
and the search page still holds every sample. Filtering, sorting and searching all of a large
bundle is what ``rollout-bundle serve`` is for; each page says so. ``page_size=0`` writes the
single page of before.

With a replay report (``rollout-bundle replay --report``), each sample also shows its guard and
token-check problems, per-image vision and placeholder token counts and the rebuilt tensors'
shapes, and the log-prob differences when the report has them.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bundles
from bundles import Bundle, BundleError, BundleIOError, BundleVerificationError, open_bundle
from bundles.support import MEDIA_DIR, atomic_write
from trainer_hooks.pages import render, sample_view, stored_media
from trainer_hooks.replay import REPORT_FORMAT as REPLAY_FORMAT
from trainer_hooks.replay import ReportError, check_replay_report, check_report_bundle, load_replay_report
from trainer_hooks.view._context import page_context
from trainer_hooks.view._media import pictures
from trainer_hooks.view._search import render_search, search_rows

__all__ = [
    "PAGE_SIZE",
    "REPLAY_FORMAT",
    "THUMB_WIDTH",
    "ReportError",
    "ReportWritten",
    "load_replay_report",
    "write_html_report",
]

THUMB_WIDTH = 320  # px; a 1080p screenshot becomes a ~6-12 KB JPEG
LARGE_WIDTH = 1280  # px: the large view's inlined JPEG, wide enough for a screenshot's text
INLINE_BUDGET = 8 * 2**20  # bytes of inlined large views per page (beyond: linked, or the thumbnail)
SMALL_DUMP = 24  # distinct screenshots up to which a directory bundle's page inlines its large views
PAGE_SIZE = 500  # samples per page of a report (about 2 MB, 1.5 s to write, 0.6 s to load in Chromium)


@dataclass(frozen=True)
class ReportWritten:
    path: Path
    samples: int  # samples shown
    images: int  # thumbnails shown (occurrences)
    bytes: int  # size of the HTML file
    not_shown: list[str] = field(default_factory=list)  # one line per stored file that cannot be shown
    missing: list[str] = field(default_factory=list)  # media files listed in the manifest but missing
    search: Path | None = None  # the search page written beside the report
    pages: list[Path] = field(default_factory=list)  # every page written, the first being ``path``


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
    """Replace ``out`` with ``data`` by the project's one atomic write (not durable: a report can
    be written again); a failure names the report, never the temporary file."""
    try:
        atomic_write(out, data)
    except OSError as err:
        if isinstance(err, BundleError):
            raise
        raise BundleIOError.wrap(out, "write the report", OSError(err.errno, err.strerror)) from err


def write_html_report(
    bundle: Bundle | str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    replay: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    limit: int | None = None,
    samples: Sequence[int] | None = None,
    thumb_width: int = THUMB_WIDTH,
    large_width: int = LARGE_WIDTH,
    inline_budget: int = INLINE_BUDGET,
    search: bool = True,
    progress: bool | None = None,
    page_size: int | None = PAGE_SIZE,
) -> ReportWritten:
    """Write self-contained HTML pages describing ``bundle``: ``output``, and for more than
    ``page_size`` samples ``<stem>-2.html``, ``<stem>-3.html``, ... beside it (each atomically).

    Args:
        bundle: an open bundle, or the path of a bundle directory or packed file.
        output: the HTML file to write; its directory must exist.
        replay: a replay report (``rollout-bundle replay --report``), as a dict or a JSON path.
        limit: show at most this many samples (after ``samples``); at least 1, None for all.
        samples: positions of the samples to show, in this order (default: all, in order).
        thumb_width: thumbnail width in pixels.
        large_width: width in pixels of the large views inlined in the page.
        inline_budget: bytes of inlined large views at most (0: none), for a packed bundle or a
            directory bundle of at most ``SMALL_DUMP`` distinct screenshots. Beyond it, and for
            larger directory bundles, a large view shows the stored file beside the page (only
            ``.png``/``.jpg``/``.jpeg`` files), or the thumbnail enlarged (a packed bundle).
        search: also write the search page, ``<output stem>.search.html`` beside the report
            (the report itself runs no script; see :func:`~trainer_hooks.view._search.render_search`).
        progress: draw a progress line while making thumbnails (default: on a terminal).
        page_size: samples per page (default ``PAGE_SIZE``); 0 or None: every sample on one page.

    Raises:
        BundleError: the bundle cannot be read, a position is out of range, or the replay report
            is not one (:class:`ReportError`).
    """
    out = _checked_output(output, limit, page_size)
    b, missing = (bundle, []) if isinstance(bundle, Bundle) else _open(bundle)
    report, replay_name = _replay_of(replay, b)
    positions = _shown_positions(b, samples, limit)
    step = page_size or len(positions) or 1
    chunks = [positions[k : k + step] for k in range(0, len(positions), step)] or [[]]  # fmt: skip
    paths = [out] + [out.with_name(f"{out.stem}-{k + 1}{out.suffix}") for k in range(1, len(chunks))]
    search_path = out.with_name(out.stem + ".search.html") if search else None
    rows: list[dict[str, str]] = []
    written: list[_PageWritten] = []
    for k, chunk in enumerate(chunks):
        nav = _pages_nav(b, paths, k, chunk, len(positions)) if len(chunks) > 1 else None
        written.append(_write_page(b, chunk, paths[k], nav=nav, report=report, replay_name=replay_name,
                                   search_path=search_path, rows=rows if search else None, thumb_width=thumb_width,
                                   large_width=large_width, inline_budget=inline_budget, progress=progress))  # fmt: skip
    if search_path is not None:
        page = render_search(rows, written[0].title, urllib.parse.quote(out.name))
        _write(search_path, page.encode("utf-8"))
    return _summed(out, written, missing, search_path, paths)


def _checked_output(output: str | os.PathLike[str], limit: int | None, page_size: int | None) -> Path:
    """The report's absolute path, once ``limit``, ``page_size`` and ``output`` are checked."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise BundleError(f"limit must be at least 1; omit it for every sample (found {limit!r})")
    if page_size is not None and (
        not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 0
    ):
        raise BundleError(f"page_size must be at least 1, or 0 for one page (found {page_size!r})")
    out = Path(os.path.abspath(output))
    if out.is_dir():
        raise BundleError(f"{out}: is a directory; name the file to write")
    if not out.parent.is_dir():
        raise BundleError(f"{output}: directory {out.parent} does not exist")
    return out


def _replay_of(
    replay: Mapping[str, Any] | str | os.PathLike[str] | None, b: Bundle
) -> tuple[dict[str, Any] | None, str | None]:
    """The replay report checked, and the name it is shown by (its path, when read from one)."""
    if replay is None:
        return None, None
    if isinstance(replay, Mapping):
        report, name = dict(replay), None
        check_replay_report(report, "replay report")
    else:
        report, name = load_replay_report(replay), str(replay)
    # A report of another bundle would put its verdicts on these samples (issue 16, item 7).
    check_report_bundle(report, b, name or "replay report")
    return report, name


def _shown_positions(b: Bundle, samples: Sequence[int] | None, limit: int | None) -> list[int]:
    """The positions shown, in order: ``samples`` (each in range) or all, then at most ``limit``."""
    n = len(b)
    positions = list(range(n)) if samples is None else [int(i) for i in samples]
    for i in positions:
        if not 0 <= i < n:
            raise bundles.BundleIndexError(
                f"{b.path}: sample {i} is out of range: the bundle holds {n} (0..{n - 1})"
            )
    return positions if limit is None else positions[:limit]


@dataclass(frozen=True)
class _PageWritten:
    title: str
    samples: int
    images: int
    bytes: int
    not_shown: list[str]


def _summed(out: Path, written: list[_PageWritten], missing: list[str], search: Path | None,
            paths: list[Path]) -> ReportWritten:  # fmt: skip
    """What :func:`write_html_report` returns: its pages' counts summed."""
    return ReportWritten(
        out,
        sum(w.samples for w in written),
        sum(w.images for w in written),
        sum(w.bytes for w in written),
        [e for w in written for e in w.not_shown],
        missing,
        search,
        paths,
    )


def _pages_nav(b: Bundle, paths: list[Path], k: int, chunk: list[int], total: int) -> dict[str, Any]:
    """The links between the pages of a paged report, for ``report.html.j2``'s ``pages`` block."""

    def href(i: int) -> str:
        return urllib.parse.quote(paths[i].name)

    return {
        "current": k + 1,
        "count": len(paths),
        "first_sample": chunk[0] if chunk else None,
        "last_sample": chunk[-1] if chunk else None,
        "total": total,
        "prev": href(k - 1) if k > 0 else None,
        "next": href(k + 1) if k + 1 < len(paths) else None,
        "links": [{"n": i + 1, "href": href(i), "current": i == k} for i in range(len(paths))],
        "serve": f"rollout-bundle serve {b.path}",
    }


def _write_page(
    b: Bundle,
    positions: list[int],
    out: Path,
    *,
    nav: dict[str, Any] | None,
    report: Mapping[str, Any] | None,
    replay_name: str | None,
    search_path: Path | None,
    rows: list[dict[str, str]] | None,
    thumb_width: int,
    large_width: int,
    inline_budget: int,
    progress: bool | None,
) -> _PageWritten:
    """Write one page of the report: the samples at ``positions`` and the pictures they show.

    Only this page's samples and pictures are held while it is made, so a paged report of a large
    bundle needs the memory of one page, not of the bundle; ``rows`` collects the search page's.
    """
    # Where the samples name the stored files: under the bundle, or in a store's shared pool.
    media = stored_media(b)
    views = [sample_view(p, s, media) for p, s in zip(positions, b.samples(indices=positions), strict=True)]
    if rows is not None:
        href = nav["links"][nav["current"] - 1]["href"] if nav else urllib.parse.quote(out.name)
        rows.extend({**row, "href": href} for row in search_rows(views))  # the page that shows it
    names = list(dict.fromkeys(img.name for v in views for img in v.images if img.name))
    # Large views: a packed bundle has no files beside the page, so they are inlined (up to the
    # budget; beyond it the thumbnail is enlarged). A directory bundle's large views are its
    # stored files, linked at full resolution, except in a small dump, whose page then works
    # alone (mailed, attached to a bug) at little cost.
    # A bundle on an object store has no files beside the page either.
    media_dir = b.media_dir  # None: no files to link to (packed, or on a store)
    no_files = media_dir is None
    budget = inline_budget if no_files or len(names) <= SMALL_DUMP else 0
    shown = pictures(b, names, thumb_width=thumb_width, large_width=large_width, large_budget=budget,
                     progress=progress)  # fmt: skip
    link_base = None  # a packed bundle has no files to link to
    if media_dir is not None:
        rel = os.path.relpath(media_dir, out.parent)
        link_base = "/".join(urllib.parse.quote(part) for part in Path(rel).parts) + "/"
    context = page_context(b, views, shown, link_base=link_base, replay=report, replay_name=replay_name)
    context["search_href"] = urllib.parse.quote(search_path.name) if search_path else None
    context["pages"] = nav
    data = render("report.html.j2", context).encode("utf-8")
    _write(out, data)
    not_shown = [t.error for name in names if (t := shown[name]).error]
    return _PageWritten(context["title"], len(views), context["shown_images"], len(data), not_shown)
