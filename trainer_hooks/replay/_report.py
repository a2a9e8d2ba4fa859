"""Replay reports: their format, reading them back, their bundle's identity, writing them.

Report (``rollout-bundle replay --report FILE.json``; read by ``rollout-bundle view --replay`` and
``replay --expect``)::

    {"format": "rollout-bundle-replay", "version": 1, "bundle": str, "bundle_id": "sha256:...",
     "dtype": "bf16"|"fp16"|"fp32", "processor": {...settings used, notes...},
     "summary": {"samples", "images", "vision_tokens", "bytes_before_cast", "bytes_after_cast",
                 "peak_rss_bytes", "problems": {kind: count}},
     "samples": [{"position", "index", "group_index", "problems": [{"kind", "message", "image"}],
                  "images": [{"image", "vision_tokens", "placeholder_tokens",
                              "pixel_values": {"shape", "dtype", "sha256"},
                              "image_grid_thw": {"shape", "dtype", "sha256", "values"}}],
                  "bytes_before_cast", "bytes_after_cast",
                  "logprob_diff": null | {"max_abs", "mean_abs", "tokens", "recomputed"}
                                  (with --model also "first_over", "turns", "k3", "tis_clipped")}],
     "model": {"path", "device", "max_logprob_diff"} (with --model)}

``summary["logprob"]`` (when any ``logprob_diff`` is filled): ``{"samples", "tokens", "mean_abs":
{"mean", "p50", "p99", "max"}, "k3", "tis_cap", "tis_clipped_tokens", "tis_clipped_fraction"}``
(:mod:`trainer_hooks.replay._mismatch`).

Problem kinds: ``guard`` (media references and dense tensors both shipped), ``convert`` (the
converter refused the sample), ``rebuild`` (an image could not be loaded or processed),
``token_count`` (placeholder count differs from the processor's), ``payload`` (no prefill
payload can be built), ``logprob`` (with engine answers: an answer that does not line up with the
response; with ``--model``: a sample over ``--max-logprob-diff``, or inputs the model refused), ``processor`` (a recorded setting was not honoured, or none was recorded),
``fingerprint`` (with ``expect``: rebuilt tensors differ from an earlier replay).

A report read back comes from a file anyone may have edited: :func:`check_replay_report` checks
the shape every reader relies on, :func:`check_report_bundle` that it was made from the bundle at
hand (``bundle_id``: :func:`bundle_identity`). Reports and payload files are written with the
project's one atomic write (:func:`bundles.support.atomic_writer`).

Replay's modules, imports pointing one way: ``_report`` (this: report I/O) <- ``_plan`` (what to
replay, with what) <- ``_run`` (the per-sample work, local) <- ``_ray`` (the same work as Ray
tasks) <- ``_replay`` (:func:`~trainer_hooks.replay._replay.replay_bundle`: plan, run, compare,
summarize); ``_fingerprint`` (tensor fingerprints, comparing two reports) is used by ``_run`` and
``_replay`` and imports only ``_report``; ``_score`` (the model's log-probs, batched) sits between
``_plan`` and ``_run`` and uses ``_mismatch`` (per-sample and bundle figures, importing nothing
of replay), which ``_replay`` also uses for the summary.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

from bundles import Bundle, BundleError, open_bundle
from bundles.support import LIMITS, atomic_writer, nesting_depth_exceeds, open_regular_file, read_at_most

__all__ = [
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "ReportError",
    "bundle_identity",
    "check_replay_report",
    "check_report_bundle",
    "load_replay_report",
    "strict_json",
    "write_json_lines",
    "write_report",
]

REPORT_FORMAT = "rollout-bundle-replay"
REPORT_VERSION = 1


class ReportError(BundleError, ValueError):
    """A replay report read back (``view --replay``, ``replay --expect``) is not one: wrong format,
    version or shape."""


def load_replay_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a replay report (``rollout-bundle replay --report``) and check its shape.

    The file is anyone's: it is opened as a bundle's members are (a regular file, never through a
    symlink, never blocking on a FIFO), read bounded (``LIMITS["MAX_REPORT_BYTES"]``) and nested
    no deeper than ``LIMITS["MAX_JSON_DEPTH"]`` (200,000 ``[`` is a :class:`ReportError`, not a
    ``RecursionError``)."""
    cap, depth = LIMITS["MAX_REPORT_BYTES"], LIMITS["MAX_JSON_DEPTH"]
    try:
        f, size = open_regular_file(path)
        with f:
            if size > cap:
                raise ReportError(f"{path}: not a replay report: {size} bytes, over the {cap} bytes read")
            raw = read_at_most(f, cap + 1)
    except BundleError as e:
        raise ReportError(f"{path}: cannot read the replay report: {e}") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read the replay report: {e.strerror or e}") from None
    if len(raw) > cap:
        raise ReportError(f"{path}: not a replay report: over the {cap} bytes read")
    too_deep = ReportError(f"{path}: not a replay report: nested deeper than {depth} levels")
    try:
        report = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise too_deep from None
    except ValueError as e:  # not UTF-8 (UnicodeDecodeError), not JSON
        raise ReportError(f"{path}: not a replay report: not valid JSON: {e}") from None
    if nesting_depth_exceeds(report, depth):
        raise too_deep
    check_replay_report(report, str(path))
    return report


def check_replay_report(report: Any, where: str) -> None:
    """Raise :class:`ReportError` naming ``where`` and the key path unless ``report`` has the
    shape :func:`replay_bundle` writes (what ``view --replay`` and ``replay --expect`` read)."""
    if not isinstance(report, dict):
        raise ReportError(f"{where}: expected a replay report object, found {type(report).__name__}")
    if report.get("format") != REPORT_FORMAT:
        raise ReportError(
            f"{where}: format: expected {REPORT_FORMAT!r}, found {reprlib.repr(report.get('format'))}"
        )
    if report.get("version") != REPORT_VERSION:
        raise ReportError(
            f"{where}: version: expected {REPORT_VERSION}, found {reprlib.repr(report.get('version'))}"
        )
    samples = report.get("samples")
    if not isinstance(samples, list):
        raise ReportError(f"{where}: samples: expected a list, found {type(samples).__name__}")
    for i, s in enumerate(samples):
        if not isinstance(s, dict) or type(s.get("position")) is not int:
            raise ReportError(f"{where}: samples[{i}].position: expected an int")
        if s.get("index") is not None and type(s["index"]) not in (int, str):
            raise ReportError(
                f"{where}: samples[{i}].index: expected an int or null, found {reprlib.repr(s['index'])}"
            )
        for key in ("problems", "images"):
            if not isinstance(s.get(key, []), list):
                raise ReportError(f"{where}: samples[{i}].{key}: expected a list")
        for j, img in enumerate(s.get("images", [])):
            if not isinstance(img, dict) or type(img.get("image")) is not int:
                raise ReportError(f"{where}: samples[{i}].images[{j}].image: expected an int")
            for tensor in ("pixel_values", "image_grid_thw"):
                if not isinstance(img.get(tensor, {}), (dict, type(None))):
                    raise ReportError(f"{where}: samples[{i}].images[{j}].{tensor}: expected an object")
    summary = report.get("summary", {})
    if not isinstance(summary, dict):
        raise ReportError(f"{where}: summary: expected an object")
    if not isinstance(summary.get("problems", {}), dict):
        raise ReportError(f"{where}: summary.problems: expected an object of counts by kind")
    if not isinstance(report.get("processor", {}), (dict, type(None))):
        raise ReportError(f"{where}: processor: expected an object")


def bundle_identity(bundle: Bundle) -> str:
    """What identifies a bundle's content: ``sha256:`` of its manifest in canonical JSON.

    The manifest lists every shard's and every media file's digest, so two bundles with the same
    identity hold the same samples and media; packing and unpacking keep it (the manifest is
    carried as it is), moving or renaming the bundle too."""
    text = json.dumps(bundle.manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def check_report_bundle(
    report: Mapping[str, Any] | str | os.PathLike[str],
    bundle: Bundle | str | os.PathLike[str],
    where: str = "replay report",
) -> None:
    """Refuse ``report`` (a report or its JSON path) unless it was made from ``bundle`` (an open
    bundle or its path): ``view --replay`` and ``replay --expect`` call it before using one.

    A report records ``bundle_id`` (:func:`bundle_identity`); one written before that field
    existed is matched by the bundle's absolute path instead.

    Raises:
        ReportError: naming ``where``, the report's bundle and this one (also: not a report).
        BundleError: ``bundle`` cannot be opened.
    """
    if not isinstance(report, Mapping):
        report = load_replay_report(report)
    else:
        check_replay_report(report, where)
    opened = None
    if not isinstance(bundle, Bundle):
        opened = bundle = open_bundle(bundle, verify="none")
    try:
        recorded = report.get("bundle_id")
        shown = str(report.get("bundle"))[:300]
        if recorded is not None:
            mine = bundle_identity(bundle)
            if recorded != mine:
                raise ReportError(
                    f"{where}: a replay report of another bundle ({shown}, {str(recorded)[:80]}), not of "
                    f"{bundle.path} ({mine}); replay this bundle with --report to get its own"
                )
            return
        if report.get("bundle") != str(bundle.path):
            raise ReportError(
                f"{where}: a replay report of {shown}, not of {bundle.path} (it records no bundle_id, so "
                "only its path can be compared); replay this bundle with --report to get its own"
            )
    finally:
        if opened is not None:
            opened.close()


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (a flagged ``inf`` log-prob difference) as None, so
    that it is written as strict JSON (no ``NaN``/``Infinity``, which most parsers refuse)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def write_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``report`` as strict JSON to ``path`` atomically (a reader sees the old file or the new one)."""
    with atomic_writer(path, text=True) as f:
        json.dump(strict_json(report), f, indent=1, allow_nan=False)
        f.write("\n")


def write_json_lines(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write one compact JSON object per line to ``path`` atomically (``--payloads-out``)."""
    with atomic_writer(path, text=True) as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
