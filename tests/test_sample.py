"""``trainer_hooks.Sample`` at parity with Miles' ``miles.utils.types.Sample``.

The expected field list, defaults, enum values and method behaviour below are written down from
Miles' source (``miles/utils/types.py`` at radixark/miles 31f1ca961); Miles itself is not
installable here, so the list is the contract.
"""

from __future__ import annotations

import dataclasses
from argparse import Namespace

import numpy as np
import pytest

from bundles import MediaRef
from trainer_hooks import AdapterRef, RewardSpec, Sample

# Miles' Sample fields, in declaration order, with their defaults as to_dict() reports them.
MILES_FIELDS = [
    ("group_index", None),
    ("index", None),
    ("rollout_id", None),
    ("prompt", ""),
    ("tokens", []),
    ("multimodal_inputs", None),
    ("multimodal_train_inputs", None),
    ("response", ""),
    ("response_length", 0),
    ("label", None),
    ("reward", None),
    ("loss_mask", None),
    ("weight_versions", []),
    ("rollout_log_probs", None),
    ("rollout_routed_experts", None),
    ("rollout_indexer_topk", None),
    ("remove_sample", False),
    ("teacher_log_probs", None),
    ("opd_reverse_kl", None),
    ("status", "pending"),
    ("metadata", {}),
    ("generate_function_path", None),
    ("train_metadata", None),
    ("adapter", None),
    ("reward_spec", None),
    ("routing_key", None),
    ("non_generation_time", 0.0),
    (
        "spec_info",
        {
            "spec_accept_token_num": 0,
            "spec_draft_token_num": 0,
            "spec_verify_ct": 0,
            "completion_token_num": 0,
        },
    ),
    ("prefix_cache_info", {"cached_tokens": 0, "total_prompt_tokens": 0}),
]
MILES_STATUS = {
    "PENDING": "pending",
    "COMPLETED": "completed",
    "TRUNCATED": "truncated",
    "ABORTED": "aborted",
    "FAILED": "failed",
}


def _sample() -> Sample:
    return Sample(
        group_index=1,
        index=7,
        rollout_id=3,
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
        teacher_log_probs=[-0.3, -0.4],
        opd_reverse_kl=[0.01, 0.02],
        status=Sample.Status.TRUNCATED,
        metadata={"source": "gui"},
        generate_function_path="my.gen",
        train_metadata={"loss": "grpo"},
        adapter=AdapterRef("math", 2),
        reward_spec=RewardSpec(rm_type="math"),
        routing_key="user-9",
        non_generation_time=0.5,
        spec_info=Sample.SpecInfo(5, 8, 2, 6),
        prefix_cache_info=Sample.PrefixCacheInfo(10, 40),
    )


def test_fields_defaults_and_order_are_miles() -> None:
    d = Sample().to_dict()
    assert list(d.items()) == MILES_FIELDS
    assert [f.name for f in dataclasses.fields(Sample)] == [name for name, _ in MILES_FIELDS]


def test_status_values_are_miles_values() -> None:
    assert {s.name: s.value for s in Sample.Status} == MILES_STATUS
    assert list(Sample.Status) == [Sample.Status[n] for n in MILES_STATUS]


def test_adapter_ref_and_reward_spec_are_frozen_records() -> None:
    assert [(f.name, f.default) for f in dataclasses.fields(AdapterRef)] == [
        ("name", dataclasses.MISSING),
        ("slot", dataclasses.MISSING),
    ]
    assert [(f.name, f.default) for f in dataclasses.fields(RewardSpec)] == [
        ("rm_type", None),
        ("custom_rm_path", None),
    ]
    a = AdapterRef("math", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.slot = 2  # type: ignore[misc]
    assert a == AdapterRef("math", 1) and hash(a) == hash(AdapterRef("math", 1))


def test_to_dict_is_a_shallow_copy_with_plain_status_and_nested_records() -> None:
    s = _sample()
    d = s.to_dict()
    assert d["status"] == "truncated"
    assert d["spec_info"] == {
        "spec_accept_token_num": 5,
        "spec_draft_token_num": 8,
        "spec_verify_ct": 2,
        "completion_token_num": 6,
    }
    assert d["prefix_cache_info"] == {"cached_tokens": 10, "total_prompt_tokens": 40}
    # adapter / reward_spec stay objects, as in Miles; tensors and arrays pass through uncopied.
    assert d["adapter"] is s.adapter and d["reward_spec"] is s.reward_spec
    assert d["multimodal_train_inputs"] is s.multimodal_train_inputs
    assert d["rollout_routed_experts"] is s.rollout_routed_experts
    d["response"] = "changed"
    assert s.response == "a cat"


def test_from_dict_round_trips_and_keeps_unknown_keys_as_attributes() -> None:
    d = _sample().to_dict()
    d["session_id"] = "s-1"  # a field of a newer Miles
    original = dict(d)
    s = Sample.from_dict(d)
    assert d == original  # input not modified
    assert s.status is Sample.Status.TRUNCATED
    assert s.spec_info == Sample.SpecInfo(5, 8, 2, 6) and s.spec_info.spec_accept_rate == 5 / 8
    assert s.prefix_cache_info.prefix_cache_hit_rate == 0.25
    assert s.adapter == AdapterRef("math", 2) and s.reward_spec == RewardSpec("math")
    again = s.to_dict()
    assert again["session_id"] == "s-1" and again["status"] == "truncated"
    assert list(again) == list(d)


def test_from_dict_nested_records_default_and_missing_keys_read_zero() -> None:
    s = Sample.from_dict({"status": "completed", "spec_info": {"spec_verify_ct": 4}})
    assert s.spec_info == Sample.SpecInfo(spec_verify_ct=4)
    assert s.prefix_cache_info == Sample.PrefixCacheInfo()
    assert Sample.SpecInfo.from_dict({}).to_dict() == Sample.SpecInfo().to_dict()
    with pytest.raises(TypeError, match=r"spec_info: expected a dict or Sample.SpecInfo, found list"):
        Sample.from_dict({"status": "completed", "spec_info": [1]})


def test_from_dict_requires_a_valid_status() -> None:
    with pytest.raises(KeyError, match="'status' is required"):
        Sample.from_dict({"prompt": "x"})
    with pytest.raises(ValueError, match=r"status: expected one of .*found 'done'"):
        Sample.from_dict({"status": "done"})
    assert Sample.from_dict({"status": Sample.Status.FAILED}).status is Sample.Status.FAILED


def test_reset_for_retry_has_miles_semantics() -> None:
    s = _sample()
    images = s.multimodal_inputs
    s.reset_for_retry()
    # Kept: identity, prompt, inputs and routing.
    assert s.prompt == [{"role": "user", "content": "<image> what is this?"}]
    assert s.multimodal_inputs is images
    assert (s.group_index, s.index, s.rollout_id, s.label, s.metadata) == (1, 7, 3, "cat", {"source": "gui"})
    assert (s.generate_function_path, s.routing_key) == ("my.gen", "user-9")
    assert s.adapter == AdapterRef("math", 2) and s.reward_spec == RewardSpec("math")
    assert s.teacher_log_probs == [-0.3, -0.4] and s.opd_reverse_kl == [0.01, 0.02]  # Miles keeps these
    # Cleared: what generation produced.
    assert s.tokens == [] and s.response == "" and s.response_length == 0
    assert s.reward is None and s.loss_mask is None and s.rollout_log_probs is None
    assert s.multimodal_train_inputs is None and s.rollout_routed_experts is None
    assert s.rollout_indexer_topk is None and s.remove_sample is False
    assert s.weight_versions == [] and s.train_metadata is None and s.non_generation_time == 0.0
    assert s.spec_info == Sample.SpecInfo() and s.prefix_cache_info == Sample.PrefixCacheInfo()
    assert s.status is Sample.Status.ABORTED
    # Defaults are fresh objects, not shared between samples.
    t = _sample()
    t.reset_for_retry()
    s.tokens.append(1)
    assert t.tokens == []


def test_get_reward_value() -> None:
    s = _sample()
    assert s.get_reward_value(Namespace(reward_key="score")) == 1.0
    assert s.get_reward_value(Namespace(reward_key=None)) == {"score": 1.0}
    s.reward = 0.5
    assert s.get_reward_value(Namespace(reward_key="")) == 0.5


def test_effective_response_length_and_oldest_weight_version() -> None:
    s = Sample(response_length=4, loss_mask=[1, 0, 1, 0])
    assert s.effective_response_length == 2
    s.loss_mask = None
    assert s.effective_response_length == 4
    assert Sample(weight_versions=["7", "3", "x", "12"]).oldest_weight_version == 3
    assert Sample(weight_versions=["x"]).oldest_weight_version is None


def test_validate() -> None:
    _sample().validate()
    s = _sample()
    s.loss_mask = [1]
    with pytest.raises(AssertionError, match=r"loss_mask length \(1\) != response_length \(2\)"):
        s.validate()
    s = _sample()
    s.tokens = [1]
    with pytest.raises(AssertionError, match=r"tokens length \(1\) must be >= response_length \(2\)"):
        s.validate()
    s = _sample()
    s.rollout_indexer_topk = np.zeros((2, 1, 1), dtype=np.int32)
    with pytest.raises(AssertionError, match=r"rollout_indexer_topk length \(2\) != len\(tokens\) - 1 \(3\)"):
        s.validate()
    # Routed experts may count expanded media positions: 3 + (4 - 1) patches.
    s = _sample()
    s.multimodal_train_inputs = {"mm_vision_num_patches": [4]}
    s.rollout_routed_experts = np.zeros((6, 1, 1), dtype=np.int32)
    s.validate()
    s.rollout_routed_experts = np.zeros((5, 1, 1), dtype=np.int32)
    with pytest.raises(AssertionError, match=r"or media-expanded \(6\)"):
        s.validate()


def _word_tokenizer():
    """A real Hugging Face fast tokenizer over a word-level vocabulary (built offline)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "c": 3, "d": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok)


def test_strip_last_output_tokens() -> None:
    tokenizer = _word_tokenizer()
    s = Sample(
        tokens=[1, 2, 3, 4],
        response_length=3,
        response="b c d",
        loss_mask=[1, 1, 0],
        rollout_log_probs=[-1.0, -2.0, -3.0],
        teacher_log_probs=[-1.5, -2.5, -3.5],
        opd_reverse_kl=[0.1, 0.2, 0.3],
        rollout_routed_experts=np.arange(3).reshape(3, 1, 1).astype(np.int32),
        rollout_indexer_topk=np.arange(3).reshape(3, 1, 1).astype(np.int32),
        metadata={"opd_student_top_logprobs": [[0.1], [0.2], [0.3]]},
    )
    s.strip_last_output_tokens(0, tokenizer)
    assert s.tokens == [1, 2, 3, 4]
    s.strip_last_output_tokens(2, tokenizer)
    assert s.tokens == [1, 2] and s.response_length == 1 and s.response == "b"
    assert s.loss_mask == [1] and s.rollout_log_probs == [-1.0] and s.teacher_log_probs == [-1.5]
    assert s.opd_reverse_kl == [0.1] and s.metadata["opd_student_top_logprobs"] == [[0.1]]
    assert s.rollout_routed_experts.tolist() == [[[0]]] and s.rollout_indexer_topk.tolist() == [[[0]]]
    s.strip_last_output_tokens(1, tokenizer)
    assert s.response == "" and s.response_length == 0
    with pytest.raises(AssertionError, match="cannot strip 1 tokens: only 0 output tokens available"):
        s.strip_last_output_tokens(1, tokenizer)


def test_update_from_meta_info() -> None:
    s = Sample()
    meta = {
        "finish_reason": {"type": "length"},
        "weight_version": "4",
        "cached_tokens": 3,
        "prompt_tokens": 10,
        "spec_accept_token_num": 2,
        "spec_draft_token_num": 4,
        "spec_verify_ct": 1,
        "completion_tokens": 5,
    }
    s.update_from_meta_info(Namespace(sglang_speculative_algorithm=None), meta)
    assert s.status is Sample.Status.TRUNCATED and s.weight_versions == ["4"]
    assert s.prefix_cache_info == Sample.PrefixCacheInfo(3, 10)
    assert s.spec_info == Sample.SpecInfo()  # counted only with speculative decoding on
    s.update_from_meta_info(
        Namespace(sglang_speculative_algorithm="EAGLE"), {**meta, "finish_reason": {"type": "stop"}}
    )
    assert s.status is Sample.Status.COMPLETED and s.oldest_weight_version == 4
    assert s.spec_info == Sample.SpecInfo(2, 4, 1, 5) and s.prefix_cache_info == Sample.PrefixCacheInfo(6, 20)
    s.update_from_meta_info(Namespace(), {"finish_reason": {"type": "abort"}})
    assert s.status is Sample.Status.ABORTED
    s.update_from_meta_info(Namespace(), {"finish_reason": {"type": "other"}})
    assert s.status is Sample.Status.ABORTED
