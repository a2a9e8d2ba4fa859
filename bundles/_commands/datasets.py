"""A run's bundles as one Ray Data dataset: :func:`read_bundles`, for runs past one machine.

Protocol: the driver lists the bundles under ROOT as ``ls -r`` does (:func:`.find.find_bundles`,
so a bundle that cannot be listed is refused here as export refuses it) and opens each one's
manifest (``verify="none"``: no listing of its files, no shard read), and makes one Ray Data read
task per shard: the task's descriptor is the bundle's location (its text: a directory, a packed
file, ``s3://...``), its ``storage_options``, its identity (``bundle_id``) and the shard's number,
nothing else. A task, on whichever node Ray places it, opens the bundle by that location itself
(no shared filesystem is needed for a bundle on a store), checks the identity (a bundle replaced
since the listing is a :class:`~bundles.BundleError` naming it, never a mix of two bundles) and
yields the shard's rows through the one conversion :func:`bundles._dataset.arrow.to_arrow`
(``shards=[k]``): the schema of docs/DATASET.md, ``position`` the sample's index in its bundle.
Shards and screenshots are checked against their digests as the task reads them.

Screenshots are read only when asked: ``media=True`` or an ``images`` column; otherwise no media
file is opened, whatever a sample references.

Costs: on the driver, one listing per level of ROOT and one manifest read per bundle; per task,
one manifest read and one shard (its decoded samples held until the shard is read, bounded by
``MAX_SHARD_RAW_BYTES``), and with images the shard's screenshots, one batch's at a time. The
number of tasks is the run's number of shards, bounded by ``MAX_READ_TASKS``
(:mod:`bundles._format.limits`).

ray and pyarrow are imported inside the functions: ``import bundles`` needs neither.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bundles._api.entry import open_bundle
from bundles._commands.find import find_bundles
from bundles._dataset import identity
from bundles._dataset.arrow import schema as arrow_schema
from bundles._dataset.arrow import to_arrow
from bundles._errors import BundleError
from bundles._format.limits import MAX_FIND_DEPTH, MAX_READ_TASKS

__all__ = ["ShardTask", "read_bundles", "shard_tasks"]


@dataclass(frozen=True)
class ShardTask:
    """What one read task needs: where the bundle is, which of its shards, and what it was."""

    location: str
    shard: int
    samples: int
    size: int
    bundle_id: str
    storage_options: Mapping[str, Any] | None = None


def shard_tasks(
    root: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    depth: int = MAX_FIND_DEPTH,
) -> list[ShardTask]:
    """One :class:`ShardTask` per shard of every bundle under ``root`` (manifests only), in the
    order of the bundles' locations then of their shards. A bundle that cannot be listed or
    opened is a :class:`~bundles.BundleError` naming it."""
    listing = find_bundles(root, depth=depth, storage_options=storage_options)
    if listing.problems:
        where, reason = listing.problems[0]
        raise BundleError(f"read_bundles: {where}: cannot be listed: {reason}")
    tasks: list[ShardTask] = []
    for location in listing.bundles:
        with open_bundle(location, verify="none", storage_options=storage_options) as bundle:
            bid = identity(bundle)
            for k, entry in enumerate(bundle.manifest.shards):
                tasks.append(ShardTask(location, k, entry.samples, entry.size, bid, storage_options))
        if len(tasks) > MAX_READ_TASKS:
            raise BundleError(
                f"read_bundles: {root}: expected at most {MAX_READ_TASKS} shards (MAX_READ_TASKS), "
                f"found more ({len(listing.bundles)} bundles)"
            )
    return tasks


def read_shard(task: ShardTask, columns: Sequence[str] | None, media: bool, batch_rows: int) -> Iterator[Any]:
    """The shard's rows as ``pyarrow.Table``s (what a Ray Data read task yields), read where the
    task runs."""
    import pyarrow as pa

    with open_bundle(task.location, verify="none", storage_options=task.storage_options) as bundle:
        found = identity(bundle)
        if found != task.bundle_id:
            raise BundleError(
                f"{task.location}: changed since read_bundles listed it: bundle_id expected "
                f"{task.bundle_id}, found {found}"
            )
        for batch in to_arrow(bundle, columns, batch_rows, media, shards=[task.shard]):
            yield pa.Table.from_batches([batch])


def _datasource(tasks: list[ShardTask], columns: Sequence[str] | None, media: bool, batch_rows: int) -> Any:
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    sch = arrow_schema(media, columns)

    class BundleShards(Datasource):
        """Ray Data's view of the shards: one read task each, whatever ``parallelism`` asks."""

        def estimate_inmemory_data_size(self) -> int | None:
            return sum(t.size for t in tasks) or None

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
        ) -> list[Any]:
            out = []
            for t in tasks:
                meta = BlockMetadata(
                    num_rows=t.samples, size_bytes=t.size, exec_stats=None, input_files=(t.location,)
                )
                out.append(
                    ReadTask(
                        functools.partial(read_shard, t, columns, media, batch_rows),
                        meta,
                        schema=sch,
                        per_task_row_limit=per_task_row_limit,
                    )
                )
            return out

        def get_name(self) -> str:
            return "RolloutBundles"

    return BundleShards()


def read_bundles(
    root: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    media: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    batch_rows: int = 1024,
    depth: int = MAX_FIND_DEPTH,
) -> Any:
    """The samples of every bundle under ``root`` (a run directory, a store prefix, or one
    bundle) as a ``ray.data.Dataset`` of the schema in docs/DATASET.md, one read task per shard.

    ``columns`` picks columns (``"images"`` among them implies ``media=True``); ``media=True``
    adds ``images``, the screenshots read by digest in the task. ``storage_options`` reach every
    task (a store's credentials: each task opens its bundle by location, no shared filesystem).
    Needs ``ray[data]`` and ``pyarrow``; see :mod:`bundles._commands.datasets`.
    """
    try:
        import ray.data
    except ImportError:
        raise BundleError(
            "read_bundles: ray is not installed: expected ray[data] (pip install 'ray[data]')"
        ) from None
    if columns is not None and "images" in columns:
        media = True
    arrow_schema(media, columns)  # an unknown column is refused before anything is listed
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise BundleError(f"read_bundles: batch_rows: expected an int >= 1, found {batch_rows!r}")
    tasks = shard_tasks(root, storage_options=storage_options, depth=depth)
    if not tasks:
        raise BundleError(f"read_bundles: {root}: expected bundles under it, found none")
    return ray.data.read_datasource(
        _datasource(tasks, columns, media, batch_rows), override_num_blocks=len(tasks)
    )
