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
from collections.abc import Iterator
from pathlib import Path

import pytest
from media_helpers import wait_until
from swap_helpers import make_victim, swap_after_listing, victim_intact

from trainer_hooks import LEASE_NAME, RunLease, RunMediaError, parse_duration, read_lease, sweep_run_media
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
    from trainer_hooks._lease import _identity  # the fields a lease records about its process

    me = _identity()
    _write_lease(tmp_path / "reused", heartbeat_age=1, **{**me, "pid_start_ticks": me["pid_start_ticks"] - 1})
    _write_lease(tmp_path / "mine", heartbeat_age=3600 * 24, **me)
    assert _states(sweep_run_media(tmp_path)) == {"mine": "live", "reused": "crashed"}


def test_directories_without_a_lease_go_by_modification_time(tmp_path: Path) -> None:
    old, new = tmp_path / "old-run", tmp_path / "new-run"
    for d in (old, new):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f.bin").write_bytes(b"q" * 3)
    past = time.time() - 7200
    for p in (old / "sub" / "f.bin", old / "sub", old):
        os.utime(p, (past, past))
    (new / LEASE_NAME).write_text("{not json")  # unreadable lease: judged like no lease
    entries = sweep_run_media(tmp_path, delete=True)
    assert {e.run_id: (e.state, e.deleted) for e in entries} == {
        "new-run": ("recent", False),
        "old-run": ("orphaned", True),
    }
    assert "unreadable lease" in next(e.reason for e in entries if e.run_id == "new-run")
    # A file changed recently deep inside keeps an otherwise old directory.
    (tmp_path / "old2" / "sub").mkdir(parents=True)
    (tmp_path / "old2" / "sub" / "fresh").write_bytes(b"")
    for p in (tmp_path / "old2" / "sub", tmp_path / "old2"):
        os.utime(p, (past, past))
    assert _states(sweep_run_media(tmp_path, delete=True))["old2"] == "recent"


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
