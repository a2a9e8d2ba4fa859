"""The per-sample work of a replay: :func:`replay_positions`.

For each sample: the conversion guard, the rebuild of its vision tensors (images only from the
bundle's own media, :mod:`trainer_hooks.replay._media`) with the cast to the training dtype, the
token-space check, the prefill payload, and the fingerprints of every image. The same function
runs in the driver (a local replay) and in each Ray task (:mod:`trainer_hooks.replay._ray`),
which is why a merged Ray report equals the local one; :func:`summarize` computes ``summary``
from the sample entries alone (plus the peak RSS, per process, the one field that differs).
"""

from __future__ import annotations

import resource
import sys
from argparse import Namespace
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bundles import Bundle, BundleError
from trainer_hooks._sample import Sample
from trainer_hooks.replay._fingerprint import fingerprints, tensor_bytes
from trainer_hooks.replay._guard import _default_convert, guard_violations
from trainer_hooks.replay._media import MediaReader
from trainer_hooks.replay._payload import build_prefill_scoring_payload
from trainer_hooks.replay._plan import ReplayPlan, open_replay_bundle
from trainer_hooks.replay._processor import ReplayProcessor, load_processor
from trainer_hooks.replay._rebuild import compute_multimodal_train_inputs, dtype_from_name
from trainer_hooks.replay._tokens import check_image_tokens

__all__ = ["peak_rss_bytes", "replay_positions", "summarize"]


def peak_rss_bytes() -> int:
    """This process's RSS high-water mark (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


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
        entry["bytes_after_cast"] = tensor_bytes(rebuilt)
        images = fingerprints(rebuilt)
        grid = rebuilt.get("image_grid_thw")
        tokens = sample.tokens if isinstance(sample.tokens, (list, tuple)) else []  # else a payload problem
        if grid is not None:
            expected, found, token_problems = check_image_tokens(
                tokens,
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
