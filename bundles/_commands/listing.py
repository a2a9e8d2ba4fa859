"""``ls``: the bundles in a directory or under an object-store prefix."""

from __future__ import annotations

import argparse
import os
from typing import Any

from bundles._api.entry import open_bundle
from bundles._api.location import Location
from bundles._commands import common
from bundles._commands.find import find_bundles
from bundles._commands.output import location_shown, plural, print_json
from bundles._errors import BundleError
from bundles._format.limits import MAX_FIND_DEPTH, MAX_SHOWN_PATH_CHARS
from bundles._format.repr import display
from bundles._local.progress import human_bytes


def _ls(ns: argparse.Namespace) -> int:
    """Every bundle found is listed; every entry that could not be read is one line on stderr,
    and then the status is 1 (0 when every entry was listed)."""
    root = ns.root
    if not Location.of(root).uploads and not os.path.lexists(root):  # a store prefix needs no directory
        raise common.CommandError(
            f"{os.path.abspath(root)}: does not exist; ls lists the bundles in a directory (or a packed bundle)"
        )
    found = find_bundles(root, depth=MAX_FIND_DEPTH if ns.recursive else 0)
    problems = list(found.problems)
    rows: list[dict[str, Any]] = []
    for location in found.bundles:
        row: dict[str, Any] = {"location": location}
        if ns.long:
            try:
                with open_bundle(location, verify="none") as b:
                    row.update(
                        samples=len(b), media_files=len(b.media), media_bytes=b.media_bytes, kind=b.kind
                    )
            except (BundleError, OSError) as e:  # one bundle's defect is a line, not ls's failure
                problems.append((location, str(e)))
                continue
        rows.append(row)
    if ns.json:
        print_json(rows)
    for r in [] if ns.json else rows:
        line = display(r["location"], limit=MAX_SHOWN_PATH_CHARS)
        if ns.long:
            line += (
                f"  {display(r['kind'])}  {plural(r['samples'], 'sample')}, "
                f"{plural(r['media_files'], 'media file')} ({human_bytes(r['media_bytes'])})"
            )
        print(line)
    for where, message in problems:
        said = message if message.startswith(where) else f"{where}: {message}"
        common.warn("ls", f"not listed: {said}")
    if not rows and not problems and not ns.recursive:
        common.warn(
            "ls",
            f"{location_shown(root)}: no bundle right under it (ls -r looks {MAX_FIND_DEPTH} levels down)",
        )
    return 1 if problems else 0


def register(subparsers: Any) -> None:
    """``ls``: what it lists, how deep, and its exit status."""
    p = common.add_command(
        subparsers,
        "ls",
        "list the bundles in a directory or under an object-store prefix",
        _ls,
        description="List the bundles right under ROOT (one level; with -r, up to "
        f"{MAX_FIND_DEPTH} levels down, as serve finds a run's bundles): bundle directories and packed files "
        "locally; prefixes with a pointer (or a plain copy of a bundle directory) and packed objects on an "
        "object store; each proven by a manifest that validates (docs/FORMAT.md §5a). Media pools, staging "
        "directories, generations, damaged bundles and other files named manifest.json are left out. ROOT "
        "that is itself a bundle is listed as such. Names are printed escaped (control "
        "characters, bidirectional overrides and bytes that are not UTF-8 spelled out), one per line. "
        "An entry that cannot be read (a manifest gone, no permission) is one line on stderr and the "
        "others are still listed. Exit status: 0 when every entry was listed, 1 when some entry (or "
        "ROOT) could not be read.",
    )
    p.add_argument("root", metavar="ROOT", help="a directory, or an object-store URL (s3://bucket/prefix)")
    p.add_argument("-l", "--long", action="store_true", help="also each bundle's kind, samples and media")
    p.add_argument(
        "-r",
        "--recursive",
        action="store_true",
        help=f"also look below ROOT, up to {MAX_FIND_DEPTH} levels (not into bundles, hidden names or links)",
    )
    common.add_json_option(p, "the bundles")
