"""Finding the bundles under a root for ``rollout-bundle ls``: one level, or a walk below it.

:func:`find_bundles` asks :func:`bundles.list_bundles` (and so the one rule that decides what is a
bundle) at each level it visits; it never decides by itself. What it adds is how a listing
survives what it meets:

* one entry that cannot be read (a manifest that is gone, a directory without permission, a
  name the store refuses) is a problem on that entry, and every other entry is still listed:
  when a level's listing fails, its entries are asked one by one;
* ``depth`` levels below the root are walked (``ls -r``), as a run lays its bundles out
  (``<save>/rollout/fully_async_3``, ``<dump>/debug/rollout_3.bundle``): a bundle is not looked
  into, nor a hidden name (a media pool, a staging directory), nor a symbolic link (a walk never
  leaves the root), nor a store's generation prefix. The default depth is the limit
  ``MAX_FIND_DEPTH`` (:mod:`bundles._format.limits`), the depth serve's run listing uses
  (``trainer_hooks/serve/_run.py`` keeps its own walk, with the same rule, for now: it also
  drops bundles whose real path leaves ROOT; it can call this one later).

Costs: one listing per level visited (a ``scandir``, or one delimited listing on a store), plus
what :func:`bundles.list_bundles` reads per entry; never more than ``depth`` levels.

Limitation: obstore (the store client) refuses a whole listing page that holds a key it cannot
parse as a path (a control character in the key). Such a prefix is reported as one problem naming
it; the entries of that page cannot be listed one by one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bundles._api.entry import is_bundle, list_bundles
from bundles._api.location import Location
from bundles._errors import BundleError
from bundles._format.layout import STORE_GENERATION_RE, STORE_MEDIA_POOL
from bundles._format.limits import MAX_FIND_DEPTH

__all__ = ["Listing", "find_bundles"]


@dataclass
class Listing:
    """What :func:`find_bundles` found: ``bundles`` (locations, sorted) and ``problems``
    (``(where, message)`` for each entry or level that could not be read, in the order met)."""

    bundles: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _one_by_one(where: Location, found: Listing) -> list[str]:
    """The bundles right under the local directory ``where``, each entry asked alone."""
    try:
        entries = sorted(os.scandir(where), key=lambda e: e.name)
    except OSError as e:
        found.problems.append((str(where), f"cannot list it: {_reason(e)}"))
        return []
    out: list[str] = []
    for entry in entries:
        try:
            child = Location.of(os.path.join(where, entry.name))
            if child.has_bundle():
                out.append(str(child))
        except (BundleError, OSError, ValueError) as e:
            found.problems.append((os.path.join(where, entry.name), _reason(e)))
    return out


def _level(where: Location, found: Listing, storage_options: Mapping[str, Any] | None) -> list[str]:
    """The bundles right under ``where``; a failed listing is retried entry by entry (locally)
    or reported as the level's problem (on a store)."""
    try:
        return list_bundles(where, storage_options)
    except (BundleError, OSError, ValueError) as e:
        if where.uploads:
            found.problems.append((str(where), _reason(e)))
            return []
    return _one_by_one(where, found)


def _below(where: Location, taken: set[str], storage_options: Mapping[str, Any] | None) -> list[Location]:
    """The places one level below ``where`` a walk looks into: not a bundle found there, not a
    hidden name, not a symbolic link, not a store's generation or media pool."""
    if where.uploads:
        from bundles._store.client import get_store
        from bundles._urls import StoreURL

        url = StoreURL(str(where))
        names = get_store(url, storage_options).children(url.key)
        return [
            Location.of(str(url.child(n)), storage_options)
            for n in sorted(names)
            if not n.startswith(".") and n != STORE_MEDIA_POOL and not STORE_GENERATION_RE.fullmatch(n)
            and str(url.child(n)) not in taken
        ]  # fmt: skip
    out: list[Location] = []
    for entry in sorted(os.scandir(where), key=lambda e: e.name):
        path = os.path.join(where, entry.name)
        if entry.name.startswith(".") or path in taken:
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                out.append(Location.of(path))
        except (BundleError, OSError, ValueError):
            continue  # unreadable or unnameable: not walked into (a bundle there was reported)
    return out


def _walk(where: Location, depth: int, found: Listing, storage_options: Mapping[str, Any] | None) -> None:
    here = _level(where, found, storage_options)
    found.bundles += here
    if depth <= 0:
        return
    try:
        below = _below(where, set(here), storage_options)
    except (BundleError, OSError, ValueError) as e:
        found.problems.append((str(where), f"cannot look below it: {_reason(e)}"))
        return
    for child in below:
        _walk(child, depth - 1, found, storage_options)


def find_bundles(
    root: str | os.PathLike[str],
    *,
    depth: int = 0,
    storage_options: Mapping[str, Any] | None = None,
) -> Listing:
    """The bundles right under ``root`` and, with ``depth`` > 0, up to ``depth`` levels below it
    (``MAX_FIND_DEPTH`` is serve's rule); a ``root`` that is itself a bundle, and holds none, is
    listed as itself. Never raises for one entry: see :class:`Listing`."""
    if depth < 0 or depth > MAX_FIND_DEPTH:
        raise BundleError(f"find_bundles: depth: expected 0..{MAX_FIND_DEPTH}, found {depth!r}")
    at = Location.of(root, storage_options)
    found = Listing()
    a_file = not at.uploads and os.path.lexists(at) and not os.path.isdir(at)
    if not a_file:  # a packed bundle is not looked into: it is asked about as itself, below
        _walk(at, depth, found, storage_options)
    if not found.bundles and not found.problems:
        try:
            if is_bundle(at, storage_options):
                found.bundles = [str(at)]  # `ls BUNDLE` names the bundle, as ls FILE names the file
            elif a_file:
                found.problems.append((str(at), "not a bundle, nor a directory to look into"))
        except (BundleError, OSError, ValueError) as e:
            found.problems.append((str(at), _reason(e)))
    found.bundles = sorted(set(found.bundles))
    return found
