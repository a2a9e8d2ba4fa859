"""Debug rollout dumps as bundles, with Miles' call shapes and path templates.

``save_debug_rollout_data(args, data, rollout_id, evaluation, metadata=None)`` writes the
samples of one rollout to ``args.save_debug_rollout_data.format(rollout_id=...)`` (prefixed
``eval_`` for evaluation rollouts, whose ``{name: {"samples": [...]}}`` data is flattened in
dataset order), and ``load_debug_rollout_data(args, rollout_id) -> (samples, metadata)`` reads
``args.load_debug_rollout_data.format(rollout_id=rollout_id)`` back, keeping the first and last
halves of ``int(len * r)`` samples with ``--load-debug-rollout-data-subsample r``.

Where Miles writes ``torch.save({"rollout_id", "metadata", "samples"})`` with absolute paths
into the run media directory, the file at the formatted path is a bundle of kind
``"debug_dump"``: the samples' media are linked or copied in (``--bundle-link-mode``), so the
dump outlives ``release_run_media`` and can move to another machine; nothing is pickled.
Its manifest meta::

    {"rollout_id": "eval_3" | 3, "evaluation": bool, "metadata": {...}, "run_uuid": ...,
     "training_dtype": "bf16", "processor": {...} | null}

``metadata`` must be JSON-compatible (it lives in the manifest); anything else is refused with
an error naming the key.

Directory or single file
------------------------
A formatted path ending in ``.rbundle`` holds a *packed* bundle: :func:`bundles.write_bundle`
writes it (built in a hidden scratch directory, packed onto the file atomically, the scratch
removed; a crash can leave that directory behind, named like a staging directory, never mistaken
for the dump and removed by the next write there once this process is gone). Errors name the
file, not that directory. On a store (:attr:`bundles.Location.uploads`) the bundle is staged
locally (:meth:`bundles.Location.stage`) and published on the upload thread.

Loading a packed dump does not read it in place, as :func:`bundles.open_bundle` can: the samples
go to code that opens media *by path* (the processor, PIL's lazy ``Image.open``, an engine's
``image_data``), and a tar member has no path of its own. So it is unpacked (fully verified) into a
cache directory beside the file, ``.<file name>.<size>-<mtime_ns>.unpacked``, reused while the
file is unchanged, so the returned media paths stay valid after the call: they point into that
directory, which this module never deletes (remove it with the file). When the file's directory
is not writable the cache goes under ``$XDG_CACHE_HOME/rollout-bundles`` (``~/.cache``) instead.
Processes loading one dump at once (replay's Ray actors) may each unpack it; the first commit wins
and the others open it.

Loaded samples reference media inside the dump itself (no rehydration into the run directory):
a replay starts no rollout engine and the dump is not removed by the run's teardown.
"""

from __future__ import annotations

import hashlib
import os
from argparse import Namespace
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bundles import (
    Bundle,
    BundleExistsError,
    BundleFormatError,
    Location,
    OutsidePolicy,
    open_bundle,
    unpack_bundle,
)
from trainer_hooks._sample import resolve_sample_cls
from trainer_hooks._sample_bundle import (
    other_run_media_policy,
    run_media_roots,
    run_meta,
    write_samples_bundle,
)
from trainer_hooks.checkpoints import snapshot_value
from trainer_hooks.dumps._trajectory import save_debug_trajectory_data, strip_messages
from trainer_hooks.dumps._uploads import queue_upload

__all__ = [
    "DEBUG_DUMP_KIND",
    "load_debug_rollout_data",
    "open_debug_dump",
    "save_debug_rollout_data",
    "write_dump_bundle",
]

DEBUG_DUMP_KIND = "debug_dump"


def _flatten(data: Any, evaluation: bool) -> list[Any]:
    if evaluation:
        if not isinstance(data, Mapping):
            raise TypeError(
                f"save_debug_rollout_data: evaluation data: expected {{dataset_name: {{'samples': [...]}}}}, "
                f"found {type(data).__name__}"
            )
        out = []
        for name, entry in data.items():
            if not isinstance(entry, Mapping) or "samples" not in entry:
                raise TypeError(
                    f"save_debug_rollout_data: evaluation data[{name!r}]: expected a dict with 'samples', "
                    f"found {type(entry).__name__}"
                )
            out.extend(entry["samples"])
        return out
    # Training data: a flat list of samples, or the list of groups a rollout function returns.
    out = []
    for item in data:
        if isinstance(item, (list, tuple)):
            out.extend(item)
        else:
            out.append(item)
    return out


def write_dump_bundle(
    dest: str | os.PathLike[str],
    samples: Iterable[dict[Any, Any]],
    *,
    media_roots: Iterable[str | os.PathLike[str]] = (),
    kind: str = DEBUG_DUMP_KIND,
    meta: dict[str, Any],
    link: str = "auto",
    missing_media: str = "error",
    outside_paths: OutsidePolicy = "warn",
) -> Location:
    """Write (replacing) a bundle at ``dest``, packed into one file when it ends in ``.rbundle``.

    ``dest`` may be an object-store URL: the bundle is written locally and its upload queued in
    the background (:mod:`trainer_hooks.dumps._uploads`); the URL is returned at once."""
    sample_dicts, roots = list(samples), list(media_roots)

    def write(where: os.PathLike[str], *, overwrite: bool) -> Location:
        """The bundle itself, at ``where``: the rest is where it goes and how it is packed."""
        return write_samples_bundle(
            where,
            sample_dicts,
            media_roots=roots,
            kind=kind,
            meta=meta,
            link=link,
            overwrite=overwrite,
            missing_media=missing_media,
            outside_paths=outside_paths,
        )

    location = Location.of(dest)
    if location.uploads:  # an upload is slow: staged here, published on the upload thread
        staged = location.stage(
            lambda where: write(where, overwrite=False), media_roots=roots, overwrite=True
        )
        queue_upload(str(location), lambda: staged.publish(shared_media=True, progress=False))
        return location
    # A directory is staged and renamed by the writer, a packed file built beside it and packed
    # onto it (bundles.write_bundle): either way a crash leaves no half-written dump.
    return write(location, overwrite=True)


def save_debug_rollout_data(
    args: Namespace, data: Any, rollout_id: int, evaluation: bool, metadata: dict[str, Any] | None = None
) -> Location | None:
    """Dump one rollout's samples as a bundle; a no-op (None) without ``--save-debug-rollout-data``.

    Args:
        args: with ``save_debug_rollout_data`` (a template with ``{rollout_id}``) and the run
            media options; ``bundle_link_mode`` is used when present.
        data: a list of samples (or of groups), or for evaluation ``{name: {"samples": [...]}}``.
        rollout_id: the step; evaluation dumps are named ``eval_<rollout_id>``.
        evaluation: whether ``data`` is evaluation data.
        metadata: JSON-compatible, kept in the manifest and returned by the loader.

    Returns:
        The path written.
    """
    template = getattr(args, "save_debug_rollout_data", None)
    if template is None:
        return None
    name = ("eval_" if evaluation else "") + str(rollout_id)
    path = template.format(rollout_id=name)
    samples = [
        snapshot_value(s.to_dict() if hasattr(s, "to_dict") else s) for s in _flatten(data, evaluation)
    ]
    # Miles writes the trajectory sidecar first; the messages then live there, not in the dump.
    if save_debug_trajectory_data(args, samples, rollout_id, evaluation) is not None:
        strip_messages(samples)
    meta = {
        "rollout_id": name if evaluation else rollout_id,
        "evaluation": bool(evaluation),
        "metadata": dict(metadata or {}),
        **run_meta(args),
    }
    return write_dump_bundle(
        path,
        samples,
        media_roots=run_media_roots(args),
        meta=meta,
        link=getattr(args, "bundle_link_mode", None) or "auto",
        outside_paths=other_run_media_policy(args),
    )


def _remote_cache_dir(url: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollout-bundles" / "remote"
    return base / hashlib.sha256(url.encode()).hexdigest()[:16]


def _cache_dir_for(pack: Path) -> Path:
    st = os.stat(pack)
    name = f".{pack.name}.{st.st_size}-{st.st_mtime_ns}.unpacked"
    if os.access(pack.parent, os.W_OK):
        return pack.parent / name
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollout-bundles"
    tag = hashlib.sha256(str(pack).encode()).hexdigest()[:16]
    return base / f"{tag}{name}"


def open_debug_dump(path: str | os.PathLike[str], verify: str = "fast") -> Bundle:
    """Open a dump at ``path``: a bundle directory, or a packed file (unpacked into a cache
    directory beside it; see the module docstring); or an object-store URL, read in place."""
    if os.path.isfile(path):  # a packed file here (a URL, a directory: opened where they are)
        p = Path(os.path.abspath(path))
        cache = _cache_dir_for(p)
        if cache.is_dir():
            return open_bundle(cache, verify=verify)
        # unpack_bundle verifies the result fully before committing it. Another process loading
        # the same dump (replay's Ray actors) may commit the same cache first: use theirs.
        try:
            return unpack_bundle(p, cache, overwrite=False, progress=False)
        except BundleExistsError:
            return open_bundle(cache, verify=verify)
    return open_bundle(path, verify=verify)


def _subsample(samples: list[Any], ratio: float | None) -> list[Any]:
    """Miles' slicing, exactly: the first ``n // 2`` and the rows from ``-n // 2`` on, with
    ``n = int(len * ratio)``. ``-n // 2`` floors (10 rows at 0.5 keep 0, 1, 7, 8, 9) and ``n == 0``
    keeps everything (``samples[-0:]``)."""
    if ratio is None:
        return samples
    n = int(len(samples) * ratio)
    return samples[: n // 2] + samples[-n // 2 :]


_PICKLE_PROTOCOL_BYTES = tuple(bytes([0x80, v]) for v in range(2, 6))


def _refuse_legacy_dump(path: Path) -> None:
    """A ``torch.save`` file (a zip holding ``data.pkl``, or a bare pickle) is a legacy dump:
    say so, with the command that converts it, instead of failing as a malformed bundle."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return  # the bundle reader reports it
    legacy = head in _PICKLE_PROTOCOL_BYTES
    if head == b"PK":
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                legacy = any(n == "data.pkl" or n.endswith("/data.pkl") for n in z.namelist())
        except (zipfile.BadZipFile, OSError):
            legacy = False
    if legacy:
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        out = path.with_name(f"{stem}_bundle")
        raise BundleFormatError(
            f"{path}: a legacy torch.save debug dump, not a bundle. Convert it once (loading it runs "
            f"pickle: only for a file you trust) with:\n    rollout-bundle import-dump {path} -o {out} "
            f"--trust-pickle\nand point --load-debug-rollout-data at the bundle it writes"
        )


def load_debug_rollout_data(
    args: Namespace, rollout_id: int | str, *, sample_cls: Any = None
) -> tuple[list[Any], dict[str, Any]]:
    """Read ``args.load_debug_rollout_data.format(rollout_id=rollout_id)``; return the samples and
    the metadata given to :func:`save_debug_rollout_data`.

    Samples are built with ``sample_cls.from_dict``: by default Miles' ``Sample`` when ``miles``
    is importable, else :class:`trainer_hooks.Sample` (:func:`trainer_hooks.default_sample_cls`);
    ``sample_cls=dict`` returns the stored dicts.

    Verification follows ``args.bundle_verify`` (default ``"fast"``). Media references point into
    the dump (or its unpacked cache directory; for a dump on an object store, a local download
    cache, ``$XDG_CACHE_HOME/rollout-bundles/remote/<hash of the URL>``).
    """
    cls = resolve_sample_cls(sample_cls)
    template = getattr(args, "load_debug_rollout_data", None)
    if template is None:
        raise ValueError("--load-debug-rollout-data is not set: expected a path template with {rollout_id}")
    path = template.format(rollout_id=rollout_id)
    if os.path.isfile(path):
        _refuse_legacy_dump(Path(os.path.abspath(path)))
    bundle = open_debug_dump(path, verify=getattr(args, "bundle_verify", None) or "fast")
    if bundle.kind != DEBUG_DUMP_KIND:
        raise BundleFormatError(f"{bundle.path}: kind: expected {DEBUG_DUMP_KIND!r}, found {bundle.kind!r}")
    if bundle.media_dir is None:
        # Media of a dump on a store are URLs, which the code loaded samples go to (a processor,
        # PIL) cannot open: they are downloaded into a local cache, content-addressed.
        samples = bundle.rehydrate(_remote_cache_dir(path), progress=False, sample_cls=cls)
    else:
        samples = list(bundle.samples(sample_cls=cls))
    samples = _subsample(samples, getattr(args, "load_debug_rollout_data_subsample", None))
    metadata = bundle.meta.get("metadata", {})
    if not isinstance(metadata, dict):
        raise BundleFormatError(
            f"{bundle.path}: meta.metadata: expected an object, found {type(metadata).__name__}"
        )
    return samples, metadata
