"""FullyAsyncRolloutFn: background generation, drain, automatic checkpoints, resume, drivers."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import pytest
from helpers import digest_of, trainer_args

from bundles import MediaRef, open_bundle
from trainer_hooks import (
    CheckpointSaveError,
    FullyAsyncRolloutFn,
    ListDataSource,
    RolloutWorkerError,
    RunDisposer,
    Sample,
    checkpoint_path,
    list_rollout_checkpoints,
    release_run_media,
    run_media_dir,
    store_media,
    train_async,
)
from trainer_hooks.testing import StandInTrainer, png_bytes


def prompts(n_groups: int, start: int = 0, size: int = 2) -> list[list[Sample]]:
    return [
        [Sample(group_index=g, index=g * size + i, prompt=f"prompt {g}") for i in range(size)]
        for g in range(start, start + n_groups)
    ]


class Generator:
    """Stores one image per sample in the run directory and answers; can be held at a gate."""

    def __init__(self, gate_from: int | None = None) -> None:
        self.gate = threading.Event()
        self.gate_from = gate_from
        self.started: list[int] = []
        self.lock = threading.Lock()

    async def __call__(self, args, group):
        gi = group[0].group_index
        with self.lock:
            self.started.append(gi)
        if self.gate_from is not None and gi >= self.gate_from:
            while not self.gate.is_set():
                await asyncio.sleep(0.005)
        for s in group:
            ref = store_media(args, png_bytes(4, 4, (gi % 256, s.index % 256, 3)))
            s.multimodal_inputs = {"images": [ref]}
            s.tokens = [1, 2, 3, s.index]
            s.response = f"answer {s.index}"
            s.response_length = 1
            s.reward = 1.0
            s.status = Sample.Status.COMPLETED
            await asyncio.sleep(0)
        return group


def test_drain_returns_batches_sorted_by_index(tmp_path):
    args = trainer_args(tmp_path, "run-a", batch_size=2)
    with FullyAsyncRolloutFn(args, ListDataSource(prompts(6)), Generator(), max_in_flight=4) as fn:
        seen = []
        for rid in range(3):
            groups = fn(rid)
            assert len(groups) == 2
            idx = [g[0].index for g in groups]
            assert idx == sorted(idx)
            seen += [g[0].group_index for g in groups]
            assert all(s.status is Sample.Status.COMPLETED for g in groups for s in g)
        assert sorted(seen) == list(range(6))
        with pytest.raises(RolloutWorkerError, match="exhausted"):
            fn.drain(timeout=5)


def test_save_holds_in_flight_and_buffered_groups_then_resume_in_new_run(tmp_path):
    args = trainer_args(tmp_path, "run-a", batch_size=2)
    gen = Generator(gate_from=4)  # groups 0-3 finish, 4 and 5 stay in flight
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(6)), gen, max_in_flight=6, max_buffered=6)
    first = fn(0)
    assert [g[0].group_index for g in first] == [0, 1]
    with fn._changed:  # wait until groups 2, 3 are buffered and 4, 5 in flight
        assert fn._changed.wait_for(lambda: len(fn.buffer) == 2 and len(fn._in_flight) == 2, timeout=10)
    buffered_media = {s.index: s.multimodal_inputs["images"][0] for g in fn.buffer.groups() for s in g}
    fut = fn.save(0)
    fn.stop()
    fn.flush()
    path = fut.result()
    assert path == checkpoint_path(args.save, 0)
    bundle = open_bundle(path, verify="full")
    assert bundle.meta["pending_group_sizes"] == [2, 2]
    assert bundle.meta["completed_group_sizes"] == [2, 2]
    fn.close()

    # Teardown of run A, then a new run resumes: pending first, then new prompts.
    release_run_media(args)
    # Another dataset: refused unless accepted by name (the fingerprint, docs/RESUME.md).
    args_b = trainer_args(tmp_path, "run-b", "--resume-accept-changes", "dataset", batch_size=2)
    gen_b = Generator()
    fn_b = FullyAsyncRolloutFn(args_b, ListDataSource(prompts(2, start=10)), gen_b, max_in_flight=2)
    fn_b.load(0)
    batch = fn_b(1)  # the restored completed groups come first
    assert [g[0].group_index for g in batch] == [2, 3]
    run_b = run_media_dir(args_b)
    for g in batch:
        for s in g:
            ref = s.multimodal_inputs["images"][0]
            assert isinstance(ref, MediaRef) and Path(ref.path).parent == run_b
            assert ref.digest == buffered_media[s.index].digest
            assert digest_of(Path(ref.path).read_bytes()) == ref.digest
    assert [g[0].group_index for g in fn_b(2)] == [4, 5]
    assert [g[0].group_index for g in fn_b(3)] == [10, 11]
    assert gen_b.started[:2] == [4, 5]  # resubmitted before any new prompt
    fn_b.close()


def test_a_mutated_buffered_group_is_saved_as_it_was(tmp_path):
    args = trainer_args(tmp_path, "run-a", batch_size=2)
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(2)), Generator(), max_in_flight=2)
    fn.start()
    with fn._changed:
        assert fn._changed.wait_for(lambda: len(fn.buffer) == 2, timeout=10)
    fn.stop()
    fn.save(0)
    for g in fn.buffer.groups():
        for s in g:
            s.tokens.append(-1)
            s.response = "changed"
    fn.close()
    bundle = open_bundle(checkpoint_path(args.save, 0))
    for row in bundle.samples():
        assert -1 not in row["tokens"] and row["response"].startswith("answer")


def test_generator_errors_surface_at_drain_and_the_group_stays_checkpointable(tmp_path):
    args = trainer_args(tmp_path, "run-a", batch_size=2)

    async def broken(args, group):
        raise ValueError("engine exploded")

    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(1)), broken)
    with pytest.raises(RolloutWorkerError, match="engine exploded"):
        fn.drain(timeout=10)
    fn.save(0)
    fn.close()
    assert open_bundle(checkpoint_path(args.save, 0)).meta["pending_group_sizes"] == [2]


def test_background_save_failure_surfaces_at_next_save(tmp_path):
    args = trainer_args(tmp_path, "run-a", batch_size=2)
    fn = FullyAsyncRolloutFn(args, ListDataSource([]), Generator())
    bad = Sample(
        index=0,
        status=Sample.Status.COMPLETED,
        multimodal_inputs={"images": [str(run_media_dir(args) / ("f" * 64 + ".png"))]},
    )
    fn.buffer.put([bad])
    fn.save(0).exception(timeout=30)
    with pytest.raises(CheckpointSaveError, match="rollout 0"):
        fn.save(1)
    fn.close()


def test_reference_driver_flushes_checkpoints_before_releasing_media(tmp_path):
    """train_async with the rollout function as its rollout manager: every step is checkpointed
    in the background, teardown flushes before release_run_media, and a new run resumes."""
    args = trainer_args(
        tmp_path,
        "run-a",
        "--num-rollout",
        "3",
        "--save-interval",
        "1",
        "--keep-rollout-checkpoints",
        "2",
        batch_size=2,
    )

    class Manager(FullyAsyncRolloutFn):
        def generate(self, rollout_id):  # the stand-in trainer takes a flat list of samples
            return [s for g in super().generate(rollout_id) for s in g]

    made: list[Manager] = []

    def create(a):
        made.append(Manager(a, ListDataSource(prompts(12)), Generator(), max_in_flight=4))
        return made[0]

    disposer = RunDisposer()
    report = train_async(
        args, create_rollout_manager=create, create_actor=StandInTrainer, disposer=disposer, lease_interval=60
    )
    assert report.trained_rollout_ids == [0, 1, 2]
    history = report.teardown
    assert history.index("dispose_rollout_manager") < history.index("flush_pending_writes")
    assert history.index("flush_pending_writes") < history.index("release_run_media") == len(history) - 1
    assert not run_media_dir(args).exists()
    assert sorted(list_rollout_checkpoints(args.save)) == [1, 2]
    for rid in (1, 2):
        open_bundle(checkpoint_path(args.save, rid), verify="full")

    args_b = trainer_args(tmp_path, "run-b", batch_size=2)
    fn_b = FullyAsyncRolloutFn(args_b, ListDataSource(prompts(12)), Generator())  # the same dataset
    fn_b.load(2)
    restored = fn_b.buffer.groups()
    assert restored
    trainer = StandInTrainer(args_b)
    trainer.train(3, [s for g in restored for s in g])  # reads and checks every image
    assert trainer.images_read == sum(len(g) for g in restored)
    fn_b.close()


def test_a_checkpoint_taken_while_a_group_is_half_generated_saves_it_as_submitted(tmp_path):
    """The generator has written a partial answer, tokens and an image into the group and is
    still running when save() is called: the checkpoint holds the prompt as the data source
    gave it, not the half-generated group (which a resume would then treat as the prompt)."""
    args = trainer_args(tmp_path, "run-a", batch_size=2)
    half_generated = threading.Event()
    release = threading.Event()

    async def generate(args, group):
        first = group[0]
        first.tokens = [7, 7, 7]
        first.response = "partial ans"
        first.response_length = 2
        first.multimodal_inputs = {"images": [store_media(args, png_bytes(4, 4, (1, 2, 3)))]}
        first.status = Sample.Status.TRUNCATED
        half_generated.set()
        while not release.is_set():  # an engine still decoding
            await asyncio.sleep(0.005)
        for s in group:
            s.response = f"answer {s.index}"
            s.status = Sample.Status.COMPLETED
        return group

    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(1)), generate, max_in_flight=1)
    fn.start()
    assert half_generated.wait(timeout=30), "the generator never started"
    fut = fn.save(0)
    release.set()
    (done,) = fn.drain(1, timeout=30)  # generation finishes after the snapshot ...
    assert done[0].response == "answer 0"
    fn.flush()
    fn.close()
    bundle = open_bundle(fut.result(), verify="full")
    # ... and the checkpoint holds the group as submitted: equal to a fresh copy of the prompt.
    assert bundle.meta["pending_group_sizes"] == [2] and bundle.meta["completed_group_sizes"] == []
    assert list(bundle.samples()) == [s.to_dict() for s in prompts(1)[0]]
    assert bundle.media == []


class _ReadmeManager(FullyAsyncRolloutFn):
    """The README's rollout manager (``create_rollout_manager=lambda a: fn``), noting each step
    drained."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drained: dict[int, threading.Event] = {}

    def step_drained(self, rollout_id):
        return self.drained.setdefault(rollout_id, threading.Event())

    def generate(self, rollout_id):
        try:
            return super().generate(rollout_id)
        finally:  # drained, or failed: the driver raises it
            self.step_drained(rollout_id).set()


def _readme_run(args, fn, trained, *, crash_at=None):
    """``train_async`` as the README runs it, with a trainer that records the groups of each step
    and returns from step N only once step N+1 is drained: ``save(N)`` then always finds N+1's
    groups out of the buffer (the overlap the driver has whenever generation keeps ahead)."""

    class Trainer:
        def __init__(self, args):
            pass

        def train(self, rollout_id, groups):
            if rollout_id == crash_at:
                raise RuntimeError(f"crash in step {rollout_id}")
            trained.append((rollout_id, sorted(g[0].group_index for g in groups)))
            if rollout_id + 1 < args.num_rollout:
                assert fn.step_drained(rollout_id + 1).wait(30), f"step {rollout_id + 1} never drained"

        def save_model(self, rollout_id):
            pass

        def update_weights(self):
            pass

    return train_async(args, create_rollout_manager=lambda a: fn, create_actor=Trainer, lease_interval=60)


@pytest.mark.parametrize("journal", ["1.0", "0"], ids=["journal", "no-journal"])
def test_train_async_resume_trains_the_groups_drained_during_the_saved_step_exactly_once(tmp_path, journal):
    """Issue 30, item 1: train_async drains step N+1 while step N trains, so at save(N) the groups
    of N+1 have left the buffer and are in no saved weights. A crash in step N+1 and the README's
    resume (a new run, ``--start-rollout-id N+1``, ``fn.load(N)``) trains each group once; before,
    N+1's groups were lost and the resumed run died with ``drain: expected 2 completed groups``."""
    common = ("--num-rollout", "6", "--save-interval", "2", "--rollout-journal-interval", journal)
    common += ("--keep-rollout-checkpoints", "2")
    trained: list[tuple[int, list[int]]] = []
    args = trainer_args(tmp_path, "run-a", *common, batch_size=2)
    fn = _ReadmeManager(args, ListDataSource(prompts(12)), Generator(), max_in_flight=4)
    with pytest.raises(RuntimeError, match="crash in step 4"):
        _readme_run(args, fn, trained, crash_at=4)
    assert [step for step, _ in trained] == [0, 1, 2, 3]

    args_b = trainer_args(tmp_path, "run-b", *common, "--start-rollout-id", "4", batch_size=2)
    fn_b = _ReadmeManager(args_b, ListDataSource(prompts(12)), Generator(), max_in_flight=4)
    fn_b.load(3)
    report = _readme_run(args_b, fn_b, trained)
    assert report.trained_rollout_ids == [4, 5]
    assert [step for step, _ in trained] == [0, 1, 2, 3, 4, 5]
    assert sorted(g for _, groups in trained for g in groups) == list(range(12))
    saved = open_bundle(checkpoint_path(args.save, 3), verify="full")
    assert saved.meta["consumed_after_checkpoint"] == 2  # step 4's groups, drained before save(3)


def test_train_async_resume_from_an_older_checkpoint_does_not_train_held_groups_twice(tmp_path):
    """The weights of step 5 were saved but its rollout checkpoint never committed: load(5) takes
    checkpoint 3 and the journal after it. Checkpoint 3 holds step 4's groups (drained before
    save(3)) as consumed by step 4; the restored weights include step 4, so they stay trained,
    and step 6's groups, drained before save(5), come back once."""
    common = ("--num-rollout", "8", "--save-interval", "2", "--keep-rollout-checkpoints", "2")
    trained: list[tuple[int, list[int]]] = []
    args = trainer_args(tmp_path, "run-a", *common, batch_size=2)
    fn = _ReadmeManager(args, ListDataSource(prompts(16)), Generator(), max_in_flight=4)
    with pytest.raises(RuntimeError, match="crash in step 6"):
        _readme_run(args, fn, trained, crash_at=6)
    held = open_bundle(checkpoint_path(args.save, 3)).meta["consumed_group_steps"]
    assert [step for _, step in held] == [4, 4]  # [group id, the step that took it]
    shutil.rmtree(checkpoint_path(args.save, 5))  # made by this test: as if its write never committed

    args_b = trainer_args(tmp_path, "run-b", *common, "--start-rollout-id", "6", batch_size=2)
    fn_b = _ReadmeManager(args_b, ListDataSource(prompts(16)), Generator(), max_in_flight=4)
    fn_b.load(5)
    _readme_run(args_b, fn_b, trained)
    assert [step for step, _ in trained] == list(range(8))
    assert sorted(g for _, groups in trained for g in groups) == list(range(16))


def test_groups_drained_for_the_next_step_are_saved_as_they_were_drained(tmp_path):
    """save(0) after drain(step=1) holds step 1's groups (snapshotted by the save, as drained):
    training changing them afterwards does not reach the checkpoint."""
    args = trainer_args(tmp_path, "run-a", batch_size=2)
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(4)), Generator(), max_in_flight=4)
    fn.drain(step=0)
    ahead = fn.drain(step=1)
    fut = fn.save(0)
    for g in ahead:
        for s in g:
            s.tokens.append(-1)
            s.response = "changed by training"
    fn.close()
    bundle = open_bundle(fut.result(), verify="full")
    assert bundle.meta["completed_group_sizes"] == [2, 2] and bundle.meta["consumed_after_checkpoint"] == 2
    assert [step for _, step in bundle.meta["consumed_group_steps"]] == [1, 1]
    rows = list(bundle.samples())
    assert sorted(r["group_index"] for r in rows) == [2, 2, 3, 3]
    assert all(-1 not in r["tokens"] and r["response"].startswith("answer") for r in rows)


def test_groups_are_held_for_the_last_two_steps_drained_and_a_save_says_what_it_missed(tmp_path, caplog):
    """Without saves nothing accumulates: drained groups are held for the last two steps. A save
    of a step older than that (a driver draining further ahead than the contract) logs which
    step's groups were released before it."""
    args = trainer_args(tmp_path, "run-a", batch_size=1)
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(5)), Generator(), max_in_flight=5)
    for step in range(5):
        fn.drain(step=step)
    with caplog.at_level("WARNING", logger="trainer_hooks.rollout._fully_async"):
        fut = fn.save(0)
    fn.close()
    assert "groups drained for step 2 were released before this save" in caplog.text
    held = open_bundle(fut.result()).meta["consumed_group_steps"]
    assert [step for _, step in held] == [3, 4]


def test_a_group_restored_from_the_journal_and_drained_ahead_is_saved_as_restored(tmp_path):
    """A resumed run's finished groups come back from the journal encoded; the ones drained for
    step 1 are decoded for training, and save(0) writes them decoded anew from the journal (its
    writer decodes on its own thread, later): what training did to the decoded samples, here
    even before the save, never reaches the checkpoint."""
    args = trainer_args(tmp_path, "run-a", batch_size=2)
    fn = FullyAsyncRolloutFn(args, ListDataSource(prompts(4)), Generator(), max_in_flight=4)
    fn.start()
    with fn._changed:
        assert fn._changed.wait_for(lambda: len(fn.buffer) == 4, timeout=10)
    fn.close()  # no checkpoint: the journal holds the four finished groups

    args_b = trainer_args(tmp_path, "run-b", batch_size=2)
    fn_b = FullyAsyncRolloutFn(args_b, ListDataSource(prompts(4)), Generator())
    fn_b.load(-1)
    fn_b.drain(step=0)
    ahead = fn_b.drain(step=1)
    for g in ahead:
        for s in g:
            s.tokens.append(-1)
    fut = fn_b.save(0)
    fn_b.close()
    bundle = open_bundle(fut.result(), verify="full")
    assert [step for _, step in bundle.meta["consumed_group_steps"]] == [1, 1]
    rows = list(bundle.samples())
    assert len(rows) == 4 and all(-1 not in r["tokens"] for r in rows)
