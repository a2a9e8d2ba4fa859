"""Issue 9 "done when": a Miles-shaped sample with an adapter, a reward spec, bf16 pixel values,
int64 grid sizes, a PIL image and a path string comes back with every field and type equal,
through a debug dump and through a checkpoint resumed in a new run (run media released in
between)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import trainer_args

from trainer_hooks import (
    AdapterRef,
    FullyAsyncRolloutFn,
    RewardSpec,
    Sample,
    load_debug_rollout_data,
    load_rollout_checkpoint,
    release_run_media,
    run_media_dir,
    save_debug_rollout_data,
    save_rollout_checkpoint,
    store_media,
)
from trainer_hooks.testing import png_bytes

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")


def make_sample(args: Any, i: int) -> Sample:
    screenshot = Image.new("RGB", (12, 8))
    screenshot.putdata([((x * 20 + i) % 256, y * 30, 99) for y in range(8) for x in range(12)])
    path = str(store_media(args, png_bytes(5, 4, (i, 7, 9))).path)  # a plain path string
    g = torch.Generator().manual_seed(i)
    return Sample(
        group_index=i // 2,
        index=i,
        rollout_id=3,
        prompt=[{"role": "user", "content": "<image><image> click OK"}],
        tokens=[151644, 8948, 198, 100 + i, 101, 102],
        multimodal_inputs={"images": [screenshot, path]},
        multimodal_train_inputs={
            "pixel_values": torch.randn(8, 1176, generator=g).to(torch.bfloat16),
            "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2]], dtype=torch.int64),
        },
        response="click(1, 2)",
        response_length=3,
        label="OK",
        reward={"score": 0.5 + i},
        loss_mask=[1, 1, 0],
        weight_versions=["4", "5"],
        rollout_log_probs=[-0.5, -0.25, -0.125],
        rollout_routed_experts=np.arange(30, dtype=np.int32).reshape(5, 3, 2),
        remove_sample=False,
        teacher_log_probs=[-0.4, -0.3, -0.2],
        status=Sample.Status.TRUNCATED,
        metadata={"source": "gui", "step": i},
        generate_function_path="my.generate",
        train_metadata={"loss": "grpo"},
        adapter=AdapterRef("math-lora", 2),
        reward_spec=RewardSpec(rm_type="math", custom_rm_path=None),
        routing_key=f"user-{i}",
        non_generation_time=0.75,
        spec_info=Sample.SpecInfo(3, 4, 1, 5),
        prefix_cache_info=Sample.PrefixCacheInfo(10, 40),
    )


def assert_same(a: Any, b: Any, where: str) -> None:
    """Equal values of the same type; a path string may point elsewhere (into the bundle or the
    new run's directory) but must name the same bytes."""
    if isinstance(a, Image.Image):
        assert isinstance(b, Image.Image), where
        assert (b.mode, b.size, b.tobytes()) == (a.mode, a.size, a.tobytes()), where
        return
    assert type(b) is type(a), f"{where}: {type(a).__name__} became {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (b.dtype, b.shape) == (a.dtype, a.shape) and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert b.dtype == a.dtype and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert list(b) == list(a), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(b) == len(a), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, str) and a.startswith("/") and Path(a).is_file():
        assert Path(b).read_bytes() == Path(a).read_bytes(), where
    else:
        assert b == a, where


def assert_samples_equal(originals: list[Sample], loaded: list[Any], paths: dict[str, bytes]) -> None:
    assert [type(s) for s in loaded] == [Sample] * len(originals)
    for orig, got in zip(originals, loaded, strict=True):
        for f in dataclasses.fields(Sample):
            a, b = getattr(orig, f.name), getattr(got, f.name)
            if f.name == "multimodal_inputs":
                shot, path = a["images"]
                got_shot, got_path = b["images"]
                assert_same(shot, got_shot, "multimodal_inputs.images[0]")
                assert type(got_path) is str and Path(got_path).read_bytes() == paths[path]
                continue
            assert_same(a, b, f.name)
        assert got.status is Sample.Status.TRUNCATED
        assert type(got.adapter) is AdapterRef and type(got.reward_spec) is RewardSpec


def test_through_a_debug_dump(tmp_path):
    args = trainer_args(
        tmp_path,
        "run-a",
        "--save-debug-rollout-data",
        str(tmp_path / "dumps" / "rollout_{rollout_id}.rbundle"),
        "--load-debug-rollout-data",
        str(tmp_path / "dumps" / "rollout_{rollout_id}.rbundle"),
    )
    samples = [make_sample(args, i) for i in range(3)]
    paths = {
        s.multimodal_inputs["images"][1]: Path(s.multimodal_inputs["images"][1]).read_bytes() for s in samples
    }
    save_debug_rollout_data(args, samples, 3, evaluation=False)
    release_run_media(args)  # the run's media are gone; the dump holds its own
    assert not any(Path(p).exists() for p in paths)
    loaded, _ = load_debug_rollout_data(args, 3)
    assert_samples_equal(samples, loaded, paths)
    assert all(Path(s.multimodal_inputs["images"][1]).is_relative_to(tmp_path / "dumps") for s in loaded)


def test_through_a_checkpoint_with_resume(tmp_path):
    args = trainer_args(tmp_path, "run-a")
    samples = [make_sample(args, i) for i in range(4)]
    paths = {
        s.multimodal_inputs["images"][1]: Path(s.multimodal_inputs["images"][1]).read_bytes() for s in samples
    }
    save_rollout_checkpoint(args, 2, [], [samples[:2], samples[2:]])
    release_run_media(args)

    args_b = trainer_args(tmp_path, "run-b")
    _, completed = load_rollout_checkpoint(args_b, 2)
    loaded = [s for g in completed for s in g]
    assert_samples_equal(samples, loaded, paths)
    run_b = run_media_dir(args_b)
    for s in loaded:  # media rehydrated into the new run, path strings and images alike
        assert Path(s.multimodal_inputs["images"][1]).parent == run_b
        assert Path(s.multimodal_inputs["images"][0].filename).parent == run_b

    # The same through FullyAsyncRolloutFn's background save and load.
    async def generate(args: Any, group: list[Any]) -> list[Any]:
        return group

    with FullyAsyncRolloutFn(args_b, lambda n: [], generate) as fn:
        for g in completed:
            fn.buffer.put(g)
        fn.save(5).result(timeout=60)
    release_run_media(args_b)
    args_c = trainer_args(tmp_path, "run-c")
    with FullyAsyncRolloutFn(args_c, lambda n: [], generate) as fn:
        fn.load(5)
        resumed = [s for g in fn.buffer.groups() for s in g]
    assert_samples_equal(samples, resumed, paths)
