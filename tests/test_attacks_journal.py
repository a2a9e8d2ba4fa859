"""An attacker's and a user's read of the training side of issue 36 (journal, resume,
checkpoints, replay reports, inspect): each test is an attack that succeeded on the wave's
code, kept as the proof of its fix. The rule they hold: what the journal's writer accepts its
reader reads (a record the reader refuses makes a run unresumable), and what a checkpoint or a
report forges is refused, named, before it is spent."""

from __future__ import annotations

import pytest
from helpers import trainer_args

from trainer_hooks.checkpoints import RolloutLedger
from trainer_hooks.checkpoints.journal import JournalLimitError


@pytest.mark.parametrize(
    "cursor", [{(0, 1): "x"}, {"state": [{((),): 1}]}], ids=["tuple-key", "nested-tuple-key"]
)
def test_a_cursor_with_a_container_map_key_is_refused_by_the_writer_and_the_run_resumes(tmp_path, cursor):
    """msgpack encodes a tuple key as an array, which the reader cannot make a key again: the
    take was written, and every later resume refused the journal (unresumable)."""
    ledger = RolloutLedger(trainer_args(tmp_path, "run-a", "--rollout-journal-interval", "0.05"))
    ledger.take([{"index": 0}], {"offset": 1})
    with pytest.raises(JournalLimitError) as e:
        ledger.take([{"index": 1}], cursor)
    assert "take record: b.cursor: a map key that is not a scalar, found" in str(e.value), str(e.value)
    assert "nothing was written" in str(e.value)
    ledger.take([{"index": 2}], {"offset": 3, 4: None, None: b"x"})
    ledger.flush()
    ledger.close()
    state = RolloutLedger(trainer_args(tmp_path, "run-b", "--rollout-journal-interval", "0.05")).recover(
        None, sample_cls=dict
    )
    assert state.cursor == {"offset": 3, 4: None, None: b"x"}
    assert sorted(g.gid for g in state.pending) == [0, 2]
