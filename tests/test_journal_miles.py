"""The rollout journal under the Miles plugins (issues 18 and 19): Miles' real data source,
``FullyAsyncRolloutFn`` (through ``call_rollout_function``, on Miles' background loop) and data
buffer, with a scripted engine. After a checkpoint at step 0, the run trains step 1 and keeps
generating; a resume from the trainer's step 0 gets back, without regenerating them, the groups
trained at step 1 and those finished after the checkpoint; nothing handed out is lost or doubled."""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers.miles_snapshot import require_miles

MILES = require_miles()

pytestmark = pytest.mark.torch

from helpers.miles_run import install_scripted_engine, make_tokenizer_dir, miles_args, write_prompts  # noqa: E402

from trainer_hooks.journal import journal_dir, scan_journal  # noqa: E402


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("miles-journal-inputs")
    return make_tokenizer_dir(d / "tokenizer"), write_prompts(d / "prompts.jsonl", 200)


@pytest.fixture
def miles_rollout(monkeypatch):
    install_scripted_engine(monkeypatch)
    import miles.rollout.fully_async_rollout as fully_async
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function

    import trainer_hooks.miles as plugins

    made = []

    def make(args):
        ds = plugins.BundledDataSource(args)
        fn = fully_async.FullyAsyncRolloutFn(RolloutFnConstructorInput(args=args, data_source=ds))

        def step(rollout_id):
            return call_rollout_function(fn, RolloutFnTrainInput(rollout_id=rollout_id)).samples

        made.append((ds, fn))
        return ds, fn, step

    yield make
    for ds, fn in made:
        if fn._worker is not None:
            stop_worker(fn)
        ds.close()


def stop_worker(fn):
    from miles.utils.async_utils import run

    async def stop(task):
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(stop(fn._worker))


def group_ids(groups):
    return [g[0].group_index for g in groups]


def test_a_resume_replays_the_journal_after_the_checkpoint(inputs, tmp_path, miles_rollout):
    tok, prompts = inputs
    save = str(tmp_path / "ckpt")
    args = miles_args(tok, prompts, save=save, rollout_journal_interval=0.05)
    ds, fn, step = miles_rollout(args)
    first = group_ids(step(0))
    ds.save(0).result()
    second = group_ids(step(1))  # trained into weights that are never saved
    deadline = time.monotonic() + 10
    while ds.rollout_state.counts()["completed"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    # The "crash": the worker stops handing out groups (a live worker would keep journaling takes
    # while the resume below reads the journal, and the cursor read here would be stale).
    stop_worker(fn)
    with ds.rollout_state.lock:  # what the journal has now is the crash state
        handed = ds.sample_group_index
        ds.rollout_state.ledger.flush()
        counts = ds.rollout_state.counts()
    records = scan_journal(journal_dir(save)).records
    assert {r.kind for r in records} >= {"take", "group", "consumed"}

    args2 = miles_args(tok, prompts, save=str(tmp_path / "ckpt2"), load=save, rollout_journal_interval=0.05)
    ds2, _, step2 = miles_rollout(args2)
    rec = ds2.load(0)  # the trainer restored step 0
    assert rec is not None and rec.stats["groups_returned"] == len(second)
    assert ds2.sample_group_index >= handed  # the cursor continues past every journaled hand-out
    buffered = [g for _, g in rec.completed]
    pending = [g.prompt for g in rec.pending]
    # Step 1's groups came back first, with their generations; nothing was lost or doubled.
    assert set(group_ids(buffered[: len(second)])) == set(second)  # Miles sorts a batch: compare sets
    assert all(s.response.startswith("click") for g in buffered for s in g)
    restored = group_ids(buffered) + group_ids(pending)
    assert len(restored) == len(set(restored))
    assert set(restored) | set(first) == set(range(handed))  # every group handed out, once
    assert not set(restored) & set(first)
    assert counts["completed"] + len(second) <= len(buffered)
    later = []
    for rid in (1, 2, 3):
        later += group_ids(step2(rid))
    assert len(later) == len(set(later)) and not set(later) & set(first)
    assert set(second) <= set(later)  # returned groups train again in the surviving lineage
