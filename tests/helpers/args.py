"""Trainer options for tests, parsed by the real parser (``trainer_hooks.parse_args``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["dump_args", "trainer_args"]


def trainer_args(
    tmp_path: Path,
    run: str | None = "run-a",
    *extra: str,
    batch_size: int = 1,
    checkpoints: bool = True,
    dumps: str | None = None,
) -> Any:
    """Parsed options of a run ``run`` under ``tmp_path``: ``--shared-media-dir tmp_path/shared``,
    ``--run-uuid run`` (left to the parser when None), ``--rollout-batch-size batch_size``;
    ``--save``/``--load tmp_path/ckpt`` when ``checkpoints``; ``--save/--load-debug-rollout-data
    tmp_path/dumps/<dumps>`` when ``dumps`` names a template; then ``extra``."""
    from trainer_hooks import parse_args

    argv = ["--rollout-batch-size", str(batch_size), "--shared-media-dir", str(tmp_path / "shared")]
    if run is not None:
        argv += ["--run-uuid", run]
    if checkpoints:
        argv += ["--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt")]
    if dumps is not None:
        template = str(tmp_path / "dumps" / dumps)
        argv += ["--save-debug-rollout-data", template, "--load-debug-rollout-data", template]
    return parse_args([*argv, *extra])


def dump_args(tmp_path: Path, name: str, dtype: str = "--bf16", token_space: bool = True) -> Any:
    extra = [dtype, "--save-debug-rollout-data", str(tmp_path / f"{name}_{{rollout_id}}")]
    if token_space:
        extra += [
            "--enable-token-space-processor",
            "--sglang-model-path", "Qwen/Qwen2-VL-7B-Instruct",
            "--sglang-image-processor-backend", "pil",
            "--sglang-mm-process-config", '{"image": {"max_pixels": 12845056, "min_pixels": 3136}}',
        ]  # fmt: skip
    return trainer_args(tmp_path, f"run-{name}", *extra)
