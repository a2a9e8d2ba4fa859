"""``export``: every bundle under a root as a Hive-partitioned Parquet (or JSON lines, or SFT) dataset.

Layout (docs/DATASET.md): ``OUT/kind=<kind>/step=<step>/part-<id>-<options>.parquet``, one part
per bundle, ``<id>`` the first 32 hex digits of the bundle's identity
(:func:`bundles._dataset.identity`), ``<options>`` 8 hex digits of the export's format and options
(:func:`options_digest`), ``<kind>`` percent-encoded as Hive does, ``<step>`` the bundle's step
(``__HIVE_DEFAULT_PARTITION__`` when it has none). The partition columns ``kind`` and ``step`` are in the path, not in the file
(DuckDB, polars and pyarrow add them back from the path; a column in both would be read twice).

Protocol: bundles are found as ``ls -r`` finds them (:func:`bundles._commands.find.find_bundles`,
one rule of what is a bundle). For each, its part's name is computed from its manifest; a part
that exists is a bundle already exported (same identity, same format and options) and is skipped
unread. Otherwise its batches are streamed (``Bundle.to_arrow``: one shard and one batch in memory) into a Parquet
writer over a temporary file, and published in one step: locally by
``bundles.support.atomic_writer`` (rename over the name), on a store by one create-only put of
the finished file (a part another export published meanwhile is left as it is). A reader never
sees half a part, and a killed export leaves no part to skip by mistake. Trade-off: on a store the
finished part is read into memory for its put (a part is one bundle's rows, compressed), so a part
over ``MAX_EXPORT_PART_BYTES`` (4 GiB; FORMAT.md §8) is refused, naming the bundle and the size,
before it is read: that bundle's problem line.

One bundle's defect (damaged, unreadable) is one line on stderr and exit status 1; the others are
exported.

Parallelism (``--jobs``, ``jobs=``): the bundles are exported by that many worker processes,
one bundle a task. A part is one bundle's: two copies of one bundle under ROOT (a directory and
its packed file) have one part, published create-only (locally a rename that never replaces, on a
store a create-only put), so exactly one copy's part lands and the other copy is reported
skipped. With one process that is the copy found first; with workers two copies may be exported
at once and the one finished first wins: its rows are the same, its ``bundle`` column (where the
rows were read from) names it. A sample is decoded and
turned into columns in Python, which holds one core; the Parquet writing is C. On two cores two
workers export a run in a little over half the time (docs/PERFORMANCE.md, "Export to Parquet").
Workers are started with ``spawn`` (a fork of a process holding threads, an event loop or a store
client is unsafe); each imports bundles and pyarrow once (about half a second) and holds one shard
and one batch, about 200 MB with the interpreter, so memory is ``jobs`` times that. ``jobs=1``
(the function's default) exports in the calling process; the command's default
(:func:`default_jobs`) is the CPUs this process may use (its affinity, within a container's
cgroup v2 CPU quota), at most 4, with at least two bundles a worker. The report is the same whatever ``jobs``
is: merged in the order the bundles were found.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from bundles._api.entry import open_bundle
from bundles._api.location import Location
from bundles._commands import common
from bundles._commands.find import find_bundles
from bundles._commands.output import location_shown, plural
from bundles._dataset import COLUMNS, SCHEMA_VERSION, Conventions, identity, sft_rows, sft_schema, step_of
from bundles._errors import BundleError
from bundles._format.limits import MAX_EXPORT_PART_BYTES, MAX_FIND_DEPTH
from bundles._local.atomic import DestinationExistsError, atomic_writer
from bundles._local.faults import fault_point
from bundles._local.progress import Progress
from bundles._urls import StoreURL

__all__ = ["ExportReport", "export_run", "register"]

FORMATS = ("parquet", "jsonl", "sft")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_PARTITION = ("kind", "step")


@dataclass
class ExportReport:
    """What :func:`export_run` did: parts written, bundles skipped (already exported, or filtered
    out by kind), rows written, the SFT conventions read, and ``(where, message)`` problems."""

    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    filtered: int = 0
    rows: int = 0
    conventions: Conventions = field(default_factory=Conventions)
    problems: list[tuple[str, str]] = field(default_factory=list)


def options_digest(fmt: str, opts: Mapping[str, Any]) -> str:
    """8 hex digits of what a part's content depends on besides the bundle: the format, the
    columns, ``min_reward``, ``with_images`` and ``SCHEMA_VERSION``. In the part's name, so that
    another export's parts (``--format sft`` beside parquet ones) never count as this one's."""
    what = {"format": fmt, "columns": opts["columns"], "min_reward": opts["min_reward"],
            "with_images": bool(opts["with_images"]), "schema_version": SCHEMA_VERSION}  # fmt: skip
    text = json.dumps(what, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def part_name(bundle: Any, fmt: str, opts: Mapping[str, Any]) -> str:
    """The part's path under OUT: ``kind=<kind>/step=<step>/part-<id>-<options>.<ext>``."""
    step = step_of(bundle)
    kind = urllib.parse.quote(bundle.kind, safe="")
    ext = "jsonl" if fmt == "jsonl" else "parquet"
    name = f"part-{identity(bundle)[:32]}-{options_digest(fmt, opts)}.{ext}"
    return f"kind={kind}/step={HIVE_NULL if step is None else step}/{name}"


def _batches(bundle: Any, fmt: str, with_images: bool, columns: list[str] | None,
             min_reward: float | None, conventions: Conventions) -> Iterator[Any]:  # fmt: skip
    """The bundle's batches as the part holds them: filtered by reward, the columns asked for,
    the partition columns dropped (Parquet) or SFT rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    media = with_images or fmt == "sft" or "images" in (columns or ())
    need = ["bundle_id", "position", "reward", "status", "prompt", "response", "turns", "images"]
    read = None if columns is None else list(dict.fromkeys([*columns, "reward"]))
    if fmt == "sft":
        read = need
    for batch in bundle.to_arrow(columns=read, media=media):
        if fmt == "sft":
            rows = sft_rows(batch.to_pydict(), min_reward, conventions)
            yield pa.RecordBatch.from_pydict(rows, schema=sft_schema())
            continue
        if min_reward is not None:
            reward = batch.column("reward")
            batch = batch.filter(pc.fill_null(pc.greater_equal(reward, min_reward), False))
        keep = [n for n in batch.schema.names if (columns is None or n in columns)]
        if fmt == "parquet":
            keep = [n for n in keep if n not in _PARTITION]
        yield batch.select(keep)


def _write_parquet(f: BinaryIO, batches: Iterator[Any], schema: Any) -> int:
    import pyarrow.parquet as pq

    rows = 0
    writer = None
    for batch in batches:
        if writer is None:
            writer = pq.ParquetWriter(f, batch.schema, compression="zstd")
        writer.write_batch(batch)
        rows += batch.num_rows
    if writer is None:  # no row: an empty part, so that the bundle counts as exported
        writer = pq.ParquetWriter(f, schema, compression="zstd")
    writer.close()
    return rows


def _write_jsonl(f: BinaryIO, batches: Iterator[Any]) -> int:
    """One JSON object per row. JSON has no NaN or infinity: a non-finite float of a typed column
    is null (text would turn the column's type into string for polars and DuckDB; the Parquet
    part keeps the value, and ``extra`` already holds its own as text)."""
    import base64
    import math

    def plain(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, bytes):
            return base64.b64encode(v).decode("ascii")
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    rows = 0
    for batch in batches:
        for row in batch.to_pylist():
            f.write(
                json.dumps(plain(row), ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
                + b"\n"
            )
            rows += 1
    return rows


def _write_part(f: BinaryIO, bundle: Any, fmt: str, opts: dict[str, Any], conventions: Conventions) -> int:
    batches = _batches(bundle, fmt, opts["with_images"], opts["columns"], opts["min_reward"], conventions)
    if fmt == "jsonl":
        return _write_jsonl(f, batches)
    import pyarrow as pa

    schema = sft_schema() if fmt == "sft" else pa.schema([])
    return _write_parquet(f, batches, schema)


class _Out:
    """Where parts go: a local directory or a store prefix; ``exists`` and ``publish`` one part."""

    def __init__(self, out: str, storage_options: Mapping[str, Any] | None) -> None:
        self.out = out
        self.store = None
        if not Location.of(out, storage_options).uploads:
            if os.path.lexists(out) and not os.path.isdir(out):
                raise BundleError(f"export: -o {out}: expected a directory (or none yet), found a file")
            try:
                os.makedirs(out, exist_ok=True)
            except OSError as e:
                raise BundleError(f"export: -o {out}: cannot make the directory: {e.strerror}") from None
        else:
            from bundles._store.client import get_store

            self.url = StoreURL(out)
            self.store = get_store(self.url, storage_options)

    def where(self, rel: str) -> str:
        return str(self.url.child(rel)) if self.store is not None else os.path.join(self.out, rel)

    def exists(self, rel: str) -> bool:
        """Whether the part is there (a bundle already exported); locally anything but a regular
        file at its name (a symbolic link, a directory) is a problem, left as it is."""
        if self.store is not None:
            return self.store.head(StoreURL(self.where(rel)).key) is not None
        path = self.where(rel)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(mode):
            raise BundleError(
                f"{path}: expected a part (a file) or nothing, found something else; left as it is"
            )
        return True

    def publish(self, rel: str, write: Any, location: str) -> bool:
        """Write a part with ``write(f)`` and publish it whole, never over one that is there;
        False when another export (or another copy of the bundle, in another worker) published
        it first. On a store the finished part is read into memory for its put: one over
        ``MAX_EXPORT_PART_BYTES`` is refused, unread."""
        if self.store is None:
            path = self.where(rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                with atomic_writer(path, durable=True, replace=False) as f:
                    write(f)
                    fault_point("export.written", rel)
            except DestinationExistsError:  # published meanwhile: not an EEXIST while writing
                return False
            return True
        with tempfile.TemporaryDirectory(prefix=".export-") as tmp:
            part = os.path.join(tmp, "part")
            with open(part, "wb") as f:
                write(f)
            fault_point("export.written", rel)
            size = os.path.getsize(part)
            if size > MAX_EXPORT_PART_BYTES:
                raise BundleError(
                    f"{location}: its part {rel} holds {size} bytes: expected at most "
                    f"MAX_EXPORT_PART_BYTES = {MAX_EXPORT_PART_BYTES} to publish it to a store in one put"
                )
            with open(part, "rb") as f:
                data = f.read(size)
        return bool(self.store.put_create(StoreURL(self.where(rel)).key, data))


def _export_one(location: str, out: _Out, fmt: str, opts: dict[str, Any], report: ExportReport) -> None:
    with open_bundle(location, storage_options=opts["storage_options"]) as bundle:
        if opts["kind"] is not None and bundle.kind != opts["kind"]:
            report.filtered += 1
            return
        rel = part_name(bundle, fmt, opts)
        if out.exists(rel):
            report.skipped.append(location)
            return
        rows = [0]
        conventions = Conventions()  # counted once the part is published, not by a copy that lost

        def write(f: BinaryIO) -> None:
            rows[0] = _write_part(f, bundle, fmt, opts, conventions)

        if out.publish(rel, write, location):
            report.written.append(out.where(rel))
            report.rows += rows[0]
            report.conventions.update(conventions)
        else:
            report.skipped.append(location)


def _export_alone(location: str, out: str, fmt: str, opts: dict[str, Any]) -> ExportReport:
    """One bundle exported in a worker process: its own report (never raises for the bundle)."""
    report = ExportReport()
    try:
        _export_one(location, _out_of(out, opts["storage_options"]), fmt, opts, report)
    except (BundleError, OSError) as e:
        report.problems.append((location, str(e)))
    return report


_OUTS: dict[str, _Out] = {}


def _out_of(out: str, storage_options: Mapping[str, Any] | None) -> _Out:
    """The worker's destination, made once per process (a store client is reused)."""
    if out not in _OUTS:
        _OUTS[out] = _Out(out, storage_options)
    return _OUTS[out]


def _merge(report: ExportReport, part: ExportReport) -> None:
    """Add one worker's report. Of two copies of one bundle under the root only one published
    its part (create-only): the other's report says skipped."""
    report.written += part.written
    report.rows += part.rows
    report.conventions.update(part.conventions)
    report.skipped += part.skipped
    report.filtered += part.filtered
    report.problems += part.problems


def _cpus() -> int:
    """The CPUs this process may use: its affinity, within a cgroup v2 CPU quota as a container
    sees it (``/sys/fs/cgroup/cpu.max``: a container limited to one CPU on a 64-core host sees 64
    in its affinity). A cgroup v1 quota, or a parent's, is not read."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError, ArithmeticError):  # cgroup v1, no limit, or not Linux
        pass
    return max(1, cpus)


def default_jobs(bundles: int) -> int:
    """The command's ``--jobs`` default for ``bundles`` bundles: the CPUs this process may use,
    at most 4, and at least two bundles a worker (a worker's start, ~0.5 s of imports, is not
    worth one small bundle)."""
    return max(1, min(_cpus(), 4, bundles // 2))


def _export_parallel(
    locations: Sequence[str], out: str, fmt: str, opts: dict[str, Any], jobs: int, bar: Progress
) -> list[ExportReport]:
    """Each bundle exported by a pool of ``jobs`` spawned workers, at most two tasks per worker
    queued (a run of 100,000 bundles is not 100,000 futures at once); reports in ``locations``' order."""
    import concurrent.futures as cf
    import multiprocessing

    results: list[ExportReport | None] = [None] * len(locations)
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    pending: dict[cf.Future[ExportReport], int] = {}
    queue = iter(enumerate(locations))

    def submit() -> None:
        for i, location in queue:
            pending[pool.submit(_export_alone, location, out, fmt, opts)] = i
            return

    try:
        while len(pending) < 2 * jobs and len(pending) < len(locations):
            submit()
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for future in done:
                results[pending.pop(future)] = future.result()
                bar.advance(1)
                submit()
    except cf.BrokenExecutor:
        pool.shutdown(wait=True, cancel_futures=True)
        busy = sorted({locations[i] for i in pending.values()})
        raise BundleError(
            f"export: a worker process died (killed, or out of memory) while exporting one of these "
            f"bundles (running or queued): {', '.join(busy)}; the parts published so far are whole and "
            "kept: export again to finish (what was published is skipped)"
        ) from None
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [r for r in results if r is not None]


def export_run(
    root: str,
    out: str,
    *,
    fmt: str = "parquet",
    with_images: bool = False,
    kind: str | None = None,
    min_reward: float | None = None,
    columns: list[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    jobs: int | None = 1,
) -> ExportReport:
    """Export every bundle under ``root`` (a run directory or a store prefix) to ``out`` (a
    directory or a store prefix); see the module's docstring. ``jobs``: worker processes (1:
    this process; None: :func:`default_jobs`). Never raises for one bundle. Workers are spawned:
    a script calling this with ``jobs`` > 1 needs the ``if __name__ == "__main__":`` guard that
    :mod:`multiprocessing` asks of it, or its workers die starting."""
    if fmt not in FORMATS:
        raise BundleError(f"export: --format: expected one of {', '.join(FORMATS)}, found {fmt!r}")
    unknown = [c for c in columns or () if c not in COLUMNS]
    if unknown:
        raise BundleError(f"export: --columns: expected names among {', '.join(COLUMNS)}, found {unknown!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise BundleError(f"export: --jobs: expected an int >= 1, found {jobs!r}")
    target = _Out(out, storage_options)  # a destination that cannot be is one error, not one a bundle
    found = find_bundles(root, depth=MAX_FIND_DEPTH, storage_options=storage_options)
    report = ExportReport(problems=list(found.problems))
    opts = {"with_images": with_images, "kind": kind, "min_reward": min_reward, "columns": columns,
            "storage_options": storage_options}  # fmt: skip
    workers = min(default_jobs(len(found.bundles)) if jobs is None else jobs, len(found.bundles))
    with Progress(f"export {root}", total=len(found.bundles), unit=" bundles", enabled=progress) as bar:
        if workers > 1:
            parts = _export_parallel(found.bundles, out, fmt, opts, workers, bar)
            for part in parts:
                _merge(report, part)
            return report
        for location in found.bundles:
            try:
                _export_one(location, target, fmt, opts, report)
            except (BundleError, OSError) as e:  # one bundle's defect is a line, not the export's failure
                report.problems.append((location, str(e)))
            bar.advance(1)
    return report


def _export(ns: argparse.Namespace) -> int:
    if not Location.of(ns.root).uploads and not os.path.lexists(ns.root):
        raise common.CommandError(
            f"{os.path.abspath(ns.root)}: does not exist; export reads the bundles under a directory "
            "(or one packed bundle)"
        )
    columns = [c for part in ns.columns for c in part.split(",") if c] if ns.columns else None
    report = export_run(ns.root, ns.output, fmt=ns.format, with_images=ns.with_images, kind=ns.kind,
                        min_reward=ns.min_reward, columns=columns, progress=ns.progress,
                        jobs=ns.jobs)  # fmt: skip
    print(
        f"exported {plural(len(report.written), 'bundle')} ({plural(report.rows, 'row')}) to "
        f"{location_shown(ns.output)}; skipped {len(report.skipped)} already exported"
        + (f", {report.filtered} of another kind" if report.filtered else "")
    )
    if ns.format == "sft":
        turns, plain = report.conventions["turns"], report.conventions["prompt-response"]
        print(f"sft: {turns} trajectories read by turns (metadata.actions and screenshots), "
              f"{plain} by prompt/response (one user message, one assistant message)")  # fmt: skip
    for where, message in report.problems:
        said = message if message.startswith(where) else f"{where}: {message}"
        common.warn("export", f"not exported: {said}")
    return 1 if report.problems else 0


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, found {text!r}")
    return n


def register(subparsers: Any) -> None:
    p = common.add_command(
        subparsers, "export", "export every bundle under a root as a Parquet dataset", _export,
        description="Export every bundle under ROOT (a run directory or a store prefix) into a "
        "Hive-partitioned dataset OUT/kind=K/step=S/part-ID-OPTIONS.parquet (docs/DATASET.md); a "
        "bundle already exported with the same format and options is skipped.",
    )  # fmt: skip
    p.add_argument("root", help="a run directory or a store prefix holding bundles")
    p.add_argument("-o", "--output", required=True, help="the dataset's directory or store prefix")
    p.add_argument("--format", choices=FORMATS, default="parquet",
                   help="parquet (default), jsonl, or sft: successful trajectories as TRL's vision SFT takes them")  # fmt: skip
    p.add_argument("--with-images", action="store_true", help="add the screenshots (images column)")
    p.add_argument("--kind", help="only bundles of this kind")
    p.add_argument("--min-reward", type=float, help="only samples with a reward at least this")
    p.add_argument("--columns", action="append", help="only these columns (comma-separated)")
    p.add_argument("--jobs", type=_jobs, help="worker processes, one bundle each at a time (default: the "
                   "CPUs this process may use, at most 4, at least two bundles a worker; 1: none, the "
                   "bundles one after another here)")  # fmt: skip
    common.add_progress_option(p)
