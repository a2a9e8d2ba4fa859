"""RunDisposer's ExitStack semantics, and the reference drivers' teardown order."""

from __future__ import annotations

import contextlib
import json
import threading
from argparse import Namespace
from pathlib import Path

import pytest
from helpers import trainer_args

from trainer_hooks import LEASE_NAME, RunDisposer, parse_args, read_lease, store_media, train, train_async
from trainer_hooks.testing import StandInRolloutManager, StandInTrainer

DRIVERS = [pytest.param(train, id="train"), pytest.param(train_async, id="train_async")]


# ---------------------------------------------------------------- RunDisposer


def test_callbacks_run_in_reverse_order() -> None:
    ran: list[int] = []
    with RunDisposer() as d:
        for i in range(3):
            d.callback(ran.append, i, name=f"step{i}")
    assert ran == [2, 1, 0]
    assert d.history == ["step2", "step1", "step0"]


def test_all_callbacks_run_and_the_first_error_is_raised_with_the_others_noted() -> None:
    ran: list[str] = []

    def fail(msg: str) -> None:
        ran.append(msg)
        raise RuntimeError(msg)

    d = RunDisposer()
    d.callback(ran.append, "first registered")
    d.callback(fail, "second failure", name="b")
    d.callback(ran.append, "middle")
    d.callback(fail, "first failure", name="a")
    with pytest.raises(RuntimeError, match="first failure") as info:
        d.close()
    assert ran == ["first failure", "middle", "second failure", "first registered"]
    assert [str(e) for e in info.value.teardown_errors] == ["second failure"]
    assert any("'b' also failed: RuntimeError: second failure" in n for n in info.value.__notes__)
    d.close()  # idempotent: nothing runs twice
    assert ran == ["first failure", "middle", "second failure", "first registered"]


def test_the_body_error_wins_and_teardown_errors_are_noted() -> None:
    ran: list[str] = []
    with pytest.raises(KeyError) as info, RunDisposer() as d:
        d.callback(ran.append, "cleanup")
        d.callback(lambda: (_ for _ in ()).throw(OSError("disk gone")), name="flaky")
        raise KeyError("loop")
    assert ran == ["cleanup"]
    assert any("'flaky' failed: OSError: disk gone" in n for n in info.value.__notes__)


def test_keyboard_interrupt_in_teardown_still_runs_the_rest() -> None:
    ran: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    d = RunDisposer()
    d.callback(ran.append, "release")
    d.callback(interrupt)
    with pytest.raises(KeyboardInterrupt):
        d.close()
    assert ran == ["release"]


def test_enter_context_and_no_registration_after_close() -> None:
    events: list[str] = []

    @contextlib.contextmanager
    def resource(name: str):
        events.append(f"enter {name}")
        yield name
        events.append(f"exit {name}")

    d = RunDisposer()
    assert d.enter_context(resource("a")) == "a"
    assert d.enter_context(resource("b"), name="b") == "b"
    d.close()
    assert events == ["enter a", "enter b", "exit b", "exit a"]
    with pytest.raises(RuntimeError, match="after close"):
        d.callback(print)


# ---------------------------------------------------------------- drivers


def _args(tmp_path: Path, *extra: str) -> Namespace:
    """Three rollouts of two, no run id given (the parser makes one), no checkpoints."""
    return trainer_args(tmp_path, None, "--num-rollout", "3", *extra, batch_size=2, checkpoints=False)


class _Recorder:
    """Factories sharing one event list; remembers the objects they built."""

    def __init__(self, manager_fail_at: int | None = None, actor_fail_at: int | None = None) -> None:
        self.events: list[str] = []
        self.manager: StandInRolloutManager | None = None
        self.actor: StandInTrainer | None = None
        self.manager_fail_at = manager_fail_at
        self.actor_fail_at = actor_fail_at
        self.run_dir_existed_at_release: bool | None = None

    def create_rollout_manager(self, args: Namespace) -> StandInRolloutManager:
        self.manager = StandInRolloutManager(args, events=self.events, fail_at=self.manager_fail_at)
        return self.manager

    def create_actor(self, args: Namespace) -> StandInTrainer:
        self.actor = StandInTrainer(args, events=self.events, fail_at=self.actor_fail_at)
        return self.actor

    def kwargs(self) -> dict[str, object]:
        return {"create_rollout_manager": self.create_rollout_manager, "create_actor": self.create_actor}


EXPECTED_TEARDOWN_TAIL = [
    "dispose_rollout_manager",
    "flush_pending_writes",
    "close_run_lease",
    "release_run_media",
]


@pytest.mark.parametrize("driver", DRIVERS)
def test_driver_trains_then_releases_media_last(tmp_path: Path, driver) -> None:
    args = _args(tmp_path)
    rec = _Recorder()
    report = driver(args, **rec.kwargs())
    assert report.trained_rollout_ids == [0, 1, 2]
    assert report.teardown[-4:] == EXPECTED_TEARDOWN_TAIL
    assert report.teardown[0] in ("close_actor", "shutdown_rollout_thread")
    assert rec.actor is not None and rec.actor.images_read == 6
    assert rec.manager is not None and rec.manager.media_present_at_dispose is True
    # Six distinct images were stored and then released with the run directory, and with them
    # the run marker (.run-media.json, about a hundred bytes).
    media = sum(m.size for m in {m.digest: m for m in rec.manager.media}.values())
    assert media > 0 and 0 < report.media_bytes_freed - media < 256
    assert not (tmp_path / "shared" / args.run_uuid).exists()
    assert (tmp_path / "shared").is_dir()
    assert rec.events.index("rollout_manager.dispose") < rec.events.index("rollout_manager.flush")
    assert rec.events.index("actor.close") < rec.events.index("rollout_manager.dispose")


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("where", ["actor", "rollout"])
def test_driver_releases_media_last_when_the_loop_raises(tmp_path: Path, driver, where: str) -> None:
    args = _args(tmp_path)
    rec = _Recorder(**({"actor_fail_at": 1} if where == "actor" else {"manager_fail_at": 1}))
    disposer = RunDisposer()
    with pytest.raises(
        RuntimeError, match=f"stand-in {'actor' if where == 'actor' else 'rollout'} failed at"
    ):
        driver(args, disposer=disposer, **rec.kwargs())
    assert disposer.history[-4:] == EXPECTED_TEARDOWN_TAIL
    assert disposer.history.count("release_run_media") == 1
    assert rec.manager is not None and rec.manager.media_present_at_dispose is True
    assert rec.manager.media  # media had been stored before the failure
    assert not (tmp_path / "shared" / args.run_uuid).exists()


@pytest.mark.parametrize("driver", DRIVERS)
def test_driver_releases_media_when_building_the_trainer_fails(tmp_path: Path, driver) -> None:
    args = _args(tmp_path)
    store_media(args, b"123", suffix=".bin")  # a leftover of this run's earlier attempt

    def broken_actor(args: Namespace) -> StandInTrainer:
        raise ValueError("no GPUs")

    disposer = RunDisposer()
    with pytest.raises(ValueError, match="no GPUs"):
        driver(args, create_actor=broken_actor, disposer=disposer)
    assert disposer.history == EXPECTED_TEARDOWN_TAIL
    assert not (tmp_path / "shared" / args.run_uuid).exists()


def test_train_async_overlaps_the_next_rollout_with_training(tmp_path: Path) -> None:
    args = _args(tmp_path, "--update-weights-interval", "2")
    events: list[str] = []
    started = {i: threading.Event() for i in range(3)}

    class Manager(StandInRolloutManager):
        def generate(self, rollout_id):  # type: ignore[no-untyped-def]
            started[rollout_id].set()
            return super().generate(rollout_id)

    overlapped: list[bool] = []

    class Trainer(StandInTrainer):
        def train(self, rollout_id, samples):  # type: ignore[no-untyped-def]
            # Training step 0 sees rollout 1 start meanwhile (a synchronous driver would not).
            if rollout_id == 0:
                overlapped.append(started[1].wait(timeout=10))
            super().train(rollout_id, samples)

    train_async(
        args,
        create_rollout_manager=lambda a: Manager(a, events=events),
        create_actor=lambda a: Trainer(a, events=events),
    )
    assert overlapped == [True]
    assert events.index("generate.end 2") < events.index("rollout_manager.dispose")
    assert events.count("actor.update_weights") == 2  # initial, then after step 1 (interval 2)


def test_train_does_not_overlap(tmp_path: Path) -> None:
    rec = _Recorder()
    train(_args(tmp_path), **rec.kwargs())
    assert rec.events.index("actor.train.end 0") < rec.events.index("generate.start 1")


def test_the_lease_is_held_while_the_loop_runs(tmp_path: Path) -> None:
    args = _args(tmp_path)
    seen: list[dict] = []

    class Peeking(StandInTrainer):
        def train(self, rollout_id, samples):  # type: ignore[no-untyped-def]
            lease = read_lease(tmp_path / "shared" / args.run_uuid)
            assert lease is not None
            seen.append(lease)
            super().train(rollout_id, samples)

    train(args, create_actor=Peeking)
    assert len(seen) == 3 and {lease["run_id"] for lease in seen} == {args.run_uuid}
    assert json.loads(json.dumps(seen[0]))["host"]  # plain JSON
    assert not (tmp_path / "shared" / args.run_uuid / LEASE_NAME).exists()


def test_driver_saves_like_miles(tmp_path: Path) -> None:
    args = _args(tmp_path, "--save", str(tmp_path / "ckpt"), "--save-interval", "2")
    rec = _Recorder()
    train(args, **rec.kwargs())
    saves = [e for e in rec.events if "save" in e]
    assert saves == [
        "actor.save_model 1",
        "rollout_manager.save 1",
        "actor.save_model 2",
        "rollout_manager.save 2",
    ]
    assert (tmp_path / "ckpt" / "rollout" / "global_dataset_state_dict_2.json").exists()


def test_driver_without_shared_media_dir_runs_with_no_lease(tmp_path: Path) -> None:
    args = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1"])

    class NoMedia(StandInRolloutManager):
        def generate(self, rollout_id):  # type: ignore[no-untyped-def]
            return []

    report = train(args, create_rollout_manager=NoMedia)
    assert report.media_bytes_freed == 0
    assert report.teardown[-3:] == ["dispose_rollout_manager", "flush_pending_writes", "release_run_media"]


def test_driver_refuses_a_used_disposer(tmp_path: Path) -> None:
    d = RunDisposer()
    d.callback(print)
    with pytest.raises(ValueError, match="must be empty"):
        train(_args(tmp_path), disposer=d)


def test_drivers_need_num_rollout_which_has_no_default_as_in_miles():
    args = parse_args(["--rollout-batch-size", "1"])
    assert args.num_rollout is None
    for driver in (train, train_async):
        with pytest.raises(ValueError, match="--num-rollout is not set"):
            driver(args)


# A first run in its own process: train two rollouts with the reference driver, pausing after the
# first rollout's screenshots (it prints "ready") until a line arrives on stdin.
FIRST_RUN = """
import sys
from trainer_hooks import parse_args, train
from trainer_hooks.testing import StandInRolloutManager

class Paused(StandInRolloutManager):
    def generate(self, rollout_id):
        samples = super().generate(rollout_id)
        if rollout_id == 0:
            print("ready", flush=True)
            sys.stdin.readline()
        return samples

args = parse_args(["--rollout-batch-size", "2", "--num-rollout", "2",
                   "--shared-media-dir", sys.argv[1], "--run-uuid", sys.argv[2]])
report = train(args, create_rollout_manager=Paused)
print("done", report.teardown[-1], report.trained_rollout_ids, flush=True)
"""


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_second_run_refused_its_lease_releases_nothing(tmp_path: Path, driver) -> None:
    """Issue 30 item 4: two launches with the same run id, each a real process. The second is
    refused at its start and its teardown deletes nothing of the first run's directory; the
    first run goes on storing screenshots and removes its own directory at its end. A driver of
    one's own that registers ``release_run_media`` before taking the lease (INTEGRATION.md §2)
    is refused the deletion too."""
    import subprocess
    import sys

    from trainer_hooks import RunMediaError, release_run_media

    shared = tmp_path / "shared"
    first = subprocess.Popen(
        [sys.executable, "-c", FIRST_RUN, str(shared), "same-run"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "ready"
        run_dir = shared / "same-run"
        media = sorted(p.name for p in run_dir.iterdir() if p.suffix == ".png")
        assert len(media) == 2

        second = trainer_args(tmp_path, "same-run", "--num-rollout", "2", checkpoints=False)
        disposer = RunDisposer()
        with pytest.raises(RunMediaError, match=r"already leased \(pid \d+ on .* is running"):
            driver(second, disposer=disposer)
        assert disposer.history == []  # nothing was registered: it acquired nothing
        with pytest.raises(RunMediaError, match=r"leased by another run \(pid \d+ .*not removing it"):
            release_run_media(second)
        assert sorted(p.name for p in run_dir.iterdir() if p.suffix == ".png") == media

        first.stdin.write("go\n")
        first.stdin.close()
        assert first.wait(timeout=60) == 0
        assert first.stdout.read().split() == ["done", "release_run_media", "[0,", "1]"]
        assert not run_dir.exists()  # the first run's own teardown removed it
    finally:
        if first.poll() is None:
            first.kill()
        first.wait(timeout=10)
