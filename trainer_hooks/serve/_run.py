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
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import bundles
from bundles import Bundle, BundleError
from bundles.support import LIMITS, MEDIA_DIR, display, fault_point

__all__ = ["INDEX_VERSION", "BundleEntry", "Run", "identity_of"]

#: Bumped whenever what the per-bundle index holds changes: old cache files are then not used.
INDEX_VERSION = 3  # 3: stored views cut to what a page shows (issue 36)
#: Directory levels searched below a local ROOT (run/ckpt/rollout/fully_async_3 is 3 below run/).
MAX_DEPTH = 4
#: Sub-prefixes looked into on a store (a store has no directories to walk without listing).
STORE_SUBDIRS = ("rollout", "debug", "dumps", "eval", "rollout_data", "ckpt", "ckpt/rollout")
OPEN_WORKERS = 8
MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]
#: What pages keep of a bundle in its entry's ``extra`` while it is open, dropped when it is let go.
LET_GO_WITH_THE_BUNDLE = ("media_sizes", "replay")
#: Bundles kept open at once (a packed one holds a descriptor): see :class:`OpenBundles`.
MAX_OPEN_BUNDLES = 64
#: Bundles opened (their manifests read) per step of a listing before they join the run: the
#: first ones are on the run page while the rest are still being found.
LIST_BATCH = 256
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


@dataclass(eq=False, slots=True)
class BundleEntry:
    """One bundle of the run, as its manifest told it when listed: what the run page shows, and
    no open bundle. :attr:`bundle` opens it when a page or the indexer needs it (through the
    run's :class:`OpenBundles`, a few at a time)."""

    id: str  # opaque: the only name routes take
    location: str  # what list_bundles returned: a path or a URL
    rel: str  # shown: the location relative to ROOT, through bundles.support.display
    kind: str
    samples: int
    stored_bytes: int
    identity: str
    step: int | None
    order: int = 0  # position in the run's table (by step, then name)
    stamp: tuple[int, int] | None = None  # a local bundle's inode and mtime when listed
    opener: Callable[[BundleEntry], Bundle] | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bundle(self) -> Bundle:
        """The bundle, open (opened again if it was closed since; a bundle replaced since it was
        listed is refused: its entry names another bundle)."""
        if self.opener is None:
            raise BundleError(f"{self.location}: not open")
        return self.opener(self)

    def media_prefix(self) -> str:
        """What a resolved reference of this bundle starts with: ``<bundle>/media/``, or the run's
        shared pool (``<parent>/.media/`` on a store) where the bundle keeps its media there."""
        prefix = self.extra.get("media_prefix")
        if prefix is None:
            bundle = self.bundle
            first = next(iter(bundle.media), None)
            path = str(first.path) if first is not None and first.path is not None else ""
            prefix = path.rsplit("/", 1)[0] + "/" if "/" in path else f"{bundle.path}/{MEDIA_DIR}/"
            self.extra["media_prefix"] = prefix
        return str(prefix)


class OpenBundles:
    """The bundles open now, at most ``capacity`` of them, least recently used let go first.

    A packed bundle holds a descriptor while open (and a store bundle a client), so a run of
    1,500 packed files cannot keep them all open (the usual limit is 1,024 descriptors). A bundle
    is opened when a page or the indexer asks for it and let go when ``capacity`` newer ones
    were asked for, or when it leaves the run (:meth:`drop`). Letting go never closes a bundle a
    page is still reading: the packed file's descriptor is closed when the last reference goes
    (:class:`bundles.Bundle`'s source closes it on collection), at once in CPython when no page
    holds it.
    """

    def __init__(
        self,
        capacity: int,
        storage_options: dict[str, Any] | None = None,
        on_let_go: Callable[[str], None] | None = None,
    ) -> None:
        self.capacity = max(1, capacity)
        self.storage_options = storage_options
        self.on_let_go = on_let_go  # told the id of each bundle let go (what was kept of it goes too)
        # (entry id, identity) -> bundle: a bundle replaced in place keeps its entry id, and the old
        # one is never handed out for the new
        self._open: OrderedDict[tuple[str, str], Bundle] = OrderedDict()
        # entry id -> times it left the run: a bundle opened while its entry left is not kept (it
        # closes when the page reading it is done), so no descriptor outlives a bundle that went
        self._dropped: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def open(self, entry: BundleEntry) -> Bundle:
        key = (entry.id, entry.identity)
        with self._lock:
            bundle = self._open.get(key)
            if bundle is not None:
                self._open.move_to_end(key)
                return bundle
            epoch = self._dropped.get(entry.id, 0)
        bundle = bundles.open_bundle(entry.location, verify="none", storage_options=self.storage_options)
        if identity_of(bundle) != entry.identity:
            bundle.close()
            raise BundleError(
                f"{entry.location}: replaced since it was listed; the run page lists it again shortly"
            )
        return self.keep(key, bundle, epoch)

    def keep(self, key: tuple[str, str], bundle: Bundle, epoch: int | None = None) -> Bundle:
        """Keep ``bundle`` (just opened for entry ``key``: its id and identity) among the open ones;
        returns the one kept. Opened at ``epoch`` (how often its entry had left the run then): one
        whose entry left meanwhile is returned, not kept."""
        with self._lock:
            if epoch is not None and self._dropped.get(key[0], 0) != epoch:
                return bundle  # its entry left the run while it was opened: closes when the page is done
            kept = self._open.get(key)
            if kept is not None and kept is not bundle:
                self._open.move_to_end(key)
                return kept  # another thread opened it first; ours goes when this call returns
            self._open[key] = bundle
            evicted = []
            while len(self._open) > self.capacity:
                evicted.append(self._open.popitem(last=False)[0][0])
        for gone in evicted:
            self._let_go(gone)
        return bundle

    def _let_go(self, eid: str) -> None:
        if self.on_let_go is not None:
            self.on_let_go(eid)

    def drop(self, eid: str) -> None:
        """Let go of entry ``eid``'s bundle (it left the run, or was replaced in place)."""
        with self._lock:
            self._dropped[eid] = self._dropped.get(eid, 0) + 1
            gone = [self._open.pop(k) for k in [k for k in self._open if k[0] == eid]]
        del gone  # closed now unless a page is reading one; then when that page is done
        self._let_go(eid)

    def close(self) -> None:
        with self._lock:
            opened, self._open = list(self._open.values()), OrderedDict()
        for b in opened:
            b.close()


def descriptor_limit() -> int | None:
    """How many descriptors this process may open (its soft ``RLIMIT_NOFILE``); None: no limit known."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def open_capacity() -> int:
    """How many bundles :class:`OpenBundles` keeps open: :data:`MAX_OPEN_BUNDLES`, or an eighth of
    the descriptors this process may open when that is less (the index connections kept and the
    sockets need the rest)."""
    limit = descriptor_limit()
    return MAX_OPEN_BUNDLES if limit is None else max(4, min(MAX_OPEN_BUNDLES, limit // 8))


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

    Listing: with ``list_now=False`` nothing is listed until :meth:`list_in_background`, so that
    the server listens before a run of 100,000 bundles is walked; bundles join the run
    :data:`LIST_BATCH` at a time (more as the run grows), and :attr:`listing` / :attr:`found`
    say how far a listing is. Each bundle's manifest is read once, what the run page shows of it
    kept in its :class:`BundleEntry`, and the bundle closed: pages reopen it through
    :attr:`opened` (a few open at a time).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        list_now: bool = True,
    ) -> None:
        self.storage_options = storage_options
        # The root as bundles names it (an absolute path, or the URL normalised); a local
        # directory is walked, any other root is listed through bundles' entry points only.
        self.root = str(bundles.child_location(os.fspath(root), "")).rstrip("/") or "/"
        self._real_root: str | None = os.path.realpath(self.root) if os.path.exists(self.root) else None
        self.entries: dict[str, BundleEntry] = {}
        self.problems: dict[str, str] = {}
        self._lock = threading.Lock()
        self._ordered: list[BundleEntry] = []
        self._refreshing = threading.Lock()  # one listing at a time
        self.listeners: list[Callable[[BundleEntry], None]] = []
        self.opened = OpenBundles(open_capacity(), storage_options, on_let_go=self._let_go)
        self.listing = False  # a listing is under way
        self.found = 0  # bundles found so far by the listing under way (or by the last one)
        self.listed = threading.Event()  # set once a first listing has finished
        if list_now:
            self.refresh()

    def list_in_background(self, then: Callable[[], None] | None = None) -> threading.Thread:
        """List ROOT in a thread (bundles join the run as they are found); ``then()`` after."""

        def work() -> None:
            try:
                self.refresh()
            except Exception as e:  # a store's failure: named on the run page, tried again on --follow
                self.problems[self.root] = f"{self.root}: listing failed: {e}"
            finally:
                if then is not None:
                    then()

        thread = threading.Thread(target=work, name="serve-list", daemon=True)
        thread.start()
        return thread

    # -- finding ------------------------------------------------------------------------------------
    def _locations(self) -> Iterator[str]:
        if bundles.is_bundle(self.root, self.storage_options):
            yield self.root
            return
        if os.path.isdir(self.root):
            yield from self._walk(self.root, 0)
            return
        # Not a directory here (a store prefix): the root and the run layout's usual places.
        for sub in ("", *STORE_SUBDIRS):
            where = str(bundles.child_location(self.root, sub)) if sub else self.root
            try:
                yield from sorted(bundles.list_bundles(where, self.storage_options))
            except BundleError:
                continue

    def _walk(self, directory: str, depth: int) -> Iterator[str]:
        try:
            listed = bundles.list_bundles(directory)
        except (BundleError, OSError):
            listed = []
        out = [loc for loc in listed if self._inside(loc)]
        yield from out
        if depth >= MAX_DEPTH:
            return
        taken = {os.path.basename(loc.rstrip("/")) for loc in out}
        try:
            children = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for child in children:
            if child.name.startswith(".") or child.name in taken:
                continue
            try:
                if not child.is_dir(follow_symlinks=False):
                    continue
            except OSError:
                continue
            yield from self._walk(child.path, depth + 1)

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
        gone (a retention policy removed them: their bundle let go, their note removed). Returns
        the new and reopened ones."""
        with self._refreshing:
            self.listing, self.found = True, 0
            try:
                return self._refresh()
            finally:
                self.listing = False
                self.listed.set()

    def _refresh(self) -> list[BundleEntry]:
        new: list[BundleEntry] = []
        listed: set[str] = set()
        known = {e.location: e for e in self.ordered()}
        todo: list[str] = []
        for location in self._locations():
            if location in listed:
                continue
            listed.add(location)
            self.found = len(listed)
            e = known.get(location)
            if e is None or _stamp(location) != e.stamp:
                todo.append(location)
            if len(todo) >= max(LIST_BATCH, len(self.entries) // 4):  # sorting the run: O(n log n) in all
                new += self._add(todo)
                todo = []
                fault_point("serve.listed-batch", self.found)
        new += self._add(todo)
        gone = [e for loc, e in known.items() if loc not in listed]
        with self._lock:
            for e in gone:
                self.entries.pop(e.id, None)
                self.opened.drop(e.id)
            for location in [loc for loc in self.problems if loc not in listed and loc != self.root]:
                del self.problems[location]
            if gone:
                self._sort()
        return new

    def _open_entry(self, location: str) -> BundleEntry | str:
        """The run's entry for the bundle at ``location`` (its manifest read, what the run page
        shows kept, the bundle closed), or the note the run page shows instead (through
        :func:`bundles.support.display`): one bundle's defect is never the run's failure, so
        nothing but a note comes out of here, whatever the bundle holds."""
        stamp = _stamp(location)  # before opening: a bundle replaced meanwhile is read again next time
        try:
            bundle = bundles.open_bundle(location, verify="none", storage_options=self.storage_options)
        except BundleError as err:
            return display(str(err), MAX_SHOWN_CHARS)
        except OSError as err:
            return display(f"{location}: cannot read: {err.strerror or err}", MAX_SHOWN_CHARS)
        except Exception as err:  # a reader's defect: this bundle's note, the run is served
            return display(f"{location}: cannot open: {type(err).__name__}: {err}", MAX_SHOWN_CHARS)
        try:
            with bundle:
                name = os.path.basename(location.rstrip("/"))
                return BundleEntry(_entry_id(location), location, display(self._rel(location)), bundle.kind,
                                   len(bundle), bundle.stored_bytes, identity_of(bundle), _step(bundle, name),
                                   stamp=stamp, opener=self.opened.open)  # fmt: skip
        except Exception as err:
            return display(f"{location}: cannot be served: {type(err).__name__}: {err}", MAX_SHOWN_CHARS)

    def _add(self, todo: list[str]) -> list[BundleEntry]:
        if not todo:
            return []
        # Manifests read a few at a time: a run of hundreds of bundles on a store is hundreds of
        # small requests, each mostly waiting. Each bundle is closed once read (a descriptor each).
        with ThreadPoolExecutor(OPEN_WORKERS) as pool:
            summaries = list(pool.map(self._open_entry, todo))
        new: list[BundleEntry] = []
        for location, entry in zip(todo, summaries, strict=True):
            if isinstance(entry, str):
                self.problems[location] = entry
                continue
            self.problems.pop(location, None)
            new.append(entry)
        if new:
            with self._lock:
                for e in new:
                    self.opened.drop(e.id)  # a bundle replaced in place: its old one let go
                    self.entries[e.id] = e
                self._sort()
            for e in new:
                for listener in self.listeners:
                    listener(e)
        return new

    def _let_go(self, eid: str) -> None:
        """What pages kept of a bundle while it was open (its media table, as long as its manifest's
        media list; its replay report, up to MAX_REPORT_BYTES) goes when the bundle is let go; it is
        made again when the bundle is reopened."""
        entry = self.entries.get(eid)
        if entry is not None:
            for key in LET_GO_WITH_THE_BUNDLE:
                entry.extra.pop(key, None)

    def _sort(self) -> None:
        self._ordered = sorted(self.entries.values(), key=lambda e: (e.step is None, e.step or 0, e.rel))
        for k, e in enumerate(self._ordered):
            e.order = k

    def ordered(self) -> list[BundleEntry]:
        with self._lock:
            return list(self._ordered)

    def get(self, eid: str) -> BundleEntry | None:
        """The bundle with id ``eid``; None for any other text (the only lookup a route makes)."""
        if not isinstance(eid, str) or not re.fullmatch(r"[0-9a-f]{16}", eid):
            return None
        return self.entries.get(eid)

    def close(self) -> None:
        self.opened.close()
