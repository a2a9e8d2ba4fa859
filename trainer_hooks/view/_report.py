"""One self-contained HTML page for a bundle: :func:`write_html_report`.

The page is a single file a person can mail or attach to a bug: the stylesheet is inlined, the
screenshots are small JPEG thumbnails inlined as ``data:`` URIs, and a Content-Security-Policy
forbids scripts and every network fetch, so opening it never reaches anything.

Each stored screenshot is inlined once, as an SVG ``<image>`` in one hidden ``<defs>``, and every
turn that shows it draws it with ``<use href="#m7">``: a trajectory's samples often repeat the
same screenshots, and inlining per occurrence made a 600-screenshot dump a 32 MiB page instead of
about 8. No script is needed for that, so the page still runs none.

The work is split by concern: :mod:`~trainer_hooks.view._samples` reads each sample down to what
the page shows (any legal value, never a crash), :mod:`~trainer_hooks.view._media` reads and
decodes each stored screenshot once (PNG/JPEG only, through :func:`bundles.decode_image`),
:mod:`~trainer_hooks.view._context` turns both into plain data, and Jinja2 templates with
autoescaping write the HTML (``templates/``), so no string from the bundle is escaped by hand.

A thumbnail links to the full-size image by a relative path when the bundle is a directory, so
the link works while the bundle sits where it was next to the report (move them together); only
stored ``.png``/``.jpg``/``.jpeg`` files that decoded are linked. A packed bundle has no files to
link to; its inlined pictures are all there is.

Samples are read one shard at a time and reduced to what the page shows before the next is read,
so a dump that holds processor tensors does not have to fit in memory.

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
from trainer_hooks.replay import REPORT_FORMAT as REPLAY_FORMAT
from trainer_hooks.replay import ReportError, check_replay_report, check_report_bundle, load_replay_report
from trainer_hooks.view._context import page_context
from trainer_hooks.view._jinja import render_page
from trainer_hooks.view._media import pictures
from trainer_hooks.view._samples import sample_view, stored_media
from trainer_hooks.view._search import render_search, search_rows

__all__ = [
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


@dataclass(frozen=True)
class ReportWritten:
    path: Path
    samples: int  # samples shown
    images: int  # thumbnails shown (occurrences)
    bytes: int  # size of the HTML file
    not_shown: list[str] = field(default_factory=list)  # one line per stored file that cannot be shown
    missing: list[str] = field(default_factory=list)  # media files listed in the manifest but missing
    search: Path | None = None  # the search page written beside the report


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
) -> ReportWritten:
    """Write one self-contained HTML page describing ``bundle`` to ``output`` (atomically).

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
    if report is not None:
        # A report of another bundle would put its verdicts on these samples (issue 16, item 7).
        check_report_bundle(report, b, replay_name or "replay report")
    n = len(b)
    positions = list(range(n)) if samples is None else [int(i) for i in samples]
    for i in positions:
        if not 0 <= i < n:
            raise bundles.BundleIndexError(
                f"{b.path}: sample {i} is out of range: the bundle holds {n} (0..{n - 1})"
            )
    if limit is not None:
        positions = positions[:limit]

    # Where the samples name the stored files: under the bundle, or in a store's shared pool.
    media = stored_media(b)
    views = [sample_view(p, s, media) for p, s in zip(positions, b.samples(indices=positions), strict=True)]
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
    search_path = out.with_name(out.stem + ".search.html") if search else None
    context = page_context(b, views, shown, link_base=link_base, replay=report, replay_name=replay_name)
    context["search_href"] = urllib.parse.quote(search_path.name) if search_path else None
    data = render_page(context).encode("utf-8")
    _write(out, data)
    if search_path is not None:
        page = render_search(search_rows(views), context["title"], urllib.parse.quote(out.name))
        _write(search_path, page.encode("utf-8"))
    not_shown = [t.error for name in names if (t := shown[name]).error]
    return ReportWritten(out, len(views), context["shown_images"], len(data), not_shown, missing, search_path)
