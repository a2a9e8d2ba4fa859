"""Train data conversion with the guard: :func:`convert_samples_to_train_data`.

The guard: train data never carries both media references (``multimodal_inputs``) and dense
``multimodal_train_inputs`` for the same sample. The trainer rebuilds the tensors from the
references (:func:`trainer_hooks.get_rollout_data`), so shipping both silently pays the very
hand-off (hundreds of MiB per step through Ray's object store) that references replace. The check
runs on the converter's *output*, so a custom converter
(``--custom-convert-samples-to-train-data-path``) is held to it as well as the default one.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["check_train_data", "convert_samples_to_train_data", "guard_violations"]

_MEDIA_KEYS = ("images", "videos", "audios")


def _media_count(mm: Any) -> int:
    if not isinstance(mm, Mapping):
        return 0
    # `is None`, not truthiness: a custom converter may hand tensors, whose truth value is an error.
    return sum(len(items) for k in _MEDIA_KEYS if (items := mm.get(k)) is not None)


def _dense_keys(mti: Any) -> list[str]:
    if not isinstance(mti, Mapping):
        return []
    return [str(k) for k, v in mti.items() if v is not None]


def guard_violations(train_data: Mapping[str, Any], first_position: int = 0) -> list[tuple[int, Any, str]]:
    """Every sample of ``train_data`` that carries both media references and dense tensors, as
    ``(position, sample index, message)``; empty when the data is clean. Positions count from
    ``first_position`` (for train data built from a slice of a batch)."""
    mis = train_data.get("multimodal_inputs")
    mtis = train_data.get("multimodal_train_inputs")
    if not mis or not mtis:
        return []
    indices = train_data.get("sample_indices") or [None] * len(mis)
    out = []
    for position, (mi, mti) in enumerate(zip(mis, mtis, strict=False), first_position):
        n_media = _media_count(mi)
        dense = _dense_keys(mti)
        if n_media and dense:
            row = position - first_position
            index = indices[row] if row < len(indices) else None
            out.append(
                (
                    position,
                    index,
                    f"sample index {index} (position {position}) carries both media references "
                    f"(multimodal_inputs: {n_media} item(s)) and dense multimodal_train_inputs "
                    f"({', '.join(dense)}); the trainer rebuilds the tensors from the references "
                    f"(get_rollout_data), so keep only the references",
                )
            )
    return out


def check_train_data(train_data: Mapping[str, Any], where: str = "convert_samples_to_train_data") -> None:
    """Raise ``ValueError`` naming the first sample that violates the guard (or output that is no
    dict of per-sample lists, as a custom converter may return)."""
    if not isinstance(train_data, Mapping):
        raise ValueError(f"{where}: expected a dict of per-sample lists, found {type(train_data).__name__}")
    for key in ("multimodal_inputs", "multimodal_train_inputs"):
        value = train_data.get(key)
        if value is not None and not isinstance(value, Sequence):
            raise ValueError(f"{where}: {key}: expected one entry per sample, found {type(value).__name__}")
    found = guard_violations(train_data)
    if found:
        more = f" ({len(found) - 1} more sample(s) do too)" if len(found) > 1 else ""
        raise ValueError(f"{where}: {found[0][2]}{more}")


def _reward_value(args: Namespace, sample: Any) -> Any:
    get = getattr(sample, "get_reward_value", None)
    if callable(get) and hasattr(args, "reward_key"):
        return get(args)
    key = getattr(args, "reward_key", None)
    reward = sample.reward
    return reward[key] if key and isinstance(reward, Mapping) else reward


def _reward_segments(
    args: Namespace, samples: Sequence[Any], prompt_group_sizes: Sequence[int] | None
) -> list[list[int]]:
    """Rows of each prompt's reward group, as Miles finds them: ``prompt_group_sizes`` (multi-LoRA),
    else ``group_index``, else a complete fixed fan-out batch, else one group."""
    if prompt_group_sizes is not None:
        if sum(prompt_group_sizes) != len(samples):
            raise ValueError(
                f"convert_samples_to_train_data: metadata.prompt_group_sizes sum to {sum(prompt_group_sizes)}, "
                f"found {len(samples)} samples"
            )
        out, start = [], 0
        for size in prompt_group_sizes:
            if size > 0:
                out.append(list(range(start, start + size)))
            start += size
        return out
    indices = [s.group_index for s in samples]
    if all(g is not None for g in indices):
        by_group: dict[int, list[int]] = {}
        for row, g in enumerate(indices):
            by_group.setdefault(int(g), []).append(row)
        return list(by_group.values())
    n = getattr(args, "n_samples_per_prompt", None)
    batch = getattr(args, "rollout_batch_size", None)
    if isinstance(n, int) and isinstance(batch, int) and n > 0 and len(samples) == n * batch:
        return [list(range(start, start + n)) for start in range(0, len(samples), n)]
    return [list(range(len(samples)))]


def _centre(values: list[float], divide_by_std: bool) -> list[float]:
    """Mean-centred (and std-divided) values in float32, as Miles computes them with torch; numpy
    float32 where torch is not installed (equal for the group sizes RL uses; a reduction over
    thousands of values may differ in the last bit)."""
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        t = torch.tensor(values, dtype=torch.float)
        out = t - t.mean()
        if divide_by_std and len(values) > 1:
            std = t.std()
            if std > 0:
                out = out / (std + 1e-6)
        return out.tolist()
    import numpy as np

    a = np.asarray(values, dtype=np.float32)
    out_np = a - a.mean(dtype=np.float32)
    if divide_by_std and len(values) > 1:
        std = a.std(ddof=1, dtype=np.float32)
        if std > 0:
            out_np = out_np / (std + np.float32(1e-6))
    return [float(x) for x in out_np.astype(np.float32)]


def _normalize(
    args: Namespace, samples: Sequence[Any], raw: list[Any], prompt_group_sizes: Sequence[int] | None
) -> list[Any]:
    """Miles' reward normalisation for grpo/gspo/reinforce++-baseline with ``--rewards-normalization``:
    per prompt group, one reward per rollout (siblings sharing ``rollout_id``, else ``index``, must
    agree), centred on the group's mean and, for grpo/gspo with ``--grpo-std-normalization``,
    divided by its std; then broadcast to the siblings. float32, as Miles' torch code."""
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in ("grpo", "gspo", "reinforce_plus_plus_baseline") or not getattr(
        args, "rewards_normalization", False
    ):
        return raw
    out: list[Any] = [0.0] * len(raw)
    for rows in _reward_segments(args, samples, prompt_group_sizes):
        by_rollout: dict[Any, list[int]] = {}
        for row in rows:
            s = samples[row]
            key = s.rollout_id if getattr(s, "rollout_id", None) is not None else s.index
            by_rollout.setdefault(key if key is not None else ("row", row), []).append(row)
        shared = []
        for key, sibling_rows in by_rollout.items():
            rewards = [raw[r] for r in sibling_rows]
            if any(r != rewards[0] for r in rewards[1:]):
                raise ValueError(
                    f"convert_samples_to_train_data: all samples in rollout {key!r} must share one reward; "
                    f"rows {sibling_rows} have rewards {rewards}"
                )
            shared.append(float(rewards[0]))
        centred = _centre(
            shared, estimator in ("grpo", "gspo") and getattr(args, "grpo_std_normalization", False)
        )
        for sibling_rows, value in zip(by_rollout.values(), centred, strict=True):
            for r in sibling_rows:
                out[r] = value
    return out


def _rollout_mask_sums(rollout_ids: list[Any], loss_masks: list[Any]) -> list[int]:
    totals: dict[Any, int] = {}
    for rid, mask in zip(rollout_ids, loss_masks, strict=True):
        totals[rid] = totals.get(rid, 0) + sum(mask)
    return [totals[rid] for rid in rollout_ids]


def _rewards(
    args: Namespace,
    samples: Sequence[Any],
    prompt_group_sizes: Sequence[int] | None,
    reward_fn: Callable[..., tuple[list[Any], list[Any]]] | None,
) -> tuple[list[Any], list[Any]]:
    if reward_fn is not None:
        raw, rewards = reward_fn(args, samples)
        if len(raw) != len(samples) or len(rewards) != len(samples):
            raise ValueError(
                f"convert_samples_to_train_data: custom_reward_post_process_func returned {len(raw)} raw "
                f"rewards and {len(rewards)} rewards for {len(samples)} samples"
            )
        return raw, rewards
    raw = [_reward_value(args, s) for s in samples]
    return raw, _normalize(args, samples, raw, prompt_group_sizes)


def _default_convert(
    args: Namespace,
    samples: Sequence[Any],
    metadata: Mapping[str, Any],
    reward_fn: Callable[..., tuple[list[Any], list[Any]]] | None = None,
    token_space: bool | None = None,
) -> dict[str, Any]:
    """Miles' default converter (``miles.ray.rollout.train_data_conversion``), key for key and
    value for value, without mutating the samples (Miles writes the loss masks back), plus the
    media references on the token-space path."""
    if token_space is None:
        token_space = bool(getattr(args, "enable_token_space_processor", False))
    prompt_group_sizes = metadata.get("prompt_group_sizes")
    raw, rewards = _rewards(args, samples, prompt_group_sizes, reward_fn)
    data: dict[str, Any] = {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [1 if getattr(s.status, "value", s.status) == "truncated" else 0 for s in samples],
        "sample_indices": [s.index for s in samples],
        "rollout_ids": [
            s.rollout_id if getattr(s, "rollout_id", None) is not None else s.index for s in samples
        ],
    }
    loss_masks = _loss_masks(samples)
    data["loss_masks"] = loss_masks
    data["rollout_mask_sums"] = _rollout_mask_sums(data["rollout_ids"], loss_masks)
    _add_sample_extras(data, samples, token_space)
    _add_adapter_fields(data, samples, metadata)
    if prompt_group_sizes is not None:
        data["prompt_group_sizes"] = prompt_group_sizes
    if getattr(samples[0], "opd_reverse_kl", None) is not None:
        data["opd_reverse_kl"] = [getattr(s, "opd_reverse_kl", None) for s in samples]
    _add_dynamic_batch_size(data, args, metadata)
    return data


def _loss_masks(samples: Sequence[Any]) -> list[Any]:
    # Miles writes these masks back into the samples; collecting them leaves the samples as read.
    loss_masks = []
    for position, s in enumerate(samples):
        mask = s.loss_mask if s.loss_mask is not None else [1] * s.response_length
        if len(mask) != s.response_length:
            raise ValueError(
                f"convert_samples_to_train_data: sample index {s.index} (position {position}): loss_mask has "
                f"{len(mask)} entries, expected response_length = {s.response_length}"
            )
        if getattr(s, "remove_sample", False):
            mask = [0] * s.response_length
        loss_masks.append(mask)
    return loss_masks


def _add_sample_extras(data: dict[str, Any], samples: Sequence[Any], token_space: bool) -> None:
    """The optional per-sample keys, present as Miles decides: most by the first sample alone."""
    first = samples[0]
    if first.metadata and "raw_reward" in first.metadata:
        data["raw_reward"] = [s.metadata["raw_reward"] for s in samples]
    if first.metadata and "round_number" in first.metadata:
        data["round_number"] = [s.metadata["round_number"] for s in samples]
    for key in ("rollout_log_probs", "rollout_routed_experts", "rollout_indexer_topk"):
        if getattr(first, key, None) is not None:
            data[key] = [getattr(s, key, None) for s in samples]
    if first.train_metadata is not None:
        data["metadata"] = [s.train_metadata for s in samples]
    if token_space:
        # The token-space path: the trainer rebuilds the vision tensors from the media references
        # (get_rollout_data), so the references travel in the train data. A sample that also
        # carries dense tensors ships both, and the guard names it.
        refs = [s.multimodal_inputs if _media_count(s.multimodal_inputs) else None for s in samples]
        if any(r is not None for r in refs):
            data["multimodal_inputs"] = refs
    if any(s.multimodal_train_inputs is not None for s in samples):
        data["multimodal_train_inputs"] = [s.multimodal_train_inputs for s in samples]
    if any(s.weight_versions for s in samples):
        data["weight_versions"] = [s.weight_versions for s in samples]
    if getattr(first, "teacher_log_probs", None) is not None:
        data["teacher_log_probs"] = [getattr(s, "teacher_log_probs", None) for s in samples]


def _add_adapter_fields(data: dict[str, Any], samples: Sequence[Any], metadata: Mapping[str, Any]) -> None:
    adapters = [getattr(s, "adapter", None) for s in samples]
    if not any(a is not None for a in adapters):
        return
    if not all(a is not None for a in adapters):
        raise ValueError("convert_samples_to_train_data: cannot mix adapter and adapter-less samples")
    data["adapter_slots"] = [a.slot for a in adapters if a is not None]
    step_slots = sorted(metadata.get("step_slots", []))
    data["step_slots"] = step_slots
    data["step_adapter_names"] = sorted(metadata.get("step_adapter_names", []))
    step_set = set(step_slots)
    data["step_adapter_batch_sizes"] = {
        s.adapter.slot: s.metadata["adapter_global_batch_size"] for s in samples if s.adapter.slot in step_set
    }


def _add_dynamic_batch_size(data: dict[str, Any], args: Namespace, metadata: Mapping[str, Any]) -> None:
    dynamic = metadata.get("dynamic_global_batch_size")
    if bool(getattr(args, "use_dynamic_global_batch_size", False)) != (dynamic is not None):
        raise ValueError(
            "convert_samples_to_train_data: --use-dynamic-global-batch-size is "
            f"{bool(getattr(args, 'use_dynamic_global_batch_size', False))} but metadata.dynamic_global_batch_size "
            f"is {dynamic!r}: they go together"
        )
    if dynamic is not None:
        data["dynamic_global_batch_size"] = dynamic


def convert_samples_to_train_data(
    args: Namespace,
    samples: Sequence[Any],
    metadata: Mapping[str, Any] | None = None,
    custom_convert_samples_to_train_data_func: Callable[..., dict[str, Any]] | None = None,
    custom_reward_post_process_func: Callable[..., tuple[list[Any], list[Any]]] | None = None,
    *,
    token_space: bool | None = None,
) -> dict[str, Any]:
    """Miles' conversion of samples into a dict of per-sample lists, with the guard.

    The default converter returns what Miles' own ``convert_samples_to_train_data`` returns, key
    for key and value for value (tests/test_miles_convert.py runs both side by side): ``tokens``,
    ``response_lengths``, ``rewards`` (normalised per prompt group and rollout, in float32),
    ``raw_reward``, ``truncated``, ``sample_indices``, ``rollout_ids``, ``loss_masks``,
    ``rollout_mask_sums``, and as Miles adds them ``round_number``, ``rollout_log_probs``,
    ``rollout_routed_experts``, ``rollout_indexer_topk``, ``metadata`` (``train_metadata``),
    ``multimodal_train_inputs``, ``weight_versions``, ``teacher_log_probs``, ``adapter_slots`` /
    ``step_slots`` / ``step_adapter_names`` / ``step_adapter_batch_sizes``, ``prompt_group_sizes``,
    ``opd_reverse_kl``, ``dynamic_global_batch_size``. It does not write loss masks back into the
    samples as Miles does.

    One addition, on the token-space path only (``token_space``, default
    ``args.enable_token_space_processor``; :func:`get_rollout_data` passes True), where the trainer
    rebuilds vision tensors from media references: ``multimodal_inputs`` (each sample's references,
    None for a sample without media). A sample there that also carries dense tensors ships both,
    which the guard refuses. Off that path, Miles' ordinary VLM samples (images *and* dense
    tensors) convert exactly as in Miles, and the guard never fires on them.

    ``custom_convert_samples_to_train_data_func(args, samples)`` replaces the default converter;
    ``custom_reward_post_process_func(args, samples) -> (raw_rewards, rewards)`` replaces the
    reward step of the default one.

    Raises:
        ValueError: the output (of either converter) carries both media references and dense
            ``multimodal_train_inputs`` for a sample, naming the first such sample index; a
            sample's ``loss_mask`` length differs from its ``response_length``; siblings of one
            rollout disagree on their reward; ``metadata.prompt_group_sizes`` do not add up; or
            ``--use-dynamic-global-batch-size`` and ``metadata.dynamic_global_batch_size`` disagree.
    """
    samples = list(samples)
    if custom_convert_samples_to_train_data_func is not None:
        data = custom_convert_samples_to_train_data_func(args, samples)
        name = getattr(custom_convert_samples_to_train_data_func, "__qualname__", "custom converter")
        check_train_data(data, f"convert_samples_to_train_data (custom converter {name})")
        return data
    if not samples:
        raise ValueError("convert_samples_to_train_data: expected at least one sample, found none")
    data = _default_convert(args, samples, metadata or {}, custom_reward_post_process_func, token_space)
    check_train_data(data)
    return data
