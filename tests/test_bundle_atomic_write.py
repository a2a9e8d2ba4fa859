"""The one atomic file write (bundles.support.atomic_write), its crash behaviour tested once.

A real writer process is SIGKILLed at each fault point of a write (mid-data, data complete but
not renamed, renamed but directory not fsynced): the destination then holds the complete old or
the complete new bytes, never a torn file, and the temporary file it may leave is removed by the
next write into the directory (or by ``remove_stale_temps``), while a live writer's never is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from bundles.support import KILL_ENV, atomic_write, atomic_writer, remove_stale_temps

ROOT = Path(__file__).resolve().parent.parent
OLD = b"old!" * 100_000
NEW = b"new." * 300_000  # written in 12 chunks of 100 kB, a fault point between chunks

CHILD = textwrap.dedent(
    """
    import sys
    from bundles.support import atomic_write, fault_point

    dest, durable, sweep = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
    data = b"new." * 300_000

    def chunks(f):
        for i in range(0, len(data), 100_000):
            f.write(data[i : i + 100_000])
            f.flush()
            fault_point("test.mid-data")

    atomic_write(dest, chunks, durable=durable, sweep=sweep)
    """
)


def _temps(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def _run_child(dest: Path, point: str | None, *, durable: bool, sweep: bool = True) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if point:
        env[KILL_ENV] = point
    else:
        env.pop(KILL_ENV, None)
    cmd = [sys.executable, "-c", CHILD, str(dest), "1" if durable else "0", "1" if sweep else "0"]
    return subprocess.run(cmd, env=env, timeout=120).returncode


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "not-durable"])
@pytest.mark.parametrize(
    ("point", "expected"),
    [
        ("test.mid-data@1", OLD),  # a tenth of the new bytes written
        ("test.mid-data@7", OLD),  # more than half
        ("atomic_write.after-data", OLD),  # complete, not renamed
        ("atomic_write.after-rename", NEW),  # renamed, directory not fsynced
    ],
)
def test_a_writer_killed_at_any_point_leaves_old_or_new_and_the_next_write_cleans_up(
    tmp_path, point, expected, durable
):
    dest = tmp_path / "state.json"
    dest.write_bytes(OLD)
    assert _run_child(dest, point, durable=durable) == -signal.SIGKILL
    assert dest.read_bytes() == expected  # never torn
    left = _temps(tmp_path)
    if expected is OLD:
        assert len(left) == 1 and left[0].startswith(".state.json.staging.")  # its temporary file
    else:
        assert left == []
    # The next write into the directory removes the dead writer's temporary file.
    atomic_write(dest, b"third", durable=durable)
    assert dest.read_bytes() == b"third"
    assert _temps(tmp_path) == []


def test_without_sweep_the_leftover_waits_for_remove_stale_temps(tmp_path):
    dest = tmp_path / "lease.json"
    dest.write_bytes(OLD)
    assert _run_child(dest, "atomic_write.after-data", durable=False, sweep=False) == -signal.SIGKILL
    (leftover,) = _temps(tmp_path)
    atomic_write(dest, b"x", sweep=False)  # a writer into a big directory does not scan it
    assert _temps(tmp_path) == [leftover] and dest.read_bytes() == b"x"
    assert remove_stale_temps(tmp_path) == [tmp_path / leftover]
    assert _temps(tmp_path) == []


def test_a_live_writers_temporary_file_is_never_removed(tmp_path):
    dest = tmp_path / "report.html"
    code = textwrap.dedent(
        """
        import sys
        from bundles.support import atomic_writer

        with atomic_writer(sys.argv[1]) as f:
            f.write(b"partial")
            f.flush()
            print("writing", flush=True)
            sys.stdin.readline()  # hold the write open until the test says so
            f.write(b" and the rest")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", code, str(dest)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        assert child.stdout.readline() == b"writing\n"
        (temp,) = _temps(tmp_path)
        assert remove_stale_temps(tmp_path) == []
        atomic_write(tmp_path / "other", b"y")  # a sweeping write beside it leaves it too
        assert temp in _temps(tmp_path)
        child.stdin.write(b"go\n")
        child.stdin.close()
        assert child.wait(timeout=60) == 0
    assert dest.read_bytes() == b"partial and the rest"
    assert _temps(tmp_path) == []


def test_a_failed_write_keeps_the_old_file_removes_its_temporary_and_names_the_destination(tmp_path):
    dest = tmp_path / "trajectory.jsonl"
    dest.write_bytes(OLD)

    def full_disk(f):
        f.write(b"some")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)

    with pytest.raises(OSError) as info:
        atomic_write(dest, full_disk)
    assert info.value.filename == str(dest)  # not the temporary name nobody typed
    assert ".staging." not in str(info.value)
    with pytest.raises(KeyboardInterrupt), atomic_writer(dest) as f:
        f.write(b"half")
        raise KeyboardInterrupt
    assert dest.read_bytes() == OLD and _temps(tmp_path) == []


def test_mode_text_and_durable_options(tmp_path):
    dest = tmp_path / "media.png"
    atomic_write(dest, b"\x89PNG", mode=0o444, durable=True)
    assert dest.stat().st_mode & 0o777 == 0o444
    atomic_write(dest, b"again", mode=0o444)  # renaming over a read-only file works
    assert dest.read_bytes() == b"again"
    with atomic_writer(tmp_path / "t.txt", text=True) as f:
        f.write("héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    atomic_write(tmp_path / "s.txt", "ünïcode")
    assert (tmp_path / "s.txt").read_bytes() == "ünïcode".encode()


def test_concurrent_writers_of_one_file_never_tear_it(tmp_path):
    dest = tmp_path / "marker.json"
    payloads = [bytes([65 + i]) * (50_000 + i) for i in range(8)]
    seen: list[bytes] = []
    stop = threading.Event()

    def write(p: bytes) -> None:
        for _ in range(20):
            atomic_write(dest, p, sweep=False)

    def read() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(dest.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert dest.read_bytes() in payloads
    assert seen and all(s in payloads for s in seen)
    assert _temps(tmp_path) == []


def test_without_renameat2_a_file_is_published_by_a_link_that_never_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``renameat2(RENAME_NOREPLACE)`` is refused (NFS, CIFS), ``replace=False`` links the
    file to its name: a file that appears after any check is still never replaced (the check and
    the rename of the fallback were a race: the check is made to miss here)."""
    from bundles._local import fs
    from bundles._local.atomic import DestinationExistsError

    monkeypatch.setattr(fs, "_call_renameat2", lambda *a: False)
    dest = tmp_path / "part.parquet"
    dest.write_bytes(b"mine")  # the user's (or the other writer's) file
    monkeypatch.setattr(fs.os.path, "lexists", lambda p: False)  # the check sees nothing
    with pytest.raises(DestinationExistsError) as e, atomic_writer(dest, replace=False) as f:
        f.write(b"theirs")
    assert e.value.filename == str(dest)
    monkeypatch.undo()
    assert dest.read_bytes() == b"mine" and os.listdir(tmp_path) == ["part.parquet"]
    monkeypatch.setattr(fs, "_call_renameat2", lambda *a: False)
    fresh = tmp_path / "fresh"
    with atomic_writer(fresh, replace=False) as f:
        f.write(b"new")
    assert fresh.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["fresh", "part.parquet"]
