"""Writing sample dicts as a bundle, and what every bundle a run writes records about the run.

Shared by rollout checkpoints and debug dumps: media are taken from ``run_media_dir(args)`` (any
absolute path string under it, and every ``MediaRef``); PIL images are stored by
:func:`bundles.write_bundle` as PNG media and read back as PIL images.
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bundles import Location, OutsidePolicy, write_bundle
from trainer_hooks._sample import register_record_types
from trainer_hooks.run_media import run_media_dir

__all__ = [
    "other_run_media_policy",
    "processor_settings",
    "run_media_roots",
    "run_meta",
    "training_dtype_name",
    "write_samples_bundle",
]


def write_samples_bundle(
    dest: str | os.PathLike[str],
    samples: Sequence[dict[Any, Any]],
    *,
    media_roots: Sequence[str | os.PathLike[str]],
    kind: str,
    meta: dict[str, Any],
    link: str,
    overwrite: bool,
    missing_media: str = "error",
    outside_paths: OutsidePolicy = "warn",
) -> Location:
    """``write_bundle`` of sample dicts, with this package's record types (``AdapterRef``,
    ``RewardSpec``, and Miles' when it is loaded) registered first. PIL images are stored by the
    bundle writer as PNG media. ``outside_paths`` is passed on (see :func:`other_run_media_policy`).
    ``dest`` may be an object-store URL: then media go to the pool shared with its siblings."""
    register_record_types()
    return write_bundle(
        dest,
        samples,
        media_roots=media_roots,
        kind=kind,
        meta=meta,
        link=link,
        overwrite=overwrite,
        progress=False,
        missing_media=missing_media,
        outside_paths=outside_paths,
        # On a store, the bundles beside one another (a run's checkpoints, its dumps) share one
        # content-addressed media pool: a screenshot is uploaded once per run (in a directory
        # they share it already: hard links).
        shared_media=True,
    )


def training_dtype_name(args: Namespace) -> str:
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
        "training_dtype": training_dtype_name(args),
        "processor": processor_settings(args),
    }


def other_run_media_policy(args: Namespace) -> OutsidePolicy:
    """The ``outside_paths`` policy of a run's saves: a path string under ``--shared-media-dir``
    but outside this run's directory is another run's media, which that run deletes at teardown,
    so the save is refused naming the key path; any other absolute path to a file outside the
    media roots gets write_bundle's warning."""
    shared = getattr(args, "shared_media_dir", None)
    run_dir = run_media_dir(args)
    if shared is None or run_dir is None:
        return "warn"
    shared_prefix = os.path.abspath(shared).rstrip(os.sep) + os.sep
    run_prefix = os.path.abspath(run_dir).rstrip(os.sep) + os.sep

    def policy(path: str) -> str:
        norm = os.path.normpath(path)
        if norm.startswith(shared_prefix) and not (norm + os.sep).startswith(run_prefix):
            return "error"
        return "warn"

    return policy


def run_media_roots(args: Namespace) -> list[Path]:
    run_dir = run_media_dir(args)
    return [] if run_dir is None else [run_dir]
