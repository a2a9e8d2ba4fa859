"""A small run for the dataset tests: bundles of three steps and two kinds, samples with rewards,
screenshots (real PNGs of seeded pixels), computer-use actions, and fields no column names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import bundles
from helpers.media import noise_png, put_media

STEPS = (0, 1, 2)
PER_STEP = 5


def sample(step: int, i: int, media: Path) -> dict[str, Any]:
    """Sample ``i`` of ``step``: two screenshots and two actions when ``i`` is even, else a plain
    prompt/response with one screenshot; rewards vary with step and position."""
    shots = [put_media(media, noise_png(12 + j, 9, seed=100 * step + 10 * i + j)) for j in range(2 - i % 2)]
    metadata: dict[str, Any] = {"task": f"t{i}", "screen": [12, 9]}
    if i % 2 == 0:
        metadata["actions"] = [f"click({i}, {j})" for j in range(2)]
    return {
        "index": 100 * step + i,
        "group_index": i // 2,
        "prompt": f"open the settings, step {step}",
        "response": f"done {i}",
        "reward": (step + i) / 10,
        "status": "completed" if i != 3 else "truncated",
        "response_length": 3,
        "tokens": [151644, 872, 9707 + i],
        "rollout_log_probs": [-0.25, -0.5, -0.125],
        "loss_mask": [0, 1, 1],
        "multimodal_inputs": {"images": shots},
        "metadata": metadata,
        "advantages": np.arange(3, dtype=np.float32) * (i + 1),
        "label": None,
    }


def make_run(root: Path) -> dict[str, Any]:
    """Bundles under ``root/run`` (one per step, kind ``rollout``, and one ``debug_dump``); returns
    the expected figures: mean reward per step, sample counts per kind."""
    media = root / "media"
    run = root / "run"
    figures: dict[str, Any] = {"avg": {}, "count": {}}
    for step in STEPS:
        samples = [sample(step, i, media) for i in range(PER_STEP)]
        bundles.write_bundle(run / "rollout" / f"fully_async_{step}", samples, media_roots=[media],
                             kind="rollout", meta={"rollout_id": step})  # fmt: skip
        figures["avg"][step] = sum(s["reward"] for s in samples) / len(samples)
    odd = [{}, {"reward": {"score": 1.0}, "tokens": [2**40], "status": "completed"}]
    bundles.write_bundle(run / "debug" / "rollout_9.bundle", odd, kind="debug_dump", meta={"rollout_id": 9})
    figures["count"] = {"rollout": len(STEPS) * PER_STEP, "debug_dump": len(odd)}
    return {"run": run, "media": media, **figures}
