"""The trainer side on an object store (moto on 127.0.0.1, configured by the AWS environment):
``--save s3://...`` checkpoints written in the background with one media pool per run and
retention that keeps what surviving checkpoints need, resume from ``--load s3://...`` into a new
run's media directory, and ``--save-debug-rollout-data s3://.../rollout_{rollout_id}`` uploaded
in the background and flushed before run media are released."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import open_bundle
from trainer_hooks import (
    RolloutCheckpointer,
    Sample,
    flush_dump_uploads,
    list_rollout_checkpoints,
    load_debug_rollout_data,
    parse_args,
    read_rollout_checkpoint,
    release_run_media,
    save_debug_rollout_data,
    store_media,
)
from trainer_hooks.testing import png_bytes


@pytest.fixture
def bucket(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    return moto_s3.bucket()


def args_for(tmp_path: Path, run: str, *extra: str) -> Any:
    return parse_args(
        [
            "--shared-media-dir",
            str(tmp_path / "shared"),
            "--run-uuid",
            run,
            "--rollout-batch-size",
            "1",
            *extra,
        ]
    )


def group(args: Any, gid: int, shots: list[bytes]) -> list[Sample]:
    refs = [store_media(args, b) for b in shots]
    return [
        Sample(
            group_index=gid,
            index=gid,
            prompt=f"p{gid}",
            tokens=[1, 2, gid],
            multimodal_inputs={"images": refs},
            response="r",
            response_length=1,
            reward=1.0,
            status=Sample.Status.COMPLETED,
        )
    ]


def pool_keys(moto_s3: Any, bucket: str, prefix: str) -> list[str]:
    raw = S3Store(bucket, **moto_s3.options(), client_options={"allow_http": True})
    return sorted(m["path"] for batch in obstore.list(raw, prefix) for m in batch)


def test_url_options_are_kept_as_urls(bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/run"
    args = args_for(
        tmp_path,
        "a",
        "--save",
        url,
        "--load",
        url,
        "--save-debug-rollout-data",
        f"{url}/dumps/rollout_{{rollout_id}}",
    )
    assert args.save == url and args.load == url
    assert args.save_debug_rollout_data == f"{url}/dumps/rollout_{{rollout_id}}"
    with pytest.raises(ValueError, match=r"--save-debug-trajectory-data .*not supported for this option"):
        args_for(tmp_path, "a", "--save-debug-trajectory-data", f"{url}/t.jsonl")


def test_checkpoints_on_a_store_share_a_pool_survive_retention_and_resume(
    bucket: str, moto_s3: Any, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/run"
    args = args_for(tmp_path, "a", "--save", url, "--keep-rollout-checkpoints", "1")
    shots = [png_bytes(8, 8, (i, 1, 2)) for i in range(4)]
    ckpt = RolloutCheckpointer(args)
    for step in range(3):  # each step's groups reuse earlier screenshots: one pool, each once
        ckpt.save(step, [], [group(args, step, shots[: step + 2])])
    committed = ckpt.flush()
    ckpt.close()
    assert [str(p) for p in committed] == [f"{url}/rollout/fully_async_{i}" for i in range(3)]
    assert list(list_rollout_checkpoints(url)) == [2]  # retention kept the newest
    pool = [k for k in pool_keys(moto_s3, bucket, "run/rollout/.media/")]
    assert len(pool) == 4  # every screenshot uploaded once, and those fully_async_2 needs kept
    open_bundle(f"{url}/rollout/fully_async_2", verify="full")

    # Resume on another machine: a new run, its own media directory, no shared filesystem.
    release_run_media(args)
    args2 = args_for(tmp_path, "b", "--load", url)
    restored = read_rollout_checkpoint(args2, 2)
    (sample,) = restored.completed_groups[0]
    placed = [Path(r.path if hasattr(r, "path") else r) for r in sample.multimodal_inputs["images"]]
    assert [p.read_bytes() for p in placed] == shots[:4]
    assert all(p.parent == tmp_path / "shared" / "b" for p in placed)


def test_debug_dumps_upload_in_the_background_and_load_back(
    bucket: str, moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = f"s3://{bucket}/run/dumps/rollout_{{rollout_id}}"
    args = args_for(
        tmp_path, "a", "--save-debug-rollout-data", template, "--load-debug-rollout-data", template
    )
    shot = png_bytes(6, 6, (3, 3, 3))
    out = save_debug_rollout_data(
        args, group(args, 0, [shot]), rollout_id=5, evaluation=False, metadata={"m": 1}
    )
    assert str(out) == f"s3://{bucket}/run/dumps/rollout_5"
    packed = save_debug_rollout_data(
        parse_args([*_base(tmp_path), "--save-debug-rollout-data", template + ".rbundle"]),
        group(args, 1, [shot]),
        rollout_id=6,
        evaluation=False,
    )
    assert str(packed).endswith("rollout_6.rbundle")
    assert sorted(flush_dump_uploads()) == sorted([str(out), str(packed)])
    release_run_media(args)  # the uploads are done: nothing of them needs the run directory
    samples, meta = load_debug_rollout_data(args, 5)
    assert meta == {"m": 1} and len(samples) == 1
    (image,) = samples[0].multimodal_inputs["images"]  # a local file: processors open media by path
    assert Path(getattr(image, "path", image)).read_bytes() == shot
    b = open_bundle(str(out), verify="full")
    with b.open_media(b[0]["multimodal_inputs"]["images"][0]) as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(shot).digest()
    assert len(open_bundle(str(packed), verify="full")) == 1
    assert not list((tmp_path / "shared").glob(".*staging*"))  # the local copies are gone


def _base(tmp_path: Path) -> list[str]:
    return ["--shared-media-dir", str(tmp_path / "shared"), "--run-uuid", "a", "--rollout-batch-size", "1"]


def test_a_failed_background_upload_is_raised_at_flush(
    tmp_path: Path, moto_s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer_hooks import DumpUploadError

    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    template = "s3://no-such-bucket-dumps/rollout_{rollout_id}"
    args = args_for(tmp_path, "a", "--save-debug-rollout-data", template)
    save_debug_rollout_data(
        args, group(args, 0, [png_bytes(4, 4, (1, 1, 1))]), rollout_id=0, evaluation=False
    )
    with pytest.raises(
        DumpUploadError, match=r"^s3://no-such-bucket-dumps/rollout_0: background upload .* does not exist"
    ):
        flush_dump_uploads()
    assert flush_dump_uploads() == []  # raised once
