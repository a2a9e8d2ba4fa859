"""The bundle subcommands of ``rollout-bundle``: inspect, verify, pack, unpack.

:func:`register` adds them to a ``rollout-bundle`` parser (see :mod:`bundles._cli` for what
every subcommand shares); the ``rollout-bundle`` entry point (:mod:`trainer_hooks.cli`) adds the
training-side commands beside them. ``python -m bundles.cli`` runs the bundle commands alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from bundles._cli import add_command, add_json_option, add_progress_option, main_with
from bundles._pack import pack_bundle, unpack_bundle
from bundles._progress import _human_bytes
from bundles._reader import open_bundle

__all__ = ["main", "register"]

BUNDLE_HELP = "a bundle directory or a packed bundle file"


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _inspect(ns: argparse.Namespace) -> int:
    bundle = open_bundle(ns.bundle, verify="none")
    refs = bundle.media_references
    stored = len(bundle.media)
    info: dict[str, Any] = {
        "path": str(bundle.path),
        "kind": bundle.kind,
        "format_version": bundle.manifest["format_version"],
        "created_by": bundle.manifest.get("created_by"),
        "samples": len(bundle),
        "shards": len(bundle.manifest["shards"]),
        "media_files": stored,
        "media_bytes": bundle.media_bytes,
        "media_references": refs,
        "dedup_ratio": round(refs / stored, 3) if stored else None,
        "meta": bundle.meta,
    }
    if ns.json:
        _print_json(info)
        return 0
    print(f"bundle        {info['path']}")
    print(f"kind          {info['kind']} (format_version {info['format_version']}, {info['created_by']})")
    print(f"samples       {info['samples']} in {info['shards']} shard(s)")
    print(f"media         {stored} file(s), {_human_bytes(info['media_bytes'])}")
    ratio = f"{refs / stored:.2f}x" if stored else "n/a"
    print(f"references    {refs} (dedup ratio {ratio})")
    print(
        "meta          " + json.dumps(bundle.meta, sort_keys=True, indent=2).replace("\n", "\n              ")
    )
    return 0


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
        print(f"{bundle.path}: {len(problems)} problem(s) ({level} verification):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"{bundle.path}: OK ({level} verification: {len(bundle)} samples, {len(bundle.media)} media files)")
    return 0


def _pack(ns: argparse.Namespace) -> int:
    out = pack_bundle(ns.bundle, ns.output, overwrite=ns.force, progress=ns.progress)
    size = os.path.getsize(out)
    if ns.json:
        _print_json({"bundle": os.path.abspath(ns.bundle), "output": str(out), "bytes": size})
    else:
        print(f"packed {ns.bundle} -> {out} ({_human_bytes(size)})")
    return 0


def _unpack(ns: argparse.Namespace) -> int:
    bundle = unpack_bundle(ns.file, ns.output, overwrite=ns.force, progress=ns.progress)
    if ns.json:
        _print_json(
            {
                "packed": os.path.abspath(ns.file),
                "output": str(bundle.path),
                "verified": "full",
                "samples": len(bundle),
                "media_files": len(bundle.media),
            }
        )
    else:
        print(
            f"unpacked {ns.file} -> {bundle.path} (fully verified: {len(bundle)} samples, "
            f"{len(bundle.media)} media files)"
        )
    return 0


def register(subparsers: Any) -> None:
    """Add ``inspect``, ``verify``, ``pack`` and ``unpack`` to a ``rollout-bundle`` parser."""
    p = add_command(
        subparsers, "inspect", "show a bundle's kind, counts, sizes, dedup ratio and meta", _inspect
    )
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE_HELP)
    add_json_option(p)

    p = add_command(
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
    add_json_option(p, "the verdict and every problem")
    add_progress_option(p)

    p = add_command(subparsers, "pack", "pack a bundle directory into one file", _pack)
    p.add_argument("bundle", metavar="BUNDLE", help="the bundle directory to pack")
    p.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the packed file to write (.rbundle)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing output")
    add_json_option(p)
    add_progress_option(p)

    p = add_command(
        subparsers, "unpack", "unpack a packed bundle into a directory and fully verify it", _unpack
    )
    p.add_argument("file", metavar="FILE", help="the packed bundle file (.rbundle)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the bundle directory to create")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at the output")
    add_json_option(p)
    add_progress_option(p)


def main(argv: list[str] | None = None) -> int:
    """A bundles-only entry point (``python -m bundles.cli``); ``rollout-bundle`` adds more."""
    return main_with(
        [register], "Self-contained, verifiable bundles of rollout samples and their media.", argv
    )


if __name__ == "__main__":
    sys.exit(main())
