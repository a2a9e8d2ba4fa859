"""The conformance suite every bundle location runs (the way zarr's ``StoreTests`` is subclassed by
each store's tests): write, open, verify fast and full, samples, open_media, rehydrate, pack,
unpack, overwrite, two racing writers, a writer SIGKILLed mid-commit, remove, list, gc.

A location passes by subclassing :class:`LocationTests` in tests/test_locations.py and saying
only how to name a fresh destination (:meth:`LocationTests.dest`), which servers it needs (a
fixture that sets the standard environment, so every public call finds its store), and the
capabilities its :class:`bundles.Location` declares (``capabilities``, checked against the
object :meth:`bundles.Location.of` builds). Every location is written the same way,
``write_bundle(dest, ...)``: a packed destination is packed by bundles, not by the suite.
Everything else is asserted through the public API alone, never by looking at the files or
objects behind it: what a user of one location may rely on, a user of every location may.

What a location lacks by design is read from its capabilities (``has_pool``: only a store's
bundles share a media pool to collect) or said by ``kill_point`` (where a writer is killed
mid-commit), never what a test found hard.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bundles import (
    BundleError,
    BundleExistsError,
    BundleNotFoundError,
    Location,
    MediaRef,
    collect_garbage,
    is_bundle,
    open_bundle,
    pack_bundle,
    remove_bundle,
    unpack_bundle,
    write_bundle,
)
from bundles.support import KILL_ENV

ROOT = Path(__file__).resolve().parents[2]
N_MEDIA = 4

# A writer in a subprocess, for the SIGKILL test: the kill lands in the location's own commit.
_WRITER = """
import os, sys
from bundles import write_bundle
dest, run, overwrite = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
paths = sorted(os.path.join(run, n) for n in os.listdir(run))
samples = [{"index": i, "image": p, "writer": "killed"} for i, p in enumerate(paths)]
write_bundle(dest, samples, media_roots=[run], overwrite=overwrite)
print("COMMITTED")
"""


def make_media(root: Path, tag: str, n: int = N_MEDIA) -> list[str]:
    """``n`` distinct PNG-named files under ``root``, content-addressed as a run names them."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        data = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(f"{tag}/{i}".encode()).digest() * 64
        p = root / f"{hashlib.sha256(data).hexdigest()}.png"
        p.write_bytes(data)
        paths.append(str(p))
    return paths


class LocationTests:
    """The suite. Subclasses set ``name`` and implement :meth:`dest`; see the module docstring."""

    name: ClassVar[str]
    packed: ClassVar[bool] = False  # one packed file (unpacked, not packed, by the pack test)
    #: What the location's :class:`bundles.Location` declares (module docstring).
    capabilities: ClassVar[dict[str, object]]
    kill_point: ClassVar[str] = "commit.before-rename"  # where the writer dies mid-commit

    # -- what a subclass provides ---------------------------------------------------------------
    def dest(self, tmp_path: Path, name: str) -> str:
        """A fresh destination for a bundle called ``name`` (nothing there yet)."""
        raise NotImplementedError

    def root(self, tmp_path: Path) -> str:
        """The parent of every :meth:`dest`: what ``list`` and ``gc`` are given."""
        return self.dest(tmp_path, "x").rpartition("/")[0]

    # -- how the suite writes --------------------------------------------------------------------
    def write(self, tmp_path: Path, dest: str, samples: list[Any], run: Path, **kw: Any) -> Location:
        return write_bundle(dest, samples, media_roots=[run], **kw)

    def write_each(self, tmp_path: Path, names: list[str]) -> None:
        """A bundle at :meth:`dest` for each name, each from a run of its own."""
        for n in names:
            self.write(
                tmp_path,
                self.dest(tmp_path, n),
                self.samples(tmp_path / f"run-{n}", n),
                tmp_path / f"run-{n}",
            )

    def samples(self, run: Path, tag: str = "a") -> list[dict[str, Any]]:
        paths = make_media(run, tag)
        return [
            {
                "index": i,
                "image": p,
                "ref": MediaRef.from_file(p),
                "tokens": list(range(i, i + 30)),
                "tag": tag,
            }
            for i, p in enumerate(paths)
        ]

    @staticmethod
    def plain(sample: dict[str, Any]) -> tuple[Any, ...]:
        return (sample["index"], sample["tokens"], sample["tag"])

    # -- the tests -------------------------------------------------------------------------------
    def test_write_then_open(self, tmp_path: Path) -> None:
        samples = self.samples(tmp_path / "run")
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, samples, tmp_path / "run", kind="rollout_checkpoint", meta={"step": 3})
        with open_bundle(dest) as b:
            assert len(b) == len(samples) and b.kind == "rollout_checkpoint" and b.meta == {"step": 3}
            assert [self.plain(s) for s in b.samples()] == [self.plain(s) for s in samples]
        assert is_bundle(dest)

    def test_verify_fast_and_full(self, tmp_path: Path) -> None:
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, self.samples(tmp_path / "run"), tmp_path / "run")
        for level in ("fast", "full"):
            with open_bundle(dest, verify=level) as b:
                b.verify(level)

    def test_a_missing_bundle_is_named(self, tmp_path: Path) -> None:
        dest = self.dest(tmp_path, "absent")
        with pytest.raises(BundleNotFoundError) as caught:
            open_bundle(dest)
        assert dest.rstrip("/").rsplit("/", 1)[-1] in str(caught.value)
        assert not is_bundle(dest)

    def test_open_media_reads_the_bytes_written_after_the_run_is_gone(self, tmp_path: Path) -> None:
        run = tmp_path / "run"
        samples = self.samples(run)
        originals = [Path(s["image"]).read_bytes() for s in samples]
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, samples, run)
        for p in run.iterdir():  # teardown: the run's media go
            p.unlink()
        with open_bundle(dest, verify="full") as b:
            for sample, data in zip(b.samples(), originals, strict=True):
                for ref in (sample["image"], sample["ref"]):
                    with b.open_media(ref) as f:
                        assert f.read() == data

    def test_rehydrate_gives_a_new_run_its_media(self, tmp_path: Path) -> None:
        run = tmp_path / "run"
        samples = self.samples(run)
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, samples, run)
        new_run = tmp_path / "new-run"
        with open_bundle(dest) as b:
            restored = b.rehydrate(new_run)
        for before, after in zip(samples, restored, strict=True):
            assert Path(after["image"]).parent == new_run
            assert Path(after["image"]).read_bytes() == Path(before["image"]).read_bytes()

    def test_pack_and_unpack(self, tmp_path: Path) -> None:
        samples = self.samples(tmp_path / "run")
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, samples, tmp_path / "run")
        if self.packed:
            unpacked = unpack_bundle(dest, tmp_path / "unpacked")
            assert [self.plain(s) for s in unpacked.samples()] == [self.plain(s) for s in samples]
            unpacked.verify("full")
            return
        packed = pack_bundle(dest, tmp_path / "b.rbundle")
        with open_bundle(packed, verify="full") as p:
            assert [self.plain(s) for s in p.samples()] == [self.plain(s) for s in samples]
        back = unpack_bundle(packed, tmp_path / "back")
        back.verify("full")
        assert [self.plain(s) for s in back.samples()] == [self.plain(s) for s in samples]

    def test_existing_is_refused_then_overwrite_replaces(self, tmp_path: Path) -> None:
        run = tmp_path / "run"
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, self.samples(run, "a"), run)
        with pytest.raises(BundleExistsError):
            self.write(tmp_path, dest, self.samples(run, "b"), run)
        with open_bundle(dest) as b:
            assert {s["tag"] for s in b.samples()} == {"a"}
        self.write(tmp_path, dest, self.samples(run, "b"), run, overwrite=True)
        with open_bundle(dest, verify="full") as b:
            assert {s["tag"] for s in b.samples()} == {"b"}

    def test_two_racing_writers_exactly_one_wins(self, tmp_path: Path) -> None:
        dest = self.dest(tmp_path, "contested")
        outcomes: dict[str, str] = {}
        barrier = threading.Barrier(2)
        batches = {tag: self.samples(tmp_path / f"run-{tag}", tag) for tag in ("a", "b")}

        def race(tag: str) -> None:
            barrier.wait()
            try:
                self.write(tmp_path, dest, batches[tag], tmp_path / f"run-{tag}")
                outcomes[tag] = "won"
            except BundleExistsError:
                outcomes[tag] = "lost"
            except BundleError as e:  # anything else is a failure of the location
                outcomes[tag] = f"error: {e}"

        threads = [threading.Thread(target=race, args=(tag,)) for tag in batches]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(outcomes.values()) == ["lost", "won"], outcomes
        winner = next(tag for tag, o in outcomes.items() if o == "won")
        with open_bundle(dest, verify="full") as b:
            assert {s["tag"] for s in b.samples()} == {winner}

    @pytest.mark.parametrize("replacing", [False, True], ids=["new", "replacing"])
    def test_a_writer_killed_mid_commit_leaves_the_old_bundle_or_none(
        self, tmp_path: Path, replacing: bool
    ) -> None:
        dest = self.dest(tmp_path, "b")
        if replacing:
            self.write(tmp_path, dest, self.samples(tmp_path / "old", "old"), tmp_path / "old")
        run = tmp_path / "run"
        make_media(run, "killed")
        env = {**os.environ, KILL_ENV: self.kill_point, "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-c", _WRITER, dest, str(run), "1" if replacing else "0"]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == -9, (done.returncode, done.stdout, done.stderr)
        assert "COMMITTED" not in done.stdout
        if replacing:
            with open_bundle(dest, verify="full") as b:
                assert {s["tag"] for s in b.samples()} == {"old"}
        else:
            with pytest.raises(BundleNotFoundError):
                open_bundle(dest)
        # The next writer is not hindered by what the dead one left.
        self.write(tmp_path, dest, self.samples(tmp_path / "next", "next"), tmp_path / "next", overwrite=True)
        with open_bundle(dest, verify="full") as b:
            assert {s["tag"] for s in b.samples()} == {"next"}

    def test_remove(self, tmp_path: Path) -> None:
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, self.samples(tmp_path / "run"), tmp_path / "run")
        remove_bundle(dest)
        assert not is_bundle(dest)
        with pytest.raises(BundleNotFoundError):
            open_bundle(dest)
        with pytest.raises(BundleNotFoundError):
            remove_bundle(dest)

    def test_list_finds_every_bundle_under_a_root_and_nothing_else(self, tmp_path: Path) -> None:
        from bundles import list_bundles

        names = ["b1", "b2", "b3"]
        self.write_each(tmp_path, names)
        found = list_bundles(self.root(tmp_path))
        assert sorted(found) == sorted(self.dest(tmp_path, n) for n in names)
        for location in found:
            assert is_bundle(location)

    def test_gc_keeps_every_live_bundle_whole(self, tmp_path: Path) -> None:
        dest = self.dest(tmp_path, "b")
        self.write(tmp_path, dest, self.samples(tmp_path / "run"), tmp_path / "run")
        root = Location.of(self.root(tmp_path))
        if not root.has_pool:
            assert root.collect_garbage(older_than_s=0) is None
            with pytest.raises(BundleError):
                collect_garbage(self.root(tmp_path), older_than_s=0)
            return
        assert root.collect_garbage(older_than_s=0) is not None
        collect_garbage(self.root(tmp_path), older_than_s=0)
        with open_bundle(dest, verify="full") as b:
            assert len(b) == N_MEDIA

    # -- the Location object -----------------------------------------------------------------------
    def test_the_location_declares_its_capabilities(self, tmp_path: Path) -> None:
        location = Location.of(self.dest(tmp_path, "b"))
        found = {name: getattr(location, name) for name in self.capabilities}
        assert found == self.capabilities

    def test_write_returns_the_location_it_wrote(self, tmp_path: Path) -> None:
        import pickle

        dest = self.dest(tmp_path, "b")
        written = self.write(tmp_path, dest, self.samples(tmp_path / "run"), tmp_path / "run")
        assert isinstance(written, Location) and isinstance(written, os.PathLike)
        assert os.fspath(written) == str(written) == dest
        assert Location.of(written) is written  # a Location is chosen once, then handed on
        assert Location.of(dest) == written and type(Location.of(dest)) is type(written)
        again = pickle.loads(pickle.dumps(written))  # to a Ray actor and back
        assert again == written and type(again) is type(written)
        with open_bundle(written, verify="full") as b, written.open_bundle() as same:
            assert list(b.samples()) == list(same.samples())
        assert written.has_bundle() and is_bundle(written)

    def test_list_bundles_and_child_through_the_location(self, tmp_path: Path) -> None:
        names = ["b1", "b2"]
        self.write_each(tmp_path, names)
        root = Location.of(self.root(tmp_path))
        found = root.list_bundles()
        assert all(isinstance(loc, Location) for loc in found)
        assert [str(loc) for loc in found] == sorted(self.dest(tmp_path, n) for n in names)
        leaf = self.dest(tmp_path, "b1").rpartition("/")[2]
        assert root.child(leaf) == found[0] and root.child("") == root

    def test_stage_writes_nothing_visible_until_published(self, tmp_path: Path) -> None:
        run = tmp_path / "run"
        samples = self.samples(run)
        location = Location.of(self.dest(tmp_path, "b"))

        def write(where: Path) -> Location:
            return write_bundle(where, samples, media_roots=[run])

        staged = location.stage(write, media_roots=[run])
        assert not location.has_bundle()  # staged: complete locally, not in place
        with open_bundle(staged.local) as b:
            assert len(b) == len(samples)
        staged.discard()
        assert not location.has_bundle() and not os.path.exists(staged.local)
        staged = location.stage(write, media_roots=[run])
        assert staged.publish() == location
        assert not os.path.exists(staged.local)
        with open_bundle(location, verify="full") as b:
            assert [self.plain(s) for s in b.samples()] == [self.plain(s) for s in samples]
        with pytest.raises(BundleExistsError):
            location.stage(write, media_roots=[run])  # refused before any work

    def test_an_error_of_a_staged_write_names_the_location(self, tmp_path: Path) -> None:
        dest = self.dest(tmp_path, "b")
        with pytest.raises(BundleError) as caught:
            write_bundle(dest, [{"x": object()}])
        assert str(caught.value).startswith(f"{dest}: samples[0].x: ")
        assert not is_bundle(dest)
