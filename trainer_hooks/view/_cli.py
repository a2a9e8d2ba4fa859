"""``rollout-bundle view BUNDLE -o report.html [--replay REPORT.json] [--limit N] [--samples 3,7,12] [--page-size N]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bundles import BundleIndexError
from bundles.support import (
    CommandError,
    add_command,
    add_json_option,
    add_progress_option,
    check_output_file,
)

__all__ = ["register"]

PAGE_SIZE = 500  # trainer_hooks.view._report.PAGE_SIZE, without importing Jinja2 to build the parser


def _positions(text: str) -> list[int]:
    try:
        out = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated sample positions such as 3,7,12, found {text!r}"
        ) from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated sample positions >= 0, found {text!r}")
    return out


def _limit(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, found {text!r}") from None


def _page_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected samples per page >= 1, or 0 for one page, found {text!r}")
    return n


def run_view(ns: argparse.Namespace) -> int:
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise CommandError("view needs Pillow for the thumbnails: pip install pillow", status=2) from None
    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise CommandError(
            "view needs Jinja2 for its page: pip install 'rollout-bundles[view]'", status=2
        ) from None
    from trainer_hooks.replay import ReportError, check_report_bundle
    from trainer_hooks.view._report import write_html_report

    if ns.limit is not None and ns.limit < 1:
        raise CommandError("--limit must be at least 1; omit it for every sample", status=2)
    check_output_file("-o", ns.output)  # before any work; a missing directory is refused, not created
    # A --replay that is not a report, or a report of another bundle, is the caller's to fix (exit
    # 2, as replay --expect); so is a --samples position out of range. A bad BUNDLE exits 1.
    try:
        if ns.replay is not None:  # a report of another bundle is refused, not shown
            check_report_bundle(ns.replay, ns.bundle, f"--replay {ns.replay}")
        written = write_html_report(
            ns.bundle, ns.output, replay=ns.replay, limit=ns.limit, samples=ns.samples, progress=ns.progress,
            search=not ns.no_search, inline_budget=int(ns.inline_budget * 2**20), page_size=ns.page_size,
        )  # fmt: skip
    except (ReportError, BundleIndexError) as e:
        raise CommandError(str(e), status=2) from None
    if written.not_shown:
        n = len(written.not_shown)
        first = "; ".join(written.not_shown[:3]) + ("; ..." if n > 3 else "")
        print(f"rollout-bundle view: warning: {n} stored screenshot(s) cannot be shown (placeholders on "
              f"the page): {first}", file=sys.stderr)  # fmt: skip
    if ns.json:
        print(json.dumps({"output": str(written.path), "samples": written.samples, "images": written.images,
                          "bytes": written.bytes, "not_shown": written.not_shown,
                          "pages": [str(p) for p in written.pages],
                          "search": None if written.search is None else str(written.search)}, indent=2, sort_keys=True))  # fmt: skip
    elif len(written.pages) > 1:
        print(f"wrote {written.path} and {len(written.pages) - 1} more page(s) beside it, {written.pages[1].name} to "
              f"{written.pages[-1].name} ({_count(written.samples, 'sample')}, at most {ns.page_size} a page, "
              f"{_count(written.images, 'screenshot')}, {written.bytes / 2**20:.1f} MiB in all)"
              + (f" and its search page {written.search}" if written.search else "")
              + f": open {written.path.name} in a browser; to filter, sort and search every sample at once, "
              f"`rollout-bundle serve {ns.bundle}`")  # fmt: skip
    else:
        print(f"wrote {written.path} ({_count(written.samples, 'sample')}, {_count(written.images, 'screenshot')}, "
              f"{written.bytes / 2**20:.1f} MiB)" + (f" and its search page {written.search}" if written.search else "")
              + f": open {written.path.name} in a browser")  # fmt: skip
    return 0


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def register(subparsers: Any) -> None:
    """Add ``view`` to a ``rollout-bundle`` parser."""
    p = add_command(
        subparsers,
        "view",
        "write an HTML report of a bundle's samples and screenshots, and its search page",
        run_view,
        description="Write an HTML report (inlined thumbnails and styles, no script, no network) "
        "describing a bundle: kind, meta, counts, sizes, dedup ratio, histograms of reward, response length and "
        "turns, CSS-only filters and sorting, GRPO groups side by side with their advantages, then each sample "
        "with its status, reward, lengths, log-prob strip and screenshots. A click on a screenshot opens a large "
        "view with the turn's action (click, drag, scroll, typed text) drawn over it; for a packed bundle or a "
        "small dump the large views are inlined too, otherwise they are the bundle's stored files, linked. "
        "A bundle of more than --page-size samples (default 500) is written as pages linked to each other "
        "(REPORT.html, REPORT-2.html, ...), each holding its own samples and thumbnails. "
        "Beside it, a second file, REPORT.search.html, searches prompts and responses (one script, allowed "
        "by its CSP hash; --no-search writes the report alone). With --replay, "
        "each sample also shows the replay's guard and token-check results and log-prob differences.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle directory or a packed bundle file")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write (replaced)")
    p.add_argument(
        "--replay", metavar="REPORT.json", help="a report written by `rollout-bundle replay --report`"
    )
    p.add_argument("--limit", type=_limit, metavar="N", help="show at most N samples (N >= 1; omit for all)")
    p.add_argument(
        "--samples", type=_positions, metavar="3,7,12", help="show only these sample positions, in this order"
    )
    p.add_argument(
        "--inline-budget",
        type=float,
        default=8.0,
        metavar="MIB",
        help="MiB of large views (1280 px JPEGs) inlined for a packed bundle or a small dump (default "
        "8); beyond it a large view is the stored file beside the page, or the enlarged thumbnail",
    )
    p.add_argument(
        "--no-search",
        action="store_true",
        help="do not write the search page (REPORT.search.html, the one page with a script)",
    )
    p.add_argument(
        "--page-size",
        type=_page_size,
        default=PAGE_SIZE,
        metavar="N",
        help=f"samples per page (default {PAGE_SIZE}): a larger bundle is written as REPORT.html, REPORT-2.html, ... "
        "linked to each other, each page's filters and sorting acting on its own samples (`rollout-bundle serve` "
        "filters and sorts all of them); 0 writes every sample on one page",
    )
    add_json_option(p, "what was written")
    add_progress_option(p)
