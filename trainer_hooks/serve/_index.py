"""The per-bundle index: the columns pages filter and sort on, and full-text search, in SQLite.

Why SQLite (stdlib ``sqlite3``) with FTS5: the pages ask for a filtered, sorted page of a bundle
of up to tens of thousands of samples, and for the samples whose prompt or response holds some
words. A table with an index per sort column answers the first in milliseconds without holding
the bundle in memory; FTS5 answers the second; the file is one ordinary file the user can delete,
and it needs no package beyond Python. A column file (parquet) would need a query engine and
has no text search; an in-memory table would cost RAM in proportion to the bundle.

One file per bundle, ``<cache>/index/<identity>.sqlite``, named by the bundle's identity
(:func:`~trainer_hooks.serve._run.identity_of`: kind, meta, counts and shard digests, so a
bundle replaced at the same place is indexed again and two copies of one bundle share one file).
It is built once, in the background (:class:`Indexer`), streaming the bundle's samples one shard at a time (memory holds one
shard and a batch of rows, whatever the bundle's size), into ``<identity>.building.sqlite``,
committed every :data:`BATCH` rows so that a page can show the first rows while the rest is
read; when complete it is renamed to its final name (a reader never takes a partial index for a
whole one). Another process building the same index holds its lock file (``flock``); a
``.building`` file left by a process that died is rebuilt from the start.

What names an index is verified, never claimed (issue 36): an index becomes complete only when
every shard was read whole and matched its manifest digest (the reader checks each while it
streams), so its identity is made of digests this server verified, whichever copy of the bundle
it was read from. Two copies of one identity served at once (a run's bundle and a hostile twin
with the same manifest) are both candidates: the first that reads whole builds the index, and a
copy that fails has its own error (keyed by the copy, never by the identity), remembered with its
files' fingerprint (:func:`_fingerprint`) and asked again once they change (a bundle copied in
manifest first and shards later). A complete index that cannot be read (damaged in the cache) is
removed and built again; its path, outside ROOT, is never put on a page.

Rows hold what the table shows, and each sample's page-ready view (:mod:`~trainer_hooks.serve._rows`);
the pages read them through :mod:`~trainer_hooks.serve._lookups`.

Connections: a complete index never changes (its name is the bundle's identity and it appears
whole, by a rename), so :meth:`Indexer.connect` keeps its read-only connections open between
requests, in a small pool per index (at most :data:`MAX_IDLE` idle in all, closed by
:meth:`Indexer.close` at the app's shutdown): the prompt page across a run of 200 bundles
otherwise spends a quarter of its time opening 200 connections per request. Why a pool, and
why it is safe: Starlette runs the pages in a pool of up to 40 worker threads, so one
connection per index per thread would hold up to 40 descriptors per bundle; one connection per
index behind a lock would queue two pages of one bundle behind each other, and two pages each
holding one of two bundles (compare) could wait on each other. A pooled connection is taken out
under a lock and used by one thread only until it is given back; it is opened with
``check_same_thread=False`` only because the thread that next takes it may be another one, which
SQLite allows when no two threads use a connection at once (Python's ``sqlite3`` is built
thread-safe; ``sqlite3.threadsafety`` >= 1). An index still being built is opened per request
(its file is renamed when complete).
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundles import BundleError
from bundles.support import LIMITS, MANIFEST_NAME, SHARDS_DIR, Progress, display
from trainer_hooks.pages import SampleView, sample_view
from trainer_hooks.serve._rows import BIG, SCHEMA, row_of, view_bytes, view_of
from trainer_hooks.serve._run import BundleEntry, descriptor_limit

__all__ = ["WANTED", "IndexState", "Indexer"]

WANTED = 10  # priorities below this are a page's, built by the second thread at once
BATCH = 500  # rows per commit while building
FIRST_BATCH = 50  # the first commit comes sooner: the first page of an unindexed bundle waits for it
MAX_IDLE = 256  # open connections kept to complete indexes, in all (one descriptor each) ...
_LIMIT = descriptor_limit()
if _LIMIT is not None:
    MAX_IDLE = max(4, min(MAX_IDLE, _LIMIT // 4))  # ... and a quarter of the descriptors at most
MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]


# -- the index of one bundle -------------------------------------------------------------------------


@dataclass
class IndexState:
    complete: bool
    rows: int  # rows readable now
    total: int  # samples in the bundle
    error: str | None = None
    summary: dict[str, Any] | None = None  # when complete


def _connect_ro(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=5)
    con.execute("PRAGMA query_only = 1")
    return con


def _summary(con: sqlite3.Connection) -> dict[str, Any]:
    n, rmean, rmin, rmax, rsq, rcount, lmean, tmean, trunc = con.execute(
        "SELECT count(*), avg(reward), min(reward), max(reward), sum(reward*reward), count(reward), "
        "avg(resp_len), avg(turns), sum(truncated) FROM samples"
    ).fetchone()
    std = None
    if rcount and rcount > 1 and rmean is not None:
        std = math.sqrt(max(0.0, (rsq - rcount * rmean * rmean) / (rcount - 1)))
    statuses = dict(
        con.execute("SELECT ifnull(status, 'no status'), count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC")
    )
    groups, flat = con.execute(
        "SELECT count(*), ifnull(sum(c > 1 AND lo = hi), 0) FROM (SELECT grp, count(reward) c, min(reward) lo, "
        "max(reward) hi FROM samples WHERE grp IS NOT NULL GROUP BY grp)"
    ).fetchone()
    return {"samples": n, "reward_mean": rmean, "reward_std": std, "reward_min": rmin, "reward_max": rmax,
            "rewarded": rcount, "length_mean": lmean, "turns_mean": tmean, "truncated": trunc or 0,
            "statuses": statuses, "groups": groups, "flat_groups": flat}  # fmt: skip


def _advantages(con: sqlite3.Connection) -> None:
    """GRPO advantages per group as :func:`trainer_hooks.pages.advantages` computes them."""
    con.execute("CREATE TEMP TABLE g AS SELECT grp, avg(reward) m, count(reward) c, sum(reward*reward) sq "
                "FROM samples WHERE grp IS NOT NULL AND reward IS NOT NULL GROUP BY grp")  # fmt: skip
    rows = con.execute("SELECT grp, m, c, sq FROM g").fetchall()
    con.execute("CREATE TEMP TABLE gs (grp TEXT PRIMARY KEY, m REAL, s REAL)")
    con.executemany("INSERT INTO gs VALUES (?, ?, ?)",
                    [(g, m, math.sqrt(max(0.0, (sq - c * m * m) / (c - 1))) if c > 1 else 0.0) for g, m, c, sq in rows])  # fmt: skip
    con.execute("UPDATE samples SET advantage = CASE WHEN gs.s > 1e-12 THEN (reward - gs.m) / (gs.s + 1e-6) "
                "ELSE reward - gs.m END FROM gs WHERE samples.grp = gs.grp AND samples.reward IS NOT NULL")  # fmt: skip


def _build(entry: BundleEntry, path: Path, progress: bool | None, finishing: threading.RLock) -> None:
    """Build ``entry``'s index at ``path``: rows streamed into ``<identity>.building.sqlite``,
    committed as they come, then completed and renamed (a reader never takes a part for the whole)."""
    tmp = path.with_name(path.name.replace(".sqlite", ".building.sqlite"))
    con = _start(entry, tmp)
    try:
        _fill(con, entry, progress)
        _complete(con, tmp, path, finishing)
    finally:
        con.close()


def _start(entry: BundleEntry, tmp: Path) -> sqlite3.Connection:
    """A new building file for ``entry`` (a dead build's leftovers removed: the lock is ours)."""
    for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()  # our own leftover (the lock is ours): a dead build starts over
    # A page reading the rows built so far holds a read lock for a moment: the builder waits for
    # it (busy timeout) rather than fail, when it leaves WAL mode at the end.
    con = sqlite3.connect(tmp, check_same_thread=False, timeout=60)
    try:
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = OFF")  # a cache: a crash rebuilds it
        con.executescript(SCHEMA)
        meta = {"identity": entry.identity, "total": str(len(entry.bundle)), "complete": "0"}
        con.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        con.commit()
    except BaseException:
        con.close()
        raise
    return con


def _fill(con: sqlite3.Connection, entry: BundleEntry, progress: bool | None) -> None:
    """Every sample's row, words and view, streamed one shard at a time, committed every
    :data:`BATCH` rows (the first :data:`FIRST_BATCH` sooner) so that a page shows them."""
    rows: list[tuple[Any, ...]] = []
    texts: list[tuple[int, str, str]] = []
    views: list[tuple[int, bytes]] = []
    prefix = entry.media_prefix()

    def flush() -> None:
        con.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        con.executemany("INSERT INTO fts(rowid, prompt, response) VALUES (?, ?, ?)", texts)
        con.executemany("INSERT INTO views VALUES (?, ?)", views)
        con.commit()
        rows.clear()
        texts.clear()
        views.clear()

    with Progress(f"indexing {entry.rel}", total=len(entry.bundle), unit="samples", enabled=progress) as bar:
        for pos, sample in enumerate(entry.bundle.samples()):
            row, ptext, rtext = row_of(pos, sample)
            try:
                view = view_bytes(sample_view(pos, sample, prefix)) if isinstance(sample, Mapping) else None
            except Exception:  # any value view cannot summarise: the page reads the sample itself
                view = None
            del sample
            rows.append(row)
            texts.append((pos, ptext, rtext))
            if view is not None:
                views.append((pos, view))
            if len(rows) >= (BATCH if pos >= BATCH else FIRST_BATCH):
                bar.advance(len(rows))
                flush()
        n_last = len(rows)
        flush()
        bar.advance(n_last)


def _complete(con: sqlite3.Connection, tmp: Path, path: Path, finishing: threading.RLock) -> None:
    """The advantages, the sort indexes and the summary, then every row into the main file and
    the file renamed to its final name."""
    _advantages(con)
    for col in ("reward", "resp_len", "turns", "advantage", "tokens"):
        con.execute(f"CREATE INDEX s_{col}_a ON samples(ifnull({col}, {BIG}), pos)")
        con.execute(f"CREATE INDEX s_{col}_d ON samples(ifnull({col}, -{BIG}), pos)")
    for col in ("status", "grp", "prompt_key"):
        con.execute(f"CREATE INDEX s_{col} ON samples({col}, pos)")
    con.execute("INSERT INTO fts(fts) VALUES ('optimize')")
    summary = _summary(con)
    con.execute("INSERT OR REPLACE INTO meta VALUES ('summary', ?)", (json.dumps(summary),))
    con.execute("INSERT OR REPLACE INTO meta VALUES ('complete', '1')")
    con.commit()
    # Every row into the main file before it is renamed (a row left in the -wal file would be
    # lost with it): pages of this process read the building file under ``finishing``, so the
    # checkpoint waits for none of them; another process's reader is waited for.
    with finishing:
        for _ in range(600):
            busy, _, _ = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                break
            time.sleep(0.1)
        else:
            raise BundleError(f"{tmp}: the index cannot be completed: another reader holds it")
        con.execute("PRAGMA journal_mode = DELETE")
        con.close()
        os.replace(tmp, path)


def _fingerprint(entry: BundleEntry) -> Any:
    """What a failed build of a local bundle is remembered with: its directory, manifest and
    shards (inode, size, mtime), or its packed file's; a change (the shards of a bundle copied in
    after its manifest arrived) asks again. None for a store bundle (tried once per server)."""
    location = entry.location
    if "://" in location:
        return None
    names = [""]
    if os.path.isdir(location):
        names += [MANIFEST_NAME, SHARDS_DIR] + [s.path for s in entry.bundle.manifest.shards]
    out: list[tuple[str, int | None, int | None, int | None, int | None]] = []
    for name in names:
        try:
            st = os.lstat(os.path.join(location, name) if name else location)
            out.append((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
        except (OSError, ValueError):
            out.append((name, None, None, None, None))
    return tuple(out)


class Indexer:
    """Builds the indexes of a run's bundles in two background threads.

    The run's bundles are queued in the run's order when they are found, and one thread builds
    them one at a time. A page asks :meth:`want` for its bundle: it goes to the front, and a
    second thread, which takes only such wanted bundles, starts on it at once rather than after
    the bundle being built (a person waiting for one page does not wait for a 50,000-sample
    bundle they did not open). :meth:`state` says how far a bundle's index is; :meth:`connect`
    gives a read-only connection to what is readable now.
    """

    def __init__(self, cache_dir: str | os.PathLike[str], *, progress: bool | None = None) -> None:
        self.dir = Path(cache_dir) / "index"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self._cv = threading.Condition()
        self._queue: list[tuple[int, int, str]] = []  # (priority, seq, identity)
        # identity -> {entry id: entry}: every copy of one identity served (two runs' copies, a
        # directory and its packed file); the index is built from the first copy that reads whole.
        self._entries: dict[str, dict[str, BundleEntry]] = {}
        # (entry id, identity) -> (its files' fingerprint then, why its build failed): one copy's failure,
        # never the identity's; asked again once its files changed (see :func:`_fingerprint`).
        self._errors: dict[tuple[str, str], tuple[Any, str]] = {}
        self._done: set[str] = set()  # identities whose index is complete
        self._seq = itertools.count()
        self._finishing = threading.RLock()  # held while reading a building file, and to complete one
        self._queued: dict[str, int] = {}  # identity -> best priority queued
        self._summaries: dict[str, dict[str, Any]] = {}  # identity -> summary of a complete index
        self._active: set[str] = set()  # being built now
        # identity -> idle connections to its complete index (see the module's docstring)
        self._idle: dict[str, list[sqlite3.Connection]] = {}
        self._idle_count = 0
        self._pool_lock = threading.Lock()
        self._stop = False
        self._threads = [
            threading.Thread(target=self._work, args=(False,), name="serve-indexer", daemon=True),
            threading.Thread(target=self._work, args=(True,), name="serve-indexer-wanted", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def path(self, identity: str) -> Path:
        return self.dir / f"{identity}.sqlite"

    def _building(self, identity: str) -> Path:
        return self.dir / f"{identity}.building.sqlite"

    def add(self, entry: BundleEntry, priority: int = 10) -> None:
        with self._cv:
            self._entries.setdefault(entry.identity, {})[entry.id] = entry
            if entry.identity in self._done or self.path(entry.identity).exists():
                self._done.add(entry.identity)
                return
            if not self._candidates(entry.identity):
                return  # every copy failed, none changed since
            if self._queued.get(entry.identity, WANTED + 2**40) <= priority:
                return  # queued already, as early
            self._queued[entry.identity] = priority
            heapq.heappush(self._queue, (priority, next(self._seq), entry.identity))
            self._cv.notify_all()

    def want(self, entry: BundleEntry, wait_s: float = 0.0) -> IndexState:
        """Put ``entry`` first in the queue; wait up to ``wait_s`` for its first rows."""
        self.add(entry, priority=0)
        deadline = time.monotonic() + wait_s
        while True:
            st = self.state(entry)
            if st.complete or st.error or st.rows > 0 or st.total == 0 or time.monotonic() >= deadline:
                return st
            with self._cv:
                self._cv.wait(timeout=0.05)

    def _candidates(self, identity: str) -> list[BundleEntry]:
        """The copies of ``identity`` not known to fail (called under ``_cv``)."""
        return [e for e in self._entries.get(identity, {}).values() if (e.id, identity) not in self._errors]

    def _failed(self, entry: BundleEntry) -> str | None:
        """Why ``entry``'s index cannot be built; None when it never failed, or its files changed
        since it did (then it is queued again: a bundle copied in shard by shard is indexed once
        whole)."""
        failed = self._errors.get((entry.id, entry.identity))
        if failed is None:
            return None
        if _fingerprint(entry) == failed[0]:
            return failed[1]
        with self._cv:
            self._errors.pop((entry.id, entry.identity), None)
        self.add(entry, priority=WANTED)
        return None

    def _discard(self, identity: str) -> None:
        """A complete index that cannot be read (damaged in the cache): closed, removed, rebuilt."""
        with self._pool_lock:
            idle = self._idle.pop(identity, [])
            self._idle_count -= len(idle)
        for con in idle:
            con.close()
        with self._cv:
            self._done.discard(identity)
            self._summaries.pop(identity, None)
        with contextlib.suppress(FileNotFoundError):
            self.path(identity).unlink()  # the cache's own file, named by the identity

    def state(self, entry: BundleEntry) -> IndexState:
        total = entry.samples  # as listed: the run page asks this of every bundle it shows, none opened
        error = self._failed(entry)
        if error is not None:
            return IndexState(False, 0, total, error)
        summary = self._summaries.get(entry.identity)
        if summary is not None:  # complete, read once (an index never changes once complete)
            return IndexState(True, total, total, summary=summary)
        final = self.path(entry.identity)
        if final.exists():
            try:
                with self.connect(entry) as con:  # kept for the page that asked (the pool)
                    raw = con.execute("SELECT v FROM meta WHERE k = 'summary'").fetchone()
                summary = json.loads(raw[0]) if raw else {}
            except (sqlite3.DatabaseError, ValueError) as e:
                if isinstance(e, sqlite3.OperationalError) and not str(e).startswith("no such table"):
                    # Not the file's fault (out of descriptors, a lock): asked again next time.
                    return IndexState(False, 0, total, f"{entry.rel}: the index cannot be read now: {e}")
                # Damaged in the cache (the path is outside ROOT: never on a page): built again.
                self._discard(entry.identity)
                self.add(entry, priority=0)
                return IndexState(False, 0, total)
            except BundleError as e:
                return IndexState(False, 0, total, f"{entry.rel}: the index cannot be read now: {e}")
            self._summaries[entry.identity] = summary
            return IndexState(True, total, total, summary=summary)
        building = self._building(entry.identity)
        with self._finishing:
            if building.exists():
                try:
                    with contextlib.closing(_connect_ro(building)) as con:
                        rows = con.execute("SELECT count(*) FROM samples").fetchone()[0]
                    return IndexState(False, rows, total)
                except sqlite3.Error:
                    return IndexState(False, 0, total)
        if final.exists():  # completed meanwhile
            return self.state(entry)
        return IndexState(False, 0, total)

    @contextlib.contextmanager
    def connect(self, entry: BundleEntry) -> Iterator[sqlite3.Connection]:
        """A read-only connection to the index (complete, or the part built so far)."""
        final = self.path(entry.identity)
        con = self._take(entry.identity)
        if con is not None or final.exists():
            con = con if con is not None else _connect_ro(final)
            try:
                yield con
            finally:
                self._give_back(entry.identity, con)
            return
        with self._finishing:
            building = self._building(entry.identity)
            partial: sqlite3.Connection | None = None
            if building.exists():
                with contextlib.suppress(sqlite3.Error):
                    partial = _connect_ro(building)
            if partial is not None:
                try:
                    yield partial
                finally:
                    partial.close()
                return
        if final.exists():
            with self.connect(entry) as con:
                yield con
            return
        raise BundleError(f"{entry.location}: its index is not built yet")

    def _take(self, identity: str) -> sqlite3.Connection | None:
        """An idle connection to ``identity``'s complete index, now this thread's alone (None: open one)."""
        with self._pool_lock:
            idle = self._idle.get(identity)
            if not idle:
                return None
            self._idle_count -= 1
            return idle.pop()

    def _give_back(self, identity: str, con: sqlite3.Connection) -> None:
        """Keep ``con`` for the next request, unless the pool is full or the server stopping."""
        try:
            if con.in_transaction:  # a transaction left open: never hand it on
                con.rollback()
        except sqlite3.Error:
            con.close()
            return
        with self._pool_lock:
            if not self._stop and self._idle_count < MAX_IDLE:
                self._idle.setdefault(identity, []).append(con)
                self._idle_count += 1
                return
        con.close()

    def views(self, entry: BundleEntry, positions: list[int]) -> dict[int, SampleView]:
        """The stored views of ``positions`` that the index holds (none while it has not the rows)."""
        if not positions:
            return {}
        try:
            with self.connect(entry) as con:
                marks = ",".join("?" * len(positions))
                found = con.execute(
                    f"SELECT pos, data FROM views WHERE pos IN ({marks})", positions
                ).fetchall()
        except (BundleError, sqlite3.Error):
            return {}
        return {int(p): view_of(d) for p, d in found}

    def _work(self, wanted_only: bool) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._queue or (wanted_only and self._queue[0][0] >= WANTED)):
                    self._cv.wait()
                if self._stop:
                    return
                _, _, identity = heapq.heappop(self._queue)
                if identity in self._done or identity in self._active:
                    continue  # built, or being built by the other thread
                self._queued.pop(identity, None)
                candidates = self._candidates(identity)
                if not candidates:
                    continue
                self._active.add(identity)
            built = False
            try:
                for entry in candidates:
                    stamp = _fingerprint(entry)
                    error = self._one(entry)
                    if error is None:
                        built = True
                        break
                    with self._cv:
                        self._errors[(entry.id, identity)] = (stamp, error)
            finally:
                with self._cv:
                    self._active.discard(identity)
                    if built:
                        self._done.add(identity)
                    self._cv.notify_all()

    def _one(self, entry: BundleEntry) -> str | None:
        """Build ``entry``'s index (another process building it is waited for); why not, or None.
        The index is complete only when every shard was read whole and matched its digest
        (the reader checks each while streaming it), so the identity it is named by is made of
        digests verified here, whichever copy of the bundle it was read from."""
        final = self.path(entry.identity)
        lock_path = self.dir / f"{entry.identity}.lock"
        try:
            with open(lock_path, "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another server building it: wait for it
                try:
                    if not final.exists():
                        _build(entry, final, self.progress, self._finishing)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        except (BundleError, OSError, sqlite3.Error) as e:
            return display(f"{entry.rel}: cannot index: {e}", MAX_SHOWN_CHARS)
        except Exception as e:  # a sample no reader should meet; the page says so, the server lives
            return display(f"{entry.rel}: cannot index: {type(e).__name__}: {e}", MAX_SHOWN_CHARS)
        return None

    def close(self) -> None:
        """Stop the build threads and close the kept connections (one in use is closed when given back)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        with self._pool_lock:
            idle, self._idle, self._idle_count = self._idle, {}, 0
        for cons in idle.values():
            for con in cons:
                con.close()
