"""The bundle subcommands of ``rollout-bundle``: inspect, show, diff, verify, pack, unpack, ls, cp,
rm and gc.

:func:`register` adds them to a ``rollout-bundle`` parser (see :mod:`bundles.support` for the
CLI kit every subcommand shares); the ``rollout-bundle`` entry point (:mod:`trainer_hooks.cli`) adds the
training-side commands beside them. ``python -m bundles.cli`` runs the bundle commands alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from bundles import _cli
from bundles._diff import DiffKeyError, diff_bundles
from bundles._entry import open_bundle, pack_bundle, remove_bundle, unpack_bundle
from bundles._errors import BundleError
from bundles._find import find_bundles
from bundles._format.layout import MEDIA_DIR, PACK_SUFFIX
from bundles._format.limits import MAX_FIND_DEPTH, MAX_SHOWN_CHARS, MAX_SHOWN_PATH_CHARS
from bundles._format.repr import display
from bundles._local.commit import scratch_dir
from bundles._local.fs import remove_tree
from bundles._local.progress import human_bytes
from bundles._locations import Location
from bundles._show import dumps_pretty, parse_key_paths, select, to_json
from bundles._urls import check_location, is_store_url

__all__ = ["main", "register"]

# The CLI kit (and Progress) used to be exported from here; they moved to bundles.support, the
# module for tools built on bundles. Kept for one release as aliases that warn.
_MOVED_TO_SUPPORT = frozenset(
    {
        "CommandError",
        "Progress",
        "add_command",
        "add_json_option",
        "add_progress_option",
        "build_parser",
        "check_output_file",
        "cli_message",
        "int_at_least",
        "main_with",
        "run_command",
    }
)


def __getattr__(name: str) -> object:
    from bundles._deprecated import moved_to_support
    from bundles._local.progress import Progress

    found = {n: Progress if n == "Progress" else getattr(_cli, n) for n in _MOVED_TO_SUPPORT}
    return moved_to_support("bundles.cli", found, name)


BUNDLE_HELP = "a bundle directory or a packed bundle file, local or on an object store (s3://bucket/prefix)"


def _print_json(obj: Any) -> None:
    # ensure_ascii: a control character, a bidirectional override or a lone surrogate read from a
    # bundle is written as a \uXXXX escape, never raw.
    print(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True))


def _say(line: str, *, file: Any = None) -> None:
    """Print one line of text output. A line names paths, keys and values read from a bundle or a
    listing: it goes through :func:`bundles.support.display` (one line, nothing raw)."""
    print(display(line, limit=MAX_SHOWN_CHARS), file=file or sys.stdout)


def _inspect(ns: argparse.Namespace) -> int:
    bundle = open_bundle(ns.bundle, verify="none")
    refs = bundle.media_references
    stored = len(bundle.media)
    info: dict[str, Any] = {
        "path": str(bundle.path),
        "kind": bundle.kind,
        "format_version": bundle.manifest.format_version,
        "created_by": bundle.manifest.created_by,
        "samples": len(bundle),
        "shards": len(bundle.manifest.shards),
        "media_files": stored,
        "media_bytes": bundle.media_bytes,
        "media_references": refs,
        "dedup_ratio": round(refs / stored, 3) if stored else None,
        "meta": bundle.meta,
    }
    if ns.json:
        _print_json(info)
        return 0
    _say(f"bundle        {info['path']}")
    _say(f"kind          {info['kind']} (format_version {info['format_version']}, {info['created_by']})")
    _say(f"samples       {info['samples']} in {info['shards']} shard(s)")
    _say(f"media         {stored} file(s), {human_bytes(info['media_bytes'])}")
    ratio = f"{refs / stored:.2f}x" if stored else "n/a"
    _say(f"references    {refs} (dedup ratio {ratio})")
    # ensure_ascii: no raw newline in a string, so each line of the indented JSON is one line.
    meta = json.dumps(bundle.meta, sort_keys=True, indent=2, ensure_ascii=True).splitlines()
    for k, line in enumerate(meta):
        _say(("meta          " if k == 0 else "              ") + line)
    return 0


def _show(ns: argparse.Namespace) -> int:
    bundle = open_bundle(ns.bundle, verify="none")
    keys = parse_key_paths(ns.keys) if ns.keys is not None else None
    n = len(bundle)
    for i in ns.indices:
        if not -n <= i < n:
            raise _cli.CommandError(  # the caller's index, like a --keys typo: exit 2
                f"{bundle.path}: sample index {i} is out of range: the bundle holds {n}", status=2
            )
    positions = [i % n for i in ns.indices] if ns.indices else range(n)
    prefix = f"{bundle.path}/{MEDIA_DIR}/"
    stored = {str(r.path): r.filename for r in bundle.media}  # pooled media lie outside the bundle
    out = sys.stdout
    # With --keys, a key path found in no shown sample is a typo, not an empty answer: output is
    # held back until every path has been found once (then streamed), so that a typo prints one
    # error naming it instead of a list of empty samples.
    matched: set[int] = set()
    streaming = not keys
    top_keys: set[str] = set()
    texts: list[str] = ["["]
    for k, (position, sample) in enumerate(zip(positions, bundle.samples(indices=positions), strict=True)):
        if keys:
            top_keys.update(str(key) for key in sample)
        shown = to_json(
            select(sample, keys, matched) if keys else sample,
            media_prefix=prefix,
            full=ns.full,
            media_paths=stored,
        )
        item = {"position": position, "sample": shown}
        texts.append(("," if k else "") + "\n  " + dumps_pretty(item, _level=1))
        if not streaming and len(matched) == len(keys or ()):
            streaming = True  # every path found: stream from here on
        if streaming:
            out.write("".join(texts))
            texts.clear()
    if keys and positions and len(matched) < len(keys):
        missing = [".".join(p) for i, p in enumerate(keys) if i not in matched]
        shown_keys = ", ".join(sorted(top_keys)[:30]) + (", ..." if len(top_keys) > 30 else "")
        raise _cli.CommandError(
            f"{bundle.path}: --keys: {', '.join(repr(m) for m in missing)}: no such key path in any "
            f"shown sample (their top-level keys: {shown_keys or 'none'})",
            status=2,
        )
    texts.append("\n]\n" if positions else "]\n")
    out.write("".join(texts))
    return 0


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt_value(v: object) -> str:
    """A changed value on one line: arrays as their kind, dtype and shape; long text cut."""
    if isinstance(v, dict) and v.get("type") in ("ndarray", "tensor"):
        return f"{v['type']} {v['dtype']}{v['shape']}"
    if isinstance(v, dict) and v.get("type") == "bytes":
        return f"bytes ({v['size']} B)"
    if isinstance(v, dict) and v.get("type") == "list":
        return f"list of {v['length']} numbers {json.dumps(v['head'])[:-1]}, ...]"
    text = json.dumps(v, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _diff(ns: argparse.Namespace) -> int:
    a = open_bundle(ns.a, verify="none")
    b = open_bundle(ns.b, verify="none")
    try:
        report = diff_bundles(a, b, by=ns.by, limit=ns.limit)
    except DiffKeyError as e:  # --by cannot match these samples: the caller's key, exit 2
        raise _cli.CommandError(str(e), status=2) from None
    if ns.json:
        _print_json(report)
        return 0 if report["same"] else 1
    for side in ("a", "b"):
        r = report[side]
        _say(
            f"{side.upper()}: {r['path']} ({r['kind']}, {_count(r['samples'], 'sample')}, "
            f"{_count(r['media_files'], 'media file')})"
        )
    if report["kind"]:
        _say(f"kind: {report['kind']['a']} -> {report['kind']['b']}")
    for c in report["meta"]["changes"]:
        _say("  " + _change_line(c))
    if report["meta"]["more"]:
        _say(f"  ... and {report['meta']['more']} more meta change(s)")
    samples = report["samples"]
    what = "sample" if report["by"] == "position" else f"sample {report['by']}="
    for c in samples["changed"]:
        where = f"{what}{c['key']}" if report["by"] != "position" else f"sample {c['key']}"
        if report["by"] != "position" and c["position_a"] != c["position_b"]:
            where += f" (position {c['position_a']} -> {c['position_b']})"
        _say(f"{where} changed:")
        for change in c["changes"]:
            _say("  " + _change_line(change))
        if c["more"]:
            _say(f"  ... and {c['more']} more")
    sep = "" if report["by"] == "position" else f"{report['by']}="
    for key in samples["removed"]:
        _say(f"sample {sep}{key} only in A (removed)")
    for key in samples["added"]:
        _say(f"sample {sep}{key} only in B (added)")
    media = report["media"]
    for side, label in (("only_in_a", "A"), ("only_in_b", "B")):
        for m in media[side]:
            _say(f"media only in {label}: {m['path']} ({human_bytes(m['size'])})")
    _say(
        f"{'same' if report['same'] else 'different'}: samples {len(samples['added'])} added, "
        f"{len(samples['removed'])} removed, {len(samples['changed'])} changed, {samples['unchanged']} unchanged; "
        f"media {len(media['only_in_a'])} only in A, {len(media['only_in_b'])} only in B, {media['common']} in both"
    )
    return 0 if report["same"] else 1


def _change_line(c: dict[str, Any]) -> str:
    if "items_differ" in c:
        return (
            f"{c['path']}: {c['items_differ']} of {c['length']} items differ, first at [{c['first']}]: "
            f"{_fmt_value(c['a'])} -> {_fmt_value(c['b'])}"
        )
    if "length_a" in c:
        return _length_line(c)
    if c.get("only_in") == "a":
        return f"{c['path']}: only in A: {_fmt_value(c['a'])}"
    if c.get("only_in") == "b":
        return f"{c['path']}: only in B: {_fmt_value(c['b'])}"
    a, b = _fmt_value(c["a"]), _fmt_value(c["b"])
    return f"{c['path']}: {a} -> {b}" if a != b else f"{c['path']}: {a}, different content"


def _length_line(c: dict[str, Any]) -> str:
    """A list whose length differs: both lengths, then how the lists part."""
    n, m, i, a, b = c["length_a"], c["length_b"], c["first"], c["a"], c["b"]
    line = f"{c['path']}: {n} vs {m} items"
    if i == min(n, m):  # the shorter list is the longer one's start
        longer, side = (a, "A") if n > m else (b, "B")
        line += f" (list {'shortened' if n > m else 'extended'}: {abs(n - m)} item(s) only in {side}"
        if isinstance(longer, list):
            line += f", from [{i}]: {_fmt_value(longer[i])}"
        return line + ")"
    if isinstance(a, list) and isinstance(b, list):
        return line + f", first difference at [{i}]: {_fmt_value(a[i])} -> {_fmt_value(b[i])}"
    return line + f", first difference at [{i}]"


def _verify(ns: argparse.Namespace) -> int:
    bundle = open_bundle(ns.bundle, verify="none")
    level = "full" if ns.full else "fast"
    problems = bundle.problems(full=ns.full, progress=ns.progress)
    if ns.json:
        _print_json(
            {
                "path": str(bundle.path),
                "level": level,
                "ok": not problems,
                "samples": len(bundle),
                "media_files": len(bundle.media),
                "problems": problems,
            }
        )
        return 1 if problems else 0
    if problems:
        _say(f"{bundle.path}: {len(problems)} problem(s) ({level} verification):", file=sys.stderr)
        for p in problems:
            _say(f"  - {p}", file=sys.stderr)
        return 1
    _say(f"{bundle.path}: OK ({level} verification: {len(bundle)} samples, {len(bundle.media)} media files)")
    return 0


def _where(location: str) -> str:
    """A location as messages name it: a URL as given, a local path made absolute."""
    return str(Location.of(location))


def _pack(ns: argparse.Namespace) -> int:
    out_at = Location.of(ns.output)
    if not out_at.uploads and os.path.isdir(out_at):  # the caller's -o: exit 2
        raise _cli.CommandError(f"-o {ns.output}: is a directory; name the file to write", status=2)
    out = pack_bundle(ns.bundle, ns.output, overwrite=ns.force, progress=ns.progress)
    with open_bundle(out, verify="none") as packed:
        size = packed.stored_bytes  # the file's (or the object's) size
    if ns.json:
        _print_json({"bundle": _where(ns.bundle), "output": str(out), "bytes": size})
    else:
        _say(f"packed {ns.bundle} -> {out} ({human_bytes(size)})")
    return 0


def _unpack(ns: argparse.Namespace) -> int:
    bundle = unpack_bundle(ns.file, ns.output, overwrite=ns.force, progress=ns.progress)
    if ns.json:
        _print_json(
            {
                "packed": _where(ns.file),
                "output": str(bundle.path),
                "verified": "full",
                "samples": len(bundle),
                "media_files": len(bundle.media),
            }
        )
    else:
        _say(
            f"unpacked {ns.file} -> {bundle.path} (fully verified: {len(bundle)} samples, "
            f"{len(bundle.media)} media files)"
        )
    return 0


def _ls(ns: argparse.Namespace) -> int:
    """Every bundle found is listed; every entry that could not be read is one line on stderr,
    and then the status is 1 (0 when every entry was listed)."""
    root = ns.root
    if not Location.of(root).uploads and not os.path.isdir(root):  # a store prefix needs no directory
        what = "does not exist" if not os.path.lexists(root) else "is not a directory"
        raise _cli.CommandError(f"{os.path.abspath(root)}: {what}; ls lists the bundles in a directory")
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
        _print_json(rows)
    for r in [] if ns.json else rows:
        line = display(r["location"], limit=MAX_SHOWN_PATH_CHARS)
        if ns.long:
            line += (
                f"  {display(r['kind'])}  {_count(r['samples'], 'sample')}, "
                f"{_count(r['media_files'], 'media file')} ({human_bytes(r['media_bytes'])})"
            )
        print(line)
    for where, message in problems:
        said = message if message.startswith(where) else f"{where}: {message}"
        _cli.warn("ls", f"not listed: {said}")
    if not rows and not problems and not ns.recursive:
        _cli.warn(
            "ls", f"{_where(root)}: no bundle right under it (ls -r looks {MAX_FIND_DEPTH} levels down)"
        )
    return 1 if problems else 0


def _copy_kind(src: str, dst: str) -> str:
    """How ``cp SRC DST`` copies: by packing, unpacking, uploading, downloading or both."""
    if dst.rstrip("/").endswith(PACK_SUFFIX):
        return "pack"
    if src.rstrip("/").endswith(PACK_SUFFIX):
        if is_store_url(dst):
            raise _cli.CommandError(
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
    raise _cli.CommandError(
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
            raise _cli.CommandError(
                f"{_where(dst)}: the copy does not hold the samples and media of {_where(src)}"
            )
        counts = {"samples": len(b), "media_files": len(b.media)}
    if ns.json:
        _print_json({"source": _where(src), "copy": _where(dst), "verified": "full", **counts})
    else:
        _say(
            f"copied {_where(src)} -> {_where(dst)} (fully verified: {counts['samples']} samples, "
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
        _print_json({"removed": _where(ns.bundle), "directory_kept": kept})
    else:
        note = " (the directory's other files are kept)" if kept else ""
        _say(f"removed {_where(ns.bundle)}{note}")
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
        raise _cli.CommandError(f"{ns.prefix}: gc takes an object-store URL (s3://bucket/prefix)", status=2)
    from bundles._errors import GarbagePrefixError
    from bundles._store import collect_garbage
    from bundles._urls import StoreURL

    try:
        report = collect_garbage(ns.prefix, older_than_s=ns.older_than, dry_run=ns.dry_run)
    except GarbagePrefixError as e:
        raise _cli.CommandError(str(e), status=2) from None  # the caller's prefix, not the data
    if ns.json:
        _print_json(
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
        _say(f"{verb} generation {bucket}/{g}/")
    for m in report.media:
        _say(f"{verb} media {bucket}/{m}")
    reasons: dict[str, list[Any]] = {}
    for k in report.skipped:
        reasons.setdefault(k.reason, []).append(k)
    for reason, places in reasons.items():  # one line per reason: what was kept, where, why
        shown = ", ".join(k.where for k in places[:3]) + (
            f", +{len(places) - 3} more" if len(places) > 3 else ""
        )
        _say(f"kept {sum(k.objects for k in places)} object(s) in {len(places)} place(s) ({shown}): {reason}")
    if report.clock != "store":
        _say(
            "ages measured on this machine's clock: the store refused gc's reference object "
            "(read-only credentials?); a run that deletes needs write access and uses the store's"
        )
    _say(
        f"{ns.prefix}: {report.bundles} live bundle(s); {verb} {len(report.generations)} generation(s) and "
        f"{len(report.media)} media file(s), {human_bytes(report.bytes)}; {report.kept_young} object(s) of "
        "garbage younger than --older-than kept"
    )
    return 0


def register(subparsers: Any) -> None:
    """Add the bundle subcommands (inspect, show, diff, verify, pack, unpack, ls, cp, rm, gc) to a
    ``rollout-bundle`` parser."""
    _register_reading(subparsers)
    _register_packing(subparsers)
    _register_locations(subparsers)


def _register_reading(subparsers: Any) -> None:
    """``inspect``, ``show``, ``diff`` and ``verify``: the commands that read a bundle."""
    p = _cli.add_command(
        subparsers, "inspect", "show a bundle's kind, counts, sizes, dedup ratio and meta", _inspect
    )
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    _cli.add_json_option(p)

    p = _cli.add_command(
        subparsers,
        "show",
        "print samples as JSON (arrays and tensors summarised, media as their bundle paths)",
        _show,
        description="Print samples as a JSON list of {position, sample}. Arrays and tensors are summarised "
        "as dtype and shape, long number lists (token ids, log-probs) as length and first values, media as "
        "their path inside the bundle (media/<sha256><suffix>); --full prints every value. Only the shards "
        "that hold the chosen samples are read.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument(
        "indices",
        metavar="INDEX",
        type=int,
        nargs="*",
        help="sample positions, from 0; negative counts from the end (default: every sample)",
    )
    p.add_argument(
        "--keys",
        metavar="A,B",
        help="only these key paths of each sample, e.g. reward,status,multimodal_inputs.images",
    )
    p.add_argument("--full", action="store_true", help="print arrays, tensors, bytes and long lists in full")

    p = _cli.add_command(
        subparsers,
        "diff",
        "report samples added, removed and changed (by key path) and media only in one bundle",
        _diff,
        description="Compare two bundles: samples added, removed and changed (listing the key paths that "
        "differ), meta changes and media stored in only one of them. Samples are matched by position, or "
        "with --by by the value at a key path. Media and arrays compare by content. Exit status 0 when "
        "the bundles hold the same samples and media, 1 when they differ.",
    )
    p.add_argument("a", metavar="A", help="the first bundle (directory or packed file)")
    p.add_argument("b", metavar="B", help="the second bundle (directory or packed file)")
    p.add_argument("--by", metavar="KEY", help="match samples by the value at this key path (e.g. index)")
    p.add_argument(
        "--limit",
        type=_cli.int_at_least(0),
        default=20,
        metavar="N",
        help="key paths listed per changed sample (default 20)",
    )
    _cli.add_json_option(p, "the differences")

    p = _cli.add_command(
        subparsers,
        "verify",
        "check a bundle's files against its manifest; exit 1 listing every problem",
        _verify,
        description="Check that a bundle holds exactly the files its manifest lists, with their sizes and "
        "shard digests (fast); with --full also re-hash every media file. Exit status 1 lists every "
        "problem found, not just the first.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    p.add_argument("--full", action="store_true", help="also re-hash every media file")
    _cli.add_json_option(p, "the verdict and every problem")
    _cli.add_progress_option(p)


def _register_packing(subparsers: Any) -> None:
    """``pack`` and ``unpack``."""
    p = _cli.add_command(subparsers, "pack", "pack a bundle directory into one file", _pack)
    p.add_argument("bundle", metavar="BUNDLE", help="the bundle directory to pack")
    p.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the packed file to write (.rbundle)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing output")
    _cli.add_json_option(p)
    _cli.add_progress_option(p)

    p = _cli.add_command(
        subparsers, "unpack", "unpack a packed bundle into a directory and fully verify it", _unpack
    )
    p.add_argument("file", metavar="FILE", help="the packed bundle file (.rbundle)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the bundle directory to create")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at the output")
    _cli.add_json_option(p)
    _cli.add_progress_option(p)


def _register_rm(subparsers: Any) -> None:
    """``rm`` and its ``--damaged``."""
    p = _cli.add_command(
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
    _cli.add_json_option(p)


def _register_ls(subparsers: Any) -> None:
    """``ls``: what it lists, how deep, and its exit status."""
    p = _cli.add_command(
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
    _cli.add_json_option(p, "the bundles")


def _register_locations(subparsers: Any) -> None:
    """``ls``, ``cp``, ``rm`` and ``gc``: the commands that list, copy and remove bundles."""
    _register_ls(subparsers)
    p = _cli.add_command(
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
    _cli.add_json_option(p)
    _cli.add_progress_option(p)

    _register_rm(subparsers)

    p = _cli.add_command(
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
    _cli.add_json_option(p)


def main(argv: list[str] | None = None) -> int:
    """A bundles-only entry point (``python -m bundles.cli``); ``rollout-bundle`` adds more."""
    return _cli.main_with(
        [register], "Self-contained, verifiable bundles of rollout samples and their media.", argv
    )


if __name__ == "__main__":
    sys.exit(main())
