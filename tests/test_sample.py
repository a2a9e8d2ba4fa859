"""Sample behaves like Miles' Sample in to_dict / from_dict / reset_for_retry."""

from __future__ import annotations

import numpy as np
import pytest

from bundles import MediaRef
from trainer_hooks import Sample


def _sample() -> Sample:
    return Sample(
        group_index=1,
        index=7,
        prompt=[{"role": "user", "content": "<image> what is this?"}],
        tokens=[1, 2, 3, 4],
        multimodal_inputs={"images": [MediaRef("sha256:" + "a" * 64, 3, ".png", "/m/a.png")]},
        multimodal_train_inputs={"image_grid_thw": np.array([[1, 2, 2]], dtype=np.int64)},
        response="a cat",
        response_length=2,
        label="cat",
        reward={"score": 1.0},
        loss_mask=[1, 1],
        weight_versions=["3"],
        rollout_log_probs=[-0.1, -0.2],
        rollout_routed_experts=np.zeros((3, 2, 2), dtype=np.int32),
        status=Sample.Status.TRUNCATED,
        metadata={"source": "gui"},
        train_metadata={"loss": "grpo"},
    )


def test_status_values_are_miles_values() -> None:
    assert [s.value for s in Sample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]


def test_to_dict_is_a_shallow_copy_with_status_as_string() -> None:
    s = _sample()
    d = s.to_dict()
    assert d["status"] == "truncated"
    assert d["multimodal_train_inputs"] is s.multimodal_train_inputs  # shallow: objects pass through
    assert d["rollout_routed_experts"] is s.rollout_routed_experts
    d["response"] = "changed"
    assert s.response == "a cat"
    assert set(d) >= {"group_index", "tokens", "multimodal_inputs", "train_metadata", "rollout_indexer_topk"}


def test_from_dict_round_trips_and_keeps_unknown_keys_as_attributes() -> None:
    d = _sample().to_dict()
    d["spec_info"] = {"spec_accept_token_num": 3}  # a field of a newer Miles
    d["session_id"] = "s-1"
    original = dict(d)
    s = Sample.from_dict(d)
    assert d == original  # input not modified
    assert s.status is Sample.Status.TRUNCATED
    assert s.spec_info == {"spec_accept_token_num": 3}  # type: ignore[attr-defined]
    again = s.to_dict()
    assert again["session_id"] == "s-1" and again["status"] == "truncated"
    assert again.keys() == d.keys()


def test_from_dict_requires_a_valid_status() -> None:
    with pytest.raises(KeyError, match="'status' is required"):
        Sample.from_dict({"prompt": "x"})
    with pytest.raises(ValueError, match=r"status: expected one of .*found 'done'"):
        Sample.from_dict({"status": "done"})
    assert Sample.from_dict({"status": Sample.Status.FAILED}).status is Sample.Status.FAILED


def test_reset_for_retry_keeps_the_inputs_and_clears_the_outputs() -> None:
    s = _sample()
    images = s.multimodal_inputs
    s.reset_for_retry()
    assert s.prompt == [{"role": "user", "content": "<image> what is this?"}]
    assert s.multimodal_inputs is images
    assert (s.group_index, s.index, s.label, s.metadata) == (1, 7, "cat", {"source": "gui"})
    assert s.tokens == [] and s.response == "" and s.response_length == 0
    assert s.reward is None and s.loss_mask is None and s.rollout_log_probs is None
    assert s.multimodal_train_inputs is None and s.rollout_routed_experts is None
    assert s.weight_versions == [] and s.train_metadata is None
    assert s.status is Sample.Status.PENDING
    # Defaults are fresh objects, not shared between samples.
    t = _sample()
    t.reset_for_retry()
    s.tokens.append(1)
    assert t.tokens == []
