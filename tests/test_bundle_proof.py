"""A bundle is proven, never guessed; a removal deletes what it listed (issue 36, items 1-5;
docs/FORMAT.md §5a).

One proof (:mod:`bundles._local.proof`) answers "is this a bundle?" for every command: a manifest that
parses and validates, or on a store a pointer naming a generation of its own prefix whose manifest
validates. Here: a web app's ``manifest.json`` is refused by ``rm``, ``cp --force`` and
``overwrite=True`` and survives byte for byte; a damaged bundle is removed only with
``--damaged`` and then only by the format's names; ``rm`` of a generation URL is refused and the
bundle above it still verifies; ``ls`` never lists a generation; an ``rm`` racing an
``overwrite=True`` never unlinks the new bundle while both report success; ``S3:/`` paths and
NUL bytes are refused by name. Every refusal and deletion plants a user's files and checks they
survive. CLI checks run ``python -m bundles.cli`` in a subprocess, as a user runs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import (
    BundleError,
    BundleExistsError,
    BundleFormatError,
    BundleNotFoundError,
    is_bundle,
    list_bundles,
    open_bundle,
    pack_bundle,
    remove_bundle,
    write_bundle,
)
from bundles._format.manifest import parse_manifest_bytes
from bundles.support import on_fault_point

ROOT = Path(__file__).resolve().parents[1]
WEB_MANIFEST = b'{"name": "My App", "short_name": "app", "icons": [], "start_url": "/"}\n'
UNLISTED = "ab" * 32 + ".png"


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bundles.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under ``root``, by relative path."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))
    }


def make_bundle(tmp_path: Path, dest: Path, tag: str, overwrite: bool = False) -> Path:
    run = tmp_path / f"run-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 30) for i in range(2)]
    samples = [{"i": i, "image": p, "tag": tag} for i, p in enumerate(paths)]
    return Path(write_bundle(dest, samples, media_roots=[run], overwrite=overwrite))


def web_app(where: Path, only_manifest: bool = False) -> Path:
    where.mkdir(parents=True)
    (where / "manifest.json").write_bytes(WEB_MANIFEST)
    if not only_manifest:
        (where / "samples").mkdir()
        (where / "samples" / "notes.txt").write_text("my notes\n")
        (where / "samples" / "000000.msgpack.zst").write_bytes(b"a user's file of that name\n")
        (where / "media").mkdir()
        (where / "media" / UNLISTED).write_bytes(b"a user's picture\n")
    return where


# -- local: what is a bundle --------------------------------------------------------------------
@pytest.mark.parametrize("only_manifest", [True, False])
def test_a_directory_with_a_foreign_manifest_is_refused_by_rm_cp_force_and_overwrite(
    tmp_path: Path, only_manifest: bool
) -> None:
    """Before: rm deleted manifest.json and every layout-named file (a directory holding only
    manifest.json went whole); cp --force and overwrite=True swapped it away."""
    app = web_app(tmp_path / "app", only_manifest)
    before = snapshot(app)
    assert not is_bundle(app) and list_bundles(tmp_path) == []
    done = cli("rm", str(app))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not a rollout-bundle manifest" in done.stderr and "refusing to remove it" in done.stderr
    assert snapshot(app) == before
    damaged = cli("rm", "--damaged", str(app))  # not a damaged bundle either: someone else's file
    assert damaged.returncode == 1 and "not a rollout-bundle manifest" in damaged.stderr
    assert snapshot(app) == before
    packed = pack_bundle(make_bundle(tmp_path, tmp_path / "src", "src"), tmp_path / "src.rbundle")
    forced = cli("cp", str(packed), str(app), "--force")
    assert forced.returncode == 2, forced.stdout + forced.stderr  # the caller's to change
    assert "destination exists and is not a bundle; refusing to replace it" in forced.stderr
    assert snapshot(app) == before
    with pytest.raises(
        BundleExistsError, match=r"is not a bundle; refusing to replace it \(.*manifest\.json: not a"
    ):
        make_bundle(tmp_path, app, "new", overwrite=True)
    assert snapshot(app) == before
    assert not [p for p in tmp_path.iterdir() if ".staging." in p.name or ".retired." in p.name]


def test_rm_removes_only_what_the_manifest_lists(tmp_path: Path) -> None:
    """Before: samples/notes.txt stayed but media/<64 hex>.png that the manifest does not list,
    and samples/000009.msgpack.zst, went with the bundle whenever the manifest could not be read."""
    dest = make_bundle(tmp_path, tmp_path / "b", "b")
    user = {
        "samples/notes.txt": b"notes\n",
        "samples/000009.msgpack.zst": b"not listed\n",
        f"media/{UNLISTED}": b"not listed either\n",
    }
    for rel, data in user.items():
        (dest / rel).write_bytes(data)
    listed = [e.path for e in open_bundle(dest, verify="none").manifest.shards]
    done = cli("rm", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"removed": str(dest), "directory_kept": True}
    assert snapshot(dest) == {"media": None, "samples": None, **user}
    assert not any((dest / rel).exists() for rel in listed)


def test_a_damaged_bundle_is_removed_only_with_damaged_and_only_by_the_formats_names(tmp_path: Path) -> None:
    dest = make_bundle(tmp_path, tmp_path / "b", "b")
    manifest = json.loads((dest / "manifest.json").read_bytes())
    manifest["kind"] = "Not A Kind"
    (dest / "manifest.json").chmod(0o644)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    (dest / "samples" / "notes.txt").write_text("mine\n")
    (dest / "README.md").write_text("mine too\n")
    before = snapshot(dest)
    assert not is_bundle(dest)
    refused = cli("rm", str(dest))
    assert refused.returncode == 1
    assert f"{dest}/manifest.json: kind: expected lowercase letters" in refused.stderr
    assert "a damaged bundle, not removed; `rollout-bundle rm --damaged`" in refused.stderr
    assert snapshot(dest) == before
    done = cli("rm", "--damaged", str(dest))
    assert done.returncode == 0, done.stderr
    assert snapshot(dest) == {"README.md": b"mine too\n", "samples": None, "samples/notes.txt": b"mine\n"}


def test_a_damaged_bundle_is_never_replaced(tmp_path: Path) -> None:
    dest = make_bundle(tmp_path, tmp_path / "b", "b")
    (dest / "manifest.json").chmod(0o644)
    (dest / "manifest.json").write_bytes(
        (dest / "manifest.json").read_bytes()[:100]
    )  # truncated after "format"
    before = snapshot(dest)
    with pytest.raises(BundleExistsError, match=r"is a damaged bundle; refusing to replace it .*--damaged"):
        make_bundle(tmp_path, dest, "new", overwrite=True)
    assert snapshot(dest) == before


def test_symlinks_staging_names_and_special_manifests_are_never_bundles(tmp_path: Path) -> None:
    real = make_bundle(tmp_path, tmp_path / "real", "r")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    staging = tmp_path / ".x.staging.host.1.2.3.abcd"
    staging.mkdir()
    (staging / "manifest.json").write_bytes((real / "manifest.json").read_bytes())
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "manifest.json").symlink_to(real / "manifest.json")
    assert [is_bundle(p) for p in (real, tmp_path / "link", staging, fifo, linked)] == [True] + [False] * 4
    assert list_bundles(tmp_path) == [str(real)]
    with pytest.raises(BundleNotFoundError, match="a symlink, not a bundle directory; refusing to remove it"):
        remove_bundle(tmp_path / "link")
    assert is_bundle(real)


def test_a_users_file_named_like_a_packed_bundle_is_never_replaced(tmp_path: Path) -> None:
    src = make_bundle(tmp_path, tmp_path / "src", "src")
    notes = tmp_path / "notes.rbundle"
    notes.write_bytes(b"my notes, whatever their name\n")
    assert not is_bundle(notes)
    with pytest.raises(BundleExistsError, match="is not a bundle; refusing to replace it"):
        pack_bundle(src, notes, overwrite=True)
    forced = cli("cp", str(src), str(notes), "--force")
    assert forced.returncode == 2 and "is not a bundle; refusing to replace it" in forced.stderr
    assert notes.read_bytes() == b"my notes, whatever their name\n"
    packed = pack_bundle(src, tmp_path / "b.rbundle")
    assert is_bundle(packed)
    pack_bundle(src, packed, overwrite=True)  # a packed bundle is replaced as before


# -- the proof over random manifests -------------------------------------------------------------
def _valid_manifest() -> dict[str, Any]:
    return {
        "format": "rollout-bundle",
        "format_version": 1,
        "kind": "debug_dump",
        "meta": {},
        "sample_count": 0,
        "shards": [],
        "media": [],
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    """A valid manifest with fields dropped, replaced or added; any JSON; or any bytes."""
    how = draw(st.sampled_from(["mutated", "json", "bytes"]))
    if how == "bytes":
        return draw(st.binary(max_size=200))
    if how == "json":
        return json.dumps(draw(json_values)).encode()
    m = _valid_manifest()
    for key in draw(st.lists(st.sampled_from(sorted(m)), max_size=3)):
        if draw(st.booleans()):
            m.pop(key, None)
        else:
            m[key] = draw(json_values)
    m.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
    return json.dumps(m).encode()


def _validates(raw: bytes) -> bool:
    try:
        parse_manifest_bytes(raw, "m")
    except BundleError:
        return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=manifests())
def test_a_manifest_is_a_bundle_exactly_when_it_validates(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp) / "b"
        where.mkdir()
        (where / "manifest.json").write_bytes(raw)
        (where / "notes.txt").write_text("mine\n")
        proven = is_bundle(where)
        assert proven == _validates(raw)
        assert list_bundles(tmp) == ([str(where)] if proven else [])
        if not proven:
            with pytest.raises((BundleNotFoundError, BundleFormatError)):
                remove_bundle(where)
            assert sorted(os.listdir(where)) == ["manifest.json", "notes.txt"]
            assert (where / "manifest.json").read_bytes() == raw


# -- item 4: rm racing a local overwrite ---------------------------------------------------------
def test_rm_racing_an_overwrite_never_unlinks_the_new_bundle(tmp_path: Path) -> None:
    """Before: the overwrite swapped the new bundle in between rm's check and its retire rename;
    rm retired and deleted the new bundle, and both reported success."""
    dest = make_bundle(tmp_path, tmp_path / "b", "old")
    (tmp_path / "mine.txt").write_text("a user's file beside it\n")

    def overwrite(at: Path) -> None:  # another process's overwrite=True, exactly in rm's window
        write_bundle(at, [{"tag": "new", "i": 0}], overwrite=True)

    replaced = pytest.raises(BundleError, match="replaced by another writer while it was being removed")
    with on_fault_point("remove_bundle.before-retire", overwrite), replaced:
        remove_bundle(dest)
    assert [s["tag"] for s in open_bundle(dest, verify="full")] == ["new"]
    assert (tmp_path / "mine.txt").read_text() == "a user's file beside it\n"
    assert not [p for p in tmp_path.iterdir() if ".staging." in p.name or ".retired." in p.name]
    remove_bundle(dest)  # and with no race, it goes
    assert not dest.exists()


# -- item 9: locations refused by name -----------------------------------------------------------
@pytest.mark.parametrize("text", ["S3://b/x", "s3://b/x", "Gs://b/x", "AZ://c/x"])
def test_a_collapsed_store_url_is_refused_in_any_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BundleError, match=r"URL whose '//' was collapsed"):
        write_bundle(Path(text), [{"v": 1}])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("call", ["write", "open", "remove", "is_bundle", "unpack"])
def test_a_nul_in_a_path_is_a_bundle_error_naming_it(tmp_path: Path, call: str) -> None:
    bad = f"{tmp_path}/a\x00b"
    from bundles import unpack_bundle

    run = {
        "write": lambda: write_bundle(bad, [{"v": 1}]),
        "open": lambda: open_bundle(bad),
        "remove": lambda: remove_bundle(bad),
        "is_bundle": lambda: is_bundle(bad),
        "unpack": lambda: unpack_bundle(tmp_path / "x.rbundle", bad),
    }[call]
    with pytest.raises(BundleError) as e:
        run()
    assert (
        str(e.value)
        == f"{tmp_path}/a\\x00b: {'unpack output' if call == 'unpack' else 'bundle'}: a path must not hold a NUL byte"
    )


# -- on a store ---------------------------------------------------------------------------------
def put(server: Any, key: str, data: bytes) -> None:
    import obstore

    obstore.put(server.client(), key, data)


def store_bundle(server: Any, tmp_path: Path, url: str, tag: str) -> str:
    run = tmp_path / f"run-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 30) for i in range(2)]
    write_bundle(url, [{"i": i, "image": p} for i, p in enumerate(paths)], media_roots=[run])
    return url


def test_rm_of_a_generation_is_refused_and_ls_never_lists_one(weed: Any, tmp_path: Path) -> None:
    """Before: `rm s3://b/run/bun/<generation>` exited 0 and deleted the live generation; `ls -l`
    of the generation listed it as a bundle."""
    url = store_bundle(weed, tmp_path, f"s3://{weed.current}/run/bun", "a")
    put(weed, "run/bun/notes.txt", b"mine\n")
    gen = json.loads(weed.contents()["run/bun/bundle.json"])["generation"]
    before = weed.contents()
    done = cli("rm", f"{url}/{gen}", env=weed.env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{url}/{gen}: a generation of the bundle {url}, not a bundle" in done.stderr
    assert weed.contents() == before
    assert cli("verify", url, "--full", env=weed.env).returncode == 0
    listed = cli("ls", "-l", f"{url}/{gen}", "--json", env=weed.env)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    above = cli("ls", "-l", f"s3://{weed.current}/run", "--json", env=weed.env)
    assert [r["location"] for r in json.loads(above.stdout)] == [url], above.stderr
    assert not is_bundle(f"{url}/{gen}")


def test_a_store_prefix_with_a_foreign_manifest_is_refused_by_rm_and_cp_force(
    weed: Any, tmp_path: Path
) -> None:
    put(weed, "site/manifest.json", WEB_MANIFEST)
    put(weed, "site/samples/notes.txt", b"notes\n")
    put(weed, f"site/media/{UNLISTED}", b"a picture\n")
    before = weed.contents()
    url = f"s3://{weed.current}/site"
    assert not is_bundle(url) and list_bundles(f"s3://{weed.current}") == []
    done = cli("rm", url, env=weed.env)
    assert done.returncode == 1 and "not a rollout-bundle manifest" in done.stderr, done.stderr
    src = make_bundle(tmp_path, tmp_path / "src", "src")
    forced = cli("cp", str(src), url, "--force", env=weed.env)
    assert forced.returncode == 2, forced.stdout + forced.stderr
    assert "destination is not a bundle; refusing to replace it" in forced.stderr
    assert weed.contents() == before


def test_cp_force_onto_a_users_bundle_json_says_so_and_uploads_nothing(weed: Any, tmp_path: Path) -> None:
    """Before: "other writers kept replacing the bundle" after 16 tries, with the media uploaded
    and left where no gc removes them."""
    put(weed, "cfg/bundle.json", b'{"theme": "dark"}\n')
    before = weed.contents()
    src = make_bundle(tmp_path, tmp_path / "src", "src")
    forced = cli("cp", str(src), f"s3://{weed.current}/cfg", "--force", env=weed.env)
    assert forced.returncode == 2, forced.stdout + forced.stderr
    assert (
        f"s3://{weed.current}/cfg/bundle.json: holds a file that is not a bundle pointer" in forced.stderr
    ), forced.stderr
    assert weed.contents() == before  # nothing uploaded, nothing for gc to find


def test_a_damaged_store_bundle_is_removed_only_with_damaged(weed: Any, tmp_path: Path) -> None:
    url = store_bundle(weed, tmp_path, f"s3://{weed.current}/run/bun", "a")
    gen = json.loads(weed.contents()["run/bun/bundle.json"])["generation"]
    import obstore

    obstore.delete(weed.client(), f"run/bun/{gen}/manifest.json")
    put(weed, "run/bun/notes.txt", b"mine\n")
    put(weed, "run/other/README", b"mine too\n")
    before = weed.contents()
    refused = cli("rm", url, env=weed.env)
    assert refused.returncode == 1
    assert f"{url}/{gen}/manifest.json: the manifest {url}/bundle.json names is missing" in refused.stderr
    assert "--damaged" in refused.stderr and weed.contents() == before
    assert cli("rm", "--damaged", url, env=weed.env).returncode == 0
    left = weed.contents()
    assert "run/bun/bundle.json" not in left and not [k for k in left if f"/{gen}/" in k]
    assert left["run/bun/notes.txt"] == b"mine\n" and left["run/other/README"] == b"mine too\n"


def test_rm_on_a_store_keeps_media_no_manifest_lists(weed: Any, tmp_path: Path) -> None:
    url = store_bundle(weed, tmp_path, f"s3://{weed.current}/b", "a")
    put(weed, f"b/media/{UNLISTED}", b"a user's picture\n")
    put(weed, "b/samples/notes.txt", b"notes\n")
    remove_bundle(url)
    assert weed.contents() == {
        f"b/media/{UNLISTED}": b"a user's picture\n",
        "b/samples/notes.txt": b"notes\n",
    }
