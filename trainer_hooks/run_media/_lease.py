"""Run leases, and sweeping the media directories that crashed runs left behind.

A run that crashes never reaches its teardown, so its ``<shared_media_dir>/<run_uuid>``
directory stays. To tell a crashed run's directory from a live one, a live run keeps a lease
file in its directory:

``<run dir>/.lease.json`` (written atomically, temp name + rename)::

    {"lease_version": 1, "run_id": "...", "host": "node-7", "pid": 4242,
     "pid_start_ticks": 123456, "boot_id": "...", "pid_namespace": "pid:[4026531836]",
     "started_at": 1700000000.0, "heartbeat_at": 1700000030.0, "heartbeat_interval_s": 30.0}

:class:`RunLease` writes it and refreshes ``heartbeat_at`` from a daemon thread every
``heartbeat_interval_s`` seconds; closing the lease stops the thread and removes the file.

Sweep rules (:func:`sweep_run_media`), for each directory directly under the shared root:

* **live** — the lease's process is visibly running on this host, or the heartbeat is within
  the *fresh window*, ``max(older_than, 3 × interval)``. Never deleted, whatever the flags: the
  window can't shrink below three heartbeats, so a heartbeating run elsewhere is never swept.
* **crashed** — the lease names this machine (same host name, boot id and pid namespace) and
  its process is gone: no such pid, a zombie, or a pid reused by a process that started
  later. This is certain, so no waiting is needed. A lease from an earlier boot of this host
  name counts as crashed once it missed three heartbeats (the name may be shared).
* **stale** — the heartbeat is older than the fresh window (a run on another host, or in
  another pid namespace, whose process can't be checked from here).
* **orphaned** — no readable lease, and nothing in the directory changed within ``older_than``.
* **recent** — no readable lease, but something changed within ``older_than``: kept, since a
  run may be starting.

Trade-offs: heartbeats are wall-clock times compared across hosts, so clock skew shortens or
lengthens the window (the lease file's mtime is also taken into account, and the default
``older_than`` of one hour dwarfs ordinary skew). The verdict is re-read right before each
deletion, but a run resurrecting the same run id between that check and the deletion is not
guarded against; run ids are uuid4s.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
from argparse import Namespace
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeGuard

from bundles import BundleError
from bundles.support import atomic_write, boot_id, fault_point, local_path_only, pid_namespace, proc_stat
from trainer_hooks.run_media._store import (
    _BEFORE_REMOVE,
    LEASE_NAME,
    RUN_MARKER_NAME,
    RunMediaError,
    UnsafeRunDirError,
    check_run_id,
    create_run_dir,
    dir_usage,
    read_run_marker,
    remove_run_dir,
    run_media_dir,
)

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "DEFAULT_SWEEP_OLDER_THAN_S",
    "LEASE_NAME",
    "RunLease",
    "SweepEntry",
    "acquire_run_lease",
    "format_duration",
    "parse_duration",
    "read_lease",
    "sweep_run_media",
]

logger = logging.getLogger(__name__)

LEASE_VERSION = 1
DEFAULT_HEARTBEAT_INTERVAL_S = 30.0
DEFAULT_SWEEP_OLDER_THAN_S = 3600.0
# A lease is fresh for at least this many heartbeat intervals: one missed beat (a slow NFS
# write, a GC pause) must not make a live run look dead.
MISSED_BEATS = 3

_DURATION_RE = re.compile(r"\s*(?P<n>[0-9]+(?:\.[0-9]*)?)\s*(?P<unit>[smhd]?)\s*")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"`` (a bare number means seconds)."""
    m = _DURATION_RE.fullmatch(text)
    if m is None:
        raise ValueError(
            f"duration {text!r}: expected a number with an optional unit s, m, h or d (e.g. 30s, 10m, 2h, 1d)"
        )
    return float(m["n"]) * _UNITS[m["unit"]]


def format_duration(seconds: float) -> str:
    """Short human form: ``"42s"``, ``"12m"``, ``"3.5h"``, ``"2d"``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            value = seconds / size
            return f"{value:.0f}{unit}" if value >= 10 or value.is_integer() else f"{value:.1f}{unit}"
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"


# ---------------------------------------------------------------- process identity


def _identity() -> dict[str, Any]:
    pid = os.getpid()
    st = proc_stat(pid)
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start_ticks": st[1] if st else None,
        "boot_id": boot_id(),
        "pid_namespace": pid_namespace(),
    }


def _process_state(lease: dict[str, Any]) -> str:
    """``"alive"``, ``"gone"``, ``"other-boot"`` or ``"unknown"`` for the process holding ``lease``.

    ``"gone"`` is only answered when this machine can know: same host name, boot id and pid
    namespace, and the pid is absent, a zombie, or reused by a process that started later.
    """
    me = _identity()
    if lease.get("host") != me["host"]:
        return "unknown"
    if lease.get("boot_id") and me["boot_id"] and lease["boot_id"] != me["boot_id"]:
        # Same host name, different boot: a reboot, or another machine with the same name.
        # Only trusted together with missed heartbeats, see _verdict.
        return "other-boot"
    if lease.get("pid_namespace") and me["pid_namespace"] and lease["pid_namespace"] != me["pid_namespace"]:
        return "unknown"  # another container on this machine: its pids mean nothing here
    pid = lease.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return "unknown"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return "unknown"
    st = proc_stat(pid)
    if st is not None:
        state, start_ticks = st
        if state in ("Z", "X"):
            return "gone"  # killed, not yet reaped by its parent
        if lease.get("pid_start_ticks") is not None and start_ticks != lease["pid_start_ticks"]:
            return "gone"  # the pid was reused by a later process
    return "alive"


# ---------------------------------------------------------------- lease file


def read_lease(run_dir: Path) -> dict[str, Any] | None:
    """The lease in ``run_dir`` as a dict, or None when there is none or it is corrupt."""
    return _load_lease(Path(run_dir))[0]


# A heartbeat this far ahead of our clock is not clock skew but a broken (or hostile) lease that
# would keep its directory "live" forever.
MAX_FUTURE_HEARTBEAT_S = 86400.0


def _finite_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _load_lease(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(lease, None) for a valid lease; (None, None) when there is no lease file; (None, why)
    for a corrupt one: not JSON, not an object, or a heartbeat that is not a finite time."""
    path = run_dir / LEASE_NAME
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * 1024)
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"lease unreadable ({e.strerror})"
    try:
        data = json.loads(raw)  # Infinity and NaN parse, and are refused as heartbeats below
    except (ValueError, RecursionError) as e:
        return None, f"corrupt lease ({LEASE_NAME} is not JSON: {e})"
    if not isinstance(data, dict):
        return None, f"corrupt lease (expected a JSON object, found {type(data).__name__})"
    beat = data.get("heartbeat_at")
    if not _finite_number(beat):
        return None, f"corrupt lease (heartbeat_at: expected a finite time, found {beat!r})"
    if float(beat) > time.time() + MAX_FUTURE_HEARTBEAT_S:
        return None, f"corrupt lease (heartbeat_at {beat!r} is more than a day in the future)"
    interval = data.get("heartbeat_interval_s")
    if interval is not None and not (_finite_number(interval) and interval > 0):
        return None, f"corrupt lease (heartbeat_interval_s: expected a positive number, found {interval!r})"
    # The freshest evidence of life: a writer whose clock runs slow still bumps the mtime.
    data["_heartbeat"] = max(float(beat), mtime)
    return data, None


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    # The one atomic write (bundles.support). No sweep of the run directory (thousands of media
    # files) at every heartbeat: it is removed as a whole, a killed writer's temporary included.
    atomic_write(path, json.dumps(data, sort_keys=True), sweep=False)


def _verdict(lease: dict[str, Any], now: float, older_than: float) -> tuple[str, str, float]:
    """(state, reason, heartbeat age) for a parsed lease; see the module docstring."""
    age = now - lease["_heartbeat"]
    interval = lease.get("heartbeat_interval_s")
    interval = float(interval) if _finite_number(interval) and interval > 0 else DEFAULT_HEARTBEAT_INTERVAL_S
    grace = MISSED_BEATS * interval
    window = max(older_than, grace)
    who = f"pid {lease.get('pid')} on {lease.get('host')}"
    beat = f"last heartbeat {format_duration(age)} ago"
    proc = _process_state(lease)
    if proc == "alive":
        return "live", f"{who} is running; {beat}", age
    if proc == "gone":
        return "crashed", f"{who} is gone; {beat}", age
    if proc == "other-boot":
        # Another boot id under this host name: a reboot since (the process is gone) or another
        # machine with the same name (it may be running). Only missed heartbeats tell, and like
        # any lease whose process can't be checked, it must be older than --older-than too.
        if age > window:
            return "crashed", f"{who} belongs to another boot of this host name; {beat}", age
        return (
            "live",
            f"lease held by {who} (another boot id); {beat}, fresh within {format_duration(window)}",
            age,
        )
    if age > window:
        return "stale", f"lease of {who} is stale: {beat}, older than {format_duration(window)}", age
    return "live", f"lease held by {who}; {beat}, fresh within {format_duration(window)}", age


class RunLease:
    """The lease of one run on its media directory, refreshed by a daemon heartbeat thread.

    Use as a context manager, or call :meth:`start` and :meth:`close`. Starting takes over a
    lease left by a process that is gone (e.g. a crashed run resumed with the same
    ``--run-uuid``) or whose heartbeat missed three intervals; it refuses a directory leased by
    a live process (two launches with the same run id), and an existing directory no run made
    (no run marker, no lease naming it: :func:`~trainer_hooks.run_media._store.create_run_dir`),
    writing nothing into either.
    """

    def __init__(self, run_dir: Path, *, interval: float = DEFAULT_HEARTBEAT_INTERVAL_S) -> None:
        if interval <= 0:
            raise ValueError(f"RunLease: heartbeat interval must be positive, found {interval!r}")
        self.run_dir = Path(run_dir)
        check_run_id(self.run_dir.name)
        self.interval = float(interval)
        self.path = self.run_dir / LEASE_NAME
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._record: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> RunLease:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def active(self) -> bool:
        return self._record is not None

    def start(self) -> RunLease:
        if self._record is not None:
            return self
        create_run_dir(self.run_dir, ensure_marker=True)  # refuses a symlinked run directory
        existing = read_lease(self.run_dir)
        now = time.time()
        if existing is not None:
            state, reason, _ = _verdict(existing, now, older_than=0.0)
            if state == "live":
                raise RunMediaError(
                    f"{self.path}: run directory is already leased ({reason}); "
                    "is another run using the same --run-uuid?"
                )
            logger.warning("%s: taking over a lease left behind (%s)", self.path, reason)
        self._record = {
            "lease_version": LEASE_VERSION,
            "run_id": self.run_dir.name,
            **_identity(),
            "started_at": now,
            "heartbeat_at": now,
            "heartbeat_interval_s": self.interval,
        }
        _write_json_atomic(self.path, self._record)
        with _ACTIVE_LOCK:
            _ACTIVE[_key(self.run_dir)] = self
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat, name=f"run-lease-{self.run_dir.name[:8]}", daemon=True
        )
        self._thread.start()
        return self

    def refresh(self) -> None:
        """Write a new heartbeat now. Never recreates a run directory that was removed."""
        with self._lock:
            if self._record is None:
                return
            self._record["heartbeat_at"] = time.time()
            _write_json_atomic(self.path, self._record)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except FileNotFoundError:
                logger.error(
                    "%s: run media directory vanished while the run holds it; heartbeat stops", self.run_dir
                )
                return
            except OSError as e:  # a flaky shared filesystem: keep trying, the window allows misses
                logger.warning("%s: heartbeat failed: %s", self.path, e)

    def close(self) -> None:
        """Stop the heartbeat and remove the lease file (if it is still ours). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            record, self._record = self._record, None
        if record is None:
            return
        with _ACTIVE_LOCK:
            if _ACTIVE.get(_key(self.run_dir)) is self:
                del _ACTIVE[_key(self.run_dir)]
        current = read_lease(self.run_dir)
        if current is not None and (current.get("pid"), current.get("host"), current.get("started_at")) == (
            record["pid"],
            record["host"],
            record["started_at"],
        ):
            with suppress(FileNotFoundError):
                os.unlink(self.path)


# Leases started by this process, by run directory, so that releasing the directory can stop
# the heartbeat first (see _run_media._BEFORE_REMOVE).
_ACTIVE: dict[str, RunLease] = {}
_ACTIVE_LOCK = threading.Lock()


def _key(run_dir: Path) -> str:
    return os.path.realpath(run_dir)


def _before_remove(run_dir: Path) -> None:
    """Close this process's lease on ``run_dir``; refuse the removal while another live run holds
    one (a second launch with the same run id, refused at its start, releasing in its teardown)."""
    with _ACTIVE_LOCK:
        lease = _ACTIVE.get(_key(run_dir))
    if lease is not None:
        lease.close()
    held = read_lease(run_dir)
    if held is None:
        return
    state, reason, _ = _verdict(held, time.time(), older_than=0.0)
    if state == "live":
        raise RunMediaError(
            f"{run_dir / LEASE_NAME}: run directory is leased by another run ({reason}); not removing it: "
            "only the run holding the lease removes its media (or rollout-bundle sweep, once that run is gone)"
        )


_BEFORE_REMOVE.append(_before_remove)


def acquire_run_lease(args: Namespace, *, interval: float = DEFAULT_HEARTBEAT_INTERVAL_S) -> RunLease | None:
    """Start and return the lease on this run's media directory (None without ``--shared-media-dir``)."""
    run_dir = run_media_dir(args)
    if run_dir is None:
        return None
    return RunLease(run_dir, interval=interval).start()


# ---------------------------------------------------------------- sweep


@dataclass(frozen=True)
class SweepEntry:
    """One directory under the shared media root and what sweep made of it.

    ``size`` is the apparent size of its files; ``freed`` the bytes deleting it freed (files
    hard-linked elsewhere don't count). ``age_s`` is the heartbeat age, or for a directory
    without a lease the time since anything in it changed.
    """

    run_id: str
    path: str
    state: str
    reason: str
    size: int
    age_s: float | None
    deleted: bool = False
    freed: int = 0
    error: str | None = None

    @property
    def removable(self) -> bool:
        return self.state in REMOVABLE_STATES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


REMOVABLE_STATES = frozenset({"crashed", "stale", "orphaned"})


NOT_A_RUN_DIR = f"not a run directory (no {RUN_MARKER_NAME} marker and no lease naming it)"


def _classify(run_dir: Path, now: float, older_than: float) -> tuple[str, str, float | None, int]:
    lease, corrupt = _load_lease(run_dir)
    # Proof first, and before walking the directory: a sweep pointed at a home directory must
    # neither delete nor walk it.
    if read_run_marker(run_dir) is None and (lease is None or lease.get("run_id") != run_dir.name):
        reason = NOT_A_RUN_DIR if corrupt is None else f"{NOT_A_RUN_DIR}; {corrupt}"
        return "skipped", reason, None, 0
    usage = dir_usage(run_dir)
    if lease is not None:
        state, reason, age = _verdict(lease, now, older_than)
        return state, reason, age, usage.total
    age = now - usage.newest_mtime
    what = corrupt or "no lease"
    if age > older_than:
        return "orphaned", f"{what}; nothing changed for {format_duration(age)}", age, usage.total
    return (
        "recent",
        f"{what}; changed {format_duration(age)} ago, within {format_duration(older_than)}",
        age,
        usage.total,
    )


def sweep_run_media(
    shared_media_dir: str | os.PathLike[str],
    *,
    older_than: float = DEFAULT_SWEEP_OLDER_THAN_S,
    delete: bool = False,
    now: float | None = None,
) -> list[SweepEntry]:
    """Classify every run directory under ``shared_media_dir``; with ``delete``, remove the
    crashed, stale and orphaned ones. Returns one entry per directory, sorted by run id.

    Live and recent directories are never deleted; nor is anything that is not a plain
    directory with a valid run id (those are listed as ``skipped``). Hidden entries are ignored.
    """
    local_path_only(shared_media_dir, "shared media directory")  # a URL is no directory to sweep
    shared = Path(shared_media_dir)
    if not shared.is_dir():
        raise RunMediaError(f"{shared}: shared media directory not found")
    entries: list[SweepEntry] = []
    for child in sorted(os.scandir(shared), key=lambda e: e.name):
        name = child.name
        if name.startswith("."):
            continue
        path = shared / name
        try:
            check_run_id(name)
        except UnsafeRunDirError:
            entries.append(SweepEntry(name, str(path), "skipped", "not a valid run id", 0, None))
            continue
        if child.is_symlink() or not child.is_dir(follow_symlinks=False):
            entries.append(SweepEntry(name, str(path), "skipped", "not a plain directory", 0, None))
            continue
        when = time.time() if now is None else now
        try:
            state, reason, age, size = _classify(path, when, older_than)
        except FileNotFoundError:
            continue  # released while we looked
        entry = SweepEntry(name, str(path), state, reason, size, age)
        if delete and entry.removable:
            entry = _delete(shared, entry, older_than, now)
        entries.append(entry)
    return entries


def _delete(shared: Path, entry: SweepEntry, older_than: float, now: float | None) -> SweepEntry:
    path = Path(entry.path)
    fault_point("sweep.before-recheck", path)
    # Look again right before deleting: a lease may have appeared or a heartbeat landed since.
    try:
        state, reason, age, size = _classify(path, time.time() if now is None else now, older_than)
    except FileNotFoundError:
        return _replace(entry, deleted=True)
    if state not in REMOVABLE_STATES:
        return SweepEntry(entry.run_id, entry.path, state, reason, size, age)
    try:
        freed = remove_run_dir(shared, entry.run_id)
    except (OSError, BundleError) as e:  # reported on the entry; the sweep goes on
        return _replace(entry, error=str(e))
    return _replace(entry, deleted=True, freed=freed)


def _replace(entry: SweepEntry, **changes: Any) -> SweepEntry:
    return SweepEntry(**{**asdict(entry), **changes})
