"""The token-space check: :func:`check_image_tokens`.

In token space the trainer expands every image into ``prod(image_grid_thw) // merge_size**2``
placeholder tokens (``<|image_pad|>``, id 151655 for Qwen2-VL) inside ``sample.tokens``. If the
count in the tokens differs from what the processor makes of the image now, the model is trained
on a sequence that does not line up with its vision features: a changed ``max_pixels`` (another
resize), or an engine that expanded the placeholders again (then the count is exactly double).

Each image's placeholders form one contiguous run, in image order. When the number of runs equals
the number of images, each run is compared to its image; otherwise the totals are compared and
the problem is reported for the sample as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["check_image_tokens", "placeholder_runs", "vision_token_counts"]


def vision_token_counts(image_grid_thw: Any, merge_size: int) -> list[int]:
    """Placeholder tokens per image: ``t * h * w // merge_size**2`` for each ``(t, h, w)`` row."""
    rows = image_grid_thw.tolist() if hasattr(image_grid_thw, "tolist") else list(image_grid_thw)
    return [int(t) * int(h) * int(w) // (merge_size * merge_size) for t, h, w in rows]


def placeholder_runs(tokens: Sequence[int], token_id: int) -> list[int]:
    """Lengths of the contiguous runs of ``token_id`` in ``tokens``, in order."""
    runs: list[int] = []
    n = 0
    for t in tokens:
        if t == token_id:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    if n:
        runs.append(n)
    return runs


def _twice(expected: int, found: int) -> str:
    return " (expanded twice)" if expected and found == 2 * expected else ""


def check_image_tokens(
    tokens: Sequence[int],
    image_grid_thw: Any,
    *,
    merge_size: int = 2,
    image_token_id: int = 151655,
    sample_index: Any = None,
) -> tuple[list[int], list[int | None], list[dict[str, Any]]]:
    """Compare each image's placeholder count in ``tokens`` with the processor's count.

    Returns:
        ``(expected per image, found per image (None when runs can't be matched to images),
        problems)``; each problem is ``{"kind": "token_count", "message": ..., "image": j | None}``
        naming the sample index, the image index, the expected and the found count.
    """
    expected = vision_token_counts(image_grid_thw, merge_size)
    runs = placeholder_runs(tokens, image_token_id)
    problems: list[dict[str, Any]] = []
    if len(runs) == len(expected):
        for j, (e, f) in enumerate(zip(expected, runs, strict=True)):
            if e != f:
                problems.append(
                    {
                        "kind": "token_count",
                        "image": j,
                        "message": f"sample index {sample_index}, image {j}: expected {e} placeholder tokens "
                        f"(id {image_token_id}) from image_grid_thw, found {f}{_twice(e, f)}",
                    }
                )
        return expected, list(runs), problems
    total_e, total_f = sum(expected), sum(runs)
    problems.append(
        {
            "kind": "token_count",
            "image": None,
            "message": f"sample index {sample_index}: {len(expected)} image(s) expect {total_e} placeholder "
            f"tokens (id {image_token_id}) in {len(expected)} run(s) {expected}, found {total_f} in "
            f"{len(runs)} run(s){_twice(total_e, total_f)}",
        }
    )
    return expected, [None] * len(expected), problems
