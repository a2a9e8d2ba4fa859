"""Debug rollout dumps as bundles: Miles' templates, eval naming, subsample, packed files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import digest_of, trainer_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import PACK_SUFFIX, BundleError, BundleFormatError, MediaRef, open_bundle
from trainer_hooks import (
    Sample,
    load_debug_rollout_data,
    parse_args,
    release_run_media,
    save_debug_rollout_data,
    store_media,
)
from trainer_hooks.testing import png_bytes


def make_args(tmp_path: Path, template: str, *extra: str):
    """A run that dumps to (and loads from) ``tmp_path/dumps/<template>``, no checkpoints."""
    return trainer_args(tmp_path, "run-a", *extra, checkpoints=False, dumps=template)


def samples(args, n: int, start: int = 0) -> list[Sample]:
    out = []
    for i in range(start, start + n):
        ref = store_media(args, png_bytes(3, 3, (i % 256, 1, 2)))
        out.append(
            Sample(
                index=i,
                prompt=f"p{i}",
                tokens=[i, i + 1],
                multimodal_inputs={"images": [ref]},
                multimodal_train_inputs={"image_grid_thw": np.array([[1, 2, 2]])},
                reward=float(i),
                status=Sample.Status.COMPLETED,
            )
        )
    return out


@pytest.mark.parametrize(
    "template", ["rollout_{rollout_id}", "rollout_{rollout_id}" + PACK_SUFFIX], ids=["directory", "packed"]
)
def test_round_trip_survives_release_of_the_run_media(tmp_path, template):
    args = make_args(tmp_path, template, "--bf16")
    data = samples(args, 4)
    digests = [s.multimodal_inputs["images"][0].digest for s in data]
    path = save_debug_rollout_data(args, data, 3, evaluation=False, metadata={"step": 3, "note": "x"})
    assert path == tmp_path / "dumps" / template.format(rollout_id=3)
    assert path.is_file() == template.endswith(PACK_SUFFIX)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    release_run_media(args)

    loaded, metadata = load_debug_rollout_data(args, 3)
    assert metadata == {"step": 3, "note": "x"}
    assert [s.index for s in loaded] == [0, 1, 2, 3]
    for s, digest in zip(loaded, digests, strict=True):
        ref = s.multimodal_inputs["images"][0]
        assert isinstance(ref, MediaRef) and ref.digest == digest
        assert digest_of(Path(ref.path).read_bytes()) == digest
        assert s.status is Sample.Status.COMPLETED
        assert s.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 2, 2]]
    if template.endswith(PACK_SUFFIX):
        # Unpacked once into a cache directory beside the file, reused while the file is unchanged.
        cache = Path(loaded[0].multimodal_inputs["images"][0].path).parents[1]
        assert cache.parent == path.parent and cache.name.startswith(f".{path.name}.")
        again, _ = load_debug_rollout_data(args, 3)
        assert again[0].multimodal_inputs["images"][0].path == loaded[0].multimodal_inputs["images"][0].path
    else:
        bundle = open_bundle(path, verify="full")
        assert bundle.kind == "debug_dump"
        assert bundle.meta["rollout_id"] == 3 and bundle.meta["evaluation"] is False
        assert bundle.meta["training_dtype"] == "bf16" and bundle.meta["run_uuid"] == "run-a"


def test_eval_naming_and_flattening(tmp_path):
    args = make_args(tmp_path, "dump_{rollout_id}")
    data = {"math": {"samples": samples(args, 2)}, "gui": {"samples": samples(args, 3, start=10)}}
    path = save_debug_rollout_data(args, data, 7, evaluation=True)
    assert path.name == "dump_eval_7"
    loaded, metadata = load_debug_rollout_data(args, "eval_7")
    assert [s.index for s in loaded] == [0, 1, 10, 11, 12]
    assert metadata == {}
    assert open_bundle(path).meta["rollout_id"] == "eval_7"


def test_groups_are_flattened_and_unset_template_is_a_no_op(tmp_path):
    args = make_args(tmp_path, "d_{rollout_id}")
    s = samples(args, 4)
    save_debug_rollout_data(args, [s[:2], s[2:]], 0, evaluation=False)
    assert [x.index for x in load_debug_rollout_data(args, 0)[0]] == [0, 1, 2, 3]
    off = parse_args(["--rollout-batch-size", "1"])
    assert save_debug_rollout_data(off, s, 0, evaluation=False) is None
    with pytest.raises(ValueError, match="--load-debug-rollout-data is not set"):
        load_debug_rollout_data(off, 0)


@pytest.mark.parametrize(
    ("n", "ratio", "expected"),
    [
        (10, 0.5, [0, 1, 7, 8, 9]),  # int(5): data[:2] + data[-3:] (-5 // 2 floors to -3)
        (10, 0.4, [0, 1, 8, 9]),
        (10, 1.0, list(range(10))),
        (3, 0.2, [0, 1, 2]),  # int(0.6) == 0: data[:0] + data[-0:] keeps everything, as in Miles
    ],
)
def test_subsample_keeps_first_and_last_halves(tmp_path, n, ratio, expected):
    args = make_args(tmp_path, "d_{rollout_id}", "--load-debug-rollout-data-subsample", str(ratio))
    save_debug_rollout_data(args, samples(args, n), 1, evaluation=False)
    loaded, _ = load_debug_rollout_data(args, 1)
    assert [s.index for s in loaded] == expected


def miles_subsample(data: list, ratio: float) -> list:
    """Miles' load_debug_rollout_data slicing (miles/ray/rollout/debug_data.py), verbatim."""
    rough_subsample_num_rows = int(len(data) * ratio)
    return data[: rough_subsample_num_rows // 2] + data[-rough_subsample_num_rows // 2 :]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(0, 40),
    ratio=st.floats(min_value=0.0, max_value=1.0, exclude_min=True, allow_nan=False),
)
def test_subsample_matches_miles_slicing_for_every_ratio(tmp_path_factory, n, ratio):
    root = tmp_path_factory.mktemp("sub")
    args = parse_args(
        ["--rollout-batch-size", "1", "--save-debug-rollout-data", str(root / "d_{rollout_id}"),
         "--load-debug-rollout-data", str(root / "d_{rollout_id}"),
         "--load-debug-rollout-data-subsample", repr(ratio)]
    )  # fmt: skip
    rows = [Sample(index=i, status=Sample.Status.COMPLETED) for i in range(n)]
    save_debug_rollout_data(args, rows, 0, evaluation=False)
    loaded, _ = load_debug_rollout_data(args, 0)
    assert [s.index for s in loaded] == [s.index for s in miles_subsample(rows, ratio)]


def test_mutation_after_save_and_metadata_must_be_json(tmp_path):
    args = make_args(tmp_path, "d_{rollout_id}")
    s = samples(args, 1)
    save_debug_rollout_data(args, s, 0, evaluation=False)
    s[0].tokens.append(5)
    assert load_debug_rollout_data(args, 0)[0][0].tokens == [0, 1]
    with pytest.raises(BundleError, match=r"d_1: meta\.metadata\.when: expected a JSON-compatible value"):
        save_debug_rollout_data(args, s, 1, evaluation=False, metadata={"when": object()})
    assert not (tmp_path / "dumps" / "d_1").exists()


def test_pil_images_in_dumps(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    args = make_args(tmp_path, "d_{rollout_id}" + PACK_SUFFIX)
    s = Sample(
        index=0,
        multimodal_inputs={"images": [Image.new("RGB", (6, 2), (1, 2, 3))]},
        status=Sample.Status.COMPLETED,
    )
    save_debug_rollout_data(args, [s], 0, evaluation=False)
    (loaded,), _ = load_debug_rollout_data(args, 0)
    img = loaded.multimodal_inputs["images"][0]
    assert isinstance(img, Image.Image) and img.size == (6, 2) and img.getpixel((5, 1)) == (1, 2, 3)


def test_loading_a_checkpoint_as_a_dump_names_the_kind(tmp_path):
    from bundles import write_bundle

    args = make_args(tmp_path, "d_{rollout_id}")
    write_bundle(tmp_path / "dumps" / "d_0", [{"status": "completed"}], kind="rollout_checkpoint")
    with pytest.raises(
        BundleFormatError, match=r"d_0: kind: expected 'debug_dump', found 'rollout_checkpoint'"
    ):
        load_debug_rollout_data(args, 0)


def test_trajectory_sidecar_is_miles_jsonl_next_to_the_dump(tmp_path):
    args = make_args(
        tmp_path,
        "rollout_{rollout_id}",
        "--save-debug-trajectory-data",
        str(tmp_path / "dumps" / "traj_{rollout_id}.jsonl"),
    )
    rows = samples(args, 3)
    rows[0].metadata = {"messages": [{"role": "user", "content": "hi"}], "source": "gui"}
    rows[0].group_index, rows[0].status = 4, Sample.Status.TRUNCATED
    rows[2].metadata = {"messages": [{"role": "assistant", "content": "ok"}]}
    rows[2].reward = {"score": 1.0}  # not a number: null in the sidecar
    save_debug_rollout_data(args, rows, 7, evaluation=False)

    lines = (tmp_path / "dumps" / "traj_7.jsonl").read_text().splitlines()
    assert lines[0] == (
        '{"sample_index":0,"group_index":4,"status":"truncated","reward":0.0,"prompt":"p0",'
        '"messages":[{"role":"user","content":"hi"}]}'
    )
    assert json.loads(lines[1]) == {
        "sample_index": 2,
        "group_index": None,
        "status": "completed",
        "reward": None,
        "prompt": "p2",
        "messages": [{"role": "assistant", "content": "ok"}],
    }
    assert len(lines) == 2
    # The sidecar is the messages' home: the dump leaves them out; the caller's samples keep them.
    loaded, _ = load_debug_rollout_data(args, 7)
    assert [s.metadata for s in loaded] == [{"source": "gui"}, {}, {}]
    assert rows[0].metadata["messages"] == [{"role": "user", "content": "hi"}]

    # Evaluation rollouts are named like their dump; no messages, no file.
    save_debug_rollout_data(args, {"math": {"samples": [rows[2]]}}, 8, evaluation=True)
    assert (tmp_path / "dumps" / "traj_eval_8.jsonl").is_file()
    save_debug_rollout_data(args, samples(args, 2), 9, evaluation=False)
    assert not (tmp_path / "dumps" / "traj_9.jsonl").exists()


def test_without_the_trajectory_option_messages_stay_in_the_dump(tmp_path):
    args = make_args(tmp_path, "rollout_{rollout_id}")
    rows = samples(args, 1)
    rows[0].metadata = {"messages": [{"role": "user", "content": "hi"}]}
    save_debug_rollout_data(args, rows, 1, evaluation=False)
    assert load_debug_rollout_data(args, 1)[0][0].metadata == {
        "messages": [{"role": "user", "content": "hi"}]
    }
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["rollout_1"]


def test_a_packed_dump_s_errors_name_the_file_and_leave_nothing_behind(tmp_path):
    args = make_args(tmp_path, "d_{rollout_id}" + PACK_SUFFIX)
    with pytest.raises(BundleError) as e:
        save_debug_rollout_data(args, [{"x": 1, "y": object()}], 0, evaluation=False)
    dump = tmp_path / "dumps" / ("d_0" + PACK_SUFFIX)
    assert str(e.value).startswith(f"{dump}: samples[0].y: values of type builtins.object cannot be stored")
    with pytest.raises(BundleError, match=rf"^{dump}: meta\.metadata\.a: expected a finite number"):
        save_debug_rollout_data(args, [{"x": 1}], 0, evaluation=False, metadata={"a": float("nan")})
    assert os.listdir(tmp_path / "dumps") == []  # the scratch directories were removed


def test_processes_loading_one_packed_dump_at_once_share_its_cache(tmp_path):
    # Replay's Ray actors load the same dump at the same moment: each may find no cache and
    # unpack; whoever commits second must use the first one's cache, not fail.
    import threading

    args = make_args(tmp_path, "d_{rollout_id}" + PACK_SUFFIX)
    save_debug_rollout_data(args, samples(args, 2), 0, evaluation=False)
    barrier = threading.Barrier(4)
    results: list[object] = []

    def load() -> None:
        barrier.wait()
        try:
            results.append(len(load_debug_rollout_data(args, 0)[0]))
        except Exception as e:  # collected and asserted below
            results.append(e)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [2, 2, 2, 2]
    assert len([n for n in os.listdir(tmp_path / "dumps") if n.endswith(".unpacked")]) == 1
