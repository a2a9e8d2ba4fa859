"""``rm`` and ``gc``: a bundle removed, and nothing that is not the bundle's; a store prefix's garbage."""

from __future__ import annotations

import argparse
import os
from typing import Any

from bundles._api.entry import remove_bundle
from bundles._api.location import Location
from bundles._commands import common
from bundles._commands.output import BUNDLE_HELP, location_shown, print_json, say
from bundles._local.progress import human_bytes
from bundles._urls import check_location


def _rm(ns: argparse.Namespace) -> int:
    remove_bundle(ns.bundle, damaged=ns.damaged)
    at = Location.of(ns.bundle)
    kept = not at.uploads and os.path.isdir(at)
    if ns.json:
        print_json({"removed": location_shown(ns.bundle), "directory_kept": kept})
    else:
        note = " (the directory's other files are kept)" if kept else ""
        say(f"removed {location_shown(ns.bundle)}{note}")
    return 0


def _duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``24h`` or ``7d`` as seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        seconds = float(value) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90s, 30m, 24h or 7d, found {text!r}"
        ) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"expected a duration >= 0, found {text!r}")
    return seconds


def _gc(ns: argparse.Namespace) -> int:
    if not check_location(ns.prefix, "gc PREFIX"):
        raise common.CommandError(f"{ns.prefix}: gc takes an object-store URL (s3://bucket/prefix)", status=2)
    from bundles._errors import GarbagePrefixError
    from bundles._store import collect_garbage
    from bundles._urls import StoreURL

    try:
        report = collect_garbage(ns.prefix, older_than_s=ns.older_than, dry_run=ns.dry_run)
    except GarbagePrefixError as e:
        raise common.CommandError(str(e), status=2) from None  # the caller's prefix, not the data
    if ns.json:
        print_json(
            {
                "prefix": ns.prefix,
                "dry_run": ns.dry_run,
                "bundles": report.bundles,
                "generations": report.generations,
                "media": report.media,
                "bytes": report.bytes,
                "kept_young": report.kept_young,
                "clock": report.clock,
                "skipped": [
                    {"reason": k.reason, "where": k.where, "objects": k.objects} for k in report.skipped
                ],
            }
        )
        return 0
    verb = "would remove" if ns.dry_run else "removed"
    root = StoreURL(ns.prefix)
    bucket = f"{root.scheme}://{root.bucket}"  # the lines name each object by its URL
    for g in report.generations:
        say(f"{verb} generation {bucket}/{g}/")
    for m in report.media:
        say(f"{verb} media {bucket}/{m}")
    reasons: dict[str, list[Any]] = {}
    for k in report.skipped:
        reasons.setdefault(k.reason, []).append(k)
    for reason, places in reasons.items():  # one line per reason: what was kept, where, why
        shown = ", ".join(k.where for k in places[:3]) + (
            f", +{len(places) - 3} more" if len(places) > 3 else ""
        )
        say(f"kept {sum(k.objects for k in places)} object(s) in {len(places)} place(s) ({shown}): {reason}")
    if report.clock != "store":
        say(
            "ages measured on this machine's clock: the store refused gc's reference object "
            "(read-only credentials?); a run that deletes needs write access and uses the store's"
        )
    say(
        f"{ns.prefix}: {report.bundles} live bundle(s); {verb} {len(report.generations)} generation(s) and "
        f"{len(report.media)} media file(s), {human_bytes(report.bytes)}; {report.kept_young} object(s) of "
        "garbage younger than --older-than kept"
    )
    return 0


def register(subparsers: Any) -> None:
    """``rm`` (and its ``--damaged``) and ``gc``."""
    p = common.add_command(
        subparsers,
        "rm",
        "remove a bundle, and nothing that is not the bundle's",
        _rm,
        description="Remove the bundle BUNDLE so that no reader ever finds half of it. Only a proven bundle "
        "(a manifest that validates; on a store a pointer naming a generation of its own) is removed, and "
        "only what its manifest lists (docs/FORMAT.md §5a, §9): its pointer, generations and listed media on "
        "a store, its manifest and listed files in a directory. Other files beside it and a bundle nested in "
        "it are kept; media of a shared pool are left to gc. Anything else (a web app's manifest.json, a "
        "generation of a bundle) is refused and nothing is deleted.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument(
        "--damaged",
        action="store_true",
        help="also remove a damaged bundle (its manifest or pointer claims the format but does not "
        "validate), and then only the names the format writes (manifest.json, samples/NNNNNN.msgpack.zst, "
        "media/<64 hex><suffix>; on a store its pointer and generations)",
    )
    common.add_json_option(p)

    p = common.add_command(
        subparsers,
        "gc",
        "remove unpublished generations and unreferenced shared media under an object-store prefix",
        _gc,
        description="Garbage collection of bundles on an object store (docs/FORMAT.md §9): generations that "
        "no pointer names (a writer died, lost a race, or was replaced) and media that no live bundle lists, "
        "once older than --older-than on the store's own clock (never this machine's). Only what a pointer "
        "or generation of ours vouches for is deleted: a "
        "shared pool (<dir>/.media) only when PREFIX holds <dir>, against every bundle beside it (a prefix "
        "inside a pool or a generation is refused, exit 2); objects of others, and everything a bundle with "
        "an unreadable pointer may use, are kept and reported. Run it on the --save prefix of a run, not "
        "while writers of that prefix reuse pooled media for longer than --older-than. Abandoned multipart "
        "uploads are left to the bucket's lifecycle rule (AbortIncompleteMultipartUpload).",
    )
    p.add_argument("prefix", metavar="PREFIX", help="an object-store URL, e.g. s3://bucket/runs/r1")
    p.add_argument(
        "--older-than",
        type=_duration,
        default=24 * 3600.0,
        metavar="AGE",
        help="leave garbage younger than this (default 24h; e.g. 90s, 30m, 7d)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    common.add_json_option(p)
