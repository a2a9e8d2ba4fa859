"""Bundled rollout checkpoints for a stock Miles run, through the seams Miles offers (no edit to Miles).

Two command-line options make ``RolloutManager.save(rollout_id)`` write one atomic
``rollout_checkpoint`` bundle holding the data source's cursor, the in-flight prompt groups (as
handed out), the completed groups (also those drained for a step whose weights were not saved
yet) and the recycled ones; ``RolloutManager.load`` restores all of it::

    --data-source-path trainer_hooks.miles.BundledDataSource
    --custom-async-data-buffer-path trainer_hooks.miles.BundledDataBuffer

and one more makes each step's debug dump a bundle too (:mod:`trainer_hooks.miles._log`)::

    --custom-rollout-log-function-path trainer_hooks.miles.log_rollout_bundle

* :class:`BundledDataSource` (a ``RolloutDataSourceWithBuffer``) sees every group handed out
  (``get_samples``) and recycled (``add_samples``); its ``save``/``load`` write and read the bundle
  at ``<--save>/rollout/fully_async_<N>`` (``load`` falls back to Miles' own
  ``global_dataset_state_dict_<N>.pt`` when there is no bundle, e.g. a run started without it).
* :class:`BundledDataBuffer` (a ``DefaultDataBuffer``) sees every group finished (``put``) and
  consumed (``get``), and starts with the restored completed groups.
* :class:`FullyAsyncRolloutFn` (Miles' class with ``save``/``load``) for Miles forks whose rollout
  manager calls the rollout function's ``save``/``load``; it brings the buffer itself when
  ``--custom-async-data-buffer-path`` is unset, and tracks any data source.

They share one :class:`trainer_hooks.rollout.RolloutState` per run (per ``args`` object,
:func:`rollout_state`), whose module docstring gives the events, the consistency rule and the
journal hook. Resume order: buffered (completed) groups train first, in-flight groups are
regenerated ahead of recycled ones and of new prompts, and the cursor continues.

This project's own settings (``shared_media_dir``, ``bundle_link_mode``, ...) reach a stock run
through Miles' ``--custom-config-path`` YAML, or through a custom generate function's
``add_arguments`` (:func:`add_arguments`); every plugin checks them once with :func:`check_args`
(:mod:`trainer_hooks.miles._settings`; docs/INTEGRATION.md A.6).

Miles' rollout code is imported when one of these names is first used (``--data-source-path
trainer_hooks.miles.BundledDataSource`` does that); without it, that says so in one line. The
package itself imports without it, so that :mod:`trainer_hooks.miles.dashboard` runs where only
Miles' dashboard is installed (a laptop looking at dumps has no sglang).
"""

from __future__ import annotations

from typing import Any

from trainer_hooks.miles._log import bundle_dump_template, log_rollout_bundle
from trainer_hooks.miles._settings import add_arguments, check_args

__all__ = [
    "BundledDataBuffer",
    "BundledDataSource",
    "FullyAsyncRolloutFn",
    "add_arguments",
    "bundle_dump_template",
    "check_args",
    "log_rollout_bundle",
    "rollout_state",
]
_PLUGINS = frozenset({"BundledDataBuffer", "BundledDataSource", "FullyAsyncRolloutFn", "rollout_state"})


def __getattr__(name: str) -> Any:
    if name not in _PLUGINS:
        raise AttributeError(f"module 'trainer_hooks.miles' has no attribute {name!r}")
    try:
        import miles.rollout.data_source
        import miles.rollout.fully_async_data_buffer  # noqa: F401
    except ImportError as e:  # depends on the environment
        raise ImportError(
            f"trainer_hooks.miles needs Miles importable (the `miles` package and its rollout dependencies): {e}"
        ) from e
    from trainer_hooks.miles import _plugins

    value = getattr(_plugins, name)
    globals()[name] = value  # resolved once
    return value
