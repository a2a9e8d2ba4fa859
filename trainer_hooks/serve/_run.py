"""The bundles of a run: found under ROOT once, and again on ``--follow``.

ROOT is a run's ``--save`` or ``--dump-details`` directory (bundles a few levels down:
``rollout/fully_async_3``, ``debug/rollout_3.bundle``), one bundle, or a store prefix. Every
bundle is found through :func:`bundles.list_bundles` and opened with
:func:`bundles.open_bundle` (manifest only, ``verify="none"``: the server reads shards and media
when a page needs them, and every read checks what it reads), so only committed bundles ever
appear: a staging directory, a dead writer's unpublished prefix or a retired directory is not
a bundle to ``list_bundles``.

Nothing below ROOT is reached by a URL's text. Each bundle gets an opaque id (the first 16 hex
of the sha256 of its location); a route looks the id up in :attr:`Run.entries` and refuses
anything else, so ``..``, encoded separators and absolute paths in a URL name nothing. The
local walk does not follow symbolic links, and a bundle whose real path is outside ROOT's is
left out (a symlink planted in the run directory pointing elsewhere).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import bundles
from bundles import Bundle, BundleError
from bundles.support import LIMITS, MEDIA_DIR, display

__all__ = ["INDEX_VERSION", "BundleEntry", "Run", "identity_of"]

#: Bumped whenever what the per-bundle index holds changes: old cache files are then not used.
INDEX_VERSION = 3  # 3: stored views cut to what a page shows (issue 36)
#: Directory levels searched below a local ROOT (run/ckpt/rollout/fully_async_3 is 3 below run/).
MAX_DEPTH = 4
#: Sub-prefixes looked into on a store (a store has no directories to walk without listing).
STORE_SUBDIRS = ("rollout", "debug", "dumps", "eval", "rollout_data", "ckpt", "ckpt/rollout")
OPEN_WORKERS = 8
MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]
_STEP_RE = re.compile(r"(\d+)(?:\.bundle|\.rbundle)?$")


def identity_of(bundle: Bundle) -> str:
    """A bundle's identity, what its index is cached by: the sha256 of the index version and of
    the manifest's kind, meta, sample count, media count and every shard's digest (the samples'
    bytes, and with them every media reference by content digest). Two copies of one bundle (a
    directory and its packed file, on disk and on a store) share it; a bundle replaced at the
    same location gets a new one. Cheaper than hashing the whole manifest, whose media list can
    hold hundreds of thousands of entries."""
    m = bundle.manifest
    head = {"kind": m.kind, "meta": m.meta, "samples": m.sample_count, "media": len(m.media),
            "format_version": m.format_version, "shards": [s.digest for s in m.shards]}  # fmt: skip
    text = json.dumps(head, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    # surrogatepass: a meta holding a lone surrogate ("\ud800" is valid JSON) has an identity too
    return hashlib.sha256(f"serve-index-{INDEX_VERSION}\n{text}".encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class BundleEntry:
    """One bundle of the run, as its manifest tells it (no shard read)."""

    id: str  # opaque: the only name routes take
    location: str  # what list_bundles returned: a path or a URL
    rel: str  # shown: the location relative to ROOT, through bundles.support.display
    bundle: Bundle
    identity: str
    step: int | None
    order: int = 0  # position in the run's table (by step, then name)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.bundle.kind

    def media_prefix(self) -> str:
        """What a resolved reference of this bundle starts with: ``<bundle>/media/``, or the run's
        shared pool (``<parent>/.media/`` on a store) where the bundle keeps its media there."""
        prefix = self.extra.get("media_prefix")
        if prefix is None:
            first = next(iter(self.bundle.media), None)
            path = str(first.path) if first is not None and first.path is not None else ""
            prefix = path.rsplit("/", 1)[0] + "/" if "/" in path else f"{self.bundle.path}/{MEDIA_DIR}/"
            self.extra["media_prefix"] = prefix
        return str(prefix)

    @property
    def samples(self) -> int:
        return len(self.bundle)


def _step(bundle: Bundle, name: str) -> int | None:
    meta = bundle.meta
    for key in ("rollout_id", "step", "global_step"):
        v = meta.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63:
            return v
    nested = meta.get("metadata")
    if isinstance(nested, dict):
        v = nested.get("step")
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63:
            return v
    m = _STEP_RE.search(name)
    return int(m.group(1)) if m and len(m.group(1)) < 19 else None


def _stamp(location: str) -> tuple[int, int] | None:
    """A local bundle's inode and mtime (a bundle rewritten in place is a new directory or file);
    None for a store location, which is not re-read once opened."""
    try:
        st = os.stat(location)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_mtime_ns)


def _entry_id(location: str) -> str:
    return hashlib.sha256(location.encode("utf-8", "surrogateescape")).hexdigest()[:16]


class Run:
    """The bundles under ``root``; :meth:`refresh` finds the ones committed since (``--follow``).

    ``problems`` lists, one line each, the bundles found but not opened (a damaged manifest, a
    format of a newer release): the run page shows them instead of failing.
    """

    def __init__(self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = storage_options
        # The root as bundles names it (an absolute path, or the URL normalised); a local
        # directory is walked, any other root is listed through bundles' entry points only.
        self.root = str(bundles.child_location(os.fspath(root), "")).rstrip("/") or "/"
        self._real_root: str | None = os.path.realpath(self.root) if os.path.exists(self.root) else None
        self.entries: dict[str, BundleEntry] = {}
        self.problems: dict[str, str] = {}
        self._lock = threading.Lock()
        self.listeners: list[Callable[[BundleEntry], None]] = []
        self.refresh()

    # -- finding ------------------------------------------------------------------------------------
    def _locations(self) -> list[str]:
        if bundles.is_bundle(self.root, self.storage_options):
            return [self.root]
        if os.path.isdir(self.root):
            return self._walk(self.root, 0)
        # Not a directory here (a store prefix): the root and the run layout's usual places.
        found: list[str] = []
        for sub in ("", *STORE_SUBDIRS):
            where = str(bundles.child_location(self.root, sub)) if sub else self.root
            try:
                found += bundles.list_bundles(where, self.storage_options)
            except BundleError:
                continue
        return sorted(set(found))

    def _walk(self, directory: str, depth: int) -> list[str]:
        try:
            listed = bundles.list_bundles(directory)
        except (BundleError, OSError):
            listed = []
        out = [loc for loc in listed if self._inside(loc)]
        if depth >= MAX_DEPTH:
            return out
        taken = {os.path.basename(loc.rstrip("/")) for loc in out}
        try:
            children = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return out
        for child in children:
            if child.name.startswith(".") or child.name in taken:
                continue
            try:
                if not child.is_dir(follow_symlinks=False):
                    continue
            except OSError:
                continue
            out += self._walk(child.path, depth + 1)
        return out

    def inside(self, location: str) -> bool:
        """True when the local path ``location`` is under ROOT, symlinks resolved."""
        return self._inside(location)

    def _inside(self, location: str) -> bool:
        """A local bundle is served only when it is no symlink and its real path is under ROOT's."""
        if self._real_root is None:
            return True
        try:
            if os.path.islink(location):
                return False
            real = os.path.realpath(location)
        except OSError:
            return False
        return real == self._real_root or real.startswith(self._real_root.rstrip(os.sep) + os.sep)

    def _rel(self, location: str) -> str:
        if location == self.root:
            return os.path.basename(location.rstrip("/")) or location
        if location.startswith(self.root + "/"):
            return location[len(self.root) + 1 :]
        return location

    def refresh(self) -> list[BundleEntry]:
        """List ROOT again: open and add the bundles not seen before, open again a local bundle
        replaced since (another inode or mtime: a rewrite with ``overwrite=True``), drop the ones
        gone (a retention policy removed them). Returns the new and reopened ones."""
        new: list[BundleEntry] = []
        listed = self._locations()
        known = {e.location: e for e in self.entries.values()}
        todo = [loc for loc in listed if loc not in known or _stamp(loc) != known[loc].extra.get("stamp")]
        listed_set = set(listed)
        gone = [e for loc, e in known.items() if loc not in listed_set]
        for location in [loc for loc in self.problems if loc not in listed_set]:
            del self.problems[location]  # a damaged bundle removed: its note goes with it
        if gone:
            with self._lock:
                for e in gone:
                    self.entries.pop(e.id, None)

        def open_one(location: str) -> BundleEntry | str:
            return self._open_entry(location)

        # Manifests read a few at a time: a run of hundreds of bundles on a store is hundreds of
        # small requests, each mostly waiting.
        with ThreadPoolExecutor(OPEN_WORKERS) as pool:
            opened = list(pool.map(open_one, todo))
        for location, entry in zip(todo, opened, strict=True):
            if isinstance(entry, str):
                self.problems[location] = entry
                continue
            self.problems.pop(location, None)
            new.append(entry)
        if new:
            with self._lock:
                for e in new:
                    self.entries[e.id] = e
                ordered = sorted(self.entries.values(), key=lambda e: (e.step is None, e.step or 0, e.rel))
                for k, e in enumerate(ordered):
                    e.order = k
            for e in new:
                for listener in self.listeners:
                    listener(e)
        return new

    def _open_entry(self, location: str) -> BundleEntry | str:
        """The run's entry for the bundle at ``location``, or the note the run page shows instead
        (shown with :func:`bundles.support.display`): one bundle's defect is never the run's
        failure, so nothing but a note comes out of here, whatever the bundle holds."""
        try:
            bundle = bundles.open_bundle(location, verify="none", storage_options=self.storage_options)
        except BundleError as err:
            return display(str(err), MAX_SHOWN_CHARS)
        except OSError as err:
            return display(f"{location}: cannot read: {err.strerror or err}", MAX_SHOWN_CHARS)
        except Exception as err:  # a reader's defect: this bundle's note, the run is served
            return display(f"{location}: cannot open: {type(err).__name__}: {err}", MAX_SHOWN_CHARS)
        try:
            entry = BundleEntry(_entry_id(location), location, display(self._rel(location)), bundle, identity_of(bundle),
                                _step(bundle, os.path.basename(location.rstrip("/"))))  # fmt: skip
        except Exception as err:
            bundle.close()
            return display(f"{location}: cannot be served: {type(err).__name__}: {err}", MAX_SHOWN_CHARS)
        entry.extra["stamp"] = _stamp(location)
        return entry

    def ordered(self) -> list[BundleEntry]:
        with self._lock:
            return sorted(self.entries.values(), key=lambda e: e.order)

    def get(self, eid: str) -> BundleEntry | None:
        """The bundle with id ``eid``; None for any other text (the only lookup a route makes)."""
        if not isinstance(eid, str) or not re.fullmatch(r"[0-9a-f]{16}", eid):
            return None
        return self.entries.get(eid)

    def close(self) -> None:
        for e in self.entries.values():
            e.bundle.close()
