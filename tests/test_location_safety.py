"""What a Location must never lose, found by a review of the Location kinds (issue 31): a staged
directory write killed between the two renames of a replacement, a remove of a file that only
has a bundle's name, a store write whose generation a concurrent remove deleted, a scratch copy
where it cannot be made, and an empty location. Real files, a real SeaweedFS, real SIGKILLs."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

from bundles import (
    BundleError,
    BundleNotFoundError,
    Location,
    is_bundle,
    open_bundle,
    remove_bundle,
    write_bundle,
)
from bundles.support import on_fault_point

ROOT = Path(__file__).resolve().parents[1]

STAGED_REPLACE = """
import sys
import bundles._local.commit
from bundles import Location, write_bundle
bundles._local.commit.exchange = lambda a, b: False  # a filesystem without RENAME_EXCHANGE
staged = Location.of(sys.argv[1]).stage(lambda w: write_bundle(w, [{"v": "new"}]), overwrite=True)
staged.publish()
"""


def test_a_staged_directory_killed_between_the_renames_of_a_replacement_is_recovered(tmp_path: Path) -> None:
    """Published from a staging sibling (FORMAT.md §5), the new bundle is found by the recovery
    of the next write, as a plain write's is; left inside the scratch directory it was swept
    with it, and both bundles were lost."""
    dest = tmp_path / "d"
    write_bundle(dest, [{"v": "old"}])
    env = {**os.environ, "ROLLOUT_BUNDLES_KILL_AT": "commit.between-renames", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", STAGED_REPLACE, str(dest)], env=env, capture_output=True, text=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not is_bundle(dest)
    write_bundle(tmp_path / "other", [{"i": 1}])  # the next write into the parent recovers
    with open_bundle(dest, verify="full") as b:
        assert [s["v"] for s in b.samples()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "other"]


def test_removing_a_file_that_only_has_a_packed_bundles_name_is_refused(tmp_path: Path) -> None:
    notes = tmp_path / "notes.rbundle"
    notes.write_text("my notes, not a bundle\n")
    with pytest.raises(
        BundleNotFoundError, match=r"notes\.rbundle: not a packed bundle.*refusing to remove it"
    ):
        remove_bundle(notes)
    assert notes.read_text() == "my notes, not a bundle\n"
    packed = write_bundle(tmp_path / "b.rbundle", [{"v": 1}])
    remove_bundle(packed)
    assert not packed.exists()


def test_removing_an_object_that_only_has_a_packed_bundles_name_is_refused(
    seaweed_s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for k, v in seaweed_s3.env.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{seaweed_s3.bucket()}/run/notes.rbundle"
    staged = tmp_path / "notes.rbundle"
    staged.write_bytes(b"not a bundle" * 100)
    Location.of(url.rpartition("/")[0]).objects().put_create("notes.rbundle", staged.read_bytes())
    with pytest.raises(BundleNotFoundError, match="refusing to remove it"):
        remove_bundle(url)
    assert not is_bundle(url)  # not proven: its members do not index as a packed bundle
    assert (
        Location.of(url.rpartition("/")[0]).objects().get("notes.rbundle", max_bytes=1 << 20)
        == staged.read_bytes()
    )


def test_a_write_whose_generation_a_concurrent_remove_deleted_is_told_so(
    seaweed_s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A remove (retention, `rollout-bundle rm`) racing an overwrite deletes every generation under
    the prefix, the writer's unpublished one too: the writer must not be told it published."""
    for k, v in seaweed_s3.env.items():
        monkeypatch.setenv(k, v)
    url = f"s3://{seaweed_s3.bucket()}/run/step"
    write_bundle(url, [{"v": 1}])
    image = put_media(tmp_path / "run", hashlib.sha256(b"x").digest() * 40)

    def another_process_removes(*_: object) -> None:
        remove_bundle(url)

    with (
        on_fault_point("store.before-publish", another_process_removes),
        pytest.raises(BundleError, match=r"published, but generation g\S+ was deleted meanwhile"),
    ):
        write_bundle(url, [{"v": 2, "image": image}], media_roots=[tmp_path / "run"], overwrite=True)


def test_a_store_write_from_media_under_an_unwritable_parent_stages_in_the_temp_directory(
    seaweed_s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The scratch copy goes beside the first media root (same filesystem: hard links); where
    that is impossible (``media_roots="/"``, or $HOME under a /home the user cannot write) it goes
    to the temp directory instead of failing with an error that is not a BundleError."""
    for k, v in seaweed_s3.env.items():
        monkeypatch.setenv(k, v)
    image = put_media(tmp_path / "run", hashlib.sha256(b"y").digest() * 40)
    url = f"s3://{seaweed_s3.bucket()}/from-root"
    write_bundle(url, [{"image": image}], media_roots="/")
    with open_bundle(url, verify="full") as b:
        assert len(b.media) == 1


def test_an_empty_location_is_refused_not_taken_for_the_current_directory() -> None:
    with pytest.raises(BundleError, match="not a location"):
        Location.of("")
    with pytest.raises(BundleError, match="not a location"):
        remove_bundle("")  # it removed the bundle the caller stood in
