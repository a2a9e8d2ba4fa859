"""Debug dumps for the replay tests: real screenshots-like PNGs in a run's media directory,
samples whose tokens hold each image's placeholders expanded as the token-space processor
expands them (counts taken from the real Qwen2-VL processor), written with
``save_debug_rollout_data``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.args import dump_args
from helpers.media import noise_png
from trainer_hooks import Sample, load_processor, save_debug_rollout_data, store_media

PAD = 151655
PROMPT = [151644, 872, 198]  # <|im_start|>user\n
VISION_START, VISION_END = 151652, 151653


def expanded_counts(paths: list[str], settings: dict[str, Any] | None = None) -> list[int]:
    """Placeholder tokens per image, as the token-space processor makes them."""
    from PIL import Image

    proc = load_processor(settings)
    images = [Image.open(p).convert("RGB") for p in paths]
    grid = proc(images=images, return_tensors="pt")["image_grid_thw"]
    return [int(t * h * w) // proc.merge_size**2 for t, h, w in grid.tolist()]


def make_samples(
    args: Any,
    n: int = 3,
    *,
    size: tuple[int, int] = (112, 84),
    images_per_sample: int = 2,
    expanded_twice: tuple[int, ...] = (),
    dense: tuple[int, ...] = (),
    text_only: tuple[int, ...] = (),
) -> list[Sample]:
    """``n`` completed samples with images stored in ``args``' run media directory (positions in
    ``dense`` also carry multimodal_train_inputs, in ``expanded_twice`` twice the placeholders, in
    ``text_only`` no image)."""
    import torch

    samples = []
    for i in range(n):
        tokens = list(PROMPT)
        images = []
        if i not in text_only:
            for j in range(images_per_sample):
                w, h = size[0] + 28 * j, size[1]
                images.append(store_media(args, noise_png(w, h, seed=100 * i + j), ".png"))
            for count in expanded_counts([r.path for r in images]):
                count *= 2 if i in expanded_twice else 1
                tokens += [VISION_START, *[PAD] * count, VISION_END]
        response = [9707 + i, 11, 1879, 151645]
        s = Sample(
            group_index=i // 2,
            index=10 + i,
            prompt="describe",
            tokens=tokens + response,
            multimodal_inputs={"images": images} if images else None,
            response="ok",
            response_length=len(response),
            reward=1.0,
            loss_mask=[1] * len(response),
            rollout_log_probs=[-0.25] * len(response),
            status=Sample.Status.COMPLETED,
        )
        if i in dense:
            s.multimodal_train_inputs = {
                "pixel_values": torch.zeros(4, 1176),
                "image_grid_thw": torch.tensor([[1, 2, 2]]),
            }
        samples.append(s)
    return samples


def make_dump(
    tmp_path: Path,
    n: int = 3,
    *,
    dtype: str = "--bf16",
    token_space: bool = True,
    name: str = "dump",
    **kwargs: Any,
) -> Path:
    """Write a debug dump of :func:`make_samples`; return its path."""
    args = dump_args(tmp_path, name, dtype, token_space)
    return save_debug_rollout_data(args, make_samples(args, n, **kwargs), 0, evaluation=False)
