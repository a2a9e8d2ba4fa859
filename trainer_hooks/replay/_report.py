"""Replay a bundle the way training would see it, and report: :func:`replay_bundle`.

For each sample (in bundle order, up to ``limit``): the conversion guard, the rebuild of its
vision tensors with the recorded processor settings and the cast to the training dtype, the
token-space check, the prefill payload, and a fingerprint of every image's rebuilt tensors.

Report (``--report FILE.json``; read by ``rollout-bundle view --replay``)::

    {"format": "rollout-bundle-replay", "version": 1, "bundle": str, "dtype": "bf16"|"fp16"|"fp32",
     "processor": {...settings used, notes...},
     "summary": {"samples", "images", "vision_tokens", "bytes_before_cast", "bytes_after_cast",
                 "peak_rss_bytes", "problems": {kind: count}},
     "samples": [{"position", "index", "group_index", "problems": [{"kind", "message", "image"}],
                  "images": [{"image", "vision_tokens", "placeholder_tokens",
                              "pixel_values": {"shape", "dtype", "sha256"},
                              "image_grid_thw": {"shape", "dtype", "sha256", "values"}}],
                  "bytes_before_cast", "bytes_after_cast", "logprob_diff": null}]}

Problem kinds: ``guard`` (media references and dense tensors both shipped), ``convert`` (the
converter refused the sample), ``rebuild`` (an image could not be loaded or processed),
``token_count`` (placeholder count differs from the processor's), ``payload`` (no prefill
payload can be built), ``logprob`` (with engine answers: an answer that does not line up with the
response), ``processor`` (a recorded setting was not honoured), ``fingerprint``
(with ``expect``: rebuilt tensors differ from an earlier replay).

The per-sample work is :func:`replay_positions`, shared by the local loop and the Ray tasks
(:mod:`trainer_hooks.replay._ray`), which is why a merged Ray report equals the local one.
``summary`` is computed from the sample entries alone (plus the peak RSS, which is per process
and so the one field that differs between a local and a Ray replay).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
from argparse import Namespace
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundles import Bundle, BundleError, is_store_url, open_bundle
from trainer_hooks._sample import Sample
from trainer_hooks.arguments import parse_mm_process_config
from trainer_hooks.replay._guard import _default_convert, guard_violations
from trainer_hooks.replay._media import MediaReader
from trainer_hooks.replay._payload import build_prefill_scoring_payload, compare_prefill_logprobs
from trainer_hooks.replay._processor import FAMILIES, ReplayProcessor, load_processor, resolve_processor
from trainer_hooks.replay._rebuild import DTYPE_NAMES, compute_multimodal_train_inputs, dtype_from_name
from trainer_hooks.replay._tokens import check_image_tokens

__all__ = [
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "ReplayPlan",
    "ReportError",
    "bundle_identity",
    "check_replay_report",
    "check_report_bundle",
    "compare_reports",
    "load_replay_report",
    "open_replay_bundle",
    "plan_replay",
    "replay_bundle",
    "replay_positions",
    "summarize",
]

REPORT_FORMAT = "rollout-bundle-replay"
REPORT_VERSION = 1


class ReportError(BundleError, ValueError):
    """A replay report read back (``view --replay``, ``replay --expect``) is not one: wrong format,
    version or shape."""


def load_replay_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a replay report (``rollout-bundle replay --report``) and check its shape."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except OSError as e:
        raise ReportError(f"{path}: cannot read the replay report: {e.strerror or e}") from None
    except ValueError as e:
        raise ReportError(f"{path}: not a replay report: not valid JSON: {e}") from None
    check_replay_report(report, str(path))
    return report


def check_replay_report(report: Any, where: str) -> None:
    """Raise :class:`ReportError` naming ``where`` and the key path unless ``report`` has the
    shape :func:`replay_bundle` writes (what ``view --replay`` and ``replay --expect`` read)."""
    if not isinstance(report, dict):
        raise ReportError(f"{where}: expected a replay report object, found {type(report).__name__}")
    if report.get("format") != REPORT_FORMAT:
        raise ReportError(f"{where}: format: expected {REPORT_FORMAT!r}, found {report.get('format')!r}")
    if report.get("version") != REPORT_VERSION:
        raise ReportError(f"{where}: version: expected {REPORT_VERSION}, found {report.get('version')!r}")
    samples = report.get("samples")
    if not isinstance(samples, list):
        raise ReportError(f"{where}: samples: expected a list, found {type(samples).__name__}")
    for i, s in enumerate(samples):
        if not isinstance(s, dict) or type(s.get("position")) is not int:
            raise ReportError(f"{where}: samples[{i}].position: expected an int")
        if s.get("index") is not None and type(s["index"]) not in (int, str):
            raise ReportError(f"{where}: samples[{i}].index: expected an int or null, found {s['index']!r}")
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


def peak_rss_bytes() -> int:
    """This process's RSS high-water mark (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def open_replay_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Open a bundle directory or packed file with fast verification. A packed file is read in
    place (its media through :meth:`~bundles.Bundle.open_media`): nothing is unpacked beside it."""
    return open_bundle(path, verify="fast")


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


@dataclass(frozen=True)
class ReplayPlan:
    """What every worker of one replay needs, JSON-ready so that it travels to Ray tasks as-is."""

    bundle: str
    dtype: str
    processor_settings: dict[str, Any] | None
    token_space: bool
    positions: tuple[int, ...]
    allow_outside_media: bool = False

    def args(self) -> Namespace:
        """A Miles-style args namespace for the converter and the payload builder."""
        return Namespace(
            enable_token_space_processor=self.token_space,
            bf16=self.dtype == "bf16",
            fp16=self.dtype == "fp16",
        )


def plan_replay(
    bundle: Bundle,
    *,
    dtype: str | None = None,
    limit: int | None = None,
    mm_process_config: Mapping[str, Any] | None = None,
    allow_outside_media: bool = False,
) -> ReplayPlan:
    """The dtype (given, else the bundle's ``training_dtype``, else fp32), the processor settings
    (``meta["processor"]``, with ``mm_process_config`` replaced when given) and the positions.

    Raises:
        BundleError: what the bundle recorded is unusable (bad processor settings, an unknown
            model family, a bad dtype), naming the key path.
        ValueError: ``mm_process_config`` (the caller's) is unusable, or ``limit`` < 1.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected an int >= 1 (omit it for every sample), found {limit!r}")
    meta = bundle.meta
    recorded = meta.get("processor")
    if recorded is not None and not isinstance(recorded, Mapping):
        raise BundleError(f"{bundle.path}: meta.processor: expected an object or null, found {recorded!r}")
    if recorded is not None:
        # What the bundle recorded is checked here, so that a bad value is the bundle's error (exit 1,
        # naming it) and not taken for a bad --mm-process-config (exit 2).
        where = f"{bundle.path}: meta.processor"
        try:
            parse_mm_process_config(recorded.get("mm_process_config"), where=f"{where}.mm_process_config")
            resolve_processor(recorded, where)  # bounds, family: before transformers sees a value
        except ValueError as e:
            raise BundleError(str(e)) from None
        token_id = recorded.get("image_token_id")
        if token_id is not None and (type(token_id) is not int or token_id < 0):
            raise BundleError(
                f"{where}.image_token_id: expected a token id (int >= 0) or null, found {token_id!r}"
            )
    if dtype is None:
        dtype = meta.get("training_dtype") or "fp32"
    if dtype not in DTYPE_NAMES:
        raise BundleError(
            f"{bundle.path}: meta.training_dtype: expected one of {', '.join(DTYPE_NAMES)}, found {dtype!r}"
        )
    settings = dict(recorded) if recorded is not None else None
    if mm_process_config is not None:
        settings = {**(settings or {}), "mm_process_config": dict(mm_process_config)}
        resolve_processor(settings, "--mm-process-config")  # ValueError: the caller's, exit 2
    first = _first_trainable(bundle)
    end = len(bundle) if limit is None else min(first + limit, len(bundle))
    return ReplayPlan(
        bundle=str(bundle.path),
        dtype=dtype,
        processor_settings=settings,
        # The engines' processor settings are resolved (and recorded) only in token space.
        token_space=recorded is not None,
        positions=tuple(range(first, end)),
        allow_outside_media=bool(allow_outside_media),
    )


def _first_trainable(bundle: Bundle) -> int:
    """Where training data starts: a rollout checkpoint stores its in-flight (pending) groups first,
    which training never sees as they are (they are resubmitted on resume); a dump starts at 0."""
    from trainer_hooks.checkpoints import CHECKPOINT_KIND

    if bundle.kind != CHECKPOINT_KIND:
        return 0
    sizes = bundle.meta.get("pending_group_sizes") or []
    if not isinstance(sizes, list) or not all(type(n) is int and n >= 0 for n in sizes):
        raise BundleError(
            f"{bundle.path}: meta.pending_group_sizes: expected a list of counts, found {sizes!r}"
        )
    return min(sum(sizes), len(bundle))


def _digest(t: Any) -> str:
    import torch

    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    raw = t.reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(memoryview(raw)).hexdigest()


def _dtype_str(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _fingerprints(inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per image: shape, dtype and sha256 of its rows of ``pixel_values`` and of ``image_grid_thw``."""
    grid = inputs.get("image_grid_thw")
    pixels = inputs.get("pixel_values")
    if grid is None:
        return []
    out = []
    offset = 0
    for j, row in enumerate(grid):
        t, h, w = (int(x) for x in row.tolist())
        patches = t * h * w
        entry: dict[str, Any] = {"image": j}
        if pixels is not None:
            part = pixels[offset : offset + patches]
            entry["pixel_values"] = {
                "shape": list(part.shape),
                "dtype": _dtype_str(part),
                "sha256": _digest(part),
            }
        offset += patches
        entry["image_grid_thw"] = {
            "shape": list(row.shape),
            "dtype": _dtype_str(row),
            "sha256": _digest(row),
            "values": [[t, h, w]],
        }
        out.append(entry)
    return out


def _nbytes(inputs: Mapping[str, Any] | None) -> int:
    if not inputs:
        return 0
    return sum(v.numel() * v.element_size() for v in inputs.values() if hasattr(v, "element_size"))


def replay_positions(
    plan: ReplayPlan,
    positions: Iterable[int],
    *,
    bundle: Bundle | None = None,
    processor: ReplayProcessor | None = None,
    with_payloads: bool = False,
    on_sample: Callable[[int], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Replay the samples at ``positions`` of ``plan.bundle``.

    Returns ``(sample entries, payloads (empty unless with_payloads), peak RSS of this process)``.
    """
    wanted = sorted(set(positions))
    if bundle is None:
        bundle = open_replay_bundle(plan.bundle)
    if processor is None:
        processor = load_processor(plan.processor_settings)
    dtype = dtype_from_name(plan.dtype)
    args = plan.args()
    media = MediaReader(bundle, allow_outside=plan.allow_outside_media)
    entries: list[dict[str, Any]] = []
    payloads: list[dict[str, Any]] = []
    # Only the shards holding these positions are read (a Ray task reads its own part).
    for position, sample in zip(wanted, bundle.samples(Sample, indices=wanted), strict=True):
        entry, payload = _replay_one(position, sample, processor, dtype, args, plan, media, with_payloads)
        entries.append(entry)
        if with_payloads and payload is not None:
            payloads.append(payload)
        if on_sample is not None:
            on_sample(position)
    return entries, payloads, peak_rss_bytes()


def _replay_one(
    position: int,
    sample: Sample,
    processor: ReplayProcessor,
    dtype: Any,
    args: Namespace,
    plan: ReplayPlan,
    media: MediaReader,
    with_payload: bool,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    problems: list[dict[str, Any]] = []
    entry: dict[str, Any] = {
        "position": position,
        "index": sample.index,
        "group_index": sample.group_index,
        "problems": problems,
        "images": [],
        "bytes_before_cast": 0,
        "bytes_after_cast": 0,
        "logprob_diff": None,
    }
    try:
        train = _default_convert(args, [sample], {})
        for _, _, message in guard_violations(train, first_position=position):
            problems.append({"kind": "guard", "message": message, "image": None})
    except (ValueError, TypeError, KeyError) as e:
        problems.append({"kind": "convert", "message": f"sample index {sample.index}: {e}", "image": None})

    before = [0]
    try:
        rebuilt = compute_multimodal_train_inputs(
            [sample],
            processor,
            dtype,
            on_sample=lambda _p, _c, b: before.__setitem__(0, b),
            first_position=position,
            media=media,
        )[0]
    except (OSError, ValueError, BundleError) as e:
        problems.append({"kind": "rebuild", "message": str(e), "image": None})  # names index and position
        rebuilt = None
    if rebuilt is not None:
        entry["bytes_before_cast"] = before[0]
        entry["bytes_after_cast"] = _nbytes(rebuilt)
        images = _fingerprints(rebuilt)
        grid = rebuilt.get("image_grid_thw")
        if grid is not None:
            expected, found, token_problems = check_image_tokens(
                sample.tokens,
                grid,
                merge_size=processor.merge_size,
                image_token_id=processor.image_token_id,
                sample_index=sample.index,
            )
            for img, want, got in zip(images, expected, found, strict=True):
                img["vision_tokens"] = want
                img["placeholder_tokens"] = got
            if plan.token_space:
                problems.extend(token_problems)
        entry["images"] = [
            {
                k: img.get(k)
                for k in ("image", "vision_tokens", "placeholder_tokens", "pixel_values", "image_grid_thw")
            }
            for img in images
        ]
        del rebuilt
    payload = None
    try:
        payload = build_prefill_scoring_payload(args, sample, {}, media=media, images=with_payload)
    except (OSError, ValueError, BundleError) as e:
        problems.append({"kind": "payload", "message": str(e), "image": None})
    return entry, payload


def summarize(
    entries: Sequence[Mapping[str, Any]], peak_rss: int, extra_problems: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    for e in entries:
        for p in e["problems"]:
            kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
    for p in extra_problems:
        kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
    return {
        "samples": len(entries),
        "images": sum(len(e["images"]) for e in entries),
        "vision_tokens": sum(int(i.get("vision_tokens") or 0) for e in entries for i in e["images"]),
        "bytes_before_cast": sum(int(e.get("bytes_before_cast", 0)) for e in entries),
        "bytes_after_cast": sum(int(e.get("bytes_after_cast", 0)) for e in entries),
        "peak_rss_bytes": int(peak_rss),
        "problems": dict(sorted(kinds.items())),
    }


def _image_key(entry: Mapping[str, Any], image: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry["position"], entry.get("index"), image["image"])


def compare_reports(report: Mapping[str, Any], expected: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every image whose rebuilt tensors (shape, dtype, sha256) differ from ``expected``'s, and every
    sample or image present in only one of the two; each as a ``fingerprint`` problem."""
    if expected.get("format") != REPORT_FORMAT:
        raise ValueError(
            f"--expect: expected a report with format {REPORT_FORMAT!r}, found {expected.get('format')!r}"
        )
    problems: list[dict[str, Any]] = []
    old = {_image_key(e, i): i for e in expected.get("samples", []) for i in e.get("images", [])}
    new = {_image_key(e, i): i for e in report["samples"] for i in e["images"]}
    old_positions = {e["position"] for e in expected.get("samples", [])}
    for key, img in new.items():
        position, index, j = key
        if position not in old_positions:
            continue  # a sample the earlier replay did not cover (another --limit)
        if key not in old:
            problems.append(
                {"kind": "fingerprint", "image": j, "position": position,
                 "message": f"sample index {index}, image {j}: not in the expected report"}
            )  # fmt: skip
            continue
        changed = []
        for tensor in ("pixel_values", "image_grid_thw"):
            a, b = old[key].get(tensor) or {}, img.get(tensor) or {}
            if tensor == "image_grid_thw" and a.get("values") != b.get("values"):
                changed.append(f"image_grid_thw {a.get('values')} -> {b.get('values')}")
                continue  # the values say it all
            for field in ("shape", "dtype", "sha256"):
                if a.get(field) != b.get(field):
                    changed.append(
                        f"{tensor}.{field} {a.get(field)} -> {b.get(field)}"
                        if field != "sha256"
                        else f"{tensor} bytes (sha256 {str(a.get(field))[:12]} -> {str(b.get(field))[:12]})"
                    )
        if changed:
            problems.append(
                {"kind": "fingerprint", "image": j, "position": position,
                 "message": f"sample index {index}, image {j}: rebuilt tensors changed: " + "; ".join(changed)}
            )  # fmt: skip
    new_positions = {e["position"] for e in report["samples"]}
    for key in old:
        position, index, j = key
        if position in new_positions and key not in new:
            problems.append(
                {"kind": "fingerprint", "image": j, "position": position,
                 "message": f"sample index {index}, image {j}: in the expected report, missing now"}
            )  # fmt: skip
    old_proc, new_proc = expected.get("processor") or {}, report.get("processor") or {}
    diffs = [
        f"{k} {old_proc.get(k)!r} -> {new_proc.get(k)!r}"
        for k in (
            "min_pixels",
            "max_pixels",
            "patch_size",
            "merge_size",
            "temporal_patch_size",
            "transformers",
            "class",
        )
        if old_proc.get(k) != new_proc.get(k)
    ]
    if problems and diffs:
        problems.append(
            {"kind": "fingerprint", "image": None, "position": None,
             "message": "processor settings differ from the expected report's: " + "; ".join(diffs)}
        )  # fmt: skip
    return problems


def _fill_logprob_diffs(
    bundle: Bundle, entries: list[dict[str, Any]], answers: Sequence[Mapping[str, Any]]
) -> None:
    scored = [e for e in entries if not any(p["kind"] == "payload" for p in e["problems"])]
    if len(answers) != len(scored):
        raise ValueError(
            f"answers: expected one engine answer per payload ({len(scored)}, in --payloads-out order), "
            f"found {len(answers)}"
        )
    positions = [e["position"] for e in scored]
    for entry, sample, answer in zip(scored, bundle.samples(Sample, indices=positions), answers, strict=True):
        try:
            entry["logprob_diff"] = compare_prefill_logprobs(sample, answer)
        except ValueError as e:
            entry["problems"].append({"kind": "logprob", "message": str(e), "image": None})


def replay_bundle(
    path: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    limit: int | None = None,
    mm_process_config: Mapping[str, Any] | None = None,
    expect: Mapping[str, Any] | None = None,
    payloads_out: str | os.PathLike[str] | None = None,
    answers: Sequence[Mapping[str, Any]] | None = None,
    ray_address: str | None = None,
    use_ray: bool = False,
    num_tasks: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    allow_outside_media: bool = False,
) -> dict[str, Any]:
    """Replay ``path`` (a bundle directory or packed file) and return the report (see module doc).

    Args:
        dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"``; default the bundle's ``training_dtype``.
        limit: replay only the first ``limit`` samples.
        mm_process_config: replace the recorded ``mm_process_config`` (what-if replays).
        expect: an earlier report; images whose rebuilt tensors changed become ``fingerprint``
            problems (``report["expect"]`` lists them too).
        payloads_out: write one SGLang prefill payload per sample (JSON lines, bundle order).
        answers: the engine's answers to those payloads, in the same order (one per sample with a
            payload); each sample's ``logprob_diff`` then compares the answer's response tail to
            ``rollout_log_probs``; an answer that does not line up is a ``logprob`` problem.
        use_ray / ray_address: shard the samples over Ray tasks (see :mod:`._ray`).
        progress: called as ``progress(done, total)`` after each sample (local replay) or each
            finished shard (Ray).
        allow_outside_media: also read image files that samples name outside the bundle (regular
            files only). Default: only the bundle's own stored media are read; any other path is
            a ``rebuild`` problem, and nothing outside the bundle reaches the report or payloads.
    """
    if expect is not None:
        check_replay_report(expect, "expect")  # before the work, not after it
    bundle = open_replay_bundle(path)
    try:
        return _replay_open_bundle(
            path, bundle, dtype=dtype, limit=limit, mm_process_config=mm_process_config, expect=expect,
            payloads_out=payloads_out, answers=answers, ray_address=ray_address, use_ray=use_ray,
            num_tasks=num_tasks, progress=progress, allow_outside_media=allow_outside_media,
        )  # fmt: skip
    finally:
        bundle.close()


def _replay_open_bundle(
    path: str | os.PathLike[str],
    bundle: Bundle,
    *,
    dtype: str | None,
    limit: int | None,
    mm_process_config: Mapping[str, Any] | None,
    expect: Mapping[str, Any] | None,
    payloads_out: str | os.PathLike[str] | None,
    answers: Sequence[Mapping[str, Any]] | None,
    ray_address: str | None,
    use_ray: bool,
    num_tasks: int | None,
    progress: Callable[[int, int], None] | None,
    allow_outside_media: bool,
) -> dict[str, Any]:
    if expect is not None:
        check_report_bundle(expect, bundle, "expect")  # before the work, not after it
    plan = plan_replay(
        bundle, dtype=dtype, limit=limit, mm_process_config=mm_process_config,
        allow_outside_media=allow_outside_media,
    )  # fmt: skip
    processor = load_processor(plan.processor_settings)
    want_payloads = payloads_out is not None
    if use_ray or ray_address is not None:
        from trainer_hooks.replay._ray import replay_on_ray

        entries, payloads, peak = replay_on_ray(
            plan, address=ray_address, with_payloads=want_payloads, num_tasks=num_tasks, progress=progress
        )
        peak = max(peak, peak_rss_bytes())
    else:
        total = len(plan.positions)
        done = [0]

        def tick(_position: int) -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0], total)

        entries, payloads, peak = replay_positions(
            plan,
            plan.positions,
            bundle=bundle,
            processor=processor,
            with_payloads=want_payloads,
            on_sample=tick,
        )
    if answers is not None:
        _fill_logprob_diffs(bundle, entries, answers)
    if bundle.meta.get("processor") is None:
        # Nothing recorded: the rebuild is a guess, and the report must say so (never "none").
        family = FAMILIES[processor.settings["family"]]
        processor.disagreements.insert(
            0,
            f"{bundle.path}: meta.processor is null: the bundle recorded no processor settings (only "
            f"token-space runs record them); rebuilt with the shipped {family.hub_model} hub config, which "
            "may not be the model's",
        )
    proc_problems = [{"kind": "processor", "message": n, "image": None} for n in processor.disagreements]
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "bundle": str(path) if is_store_url(str(path)) else str(Path(os.path.abspath(path))),
        "bundle_id": bundle_identity(bundle),
        "kind": bundle.kind,
        "dtype": plan.dtype,
        "token_space": plan.token_space,
        # Positions before this one are a checkpoint's pending (in-flight) groups: not training data.
        "skipped_pending": _first_trainable(bundle),
        "processor": processor.settings,
        "summary": {},
        "samples": entries,
    }
    extra = list(proc_problems)
    if expect is not None:
        changed = compare_reports(report, expect)
        report["expect"] = {"bundle": expect.get("bundle"), "changed": changed}
        extra.extend(changed)
    report["summary"] = summarize(entries, peak, extra)
    if payloads_out is not None:
        out = Path(payloads_out)
        tmp = out.with_name(out.name + ".tmp")
        with open(tmp, "w") as f:
            for p in payloads:
                f.write(json.dumps(p, separators=(",", ":")) + "\n")
        os.replace(tmp, out)
    return report
