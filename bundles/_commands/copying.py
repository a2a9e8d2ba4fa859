"""``cp``: a bundle copied between a directory, a packed file and an object store, verified in full."""

from __future__ import annotations

import argparse
import os
from typing import Any

from bundles._api.entry import open_bundle, pack_bundle, unpack_bundle
from bundles._commands import common
from bundles._commands.output import BUNDLE_HELP, location_shown, print_json, say
from bundles._format.layout import PACK_SUFFIX
from bundles._local.commit import scratch_dir
from bundles._local.fs import remove_tree
from bundles._urls import is_store_url


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


def register(subparsers: Any) -> None:
    """``cp``."""
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
