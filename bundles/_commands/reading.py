"""The commands that read a bundle: ``inspect``, ``show``, ``diff`` and ``verify``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bundles._api.entry import open_bundle
from bundles._commands import common
from bundles._commands.diff import DiffKeyError, diff_bundles
from bundles._commands.output import BUNDLE_HELP, plural, print_json, say
from bundles._commands.show import dumps_pretty, parse_key_paths, select, to_json
from bundles._format.layout import MEDIA_DIR
from bundles._local.progress import human_bytes


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
        print_json(info)
        return 0
    say(f"bundle        {info['path']}")
    say(f"kind          {info['kind']} (format_version {info['format_version']}, {info['created_by']})")
    say(f"samples       {info['samples']} in {info['shards']} shard(s)")
    say(f"media         {stored} file(s), {human_bytes(info['media_bytes'])}")
    ratio = f"{refs / stored:.2f}x" if stored else "n/a"
    say(f"references    {refs} (dedup ratio {ratio})")
    # ensure_ascii: no raw newline in a string, so each line of the indented JSON is one line.
    meta = json.dumps(bundle.meta, sort_keys=True, indent=2, ensure_ascii=True).splitlines()
    for k, line in enumerate(meta):
        say(("meta          " if k == 0 else "              ") + line)
    return 0


def _show(ns: argparse.Namespace) -> int:
    bundle = open_bundle(ns.bundle, verify="none")
    keys = parse_key_paths(ns.keys) if ns.keys is not None else None
    n = len(bundle)
    for i in ns.indices:
        if not -n <= i < n:
            raise common.CommandError(  # the caller's index, like a --keys typo: exit 2
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
        raise common.CommandError(
            f"{bundle.path}: --keys: {', '.join(repr(m) for m in missing)}: no such key path in any "
            f"shown sample (their top-level keys: {shown_keys or 'none'})",
            status=2,
        )
    texts.append("\n]\n" if positions else "]\n")
    out.write("".join(texts))
    return 0


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
        raise common.CommandError(str(e), status=2) from None
    if ns.json:
        print_json(report)
        return 0 if report["same"] else 1
    for side in ("a", "b"):
        r = report[side]
        say(
            f"{side.upper()}: {r['path']} ({r['kind']}, {plural(r['samples'], 'sample')}, "
            f"{plural(r['media_files'], 'media file')})"
        )
    if report["kind"]:
        say(f"kind: {report['kind']['a']} -> {report['kind']['b']}")
    for c in report["meta"]["changes"]:
        say("  " + _change_line(c))
    if report["meta"]["more"]:
        say(f"  ... and {report['meta']['more']} more meta change(s)")
    samples = report["samples"]
    what = "sample" if report["by"] == "position" else f"sample {report['by']}="
    for c in samples["changed"]:
        where = f"{what}{c['key']}" if report["by"] != "position" else f"sample {c['key']}"
        if report["by"] != "position" and c["position_a"] != c["position_b"]:
            where += f" (position {c['position_a']} -> {c['position_b']})"
        say(f"{where} changed:")
        for change in c["changes"]:
            say("  " + _change_line(change))
        if c["more"]:
            say(f"  ... and {c['more']} more")
    sep = "" if report["by"] == "position" else f"{report['by']}="
    for key in samples["removed"]:
        say(f"sample {sep}{key} only in A (removed)")
    for key in samples["added"]:
        say(f"sample {sep}{key} only in B (added)")
    media = report["media"]
    for side, label in (("only_in_a", "A"), ("only_in_b", "B")):
        for m in media[side]:
            say(f"media only in {label}: {m['path']} ({human_bytes(m['size'])})")
    say(
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
        print_json(
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
        say(f"{bundle.path}: {len(problems)} problem(s) ({level} verification):", file=sys.stderr)
        for p in problems:
            say(f"  - {p}", file=sys.stderr)
        return 1
    say(f"{bundle.path}: OK ({level} verification: {len(bundle)} samples, {len(bundle.media)} media files)")
    return 0


def register(subparsers: Any) -> None:
    """``inspect``, ``show``, ``diff`` and ``verify``: the commands that read a bundle."""
    _register_inspect_and_show(subparsers)
    _register_diff(subparsers)
    _register_verify(subparsers)


def _register_inspect_and_show(subparsers: Any) -> None:
    p = common.add_command(
        subparsers, "inspect", "show a bundle's kind, counts, sizes, dedup ratio and meta", _inspect
    )
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    common.add_json_option(p)

    p = common.add_command(
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


def _register_diff(subparsers: Any) -> None:
    p = common.add_command(
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
        type=common.int_at_least(0),
        default=20,
        metavar="N",
        help="key paths listed per changed sample (default 20)",
    )
    common.add_json_option(p, "the differences")


def _register_verify(subparsers: Any) -> None:
    p = common.add_command(
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
    common.add_json_option(p, "the verdict and every problem")
    common.add_progress_option(p)
