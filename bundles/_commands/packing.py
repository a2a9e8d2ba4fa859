"""``pack`` and ``unpack``: a bundle directory into one file and back."""

from __future__ import annotations

import argparse
import os
from typing import Any

from bundles._api.entry import open_bundle, pack_bundle, unpack_bundle
from bundles._api.location import Location
from bundles._commands import common
from bundles._commands.output import location_shown, print_json, say
from bundles._local.progress import human_bytes


def _pack(ns: argparse.Namespace) -> int:
    out_at = Location.of(ns.output)
    if not out_at.uploads and os.path.isdir(out_at):  # the caller's -o: exit 2
        raise common.CommandError(f"-o {ns.output}: is a directory; name the file to write", status=2)
    out = pack_bundle(ns.bundle, ns.output, overwrite=ns.force, progress=ns.progress)
    with open_bundle(out, verify="none") as packed:
        size = packed.stored_bytes  # the file's (or the object's) size
    if ns.json:
        print_json({"bundle": location_shown(ns.bundle), "output": str(out), "bytes": size})
    else:
        say(f"packed {ns.bundle} -> {out} ({human_bytes(size)})")
    return 0


def _unpack(ns: argparse.Namespace) -> int:
    bundle = unpack_bundle(ns.file, ns.output, overwrite=ns.force, progress=ns.progress)
    if ns.json:
        print_json(
            {
                "packed": location_shown(ns.file),
                "output": str(bundle.path),
                "verified": "full",
                "samples": len(bundle),
                "media_files": len(bundle.media),
            }
        )
    else:
        say(
            f"unpacked {ns.file} -> {bundle.path} (fully verified: {len(bundle)} samples, "
            f"{len(bundle.media)} media files)"
        )
    return 0


def register(subparsers: Any) -> None:
    """``pack`` and ``unpack``."""
    p = common.add_command(subparsers, "pack", "pack a bundle directory into one file", _pack)
    p.add_argument("bundle", metavar="BUNDLE", help="the bundle directory to pack")
    p.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the packed file to write (.rbundle)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing output")
    common.add_json_option(p)
    common.add_progress_option(p)

    p = common.add_command(
        subparsers, "unpack", "unpack a packed bundle into a directory and fully verify it", _unpack
    )
    p.add_argument("file", metavar="FILE", help="the packed bundle file (.rbundle)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the bundle directory to create")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at the output")
    common.add_json_option(p)
    common.add_progress_option(p)
