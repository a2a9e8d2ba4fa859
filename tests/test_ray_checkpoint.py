"""Saving a rollout checkpoint from inside a real (local) Ray actor, as Miles' rollout manager does."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import digest_of

from bundles import MediaRef, open_bundle
from trainer_hooks import load_rollout_checkpoint, parse_args, release_run_media, run_media_dir

pytestmark = pytest.mark.ray


def test_actor_saves_then_driver_releases_run_dir_and_resumes(tmp_path, ray_local):
    ray = ray_local
    argv = [
        "--shared-media-dir",
        str(tmp_path / "shared"),
        "--run-uuid",
        "run-a",
        "--save",
        str(tmp_path / "ckpt"),
        "--load",
        str(tmp_path / "ckpt"),
        "--rollout-batch-size",
        "2",
    ]

    # Defined here so that Ray ships the class by value; the worker imports trainer_hooks itself.
    @ray.remote(num_cpus=0)
    class RolloutManager:
        def __init__(self, argv: list[str]) -> None:
            import asyncio

            from trainer_hooks import FullyAsyncRolloutFn, ListDataSource, Sample, parse_args, store_media
            from trainer_hooks.testing import png_bytes

            self.args = parse_args(argv)
            self.gate_open = False

            async def generate(args, group):
                gi = group[0].group_index
                while gi >= 2 and not self.gate_open:  # groups 2+ stay in flight
                    await asyncio.sleep(0.005)
                for s in group:
                    s.multimodal_inputs = {"images": [store_media(args, png_bytes(6, 6, (gi, s.index, 1)))]}
                    s.status = Sample.Status.COMPLETED
                return group

            groups = [
                [Sample(group_index=g, index=2 * g + i, prompt=f"p{g}") for i in range(2)] for g in range(4)
            ]
            self.fn = FullyAsyncRolloutFn(self.args, ListDataSource(groups), generate, max_in_flight=4)

        def run_and_save(self, rollout_id: int) -> dict[int, str]:
            self.fn.start()
            with self.fn._changed:
                self.fn._changed.wait_for(
                    lambda: len(self.fn.buffer) == 2 and len(self.fn._in_flight) == 2, 30
                )
            digests = {
                s.index: s.multimodal_inputs["images"][0].digest for g in self.fn.buffer.groups() for s in g
            }
            self.fn.save(rollout_id)  # returns at once; written by the actor's background thread
            return digests

        def flush(self) -> list[str]:
            self.fn.stop()
            return [str(p) for p in self.fn.flush()]

        def run_dir(self) -> str:
            from trainer_hooks import run_media_dir

            return str(run_media_dir(self.args))

    manager = RolloutManager.remote(argv)
    digests = ray.get(manager.run_and_save.remote(4), timeout=120)
    assert len(digests) == 4
    (path,) = ray.get(manager.flush.remote(), timeout=120)
    run_a = Path(ray.get(manager.run_dir.remote()))
    assert run_a.is_dir() and any(run_a.iterdir())
    ray.kill(manager)

    # The driver tears the run down: the actor's media directory is deleted.
    args_a = parse_args(argv)
    release_run_media(args_a)
    assert not run_a.exists()
    bundle = open_bundle(path, verify="full")
    assert bundle.meta["run_uuid"] == "run-a"
    assert bundle.meta["pending_group_sizes"] == [2, 2] and bundle.meta["completed_group_sizes"] == [2, 2]

    # A new run loads the checkpoint: media rehydrated into its own directory, same bytes.
    args_b = parse_args(["--rollout-batch-size", "1", *argv[:3], "run-b", *argv[4:]])
    pending, completed = load_rollout_checkpoint(args_b, 4)
    assert [[s.index for s in g] for g in pending] == [[4, 5], [6, 7]]
    assert all(
        s.multimodal_inputs is None or not s.multimodal_inputs.get("images") for g in pending for s in g
    )
    run_b = run_media_dir(args_b)
    for g in completed:
        for s in g:
            ref = s.multimodal_inputs["images"][0]
            assert isinstance(ref, MediaRef) and Path(ref.path).parent == run_b
            assert ref.digest == digests[s.index]
            assert digest_of(Path(ref.path).read_bytes()) == ref.digest
    release_run_media(args_b)
    open_bundle(path, verify="full")
