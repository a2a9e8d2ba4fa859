"""Leases and ``rollout-bundle sweep``: crashed runs' directories go, live runs' never do.

Live and crashed runs are real processes: one holds its lease and heartbeats, the other was
killed with SIGKILL (so it never reached its teardown) and reaped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_until
from helpers.swap import make_victim, swap_after_listing, victim_intact

from trainer_hooks import (
    LEASE_NAME,
    RunLease,
    RunMediaError,
    parse_duration,
    read_lease,
    store_media,
    sweep_run_media,
)
from trainer_hooks.cli import main

# A run: lease its media directory with a fast heartbeat, store one file, say so, then idle.
RUN_SCRIPT = """
import sys, time
from argparse import Namespace
from trainer_hooks import acquire_run_lease, store_media
args = Namespace(shared_media_dir=sys.argv[1], run_uuid=sys.argv[2])
lease = acquire_run_lease(args, interval=0.2)
store_media(args, b"x" * 1000, suffix=".bin")
print("ready", flush=True)
time.sleep(120)
"""


class Run:
    def __init__(self, shared: Path, run_id: str) -> None:
        self.dir = shared / run_id
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUN_SCRIPT, str(shared), run_id], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"run {run_id} did not start: {line!r}"

    def crash(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)  # reaped: no zombie keeps the pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.stop()


def _states(entries) -> dict[str, str]:
    return {e.run_id: e.state for e in entries}


def _heartbeat(run_dir: Path) -> float:
    lease = read_lease(run_dir)
    assert lease is not None, f"{run_dir}: no lease"
    return float(lease["heartbeat_at"])


def _lease_threads(run_id: str) -> list[str]:
    """The heartbeat threads of leases on ``run_id`` alive in this process (named by RunLease)."""
    return [t.name for t in threading.enumerate() if t.name == f"run-lease-{run_id[:8]}"]


def _tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="needs /proc to tell a live pid from a reused one"
)
def test_sweep_deletes_a_crashed_run_and_never_a_live_one(tmp_path: Path, runs: list[Run]) -> None:
    shared = tmp_path / "shared"
    live = Run(shared, "live-run")
    runs.append(live)
    crashed = Run(shared, "crashed-run")
    runs.append(crashed)
    crashed.crash()
    live_before = _tree(live.dir)
    assert LEASE_NAME in live_before and sorted(v for k, v in live_before.items() if k.endswith(".bin")) == [
        1000
    ]

    listed = sweep_run_media(shared)  # default --older-than 1h: the crash is known by its pid
    assert _states(listed) == {"crashed-run": "crashed", "live-run": "live"}
    assert all(not e.deleted for e in listed) and crashed.dir.exists()
    crashed_entry = next(e for e in listed if e.run_id == "crashed-run")
    assert crashed_entry.size > 1000 and "is gone" in crashed_entry.reason

    # Even with the shortest threshold, a live run is kept: deletion needs evidence of death.
    swept = sweep_run_media(shared, older_than=0.0, delete=True)
    assert {e.run_id: (e.state, e.deleted) for e in swept} == {
        "crashed-run": ("crashed", True),
        "live-run": ("live", False),
    }
    assert next(e for e in swept if e.run_id == "crashed-run").freed >= 1000
    assert not crashed.dir.exists()
    # Two heartbeats after the sweep, the live run is still there and still heartbeating.
    swept_at = time.time()
    for _ in range(2):
        beat = _heartbeat(live.dir)
        wait_until(lambda b=beat: _heartbeat(live.dir) > max(b, swept_at), "a heartbeat of the live run")
    assert live.dir.is_dir() and set(_tree(live.dir)) == set(live_before)
    assert live.proc.poll() is None

    # Once the live run dies too, it is swept like any crashed run.
    live.crash()
    assert _states(sweep_run_media(shared, delete=True)) == {"live-run": "crashed"}
    assert os.listdir(shared) == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_cli_sweep_lists_then_deletes(
    tmp_path: Path, runs: list[Run], capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared"
    runs.append(Run(shared, "live-run"))
    crashed = Run(shared, "crashed-run")
    runs.append(crashed)
    crashed.crash()

    assert main(["sweep", str(shared)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["STATE", "SIZE", "AGE", "RUN", "DETAIL"]
    assert any(line.startswith("crashed ") and "crashed-run" in line for line in lines)
    assert any(line.startswith("live ") and "live-run" in line for line in lines)
    assert "1 of 2 run directories can be removed" in out and "--delete" in out
    assert crashed.dir.exists()

    assert main(["sweep", str(shared), "--older-than", "10m", "--delete"]) == 0
    out = capsys.readouterr().out
    assert "crashed (deleted)" in out and "deleted 1 run directory" in out and "kept 1" in out
    assert not crashed.dir.exists() and (shared / "live-run").is_dir()

    assert main(["sweep", str(shared), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["run_id"], r["state"], r["deleted"]) for r in rows] == [("live-run", "live", False)]


def _write_lease(
    run_dir: Path, *, host: str, heartbeat_age: float, pid: int = 12345, **extra: object
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "a.bin").write_bytes(b"z" * 10)
    now = time.time()
    lease = {
        "lease_version": 1,
        "run_id": run_dir.name,
        "host": host,
        "pid": pid,
        "started_at": now - heartbeat_age - 5,
        "heartbeat_at": now - heartbeat_age,
        "heartbeat_interval_s": 30.0,
        **extra,
    }
    (run_dir / LEASE_NAME).write_text(json.dumps(lease))
    past = now - heartbeat_age
    os.utime(run_dir / LEASE_NAME, (past, past))


def test_leases_of_other_hosts_are_judged_by_heartbeat_age(tmp_path: Path) -> None:
    _write_lease(tmp_path / "remote-stale", host="elsewhere.invalid", heartbeat_age=7200)
    _write_lease(tmp_path / "remote-fresh", host="elsewhere.invalid", heartbeat_age=600)
    # A threshold below three heartbeats does not make a heartbeating run deletable.
    _write_lease(tmp_path / "remote-beating", host="elsewhere.invalid", heartbeat_age=20)
    entries = sweep_run_media(tmp_path, older_than=10.0, delete=False)
    assert _states(entries) == {"remote-beating": "live", "remote-fresh": "stale", "remote-stale": "stale"}
    entries = sweep_run_media(tmp_path, older_than=parse_duration("1h"), delete=True)
    assert {e.run_id: (e.state, e.deleted) for e in entries} == {
        "remote-beating": ("live", False),
        "remote-fresh": ("live", False),
        "remote-stale": ("stale", True),
    }
    assert sorted(os.listdir(tmp_path)) == ["remote-beating", "remote-fresh"]


def test_a_reused_pid_counts_as_gone(tmp_path: Path) -> None:
    if not Path(f"/proc/{os.getpid()}/stat").exists():
        pytest.skip("needs /proc")
    from trainer_hooks.run_media._lease import _identity  # the fields a lease records about its process

    me = _identity()
    _write_lease(tmp_path / "reused", heartbeat_age=1, **{**me, "pid_start_ticks": me["pid_start_ticks"] - 1})
    _write_lease(tmp_path / "mine", heartbeat_age=3600 * 24, **me)
    assert _states(sweep_run_media(tmp_path)) == {"mine": "live", "reused": "crashed"}


def _marked_run(run_dir: Path) -> None:
    """A run directory as a run makes it (marker included), without a lease."""
    store_media(
        Namespace(shared_media_dir=str(run_dir.parent), run_uuid=run_dir.name), b"q" * 3, suffix=".bin"
    )


def _age(root: Path, seconds: float) -> None:
    """Make everything under ``root``, and ``root``, look unchanged for ``seconds``."""
    past = time.time() - seconds
    for p in [*root.rglob("*"), root]:
        os.utime(p, (past, past), follow_symlinks=False)


def test_directories_without_a_lease_go_by_modification_time(tmp_path: Path) -> None:
    old, new = tmp_path / "old-run", tmp_path / "new-run"
    for d in (old, new):
        _marked_run(d)
        (d / "sub").mkdir()
        (d / "sub" / "f.bin").write_bytes(b"q" * 3)
    _age(old, 7200)
    (new / LEASE_NAME).write_text("{not json")  # unreadable lease: judged like no lease
    entries = sweep_run_media(tmp_path, delete=True)
    assert {e.run_id: (e.state, e.deleted) for e in entries} == {
        "new-run": ("recent", False),
        "old-run": ("orphaned", True),
    }
    assert "corrupt lease (.lease.json is not JSON" in next(
        e.reason for e in entries if e.run_id == "new-run"
    )
    # A file changed recently deep inside keeps an otherwise old directory.
    _marked_run(tmp_path / "old2")
    (tmp_path / "old2" / "sub").mkdir()
    (tmp_path / "old2" / "sub" / "fresh").write_bytes(b"")
    _age(tmp_path / "old2", 7200)
    os.utime(tmp_path / "old2" / "sub" / "fresh")
    assert _states(sweep_run_media(tmp_path, delete=True))["old2"] == "recent"


def test_sweep_deletes_only_directories_that_prove_they_are_run_directories(tmp_path: Path) -> None:
    """Issue 8 defect 2: pointed at a home directory, sweep --delete deletes nothing of it."""
    home = tmp_path / "home"
    for name in ("Documents", "dataset", "run-like-0123abcd"):
        (home / name / "sub").mkdir(parents=True)
        (home / name / "sub" / "file.txt").write_text("keep me")
    _write_lease(home / "copied-lease", host="elsewhere.invalid", heartbeat_age=10**6, run_id="another-run")
    (home / "garbage-lease").mkdir()
    (home / "garbage-lease" / LEASE_NAME).write_text('{"heartbeat_at": "yesterday"}')
    _marked_run(home / "real-run")
    _write_lease(home / "leased-run", host="elsewhere.invalid", heartbeat_age=10**6)
    for d in home.iterdir():
        _age(d, 10**6)
    before = _tree(home)
    entries = sweep_run_media(home, older_than=0.0, delete=True)
    assert {e.run_id: (e.state, e.deleted) for e in entries} == {
        "Documents": ("skipped", False),
        "copied-lease": ("skipped", False),
        "dataset": ("skipped", False),
        "garbage-lease": ("skipped", False),
        "leased-run": ("stale", True),
        "real-run": ("orphaned", True),
        "run-like-0123abcd": ("skipped", False),
    }
    reasons = {e.run_id: e.reason for e in entries}
    assert reasons["Documents"] == "not a run directory (no .run-media.json marker and no lease naming it)"
    assert reasons["garbage-lease"].endswith(
        "corrupt lease (heartbeat_at: expected a finite time, found 'yesterday')"
    )
    assert all(e.size == 0 for e in entries if e.state == "skipped")  # not even walked
    assert _tree(home) == {k: v for k, v in before.items() if not k.startswith(("real-run", "leased-run"))}


@pytest.mark.parametrize(
    "heartbeat, fresh, expected",
    [
        # -Infinity once made the heartbeat infinitely old: a fresh run directory was deleted.
        ("-Infinity", True, ("recent", False)),
        # Infinity once made it live forever: an abandoned directory was never deleted.
        ("Infinity", False, ("orphaned", True)),
        ("NaN", False, ("orphaned", True)),
        ("1e300", False, ("orphaned", True)),  # more than a day in the future
        ("true", False, ("orphaned", True)),
    ],
)
def test_a_lease_with_a_non_finite_or_garbage_heartbeat_is_reported_corrupt(
    tmp_path: Path, heartbeat: str, fresh: bool, expected: tuple[str, bool]
) -> None:
    run = tmp_path / "run-a"
    _marked_run(run)
    lease = {"lease_version": 1, "run_id": "run-a", "host": "elsewhere.invalid", "pid": 1}
    (run / LEASE_NAME).write_text(json.dumps(lease)[:-1] + f', "heartbeat_at": {heartbeat}}}')
    if not fresh:
        _age(run, 7200)
    [entry] = sweep_run_media(tmp_path, delete=True)
    assert (entry.state, entry.deleted) == expected
    assert entry.reason.startswith("corrupt lease (heartbeat_at")
    assert read_lease(run) is None


def test_a_lease_from_another_boot_respects_older_than(tmp_path: Path) -> None:
    """Same host name, another boot id: a reboot, or another machine with the same name. It is
    crashed only once its heartbeat is older than both three beats and --older-than (issue 8
    defect 2, issue 12 row 7)."""
    from trainer_hooks.run_media._lease import _identity

    me = _identity()
    if me["boot_id"] is None:
        pytest.skip("needs /proc/sys/kernel/random/boot_id")
    other = {**me, "boot_id": "00000000-0000-0000-0000-000000000000"}
    for name, age in (("beating", 60), ("missed-beats", 200), ("long-gone", 7200)):
        _write_lease(tmp_path / name, heartbeat_age=age, **other)  # interval 30 s: grace 90 s
    assert _states(sweep_run_media(tmp_path, older_than=3600.0)) == {
        "beating": "live",
        "long-gone": "crashed",
        "missed-beats": "live",
    }
    entries = sweep_run_media(tmp_path, older_than=0.0, delete=True)
    assert {e.run_id: (e.state, e.deleted) for e in entries} == {
        "beating": ("live", False),  # within three heartbeats, whatever --older-than says
        "long-gone": ("crashed", True),
        "missed-beats": ("crashed", True),
    }
    assert "another boot" in next(e.reason for e in entries if e.run_id == "beating")


def test_a_lease_from_another_pid_namespace_is_judged_by_heartbeat_only(tmp_path: Path) -> None:
    """Same host name and boot, another pid namespace (a container): its pid means nothing here,
    so a pid that is dead here does not make it crashed (issue 12 row 9)."""
    from trainer_hooks.run_media._lease import _identity

    me = _identity()
    if me["pid_namespace"] is None:
        pytest.skip("needs /proc/self/ns/pid")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    other = {**me, "pid": dead_pid, "pid_start_ticks": None, "pid_namespace": "pid:[1]"}
    _write_lease(tmp_path / "container-run", heartbeat_age=5, **other)
    _write_lease(tmp_path / "container-gone", heartbeat_age=7200, **other)
    _write_lease(
        tmp_path / "same-namespace", heartbeat_age=5, **{**other, "pid_namespace": me["pid_namespace"]}
    )
    entries = sweep_run_media(tmp_path, delete=True)
    assert {e.run_id: (e.state, e.deleted) for e in entries} == {
        "container-gone": ("stale", True),
        "container-run": ("live", False),
        "same-namespace": ("crashed", True),  # here the dead pid is proof
    }


def test_sweep_re_checks_right_before_deleting(tmp_path: Path) -> None:
    """A run that comes alive between the verdict and the deletion is kept (issue 12 row 8)."""
    from bundles.support import on_fault_point

    _write_lease(tmp_path / "resumed", host="elsewhere.invalid", heartbeat_age=7200)
    leases: list[RunLease] = []

    def resume(path: Path) -> None:  # the crashed run is resumed with the same --run-uuid
        leases.append(RunLease(path, interval=30.0).start())

    with on_fault_point("sweep.before-recheck", resume):
        entries = sweep_run_media(tmp_path, delete=True)
    try:
        assert len(leases) == 1
        assert [(e.run_id, e.state, e.deleted) for e in entries] == [("resumed", "live", False)]
        assert (tmp_path / "resumed" / "a.bin").exists()
    finally:
        for lease in leases:
            lease.close()


def test_links_files_and_hidden_entries_are_never_touched(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim"
    _write_lease(victim, host="elsewhere.invalid", heartbeat_age=10**6)
    (shared / "link").symlink_to(victim, target_is_directory=True)
    (shared / "file").write_text("x")
    (shared / ".hidden-tmp").mkdir()
    past = time.time() - 10**6
    os.utime(shared / ".hidden-tmp", (past, past))
    entries = sweep_run_media(shared, older_than=0.0, delete=True)
    assert {e.run_id: e.state for e in entries} == {"file": "skipped", "link": "skipped"}
    assert (victim / "a.bin").exists() and (shared / "file").exists() and (shared / ".hidden-tmp").exists()


def test_sweep_of_a_missing_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RunMediaError, match="shared media directory not found"):
        sweep_run_media(tmp_path / "nope")
    assert main(["sweep", str(tmp_path / "nope")]) == 1
    assert "shared media directory not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, seconds", [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("90", 90), ("1.5h", 5400)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="duration '2w'"):
        parse_duration("2w")
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(tmp_path), "--older-than", "2w"])
    assert info.value.code == 2 and "--older-than" in capsys.readouterr().err


# ---------------------------------------------------------------- RunLease


def test_lease_heartbeats_and_is_removed_on_close(tmp_path: Path) -> None:
    with RunLease(tmp_path / "run", interval=0.05) as lease:
        first = read_lease(tmp_path / "run")
        assert first is not None and first["pid"] == os.getpid() and first["host"] == socket.gethostname()

        def a_later_heartbeat():
            r = read_lease(tmp_path / "run")
            return r if r is not None and r["heartbeat_at"] > first["heartbeat_at"] else None

        later = wait_until(a_later_heartbeat, "a second heartbeat")
        assert later["started_at"] == first["started_at"]
        assert lease.active
    assert not (tmp_path / "run" / LEASE_NAME).exists()
    assert (tmp_path / "run").is_dir()  # the lease never removes media: release does


def test_a_lease_stops_heartbeating_when_its_directory_is_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    lease = RunLease(tmp_path / "run", interval=0.05).start()
    shutil.rmtree(tmp_path / "run")
    # The heartbeat thread meets the missing directory, says so and ends ...
    wait_until(lambda: not _lease_threads("run"), "the heartbeat thread to end")
    assert any("vanished while the run holds it; heartbeat stops" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "run").exists()  # ... without recreating it
    lease.close()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_live_lease_is_not_taken_over_but_a_crashed_one_is(tmp_path: Path, runs: list[Run]) -> None:
    live = Run(tmp_path, "run-a")
    runs.append(live)
    with pytest.raises(RunMediaError, match=r"already leased .*same --run-uuid"):
        RunLease(tmp_path / "run-a").start()
    live.crash()
    with RunLease(tmp_path / "run-a", interval=0.05):
        lease = read_lease(tmp_path / "run-a")
        assert lease is not None and lease["pid"] == os.getpid()
    # Taking over keeps the crashed process's media: a resumed run may still need it.
    assert [n for n in os.listdir(tmp_path / "run-a") if n.endswith(".bin")]


def test_release_stops_this_process_lease_first(tmp_path: Path) -> None:
    from argparse import Namespace

    from trainer_hooks import acquire_run_lease, release_run_media, store_media

    args = Namespace(shared_media_dir=str(tmp_path), run_uuid="run-a")
    lease = acquire_run_lease(args, interval=0.0005)  # heartbeats as fast as it can
    assert lease is not None
    for i in range(50):
        store_media(args, bytes([i]) * 10, suffix=".bin")
    assert release_run_media(args) >= 500
    # The heartbeat thread has ended before the directory went, so nothing can recreate it.
    assert not lease.active and _lease_threads("run-a") == []
    assert not (tmp_path / "run-a").exists()
    lease.close()  # idempotent


def test_sweep_delete_never_follows_a_subdirectory_swapped_for_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 defect 1 through ``sweep --delete``: the swap lands after the deleter listed the
    subdirectory (its two size walks, for the verdict and the re-check, are let through)."""
    shared, outside, parking = tmp_path / "shared", tmp_path / "outside", tmp_path / "parking"
    run = shared / "remote-stale"
    _write_lease(run, host="elsewhere.invalid", heartbeat_age=7200)
    names = [f"n{i:03d}.png" for i in range(100)]
    (run / "sub").mkdir()
    for name in names:
        (run / "sub" / name).write_bytes(b"run's own file")
    content = make_victim(outside, names)
    with swap_after_listing(monkeypatch, run / "sub", outside, parking, skip=2) as swap:
        try:
            entries = sweep_run_media(shared, delete=True)
        finally:
            assert victim_intact(outside, content) == [], "deleted files outside the shared root"
    assert swap == {"listings": 3, "swapped": 1}
    assert [(e.run_id, e.state, e.deleted, e.error) for e in entries] == [
        ("remote-stale", "stale", True, None)
    ]
    assert os.listdir(shared) == [] and os.listdir(parking) == []


def test_a_directory_that_cannot_be_removed_is_reported_and_the_sweep_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run directory that keeps getting new files while it is deleted (something still writes
    there) fails with the path named on its entry; the other directories are still swept."""
    from bundles.support import on_fault_point

    for name in ("a-busy-run", "b-dead-run"):
        _write_lease(tmp_path / name, host="elsewhere.invalid", heartbeat_age=7200)
    busy = tmp_path / "a-busy-run"
    written = iter(range(10**6))

    def keep_writing(directory: str, _name: str) -> None:
        if Path(directory) == busy and busy.is_dir():
            (busy / f"late-{next(written)}.bin").write_bytes(b"x")

    with on_fault_point("remove_tree.entry", keep_writing):
        entries = sweep_run_media(tmp_path, delete=True)
        # Its marker and lease are removed last, so it is still a run directory to sweep again.
        assert (busy / LEASE_NAME).is_file()
        assert main(["sweep", str(tmp_path), "--delete"]) == 1
    by_id = {e.run_id: e for e in entries}
    assert by_id["b-dead-run"].deleted and not (tmp_path / "b-dead-run").exists()
    failed = by_id["a-busy-run"]
    assert not failed.deleted and failed.error is not None
    assert f"{busy}: directory keeps getting new entries while being removed" in failed.error
    assert "delete failed" in capsys.readouterr().out
