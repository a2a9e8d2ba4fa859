"""What is at a location, for every kind of location: is there a bundle, which bundles lie under a
root, remove one.

A bundle lives in one of four kinds of location, told apart once, here, by the location's text:
a local directory, a local packed file (``.rbundle``), a prefix on an object store, and a packed
file on a store (a URL ending in ``.rbundle``). Each operation below answers for all four, so
that code above :mod:`bundles` (checkpoint listings, retention, the dashboard) never asks which
kind it holds; tests/test_locations.py runs the same conformance suite on each.

The answers are cheap and not proofs: :func:`is_bundle` looks for the marker each kind has (a
directory's manifest, a packed file's name and type, a store prefix's pointer, a packed object's
existence); :func:`bundles.open_bundle` is what validates.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bundles._commit import is_bundle_dir, is_staging_name, remove_bundle_dir
from bundles._errors import BundleError, BundleNotFoundError
from bundles._layout import PACK_SUFFIX
from bundles._location import classify

__all__ = ["is_bundle", "list_bundles", "remove_bundle"]


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
        from bundles._remote import is_remote_bundle, object_exists

        if _packed_name(text):
            return object_exists(text, storage_options)
        return is_remote_bundle(text, storage_options)
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
        from bundles._remote import remove_packed_object, remove_remote_bundle

        if _packed_name(text):
            remove_packed_object(text, storage_options)
        else:
            remove_remote_bundle(text, storage_options)
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


def list_bundles(root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The bundles right under ``root`` (one level), sorted: directories and packed files
    locally, prefixes with a pointer and packed objects on a store, each as the location to pass
    to :func:`open_bundle`. What is not a bundle (media pools, staging directories, a dead
    writer's unpublished prefix, other files) is left out. A ``root`` that does not exist holds
    none."""
    text = os.fspath(root)
    if classify(text) == "store":
        from bundles._remote import list_packed_objects, list_remote_bundles

        found = [str(u) for u in list_remote_bundles(text, storage_options).values()]
        return sorted(found + list_packed_objects(text, storage_options))
    base = Path(os.path.abspath(text))
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise BundleError(f"{base}: cannot list it: {e.strerror}") from e
    return [str(base / e.name) for e in entries if is_bundle(base / e.name)]
