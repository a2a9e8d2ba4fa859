"""trainer_hooks.miles against Miles' real classes: ``RolloutDataSourceWithBuffer`` (reading a
200-prompt JSONL file with a local tokenizer), ``FullyAsyncRolloutFn`` run through Miles'
``call_rollout_function`` (its background event loop, as ``RolloutManager`` runs it) and
``DefaultDataBuffer``. Generation is a scripted engine (tests/helpers/miles_run.py), as in Miles' own
fully-async tests. One save is one bundle holding the cursor and every group; a load restores
them in order; nested groups come back nested."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from helpers.miles_snapshot import REPO, require_miles

MILES = require_miles()

pytestmark = pytest.mark.torch

from helpers.miles_run import install_scripted_engine, make_tokenizer_dir, miles_args, write_prompts  # noqa: E402

import bundles  # noqa: E402
from trainer_hooks.checkpoints import read_rollout_checkpoint, save_rollout_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("miles-inputs")
    return make_tokenizer_dir(d / "tokenizer"), write_prompts(d / "prompts.jsonl", 200)


@pytest.fixture
def miles_rollout(monkeypatch):
    install_scripted_engine(monkeypatch)
    import miles.rollout.fully_async_rollout as fully_async
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function

    import trainer_hooks.miles as plugins

    made = []

    def make(args, fn_cls=None):
        ds = plugins.BundledDataSource(args)
        fn = (fn_cls or fully_async.FullyAsyncRolloutFn)(RolloutFnConstructorInput(args=args, data_source=ds))

        def step(rollout_id):
            return call_rollout_function(fn, RolloutFnTrainInput(rollout_id=rollout_id)).samples

        made.append((ds, fn))
        return ds, fn, step

    yield make
    # Stop the workers on Miles' background loop before the scripted engine is unpatched.
    from miles.utils.async_utils import run

    async def stop(task):
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    for ds, fn in made:
        if fn._worker is not None:
            run(stop(fn._worker))
        ds.close()


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def gids(groups):
    return [g[0].group_index for g in groups]


def test_one_bundle_holds_cursor_in_flight_completed_and_comes_back_in_order(inputs, tmp_path, miles_rollout):
    tok, prompts = inputs
    args = miles_args(tok, prompts, save=str(tmp_path / "ckpt"))
    ds, _fn, step = miles_rollout(args)
    trained = gids(step(0))
    assert len(set(trained)) == 4
    wait_for(lambda: ds.rollout_state.counts()["completed"] >= 2)
    path = ds.save(0).result()
    assert sorted(p.name for p in (tmp_path / "ckpt" / "rollout").iterdir()) == [
        "fully_async_0"
    ]  # one bundle
    b = bundles.open_bundle(path, verify="full")
    meta = b.meta
    assert meta["checkpoint_version"] == 2 and b.kind == "rollout_checkpoint"
    cursor = meta["data_source"]
    sgi = cursor["sample_group_index"]
    assert cursor == {
        "sample_offset": sgi,
        "epoch_id": 0,
        "sample_group_index": sgi,
        "sample_index": 2 * sgi,
        "metadata": {},
    }
    saved = read_rollout_checkpoint(args, 0, root=args.save, sample_cls=dict)
    pending, completed = gids_of_dicts(saved.pending_groups), gids_of_dicts(saved.completed_groups)
    # One consistent cut: every group handed out before the cursor and not trained is in the
    # bundle exactly once (the worker kept running on Miles' loop while save() ran here).
    assert sorted(pending + completed) == [g for g in range(sgi) if g not in trained]
    assert completed and pending
    # In-flight groups are stored as handed out: no generation output.
    assert all(s["response"] == "" and s["tokens"] == [] for g in saved.pending_groups for s in g)
    assert all(s["response"].startswith("click") for g in saved.completed_groups for s in g)

    # Resume in a new run: completed train first, in-flight regenerate next, then new prompts.
    args2 = miles_args(tok, prompts, save=str(tmp_path / "ckpt2"), load=args.save)
    ds2, _fn2, step2 = miles_rollout(args2)
    ckpt = ds2.load(0)
    assert (ds2.sample_offset, ds2.sample_group_index, ds2.sample_index) == (sgi, sgi, 2 * sgi)
    assert gids(ds2.buffer) == gids(ckpt.pending_groups) == pending
    batch = gids(step2(1))  # Miles sorts a batch by index: compare sets
    assert set(completed[:4]) <= set(batch)
    if len(completed) >= 4:
        assert set(batch) == set(completed[:4])
    later = batch
    for rid in range(2, 2 + (len(pending) + len(completed)) // 4 + 2):  # enough steps for all of them
        later += gids(step2(rid))
    assert len(later) == len(set(later))  # nothing twice
    assert set(pending) | set(completed) <= set(later)  # nothing lost


def gids_of_dicts(groups):
    return [g[0]["group_index"] for g in groups]


def test_groups_drained_for_a_step_not_yet_saved_are_saved_as_completed(inputs, tmp_path, miles_rollout):
    """train_async drains step N+1 while step N trains; save(N) then comes after that drain. The
    groups of step N+1 are not in step N's weights: they must come back, ahead of the others."""
    tok, prompts = inputs
    args = miles_args(tok, prompts, save=str(tmp_path / "ckpt"))
    ds, _fn, step = miles_rollout(args)
    step0 = gids(step(0))
    step1 = gids(step(1))  # drained before save(0), as the asynchronous driver does
    saved = read_rollout_checkpoint(args, 0, root=ds.save(0).result().parent.parent, sample_cls=dict)
    completed = gids_of_dicts(saved.completed_groups)
    assert completed[:4] == step1 and not set(step0) & set(completed + gids_of_dicts(saved.pending_groups))
    assert saved.meta["consumed_after_checkpoint"] == 4
    # Saving step 1 forgets them: they are in step 1's weights now.
    saved1 = read_rollout_checkpoint(args, 1, root=ds.save(1).result().parent.parent, sample_cls=dict)
    assert not set(step1) & set(gids_of_dicts(saved1.completed_groups) + gids_of_dicts(saved1.pending_groups))


def test_recycled_groups_are_saved_and_retried_with_our_rollout_function(
    inputs, tmp_path, monkeypatch, miles_rollout
):
    import trainer_hooks.miles as plugins

    tok, prompts = inputs
    install_scripted_engine(monkeypatch, abort_first_try=0.5, seed=3)
    args = miles_args(tok, prompts, save=str(tmp_path / "ckpt"), custom_async_data_buffer_path=None)
    _ds, fn, step = miles_rollout(args, fn_cls=plugins.FullyAsyncRolloutFn)
    batches = step(0) + step(1)
    trained = gids(batches)
    assert any(g[0].metadata["tries"] > 1 for g in batches)  # aborted once, recycled, retried
    assert isinstance(fn._output, plugins.BundledDataBuffer)  # brought by our class without the option
    assert fn.save(1).result() is not None
    saved = read_rollout_checkpoint(args, 1, root=args.save, sample_cls=dict)
    kept = gids_of_dicts(saved.pending_groups + saved.completed_groups + saved.recycled_groups)
    assert len(kept) == len(set(kept)) and not set(kept) & set(trained)
    # Every group handed out before the saved cursor, once: trained, or in the bundle.
    assert sorted(kept + trained) == list(range(saved.data_source_state["sample_group_index"]))


def test_fully_async_without_our_buffer_refuses_to_save(inputs, tmp_path, miles_rollout):
    tok, prompts = inputs
    args = miles_args(tok, prompts, save=str(tmp_path / "ckpt"), custom_async_data_buffer_path=None)
    ds, _fn, step = miles_rollout(args)
    step(0)
    with pytest.raises(
        ValueError, match=r"--custom-async-data-buffer-path trainer_hooks.miles.BundledDataBuffer"
    ):
        ds.save(0)


def test_load_refuses_a_missing_checkpoint_when_others_exist(inputs, tmp_path, miles_rollout):
    tok, prompts = inputs
    args = miles_args(tok, prompts, save=str(tmp_path / "ckpt"))
    ds, _fn, step = miles_rollout(args)
    step(0)
    ds.save(0).result()
    args2 = miles_args(tok, prompts, load=args.save)
    ds2, _, _ = miles_rollout(args2)
    with pytest.raises(
        FileNotFoundError, match=r"fully_async_3: no committed rollout checkpoint .* rollouts \[0\]"
    ):
        ds2.load(3)
    # A run without any bundle falls back to Miles' own cursor file (absent here: fresh start).
    args3 = miles_args(tok, prompts, load=str(tmp_path / "nothing"))
    ds3, _, _ = miles_rollout(args3)
    assert ds3.load(5) is None and ds3.sample_offset == 0


def test_nested_groups_are_stored_nested_and_come_back_nested(tmp_path):
    from miles.utils.types import Sample

    def s(i, turn):
        return Sample(
            group_index=1, index=i, prompt=f"p{i}", response=f"turn {turn}", status=Sample.Status.COMPLETED
        )

    nested = [[s(0, 0), s(0, 1)], [s(1, 0)], s(2, 0)]  # two trajectories and a bare sample
    flat = [s(3, 0), s(4, 0)]
    args = miles_args(tmp_path, tmp_path, save=str(tmp_path / "ckpt"), load=str(tmp_path / "ckpt"))
    path = save_rollout_checkpoint(args, 7, [], [nested, flat])
    meta = bundles.open_bundle(path).meta
    assert meta["completed_group_sizes"] == [[2, 1, None], 2] and meta["checkpoint_version"] == 2
    ckpt = read_rollout_checkpoint(args, 7)
    got_nested, got_flat = ckpt.completed_groups
    assert [type(x) for x in got_nested] == [list, list, Sample]
    assert [[t.response for t in got_nested[0]], got_nested[1][0].index, got_nested[2].index] == [
        ["turn 0", "turn 1"],
        1,
        2,
    ]
    assert [x.index for x in got_flat] == [3, 4]
    # A flat-only checkpoint stays version 1, readable by older readers.
    assert bundles.open_bundle(save_rollout_checkpoint(args, 8, [], [flat])).meta["checkpoint_version"] == 1


def test_importing_the_plugins_without_miles_says_so_in_one_line():
    code = "import sys; sys.modules['miles'] = None\nfrom trainer_hooks.miles import BundledDataSource"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0
    assert last.startswith("ImportError: trainer_hooks.miles needs Miles importable")
