"""Rollout checkpoints: teardown-then-resume, snapshots, background errors, retention, SIGKILL."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import digest_of, trainer_args

import trainer_hooks
from bundles import (
    BundleFormatError,
    BundleNotFoundError,
    BundleVerificationError,
    MediaMissingError,
    MediaRef,
    open_bundle,
)
from trainer_hooks import (
    CheckpointSaveError,
    RolloutCheckpointer,
    RolloutEngineProcessorArgs,
    RunMediaError,
    Sample,
    checkpoint_path,
    list_rollout_checkpoints,
    load_rollout_checkpoint,
    parse_args,
    read_rollout_checkpoint,
    release_run_media,
    run_media_dir,
    save_rollout_checkpoint,
    store_media,
)
from trainer_hooks.testing import png_bytes

# Where this process imports trainer_hooks from (the source tree or an installed wheel): the
# child imports the same code.
IMPORT_ROOT = Path(trainer_hooks.__file__).resolve().parents[1]


def make_group(args, group_index: int, n: int = 2, *, status=Sample.Status.COMPLETED) -> list[Sample]:
    group = []
    for i in range(n):
        ref = store_media(args, png_bytes(4, 4, (group_index, i, 7)))
        path_str = store_media(args, png_bytes(3, 3, (i, group_index, 9))).path  # a plain path reference
        group.append(
            Sample(
                group_index=group_index,
                index=group_index * n + i,
                prompt=f"p{group_index}.{i}",
                tokens=[1, 2, 3, group_index, i],
                multimodal_inputs={"images": [ref, path_str]},
                multimodal_train_inputs={"image_grid_thw": np.array([[1, 2, 2]], dtype=np.int64)},
                response="r",
                response_length=1,
                reward={"acc": 1.0},
                loss_mask=[1],
                rollout_log_probs=[-0.25],
                status=status,
                metadata={"k": [group_index, i]},
                rollout_routed_experts=np.arange(6, dtype=np.int32).reshape(2, 3),
            )
        )
    return group


def media_of(sample: Sample) -> list[str]:
    return media_of_refs(sample.multimodal_inputs["images"])


def media_of_refs(items: list) -> list[str]:
    return [item.path if isinstance(item, MediaRef) else item for item in items]


def assert_sample_equal(a: Sample, b: Sample) -> None:
    da, db = a.to_dict(), b.to_dict()
    assert da.keys() == db.keys()
    for k in da:
        if k == "multimodal_inputs":
            continue
        va, vb = da[k], db[k]
        if k == "multimodal_train_inputs":
            assert va.keys() == vb.keys()
            for kk in va:
                np.testing.assert_array_equal(va[kk], vb[kk])
        elif isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype
            np.testing.assert_array_equal(va, vb)
        else:
            assert va == vb, k


def test_save_release_resume_in_new_run(tmp_path):
    args = trainer_args(tmp_path, "run-a", "--bf16")
    pending = [make_group(args, 0, status=Sample.Status.PENDING)]
    completed = [make_group(args, 1), make_group(args, 2, n=3)]
    originals = {p: Path(p).read_bytes() for g in pending + completed for s in g for p in media_of(s)}

    path = save_rollout_checkpoint(args, 5, pending, completed)
    assert path == tmp_path / "ckpt" / "rollout" / "fully_async_5"
    bundle = open_bundle(path, verify="full")
    assert bundle.kind == "rollout_checkpoint"
    assert bundle.meta["rollout_id"] == 5
    assert bundle.meta["run_uuid"] == "run-a"
    assert bundle.meta["training_dtype"] == "bf16"
    assert bundle.meta["processor"] is None
    assert bundle.meta["pending_group_sizes"] == [2]
    assert bundle.meta["completed_group_sizes"] == [2, 3]

    release_run_media(args)  # frees ~0 bytes: the checkpoint hard-links the same files
    assert not (tmp_path / "shared" / "run-a").exists()

    args_b = trainer_args(tmp_path, "run-b")
    got_pending, got_completed = load_rollout_checkpoint(args_b, 5)
    run_b = run_media_dir(args_b)
    assert [len(g) for g in got_pending] == [2] and [len(g) for g in got_completed] == [2, 3]
    for old_g, new_g in zip(pending + completed, got_pending + got_completed, strict=True):
        for old, new in zip(old_g, new_g, strict=True):
            old_paths, new_paths = media_of(old), media_of(new)
            assert isinstance(new.multimodal_inputs["images"][0], MediaRef)
            assert isinstance(new.multimodal_inputs["images"][1], str)
            for op, np_ in zip(old_paths, new_paths, strict=True):
                assert Path(np_).parent == run_b, np_
                assert Path(np_).read_bytes() == originals[op]
                assert Path(np_).name == Path(op).name  # content-addressed in both runs
    for old, new in zip(completed[1], got_completed[1], strict=True):
        assert_sample_equal(old, new)
        assert new.status is Sample.Status.COMPLETED
    # Pending groups come back reset for retry (Miles' reset_for_retry: status aborted): prompt
    # and media kept, generation cleared.
    for old, new in zip(pending[0], got_pending[0], strict=True):
        assert new.prompt == old.prompt and new.index == old.index and new.metadata == old.metadata
        assert new.tokens == [] and new.response == "" and new.status is Sample.Status.ABORTED

    # The resumed run's teardown removes only its own copies; the checkpoint stays whole.
    release_run_media(args_b)
    open_bundle(path, verify="full")


def test_meta_records_dtype_and_processor(tmp_path):
    args = trainer_args(tmp_path, "run-a", "--fp16")
    args.rollout_processor_args = RolloutEngineProcessorArgs("Qwen/Qwen2-VL-2B", "pil", {"max_pixels": 1024})
    path = save_rollout_checkpoint(args, 0, [], [make_group(args, 0)])
    meta = open_bundle(path).meta
    assert meta["training_dtype"] == "fp16"
    assert meta["processor"]["model_path"] == "Qwen/Qwen2-VL-2B"
    assert meta["processor"]["mm_process_config"] == {"max_pixels": 1024}


def test_mutation_after_save_does_not_change_checkpoint(tmp_path):
    args = trainer_args(tmp_path, "run-a")
    group = make_group(args, 0)
    images_before = [list(s.multimodal_inputs["images"]) for s in group]
    extra = store_media(args, png_bytes(2, 2, (1, 1, 1)))

    saver = RolloutCheckpointer(args)
    fut = saver.save(1, [], [group])
    for s in group:  # in place, everywhere, before the background write can have finished
        s.tokens.append(999)
        s.metadata["k"].append("changed")
        s.multimodal_inputs["images"].append(extra)
        s.rollout_routed_experts[:] = -1
        s.multimodal_train_inputs["image_grid_thw"][0, 0] = 42
        s.reward["acc"] = -1.0
        s.response = "mutated"
    assert saver.flush() == [fut.result()]
    saver.close()

    release_run_media(args)
    _, completed = load_rollout_checkpoint(trainer_args(tmp_path, "run-b"), 1)
    # Expected values spelled out from make_group(args, 0), never taken from what was loaded.
    assert [got.index for got in completed[0]] == [0, 1]
    for i, got in enumerate(completed[0]):
        assert got.tokens == [1, 2, 3, 0, i]
        assert got.metadata == {"k": [0, i]}
        assert [Path(p).name for p in media_of(got)] == [
            Path(p).name for p in media_of_refs(images_before[i])
        ]
        np.testing.assert_array_equal(got.rollout_routed_experts, np.arange(6, dtype=np.int32).reshape(2, 3))
        assert got.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 2, 2]]
        assert got.reward == {"acc": 1.0} and got.response == "r"


@pytest.mark.torch
def test_mutating_a_tensor_after_save_does_not_change_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    args = trainer_args(tmp_path, "run-a")
    group = make_group(args, 0, n=1)
    pv = torch.arange(12, dtype=torch.float32).reshape(2, 6)
    group[0].multimodal_train_inputs["pixel_values"] = pv
    group[0].multimodal_train_inputs["bf"] = torch.ones(3, dtype=torch.bfloat16)
    saver = RolloutCheckpointer(args)
    saver.save(0, [], [group])
    pv.mul_(0)
    group[0].multimodal_train_inputs["bf"].add_(5)
    saver.close()
    _, completed = load_rollout_checkpoint(args, 0)
    got = completed[0][0].multimodal_train_inputs
    assert torch.equal(got["pixel_values"], torch.arange(12, dtype=torch.float32).reshape(2, 6))
    assert got["bf"].dtype == torch.bfloat16 and torch.equal(got["bf"], torch.ones(3, dtype=torch.bfloat16))


def _broken_group(args) -> list[Sample]:
    """A sample referencing a file under the run directory that does not exist."""
    group = make_group(args, 9, n=1)
    missing = str(run_media_dir(args) / ("0" * 64 + ".png"))
    group[0].multimodal_inputs["images"].append(missing)
    return group


def test_background_failure_is_raised_at_flush_once(tmp_path, caplog):
    args = trainer_args(tmp_path, "run-a")
    saver = RolloutCheckpointer(args)
    saver.save(3, [], [_broken_group(args)])  # returns: the error happens in the background
    with pytest.raises(CheckpointSaveError) as info:
        saver.flush()
    assert "rollout 3 failed (raised at the next save() or flush())" in caplog.text  # also logged at once
    msg = str(info.value)
    assert "fully_async_3" in msg and "rollout 3" in msg and "0" * 64 + ".png" in msg
    assert "samples[0].multimodal_inputs.images[2]" in msg
    assert isinstance(info.value.__cause__, MediaMissingError)
    assert not checkpoint_path(args.save, 3).exists()
    saver.flush()  # raised once, not again
    saver.close()


def test_background_failure_is_raised_at_next_save(tmp_path):
    args = trainer_args(tmp_path, "run-a")
    saver = RolloutCheckpointer(args)
    fut = saver.save(1, [], [_broken_group(args)])
    assert isinstance(fut.exception(timeout=30), MediaMissingError)
    good = [make_group(args, 0)]
    with pytest.raises(CheckpointSaveError, match="rollout 1"):
        saver.save(2, [], good)
    assert saver.pending_saves == 0  # the new save was not queued
    saver.save(2, [], good)  # the caller may retry; the error is gone
    assert saver.flush() == [checkpoint_path(args.save, 2)]
    saver.close()


def test_retention_keeps_exactly_k_committed(tmp_path):
    args = trainer_args(tmp_path, "run-a", "--keep-rollout-checkpoints", "2")
    saver = RolloutCheckpointer(args)
    for rid in range(5):
        saver.save(rid, [], [make_group(args, rid)])
    saver.flush()
    assert sorted(list_rollout_checkpoints(args.save)) == [3, 4]
    # A failing save deletes nothing: retention runs only after a commit.
    saver.save(5, [], [_broken_group(args)])
    with pytest.raises(CheckpointSaveError):
        saver.flush()
    assert sorted(list_rollout_checkpoints(args.save)) == [3, 4]
    for rid in (3, 4):
        open_bundle(checkpoint_path(args.save, rid), verify="full")
    # Entries that are not committed checkpoints are neither counted nor touched.
    rollout = Path(args.save) / "rollout"
    (rollout / "fully_async_1").mkdir()  # no manifest: not a checkpoint
    (rollout / "global_dataset_state_dict_4.json").write_text("{}")
    saver.save(6, [], [make_group(args, 6)])
    saver.close()
    assert sorted(list_rollout_checkpoints(args.save)) == [4, 6]
    assert (rollout / "fully_async_1").is_dir() and (rollout / "global_dataset_state_dict_4.json").exists()
    assert not [p for p in rollout.iterdir() if p.name.startswith(".")]


def test_retention_never_deletes_the_one_just_committed(tmp_path):
    args = trainer_args(tmp_path, "run-a", "--keep-rollout-checkpoints", "1")
    for rid in (7, 8):
        save_rollout_checkpoint(args, rid, [], [make_group(args, rid)])
    save_rollout_checkpoint(args, 2, [], [make_group(args, 2)])  # resumed from an earlier step
    assert sorted(list_rollout_checkpoints(args.save)) == [2, 8]


def test_pil_images_come_back_as_pil_images(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    args = trainer_args(tmp_path, "run-a")
    img = Image.new("RGB", (5, 4), (10, 20, 30))
    s = Sample(index=0, prompt="x", multimodal_inputs={"images": [img]}, status=Sample.Status.COMPLETED)
    path = save_rollout_checkpoint(args, 0, [], [[s]])
    assert s.multimodal_inputs["images"][0] is img  # the caller's sample is not modified
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]
    args_b = trainer_args(tmp_path, "run-b")
    _, completed = load_rollout_checkpoint(args_b, 0)
    back = completed[0][0].multimodal_inputs["images"][0]
    assert isinstance(back, Image.Image) and (back.mode, back.size) == ("RGB", (5, 4))
    assert Path(back.filename).parent == run_media_dir(args_b)  # opened on the rehydrated file
    assert back.tobytes() == img.tobytes()  # PNG: lossless


def test_load_errors_name_path_and_field(tmp_path):
    args = trainer_args(tmp_path, "run-a")
    with pytest.raises(BundleNotFoundError, match="fully_async_4"):
        load_rollout_checkpoint(args, 4)
    save_rollout_checkpoint(args, 1, [], [make_group(args, 1)])
    from bundles import write_bundle

    write_bundle(checkpoint_path(args.save, 2), [{"status": "completed"}], kind="debug_dump")
    with pytest.raises(
        BundleFormatError, match=r"fully_async_2: kind: expected 'rollout_checkpoint', found 'debug_dump'"
    ):
        load_rollout_checkpoint(args, 2)
    no_media = parse_args(["--rollout-batch-size", "1", "--load", args.save, "--run-uuid", "x"])
    with pytest.raises(
        RunMediaError, match=r"fully_async_1: the checkpoint holds 4 media file\(s\) but --shared-media-dir"
    ):
        load_rollout_checkpoint(no_media, 1)
    with pytest.raises(ValueError, match="--load is not set"):
        load_rollout_checkpoint(parse_args(["--rollout-batch-size", "1"]), 1)


def test_loading_from_another_root_and_verify_full(tmp_path):
    args = trainer_args(tmp_path, "run-a", "--bundle-verify", "full")
    save_rollout_checkpoint(args, 0, [], [make_group(args, 0)])
    ckpt = read_rollout_checkpoint(args, 0, root=args.save)
    assert ckpt.meta["run_uuid"] == "run-a" and len(ckpt.completed_groups) == 1
    # Corrupt one stored media file's bytes (same size): full verification names it.
    media = next((checkpoint_path(args.save, 0) / "media").iterdir())
    os.chmod(media, 0o644)
    data = bytearray(media.read_bytes())
    data[-1] ^= 0xFF
    media.write_bytes(bytes(data))
    with pytest.raises(BundleVerificationError) as e:
        read_rollout_checkpoint(trainer_args(tmp_path, "run-b", "--bundle-verify", "full"), 0)
    expected = "sha256:" + media.name.split(".")[0]
    found = "sha256:" + hashlib.sha256(data).hexdigest()
    assert e.value.problems == [f"{media}: digest: expected {expected}, found {found}"]
    assert not run_media_dir(trainer_args(tmp_path, "run-b")).exists()  # nothing rehydrated


CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    from trainer_hooks import Sample, parse_args, save_rollout_checkpoint, store_media
    from bundles import MediaRef

    root, target = sys.argv[1], int(sys.argv[2])
    args = parse_args(["--rollout-batch-size", "1", "--shared-media-dir", root + "/shared", "--run-uuid", "victim", "--save", root + "/ckpt",
                       "--bundle-link-mode", "copy"])
    refs = [store_media(args, os.urandom(512 * 1024) + bytes([i % 256]), ".bin") for i in range(400)]
    def group(rs):
        return [Sample(index=i, prompt="p", multimodal_inputs={{"images": [r]}}, status=Sample.Status.COMPLETED)
                for i, r in enumerate(rs)]
    save_rollout_checkpoint(args, 1, [], [group(refs[:3])])
    print("committed", flush=True)
    save_rollout_checkpoint(args, target, [], [group(refs)])
    print("done", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("target", [2, 1], ids=["new-id", "overwrite-same-id"])
def test_sigkill_mid_save_leaves_previous_checkpoint_loadable(tmp_path, target):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=str(IMPORT_ROOT)))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "committed", proc.stderr.read()
        rollout = tmp_path / "ckpt" / "rollout"
        deadline = time.monotonic() + 60
        killed_in = None
        while time.monotonic() < deadline and killed_in is None:
            for staging in rollout.glob(".fully_async_*.staging.*"):
                media = staging / "media"
                if media.is_dir() and sum(1 for _ in media.iterdir()) >= 5:
                    proc.send_signal(signal.SIGKILL)
                    killed_in = staging
                    break
            time.sleep(0.001)
        assert killed_in is not None, "the child's save never reached its staging directory"
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert "done" not in proc.stdout.read(), "the save finished before the kill; the test proved nothing"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()

    # The previous checkpoint is complete, fully verifiable and loadable into a new run.
    assert killed_in.exists()
    committed = checkpoint_path(tmp_path / "ckpt", 1)
    bundle = open_bundle(committed, verify="full")
    assert len(bundle) == 3
    if target == 2:
        assert not checkpoint_path(tmp_path / "ckpt", 2).exists()
    assert sorted(list_rollout_checkpoints(tmp_path / "ckpt")) == [1]
    args = trainer_args(tmp_path, "next-run")
    _, completed = load_rollout_checkpoint(args, 1)
    assert len(completed[0]) == 3
    for s in completed[0]:
        ref = s.multimodal_inputs["images"][0]
        assert digest_of(Path(ref.path).read_bytes()) == ref.digest

    # The next save into the same directory sweeps the dead writer's staging directory.
    save_rollout_checkpoint(args, 3, [], [make_group(args, 3)])
    assert not killed_in.exists()


def test_a_long_scalar_list_hiding_a_mutable_item_fails_the_save(tmp_path):
    """Long scalar-ended lists are copied shallowly at save() and checked on the worker: one that
    holds a mutable item fails loudly instead of yielding a checkpoint a later mutation changed."""
    args = trainer_args(tmp_path, "run-a")
    s = make_group(args, 0, n=1)[0]
    s.tokens = list(range(100))
    s.tokens[5] = np.array([7])
    saver = RolloutCheckpointer(args)
    saver.save(0, [], [[s]])
    with pytest.raises(
        CheckpointSaveError,
        match=r"completed_groups\[0\]\[0\]\.tokens\[5\]: a list whose first and last items are scalars holds a numpy\.ndarray",
    ):
        saver.flush()
    saver.close()
    assert not checkpoint_path(args.save, 0).exists()
    # Short lists and lists that start with a container are copied item by item instead.
    s.tokens = [np.array([1]), *range(100)]
    save_rollout_checkpoint(args, 1, [], [[s]])
    s.tokens[0][0] = 99
    _, completed = load_rollout_checkpoint(args, 1)
    assert completed[0][0].tokens[0].tolist() == [1]


def test_resume_hashes_the_media_it_places_by_default(tmp_path):
    """Issue 8 defect 15: a hard-linked checkpoint file edited in place, or a file of the right
    name and size already in the new run's directory, is caught at resume, not trained on."""
    args = trainer_args(tmp_path, "run-a")
    save_rollout_checkpoint(args, 0, [], [make_group(args, 0)])
    release_run_media(args)
    stored = sorted((checkpoint_path(args.save, 0) / "media").iterdir())
    # An in-place edit of one stored file (same size): --bundle-verify fast cannot see it.
    victim = stored[0]
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    resumed = trainer_args(tmp_path, "run-b")
    with pytest.raises(BundleVerificationError) as info:
        load_rollout_checkpoint(resumed, 0)
    placed = run_media_dir(resumed) / victim.name
    expected = "sha256:" + victim.name.split(".")[0]
    found = "sha256:" + hashlib.sha256(data).hexdigest()
    assert info.value.problems[0] == f"{placed}: digest: expected {expected}, found {found}"
    assert len(info.value.problems) == 2 and "--no-resume-verify-media" in info.value.problems[1]
    assert str(checkpoint_path(args.save, 0)) in str(info.value)
    # The check can be skipped: by keyword, or by option.
    _, completed = load_rollout_checkpoint(resumed, 0, verify_media=False)
    assert len(completed[0]) == 2
    skipping = trainer_args(tmp_path, "run-c", "--no-resume-verify-media")
    assert skipping.resume_verify_media is False
    load_rollout_checkpoint(skipping, 0)

    # A file already in the run directory with the right name and size is kept as it is by
    # rehydration; the hash catches it too.
    victim.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))  # the original bytes again
    os.chmod(victim, 0o444)
    open_bundle(checkpoint_path(args.save, 0), verify="full")
    fresh = trainer_args(tmp_path, "run-d")
    other = run_media_dir(fresh) / stored[1].name
    store_media(fresh, b"another screenshot")  # the run directory, made as a run makes it
    other.write_bytes(b"\0" * stored[1].stat().st_size)
    with pytest.raises(BundleVerificationError, match=rf"{other}: digest: expected sha256:"):
        load_rollout_checkpoint(fresh, 0)


def test_a_failing_save_with_more_than_k_checkpoints_present_deletes_nothing(tmp_path):
    """Retention runs only after a commit: a save that fails must not delete older checkpoints,
    even when more than K are present (issue 12 row 10: retention in a `finally` went unseen)."""
    args = trainer_args(tmp_path, "run-a")
    for rid in range(3):
        save_rollout_checkpoint(args, rid, [], [make_group(args, rid)])
    args.keep_rollout_checkpoints = 1
    with pytest.raises(MediaMissingError):
        save_rollout_checkpoint(args, 3, [], [_broken_group(args)])
    assert sorted(list_rollout_checkpoints(args.save)) == [0, 1, 2]
    save_rollout_checkpoint(args, 3, [], [make_group(args, 3)])
    assert sorted(list_rollout_checkpoints(args.save)) == [3]
