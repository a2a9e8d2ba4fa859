"""The commands that list, copy and remove bundles: ``ls``, ``cp``, ``rm`` and ``gc``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from bundles._api.entry import open_bundle, pack_bundle, remove_bundle, unpack_bundle
from bundles._api.location import Location
from bundles._cli import common
from bundles._cli.find import find_bundles
from bundles._cli.output import BUNDLE_HELP, location_shown, plural, print_json, say
from bundles._errors import BundleError
from bundles._format.layout import PACK_SUFFIX
from bundles._format.limits import MAX_FIND_DEPTH, MAX_SHOWN_PATH_CHARS
from bundles._format.repr import display
from bundles._local.commit import scratch_dir
from bundles._local.fs import remove_tree
from bundles._local.progress import human_bytes
from bundles._urls import check_location, is_store_url


def _ls(ns: argparse.Namespace) -> int:
    """Every bundle found is listed; every entry that could not be read is one line on stderr,
    and then the status is 1 (0 when every entry was listed)."""
    root = ns.root
    if not Location.of(root).uploads and not os.path.isdir(root):  # a store prefix needs no directory
        what = "does not exist" if not os.path.lexists(root) else "is not a directory"
        raise common.CommandError(f"{os.path.abspath(root)}: {what}; ls lists the bundles in a directory")
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


def _copy_kind(src: str, dst: str) -> str:
    """How ``cp SRC DST`` copies: by packing, unpacking, uploading, downloading or both."""
    if dst.rstrip("/").endswith(PACK_SUFFIX):
        return "pack"
    if src.rstrip("/").endswith(PACK_SUFFIX):
        if is_store_url(dst):
            raise common.CommandError(
                f"{dst}: cp of a packed file makes a packed file or a local directory; name DST ending in "
                f"{PACK_SUFFIX}, or unpack it to a directory first",
                status=2,
            )
        return "unpack"
    if is_store_url(src) and is_store_url(dst):
        return "store-to-store"
    if is_store_url(dst):
        return "upload"
    if is_store_url(src):
        return "download"
    raise common.CommandError(
        f"{dst}: cp copies a bundle between a local directory and an object store (either way, or store "
        "to store); for two local directories use pack and unpack",
        status=2,
    )


def _cp(ns: argparse.Namespace) -> int:
    from bundles._store import upload_bundle
    from bundles._store.copy import download_bundle

    src, dst = ns.src, ns.dst
    kind = _copy_kind(src, dst)
    if kind == "pack":
        pack_bundle(src, dst, overwrite=ns.force, progress=ns.progress)
    elif kind == "unpack":
        unpack_bundle(src, dst, overwrite=ns.force, progress=ns.progress)
    elif kind == "upload":
        open_bundle(src, verify="fast").close()  # a damaged bundle is never uploaded
        upload_bundle(
            src, dst, overwrite=ns.force, shared_media=ns.shared_media, progress=ns.progress, read_back=True
        )
    elif kind == "download":
        download_bundle(src, dst, overwrite=ns.force, progress=ns.progress)
    else:
        _store_to_store(src, dst, ns)
    # Verified in full before it was published (every object of a store copy read back and
    # hashed, every file of a local copy hashed before its commit, every member of a packed file
    # as it was written): a failure here would come after the old bundle was replaced.
    level = "full" if kind in ("pack", "unpack") else "none"
    with open_bundle(src, verify="none") as a, open_bundle(dst, verify=level) as b:
        if (len(a), sorted(m.filename for m in a.media)) != (len(b), sorted(m.filename for m in b.media)):
            raise common.CommandError(
                f"{location_shown(dst)}: the copy does not hold the samples and media of {location_shown(src)}"
            )
        counts = {"samples": len(b), "media_files": len(b.media)}
    if ns.json:
        print_json({"source": location_shown(src), "copy": location_shown(dst), "verified": "full", **counts})
    else:
        say(
            f"copied {location_shown(src)} -> {location_shown(dst)} (fully verified: {counts['samples']} samples, "
            f"{counts['media_files']} media files)"
        )
    return 0


def _store_to_store(src: str, dst: str, ns: argparse.Namespace) -> None:
    """``cp URL URL``: download into a scratch directory, then upload. The scratch is named after
    this process (:func:`bundles.support.scratch_dir`, in the temporary directory), so that the
    next ``cp`` removes what a SIGKILLed one left."""
    import tempfile

    from bundles._store import upload_bundle
    from bundles._store.copy import download_bundle

    scratch = scratch_dir(os.path.join(tempfile.gettempdir(), "rollout-bundle-cp"), "copy")
    try:
        local = download_bundle(src, scratch / "bundle", progress=ns.progress)
        upload_bundle(
            local, dst, overwrite=ns.force, shared_media=ns.shared_media, progress=ns.progress, read_back=True
        )
    finally:
        remove_tree(scratch)


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


def _register_rm(subparsers: Any) -> None:
    """``rm`` and its ``--damaged``."""
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


def _register_ls(subparsers: Any) -> None:
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


def register(subparsers: Any) -> None:
    """``ls``, ``cp``, ``rm`` and ``gc``: the commands that list, copy and remove bundles."""
    _register_ls(subparsers)
    p = common.add_command(
        subparsers,
        "cp",
        "copy a bundle between a local directory and an object store, and fully verify the copy",
        _cp,
        description="Copy the bundle SRC to DST, either way between a local directory and an object store "
        "(s3://, gs://, az://), or from one store prefix to another. On a store the copy is published "
        "by the commit protocol (docs/FORMAT.md §9: a reader sees the old bundle or the whole new one); "
        "locally it is committed by rename. A DST ending in .rbundle packs, a packed SRC unpacks. The copy "
        "is verified in full (every shard and medium hashed; on a store, read back) before it is published, "
        "so a failure leaves the bundle at DST as it was; then it is checked against SRC's samples and media.",
    )
    p.add_argument("src", metavar="SRC", help=BUNDLE_HELP)
    p.add_argument(
        "dst", metavar="DST", help="the bundle to create: a local directory or an object-store URL"
    )
    p.add_argument("--force", action="store_true", help="replace a bundle at DST")
    p.add_argument(
        "--shared-media",
        action="store_true",
        help="on a store, put the media in the pool beside DST (<parent>/.media), shared with its siblings",
    )
    common.add_json_option(p)
    common.add_progress_option(p)

    _register_rm(subparsers)

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
