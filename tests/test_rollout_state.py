"""The rollout state (trainer_hooks.rollout.RolloutState) and nested group layouts, without
Miles: the events, the cut a save writes, consumption by step, the listener hook, and the
v2_nested test vector."""

from __future__ import annotations

from argparse import Namespace

import pytest

import bundles
from bundles import BundleFormatError
from trainer_hooks.checkpoints import read_rollout_checkpoint, save_rollout_checkpoint
from trainer_hooks.rollout import RolloutState

VECTORS = __import__("pathlib").Path(__file__).resolve().parent / "vectors"


def group(g, n=2, **kw):
    return [
        {"group_index": g, "index": 10 * g + i, "prompt": f"p{g}", "response": "", "status": "pending", **kw}
        for i in range(n)
    ]


def test_layouts_round_trip_flat_nested_and_mixed(tmp_path):
    groups = [group(0), [group(1, 2), group(2, 1), group(3, 1)[0]], [[], group(4, 3)]]
    args = Namespace(save=str(tmp_path), load=str(tmp_path))
    path = save_rollout_checkpoint(args, 0, [group(9)], groups)
    meta = bundles.open_bundle(path).meta
    assert meta["completed_group_sizes"] == [2, [2, 1, None], [0, 3]] and meta["pending_group_sizes"] == [2]
    back = read_rollout_checkpoint(args, 0, sample_cls=dict)
    assert back.completed_groups == groups and back.pending_groups == [group(9)]


def test_events_and_the_cut_a_save_writes(tmp_path):
    args = Namespace(save=str(tmp_path), rollout_batch_size=2, start_rollout_id=5)
    state = RolloutState(args)
    seen = []
    state.add_listener(lambda event, **payload: seen.append((event, payload.get("gid", payload.get("gids")))))
    a, b, c, d = group(0), group(1), group(2), group(3)
    assert state.handed_out([a, b, c, d], cursor={"sample_offset": 4}) == [0, 1, 2, 3]
    a[0]["response"] = "mutated after hand-out"  # generation mutates in place
    state.finished(a, a)
    state.finished(b, b)
    state.consumed(a)  # step 5 (first_step = --start-rollout-id)
    state.consumed(b)
    state.finished(c, c)
    assert state.consumed(c) == 6  # the third group consumed: rollout_batch_size 2 -> step 6
    state.recycled([d])
    cut = state.cut(5)
    # Step 5's groups are in its weights; step 6's group (c) is not: it comes back as completed.
    assert [g[0]["group_index"] for g in cut.completed] == [2] and cut.consumed_after == {2: 6}
    assert cut.pending == [] and [g[0]["group_index"] for g in cut.recycled] == [3]
    assert cut.cursor == {"sample_offset": 4}
    assert [e for e, _ in seen] == [
        "handed_out",
        "finished",
        "finished",
        "consumed",
        "consumed",
        "finished",
        "consumed",
        "recycled",
    ]
    # Re-handing a recycled group keeps its gid.
    assert state.handed_out([d]) == [3]
    path = state.save(5).result()
    ckpt = read_rollout_checkpoint(Namespace(load=str(tmp_path)), 5, sample_cls=dict)
    assert ckpt.path == path and ckpt.data_source_state == {"sample_offset": 4}
    assert [g[0]["group_index"] for g in ckpt.pending_groups] == [3]
    assert [g[0]["group_index"] for g in ckpt.completed_groups] == [2]
    assert bundles.open_bundle(path).meta["consumed_after_checkpoint"] == 1
    state.checkpointer.close()


def test_in_flight_groups_are_saved_as_handed_out(tmp_path):
    state = RolloutState(Namespace(save=str(tmp_path), rollout_batch_size=1))
    g = group(7)
    state.handed_out([g])
    g[0]["response"] = "half generated"
    (pending,) = state.cut(0).pending
    assert pending[0]["response"] == ""


def test_dropped_and_stale_groups_leave_the_state(tmp_path):
    state = RolloutState(Namespace(save=str(tmp_path), rollout_batch_size=4))
    a, b, c = group(0), group(1), group(2)
    state.handed_out([a, b, c])
    state.dropped(a)  # filtered on put
    state.finished(b, b)
    state.finished(c, c)
    state.retain_completed({id(c)})  # the buffer discarded b (stale, handler "drop")
    assert state.counts() == {"in_flight": 0, "completed": 1, "consumed_unsaved": 0, "recycled": 0}


def test_nested_group_vector_reads_back_nested():
    """tests/vectors/v2_nested: a committed checkpoint with a nested group (FORMAT.md, appendix A)."""
    ckpt = read_rollout_checkpoint(Namespace(load=str(VECTORS / "v2_nested")), 0, sample_cls=dict)
    (group_,) = ckpt.completed_groups
    assert [
        [t["response"] for t in item] if isinstance(item, list) else item["response"] for item in group_
    ] == [
        ["look", "click"],
        ["look"],
        "type",
    ]
    assert ckpt.meta["completed_group_sizes"] == [[2, 1, None]]
    assert ckpt.data_source_state["sample_index"] == 3


def test_todays_writer_gives_the_vectors_layout(tmp_path):
    args = Namespace(save=str(tmp_path), load=str(tmp_path))
    samples = [
        {"group_index": 0, "index": i, "response": r, "status": "completed"}
        for i, r in ((0, "look"), (0, "click"), (1, "look"), (2, "type"))
    ]
    nested = [[samples[0], samples[1]], [samples[2]], samples[3]]
    meta = bundles.open_bundle(save_rollout_checkpoint(args, 0, [], [nested])).meta
    vector = bundles.open_bundle(VECTORS / "v2_nested" / "rollout" / "fully_async_0").meta
    assert (
        meta["completed_group_sizes"] == vector["completed_group_sizes"] and meta["checkpoint_version"] == 2
    )


def test_a_version_1_checkpoint_with_a_nested_layout_is_refused(tmp_path):
    bundles.write_bundle(
        tmp_path / "rollout" / "fully_async_0",
        [{"index": 0}, {"index": 1}],
        kind="rollout_checkpoint",
        meta={
            "checkpoint_version": 1,
            "rollout_id": 0,
            "pending_group_sizes": [],
            "completed_group_sizes": [[2]],
        },
    )
    with pytest.raises(BundleFormatError, match=r"nested group layouts need checkpoint_version 2"):
        read_rollout_checkpoint(Namespace(load=str(tmp_path)), 0, sample_cls=dict)
    bundles.write_bundle(
        tmp_path / "rollout" / "fully_async_1",
        [{"index": 0}],
        kind="rollout_checkpoint",
        meta={
            "checkpoint_version": 2,
            "rollout_id": 1,
            "pending_group_sizes": [],
            "completed_group_sizes": [["x"]],
        },
    )
    with pytest.raises(
        BundleFormatError, match=r"meta.completed_group_sizes: expected a list of group layouts"
    ):
        read_rollout_checkpoint(Namespace(load=str(tmp_path)), 1, sample_cls=dict)


def test_a_resume_from_an_older_checkpoint_keeps_groups_it_held_for_a_later_step_trained(tmp_path):
    """Issue 30, item 1 (the Miles plugins' side): checkpoint 0 holds group 1 as completed
    because step 1 had taken it (train_async's overlap). The weights of step 2 survive but their
    rollout checkpoint was never written: load(2) resumes from checkpoint 0 and the journal, and
    group 1, trained into step 1's weights, must not come back (load(0) brings it back)."""
    from helpers import trainer_args

    from trainer_hooks.rollout import RolloutLedger

    args = trainer_args(tmp_path, "run-a", batch_size=1)
    state = RolloutState(args)
    ledger = RolloutLedger(args)
    ledger.attach(state)
    groups = [group(g, status="completed") for g in range(4)]
    state.begin_step(0)
    state.handed_out(groups, cursor={"sample_offset": 4})
    for g in groups[:2]:
        state.finished(g, g)
        state.consumed(g)  # steps 0 and 1
    state.save(0).result()
    state.finished(groups[2], groups[2])
    assert state.consumed(groups[2]) == 2
    ledger.flush()
    state.checkpointer.close()
    ledger.close()

    def resume(step, run):
        rec = RolloutLedger(trainer_args(tmp_path, run, batch_size=1)).recover(step, sample_cls=dict)
        assert rec.rollout_id == 0
        return sorted(gid for gid, _ in rec.completed), sorted(g.gid for g in rec.pending)

    assert resume(2, "run-b") == ([], [3])  # steps 0-2 are in the weights: only group 3 is left
    assert resume(0, "run-c") == ([1, 2], [3])


def test_the_names_that_moved_out_of_checkpoints_are_still_importable_there():
    """The rollout state machines moved to ``trainer_hooks.rollout`` and the journal to
    ``trainer_hooks.journal`` (issue 37): each name importable from ``trainer_hooks.checkpoints``
    or ``trainer_hooks.checkpoints.journal`` before still is, the very same object."""
    import importlib

    import trainer_hooks.checkpoints as checkpoints
    import trainer_hooks.checkpoints.journal as old_journal
    import trainer_hooks.journal as journal

    assert set(old_journal.MOVED) <= set(journal.__all__)
    for old in (checkpoints, old_journal):
        for name, home in old.MOVED.items():
            assert getattr(old, name) is getattr(importlib.import_module(home), name), name
    with pytest.raises(AttributeError, match="no attribute 'RolloutJournalz'"):
        old_journal.RolloutJournalz  # noqa: B018


@pytest.mark.parametrize("old", ["trainer_hooks.checkpoints", "trainer_hooks.checkpoints.journal"])
def test_import_star_of_the_old_homes_still_brings_the_moved_names(old):
    # ``from trainer_hooks.checkpoints.journal import *`` brought 27 names before the journal moved;
    # a star import goes through the module's __getattr__ for what __all__ lists.
    import importlib

    module = importlib.import_module(old)
    namespace: dict[str, object] = {}
    exec(f"from {old} import *", namespace)
    assert set(module.MOVED) <= set(namespace)
    assert set(module.MOVED) <= set(dir(module))
