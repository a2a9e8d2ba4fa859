"""Removing a bundle deletes what the bundle owns and nothing else (issue 30, item 2), on a real
SeaweedFS on 127.0.0.1 and in a local directory: a user's files beside the bundle, a nested
bundle, a generation-named prefix of someone else's and the shared pool survive, and a bundle at
the bucket root leaves the rest of the bucket (FORMAT.md §9: a bundle owns its pointer, its
generations, its media)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media, tree_snapshot

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import (
    BundleExistsError,
    BundleFormatError,
    BundleNotFoundError,
    is_bundle,
    open_bundle,
    remove_bundle,
    write_bundle,
)

USER_OBJECTS = {
    "README.txt": b"what these results are\n",
    "results/eval.csv": b"step,reward\n1,0.5\n",
    "media/notes.txt": b"not a medium of the bundle: its name is not <64 hex><suffix>\n",
    "media/deeper/" + "ab" * 32 + ".png": b"one level deeper than the layout\n",
    "g20260101T000000000000Z-0123456789ab/notes.txt": b"a generation-named prefix of someone else's\n",
}


def raw(server: Any) -> Any:
    """The test's own client (not the code under test's), to look at and seed the bucket."""
    return S3Store(server.current, **server.options(), client_options={"allow_http": True})


def contents(server: Any) -> dict[str, bytes]:
    store = raw(server)
    keys = sorted(m["path"] for batch in obstore.list(store) for m in batch)
    return {k: bytes(obstore.get(store, k).bytes()) for k in keys}


def samples(tmp_path: Path, tag: str, n: int = 3) -> tuple[list[dict[str, Any]], Path]:
    run = tmp_path / f"media-{tag}"
    paths = [put_media(run, hashlib.sha256(f"{tag}{i}".encode()).digest() * 40) for i in range(n)]
    return [{"index": i, "image": p, "tag": tag} for i, p in enumerate(paths)], run


def put_user_objects(server: Any, base: str) -> dict[str, bytes]:
    store = raw(server)
    placed = {}
    for rel, data in USER_OBJECTS.items():
        key = f"{base}/{rel}" if base else rel
        obstore.put(store, key, data)
        placed[key] = data
    return placed


@pytest.mark.parametrize("shared", [False, True])
def test_removing_a_store_bundle_leaves_the_users_objects_and_a_nested_bundle(
    weed: Any, tmp_path: Path, shared: bool
) -> None:
    """Before: ``R/b1/README.txt``, ``R/b1/results/eval.csv`` and the nested bundle
    ``R/b1/nested`` were deleted with the bundle."""
    url = f"s3://{weed.current}/R/b1"
    own, run = samples(tmp_path, "b1")
    write_bundle(url, own, media_roots=[run], shared_media=shared)
    beside, run2 = samples(tmp_path, "beside")
    write_bundle(f"s3://{weed.current}/R/b2", beside, media_roots=[run2], shared_media=True)
    nested, run3 = samples(tmp_path, "nested")
    write_bundle(f"{url}/nested", nested, media_roots=[run3])
    before = contents(weed)
    user = put_user_objects(weed, "R/b1")
    remove_bundle(url)
    after = contents(weed)
    b1_own = {
        k
        for k in before
        if k.startswith("R/b1/") and not k.startswith("R/b1/nested/") and not k.startswith("R/.media/")
    }
    assert b1_own and "R/b1/bundle.json" in b1_own
    assert after == {k: v for k, v in {**before, **user}.items() if k not in b1_own}
    assert not is_bundle(url)
    assert [s["tag"] for s in open_bundle(f"{url}/nested", verify="full")] == ["nested"] * 3
    assert len(open_bundle(f"s3://{weed.current}/R/b2", verify="full")) == 3  # the pool is left
    with pytest.raises(BundleNotFoundError):
        remove_bundle(url)
    assert contents(weed) == after


def test_a_bundle_at_the_bucket_root_leaves_the_rest_of_the_bucket(weed: Any, tmp_path: Path) -> None:
    """Before: the bucket went from 8 objects to 0."""
    root = f"s3://{weed.current}"
    own, run = samples(tmp_path, "root")
    write_bundle(root, own, media_roots=[run])
    nested, run2 = samples(tmp_path, "nested", 1)
    write_bundle(f"{root}/runs/r1", nested, media_roots=[run2])
    user = put_user_objects(weed, "")
    before = contents(weed)
    remove_bundle(root)
    after = contents(weed)
    assert "bundle.json" in before and len(before) > len(user) + 4
    assert after == {k: v for k, v in before.items() if k in user or k.startswith("runs/r1/")}
    assert {k: after[k] for k in user} == user
    assert len(open_bundle(f"{root}/runs/r1", verify="full")) == 1
    assert not is_bundle(root)


def test_a_plain_copy_on_a_store_loses_only_its_layout(weed: Any, tmp_path: Path) -> None:
    """``aws s3 sync bundle_dir s3://b/x`` with a user's file beside it: the manifest, the shards
    and the media go; the user's file stays."""
    own, run = samples(tmp_path, "plain")
    local = Path(write_bundle(tmp_path / "plain", own, media_roots=[run]))
    store = raw(weed)
    for f in local.rglob("*"):
        if f.is_file():
            obstore.put(store, f"x/{f.relative_to(local)}", f.read_bytes())
    url = f"s3://{weed.current}/x"
    assert len(open_bundle(url, verify="full")) == 3
    obstore.put(store, "x/samples/README.txt", b"mine\n")
    obstore.put(store, "x/notes.txt", b"mine too\n")
    remove_bundle(url)
    assert contents(weed) == {"x/notes.txt": b"mine too\n", "x/samples/README.txt": b"mine\n"}


# -- the same rule in a local directory ------------------------------------------------------------
def test_removing_a_local_bundle_keeps_the_users_files_and_a_nested_bundle(tmp_path: Path) -> None:
    """Before: the whole directory went, ``README.txt``, ``results/`` and the nested bundle
    with it."""
    own, run = samples(tmp_path, "local")
    dest = Path(write_bundle(tmp_path / "b1", own, media_roots=[run]))
    nested, run2 = samples(tmp_path, "nested", 1)
    write_bundle(dest / "nested", nested, media_roots=[run2])
    (dest / "README.txt").write_text("what these results are\n")
    (dest / "results").mkdir()
    (dest / "results" / "eval.csv").write_text("step,reward\n")
    (dest / "media" / "notes.txt").write_text("mine\n")
    kept = {
        rel: data
        for rel, data in tree_snapshot(dest).items()
        if rel.startswith(("nested", "README.txt", "results", "media/notes.txt"))
    }
    remove_bundle(dest)
    assert not is_bundle(dest)
    assert tree_snapshot(dest) == kept
    assert not (dest / "samples").exists() and sorted(p.name for p in (dest / "media").iterdir()) == [
        "notes.txt"
    ]
    assert len(open_bundle(dest / "nested", verify="full")) == 1
    with pytest.raises(BundleNotFoundError):
        remove_bundle(dest)


def test_a_local_bundle_alone_in_its_directory_is_removed_whole(tmp_path: Path) -> None:
    own, run = samples(tmp_path, "alone")
    dest = Path(write_bundle(tmp_path / "b", own, media_roots=[run]))
    remove_bundle(dest)
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["media-alone"]


def test_a_local_bundle_with_an_unreadable_manifest_is_removed_only_when_asked(tmp_path: Path) -> None:
    """A manifest that is not the format's is no bundle: nothing goes. One that claims the format
    but does not validate is damaged: refused, then with ``damaged=True`` only its layout names go
    (issue 36, items 2 and 3; before, both lost every layout name without being asked)."""
    own, run = samples(tmp_path, "broken")
    dest = Path(write_bundle(tmp_path / "b", own, media_roots=[run]))
    (dest / "manifest.json").chmod(0o644)
    (dest / "manifest.json").write_text(json.dumps({"format": "something else"}))
    (dest / "samples" / "mine.txt").write_text("mine\n")
    before = tree_snapshot(dest)
    with pytest.raises(BundleNotFoundError, match="not a rollout-bundle manifest"):
        remove_bundle(dest, damaged=True)
    assert tree_snapshot(dest) == before
    (dest / "manifest.json").write_text(json.dumps({"format": "rollout-bundle", "format_version": 1}))
    before = tree_snapshot(dest)
    with pytest.raises(BundleFormatError, match="damaged bundle, not removed; `rollout-bundle rm --damaged`"):
        remove_bundle(dest)
    assert tree_snapshot(dest) == before
    remove_bundle(dest, damaged=True)
    assert tree_snapshot(dest) == {"samples/mine.txt": b"mine\n"}
    assert not (dest / "media").exists()


def test_replacing_a_local_bundle_beside_the_users_files_is_refused_and_keeps_them(tmp_path: Path) -> None:
    """Before: ``write_bundle(dest, ..., overwrite=True)`` swapped the whole directory and deleted
    ``README.txt`` and the nested bundle with the old bundle."""
    own, run = samples(tmp_path, "old")
    dest = Path(write_bundle(tmp_path / "b1", own, media_roots=[run]))
    nested, run2 = samples(tmp_path, "nested", 1)
    write_bundle(dest / "nested", nested, media_roots=[run2])
    (dest / "README.txt").write_text("mine\n")
    before = tree_snapshot(dest)
    new, run3 = samples(tmp_path, "new")
    with pytest.raises(BundleExistsError, match=r"holds README.txt, nested beside the bundle"):
        write_bundle(dest, new, media_roots=[run3], overwrite=True)
    assert tree_snapshot(dest) == before
    assert [s["tag"] for s in open_bundle(dest, verify="none")] == ["old"] * 3  # extra files: not "fast"
    assert not [p for p in tmp_path.iterdir() if ".staging." in p.name or ".retired." in p.name]
    alone = Path(write_bundle(tmp_path / "b2", own, media_roots=[run]))
    write_bundle(alone, new, media_roots=[run3], overwrite=True)  # a bundle alone is replaced as before
    assert [s["tag"] for s in open_bundle(alone, verify="full")] == ["new"] * 3


def test_replacing_a_store_bundle_keeps_the_users_objects(weed: Any, tmp_path: Path) -> None:
    url = f"s3://{weed.current}/R/b1"
    own, run = samples(tmp_path, "old")
    write_bundle(url, own, media_roots=[run])
    user = put_user_objects(weed, "R/b1")
    new, run2 = samples(tmp_path, "new")
    write_bundle(url, new, media_roots=[run2], overwrite=True)
    after = contents(weed)
    assert {k: after[k] for k in user} == user
    assert [s["tag"] for s in open_bundle(url, verify="full")] == ["new"] * 3
