"""The public entry points that take a location: write, open, pack, unpack, is there a bundle,
list the bundles under a root, remove one.

A bundle lives in one of four kinds of location, told apart once, here, by the location's text:
a local directory, a local packed file (``.rbundle``), a prefix on an object store, and a packed
file on a store (a URL ending in ``.rbundle``). Each entry point answers for all four, so that
code above :mod:`bundles` (checkpoint listings, retention, the dashboard, the CLI) never asks
which kind it holds; tests/test_locations.py runs the same conformance suite on each.

This module is the only one that knows both halves: the local modules (:mod:`bundles._writer`,
:mod:`bundles._reader`, :mod:`bundles._pack`, :mod:`bundles._commit`) know nothing of stores, and
:mod:`bundles._remote` builds on them (it writes a bundle locally and uploads it, reads through
the local :class:`~bundles._reader.Bundle` with a source of its own). Imports point one way:
``_entry -> _remote -> local``, with no import made inside a function to break a circle.

The answers are cheap and not proofs: :func:`is_bundle` looks for the marker each kind has (a
directory's manifest, a packed file's name and type, a store prefix's pointer, a packed object's
existence); :func:`bundles.open_bundle` is what validates.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bundles import _remote
from bundles._commit import is_bundle_dir, is_staging_name, remove_bundle_dir
from bundles._errors import BundleError, BundleFormatError, BundleNotFoundError
from bundles._layout import PACK_SUFFIX
from bundles._location import STORE_SCHEMES, classify, local_path_only, url_scheme
from bundles._options import LinkMode, OutsidePolicy, Verify
from bundles._pack import pack_local, unpack_local
from bundles._reader import VERIFY_LEVELS, Bundle, open_local
from bundles._store import StoreURL
from bundles._writer import write_local

__all__ = [
    "is_bundle",
    "list_bundles",
    "open_bundle",
    "pack_bundle",
    "remove_bundle",
    "unpack_bundle",
    "write_bundle",
]


def _local_only(location: object, storage_options: object) -> None:
    if storage_options is not None:
        raise BundleError(f"{location}: storage_options apply to object-store URLs only")


def write_bundle(
    dest: str | os.PathLike[str],
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
) -> Path:
    """Write ``samples`` and every media file they reference into a new bundle at ``dest``.

    Args:
        dest: the bundle directory to create (its parent is created if missing), or an
            object-store URL (``s3://bucket/prefix``, ``gs://``, ``az://``; needs the
            ``rollout-bundles[s3]`` extra), written with the commit protocol of
            docs/FORMAT.md §9 (:mod:`bundles._remote`); any other URL scheme is refused.
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
        The absolute path of the committed bundle (for a URL: its ``StoreURL``).

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
    """
    options: dict[str, Any] = {
        "media_roots": media_roots,
        "kind": kind,
        "meta": meta,
        "link": link,
        "overwrite": overwrite,
        "progress": progress,
        "missing_media": missing_media,
        "outside_paths": outside_paths,
    }
    if classify(dest) == "store":
        # A StoreURL is a str, not a Path: the return type is the local one, as documented.
        url: Any = _remote.write_remote_bundle(
            str(dest), samples, storage_options=storage_options, shared_media=shared_media, **options
        )
        return url
    _local_only(dest, storage_options)
    return write_local(dest, samples, **options)


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
            as :func:`unpack_bundle` before anything is read. Or an object-store URL
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
    if classify(path) == "store":
        return _remote.open_remote_bundle(str(path), verify=level, storage_options=storage_options)
    _local_only(path, storage_options)
    return open_local(path, level)


def pack_bundle(
    path: str | os.PathLike[str],
    out_file: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
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
    out_is_url = classify(out_file, "pack output") == "store"
    if not out_is_url and classify(path) != "store":
        _local_only(path, storage_options)
    with open_bundle(
        path, verify="fast", storage_options=storage_options if classify(path) == "store" else None
    ) as b:
        if out_is_url:
            url: Any = _remote.pack_to_store(
                b, str(out_file), overwrite=overwrite, progress=progress, storage_options=storage_options
            )
            return url
        return pack_local(b, out_file, overwrite=overwrite, progress=progress)


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
    (:func:`bundles._source.read_tar_index`). ``packed`` may be an object on a store
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
    if classify(packed, "packed bundle") == "store":
        return _remote.unpack_from_store(
            str(packed), out_dir, overwrite=overwrite, progress=progress, storage_options=storage_options
        )
    _local_only(packed, storage_options)
    return unpack_local(packed, out_dir, overwrite=overwrite, progress=progress)


def _packed_name(text: str) -> bool:
    return text.endswith(PACK_SUFFIX) and len(text.rstrip("/").rsplit("/", 1)[-1]) > len(PACK_SUFFIX)


def _is_packed_file(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise BundleError(f"{path}: cannot look at it: {e.strerror}") from e
    return stat.S_ISREG(st.st_mode) and not is_staging_name(path.name)


def is_bundle(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when ``path`` holds a committed bundle: a bundle directory (not a symlink, not a
    staging or retired directory, with a manifest), a packed ``.rbundle`` regular file, a store
    prefix with a pointer (or a plain copy of a bundle directory), or a packed object on a store.
    Cheap (a stat or two, one or two requests); :func:`open_bundle` is what validates it."""
    text = os.fspath(path)
    if classify(text) == "store":
        if _packed_name(text):
            return _remote.object_exists(text, storage_options)
        return _remote.is_remote_bundle(text, storage_options)
    if _packed_name(text):
        return _is_packed_file(Path(os.path.abspath(text)))
    return is_bundle_dir(text)


def remove_bundle(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the bundle at ``path`` so that no reader ever finds half of it.

    A directory is first renamed to a retired name (atomic), then removed; a crash in between
    leaves a retired directory that the next write into the same parent cleans up. A packed file
    or a packed object is one unlink or one delete. On a store the pointer goes first, then the
    generation and, unless pooled, the media. Only a bundle is removed: anything else raises. A
    bundle removed by someone else meanwhile raises :class:`BundleNotFoundError`, as if it had
    never been there."""
    text = os.fspath(path)
    if classify(text) == "store":
        if _packed_name(text):
            _remote.remove_packed_object(text, storage_options)
        else:
            _remote.remove_remote_bundle(text, storage_options)
        return
    if not _packed_name(text):
        remove_bundle_dir(text)
        return
    dest = Path(os.path.abspath(text))
    if not _is_packed_file(dest):
        if not os.path.lexists(dest):
            raise BundleNotFoundError(f"{dest}: no bundle here (path does not exist)")
        raise BundleNotFoundError(f"{dest}: not a packed bundle (not a regular file); refusing to remove it")
    try:
        os.unlink(dest)
    except FileNotFoundError:
        raise BundleNotFoundError(f"{dest}: no bundle here (removed meanwhile by another process)") from None
    except OSError as e:
        raise BundleError(f"{dest}: cannot remove: {e.strerror}") from e


def child_location(root: str | os.PathLike[str], rel: str) -> Path:
    """The location ``rel`` (``/``-separated parts) below ``root``, as the entry points return
    locations: an absolute :class:`~pathlib.Path` under a local directory, a
    :class:`bundles.StoreURL` under a store URL (a ``str``; typed as the local case, as
    :func:`write_bundle` documents). Lets a tool name ``<save>/rollout/fully_async_3`` without
    asking which kind of location ``<save>`` is. An empty ``rel`` gives ``root`` itself, made
    absolute or normalised (what a report records of where a bundle was read). Naming needs no
    store client: a store URL is named even where obstore is not installed."""
    text = os.fspath(root)
    if url_scheme(text) in STORE_SCHEMES:
        url: Any = StoreURL(text).child(rel) if rel else StoreURL(text)
        return url
    classify(text)  # refuses any other URL scheme, and a store URL whose '//' was collapsed
    path = Path(os.path.abspath(text))
    return path.joinpath(*rel.split("/")) if rel else path


def list_bundles(root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The bundles right under ``root`` (one level), sorted: directories and packed files
    locally, prefixes with a pointer and packed objects on a store, each as the location to pass
    to :func:`open_bundle`. What is not a bundle (media pools, staging directories, a dead
    writer's unpublished prefix, other files) is left out. A ``root`` that does not exist holds
    none."""
    text = os.fspath(root)
    if classify(text) == "store":
        found = [str(u) for u in _remote.list_remote_bundles(text, storage_options).values()]
        return sorted(found + _remote.list_packed_objects(text, storage_options))
    base = Path(os.path.abspath(text))
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise BundleError(f"{base}: cannot list it: {e.strerror}") from e
    return [str(base / e.name) for e in entries if is_bundle(base / e.name)]
