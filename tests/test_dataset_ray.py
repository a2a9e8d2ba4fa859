"""bundles.read_bundles on a real local Ray (2 CPUs): a run of 3 bundles x 2 shards read as one
dataset, one read task per shard; filter then write_parquet to a local directory and to SeaweedFS,
the bundles read from SeaweedFS by each task with the storage options it was given; screenshots
read only when a column asks for them; ``import bundles`` without ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.dataset_run import sample

import bundles

pytest.importorskip("pyarrow")
pytest.importorskip("ray.data")
REPO = Path(__file__).resolve().parents[1]
STEPS = (0, 1, 2)
PER_BUNDLE = 4  # 2 shards of 2 samples each (SHARD_TARGET_RAW_BYTES lowered while writing)


def _write(dest: Any, step: int, media: Path, **kw: Any) -> None:
    import bundles._local.writer as writer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer, "SHARD_TARGET_RAW_BYTES", 600)
        samples = [sample(step, i, media) for i in range(PER_BUNDLE)]
        bundles.write_bundle(
            dest, samples, media_roots=[media], kind="rollout", meta={"rollout_id": step}, **kw
        )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ray-run")
    for step in STEPS:
        _write(root / "run" / "rollout" / f"fully_async_{step}", step, root / "media")
    want = []
    for step in STEPS:
        with bundles.open_bundle(root / "run" / "rollout" / f"fully_async_{step}") as b:
            assert len(b.manifest.shards) == 2
            want += [r for x in b.to_arrow(media=True) for r in x.to_pylist()]
    return {"root": root, "run": root / "run", "media": root / "media", "want": want}


def _key(r: dict[str, Any]) -> tuple[str, int]:
    return (r["bundle"], r["position"])


def test_import_bundles_needs_no_ray() -> None:
    code = "import sys, bundles; assert bundles.read_bundles; print(sorted({'ray', 'pyarrow'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_a_run_is_one_dataset_one_read_task_per_shard(run: dict[str, Any], ray_local: Any) -> None:
    ds = bundles.read_bundles(run["run"])
    assert "images" not in ds.schema().names
    done = ds.materialize()
    assert done.num_blocks() == len(STEPS) * 2  # one block per read task, one task per shard
    rows = sorted(done.take_all(), key=_key)
    assert len(rows) == done.count() == len(STEPS) * PER_BUNDLE
    want = sorted(run["want"], key=_key)
    assert [_key(r) for r in rows] == [_key(r) for r in want]
    assert [(r["reward"], r["index"], list(r["tokens"]), r["step"]) for r in rows] == [
        (r["reward"], r["index"], r["tokens"], r["step"]) for r in want
    ]
    assert {r["position"] for r in rows} == set(range(PER_BUNDLE))  # positions in the bundle, not the shard


def test_filter_then_write_parquet_to_a_local_directory(
    run: dict[str, Any], ray_local: Any, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    out.mkdir()
    (out / "NOTES.txt").write_text("mine")  # a user's file beside the parts
    ds = bundles.read_bundles(run["run"], columns=["bundle", "position", "step", "reward", "status"])
    ds.filter(lambda r: r["status"] == "completed" and r["reward"] >= 0.2).write_parquet(str(out))
    rows = sorted(pq.read_table(sorted(out.glob("*.parquet"))).to_pylist(), key=_key)
    want = [r for r in run["want"] if r["status"] == "completed" and r["reward"] >= 0.2]
    assert rows and [(_key(r), r["reward"], r["step"]) for r in rows] == sorted(
        (_key(r), r["reward"], r["step"]) for r in want
    )
    assert set(rows[0]) == {"bundle", "position", "step", "reward", "status"}
    assert (out / "NOTES.txt").read_text() == "mine"


def test_a_run_on_seaweedfs_filtered_and_written_back_with_its_images(
    run: dict[str, Any], ray_local: Any, weed: Any
) -> None:
    import pyarrow.fs
    import pyarrow.parquet as pq

    root = f"s3://{weed.current}/runs/r1"
    for step in STEPS:
        _write(f"{root}/rollout/fully_async_{step}", step, run["media"])
    # The workers were started before this test's credentials were in the environment: the
    # storage options are what reach each task.
    ds = bundles.read_bundles(root, media=True, storage_options=weed.options())
    assert ds.materialize().num_blocks() == len(STEPS) * 2
    fs = pyarrow.fs.S3FileSystem(endpoint_override=weed.endpoint, access_key=weed.access_key,
                                 secret_key=weed.secret_key, region="us-east-1", scheme="http")  # fmt: skip
    ds.filter(expr="reward >= 0.3").write_parquet(f"s3://{weed.current}/datasets/r1", filesystem=fs)
    found = fs.get_file_info(pyarrow.fs.FileSelector(f"{weed.current}/datasets/r1"))
    parts = [f.path for f in found if f.path.endswith(".parquet")]
    assert parts
    rows = pq.read_table(parts, filesystem=fs).to_pylist()
    got = sorted(((r["step"], r["position"]), r["reward"], [i["bytes"] for i in r["images"]]) for r in rows)
    want = sorted(
        ((r["step"], r["position"]), r["reward"], [i["bytes"] for i in r["images"]])
        for r in run["want"]
        if r["reward"] >= 0.3
    )
    assert got == want and all(images for _, _, images in got)
    assert all(r["bundle"].startswith(root) for r in rows)


def test_a_packed_bundle_is_read_in_place_one_task_per_shard(
    run: dict[str, Any], ray_local: Any, tmp_path: Path
) -> None:
    src = run["run"] / "rollout" / "fully_async_2"
    bundles.pack_bundle(src, tmp_path / "packed" / "fully_async_2.rbundle")
    done = bundles.read_bundles(tmp_path / "packed", media=True).materialize()
    assert done.num_blocks() == 2
    rows = sorted(done.take_all(), key=lambda r: r["position"])
    want = [r for r in run["want"] if r["step"] == 2]
    assert [(r["position"], r["reward"], r["images"], r["bundle_id"]) for r in rows] == [
        (r["position"], r["reward"], r["images"], r["bundle_id"]) for r in want
    ]
    assert all(r["bundle"].endswith("fully_async_2.rbundle") for r in rows)


def test_a_bundle_replaced_after_the_listing_fails_its_tasks_naming_it(
    run: dict[str, Any], ray_local: Any, tmp_path: Path
) -> None:
    where = tmp_path / "r" / "fully_async_5"
    _write(where, 5, run["media"])
    ds = bundles.read_bundles(tmp_path / "r", columns=["position", "reward"])  # listed now, read later
    _write(where, 6, run["media"], overwrite=True)  # another step's samples in its place
    with pytest.raises(Exception) as raised:
        ds.materialize()
    assert f"{where}: changed since read_bundles listed it: bundle_id expected" in str(raised.value)


def test_screenshots_are_read_only_when_a_column_asks_for_them(
    run: dict[str, Any], ray_local: Any, tmp_path: Path
) -> None:
    bad = tmp_path / "bad"
    _write(bad / "fully_async_7", 7, run["media"], link="copy")  # its own copies: the run's stay whole
    (media,) = [p for p in (bad / "fully_async_7" / "media").iterdir() if p.stat().st_size > 0][:1]
    data = bytearray(media.read_bytes())
    data[-1] ^= 0xFF  # same size, another digest
    media.write_bytes(bytes(data))
    rows = bundles.read_bundles(bad, columns=["position", "reward", "turns"]).take_all()
    assert sorted(r["position"] for r in rows) == list(range(PER_BUNDLE))
    with pytest.raises(Exception) as raised:
        bundles.read_bundles(bad, columns=["position", "images"]).materialize()
    assert f"{bad / 'fully_async_7'}/media/{media.name}: expected {len(data)} bytes of digest" in str(
        raised.value
    )


def test_an_unknown_column_or_an_empty_root_is_refused_naming_it(
    run: dict[str, Any], ray_local: Any, tmp_path: Path
) -> None:
    with pytest.raises(bundles.BundleError, match=r"columns: expected names among .* found \['rewrd'\]"):
        bundles.read_bundles(run["run"], columns=["reward", "rewrd"])
    with pytest.raises(bundles.BundleError, match=r"read_bundles: batch_rows: expected an int >= 1, found 0"):
        bundles.read_bundles(run["run"], batch_rows=0)
    with pytest.raises(
        bundles.BundleError, match=f"read_bundles: {tmp_path}: expected bundles under it, found none"
    ):
        bundles.read_bundles(tmp_path)


def test_to_arrow_reads_only_the_shards_asked_with_their_positions_in_the_bundle(run: dict[str, Any]) -> None:
    from bundles._dataset.arrow import to_arrow

    with bundles.open_bundle(run["run"] / "rollout" / "fully_async_1") as b:
        every = [r for x in to_arrow(b, media=True) for r in x.to_pylist()]
        second = [r for x in to_arrow(b, media=True, shards=[1]) for r in x.to_pylist()]
        both = [r for x in to_arrow(b, media=True, shards=[1, 0]) for r in x.to_pylist()]
        assert [r["position"] for r in second] == [2, 3] and second == every[2:]
        assert both == every
        with pytest.raises(
            bundles.BundleError,
            match=r"fully_async_1: to_arrow: shards: expected numbers 0\.\.1, found \[2\]",
        ):
            next(to_arrow(b, shards=[0, 2]))
