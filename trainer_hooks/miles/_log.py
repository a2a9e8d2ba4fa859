"""Bundled debug dumps for a stock Miles run: ``--custom-rollout-log-function-path``.

Miles' ``RolloutManager.generate`` calls ``log_rollout_data(rollout_id, args, samples, metrics,
rollout_time)`` right after it writes its own ``--dump-details`` / ``--save-debug-rollout-data``
pickle, and ``log_rollout_data`` first calls the function that option names. Pointing it at
:func:`log_rollout_bundle` makes every training step also leave a bundle of the same samples
(screenshots stored once by digest, PIL images as PNG, no pickle) that outlives the run's
teardown and that ``rollout-bundle view|replay|show`` open on any machine::

    --custom-rollout-log-function-path trainer_hooks.miles.log_rollout_bundle

The bundle goes beside Miles' own dump: ``<--save-debug-rollout-data without .pt>.bundle`` (with
``--dump-details DIR``: ``DIR/rollout_data/<id>.bundle``). Without either option it writes nothing.
It returns False, so Miles' own logging runs as before. A run that has its own log function calls
this one from it. Media roots are the run's (``--shared-media-dir``/``--run-uuid``) when the run
has them; paths outside them are kept as strings with one warning per dump (see
``write_bundle``'s ``outside_paths``).
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from trainer_hooks.dumps import save_debug_rollout_data
from trainer_hooks.miles._settings import check_args

__all__ = ["bundle_dump_template", "log_rollout_bundle"]

BUNDLE_SUFFIX = ".bundle"


def bundle_dump_template(args: Any) -> str | None:
    """Where :func:`log_rollout_bundle` writes: Miles' dump template with ``.pt`` replaced by
    ``.bundle`` (None when the run dumps nothing)."""
    template = getattr(args, "save_debug_rollout_data", None)
    if template is None and getattr(args, "dump_details", None) is not None:
        template = f"{args.dump_details}/rollout_data/{{rollout_id}}.pt"  # what Miles derives from it
    if template is None:
        return None
    return (template[: -len(".pt")] if template.endswith(".pt") else template) + BUNDLE_SUFFIX


def log_rollout_bundle(
    rollout_id: int, args: Any, samples: Any, rollout_extra_metrics: Any = None, rollout_time: Any = None
) -> bool:
    """Miles' custom rollout log function: write this step's samples as a bundled debug dump
    (see the module docstring); returns False so that Miles' own logging still runs."""
    check_args(args)  # this project's settings, once per run (a stock run's first seam may be this)
    template = bundle_dump_template(args)
    if template is None:
        return False
    # Miles writes its trajectory sidecar itself: ours would collide with it, so the messages stay
    # in the bundle.
    ns = Namespace(**{**vars(args), "save_debug_rollout_data": template, "save_debug_trajectory_data": None})
    metadata = {"rollout_time_s": float(rollout_time)} if isinstance(rollout_time, (int, float)) else {}
    save_debug_rollout_data(ns, samples, rollout_id, False, metadata=metadata)
    return False
