"""The public entry points that take a location: write, open, pack, unpack, is there a bundle,
list the bundles under a root, remove one.

Each builds the :class:`~bundles._api.location.Location` its argument names, once
(:meth:`Location.of`, the only reader of a location's text), and delegates to it in one line:
what a directory, a packed file, a store prefix and a packed object on a store do differently is
theirs to know, so that code above :mod:`bundles` (checkpoint listings, retention, the
dashboard, the CLI) never asks which kind it holds; tests/test_locations.py runs the same
conformance suite on each.

The answers of :func:`is_bundle` are cheap and not proofs (a directory's manifest, a packed
file's name and type, a store prefix's pointer, a packed object's existence);
:func:`open_bundle` is what validates.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from bundles._api.location import Location
from bundles._errors import BundleFormatError
from bundles._format.options import LinkMode, OutsidePolicy, Verify
from bundles._local.reader import VERIFY_LEVELS, Bundle
from bundles._urls import local_path_only

__all__ = [
    "is_bundle",
    "list_bundles",
    "open_bundle",
    "pack_bundle",
    "remove_bundle",
    "unpack_bundle",
    "write_bundle",
]


def write_bundle(
    dest: str | os.PathLike[str] | Location,
    samples: Iterable[Any],
    *,
    media_roots: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
    kind: str = "debug_dump",
    meta: Mapping[str, Any] | None = None,
    link: LinkMode | str = "auto",
    overwrite: bool = False,
    progress: bool | None = None,
    missing_media: str = "error",
    outside_paths: OutsidePolicy = "warn",
    storage_options: Mapping[str, Any] | None = None,
    shared_media: bool = False,
) -> Location:
    """Write ``samples`` and every media file they reference into a new bundle at ``dest``.

    Args:
        dest: the bundle directory to create (its parent is created if missing), a packed file
            to create (a name ending in ``.rbundle``: written in scratch beside it and packed onto
            it atomically), an object-store URL (ending in ``.rbundle``: one packed object), or an
            object-store URL (``s3://bucket/prefix``, ``gs://``, ``az://``; needs the
            ``rollout-bundles[s3]`` extra), written with the commit protocol of
            docs/FORMAT.md §9 (:mod:`bundles._store`); any other URL scheme is refused.
        samples: dicts (as ``Sample.to_dict()`` gives) or objects with ``to_dict()``.
        media_roots: a directory (``str`` or path-like), or an iterable of them, whose files may
            be referenced by absolute path strings. Any ``str`` in a sample that is an absolute
            path inside one of them is a reference; all other strings are kept as they are.
            ``MediaRef`` values are references wherever they appear.
        outside_paths: what to do with an absolute path string outside every media root that
            names an existing file (kept as a string, it dangles once the file is gone):
            ``"warn"`` (default: one :class:`OutsidePathWarning` per write with the count and the
            first key paths), ``"error"`` (:class:`OutsidePathError` naming the key path, nothing
            written), ``"keep"`` (silently), or a callable taking the path and returning one of
            these, to decide per path (trainer_hooks refuses other runs' media this way).
        kind: what the bundle holds, e.g. ``"debug_dump"`` or ``"rollout_checkpoint"``.
        meta: a JSON-compatible dict kept in the manifest.
        link: ``"auto"`` (hardlink, else reflink, else copy), ``"hardlink"``, ``"reflink"`` or ``"copy"``.
        overwrite: replace an existing bundle at ``dest`` atomically.
        progress: draw a progress line (default: only on a terminal).
        missing_media: ``"error"`` (default): a path string inside a media root whose file does
            not exist is an error; ``"keep"``: it is kept as a plain string (a ``MediaRef`` to a
            missing file is an error either way).
        storage_options: for a URL only: obstore configuration (``endpoint``,
            ``access_key_id``, ``secret_access_key``, ``region``, ``allow_http``, ...) that
            overrides the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).
        shared_media: on a store, keep media in the content-addressed pool shared by the
            bundles beside this one (``<parent>/.media/``), so that a file referenced by many
            bundles of a run is uploaded once. Changes nothing in a directory, where bundles
            that reference one file already share it (hard links; ``link="copy"`` copies).

    Returns:
        The committed bundle's :class:`Location`: a :class:`~pathlib.Path` (absolute) for a
        local destination, a :class:`~bundles.StoreURL` for a URL; either is ``os.PathLike``
        and can be passed back to every function here.

    Raises:
        MediaMissingError: a referenced file is missing or disagrees with its reference; the
            message names the sample index and key path. Nothing is written in that case.
        UnsupportedValueError: a value cannot be stored without pickle.
        OutsidePathError: with ``outside_paths="error"``, a path string outside the media roots
            names a file.
        BundleExistsError: ``dest`` exists and ``overwrite`` is false.
        BundleIOError: the filesystem refused a write (no space, file too large, permissions);
            it names the file, keeps the ``OSError`` as ``__cause__``, and leaves nothing at ``dest``.

    Example:
        >>> write_bundle("/ckpt/dump_3", [s.to_dict() for s in samples], media_roots=[run_dir])

    (Its length is this documentation of a public signature; the body is one call, so it
    cannot be split.)
    """
    return Location.of(dest, storage_options).write_bundle(
        samples, media_roots=media_roots, kind=kind, meta=meta, link=link, overwrite=overwrite,
        progress=progress, missing_media=missing_media, outside_paths=outside_paths,
        shared_media=shared_media,
    )  # fmt: skip


def open_bundle(
    path: str | os.PathLike[str],
    *,
    verify: Verify | str = "fast",
    storage_options: Mapping[str, Any] | None = None,
) -> Bundle:
    """Open the bundle at ``path`` (a directory, or a packed file read in place) and verify it to
    the given level.

    Args:
        path: a bundle directory, or a packed bundle file (``.rbundle``). A packed file is read
            by member offsets without extracting it; its members are checked by the same rules
            as :func:`unpack_bundle` before anything in them is used. Or an object-store URL
            (``s3://bucket/prefix``, needs ``rollout-bundles[s3]``): read in place, shards
            streamed and media fetched lazily with range reads (docs/FORMAT.md §9).
        storage_options: for a URL only, as in :func:`write_bundle`.
        verify: ``"none"``, ``"fast"`` (files present with their sizes, shard digests) or
            ``"full"`` (also every media digest).

    Raises:
        BundleNotFoundError: no bundle there (or only a staging directory of an unfinished write).
        BundleFormatError: the manifest does not follow the format, e.g. an unknown ``format_version``.
        UnsafeBundleError: a packed file holds a member the unpack rules refuse, or is truncated.
        BundleVerificationError: verification failed; ``.problems`` lists every bad file.
    """
    level = Verify.parse(verify)
    if level is None:
        raise BundleFormatError(f"verify: expected one of {', '.join(VERIFY_LEVELS)}, found {verify!r}")
    return Location.of(path, storage_options).open_bundle(level)


def pack_bundle(
    path: str | os.PathLike[str],
    out_file: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Location:
    """Pack the bundle at ``path`` into the single file ``out_file`` (written atomically).

    The bundle is verified (fast level) first, and every file's digest is checked while it is
    packed, so a damaged bundle is never packed. ``path`` may itself be a packed file (repacking
    reads it in place). Either may be on an object store (``out_file`` a URL ending in
    ``.rbundle`` is uploaded in one atomic put); ``storage_options`` serve both.

    Raises:
        BundleVerificationError: a file of the bundle disagrees with the manifest.
        BundleError: ``out_file`` exists (without ``overwrite``), is a directory, or is the input,
            inside it or around it; writing it failed (the ``OSError`` is the ``__cause__``).
    """
    source, out = Location.of_all(path, out_file, storage_options=storage_options)
    with source.open_bundle(Verify.FAST) as b:
        return out.pack_from(b, overwrite=overwrite, progress=progress)


def unpack_bundle(
    packed: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Bundle:
    """Unpack a packed bundle into the new directory ``out_dir``, fully verify it, commit it.

    Every member is checked before anything is written, by the rules the in-place reader applies
    (:func:`bundles._local.archive.read_tar_index`). ``packed`` may be an object on a store
    (``storage_options`` as in :func:`write_bundle`); ``out_dir`` is local.

    Raises:
        BundleNotFoundError: ``packed`` does not exist.
        BundleExistsError: ``out_dir`` exists and ``overwrite`` is false.
        UnsafeBundleError: a member is absolute, holds ``..``, is a link, sparse or special file,
            appears twice or has a name outside the layout; or the file is truncated. Nothing is
            left at ``out_dir``.
        BundleError: ``out_dir`` is the packed file or contains it.
        BundleIOError: writing failed (the ``OSError`` is the ``__cause__``).
    """
    local_path_only(out_dir, "unpack output")
    return Location.of(packed, storage_options).unpack_to(out_dir, overwrite=overwrite, progress=progress)


def is_bundle(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when a bundle is *proven* at ``path`` (docs/FORMAT.md §5a): a directory (not a
    symlink, not a staging or retired directory) whose manifest parses and validates, a packed
    ``.rbundle`` file or object whose member index and manifest do, or a store prefix whose
    pointer names a generation of its own whose manifest validates (or a plain copy of a bundle
    directory). A web app's ``manifest.json``, a generation prefix and a damaged bundle are not.
    Cost: one bounded read of the manifest (two GETs on a store prefix; a packed bundle's member
    index); shards and media are not read: :func:`open_bundle` with ``verify`` checks those."""
    return Location.of(path, storage_options).has_bundle()


def remove_bundle(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None, *, damaged: bool = False
) -> None:
    """Delete the bundle at ``path``, and only what it owns, so that no reader ever finds half
    of it (docs/FORMAT.md §5 step 5, §5a and §9).

    Only a proven bundle is removed (:func:`is_bundle`), and of it only the members its validated
    manifest lists and the manifest itself. A directory that holds only the bundle is first
    renamed to a retired name (atomic), then removed; a crash in between leaves a retired
    directory that the next write into the same parent cleans up. A directory that holds anything
    else keeps it: its manifest goes first, then the files the manifest lists. A packed file or a
    packed object is one unlink or one delete. On a store the pointer goes first, then the media
    its manifests list and its generations; a user's objects beside it, a nested bundle and a
    shared pool are left (the pool's unreferenced media go to :func:`bundles.collect_garbage`).

    ``damaged``: a bundle whose manifest (or pointer) claims the format but does not validate is
    refused without it (the message names what failed); with it, only the names the format
    produces go (``manifest.json``, ``samples/NNNNNN.msgpack.zst``, ``media/<64 hex><suffix>``; on
    a store the pointer and its generations). Anything that is no bundle (a web app's
    ``manifest.json``, a user's ``bundle.json``, a generation of a bundle) raises
    :class:`BundleNotFoundError` and nothing is deleted. A bundle removed by someone else
    meanwhile raises :class:`BundleNotFoundError`, as if it had never been there."""
    Location.of(path, storage_options).remove_bundle(damaged)


def child_location(root: str | os.PathLike[str], rel: str) -> Location:
    """The location ``rel`` (``/``-separated parts) below ``root``, as the entry points return
    locations (a :class:`Location`: an absolute :class:`~pathlib.Path` under a local directory,
    a :class:`bundles.StoreURL` under a store URL). Lets a tool name ``<save>/rollout/fully_async_3`` without
    asking which kind of location ``<save>`` is. An empty ``rel`` gives ``root`` itself, made
    absolute or normalised (what a report records of where a bundle was read). Naming needs no
    store client: a store URL is named even where obstore is not installed."""
    return Location.of(root).child(rel)


def list_bundles(root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The bundles right under ``root`` (one level), sorted: directories and packed files
    locally, prefixes with a pointer and packed objects on a store, each as the location to pass
    to :func:`open_bundle`. What is not a bundle (media pools, staging directories, a dead
    writer's unpublished prefix, other files) is left out. A ``root`` that does not exist holds
    none."""
    return [str(loc) for loc in Location.of(root, storage_options).list_bundles()]
