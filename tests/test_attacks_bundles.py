"""An attacker's read of the bundles side of issue 36: each test is an attack that succeeded on
the wave's first merge, now refused or harmless (issue 36, items 1-4, 7-9).

Every test that replaces or deletes plants a user's file beside what goes and checks it survives
byte for byte. Stores are real SeaweedFS on 127.0.0.1 (tests/conftest.py); commands run as a user
runs them, ``python -m bundles.cli`` in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

from bundles import BundleError, BundleExistsError, is_bundle, remove_bundle, write_bundle
from bundles.support import on_fault_point

ROOT = Path(__file__).resolve().parents[1]


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bundles.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def make_bundle(tmp_path: Path, dest: str | Path, tag: str) -> str:
    run = tmp_path / f"run-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 30) for i in range(2)]
    return str(
        write_bundle(dest, [{"i": i, "image": p, "tag": tag} for i, p in enumerate(paths)], media_roots=[run])
    )


# -- local removal -------------------------------------------------------------------------------
def test_rm_keeps_what_a_user_writes_into_the_bundle_while_it_is_removed(tmp_path: Path) -> None:
    """Before: ``rm`` listed the directory, found only the bundle's files, then renamed it away and
    deleted the whole tree: a file a user wrote into it in between went with it."""
    dest = Path(make_bundle(tmp_path, tmp_path / "b", "b"))
    (tmp_path / "beside.txt").write_text("beside it\n")

    def user_writes(at: Path) -> None:  # another process, exactly in rm's window
        (at / "README.txt").write_text("written meanwhile\n")
        (at / "media" / "notes.txt").write_text("mine\n")

    with on_fault_point("remove_bundle.before-retire", user_writes):
        remove_bundle(dest)
    left = {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}
    assert left == {"README.txt": b"written meanwhile\n", "media/notes.txt": b"mine\n"}
    assert not is_bundle(dest) and (tmp_path / "beside.txt").read_text() == "beside it\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# -- limits: the writer refuses what the reader would -------------------------------------------
@pytest.mark.parametrize("under", [False, True])
def test_write_bundle_refuses_a_manifest_over_the_readers_cap(tmp_path: Path, under: bool) -> None:
    """Before: ``write_bundle`` committed a manifest over ``MAX_MANIFEST_BYTES`` (a meta of 65 MiB,
    or one just under the cap that the manifest's other fields push over); every reader refused
    it, so the bundle could not be opened, listed or replaced. Now refused before the commit
    (a meta over the cap before any sample is written), and nothing is left at the destination."""
    from bundles.support import LIMITS  # new in issue 36: imported here, so the file loads on 0.2

    cap = LIMITS["MAX_MANIFEST_BYTES"]
    dest = tmp_path / "b"
    meta = {"s": "x" * (cap - 20 if under else cap + 1)}
    said = "the manifest would be" if under else "meta: "
    with pytest.raises(BundleError, match=said) as caught:
        write_bundle(dest, [{"i": 0}], meta=meta)
    del meta
    message = str(caught.value)
    assert message.startswith(f"{dest}: ") and f"{cap} (MAX_MANIFEST_BYTES" in message, message[:300]
    assert not dest.exists() and os.listdir(tmp_path) == []


# -- on a store ---------------------------------------------------------------------------------
def put(server: Any, key: str, data: bytes) -> None:
    import obstore

    obstore.put(server.client(), key, data)


def test_cp_force_onto_a_plain_copy_keeps_the_users_files_under_samples(weed: Any, tmp_path: Path) -> None:
    """Before: replacing a plain copy (a bundle copied verbatim, no pointer) deleted every key under
    ``samples/``: a user's ``samples/notes.txt`` and a file merely named like a shard the manifest
    does not list went with the old bundle's shards."""
    src = Path(make_bundle(tmp_path, tmp_path / "src", "src"))
    for p in sorted(src.rglob("*")):
        if p.is_file():
            put(weed, f"plain/{p.relative_to(src)}", p.read_bytes())
    mine = {"plain/samples/notes.txt": b"my notes\n", "plain/samples/000007.msgpack.zst": b"mine, named so\n"}
    for key, data in mine.items():
        put(weed, key, data)
    url = f"s3://{weed.current}/plain"
    assert is_bundle(url)
    new = make_bundle(tmp_path, tmp_path / "new", "new")
    done = cli("cp", new, url, "--force", env=weed.env)
    assert done.returncode == 0, done.stdout + done.stderr
    left = weed.contents("plain")
    assert {k: left.get(k) for k in mine} == mine
    assert "plain/manifest.json" not in left and "plain/samples/000000.msgpack.zst" not in left
    assert cli("verify", url, "--full", env=weed.env).returncode == 0


def _planted_in_generation(weed: Any, tmp_path: Path) -> tuple[str, str, dict[str, bytes]]:
    """A bundle ``U`` whose live generation holds, beside its own objects, a user's file and the
    objects of another bundle (as an older release's ``cp SRC U/<generation>/sub`` put them)."""
    url = make_bundle(tmp_path, f"s3://{weed.current}/run/u", "u")
    gen = json.loads(weed.contents()["run/u/bundle.json"])["generation"]
    make_bundle(tmp_path, f"s3://{weed.current}/elsewhere/o", "o")
    planted = {f"run/u/{gen}/notes.txt": b"mine\n"}
    planted |= {
        f"run/u/{gen}/sub/{k[len('elsewhere/o/') :]}": v for k, v in weed.contents("elsewhere/o").items()
    }
    for key, data in planted.items():
        put(weed, key, data)
    return url, gen, planted


def test_cp_force_keeps_what_someone_put_inside_the_replaced_generation(weed: Any, tmp_path: Path) -> None:
    """Before: ``cp --force`` onto ``U`` deleted every key of the replaced generation, a user's file
    and a whole bundle put inside it included (rm and gc leave a generation holding what no writer
    of ours writes; the overwrite did not)."""
    url, gen, planted = _planted_in_generation(weed, tmp_path)
    done = cli("cp", make_bundle(tmp_path, tmp_path / "b", "b"), url, "--force", env=weed.env)
    assert done.returncode == 0, done.stdout + done.stderr
    left = weed.contents()
    assert {k: left.get(k) for k in planted} == planted
    assert f"run/u/{gen}/manifest.json" not in left and f"run/u/{gen}/samples/000000.msgpack.zst" not in left
    assert cli("verify", url, "--full", env=weed.env).returncode == 0


@pytest.mark.parametrize("name", ["new", "p.rbundle"])
def test_no_bundle_is_written_or_found_inside_a_generation(weed: Any, tmp_path: Path, name: str) -> None:
    """Before: ``cp SRC U/<generation>/sub`` (and ``write_bundle``, ``pack -o`` of a packed object
    there) said "copied": ``verify U`` then failed on the objects it put, and U's next overwrite
    deleted them. Now refused before anything is put; what is already there is never a bundle
    (not listed, not removed)."""
    url, gen, _ = _planted_in_generation(weed, tmp_path)
    before = weed.contents()
    dest = f"{url}/{gen}/{name}"
    src = make_bundle(tmp_path, tmp_path / "a", "a")
    for argv in (["cp", src, dest], ["cp", src, dest, "--force"], ["pack", src, "-o", dest]):
        done = cli(*argv, env=weed.env)
        assert done.returncode != 0, (argv, done.stdout + done.stderr)
        assert f"{dest}: inside the generation {gen} of the bundle {url}, part of that one" in done.stderr
    with pytest.raises(BundleExistsError, match="refusing to write a bundle there"):
        write_bundle(dest, [{"i": 0}])
    assert weed.contents() == before
    assert not is_bundle(f"{url}/{gen}/sub")
    listed = cli("ls", "-r", f"s3://{weed.current}/run", "--json", env=weed.env)
    assert [r["location"] for r in json.loads(listed.stdout)] == [url], listed.stderr
    assert cli("rm", f"{url}/{gen}/sub", env=weed.env).returncode == 1
    assert weed.contents() == before


# -- what reaches a terminal --------------------------------------------------------------------
@pytest.mark.parametrize("command", [["verify", "--full"], ["pack", "-o", "{out}"]])
def test_a_progress_line_shows_a_bundles_name_through_display(tmp_path: Path, command: list[str]) -> None:
    """Before: ``--progress`` drew ``verifying <name>`` / ``packing <name>`` raw, so a directory
    named with an escape sequence (here one that sets the terminal's title) reached the terminal."""
    name = "run\x1b]0;pwned\x07\x1b[2J"
    src = make_bundle(tmp_path, tmp_path / name, "a")
    argv = [a.replace("{out}", str(tmp_path / "out.rbundle")) for a in command]
    done = cli(argv[0], "--progress", src, *argv[1:])
    assert done.returncode == 0, done.stdout + done.stderr
    drawn = done.stderr.replace("\r", "").replace("\n", "")
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr, repr(done.stderr)
    assert "run\\x1b]0;pwned\\x07\\x1b[2J" in drawn


# -- what a proof costs -------------------------------------------------------------------------
def test_proving_a_big_directory_without_a_manifest_reads_one_entry_of_it(tmp_path: Path) -> None:
    """Before: a directory without ``manifest.json`` was listed whole to tell "empty" from "not a
    bundle", so ``is_bundle`` (and ``ls`` of a run, once per child) of a run's media store with
    millions of screenshots cost their whole listing in time and memory. Measured in memory
    allocated (tracemalloc), not time: 20,000 names listed are over a megabyte."""
    import tracemalloc

    store = tmp_path / "media_store"
    store.mkdir()
    for i in range(20_000):
        os.close(os.open(store / f"{i:064x}.png", os.O_CREAT | os.O_WRONLY, 0o644))
    assert not is_bundle(store)  # warm: imports and caches are not the proof's cost
    tracemalloc.start()
    try:
        assert not is_bundle(store)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, peak
    assert len(os.listdir(store)) == 20_000


def test_overwrite_keeps_what_a_user_writes_into_the_bundle_meanwhile(tmp_path: Path) -> None:
    """Before: ``overwrite=True`` checked that the directory held only the bundle, then swapped the
    new one in and deleted the old directory whole: a file a user wrote into it in between went
    with it. Now it is moved into the new bundle's directory, where it was written."""
    dest = Path(make_bundle(tmp_path, tmp_path / "b", "old"))

    def user_writes(at: Path) -> None:  # another process, exactly in the overwrite's window
        (at / "README.txt").write_text("written meanwhile\n")
        (at / "samples" / "notes.txt").write_text("mine\n")

    with on_fault_point("commit.before-exchange", user_writes):
        write_bundle(dest, [{"tag": "new"}], overwrite=True)
    assert (dest / "README.txt").read_text() == "written meanwhile\n"
    assert (dest / "samples" / "notes.txt").read_text() == "mine\n"
    from bundles import open_bundle

    with open_bundle(dest, verify="none") as b:  # a full verify names the user's two files, rightly
        assert [s["tag"] for s in b] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
