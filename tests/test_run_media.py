"""Run media directories: content-addressed atomic stores, and a release that only ever
removes the run's own directory."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import threading
import time
from argparse import Namespace
from pathlib import Path

import pytest
from helpers.swap import make_victim, swap_after_listing, victim_intact

from bundles import BundleError, MediaRef
from trainer_hooks import (
    RunMediaError,
    UnsafeRunDirError,
    release_run_media,
    run_media_dir,
    store_media,
)
from trainer_hooks.testing import png_bytes


def _args(shared: Path | None, run_uuid: str = "run-a") -> Namespace:
    return Namespace(shared_media_dir=None if shared is None else str(shared), run_uuid=run_uuid)


def _snapshot(root: Path) -> dict[str, tuple[int, bytes | str | None]]:
    """Every path under root (links not followed) with its mode and content or link target."""
    out: dict[str, tuple[int, bytes | str | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(root))] = (st.st_mode, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[str(p.relative_to(root))] = (st.st_mode, p.read_bytes())
            else:
                out[str(p.relative_to(root))] = (st.st_mode, None)
    return out


RUN_MARKER = ".run-media.json"


def _marker_size(run_dir: Path) -> int:
    """The run marker is freed with the run's files."""
    return (run_dir / RUN_MARKER).stat().st_size


def test_run_media_dir_is_shared_dir_slash_run_uuid(tmp_path: Path) -> None:
    assert run_media_dir(_args(tmp_path, "abc")) == tmp_path / "abc"
    assert run_media_dir(_args(None)) is None


def test_store_media_is_content_addressed_read_only_and_idempotent(tmp_path: Path) -> None:
    args = _args(tmp_path / "shared")
    data = png_bytes(4, 4, (1, 2, 3))
    ref = store_media(args, data)
    assert isinstance(ref, MediaRef)
    path = Path(ref.path)
    assert path == tmp_path / "shared" / "run-a" / ref.filename
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert ref == MediaRef.from_file(path)
    again = store_media(args, bytearray(data))
    assert again == ref and again.path == ref.path
    # No temporary file is left behind, and equal content is stored once; the run marker that
    # sweep asks for was written when the directory was created.
    assert sorted(os.listdir(path.parent)) == [RUN_MARKER, ref.filename]
    marker = json.loads((path.parent / RUN_MARKER).read_text())
    assert marker["run_id"] == "run-a" and marker["marker_version"] == 1
    other = store_media(args, b"other bytes", suffix=".bin")
    assert other.filename.endswith(".bin") and other.digest != ref.digest
    assert sorted(os.listdir(path.parent)) == sorted([RUN_MARKER, ref.filename, other.filename])


def test_store_media_replaces_a_damaged_file_of_the_wrong_size(tmp_path: Path) -> None:
    args = _args(tmp_path)
    ref = store_media(args, b"abcdef", suffix=".bin")
    os.chmod(ref.path, 0o644)
    Path(ref.path).write_bytes(b"abc")
    assert store_media(args, b"abcdef", suffix=".bin") == ref
    assert Path(ref.path).read_bytes() == b"abcdef"


def test_store_media_takes_a_pil_image(tmp_path: Path) -> None:
    Image = pytest.importorskip("PIL.Image")
    image = Image.new("RGB", (3, 2), (10, 20, 30))
    ref = store_media(_args(tmp_path), image, suffix=".png")
    with Image.open(ref.path) as reread:
        assert reread.size == (3, 2) and reread.getpixel((0, 0)) == (10, 20, 30)
    assert store_media(_args(tmp_path), image, suffix=".png") == ref


def test_store_media_errors_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(RunMediaError, match="--shared-media-dir is not set"):
        store_media(_args(None), b"x")
    with pytest.raises(TypeError, match="expected bytes or a PIL image, found str"):
        store_media(_args(tmp_path), "not bytes")
    with pytest.raises(BundleError, match="suffix"):
        store_media(_args(tmp_path), b"x", suffix="/png")
    assert not (tmp_path / "run-a").exists()


def test_release_removes_the_run_and_returns_bytes_freed(tmp_path: Path) -> None:
    args = _args(tmp_path)
    a = store_media(args, b"a" * 100, suffix=".bin")
    store_media(args, b"b" * 50, suffix=".bin")
    nested = tmp_path / "run-a" / "sub"
    nested.mkdir()
    (nested / "f").write_bytes(b"c" * 7)
    os.chmod(nested / "f", 0o444)
    os.chmod(nested, 0o555)  # a read-only subdirectory must not stop the release
    marker = _marker_size(tmp_path / "run-a")
    assert release_run_media(args) == 157 + marker
    assert not (tmp_path / "run-a").exists()
    assert tmp_path.is_dir()
    assert release_run_media(args) == 0  # idempotent
    assert not Path(a.path).exists()


def test_release_counts_hard_linked_files_as_not_freed(tmp_path: Path) -> None:
    args = _args(tmp_path / "shared")
    ref = store_media(args, b"x" * 1000, suffix=".bin")
    store_media(args, b"y" * 10, suffix=".bin")
    os.link(ref.path, tmp_path / "kept-by-a-bundle.bin")
    marker = _marker_size(tmp_path / "shared" / "run-a")
    assert release_run_media(args) == 10 + marker
    assert (tmp_path / "kept-by-a-bundle.bin").read_bytes() == b"x" * 1000


def test_release_leaves_other_runs_and_the_shared_root_intact(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    store_media(_args(shared, "run-a"), b"mine", suffix=".bin")
    store_media(_args(shared, "run-b"), b"theirs", suffix=".bin")
    store_media(_args(shared, "run-b"), b"mine", suffix=".bin")  # same content, other run
    (shared / "README").write_text("not a run")
    before = {k: v for k, v in _snapshot(shared).items() if not k.startswith("run-a")}
    shared_mode = shared.stat().st_mode
    marker = _marker_size(shared / "run-a")
    assert release_run_media(_args(shared, "run-a")) == 4 + marker
    assert _snapshot(shared) == before
    assert shared.stat().st_mode == shared_mode


def test_release_without_shared_media_dir_is_a_no_op(tmp_path: Path) -> None:
    assert release_run_media(_args(None)) == 0


@pytest.mark.parametrize(
    "run_id, why",
    [
        ("", "it is empty"),
        ("..", "'..'"),
        ("../shared", "path separator"),
        ("a..b", "'..'"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        (".", "starts with '.'"),
        (".hidden", "starts with '.'"),
        ("a\0b", "NUL"),
    ],
)
def test_release_refuses_unsafe_run_ids_and_deletes_nothing(tmp_path: Path, run_id: str, why: str) -> None:
    shared = tmp_path / "shared"
    store_media(_args(shared, "run-b"), b"theirs", suffix=".bin")
    (tmp_path / "outside").write_text("keep me")
    before = _snapshot(tmp_path)
    with pytest.raises(UnsafeRunDirError, match=why) as info:
        release_run_media(_args(shared, run_id))
    assert "--run-uuid" in str(info.value) and repr(run_id) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, BundleError)
    assert _snapshot(tmp_path) == before


def test_release_refuses_a_symlinked_run_dir_and_deletes_nothing(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    store_media(_args(shared, "run-b"), b"theirs", suffix=".bin")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    (shared / "run-a").symlink_to(victim, target_is_directory=True)
    (shared / "run-c").symlink_to(shared / "run-b", target_is_directory=True)
    before = _snapshot(tmp_path)
    for run_id in ("run-a", "run-c"):
        with pytest.raises(UnsafeRunDirError, match=r"is a symlink") as info:
            release_run_media(_args(shared, run_id))
        assert str(shared / run_id) in str(info.value)
    assert _snapshot(tmp_path) == before
    # Storing into a symlinked run directory is refused too.
    with pytest.raises(UnsafeRunDirError, match="is a symlink"):
        store_media(_args(shared, "run-a"), b"x")
    assert _snapshot(tmp_path) == before


def test_release_refuses_a_run_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "run-a").write_text("a file")
    with pytest.raises(UnsafeRunDirError, match="found a regular file"):
        release_run_media(_args(tmp_path))
    assert (tmp_path / "run-a").read_text() == "a file"


def test_release_works_through_a_symlinked_shared_root(tmp_path: Path) -> None:
    real = tmp_path / "real-shared"
    real.mkdir()
    link = tmp_path / "shared-link"
    link.symlink_to(real, target_is_directory=True)
    store_media(_args(link, "run-a"), b"x" * 5, suffix=".bin")
    store_media(_args(link, "run-b"), b"y", suffix=".bin")
    marker = _marker_size(real / "run-a")
    assert release_run_media(_args(link, "run-a")) == 5 + marker
    assert sorted(os.listdir(real)) == ["run-b"] and link.is_symlink()


def test_release_does_not_follow_symlinks_inside_the_run_dir(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    store_media(_args(shared), b"x", suffix=".bin")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    (shared / "run-a" / "link").symlink_to(victim, target_is_directory=True)
    release_run_media(_args(shared))
    assert (victim / "precious").read_text() == "keep me"
    assert not (shared / "run-a").exists()


def _run_with_swappable_subdir(shared: Path, outside: Path) -> tuple[Namespace, Path, dict[str, bytes]]:
    """A run directory whose ``sub`` holds files named like the ones in ``outside``."""
    args = _args(shared)
    store_media(args, b"z" * 10, suffix=".bin")
    names = [f"n{i:03d}.png" for i in range(100)]
    sub = shared / "run-a" / "sub"
    (sub / "deeper").mkdir(parents=True)
    for name in names:
        (sub / name).write_bytes(b"run's own file")
    (sub / "deeper" / "also-precious").write_bytes(b"run's own")
    return args, sub, make_victim(outside, names)


@pytest.mark.parametrize("moment", ["after listing the subdirectory", "after listing the run directory"])
def test_release_never_deletes_through_a_subdirectory_swapped_for_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """Issue 8 defect 1: the swap happens after a listing and before the unlinks, every time."""
    shared, outside, parking = tmp_path / "shared", tmp_path / "outside", tmp_path / "parking"
    args, sub, content = _run_with_swappable_subdir(shared, outside)
    trigger = sub if moment.endswith("subdirectory") else sub.parent
    with swap_after_listing(monkeypatch, sub, outside, parking, trigger=trigger) as swap:
        try:
            release_run_media(args)
        finally:
            assert victim_intact(outside, content) == [], "deleted files outside the shared root"
    assert swap["swapped"] == 1
    assert not (shared / "run-a").exists() and os.listdir(shared) == []
    if trigger == sub:
        # The deletion went on inside the real directory, wherever it was moved: the run's own
        # files are gone, the outside ones are not.
        assert sorted(os.listdir(parking)) == []


def test_release_racing_a_symlink_swapper_never_deletes_outside(tmp_path: Path) -> None:
    """The same attack as a real race: a thread flips ``sub`` between the real directory and a
    symlink to the outside directory as fast as it can while the run is released."""
    for trial in range(6):
        shared, outside = tmp_path / f"shared{trial}", tmp_path / f"outside{trial}"
        args, sub, content = _run_with_swappable_subdir(shared, outside)
        aside = tmp_path / f"aside{trial}"
        stop = threading.Event()

        def flip(
            sub: Path = sub, outside: Path = outside, aside: Path = aside, stop: threading.Event = stop
        ) -> None:
            while not stop.is_set():
                # Sleeping with the symlink in place hands the GIL to the deleter at that moment.
                try:
                    os.rename(sub, aside)
                    os.symlink(outside, sub, target_is_directory=True)
                    time.sleep(0.0005)
                    os.unlink(sub)
                    os.rename(aside, sub)
                    time.sleep(0.0002)
                except OSError:
                    return  # the run directory is gone

        t = threading.Thread(target=flip)
        t.start()
        try:
            with contextlib.suppress(BundleError):  # it may give up on a tree that keeps changing
                release_run_media(args)
        finally:
            stop.set()
            t.join()
            assert victim_intact(outside, content) == [], f"trial {trial}: deleted outside the shared root"


def test_release_never_crosses_into_a_filesystem_mounted_inside_the_run_dir(tmp_path: Path) -> None:
    """A bind or tmpfs mount inside a run directory (anything but the run's own files) stops the
    deletion before a file on it is touched."""
    args = _args(tmp_path / "shared")
    store_media(args, b"x" * 10, suffix=".bin")
    mnt = tmp_path / "shared" / "run-a" / "mnt"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "none", str(mnt)], capture_output=True).returncode
    ):
        pytest.skip("needs to mount a tmpfs (root)")
    try:
        (mnt / "on-another-filesystem").write_bytes(b"keep me")
        with pytest.raises(BundleError, match=r"run-a/mnt: is a mount point \(another filesystem\)"):
            release_run_media(args)
        assert (mnt / "on-another-filesystem").read_bytes() == b"keep me"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    release_run_media(args)
    assert not (tmp_path / "shared" / "run-a").exists()


# ---------------------------------------------------------------- a directory the run did not make


def _home_like(tmp_path: Path) -> Path:
    """``<tmp>/home-like/alice``: a user's directory where a run directory would go."""
    alice = tmp_path / "home-like" / "alice"
    (alice / "Documents").mkdir(parents=True)
    (alice / "Documents" / "thesis.tex").write_text("\\chapter{Results}")
    (alice / ".ssh").mkdir(mode=0o700)
    (alice / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    return alice


@pytest.mark.parametrize("driver", ["train", "train_async"])
def test_a_run_never_takes_or_deletes_a_directory_it_did_not_make(tmp_path: Path, driver: str) -> None:
    """Issue 30 item 3: ``--shared-media-dir /home-like --run-uuid alice`` with ``alice`` a user's
    directory. The run is refused at its start, naming the directory and what it holds, before
    it writes anything there; and nothing in it is ever deleted."""
    import trainer_hooks

    alice = _home_like(tmp_path)
    before = _snapshot(tmp_path)
    argv = ["--rollout-batch-size", "1", "--num-rollout", "2", "--run-uuid", "alice"]
    args = trainer_hooks.parse_args([*argv, "--shared-media-dir", str(alice.parent)])
    with pytest.raises(UnsafeRunDirError) as info:
        getattr(trainer_hooks, driver)(args)
    msg = str(info.value)
    assert msg.startswith(f"{alice}: exists and is not a run media directory (no .run-media.json marker")
    assert "'.ssh', 'Documents'" in msg and "choose another --run-uuid or --shared-media-dir" in msg
    assert _snapshot(tmp_path) == before
    # Every way in refuses it the same, and writes nothing: the lease, a screenshot, the release.
    for use in (trainer_hooks.acquire_run_lease, lambda a: store_media(a, b"x"), release_run_media):
        with pytest.raises(UnsafeRunDirError, match=r"not a run media directory"):
            use(args)
        assert _snapshot(tmp_path) == before


def test_release_deletes_only_a_directory_that_proves_a_run_made_it(tmp_path: Path) -> None:
    """A directory whose marker is gone (or was never there) is not the run's to delete, even
    when ``release_run_media`` is the first thing called on it."""
    args = _args(tmp_path)
    store_media(args, b"x", suffix=".bin")
    (tmp_path / "run-a" / RUN_MARKER).unlink()
    before = _snapshot(tmp_path)
    with pytest.raises(UnsafeRunDirError, match=r"run-a: not a run media directory .*deleting nothing"):
        release_run_media(args)
    assert _snapshot(tmp_path) == before


def test_an_empty_directory_made_beforehand_is_adopted_and_released(tmp_path: Path) -> None:
    """An empty ``<shared>/<run>`` (made by a launcher ahead of the run) holds nothing to lose:
    the run takes it, marks it, and removes it at teardown."""
    (tmp_path / "run-a").mkdir()
    args = _args(tmp_path)
    store_media(args, b"y" * 9, suffix=".bin")
    assert json.loads((tmp_path / "run-a" / RUN_MARKER).read_text())["run_id"] == "run-a"
    marker = _marker_size(tmp_path / "run-a")
    assert release_run_media(args) == 9 + marker
    assert not (tmp_path / "run-a").exists()


def test_a_released_run_directory_replaced_by_a_users_one_is_refused_again(tmp_path: Path) -> None:
    """The process remembers the run directories it proved (no marker read per screenshot); a
    release forgets it, so a user's directory made at the same path (perhaps on the same inode)
    is refused like any other."""
    args = _args(tmp_path)
    store_media(args, b"x", suffix=".bin")
    release_run_media(args)
    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-a" / "notes.txt").write_text("mine")
    with pytest.raises(UnsafeRunDirError, match=r"holds 'notes.txt'"):
        store_media(args, b"y", suffix=".bin")
    assert os.listdir(tmp_path / "run-a") == ["notes.txt"]


def test_a_marker_written_by_another_thread_while_the_directory_is_checked_is_taken(tmp_path: Path) -> None:
    """Two threads of one run reach its directory at once (a resume placing media while the
    rollout worker stores its first screenshot): the one that did not make it read no marker,
    then the other wrote it, then the first listed the directory and found the marker. It must
    take the directory as the run's, not refuse it as foreign (CI: a resumed fully-async run
    killed by its own worker's UnsafeRunDirError). The interleaving is made exact with a FIFO
    where the lease is read between the two looks."""
    args = _args(tmp_path)
    run_dir = tmp_path / "run-a"
    run_dir.mkdir()  # made beforehand, empty, by the other thread's mkdir
    os.mkfifo(run_dir / ".lease.json")
    outcome: list[object] = []

    def store() -> None:
        try:
            outcome.append(store_media(args, png_bytes(4, 4, (1, 2, 3))))
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=store)
    thread.start()
    deadline = time.monotonic() + 30
    while True:  # the thread has read no marker and now reads the lease: it holds the FIFO open
        try:
            fd = os.open(run_dir / ".lease.json", os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert time.monotonic() < deadline and thread.is_alive(), outcome
            time.sleep(0.01)
    marker = {"marker_version": 1, "run_id": "run-a", "created_at": time.time(), "pid": os.getpid()}
    (run_dir / ".tmp-marker").write_text(json.dumps(marker))
    os.rename(run_dir / ".tmp-marker", run_dir / ".run-media.json")  # the other thread's marker
    os.write(fd, b"not a lease")
    os.close(fd)
    thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], MediaRef), outcome
    assert Path(outcome[0].path).parent == run_dir
