"""Converter parity: ``trainer_hooks.convert_samples_to_train_data`` against Miles' own
(``miles.ray.rollout.train_data_conversion``), side by side on Miles' ``Sample`` shapes: key for
key (in order) and value for value (float32 rewards bit for bit), plus the guard."""

from __future__ import annotations

from argparse import Namespace

import numpy as np
import pytest
from helpers.miles_snapshot import require_miles

MILES = require_miles()

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data as miles_convert  # noqa: E402
from miles.utils.types import AdapterRef, Sample  # noqa: E402

from trainer_hooks import convert_samples_to_train_data  # noqa: E402


def base_args(**kw):
    args = dict(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        n_samples_per_prompt=2,
        rollout_batch_size=2,
        use_dynamic_global_batch_size=False,
    )
    args.update(kw)
    return Namespace(**args)


def sample(i, **kw):
    fields = dict(
        group_index=i // 2,
        index=i,
        prompt=f"p{i}",
        tokens=[1, 2, 3, 4 + i],
        response="r",
        response_length=2,
        reward=[0.1, 0.7, 0.3, 0.9, 0.25, 0.5][i % 6],
        loss_mask=[1, 1],
        rollout_log_probs=[-0.5, -0.25 - i],
        status=Sample.Status.COMPLETED,
    )
    fields.update(kw)
    return Sample(**fields)


def text_grpo():
    s = [sample(i) for i in range(4)]
    s[1].status = Sample.Status.TRUNCATED
    s[2].loss_mask = None
    s[3].remove_sample = True
    for x in s:
        x.metadata = {"raw_reward": x.reward * 2, "round_number": 3}
        x.train_metadata = {"loss": "grpo"}
        x.weight_versions = ["4"]
        x.teacher_log_probs = [-0.1, -0.2]
        x.rollout_routed_experts = np.arange(6, dtype=np.int32).reshape(3, 2)
        x.rollout_indexer_topk = np.arange(4, dtype=np.int32)
    return base_args(), s, {}


def lora():
    s = [sample(i, adapter=AdapterRef(f"lora-{i % 2}", i % 2)) for i in range(4)]
    for x in s:
        x.metadata = {"adapter_global_batch_size": 8 + x.adapter.slot}
    meta = {"step_slots": [1, 0], "step_adapter_names": ["lora-1", "lora-0"], "prompt_group_sizes": [2, 0, 2]}
    return base_args(), s, meta


def opd():
    s = [sample(i, teacher_log_probs=[-0.3, -0.4], opd_reverse_kl=[0.01 * i, 0.02]) for i in range(4)]
    return base_args(advantage_estimator="gspo"), s, {}


def dynamic_batch():
    return (
        base_args(use_dynamic_global_batch_size=True),
        [sample(i) for i in range(4)],
        {"dynamic_global_batch_size": 3},
    )


def group_index_none_fixed_fanout():
    # n_samples_per_prompt * rollout_batch_size samples: contiguous prompt groups.
    return base_args(grpo_std_normalization=False), [sample(i, group_index=None) for i in range(4)], {}


def group_index_none_one_group():
    s = [sample(i, group_index=None, reward=[0.0, 1.0, 1.0][i]) for i in range(3)]  # -> -2/3, 1/3, 1/3
    return base_args(grpo_std_normalization=False), s, {}


def rollout_id_siblings():
    # Two rollouts of one prompt, each split into two samples (turns) sharing rollout_id and reward.
    s = [sample(i, group_index=0, rollout_id=10 + i // 2, reward=[0.0, 0.0, 1.0, 1.0][i]) for i in range(4)]
    return base_args(), s, {}


def prompt_group_sizes():
    s = [sample(i, group_index=None, reward=float(i)) for i in range(5)]
    return base_args(advantage_estimator="reinforce_plus_plus_baseline"), s, {"prompt_group_sizes": [3, 2]}


def vlm():
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    s = []
    for i in range(4):
        x = sample(i)
        x.multimodal_inputs = {"images": [Image.new("RGB", (28, 28), (i, 2, 3))]}
        x.multimodal_train_inputs = {
            "pixel_values": torch.randn(4, 1176, generator=g),
            "image_grid_thw": torch.tensor([[1, 2, 2]]),
        }
        s.append(x)
    s[3].multimodal_inputs = None  # a text-only sample in the batch
    s[3].multimodal_train_inputs = None
    return base_args(), s, {}


SHAPES = {
    "text_grpo": text_grpo,
    "lora": lora,
    "opd": opd,
    "dynamic_batch": dynamic_batch,
    "group_index_none_fixed_fanout": group_index_none_fixed_fanout,
    "group_index_none_one_group": group_index_none_one_group,
    "rollout_id_siblings": rollout_id_siblings,
    "prompt_group_sizes": prompt_group_sizes,
    "vlm": vlm,
}


def same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("shape", list(SHAPES))
def test_converter_matches_miles_key_for_key_and_value_for_value(shape):
    args, theirs_in, meta = SHAPES[shape]()
    _, ours_in, _ = SHAPES[shape]()  # Miles writes loss masks back into its samples: separate inputs
    theirs = miles_convert(args, theirs_in, dict(meta), None, None)
    ours = convert_samples_to_train_data(args, ours_in, dict(meta))
    assert list(ours) == list(theirs), shape
    equal = [k for k in theirs if same(ours[k], theirs[k])]
    print(f"{shape}: keys equal {len(equal)} of {len(theirs)}")
    assert equal == list(theirs), {k: (ours[k], theirs[k]) for k in theirs if k not in equal}


def test_normalised_rewards_are_miles_values():
    """The cases the issue names: group_index=None gives -2/3, 1/3, 1/3 (not all 0.0), rollout_id
    siblings share one normalised reward (-0.5 / 0.5 here, not per-row values)."""
    args, s, meta = group_index_none_one_group()
    assert convert_samples_to_train_data(args, s, meta)["rewards"] == pytest.approx([-2 / 3, 1 / 3, 1 / 3])
    args, s, meta = rollout_id_siblings()
    args.grpo_std_normalization = False
    assert convert_samples_to_train_data(args, s, meta)["rewards"] == [-0.5, -0.5, 0.5, 0.5]


def test_siblings_with_different_rewards_are_refused_as_miles_does():
    args, s, meta = rollout_id_siblings()
    s[1].reward = 0.5
    with pytest.raises(ValueError, match=r"rollout 10 must share one reward; rows \[0, 1\]"):
        miles_convert(args, s, meta, None, None)
    with pytest.raises(ValueError, match=r"rollout 10 must share one reward; rows \[0, 1\]"):
        convert_samples_to_train_data(args, s, meta)


def test_custom_reward_post_process_is_used_as_miles_uses_it():
    def post(args, samples):
        return [9.0] * len(samples), [0.5] * len(samples)

    args, theirs_in, meta = text_grpo()
    _, ours_in, _ = text_grpo()
    theirs = miles_convert(args, theirs_in, meta, None, post)
    ours = convert_samples_to_train_data(args, ours_in, meta, None, post)
    assert ours["rewards"] == theirs["rewards"] == [0.5] * 4
    assert ours["raw_reward"] == theirs["raw_reward"]  # metadata raw_reward still overrides, as in Miles


def test_guard_never_fires_on_miles_vlm_samples_and_fires_on_a_converter_shipping_both():
    args, s, meta = vlm()
    # Images and dense tensors: Miles' normal VLM sample converts as in Miles, no guard.
    data = convert_samples_to_train_data(args, s, meta)
    assert "multimodal_inputs" not in data
    # On the token-space path a sample ships its references; one that also carries dense tensors
    # ships both, and the guard names it.
    with pytest.raises(ValueError, match=r"sample index 0 \(position 0\) carries both media references"):
        convert_samples_to_train_data(args, s, meta, token_space=True)
    for x in s:
        x.multimodal_train_inputs = None  # what the token-space rollout records: references only
    data = convert_samples_to_train_data(args, s, meta, token_space=True)
    assert data["multimodal_inputs"] == [x.multimodal_inputs for x in s[:3]] + [None]
    assert "multimodal_train_inputs" not in data  # the trainer rebuilds them (get_rollout_data)
    _, vlm_in, _ = vlm()

    def both(args, samples):  # a custom converter that ships both
        return {
            "tokens": [x.tokens for x in samples],
            "sample_indices": [x.index for x in samples],
            "multimodal_inputs": [x.multimodal_inputs for x in samples],
            "multimodal_train_inputs": [x.multimodal_train_inputs for x in samples],
        }

    with pytest.raises(
        ValueError, match=r"custom converter .*both.*sample index 0 \(position 0\) carries both"
    ):
        convert_samples_to_train_data(args, vlm_in, meta, both)
