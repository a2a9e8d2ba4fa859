"""Rebuild ``multimodal_train_inputs`` from media references, casting as the tensors leave the
processor: :func:`compute_multimodal_train_inputs`, :func:`training_dtype`, :func:`get_rollout_data`.

Why the cast happens here: the Qwen2-VL image processor returns float32 ``pixel_values``
(``[patches, 1176]``), and the trainer's ``get_rollout_data`` holds every sample's rebuilt
tensors for the whole step. At 1920x1080 one image is 10764 patches, 50.6 MB in float32; two
screenshots per sample over a rollout batch ran H200 ranks out of memory in round 0. The vision
tower runs in the training dtype, so casting floating tensors to bf16 (fp16 under ``--fp16``)
changes nothing it sees; fp32 runs and integer tensors (``image_grid_thw``) stay exactly as the
processor made them.

Samples are processed one at a time, and within a sample one image at a time (Qwen2-VL's outputs
are per-image rows, so the concatenation is the same tensor a whole-sample call returns); each
floating tensor is cast before the next image is processed, so the peak stays near one image's
float32 output plus the cast results so far (``benchmarks/bench_replay.py`` measures it: the bf16
rebuild of 20 samples x two 1080p screenshots peaks at under 0.6x the float32 one's RSS).
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from trainer_hooks._sample_bundle import training_dtype_name
from trainer_hooks.replay._media import MediaReader
from trainer_hooks.replay._memory import release_freed_memory

__all__ = [
    "DTYPE_NAMES",
    "compute_multimodal_train_inputs",
    "dtype_from_name",
    "get_rollout_data",
    "processed_batches",
    "sample_images",
    "training_dtype",
]

DTYPE_NAMES = ("bf16", "fp16", "fp32")
# Processor outputs that belong to the language side, not to multimodal_train_inputs.
_TEXT_KEYS = frozenset({"input_ids", "attention_mask"})


def dtype_from_name(name: str) -> Any:
    """``"bf16"``/``"fp16"``/``"fp32"`` (as bundle meta records ``training_dtype``) → ``torch.dtype``."""
    import torch

    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if name not in table:
        raise ValueError(f"training dtype: expected one of {', '.join(DTYPE_NAMES)}, found {name!r}")
    return table[name]


def training_dtype(args: Namespace) -> Any:
    """``torch.bfloat16`` under ``--bf16``, ``torch.float16`` under ``--fp16``, else ``torch.float32``.

    Bundle meta keeps the string form (``meta["training_dtype"]``: ``"bf16"``, ``"fp16"``, ``"fp32"``).
    """
    return dtype_from_name(training_dtype_name(args))


def sample_images(sample: Any, where: str = "sample") -> list[Any]:
    """The images of ``sample.multimodal_inputs`` (paths, ``MediaRef``s or PIL images), in order.

    Raises:
        ValueError: ``multimodal_inputs`` is not a mapping or its ``images`` not a list, naming
            ``where`` and the key.
    """
    mm = (
        getattr(sample, "multimodal_inputs", None)
        if not isinstance(sample, Mapping)
        else sample.get("multimodal_inputs")
    )
    if not mm:
        return []
    if not isinstance(mm, Mapping):
        raise ValueError(
            f"{where}: multimodal_inputs: expected an object with 'images', found {type(mm).__name__}"
        )
    images = mm.get("images")
    if images is None:
        return []
    if not isinstance(images, (list, tuple)):  # a lone path string would be read as its characters
        raise ValueError(f"{where}: multimodal_inputs.images: expected a list, found {type(images).__name__}")
    return list(images)


def _cast(value: Any, dtype: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


def processed_batches(
    images: Sequence[Any],
    processor: Callable[..., Any],
    reader: MediaReader,
    where: str,
    *,
    per_image: bool = True,
) -> Iterator[dict[str, Any]]:
    """The processor's outputs (``input_ids``/``attention_mask`` left out) for ``images`` of the
    sample ``where`` names, one image (or, ``per_image=False``, the whole list) at a time.

    The caller owns each yielded dict and should ``pop`` its values: this generator keeps no other
    reference to them, so a popped float32 tensor is freed as soon as the caller drops it."""
    batches = [list(images)] if not per_image else [[img] for img in images]
    for first, batch in zip(range(0, len(images), len(batches[0])), batches, strict=True):
        pil = [
            reader.image(img, f"{where}: multimodal_inputs.images[{first + j}]")
            for j, img in enumerate(batch)
        ]
        raw = processor(images=pil, return_tensors="pt")
        del pil
        out = {key: raw[key] for key in list(raw.keys()) if key not in _TEXT_KEYS}
        del raw
        yield out


def compute_multimodal_train_inputs(
    samples: Iterable[Any],
    processor: Callable[..., Any],
    dtype: Any,
    *,
    per_image: bool = True,
    on_sample: Callable[[int, dict[str, Any] | None, int], None] | None = None,
    first_position: int = 0,
    media: MediaReader | None = None,
) -> list[dict[str, Any] | None]:
    """Rebuild each sample's vision tensors from its referenced images, cast to ``dtype``.

    Args:
        samples: objects (or dicts) with ``multimodal_inputs["images"]``: paths, ``MediaRef``s
            (their ``path``) or PIL images.
        processor: a transformers image processor, or a :class:`ReplayProcessor`, called as
            ``processor(images=[...], return_tensors="pt")``.
        per_image: call the processor once per image and concatenate each output along dim 0
            (default). A Qwen2-VL-family processor's outputs are per-image rows (patches of
            ``pixel_values``, rows of ``image_grid_thw``) concatenated in image order, so this gives
            exactly the tensors of one call per sample (tested) while only one image's float32
            output exists at a time. False: one call per sample, for processors that batch.
        dtype: the ``torch.dtype`` floating tensors are cast to (see :func:`training_dtype`);
            float32 leaves them untouched. Integer tensors are never cast.
        on_sample: called after each sample with ``(position, cast_inputs, fp32_bytes)``, where
            ``fp32_bytes`` is what the processor returned before the cast (for accounting).
        first_position: the position of the first sample, for messages and ``on_sample`` (a slice
            of a batch, as a replay rebuilds one sample at a time).
        media: where image bytes come from (:class:`~trainer_hooks.replay._media.MediaReader`):
            a replay passes one confined to its bundle; default: the paths are the caller's own
            files (a trainer's run media). Either way every image is decoded by
            :func:`bundles.decode_image` (PNG/JPEG only, size bounded) and converted to RGB.

    Returns:
        One dict per sample (processor outputs except ``input_ids``/``attention_mask``), or None
        for a sample without images.
    """
    reader = media if media is not None else MediaReader()
    out: list[dict[str, Any] | None] = []
    for position, sample in enumerate(samples, first_position):
        index = getattr(sample, "index", None) if not isinstance(sample, Mapping) else sample.get("index")
        where = f"sample index {index} (position {position})"
        images = sample_images(sample, where)
        cast, before = None, 0
        if images:
            cast, before = _rebuild_images(images, processor, dtype, reader, where, per_image)
        out.append(cast)
        if on_sample is not None:
            on_sample(position, cast, before)
    return out


def _rebuild_images(
    images: Sequence[Any],
    processor: Callable[..., Any],
    dtype: Any,
    reader: MediaReader,
    where: str,
    per_image: bool,
) -> tuple[dict[str, Any], int]:
    """One sample's processor outputs, each floating tensor cast as it leaves the processor and
    the parts concatenated in image order; and the bytes the processor returned before the cast."""
    import torch

    parts: dict[str, list[Any]] = {}
    before = 0
    for raw in processed_batches(images, processor, reader, where, per_image=per_image):
        for key in list(raw):
            # pop: the float32 original must be gone before the next image is processed
            value = raw.pop(key)
            if isinstance(value, torch.Tensor):
                before += value.numel() * value.element_size()
            parts.setdefault(key, []).append(_cast(value, dtype))
            del value
    cast: dict[str, Any] = {}
    for key, values in parts.items():
        if len(values) == 1:
            cast[key] = values[0]
        elif all(isinstance(v, torch.Tensor) for v in values):
            cast[key] = torch.cat(values, dim=0)
        else:
            cast[key] = values
    del parts
    release_freed_memory()  # the float32 buffers just freed must not stay resident
    return cast, before


def get_rollout_data(
    args: Namespace,
    samples: Sequence[Any],
    processor: Callable[..., Any],
    metadata: Mapping[str, Any] | None = None,
    custom_convert_samples_to_train_data_func: Callable[..., Any] | None = None,
    custom_reward_post_process_func: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """The trainer-side entry: train data with ``multimodal_train_inputs`` rebuilt in the training dtype.

    Converts ``samples`` with :func:`convert_samples_to_train_data` (the guard included), then
    rebuilds every sample's vision tensors from its media references with
    :func:`compute_multimodal_train_inputs` at :func:`training_dtype` ``(args)``. A sample without
    references keeps the dense ``multimodal_train_inputs`` it shipped, as they are.
    """
    from trainer_hooks.replay._guard import convert_samples_to_train_data

    data = convert_samples_to_train_data(
        args,
        list(samples),
        metadata,
        custom_convert_samples_to_train_data_func,
        custom_reward_post_process_func,
        token_space=True,  # the trainer side of the token-space path: references in the train data
    )
    rebuilt = compute_multimodal_train_inputs(samples, processor, training_dtype(args))
    # A sample without media references may have shipped dense tensors (the guard allows one kind
    # or the other): it keeps them; only samples with references get the rebuilt ones.
    shipped = data.get("multimodal_train_inputs") or [None] * len(rebuilt)
    if len(shipped) != len(rebuilt):
        raise ValueError(
            f"get_rollout_data: multimodal_train_inputs has {len(shipped)} entries for {len(rebuilt)} samples"
        )
    merged = [r if r is not None else s for r, s in zip(rebuilt, shipped, strict=True)]
    if any(m is not None for m in merged):
        data["multimodal_train_inputs"] = merged
    return data
