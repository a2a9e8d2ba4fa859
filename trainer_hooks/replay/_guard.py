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
    if callable(get):
        return get(args)
    key = getattr(args, "reward_key", None)
    reward = sample.reward
    return reward[key] if key and isinstance(reward, Mapping) else reward


def _normalize(args: Namespace, samples: Sequence[Any], raw: list[Any]) -> list[Any]:
    """Miles' group normalisation for grpo/gspo/reinforce++-baseline with ``--rewards-normalization``:
    subtract the mean of each prompt group (``group_index``), optionally divide by its std."""
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in ("grpo", "gspo", "reinforce_plus_plus_baseline") or not getattr(
        args, "rewards_normalization", False
    ):
        return raw
    groups: dict[Any, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group_index if s.group_index is not None else ("row", i), []).append(i)
    out = [0.0] * len(raw)
    for rows in groups.values():
        values = [float(raw[i]) for i in rows]
        mean = sum(values) / len(values)
        centred = [v - mean for v in values]
        if (
            estimator in ("grpo", "gspo")
            and getattr(args, "grpo_std_normalization", False)
            and len(values) > 1
        ):
            std = (sum(c * c for c in centred) / (len(values) - 1)) ** 0.5  # torch.std: unbiased
            if std > 0:
                centred = [c / (std + 1e-6) for c in centred]
        for i, c in zip(rows, centred, strict=True):
            out[i] = c
    return out


def _default_convert(args: Namespace, samples: Sequence[Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    raw = [_reward_value(args, s) for s in samples]
    data: dict[str, Any] = {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": _normalize(args, samples, raw),
        "raw_reward": raw,
        "truncated": [1 if getattr(s.status, "value", s.status) == "truncated" else 0 for s in samples],
        "sample_indices": [s.index for s in samples],
    }
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
    data["loss_masks"] = loss_masks
    first = samples[0]
    if first.metadata and "raw_reward" in first.metadata:
        data["raw_reward"] = [s.metadata["raw_reward"] for s in samples]
    if first.metadata and "round_number" in first.metadata:
        data["round_number"] = [s.metadata["round_number"] for s in samples]
    if first.rollout_log_probs is not None:
        data["rollout_log_probs"] = [s.rollout_log_probs for s in samples]
    for key in ("rollout_routed_experts", "rollout_indexer_topk", "teacher_log_probs"):
        if getattr(first, key, None) is not None:
            data[key] = [getattr(s, key, None) for s in samples]
    if first.train_metadata is not None:
        data["metadata"] = [s.train_metadata for s in samples]
    if any(s.multimodal_inputs for s in samples):
        data["multimodal_inputs"] = [s.multimodal_inputs for s in samples]
    if any(s.multimodal_train_inputs is not None for s in samples):
        data["multimodal_train_inputs"] = [s.multimodal_train_inputs for s in samples]
    if any(s.weight_versions for s in samples):
        data["weight_versions"] = [s.weight_versions for s in samples]
    if (sizes := metadata.get("prompt_group_sizes")) is not None:
        data["prompt_group_sizes"] = sizes
    return data


def convert_samples_to_train_data(
    args: Namespace,
    samples: Sequence[Any],
    metadata: Mapping[str, Any] | None = None,
    custom_convert_samples_to_train_data_func: Callable[..., dict[str, Any]] | None = None,
    custom_reward_post_process_func: Callable[..., tuple[list[Any], list[Any]]] | None = None,
) -> dict[str, Any]:
    """Miles' conversion of samples into a dict of per-sample lists, with the guard.

    Keys (default converter): ``tokens``, ``response_lengths``, ``rewards``, ``raw_reward``,
    ``truncated``, ``sample_indices``, ``loss_masks``; ``rollout_log_probs`` when the samples
    have them; ``multimodal_inputs`` and ``multimodal_train_inputs`` (one entry per sample,
    None where a sample has none) when any sample has them; ``weight_versions``, ``metadata``
    (``train_metadata``), ``round_number`` and ``prompt_group_sizes`` as Miles adds them.

    ``custom_convert_samples_to_train_data_func(args, samples)`` replaces the default converter;
    ``custom_reward_post_process_func(args, samples) -> (raw_rewards, rewards)`` replaces the
    reward step of the default one.

    Raises:
        ValueError: the output (of either converter) carries both media references and dense
            ``multimodal_train_inputs`` for a sample, naming the first such sample index; or a
            sample's ``loss_mask`` length differs from its ``response_length``.
    """
    samples = list(samples)
    if custom_convert_samples_to_train_data_func is not None:
        data = custom_convert_samples_to_train_data_func(args, samples)
        name = getattr(custom_convert_samples_to_train_data_func, "__qualname__", "custom converter")
        check_train_data(data, f"convert_samples_to_train_data (custom converter {name})")
        return data
    if not samples:
        raise ValueError("convert_samples_to_train_data: expected at least one sample, found none")
    data = _default_convert(args, samples, metadata or {})
    if custom_reward_post_process_func is not None:
        raw, rewards = custom_reward_post_process_func(args, samples)
        if len(raw) != len(samples) or len(rewards) != len(samples):
            raise ValueError(
                f"convert_samples_to_train_data: custom_reward_post_process_func returned {len(raw)} raw "
                f"rewards and {len(rewards)} rewards for {len(samples)} samples"
            )
        data["raw_reward"], data["rewards"] = list(raw), list(rewards)
    check_train_data(data)
    return data
