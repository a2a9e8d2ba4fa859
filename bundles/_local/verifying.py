"""Verifying a bundle: its listing against its manifest, then every listed file's digest.

:func:`listing_problems` walks the source once (a directory's ``os.walk``, a packed file's
member index, a store's listing) and compares it with the names and sizes the manifest expects;
:func:`digest_problems` hashes the files that passed, a few at once (hashlib releases the GIL).

**Memory.** Verifying holds one byte per stored file beyond what the open bundle holds, never a
Python object per file or per sample (issue 39, item 6). :class:`Expected` numbers the files the
manifest lists (``manifest.json``, the shards, then the media) and looks a listed name up without
a set of names: a shard by a dict of its few paths, a media file by the binary search of its
manifest's :class:`~bundles._format.mediatable.MediaTable`. What the listing shows of each file is
one byte of a ``bytearray`` by that number (found, or reported), from which the missing files
(in name order) and the files to hash are read. Before, the expected names and sizes and the
names found were held as strings (~300 bytes a file). The hashing jobs are generated as they are
taken and at most :data:`IN_FLIGHT` per worker are submitted ahead: ``ThreadPoolExecutor.map``
submitted one future per file at once (a future, its condition and its lock, ~1 KB each).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from bundles._errors import BundleError
from bundles._format.layout import MANIFEST_NAME, MEDIA_DIR
from bundles._format.manifest import ShardEntry
from bundles._format.mediatable import MediaTable
from bundles._local.progress import Progress
from bundles._local.sources import LAYOUT_DIRS, Source, describe

__all__ = ["IN_FLIGHT", "Expected", "digest_problems", "listing_problems"]

#: Hashing jobs submitted ahead per worker: enough that none waits, few enough to stay small.
IN_FLIGHT = 4
FOUND, REPORTED = 1, 2  # what the listing showed of an expected file (0: nothing)
_MEDIA_PREFIX = MEDIA_DIR + "/"


class Expected:
    """The files a manifest lists, numbered: 0 ``manifest.json``, 1.. the shards, then the media
    (see the module docstring)."""

    def __init__(self, shards: Sequence[ShardEntry], media: MediaTable) -> None:
        self.shards, self.media = shards, media
        self._shards = {e.path: k for k, e in enumerate(shards, start=1)}
        self._first_media = 1 + len(shards)
        self.count = self._first_media + len(media)

    def index(self, rel: str) -> int:
        """The number of the listed file ``rel``; -1 when the manifest does not list it."""
        if rel == MANIFEST_NAME:
            return 0
        k = self._shards.get(rel)
        if k is not None:
            return k
        if rel.startswith(_MEDIA_PREFIX):
            j = self.media.find(rel[len(_MEDIA_PREFIX) :])
            return -1 if j < 0 else self._first_media + j
        return -1

    def size(self, k: int) -> int:
        """File ``k``'s size as the manifest says it; -1 for any (the manifest's own)."""
        if k == 0:
            return -1
        if k < self._first_media:
            return self.shards[k - 1].size
        return self.media.size(k - self._first_media)

    def name(self, k: int) -> str:
        if k == 0:
            return MANIFEST_NAME
        if k < self._first_media:
            return self.shards[k - 1].path
        return _MEDIA_PREFIX + self.media.filename(k - self._first_media)

    def in_name_order(self) -> Iterator[int]:
        """Every number, in the order of the names as strings (``manifest.json`` < ``media/`` <
        ``samples/``; the media table's (digest, suffix) order is its names' order)."""
        yield 0
        yield from (self._first_media + j for j in self.media.sorted_indices())
        yield from range(1, self._first_media)

    def jobs(self, shown: bytearray, media: bool) -> Iterator[tuple[str, str, int]]:
        """(name, digest, size) of each file ``shown`` FOUND: the shards, and with ``media`` the
        media files, in the manifest's order."""
        for k, e in enumerate(self.shards, start=1):
            if shown[k] == FOUND:
                yield e.path, e.digest, e.size
        table, first = self.media, self._first_media
        for j in range(len(table)) if media else ():
            if shown[first + j] == FOUND:
                yield _MEDIA_PREFIX + table.filename(j), table.digest(j), table.size(j)


def listing_problems(src: Source, path: str, expected: Expected) -> tuple[list[str], bytearray]:
    """What a bundle's listing shows wrong against ``expected``, and what it showed of each
    expected file by its number: FOUND for a regular file of the right size (the ones worth
    hashing), REPORTED for one with a problem, 0 for none listed."""
    problems: list[str] = []
    shown = bytearray(expected.count)
    unlistable: set[str] = set()  # directories whose files are unknown (not missing)
    for entry in src.entries():
        rel = entry.name
        if entry.kind == "unlistable":
            at = path if rel == "." else src.where(rel)
            problems.append(f"{at}: cannot list the directory: {entry.error}")
            unlistable.add(rel)
            continue
        if entry.kind == "stray":  # not under a bundle-relative name (see Entry): never counted
            problems.append(f"{rel}: {entry.error}")
            continue
        if entry.kind == "dir":
            if rel not in LAYOUT_DIRS:
                problems.append(f"{src.where(rel)}: unexpected directory")
            continue
        k = expected.index(rel)
        if entry.kind != "file":
            problems.append(f"{src.where(rel)}: expected a regular file, found {describe(entry.kind)}")
            if k >= 0 and not shown[k]:
                shown[k] = REPORTED
            continue
        if k < 0:
            problems.append(f"{src.where(rel)}: file is not listed in the manifest")
            continue
        size = expected.size(k)
        if size >= 0 and entry.size != size:
            problems.append(f"{src.where(rel)}: size: expected {size} bytes, found {entry.size}")
            if not shown[k]:
                shown[k] = REPORTED
            continue
        shown[k] = FOUND  # a name listed twice (a packed file's members) is hashed if once found
    for k in expected.in_name_order():
        if shown[k]:
            continue
        rel = expected.name(k)
        if "." in unlistable or os.path.dirname(rel) in unlistable:
            continue  # not missing: its directory could not be listed (reported above)
        problems.append(f"{src.where(rel)}: listed in the manifest but missing")
    return problems, shown


def digest_problems(
    src: Source, jobs: Callable[[], Iterator[tuple[str, str, int]]], label: str, progress: bool | None
) -> list[str]:
    """Each file of ``jobs()`` (name, digest, size) hashed, a few at once, in order: the ones that
    differ or cannot be read, one message each. ``jobs`` is called twice (the total for the
    progress bar, then the work), so that no list of them is ever held."""
    total = sum(size for _, _, size in jobs())
    with Progress(label, total=total, unit="B", enabled=progress) as bar:

        def check(job: tuple[str, str, int]) -> str | None:
            rel, digest, size = job
            try:
                hexdigest, _ = src.hash(rel)
            except (OSError, BundleError) as e:
                return f"{src.where(rel)}: cannot read: {e}"
            finally:
                bar.advance(size)
            if "sha256:" + hexdigest != digest:
                return f"{src.where(rel)}: digest: expected {digest}, found sha256:{hexdigest}"
            return None

        workers = min(4, os.cpu_count() or 1)
        problems: list[str] = []
        pending: deque[Future[str | None]] = deque()
        with ThreadPoolExecutor(workers) as pool:
            for job in jobs():
                pending.append(pool.submit(check, job))
                while len(pending) > IN_FLIGHT * workers or (pending and pending[0].done()):
                    problem = pending.popleft().result()
                    if problem is not None:
                        problems.append(problem)
            for future in pending:
                problem = future.result()
                if problem is not None:
                    problems.append(problem)
        return problems
