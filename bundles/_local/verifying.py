"""Verifying a bundle: its listing against its manifest, then every listed file's digest.

:func:`listing_problems` walks the source once (a directory's ``os.walk``, a packed file's
member index, a store's listing) and compares it with the names and sizes the manifest expects;
:func:`digest_problems` hashes the files that passed, a few at once (hashlib releases the GIL).

**Memory.** What verifying holds grows with the number of stored *files*, never with the number
of samples: the expected names and sizes and the names found (one string each, O(shards +
distinct media): a listing cannot be compared with a manifest without them). The hashing jobs are
generated as they are taken and at most :data:`IN_FLIGHT` per worker are submitted ahead: before
issue 39, item 6, ``ThreadPoolExecutor.map`` submitted one future per file at once (a future, its
condition and its lock, ~1 KB each: ~12 MB at 10,000 distinct screenshots, ~120 MB at 100,000).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from bundles._errors import BundleError
from bundles._local.progress import Progress
from bundles._local.sources import LAYOUT_DIRS, Source, describe

__all__ = ["IN_FLIGHT", "digest_problems", "listing_problems"]

#: Hashing jobs submitted ahead per worker: enough that none waits, few enough to stay small.
IN_FLIGHT = 4


def listing_problems(src: Source, path: str, expected: dict[str, int]) -> tuple[list[str], set[str]]:
    """What a bundle's listing shows wrong against ``expected`` (name -> size, -1 for any size),
    and the names listed as regular files of the right size (the ones worth hashing)."""
    problems: list[str] = []
    found: set[str] = set()  # listed files present as regular files of the right size
    reported: set[str] = set()
    unlistable: set[str] = set()  # directories whose files are unknown (not missing)
    for entry in src.entries():
        rel = entry.name
        if entry.kind == "unlistable":
            shown = path if rel == "." else src.where(rel)
            problems.append(f"{shown}: cannot list the directory: {entry.error}")
            unlistable.add(rel)
            continue
        if entry.kind == "dir":
            if rel not in LAYOUT_DIRS:
                problems.append(f"{src.where(rel)}: unexpected directory")
            continue
        if entry.kind != "file":
            problems.append(f"{src.where(rel)}: expected a regular file, found {describe(entry.kind)}")
            reported.add(rel)
            continue
        if rel not in expected:
            problems.append(f"{src.where(rel)}: file is not listed in the manifest")
            continue
        if expected[rel] >= 0 and entry.size != expected[rel]:
            problems.append(f"{src.where(rel)}: size: expected {expected[rel]} bytes, found {entry.size}")
            reported.add(rel)
            continue
        found.add(rel)
    for rel in sorted(set(expected) - found - reported):
        if "." in unlistable or os.path.dirname(rel) in unlistable:
            continue  # not missing: its directory could not be listed (reported above)
        problems.append(f"{src.where(rel)}: listed in the manifest but missing")
    return problems, found


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
