"""Write failures of a checkpoint save (issue 8, fault suite): a file too large for
``RLIMIT_FSIZE``, a media file that disappears between listing and linking, a read-only
destination. Each is a named BundleError, the previous checkpoint stays intact and fully verifies,
and nothing a reader could take for a bundle is left behind."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import trainer_args

import trainer_hooks
from bundles import BundleIOError, MediaMissingError, is_bundle, open_bundle
from bundles._local.faults import on_fault_point
from trainer_hooks import Sample, list_rollout_checkpoints, save_rollout_checkpoint, store_media

REPO = Path(trainer_hooks.__file__).resolve().parents[1]


def _groups(args, n: int, seed: int) -> list[list[Sample]]:
    refs = [store_media(args, os.urandom(1) * 50_000 + bytes([seed, i])) for i in range(n)]
    return [[Sample(index=i, prompt=f"p{i}", multimodal_inputs={"images": [r]})] for i, r in enumerate(refs)]


def _previous_intact(args, rollout_id: int) -> None:
    root = Path(args.save)
    assert list(list_rollout_checkpoints(root)) == [rollout_id]
    bundle = open_bundle(list_rollout_checkpoints(root)[rollout_id], verify="full")
    assert [s["prompt"] for s in bundle.samples()] == ["p0", "p1", "p2"]
    parent = root / "rollout"
    leftovers = [p for p in parent.iterdir() if p.name != f"fully_async_{rollout_id}"]
    assert [p for p in leftovers if is_bundle(p)] == []
    assert leftovers == [], leftovers  # no staging or scratch directory survives the failure


@pytest.fixture
def saved(tmp_path):
    args = trainer_args(tmp_path, "run-a", "--keep-rollout-checkpoints", "2", "--bundle-link-mode", "copy")
    save_rollout_checkpoint(args, 1, [], _groups(args, 3, 1))
    return args


def test_a_media_file_that_disappears_between_listing_and_linking(saved):
    groups = _groups(saved, 3, 2)
    doomed = groups[2][0].multimodal_inputs["images"][0].path

    def remove_the_last_one(*_):  # right after the first media file is stored
        if os.path.exists(doomed):
            os.unlink(doomed)

    with on_fault_point("write.media", remove_the_last_one), pytest.raises(MediaMissingError) as e:
        save_rollout_checkpoint(saved, 2, [], groups)
    assert "samples[2].multimodal_inputs.images[0]" in str(e.value) and doomed in str(e.value)
    assert "fully_async_2" in str(e.value)
    _previous_intact(saved, 1)


def test_a_file_too_large_for_rlimit_fsize(saved, tmp_path):
    script = textwrap.dedent(
        f"""
        import json, os, resource, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        from trainer_hooks import Sample, parse_args, save_rollout_checkpoint
        from bundles import BundleError, MediaRef
        args = parse_args({json.dumps(_argv(saved))})
        refs = [MediaRef.from_file(p) for p in {json.dumps(_media_paths(saved))}]
        groups = [[Sample(index=i, prompt="p", multimodal_inputs={{"images": [r]}})] for i, r in enumerate(refs)]
        resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))
        try:
            save_rollout_checkpoint(args, 2, [], groups)
            print(json.dumps({{"raised": None}}))
        except BundleError as e:
            print(json.dumps({{"raised": type(e).__name__, "errno": getattr(e, "errno", None), "msg": str(e)}}))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout, r.stderr
    out = json.loads(r.stdout)
    assert out["raised"] == "BundleIOError" and out["errno"] == errno.EFBIG
    assert "fully_async_2: cannot write the bundle: [Errno 27] File too large" in out["msg"]
    _previous_intact(saved, 1)


def test_a_read_only_destination(saved):
    parent = Path(saved.save) / "rollout"
    groups = _groups(saved, 3, 3)
    with _read_only(parent):
        with pytest.raises(BundleIOError) as e:
            save_rollout_checkpoint(saved, 2, [], groups)
        assert e.value.errno in (errno.EPERM, errno.EACCES, errno.EROFS)
        assert str(parent) in str(e.value)
    _previous_intact(saved, 1)


class _read_only:
    """Make a directory unwritable for this process: chmod for a normal user; root ignores
    modes, so as root the directory is made immutable (``chattr +i``, ext4 and others)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        if os.geteuid() != 0:
            os.chmod(self.path, 0o555)
            return
        r = subprocess.run(["chattr", "+i", str(self.path)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip(
                f"as root a read-only directory needs chattr +i, which failed here: {r.stderr.strip()}"
            )

    def __exit__(self, *exc: object) -> None:
        if os.geteuid() != 0:
            os.chmod(self.path, 0o755)
        else:
            subprocess.run(["chattr", "-i", str(self.path)], check=False)


def test_a_scratch_directory_in_a_read_only_place_is_a_bundle_io_error(saved):
    from bundles.support import scratch_dir

    parent = Path(saved.save) / "rollout"
    with (
        _read_only(parent),
        pytest.raises(BundleIOError, match="cannot create the images directory beside it"),
    ):
        scratch_dir(parent / "fully_async_3", "images")


def _argv(args) -> list[str]:
    return [
        "--rollout-batch-size",
        "1",
        "--shared-media-dir",
        str(args.shared_media_dir),
        "--run-uuid",
        args.run_uuid,
        "--save",
        str(args.save),
        "--keep-rollout-checkpoints",
        "2",
        "--bundle-link-mode",
        "copy",
    ]


def _media_paths(args) -> list[str]:
    run = Path(args.shared_media_dir) / args.run_uuid
    return sorted(str(p) for p in run.iterdir() if p.suffix == ".png")[:3]
