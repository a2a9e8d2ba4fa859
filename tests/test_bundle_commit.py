"""The commit protocol: no bundle before commit, nothing left after, crash safety, overwrite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from media_helpers import put_media, tree_snapshot

from bundles import BundleExistsError, BundleReplacedError, open_bundle, write_bundle


def test_destination_appears_only_at_commit_and_nothing_is_left_behind(tmp_path):
    dest = tmp_path / "b"
    seen_during_write = []

    def samples():
        for i in range(5):
            # While samples are still being produced, dest must not exist and a staging dir must.
            seen_during_write.append((dest.exists(), [p.name for p in tmp_path.iterdir()]))
            yield {"i": i}

    write_bundle(dest, samples())
    assert all(not exists for exists, _ in seen_during_write)
    assert all(any(".b.staging." in n for n in names) for _, names in seen_during_write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert len(open_bundle(dest, verify="full")) == 5


def test_existing_destination_is_refused_without_overwrite(tmp_path):
    dest = write_bundle(tmp_path / "b", [{"v": 1}])
    with pytest.raises(BundleExistsError, match="pass overwrite=True"):
        write_bundle(dest, [{"v": 2}])
    assert [s["v"] for s in open_bundle(dest).samples()] == [1]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileExistsError):  # an empty directory is not silently replaced either
        write_bundle(tmp_path / "empty", [{"v": 2}])


def test_overwrite_replaces_a_bundle_but_never_other_directories(tmp_path):
    dest = write_bundle(tmp_path / "b", [{"v": 1}])
    write_bundle(dest, [{"v": 2}], overwrite=True)
    assert [s["v"] for s in open_bundle(dest, verify="full").samples()] == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(BundleExistsError, match="is not a bundle; refusing to replace it"):
        write_bundle(precious, [{"v": 3}], overwrite=True)
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_readers_see_old_or_new_bundle_at_every_instant_during_overwrite(tmp_path):
    dest = write_bundle(tmp_path / "b", [{"v": 0, "pad": b"x" * 1000}])
    stop = threading.Event()
    failures: list[BaseException] = []
    seen: set[int] = set()
    replaced_while_open = 0

    def read_loop():
        nonlocal replaced_while_open
        while not stop.is_set():
            try:
                # open_bundle itself must always find a complete bundle ...
                bundle = open_bundle(dest, verify="fast")
            except BaseException as e:
                failures.append(e)
                return
            try:
                seen.update(s["v"] for s in bundle.samples())
            except BundleReplacedError:
                replaced_while_open += 1  # ... and a Bundle swapped under its reader says so
            except BaseException as e:
                failures.append(e)
                return

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for v in range(1, 30):
            write_bundle(dest, [{"v": v, "pad": b"x" * 1000}], overwrite=True)
    finally:
        stop.set()
        reader.join()
    assert failures == []
    assert len(seen) > 1


CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from bundles import write_bundle
    dest, run, marker = sys.argv[1], sys.argv[2], sys.argv[3]
    images = sorted(os.path.join(run, n) for n in os.listdir(run))

    def samples():
        for i in range(10_000):
            if i == 50:
                open(marker, "w").close()  # mid-write: let the parent kill us
                time.sleep(60)
            yield {"i": i, "version": "new", "images": images}

    write_bundle(dest, samples(), media_roots=[run], overwrite=True)
    """
)


def _spawn_and_kill(tmp_path: Path, dest: Path, run: Path) -> None:
    marker = tmp_path / "mid-write"
    script = tmp_path / "writer.py"
    script.write_text(CRASHING_WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(dest), str(run), str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "writer never reached the middle of the write"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_mid_write_leaves_no_bundle(tmp_path):
    run = tmp_path / "run"
    put_media(run, os.urandom(2000))
    dest = tmp_path / "b"
    _spawn_and_kill(tmp_path, dest, run)
    assert not dest.exists()
    assert any(".b.staging." in p.name for p in tmp_path.iterdir())  # the dead writer's leftovers


def test_sigkill_mid_overwrite_keeps_the_previous_bundle_and_next_write_cleans_up(tmp_path):
    run = tmp_path / "run"
    put_media(run, os.urandom(2000))
    dest = write_bundle(tmp_path / "b", [{"i": 0, "version": "old"}])
    before = tree_snapshot(dest)
    _spawn_and_kill(tmp_path, dest, run)
    assert tree_snapshot(dest) == before
    assert [s["version"] for s in open_bundle(dest, verify="full").samples()] == ["old"]
    stale = [p for p in tmp_path.iterdir() if ".staging." in p.name]
    assert len(stale) == 1
    write_bundle(tmp_path / "other", [{"i": 1}])  # any later write into the same parent
    assert not stale[0].exists()


def test_live_writers_staging_is_not_cleaned_up(tmp_path):
    live = tmp_path / f".x.staging.{os.uname().nodename.replace('.', '-')}.{os.getpid()}.abcd1234"
    live.mkdir()
    foreign = tmp_path / ".y.staging.some-other-host.1.abcd1234"
    foreign.mkdir()
    write_bundle(tmp_path / "b", [{"i": 1}])
    assert live.exists() and foreign.exists()


def test_same_input_gives_the_same_bytes(tmp_path):
    import numpy as np

    run = tmp_path / "run"
    paths = [put_media(run, bytes([i]) * 999) for i in range(3)]
    samples = [
        {"i": i, "images": paths[: i + 1], "arr": np.arange(i + 3, dtype=np.float32), "t": (i, "x")}
        for i in range(20)
    ]
    a = write_bundle(tmp_path / "a", samples, media_roots=[run], meta={"k": [1, 2]})
    b = write_bundle(tmp_path / "b", samples, media_roots=[run], meta={"k": [1, 2]}, link="copy")
    assert tree_snapshot(a) == tree_snapshot(b)


def test_remove_bundle_removes_only_bundles(tmp_path):
    from bundles import BundleNotFoundError, remove_bundle

    dest = write_bundle(tmp_path / "b", [{"i": 1}])
    remove_bundle(dest)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "notes").mkdir()
    with pytest.raises(BundleNotFoundError, match="not a bundle"):
        remove_bundle(tmp_path / "notes")
    with pytest.raises(FileNotFoundError):
        remove_bundle(tmp_path / "gone")
    assert (tmp_path / "notes").is_dir()


def test_media_ref_from_bytes_matches_from_file(tmp_path):
    from bundles import MediaRef

    (tmp_path / "x.png").write_bytes(b"png bytes")
    a = MediaRef.from_bytes(b"png bytes", ".png")
    b = MediaRef.from_file(tmp_path / "x.png")
    assert (a.digest, a.size, a.suffix) == (b.digest, b.size, b.suffix) and a.path is None


def test_is_bundle_tells_committed_bundles_apart(tmp_path):
    from bundles import is_bundle

    dest = write_bundle(tmp_path / "b", [{"i": 1}])
    (tmp_path / "link").symlink_to(dest)
    (tmp_path / ".b.staging.h.1.ab").mkdir()
    assert is_bundle(dest)
    assert not is_bundle(tmp_path / "link")
    assert not is_bundle(tmp_path / ".b.staging.h.1.ab")
    assert not is_bundle(tmp_path / "missing")


def test_scratch_dirs_and_pack_files_of_dead_processes_are_cleaned_up(tmp_path):
    leave_behind = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from bundles import scratch_dir
        from bundles._commit import staging_name
        d = scratch_dir(Path(sys.argv[1]) / "ckpt", "images")
        (d / "x.png").write_bytes(b"png")
        staging_name(Path(sys.argv[1]) / "dump.rbundle").write_bytes(b"half a tar")
        print(d)
        """
    )
    r = subprocess.run([sys.executable, "-c", leave_behind, str(tmp_path)], capture_output=True, text=True,
                       check=True)
    scratch = Path(r.stdout.strip())
    assert scratch.is_dir() and scratch.name.startswith(".ckpt.images.staging.")
    assert len(list(tmp_path.iterdir())) == 2
    write_bundle(tmp_path / "next", [{"i": 1}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["next"]
