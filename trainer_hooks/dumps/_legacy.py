"""Importing legacy ``torch.save`` debug dumps into bundles (``rollout-bundle import-dump``).

A legacy dump is what Miles' ``save_debug_rollout_data`` wrote before bundles:
``torch.save({"rollout_id": ..., "metadata": {...}, "samples": [sample.to_dict(), ...]})``, with
PIL images or absolute paths in ``multimodal_inputs`` and tensors in ``multimodal_train_inputs``.

Reading one runs pickle, which executes whatever code the file names: only a file from a
trusted source may be loaded, and :func:`import_legacy_dump` refuses unless told
``trust_pickle=True`` (``--trust-pickle``). The bundle that comes out never needs pickle again.

Conversion:

* PIL images anywhere in a sample are stored as PNG media files and read back as PIL images;
* strings in ``multimodal_inputs`` lists (``images``, ``videos``, ``audios``) that are absolute
  paths are stored as media and stay path strings (they read back as paths into the bundle):
  their directories are the bundle's media roots, so any other absolute path string into those
  directories is stored the same way; a missing file is an error naming the sample and key path
  (its run directory was probably released already), unless ``missing_media="keep"`` keeps the
  string as it is;
* tensors, arrays and everything else the bundle format stores are kept as they are; a value it
  cannot store raises naming the key path;
* ``metadata`` must be JSON-compatible; ``meta`` records ``rollout_id``, ``evaluation``,
  ``metadata``, ``imported_from`` (the file name) and ``legacy_format: "torch.save"``. Miles
  names an evaluation dump ``…eval_<id>…`` but stores the bare ``rollout_id``; such a file is
  recorded as ``evaluation: true`` with ``rollout_id: "eval_<id>"``, as
  ``save_debug_rollout_data`` records it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bundles import BundleError, BundleExistsError, Location
from bundles.support import CommandError, add_command, add_json_option, cli_message
from trainer_hooks.dumps._debug_dump import DEBUG_DUMP_KIND, write_dump_bundle

__all__ = ["LegacyDumpError", "PickleRefusedError", "import_legacy_dump", "register"]

PICKLE_WARNING = (
    "reading a torch.save file runs pickle, which can execute arbitrary code from the file; pass "
    "trust_pickle=True only for dumps from a source you trust"
)
MEDIA_KEYS = ("images", "videos", "audios")


class LegacyDumpError(BundleError, ValueError):
    """A legacy dump does not have the expected structure, or a media file it names is missing."""


class PickleRefusedError(LegacyDumpError):
    """Loading the legacy dump was refused because it needs pickle and trust was not given."""


def _media_dirs(sample: dict[Any, Any], where: str, missing_media: str, roots: set[str]) -> None:
    """Add the directories of the absolute paths in the sample's media lists to ``roots`` (the
    writer then stores their files and keeps the strings as path strings); a missing file is an
    error naming the key path unless ``missing_media == "keep"``."""
    mm = sample.get("multimodal_inputs")
    if not isinstance(mm, dict):
        return
    for key in MEDIA_KEYS:
        items = mm.get(key)
        if not isinstance(items, (list, tuple)):
            continue
        for i, item in enumerate(items):
            if not isinstance(item, str) or not os.path.isabs(item):
                continue
            if not os.path.isfile(item) and missing_media != "keep":
                raise LegacyDumpError(
                    f"{where}.multimodal_inputs.{key}[{i}]: media file {item} does not exist (its run media "
                    "directory was probably released); pass missing_media='keep' to "
                    "keep the path as a plain string"
                )
            roots.add(os.path.dirname(os.path.normpath(item)))


def import_legacy_dump(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    trust_pickle: bool = False,
    link: str = "auto",
    overwrite: bool = False,
    missing_media: str = "error",
    evaluation: bool | None = None,
) -> Location:
    """Convert the legacy ``torch.save`` dump ``src`` into a bundle at ``dest``.

    Args:
        src: the ``.pt`` file.
        dest: the bundle to write: a directory, or one packed file when it ends in ``.rbundle``.
        trust_pickle: required; loading ``src`` runs pickle (see the module docstring).
        link: how media files named by path are taken into the bundle.
        overwrite: replace an existing ``dest``.
        missing_media: ``"error"`` (default) or ``"keep"`` for paths whose file is gone.
        evaluation: whether the dump holds an evaluation rollout; by default, when its file name
            holds ``eval_<rollout_id>`` (Miles names evaluation dumps so, but stores the bare id)
            or its stored ``rollout_id`` is a string starting with ``eval_``.

    Returns:
        The path of the bundle written.

    Raises:
        PickleRefusedError: ``trust_pickle`` is false.
        LegacyDumpError: ``src`` is not a dump of sample dicts, or a media file is missing.
    """
    src_path = Path(src)
    if not trust_pickle:
        raise PickleRefusedError(f"{src_path}: refusing to load: {PICKLE_WARNING}")
    if missing_media not in ("error", "keep"):
        raise ValueError(f"missing_media: expected 'error' or 'keep', found {missing_media!r}")
    dest_path = Path(os.path.abspath(dest))
    if os.path.lexists(dest_path) and not overwrite:
        raise BundleExistsError(
            f"{dest_path}: destination exists; pass overwrite=True (--force) to replace it"
        )
    data = _load_dump(src_path)
    samples, roots = _sample_dicts(src_path, data["samples"], missing_media)
    meta = _dump_meta(src_path, data, evaluation)
    return write_dump_bundle(
        dest_path,
        samples,
        media_roots=sorted(roots),
        kind=DEBUG_DUMP_KIND,
        meta=meta,
        link=link,
        missing_media=missing_media,
    )


def _load_dump(src_path: Path) -> Mapping[Any, Any]:
    """Unpickle ``src_path`` (trust was checked by the caller); a mapping holding ``samples``."""
    try:
        import torch
    except ImportError:
        raise LegacyDumpError(
            f"{src_path}: reading a torch.save file needs torch, which is not installed"
        ) from None
    if not src_path.is_file():
        raise LegacyDumpError(f"{src_path}: no such file")
    try:
        data = torch.load(src_path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise LegacyDumpError(
            f"{src_path}: not a readable torch.save file: {type(e).__name__}: {e}"
        ) from None
    if not isinstance(data, Mapping) or "samples" not in data:
        found = sorted(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
        raise LegacyDumpError(
            f"{src_path}: expected a dict with 'samples', 'rollout_id', 'metadata'; found {found}"
        )
    return data


def _sample_dicts(
    src_path: Path, raw_samples: Any, missing_media: str
) -> tuple[list[dict[Any, Any]], set[str]]:
    """The dump's samples as plain dicts, and the directories of the media files they name."""
    if not isinstance(raw_samples, (list, tuple)):
        raise LegacyDumpError(
            f"{src_path}: samples: expected a list of sample dicts, found {type(raw_samples).__name__}"
        )
    samples = []
    roots: set[str] = set()
    for i, s in enumerate(raw_samples):
        d = s.to_dict() if hasattr(s, "to_dict") else s
        if not isinstance(d, dict):
            raise LegacyDumpError(
                f"{src_path}: samples[{i}]: expected a sample dict, found {type(d).__name__}"
            )
        d = dict(d)
        status = d.get("status")
        if status is not None and not isinstance(status, str) and hasattr(status, "value"):
            d["status"] = status.value  # an Enum pickled by an older to_dict
        _media_dirs(d, f"{src_path}: samples[{i}]", missing_media, roots)
        samples.append(d)
    return samples, roots


def _dump_meta(src_path: Path, data: Mapping[Any, Any], evaluation: bool | None) -> dict[str, Any]:
    """The bundle's ``meta`` (see the module docstring)."""
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise LegacyDumpError(f"{src_path}: metadata: expected a dict, found {type(metadata).__name__}")
    rollout_id = data.get("rollout_id")
    evaluation = _is_evaluation(src_path, rollout_id) if evaluation is None else bool(evaluation)
    if evaluation and isinstance(rollout_id, int) and not isinstance(rollout_id, bool):
        rollout_id = f"eval_{rollout_id}"  # as save_debug_rollout_data names evaluation dumps
    return {
        "rollout_id": rollout_id,
        "evaluation": evaluation,
        "metadata": dict(metadata),
        "imported_from": src_path.name,
        "legacy_format": "torch.save",
    }


def _is_evaluation(src: Path, rollout_id: Any) -> bool:
    if isinstance(rollout_id, str):
        return rollout_id.startswith("eval_")
    if isinstance(rollout_id, int) and not isinstance(rollout_id, bool):
        # Miles formats its template with "eval_<id>" and saves {"rollout_id": <id>, ...}.
        return re.search(rf"(?<![0-9A-Za-z])eval_{rollout_id}(?![0-9])", src.name) is not None
    return False


# -- CLI -------------------------------------------------------------------------------------------------


def _run_import(ns: argparse.Namespace) -> int:
    if not ns.trust_pickle:
        raise CommandError(f"{ns.file}: refusing to load: {PICKLE_WARNING}", status=2)
    out = import_legacy_dump(
        ns.file,
        ns.output,
        trust_pickle=True,
        link=ns.link,
        overwrite=ns.force,
        missing_media="keep" if ns.keep_missing_media else "error",
        evaluation=ns.evaluation,
    )
    if ns.json:
        print(json.dumps({"source": os.path.abspath(ns.file), "output": str(out)}, indent=2, sort_keys=True))
    else:
        print(f"imported {ns.file} -> {out}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``import-dump OLD.pt -o BUNDLE --trust-pickle`` to a ``rollout-bundle`` parser."""
    p = add_command(
        subparsers,
        "import-dump",
        "convert a legacy torch.save debug dump into a bundle (needs --trust-pickle)",
        _run_import,
        description="Convert a legacy torch.save debug rollout dump into a bundle. Note: "
        + cli_message(PICKLE_WARNING)
        + ".",
    )
    p.add_argument("file", metavar="OLD.pt", help="the legacy dump written by torch.save")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="BUNDLE",
        help="bundle directory to write, or a packed file ending in .rbundle",
    )
    p.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow loading the file with pickle (it can run code from the file)",
    )
    p.add_argument(
        "--link",
        choices=("auto", "hardlink", "reflink", "copy"),
        default="auto",
        help="how media files named by path are taken into the bundle",
    )
    p.add_argument(
        "--keep-missing-media",
        action="store_true",
        help="keep paths of media files that no longer exist as plain strings",
    )
    p.add_argument(
        "--evaluation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record the dump as an evaluation rollout (default: when the file name holds eval_<rollout_id>)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output")
    add_json_option(p)
