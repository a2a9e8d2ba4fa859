"""rollout-bundle export, read by the field's tools unchanged: DuckDB, polars, HF datasets (the
screenshots decoded to the same pixels), TRL's vision-SFT layout loaded with datasets; a bundle
exported once is skipped; OUT on SeaweedFS; ROOT holding a packed bundle."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.dataset_run import PER_STEP, STEPS, make_run, sample

import bundles

pytest.importorskip("pyarrow")
REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bundles.cli", "export", *args],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_run(tmp_path_factory.mktemp("dataset-export"))


@pytest.fixture(scope="module")
def exported(run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("out") / "ds"
    out.mkdir()
    (out / "NOTES.txt").write_text("mine")  # a user's file in OUT
    done = cli(str(run["run"]), "-o", str(out), "--with-images")
    assert done.returncode == 0, done.stderr
    return {**run, "out": out, "stdout": done.stdout}


def test_parts_are_hive_partitioned_one_per_bundle_and_a_second_export_skips_them(
    exported: dict[str, Any],
) -> None:
    out = exported["out"]
    parts = sorted(str(p.relative_to(out)) for p in out.rglob("*.parquet"))
    assert [p.rsplit("/", 1)[0] for p in parts] == [
        "kind=debug_dump/step=9", *[f"kind=rollout/step={s}" for s in STEPS]]  # fmt: skip
    assert all(p.rsplit("/", 1)[1].startswith("part-") for p in parts)
    assert "exported 4 bundles (17 rows)" in exported["stdout"]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    again = cli(str(exported["run"]), "-o", str(out), "--with-images")
    assert again.returncode == 0 and "exported 0 bundles (0 rows)" in again.stdout
    assert "skipped 4 already exported" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == before
    assert (out / "NOTES.txt").read_text() == "mine"
    assert sorted(p.name for p in out.rglob("*") if p.is_file() and p.suffix != ".parquet") == ["NOTES.txt"]


def test_duckdb_reads_the_mean_reward_per_step_the_bundles_hold(exported: dict[str, Any]) -> None:
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(
        f"SELECT step, avg(reward) AS r, count(*) AS n FROM read_parquet('{exported['out']}/**/*.parquet', "
        "hive_partitioning = true) WHERE kind = 'rollout' GROUP BY step ORDER BY step"
    ).fetchall()
    assert [(s, n) for s, _, n in rows] == [(s, PER_STEP) for s in STEPS]
    for step, mean, _ in rows:
        with bundles.open_bundle(exported["run"] / "rollout" / f"fully_async_{step}") as b:
            own = [s["reward"] for s in b.samples()]
        assert mean == pytest.approx(sum(own) / len(own)) == pytest.approx(exported["avg"][step])


def test_polars_scans_the_dataset_with_its_partitions(exported: dict[str, Any]) -> None:
    pl = pytest.importorskip("polars")
    lf = pl.scan_parquet(f"{exported['out']}/**/*.parquet", hive_partitioning=True)
    counts = dict(lf.group_by("kind").agg(pl.len()).collect().iter_rows())
    assert counts == exported["count"]
    done = lf.filter((pl.col("status") == "completed") & (pl.col("step") == 2)).select("index").collect()
    assert sorted(done["index"].to_list()) == [200, 201, 202, 204]


def test_hf_datasets_decodes_the_screenshots_to_the_same_pixels(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    files = str(exported["out"] / "kind=rollout" / "step=1" / "*.parquet")
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path))
    ds = ds.cast_column("images", datasets.List(datasets.Image()))
    with bundles.open_bundle(exported["run"] / "rollout" / "fully_async_1") as b:
        samples = {s["index"]: s for s in b.samples()}
    assert len(ds) == PER_STEP
    for row in ds:
        shots = samples[row["index"]]["multimodal_inputs"]["images"]
        assert len(row["images"]) == len(shots)
        for got, path in zip(row["images"], shots, strict=True):
            with Image.open(path) as want:
                assert got.size == want.size and got.convert("RGB").tobytes() == want.convert("RGB").tobytes()


def test_sft_rows_load_as_trl_documents_them(run: dict[str, Any], tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "sft"
    done = cli(str(run["run"]), "-o", str(out), "--format", "sft", "--kind", "rollout")
    assert done.returncode == 0, done.stderr
    # successful: completed and a reward above 0 (sample 3 is truncated, step 0's sample 0 earns 0)
    assert (
        "sft: 8 trajectories read by turns (metadata.actions and screenshots), 3 by prompt/response"
        in done.stdout
    )
    ds = datasets.load_dataset("parquet", data_files=str(out / "**" / "*.parquet"), split="train",
                               cache_dir=str(tmp_path / "cache"))  # fmt: skip
    ds = ds.cast_column("images", datasets.List(datasets.Image()))
    assert len(ds) == 11
    for row in ds:
        roles = [m["role"] for m in row["messages"]]
        placeholders = sum(c["type"] == "image" for m in row["messages"] for c in m["content"])
        assert placeholders == len(row["images"]) >= 1  # one placeholder per picture, in order
        assert roles[0] == "user" and roles[-1] in ("assistant", "user")
        assert all(c["type"] in ("image", "text") for m in row["messages"] for c in m["content"])
        if row["convention"] == "turns":
            assert roles == ["user", "assistant", "user", "assistant"]
            assert [m["content"][0]["text"] for m in row["messages"][1::2]] == [
                f"click({row['position']}, {j})" for j in range(2)]  # fmt: skip
        else:
            assert roles == ["user", "assistant"]
            assert row["messages"][1]["content"] == [{"type": "text", "text": f"done {row['position']}"}]


def test_kind_min_reward_and_columns_filter_what_is_written(run: dict[str, Any], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "f"
    done = cli(str(run["run"]), "-o", str(out), "--kind", "rollout", "--min-reward", "0.4",
               "--columns", "index,reward", "--format", "parquet")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "1 of another kind" in done.stdout
    table = pq.read_table(out, partitioning="hive")
    assert sorted(table.column_names) == ["index", "kind", "reward", "step"]
    assert min(table.column("reward").to_pylist()) >= 0.4
    assert sorted(table.column("index").to_pylist()) == [4, 103, 104, 202, 203, 204]


def test_a_packed_bundle_under_root_exports_like_its_directory(run: dict[str, Any], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    root = tmp_path / "packed-run"
    root.mkdir()
    bundles.pack_bundle(run["run"] / "rollout" / "fully_async_2", root / "fully_async_2.rbundle")
    done = cli(str(root), "-o", str(tmp_path / "p"), "--with-images", "--format", "jsonl")
    assert done.returncode == 0 and "exported 1 bundle (5 rows)" in done.stdout, done.stderr
    (part,) = (tmp_path / "p").rglob("*.jsonl")
    assert part.parent.name == "step=2" and len(part.read_text().splitlines()) == PER_STEP
    out = tmp_path / "q"
    assert cli(str(root), "-o", str(out), "--with-images").returncode == 0
    (got,) = list(out.rglob("*.parquet"))
    with bundles.open_bundle(run["run"] / "rollout" / "fully_async_2") as b:
        want = [r for x in b.to_arrow(media=True) for r in x.to_pylist()]
    rows = pq.read_table(got).to_pylist()
    assert [r["images"] for r in rows] == [r["images"] for r in want]
    assert {r["bundle_id"] for r in rows} == {r["bundle_id"] for r in want}  # one identity, either copy


def test_out_on_seaweedfs_publishes_each_part_in_one_put(run: dict[str, Any], weed: Any) -> None:
    import pyarrow.parquet as pq

    url = f"s3://{weed.current}/datasets/run1"
    import obstore

    obstore.put(weed.client(), "datasets/run1/README", b"mine")
    done = cli(str(run["run"]), "-o", url, "--kind", "rollout")
    assert done.returncode == 0 and "exported 3 bundles (15 rows)" in done.stdout, done.stderr
    objects = weed.contents("datasets/run1/")
    parts = sorted(k for k in objects if k.endswith(".parquet"))
    assert [k.split("/")[2:4] for k in parts] == [["kind=rollout", f"step={s}"] for s in STEPS]
    assert objects["datasets/run1/README"] == b"mine"
    rewards = sorted(
        r for k in parts for r in pq.read_table(io.BytesIO(objects[k])).column("reward").to_pylist()
    )
    assert sum(rewards) / len(rewards) == pytest.approx(sum(run["avg"].values()) / len(STEPS))
    again = cli(str(run["run"]), "-o", url, "--kind", "rollout")
    assert again.returncode == 0 and "skipped 3 already exported" in again.stdout


def test_root_on_seaweedfs_exports_to_a_local_directory(
    run: dict[str, Any], weed: Any, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    root = f"s3://{weed.current}/runs/r1"
    samples = [sample(1, i, run["media"]) for i in range(PER_STEP)]  # the same samples as fully_async_1
    bundles.write_bundle(f"{root}/rollout/fully_async_1", samples, media_roots=[run["media"]], kind="rollout",
                         meta={"rollout_id": 1})  # fmt: skip
    done = cli(root, "-o", str(tmp_path / "out"), "--with-images")
    assert done.returncode == 0 and "exported 1 bundle (5 rows)" in done.stdout, done.stderr
    (part,) = (tmp_path / "out" / "kind=rollout" / "step=1").glob("*.parquet")
    rows = pq.read_table(part).to_pylist()
    with bundles.open_bundle(run["run"] / "rollout" / "fully_async_1") as b:
        want = [r for x in b.to_arrow(media=True) for r in x.to_pylist()]
    assert [r["images"] for r in rows] == [r["images"] for r in want]
    assert [r["reward"] for r in rows] == [r["reward"] for r in want]


def test_an_unknown_column_is_refused_before_anything_is_read(run: dict[str, Any], tmp_path: Path) -> None:
    done = cli(str(run["run"]), "-o", str(tmp_path / "x"), "--columns", "reward,rewrd")
    assert done.returncode == 1 and not (tmp_path / "x").exists()
    assert "export: --columns: expected names among bundle_id, bundle, kind" in done.stderr
    assert "found ['rewrd']" in done.stderr


def test_a_bundle_failing_mid_part_leaves_no_part_and_the_others_are_exported(
    run: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "run"
    shutil.copytree(run["run"] / "rollout", root)
    with bundles.open_bundle(root / "fully_async_1") as b:
        name = b.media[-1].filename  # read while its part's temporary file is open
    victim = root / "fully_async_1" / "media" / name
    os.chmod(victim, 0o644)
    victim.write_bytes(victim.read_bytes()[:-1] + b"\0")
    out = tmp_path / "out"
    done = cli(str(root), "-o", str(out), "--with-images")
    assert done.returncode == 1 and "exported 2 bundles (10 rows)" in done.stdout
    assert f"not exported: {root / 'fully_async_1'}" in done.stderr and name in done.stderr
    assert sorted(p.parent.name for p in out.rglob("*.parquet")) == ["step=0", "step=2"]
    assert sorted(p.name for p in out.rglob("*") if p.is_file() and p.suffix != ".parquet") == []


def test_a_nan_or_infinite_reward_is_never_an_sft_success(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    root = tmp_path / "nan-run"
    rows = [{"index": i, "prompt": "p", "response": f"r{i}", "status": "completed", "reward": r}
            for i, r in enumerate([float("nan"), float("inf"), 0.5, float("-inf")])]  # fmt: skip
    bundles.write_bundle(root / "b", rows, kind="rollout", meta={"rollout_id": 1})
    for extra in ([], ["--min-reward", "0.1"]):
        out = tmp_path / f"sft{len(extra)}"
        done = cli(str(root), "-o", str(out), "--format", "sft", *extra)
        assert done.returncode == 0, done.stderr
        assert pq.read_table(out, partitioning="hive").column("position").to_pylist() == [2]


def test_jsonl_parts_are_strict_json_with_non_finite_floats_null(tmp_path: Path) -> None:
    import json

    pl = pytest.importorskip("polars")
    root = tmp_path / "inf-run"
    rows = [{"index": i, "status": "completed", "reward": r, "rollout_log_probs": [r, -0.5]}
            for i, r in enumerate([float("nan"), float("inf"), 0.5])]  # fmt: skip
    bundles.write_bundle(root / "b", rows, kind="rollout", meta={"rollout_id": 1})
    done = cli(str(root), "-o", str(tmp_path / "j"), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    (part,) = (tmp_path / "j").rglob("*.jsonl")
    for line in part.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in {part}"))
    got = pl.read_ndjson(part)
    assert got["reward"].to_list() == [None, None, 0.5]
    assert got["rollout_log_probs"].to_list() == [[None, -0.5], [None, -0.5], [0.5, -0.5]]


def test_another_format_or_options_into_the_same_out_is_not_taken_as_exported(
    run: dict[str, Any], tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    root, out = run["run"] / "rollout", tmp_path / "same"
    assert cli(str(root), "-o", str(out)).returncode == 0
    done = cli(str(root), "-o", str(out), "--format", "sft")
    assert done.returncode == 0 and "exported 3 bundles (11 rows)" in done.stdout, done.stdout
    assert "skipped 0 already exported" in done.stdout
    parts = sorted(out.rglob("*.parquet"))
    assert len(parts) == 6 and len({p.name.rsplit("-", 1)[1] for p in parts}) == 2
    sft = [p for p in parts if "messages" in pq.read_schema(p).names]
    assert len(sft) == 3 and sum(pq.read_metadata(p).num_rows for p in sft) == 11
    again = cli(str(root), "-o", str(out), "--format", "sft")
    assert "exported 0 bundles" in again.stdout and "skipped 3 already exported" in again.stdout


def test_a_part_over_the_limit_is_refused_before_its_put_naming_bundle_and_size(
    run: dict[str, Any], weed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bundles._commands import exporting

    monkeypatch.setattr(exporting, "MAX_EXPORT_PART_BYTES", 1000)  # the images make a part ~10 kB
    url = f"s3://{weed.current}/datasets/big"
    where = str(run["run"] / "rollout" / "fully_async_0")
    report = exporting.export_run(where, url, with_images=True, progress=False)
    ((location, message),) = report.problems
    assert location == where and report.written == []
    assert message.startswith(f"{where}: its part kind=rollout/step=0/part-")
    assert "bytes: expected at most MAX_EXPORT_PART_BYTES = 1000" in message
    assert not [k for k in weed.contents("datasets/big/") if k.endswith(".parquet")]


def test_workers_export_what_one_process_exports_and_report_it_in_the_same_order(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """``jobs=2`` (two spawned workers, a bundle each at a time) against ``jobs=1``: the same parts
    with the same rows, the same report (written in the order the bundles were found, the damaged
    bundle's problem named; of two copies of one bundle, either may be the part, and the report
    names the other skipped), and a second export by workers skips every part."""
    import shutil

    import pyarrow.parquet as pq

    from bundles._commands.exporting import export_run

    root = tmp_path / "run"
    shutil.copytree(run["run"], root)
    # A second copy of fully_async_2 (its packed file): one part, the copy found second skipped.
    bundles.pack_bundle(root / "rollout" / "fully_async_2", root / "rollout" / "fully_async_2.rbundle")
    damaged = root / "rollout" / "fully_async_1"
    shard = next((damaged / "samples").iterdir())
    os.chmod(shard, 0o644)
    shard.write_bytes(b"\0" * shard.stat().st_size)
    reports = {}
    for jobs in (1, 2):
        out = tmp_path / f"out{jobs}"
        reports[jobs] = export_run(str(root), str(out), jobs=jobs, progress=False)
    one, two = reports[1], reports[2]
    rel = lambda paths, jobs: [os.path.relpath(p, tmp_path / f"out{jobs}") for p in paths]  # noqa: E731
    assert rel(two.written, 2) == rel(one.written, 1) and len(one.written) == 3
    copies = [str(root / "rollout" / "fully_async_2"), str(root / "rollout" / "fully_async_2.rbundle")]
    assert (one.rows, one.skipped, one.filtered) == (12, copies[1:], 0)  # one process: the copy found first
    # Workers may export both copies at once: the one finished first is the part, the other skipped.
    assert (two.rows, two.filtered) == (12, 0) and len(two.skipped) == 1 and two.skipped[0] in copies
    assert [w for w, _ in two.problems] == [w for w, _ in one.problems] == [str(damaged)]
    assert two.problems[0][1] == one.problems[0][1] and "samples" in one.problems[0][1]
    for a, b in zip(one.written, two.written, strict=True):
        ta, tb = pq.read_table(a), pq.read_table(b)
        assert ta.drop_columns(["bundle"]).equals(tb.drop_columns(["bundle"]))
        if "step=2" in a:  # the part of the copy the report does not name skipped
            (winner,) = set(tb.column("bundle").to_pylist())
            assert winner in copies and winner not in two.skipped
        else:
            assert ta.equals(tb)
    sft = {
        j: export_run(str(root), str(tmp_path / f"sft{j}"), fmt="sft", jobs=j, progress=False) for j in (1, 2)
    }
    assert sft[2].conventions == sft[1].conventions and sum(sft[1].conventions.values()) == sft[1].rows
    assert sft[1].skipped == copies[1:] and len(sft[2].skipped) == 1 and sft[2].skipped[0] in copies
    again = export_run(str(root), str(tmp_path / "out2"), jobs=2, progress=False)
    assert again.written == [] and len(again.skipped) == 4
    assert [w for w, _ in again.problems] == [str(damaged)]


def test_a_copy_that_finishes_second_publishes_nothing_and_counts_nothing(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """Two copies of one bundle exported at once (workers, or two exports): the part is
    published create-only, so the copy that finishes second replaces nothing, is reported
    skipped, and counts no rows and no SFT conventions (the race made to happen: the second
    export runs whole while the first holds its finished, unpublished part)."""
    import pyarrow.parquet as pq

    from bundles._commands.exporting import export_run

    first = tmp_path / "first"
    shutil.copytree(run["run"] / "rollout" / "fully_async_2", first)
    second = tmp_path / "second.rbundle"
    bundles.pack_bundle(first, second)
    out = tmp_path / "out"
    inner: list[Any] = []

    def meanwhile(rel: str) -> None:
        if not inner:  # the first export's pass; the second's own pass finds it set
            inner.append(None)
            inner[0] = export_run(str(second), str(out), fmt="sft", progress=False)

    with bundles.support.on_fault_point("export.written", meanwhile):
        outer = export_run(str(first), str(out), fmt="sft", progress=False)
    (won,) = inner
    assert len(won.written) == 1 and won.rows > 0 and sum(won.conventions.values()) == won.rows
    assert (outer.written, outer.skipped, outer.rows, outer.problems) == ([], [str(first)], 0, [])
    assert sum(outer.conventions.values()) == 0
    (part,) = out.rglob("*.parquet")
    assert str(part) == won.written[0]
    assert pq.read_table(part).num_rows == won.rows
    assert not [p for p in out.rglob("*") if p.is_file() and p != part]  # no scratch left


def test_a_packed_bundle_given_as_the_root_is_exported_and_another_file_is_a_problem(
    run: dict[str, Any], tmp_path: Path
) -> None:
    packed = tmp_path / "one.rbundle"
    bundles.pack_bundle(run["run"] / "rollout" / "fully_async_0", packed)
    done = cli(str(packed), "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "exported 1 bundle" in done.stdout and len(list((tmp_path / "out").rglob("*.parquet"))) == 1
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    done = cli(str(notes), "-o", str(tmp_path / "out2"))
    assert done.returncode == 1 and f"{notes}: not a bundle, nor a directory to look into" in done.stderr
    assert notes.read_text() == "mine"


def test_an_eexist_while_a_part_is_written_is_a_problem_and_a_link_at_its_name_is_left(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """Only the publishing rename finding the part there means "skipped": an EEXIST raised while
    the part is written is the bundle's problem; a symbolic link (even dangling) at a part's name
    is a problem too, and is left as it is."""
    import errno

    from bundles._commands.exporting import export_run

    where = str(run["run"] / "rollout" / "fully_async_0")
    out = tmp_path / "out"

    def fail(rel: str) -> None:
        raise OSError(errno.EEXIST, "File exists", "/somewhere/else")

    with bundles.support.on_fault_point("export.written", fail):
        report = export_run(where, str(out), progress=False)
    assert report.skipped == [] and report.written == [] and report.rows == 0
    ((location, message),) = report.problems
    assert location == where and "File exists" in message
    assert not [p for p in out.rglob("*") if p.is_file()]  # its temporary file removed
    done = export_run(where, str(out), progress=False)
    (part,) = (Path(p) for p in done.written)
    part.unlink()
    part.symlink_to(tmp_path / "gone.parquet")
    again = export_run(where, str(out), progress=False)
    assert again.skipped == [] and again.written == []
    assert again.problems == [
        (where, f"{part}: expected a part (a file) or nothing, found something else; left as it is")
    ]
    assert part.is_symlink() and os.readlink(part) == str(tmp_path / "gone.parquet")


def test_jobs_below_one_is_refused(run: dict[str, Any], tmp_path: Path) -> None:
    done = cli(str(run["run"]), "-o", str(tmp_path / "x"), "--jobs", "0")
    assert done.returncode == 2 and "--jobs: expected an int >= 1, found '0'" in done.stderr
    assert not (tmp_path / "x").exists()


def test_a_worker_killed_mid_part_fails_the_export_by_name_and_the_next_export_finishes(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """A worker SIGKILLed with its part written but not yet published (a real kill point, armed
    in every worker by the environment): the export fails naming the bundles in flight, no half
    part is left to be skipped by mistake, and the next export publishes every part."""
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    out.mkdir()
    (out / "NOTES.txt").write_text("mine")
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROLLOUT_BUNDLES_KILL_AT": "export.written@1"}
    done = subprocess.run([sys.executable, "-m", "bundles.cli", "export", str(run["run"]), "-o", str(out),
                           "--jobs", "2"], capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "a worker process died (killed, or out of memory) while exporting one of" in done.stderr
    assert str(run["run"] / "rollout") in done.stderr and "Traceback" not in done.stderr
    assert list(out.rglob("*.parquet")) == []  # each worker was killed before its first publish
    again = cli(str(run["run"]), "-o", str(out), "--jobs", "2")
    assert again.returncode == 0, again.stderr
    assert "exported 4 bundles (17 rows)" in again.stdout
    parts = list(out.rglob("*.parquet"))
    assert len(parts) == 4 and sum(pq.read_metadata(p).num_rows for p in parts) == 17
    assert (out / "NOTES.txt").read_text() == "mine"
    leftovers = [
        p for p in out.rglob("*") if p.is_file() and p.suffix != ".parquet" and p.name != "NOTES.txt"
    ]
    assert leftovers == []


def test_a_destination_that_cannot_be_is_one_error_whatever_the_jobs(
    run: dict[str, Any], tmp_path: Path
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    for jobs in ("1", "2"):
        done = cli(str(run["run"]), "-o", "s3:///no-bucket/x", "--jobs", jobs)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert "s3:///no-bucket/x" in done.stderr and "bucket" in done.stderr
        done = cli(str(run["run"]), "-o", str(a_file / "out"), "--jobs", jobs)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        done = cli(str(run["run"]), "-o", str(a_file), "--jobs", jobs)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert f"-o {a_file}: expected a directory (or none yet), found a file" in done.stderr
    assert a_file.read_text() == "mine"
