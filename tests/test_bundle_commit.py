"""The commit protocol: no bundle before commit, nothing left after, crash safety, overwrite."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import put_media, tree_snapshot
from helpers.swap import make_victim, swap_after_listing, victim_intact

from bundles import (
    BundleError,
    BundleExistsError,
    BundleNotFoundError,
    BundleReplacedError,
    is_bundle,
    open_bundle,
    remove_bundle,
    write_bundle,
)
from bundles._local.fs import remove_tree

MANIFEST = "manifest.json"


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
    reads = replaced_while_open = 0

    def read_loop():
        nonlocal reads, replaced_while_open
        while not stop.is_set():
            try:
                # open_bundle itself must always find a complete bundle ...
                bundle = open_bundle(dest, verify="fast")
            except BaseException as e:
                failures.append(e)
                return
            try:
                values = [s["v"] for s in bundle.samples()]
            except BundleReplacedError as e:
                replaced_while_open += 1  # ... and a Bundle swapped under its reader says so
                if "replaced or removed while open" not in str(e) or str(dest) not in str(e):
                    failures.append(e)
                    return
                continue
            except BaseException as e:
                failures.append(e)
                return
            reads += 1
            if len(values) != 1:
                failures.append(AssertionError(f"expected one sample, read {values}"))
                return
            seen.update(values)

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for v in range(1, 30):
            write_bundle(dest, [{"v": v, "pad": b"x" * 1000}], overwrite=True)
    finally:
        stop.set()
        reader.join()
    # Whether a swap lands between a reader's open and its read is up to the scheduler, so the
    # count of BundleReplacedError is only reported here; the next test makes it happen.
    assert failures == [], f"{reads} clean reads, {replaced_while_open} replaced while open"
    assert len(seen) > 1


def test_a_reader_that_opened_the_directory_just_before_an_overwrite_reads_the_new_bundle(tmp_path):
    # An overwrite swaps whole directories (RENAME_EXCHANGE), then empties the one swapped out:
    # a reader that had opened the directory an instant before found its manifest gone and said
    # "not a bundle: manifest.json is missing" (CI, under load). The swap is made to land exactly
    # there, through the fault point after the reader opens the directory.
    from bundles.support import on_fault_point

    dest = write_bundle(tmp_path / "b", [{"v": 0}])
    fired: list[str] = []

    def overwrite_now(root, rel):
        if not fired and rel == "manifest.json" and Path(root) == Path(dest):
            fired.append(rel)
            write_bundle(dest, [{"v": 1}], overwrite=True)

    with on_fault_point("read.root-opened", overwrite_now):
        bundle = open_bundle(dest, verify="fast")
    assert fired == ["manifest.json"]
    assert [s["v"] for s in bundle.samples()] == [1]


def test_a_bundle_replaced_while_open_says_so_on_every_read(tmp_path):
    dest = write_bundle(tmp_path / "b", [{"v": 0, "pad": b"x" * 1000}])
    replaced_while_open = 0
    for v in range(1, 6):
        bundle = open_bundle(dest, verify="fast")
        write_bundle(dest, [{"v": v, "pad": b"x" * 1000}], overwrite=True)
        with pytest.raises(BundleReplacedError) as e:
            list(bundle.samples())
        assert str(e.value) == (
            f"{dest}: the bundle was replaced or removed while open (overwrite=True by another writer); "
            "open it again"
        )
        replaced_while_open += 1
        assert [s["v"] for s in open_bundle(dest, verify="fast").samples()] == [v]
    assert replaced_while_open == 5
    bundle = open_bundle(dest, verify="none")
    remove_bundle(dest)
    with pytest.raises(BundleReplacedError, match="replaced or removed while open"):
        list(bundle.samples())


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
    with pytest.raises(BundleNotFoundError) as e:
        remove_bundle(tmp_path / "gone")
    assert str(e.value) == f"{tmp_path / 'gone'}: no bundle here (path does not exist)"
    assert isinstance(e.value, FileNotFoundError)
    assert (tmp_path / "notes").is_dir()


def test_overwrite_never_replaces_a_symlink_even_to_a_bundle(tmp_path):
    real = write_bundle(tmp_path / "real", [{"v": 1}])
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    with pytest.raises(BundleExistsError) as e:
        write_bundle(tmp_path / "link", [{"v": 2}], overwrite=True)
    assert (
        str(e.value)
        == f"{tmp_path / 'link'}: destination exists and is not a bundle; refusing to replace it "
        "(a symlink, not a bundle directory)"
    )
    assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == str(real)
    assert [s["v"] for s in open_bundle(real, verify="full").samples()] == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no staging left


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
        from bundles.support import scratch_dir
        from bundles._local.commit import staging_name
        d = scratch_dir(Path(sys.argv[1]) / "ckpt", "images")
        (d / "x.png").write_bytes(b"png")
        staging_name(Path(sys.argv[1]) / "dump.rbundle").write_bytes(b"half a tar")
        print(d)
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", leave_behind, str(tmp_path)], capture_output=True, text=True, check=True
    )
    scratch = Path(r.stdout.strip())
    assert scratch.is_dir() and scratch.name.startswith(".ckpt.images.staging.")
    assert len(list(tmp_path.iterdir())) == 2
    write_bundle(tmp_path / "next", [{"i": 1}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["next"]


def test_removing_a_bundle_never_follows_a_directory_swapped_for_a_symlink(tmp_path, monkeypatch):
    """Issue 8 defect 1 for bundles: retired and staging directories go through the same
    fd-relative deletion as run media."""
    from bundles import remove_bundle

    run = tmp_path / "run"
    paths = [put_media(run, bytes([i]) * 100) for i in range(20)]
    dest = write_bundle(tmp_path / "b", [{"images": paths}], media_roots=[run])
    names = sorted(os.listdir(dest / "media"))
    content = make_victim(tmp_path / "outside", names)
    with swap_after_listing(monkeypatch, dest / "media", tmp_path / "outside", tmp_path / "parking") as swap:
        try:
            remove_bundle(dest)
        finally:
            assert victim_intact(tmp_path / "outside", content) == [], "deleted files outside the bundle"
    assert swap["swapped"] == 1
    assert not dest.exists() and os.listdir(tmp_path / "parking") == []
    assert not [p for p in tmp_path.iterdir() if ".retired." in p.name]


_UNPRIVILEGED_CHILD = """
import os, sys, traceback
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import test_bundle_commit as t          # everything imported while still root
try:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
except OSError as e:
    print(f"cannot drop to nobody: {e}")
    sys.exit(77)
getattr(t, sys.argv[2])(Path(sys.argv[3]))
"""


def _as_unprivileged(fn, base: Path) -> None:
    """Run ``fn(base)`` as an unprivileged user: directly when we are one, else in a fresh
    interpreter that drops to nobody, since root ignores the permissions this is about.

    Not a bare ``os.fork()`` of pytest: a fork of a process with other threads (Ray, zstd,
    lease heartbeats of other tests) can leave the child waiting forever on a lock one of them
    held, which hung whole-suite runs. The fresh interpreter has no other threads, and its
    Python cannot be exec'd as nobody (it lives under /root), so it starts as root, imports
    everything, then drops its privileges."""
    if os.geteuid() != 0:
        fn(base)
        return
    os.chmod(base, 0o777)
    r = subprocess.run(
        [sys.executable, "-c", _UNPRIVILEGED_CHILD, str(Path(__file__).parent), fn.__name__, str(base)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode == 77:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, f"the part run as nobody failed:\n{r.stdout}{r.stderr}"


def _permissions_scenario(base: Path) -> None:
    parent = base / "team"
    parent.mkdir()
    os.chmod(parent, 0o2770)
    try:
        assert remove_tree(parent / ".b.staging.h.1.ab") == 0  # already removed by another writer
    finally:
        assert stat.S_IMODE(parent.stat().st_mode) == 0o2770, "the parent's mode was changed"

    # Read-only and unreadable directories inside the tree are opened up; the parent is not.
    tree = parent / "tree"
    (tree / "ro" / "unreadable").mkdir(parents=True)
    (tree / "ro" / "f").write_bytes(b"12345")
    (tree / "ro" / "unreadable" / "g").write_bytes(b"123")
    os.link(tree / "ro" / "f", parent / "kept")  # a second link: deleting it frees nothing
    (tree / "ro" / "h").write_bytes(b"1234567")
    for p in (tree / "ro" / "f", tree / "ro" / "h"):
        os.chmod(p, 0o444)
    os.chmod(tree / "ro" / "unreadable", 0o000)
    os.chmod(tree / "ro", 0o555)
    # One read-only directory holding only files, one holding only a directory: each way of
    # needing write permission (unlink, rmdir) is met whatever order the entries are listed in.
    (tree / "ro-files").mkdir()
    (tree / "ro-files" / "a").write_bytes(b"")
    (tree / "ro-dirs" / "sub").mkdir(parents=True)
    for d in ("ro-files", "ro-dirs"):
        os.chmod(tree / d, 0o555)
    os.chmod(tree, 0o555)
    assert remove_tree(tree) == 7 + 3
    assert not tree.exists() and (parent / "kept").read_bytes() == b"12345"
    assert stat.S_IMODE(parent.stat().st_mode) == 0o2770

    # A read-only parent is reported, never made writable.
    (parent / "t2").mkdir()
    os.chmod(parent, 0o2550)
    with pytest.raises(BundleError, match=r"team/t2: cannot remove the directory: Permission denied"):
        remove_tree(parent / "t2")
    assert stat.S_IMODE(parent.stat().st_mode) == 0o2550
    os.chmod(parent, 0o2770)


def test_remove_tree_never_chmods_outside_what_it_deletes(tmp_path):
    """Issue 8 defect 5: a vanished staging directory, or a read-only tree, inside a setgid
    group directory leaves that directory's mode alone."""
    # Not under tmp_path: pytest makes that private to root, and the scenario may run as nobody.
    base = Path(tempfile.mkdtemp(prefix="perm-", dir="/tmp"))
    try:
        _as_unprivileged(_permissions_scenario, base)
        # Writes and overwrites into the group directory leave its mode alone too.
        parent = base / "team"
        write_bundle(parent / "b", [{"i": 1}])
        write_bundle(parent / "b", [{"i": 2}], overwrite=True)
        assert sorted(os.listdir(parent)) == ["b", "kept", "t2"]
        assert stat.S_IMODE(parent.stat().st_mode) == 0o2770
    finally:
        remove_tree(base)


def test_remove_tree_refuses_a_symlink_or_a_file_and_removes_nothing(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "keep").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "file").write_bytes(b"y")
    with pytest.raises(BundleError, match=r"link: expected a directory to remove, found a symlink"):
        remove_tree(tmp_path / "link")
    with pytest.raises(BundleError, match=r"file: expected a directory to remove, found not a directory"):
        remove_tree(tmp_path / "file")
    assert (tmp_path / "real" / "keep").exists() and (tmp_path / "link").is_symlink()
    assert (tmp_path / "file").exists()


# ---------------------------------------------------------------- leftovers of dead writers

needs_proc = pytest.mark.skipif(
    not (os.path.exists("/proc/self/ns/pid") and os.path.exists("/proc/sys/kernel/random/boot_id")),
    reason="needs /proc for boot id and pid namespace",
)


def _writer_tags() -> tuple[str, str, str]:
    """This process's host tag, boot tag and pid-namespace tag, read from the system."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    ns = re.sub(r"[^0-9]", "", os.readlink("/proc/self/ns/pid"))
    return host, boot, ns


def _dead_pid() -> int:
    r = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(r.stdout)  # exited and reaped


def _age_tree(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    for p in [*path.rglob("*"), path]:
        os.utime(p, (past, past))


@needs_proc
def test_leftovers_are_removed_only_when_their_writer_is_provably_dead(tmp_path):
    """Issue 8 defects 3 and 14, issue 12 row 6: the writer named by a leftover must be on this
    host, this boot and this pid namespace, and gone."""
    host, boot, ns = _writer_tags()
    dead = _dead_pid()
    cases = {
        "dead writer here": (f".a.staging.{host}.{boot}.{ns}.{dead}.aa", True),
        "dead writer's retired bundle": (f".a.retired.{host}.{boot}.{ns}.{dead}.ab", True),
        "live writer here": (f".b.staging.{host}.{boot}.{ns}.{os.getpid()}.ac", False),
        "another host, its pid dead here": (f".c.staging.other-host.{boot}.{ns}.{dead}.ad", False),
        "another pid namespace, its pid dead here": (f".d.staging.{host}.{boot}.4026531999.{dead}.ae", False),
        "another boot, changed an hour ago": (f".e.staging.{host}.00000000abcd.{ns}.{dead}.af", False),
        "another boot, unchanged for 25 hours": (f".f.retired.{host}.00000000abcd.{ns}.{dead}.b0", True),
        "a name from before 0.2": (f".g.staging.{host}.{dead}.b1", False),
    }
    for name, _ in cases.values():
        (tmp_path / name / "media").mkdir(parents=True)
        (tmp_path / name / "media" / "x.png").write_bytes(b"x")
        (tmp_path / name / MANIFEST).write_text("{}")
    _age_tree(tmp_path / cases["another boot, changed an hour ago"][0], 3600)
    _age_tree(tmp_path / cases["another boot, unchanged for 25 hours"][0], 25 * 3600)
    for name, _ in cases.values():
        assert not is_bundle(tmp_path / name)
        with pytest.raises(BundleNotFoundError, match="staging directory of an unfinished write"):
            open_bundle(tmp_path / name)
    write_bundle(tmp_path / "next", [{"i": 1}])  # any write into the parent cleans up
    outcome = {what: not (tmp_path / name).exists() for what, (name, _) in cases.items()}
    assert outcome == {what: removed for what, (_, removed) in cases.items()}


@needs_proc
def test_a_staging_name_records_host_boot_and_pid_namespace(tmp_path, monkeypatch):
    from bundles._local.faults import on_fault_point

    seen: list[str] = []
    with on_fault_point("commit.before-rename", lambda dest: seen.extend(os.listdir(tmp_path))):
        write_bundle(tmp_path / "b", [{"i": 1}])
    host, boot, ns = _writer_tags()
    [name] = seen
    assert re.fullmatch(rf"\.b\.staging\.{re.escape(host)}\.{boot}\.{ns}\.{os.getpid()}\.[0-9a-f]+", name)


KILLED_OVERWRITE = textwrap.dedent(
    """
    import sys
    import bundles._local.commit
    from bundles import write_bundle
    if sys.argv[3] == "no-exchange":  # a kernel or filesystem without RENAME_EXCHANGE
        bundles._local.commit.exchange = lambda a, b: False
    write_bundle(sys.argv[1], [{"version": "new", "images": [sys.argv[2]]}], media_roots=[sys.argv[4]],
                 overwrite=True)
    """
)


def _killed_at(point: str, dest: Path, image: str, mode: str) -> None:
    """Overwrite ``dest`` in a subprocess that SIGKILLs itself at the fault point ``point``."""
    env = {**os.environ, "ROLLOUT_BUNDLES_KILL_AT": point}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_OVERWRITE, str(dest), image, mode, str(Path(image).parent)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_a_kill_between_the_two_renames_of_an_overwrite_is_recovered(tmp_path):
    """Issue 8 defect 3: without RENAME_EXCHANGE an overwrite renames the old bundle aside, then
    the new one into place. Killed in between, the destination is empty, and the next write
    must put the complete new bundle there, not delete it."""
    image = put_media(tmp_path / "run", b"new image" * 100)
    dest = write_bundle(tmp_path / "b", [{"version": "old"}])
    _killed_at("commit.between-renames", dest, image, "no-exchange")
    assert not dest.exists()
    leftovers = sorted(p.name.split(".")[2] for p in tmp_path.iterdir() if p.name.startswith(".b."))
    assert leftovers == ["retired", "staging"]
    with pytest.raises(BundleNotFoundError):
        open_bundle(dest)
    write_bundle(tmp_path / "other", [{"i": 1}])  # the next write into the parent recovers
    bundle = open_bundle(dest, verify="full")
    assert [s["version"] for s in bundle.samples()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "other", "run"]


@pytest.mark.parametrize(
    "point, mode, version",
    [
        ("commit.before-rename", "exchange", "old"),
        ("commit.after-rename", "exchange", "new"),
        ("discard.after-manifest", "exchange", "new"),
        ("remove_tree.entry@2", "exchange", "new"),
        ("commit.after-rename", "no-exchange", "new"),
        ("discard.after-manifest", "no-exchange", "new"),
        ("remove_tree.entry@3", "no-exchange", "new"),
    ],
)
def test_a_kill_while_discarding_the_previous_bundle_leaves_one_complete_bundle(
    tmp_path, point, mode, version
):
    """Killed while the previous bundle is being removed, the destination holds a complete bundle
    and the half-removed one (retired, or swapped out under the staging name) is never a bundle;
    the next write removes it (issue 8 defect 3: retired directories leaked)."""
    image = put_media(tmp_path / "run", b"new image" * 100)
    old_images = [put_media(tmp_path / "run", bytes([i]) * 500) for i in range(5)]
    dest = write_bundle(
        tmp_path / "b", [{"version": "old", "images": old_images}], media_roots=[tmp_path / "run"]
    )
    _killed_at(point, dest, image, mode)
    assert [s["version"] for s in open_bundle(dest, verify="full").samples()] == [version]
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]
    assert len(left) == 1 and not is_bundle(left[0])
    if point.startswith(("discard", "remove_tree")):  # half removed: its manifest went first
        assert not (left[0] / MANIFEST).exists() and (left[0] / "media").is_dir()
    write_bundle(tmp_path / "other", [{"i": 1}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "other", "run"]
    assert [s["version"] for s in open_bundle(dest, verify="full").samples()] == [version]


def test_remove_bundle_killed_midway_never_leaves_a_bundle_under_a_hidden_name(tmp_path):
    dest = write_bundle(tmp_path / "b", [{"i": 1}])
    script = f"from bundles import remove_bundle; remove_bundle({str(dest)!r})"
    for point in ("remove_bundle.after-retire", "discard.after-manifest"):
        if not dest.exists():
            dest = write_bundle(tmp_path / "b", [{"i": 1}])
        env = {**os.environ, "ROLLOUT_BUNDLES_KILL_AT": point}
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert not dest.exists()
        [left] = [p for p in tmp_path.iterdir() if p.name.startswith(".b.retired.")]
        assert not is_bundle(left)
        write_bundle(tmp_path / "other", [{"i": 2}], overwrite=True)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["other"], point  # removed, not restored


def test_two_writers_creating_one_destination_with_overwrite_both_succeed(tmp_path):
    """Issue 8 defect 14: the destination appears between a writer's existence check and its
    rename; with overwrite=True that writer replaces it instead of failing."""
    from bundles._local.faults import on_fault_point

    dest = tmp_path / "b"
    other: list[Path] = []

    def another_writer_commits_first(_dest: Path) -> None:
        if not other:
            other.append(Path("pending"))
            other[0] = write_bundle(_dest, [{"who": "other"}], overwrite=True)

    with on_fault_point("commit.before-noreplace", another_writer_commits_first):
        mine = write_bundle(dest, [{"who": "me"}], overwrite=True)
    assert mine == other[0] == dest
    assert [s["who"] for s in open_bundle(dest, verify="full").samples()] == ["me"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    # Without overwrite the late writer is refused, naming the destination.
    other.clear()
    with (
        on_fault_point("commit.before-noreplace", another_writer_commits_first),
        pytest.raises(BundleExistsError, match="destination appeared during the write"),
    ):
        write_bundle(tmp_path / "c", [{"who": "me"}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "c"]


def test_remove_bundle_tolerates_a_concurrent_remover(tmp_path):
    """Issue 8 defect 14: another process removes the bundle between the check and the rename."""
    from bundles import remove_bundle
    from bundles._local.faults import on_fault_point

    dest = write_bundle(tmp_path / "b", [{"i": 1}])
    raced: list[bool] = []

    def other_remover(path: Path) -> None:
        if not raced:
            raced.append(True)
            remove_bundle(path)

    with (
        on_fault_point("remove_bundle.before-retire", other_remover),
        pytest.raises(BundleNotFoundError, match="removed meanwhile by another process"),
    ):
        remove_bundle(dest)
    assert raced and list(tmp_path.iterdir()) == []


RACING_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bundles import write_bundle
    parent, who, start = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    time.sleep(max(0.0, start - time.time()))  # all writers start together
    for i in range(8):
        write_bundle(parent / f"b{i}", [{"who": who, "i": i, "pad": b"x" * 4096}], overwrite=True)
    """
)


def test_four_writers_racing_on_the_same_destinations_all_succeed(tmp_path):
    """Issue 8 defects 5 and 14 as a real race: four processes write the same eight new
    destinations with overwrite=True into one 0o2770 directory. Every write succeeds, each
    destination ends as one complete bundle, nothing is left behind and the mode is kept."""
    parent = tmp_path / "team"
    parent.mkdir()
    os.chmod(parent, 0o2770)
    start = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACING_WRITER, str(parent), f"w{n}", str(start)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            errors.append(err[-2000:])
    assert errors == []
    assert sorted(p.name for p in parent.iterdir()) == [f"b{i}" for i in range(8)]
    for i in range(8):
        [sample] = open_bundle(parent / f"b{i}", verify="full").samples()
        assert sample["i"] == i and sample["who"] in {"w0", "w1", "w2", "w3"}
    assert stat.S_IMODE(parent.stat().st_mode) == 0o2770
