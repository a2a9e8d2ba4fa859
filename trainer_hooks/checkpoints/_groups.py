"""The shape of prompt groups in a checkpoint's meta: flat groups and nested ones.

A group is a list of items; an item is a sample, or a list of samples (Miles' nested group,
``list[list[Sample]]``, where a generate function returns several samples per trajectory: one per
turn, or one per agent). The bundle stores the samples flattened, in order; the meta records,
for each group, its *layout*:

* an int ``n``: a flat group of ``n`` samples (what checkpoint version 1 wrote);
* a list with one entry per item: ``null`` for a bare sample, an int ``k >= 0`` for a list of
  ``k`` samples. ``[2, 2]`` is a group of two trajectories of two samples each; ``[null, 3]``
  mixes a bare sample and a trajectory of three.

So ``[[s0, s1], [s2]]`` is stored as samples ``s0 s1 s2`` with layout ``[2, 1]``, and comes back
as the same nesting. A layout's sample count is the sum of its entries (``null`` counting one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bundles import BundleFormatError

__all__ = ["flatten_groups", "group_layout", "layout_sample_count", "read_layouts", "unflatten_groups"]

Layout = int | list[int | None]


def group_layout(group: Sequence[Any]) -> Layout:
    """The layout of one (snapshotted) group: an int when it is flat, else one entry per item."""
    if not any(type(item) is list for item in group):
        return len(group)
    return [len(item) if type(item) is list else None for item in group]


def layout_sample_count(layout: Layout) -> int:
    if isinstance(layout, int):
        return layout
    return sum(1 if k is None else k for k in layout)


def flatten_groups(groups: Sequence[Sequence[Any]]) -> list[Any]:
    """The samples of ``groups`` in order, nested items expanded."""
    out: list[Any] = []
    for group in groups:
        for item in group:
            if type(item) is list:
                out.extend(item)
            else:
                out.append(item)
    return out


def unflatten_groups(
    samples: Sequence[Any], layouts: Sequence[Layout], start: int = 0
) -> tuple[list[list[Any]], int]:
    """Groups rebuilt from ``samples[start:]`` by ``layouts``; returns them and the next position."""
    groups: list[list[Any]] = []
    pos = start
    for layout in layouts:
        if isinstance(layout, int):
            groups.append(list(samples[pos : pos + layout]))
            pos += layout
            continue
        group: list[Any] = []
        for k in layout:
            if k is None:
                group.append(samples[pos])
                pos += 1
            else:
                group.append(list(samples[pos : pos + k]))
                pos += k
        groups.append(group)
    return groups, pos


def _valid(layout: Any) -> bool:
    if type(layout) is int:
        return layout >= 0
    return isinstance(layout, list) and all(k is None or (type(k) is int and k >= 0) for k in layout)


def read_layouts(
    meta: dict[str, Any], key: str, where: os.PathLike[str], *, required: bool = True
) -> list[Layout]:
    """``meta[key]`` checked to be a list of layouts (see the module docstring)."""
    if key not in meta and not required:
        return []
    layouts = meta.get(key)
    if not isinstance(layouts, list) or not all(_valid(x) for x in layouts):
        raise BundleFormatError(
            f"{where}: meta.{key}: expected a list of group layouts (an int >= 0 per flat group, or a list "
            f"of null / ints >= 0 per nested group), found {layouts!r}"
        )
    return layouts
