"""Writing sample dicts as a bundle, and what every bundle a run writes records about the run.

Shared by rollout checkpoints and debug dumps: media are taken from ``run_media_dir(args)`` (any
absolute path string under it, and every ``MediaRef``); PIL images are encoded to PNG media on the
way (:class:`trainer_hooks._images.ImageSink`).
"""

from __future__ import annotations

import os
import shutil
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bundles import scratch_dir, write_bundle
from trainer_hooks._images import ImageSink
from trainer_hooks._run_media import run_media_dir

__all__ = ["processor_settings", "run_meta", "training_dtype", "write_samples_bundle"]


def write_samples_bundle(
    dest: Path,
    samples: Sequence[dict[Any, Any]],
    *,
    media_roots: Sequence[str | os.PathLike[str]],
    kind: str,
    meta: dict[str, Any],
    link: str,
    overwrite: bool,
    missing_media: str = "error",
) -> Path:
    """``write_bundle`` after turning PIL images into PNG media in a temporary directory beside
    ``dest`` (same filesystem, so the bundle can hard-link them); the directory is removed after."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch_dir(dest, "images")  # removed by the next save if this process dies
    try:
        sink = ImageSink(tmp)
        prepared = [sink.replace(s, f"samples[{i}]") for i, s in enumerate(samples)]
        roots = [*media_roots, tmp] if sink.count else list(media_roots)
        return write_bundle(
            dest,
            prepared,
            media_roots=roots,
            kind=kind,
            meta=meta,
            link=link,
            overwrite=overwrite,
            progress=False,
            missing_media=missing_media,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def training_dtype(args: Namespace) -> str:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "fp32"


def processor_settings(args: Namespace) -> dict[str, Any] | None:
    """The engines' resolved processor settings (``args.rollout_processor_args``), or None."""
    proc = getattr(args, "rollout_processor_args", None)
    return None if proc is None else proc.to_dict()


def run_meta(args: Namespace) -> dict[str, Any]:
    """What every bundle written by a run records about it."""
    return {
        "run_uuid": getattr(args, "run_uuid", None),
        "training_dtype": training_dtype(args),
        "processor": processor_settings(args),
    }


def _media_roots(args: Namespace) -> list[Path]:
    run_dir = run_media_dir(args)
    return [] if run_dir is None else [run_dir]
