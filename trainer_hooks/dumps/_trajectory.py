"""Miles' per-rollout trajectory sidecar (``--save-debug-trajectory-data``), written beside a dump.

Miles' dashboard reads one JSON Lines file per rollout: one row per sample that recorded its raw
conversation in ``metadata["messages"]`` (the session and multi-turn paths attach it)::

    {"sample_index": 3, "group_index": 1, "status": "completed", "reward": 1.0,
     "prompt": ..., "messages": [...]}

``reward`` is the sample's reward when it is a number, else null. The path is
``args.save_debug_trajectory_data.format(rollout_id=...)`` with ``eval_`` before the id of
evaluation rollouts, as for the dump. No row, no file (the dashboard keys off its presence).
Rows are compact JSON (``separators=(",", ":")``), one per line, in sample order.

As in Miles, the sidecar becomes the messages' home: when it is written, the dump bundle's samples
leave ``metadata["messages"]`` out. Unlike Miles, the caller's samples are not modified (Miles
pops the key from the live samples). The file is written to a temporary name and renamed, so a
reader never sees half of it.
"""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bundles import BundleError
from bundles.support import atomic_write

__all__ = ["save_debug_trajectory_data", "strip_messages", "trajectory_rows"]


def _get(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def trajectory_rows(samples: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per sample (a ``Sample`` or a sample dict) whose ``metadata["messages"]`` is set."""
    rows = []
    for sample in samples:
        metadata = _get(sample, "metadata")
        messages = metadata.get("messages") if metadata else None
        if messages is None:
            continue
        status = _get(sample, "status")
        reward = _get(sample, "reward")
        rows.append(
            {
                "sample_index": _get(sample, "index"),
                "group_index": _get(sample, "group_index"),
                "status": getattr(status, "value", status),
                "reward": reward if isinstance(reward, (int, float)) else None,
                "prompt": _get(sample, "prompt"),
                "messages": messages,
            }
        )
    return rows


def trajectory_path(args: Namespace, rollout_id: Any, evaluation: bool) -> Path | None:
    template = getattr(args, "save_debug_trajectory_data", None)
    if template is None:
        return None
    return Path(template.format(rollout_id=("eval_" if evaluation else "") + str(rollout_id)))


def save_debug_trajectory_data(
    args: Namespace, samples: Iterable[Any], rollout_id: Any, evaluation: bool
) -> Path | None:
    """Write the trajectory JSONL of one rollout; None (and no file) without
    ``--save-debug-trajectory-data`` or without a sample that recorded messages."""
    path = trajectory_path(args, rollout_id, evaluation)
    if path is None:
        return None
    rows = trajectory_rows(samples)
    if not rows:
        return None
    lines = []
    for row in rows:
        try:
            lines.append(json.dumps(row, separators=(",", ":")) + "\n")
        except (TypeError, ValueError) as e:
            raise BundleError(
                f"{path}: sample index {row['sample_index']}: metadata.messages: cannot be written as JSON: {e}"
            ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, "".join(lines))  # the one atomic write (bundles.support)
    return path


def strip_messages(samples: list[dict[Any, Any]]) -> None:
    """Drop ``metadata["messages"]`` from sample dicts this module owns (snapshots)."""
    for d in samples:
        metadata = d.get("metadata")
        if isinstance(metadata, dict) and "messages" in metadata:
            d["metadata"] = {k: v for k, v in metadata.items() if k != "messages"}
