"""The bundle subcommands of ``rollout-bundle``: inspect, verify, pack, unpack.

``add_commands(subparsers)`` registers them; the ``rollout-bundle`` entry point
(:mod:`trainer_hooks.cli`) adds the training-side commands beside them. Each subcommand sets
``func``, a callable taking the parsed namespace and returning the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bundles._errors import BundleError, BundleVerificationError
from bundles._pack import pack_bundle, unpack_bundle
from bundles._progress import _human_bytes
from bundles._reader import open_bundle


def _inspect(ns: argparse.Namespace) -> int:
    bundle = open_bundle(ns.path, verify="none")
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
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(f"bundle        {info['path']}")
    print(f"kind          {info['kind']} (format_version {info['format_version']}, {info['created_by']})")
    print(f"samples       {info['samples']} in {info['shards']} shard(s)")
    print(f"media         {stored} file(s), {_human_bytes(info['media_bytes'])}")
    ratio = f"{refs / stored:.2f}x" if stored else "n/a"
    print(f"references    {refs} (dedup ratio {ratio})")
    print("meta          " + json.dumps(bundle.meta, sort_keys=True, indent=2).replace("\n", "\n              "))
    return 0


def _verify(ns: argparse.Namespace) -> int:
    bundle = open_bundle(ns.path, verify="none")
    problems = bundle.problems(full=ns.full, progress=None)
    level = "full" if ns.full else "fast"
    if problems:
        print(f"{bundle.path}: {len(problems)} problem(s) ({level} verification):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"{bundle.path}: OK ({level} verification: {len(bundle)} samples, {len(bundle.media)} media files)")
    return 0


def _pack(ns: argparse.Namespace) -> int:
    out = pack_bundle(ns.path, ns.output, overwrite=ns.force, progress=None)
    print(f"packed {ns.path} -> {out}")
    return 0


def _unpack(ns: argparse.Namespace) -> int:
    bundle = unpack_bundle(ns.file, ns.output, overwrite=ns.force, progress=None)
    print(f"unpacked {ns.file} -> {bundle.path} (fully verified: {len(bundle)} samples, {len(bundle.media)} media)")
    return 0


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser("inspect", help="show a bundle's kind, counts, sizes, dedup ratio and meta")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_inspect)

    p = subparsers.add_parser("verify", help="check a bundle; exit 1 listing every problem")
    p.add_argument("path")
    p.add_argument("--full", action="store_true", help="also re-hash every media file")
    p.set_defaults(func=_verify)

    p = subparsers.add_parser("pack", help="pack a bundle directory into one file")
    p.add_argument("path")
    p.add_argument("-o", "--output", required=True, help="the packed file to write")
    p.add_argument("--force", action="store_true", help="replace an existing output")
    p.set_defaults(func=_pack)

    p = subparsers.add_parser("unpack", help="unpack and fully verify a packed bundle")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True, help="the bundle directory to create")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at the output")
    p.set_defaults(func=_unpack)


def run(func: Any, ns: argparse.Namespace) -> int:
    """Run a subcommand, turning a :class:`BundleError` into a message and exit status 1."""
    try:
        return int(func(ns))
    except BundleVerificationError as e:
        print(str(e), file=sys.stderr)
        return 1
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """A bundles-only entry point (``python -m bundles.cli``); ``rollout-bundle`` adds more."""
    parser = argparse.ArgumentParser(prog="rollout-bundle")
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)
    ns = parser.parse_args(argv)
    return run(ns.func, ns)


if __name__ == "__main__":
    sys.exit(main())
