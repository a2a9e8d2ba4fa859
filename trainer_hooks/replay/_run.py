"""The per-sample work of a replay: :func:`replay_positions`.

For each sample: the conversion guard, the rebuild of its vision tensors (images only from the
bundle's own media, :mod:`trainer_hooks.replay._media`) with the cast to the training dtype, the
token-space check, the prefill payload, and the fingerprints of every image. The same function
runs in the driver (a local replay) and in each Ray task (:mod:`trainer_hooks.replay._ray`),
which is why a merged Ray report equals the local one; :func:`summarize` computes ``summary``
from the sample entries alone (plus the peak RSS, per process, the one field that differs).

A replay keeps none of the tensors it rebuilds, only their fingerprints, so it does not call
:func:`compute_multimodal_train_inputs` as the trainer does: each image's processor output goes
to a :class:`~trainer_hooks.replay._overlap.PixelWorker`, whose thread casts it to the training
dtype and fingerprints it while this thread decodes the next image and runs the processor on it;
the sample's images are never concatenated (the fingerprints of per-image rows are those of the
concatenation). The price is memory, bounded: one image's float32 output in flight and one
reusable cast buffer (see :mod:`trainer_hooks.replay._overlap`). A sample is finished (its
``images`` filled in, ``on_sample`` called) when the next one has started. A processor whose
outputs are not per-image rows gets the trainer's own rebuild, on this thread.

With a model (``replay --model``, :mod:`trainer_hooks.replay._score`) every sample gets the
trainer's own rebuild, on this thread, because the model needs the cast tensors themselves: they
are queued with the sample's tokens and scored in batches; a sample some check has already refused
(``rebuild``, ``token_count``, ``payload``, ``convert``) is not scored. Each process loads its
model once (a Ray task: one model per task).
"""

from __future__ import annotations

import resource
import sys
from argparse import Namespace
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from bundles import Bundle, BundleError
from trainer_hooks._sample import Sample
from trainer_hooks.replay._fingerprint import fingerprints, grid_fingerprint, tensor_bytes
from trainer_hooks.replay._guard import _default_convert, guard_violations
from trainer_hooks.replay._media import MediaReader
from trainer_hooks.replay._overlap import PixelResult, PixelWorker, _wait
from trainer_hooks.replay._payload import build_prefill_scoring_payload
from trainer_hooks.replay._plan import ReplayPlan, open_replay_bundle
from trainer_hooks.replay._processor import ReplayProcessor, load_processor
from trainer_hooks.replay._rebuild import (
    compute_multimodal_train_inputs,
    dtype_from_name,
    processed_batches,
    sample_images,
)
from trainer_hooks.replay._score import LogprobScorer, make_scorer, score_item
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
    overlap: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Replay the samples at ``positions`` of ``plan.bundle``.

    ``overlap``: cast and fingerprint on a worker thread (see the module doc); False: the same
    work on the calling thread, with the same results.

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
    scorer = make_scorer(plan, processor.image_token_id)  # None without --model
    entries: list[dict[str, Any]] = []
    payloads: list[dict[str, Any]] = []
    # A sample is finished (its fingerprints filled in) once the next one's work has started.
    pending: tuple[int, Callable[[], None]] | None = None
    with PixelWorker(overlap) as worker:
        # Only the shards holding these positions are read (a Ray task reads its own part).
        for position, sample in zip(wanted, bundle.samples(Sample, indices=wanted), strict=True):
            entry, payload, finish = _replay_one(
                position, sample, processor, dtype, args, plan, media, with_payloads, worker, scorer
            )
            entries.append(entry)
            if with_payloads and payload is not None:
                payloads.append(payload)
            if pending is not None:
                _finish(pending, on_sample)
            pending = (position, finish)
        if scorer is not None:
            scorer.flush()  # the last batch: its entries are filled before the last sample finishes
        if pending is not None:
            _finish(pending, on_sample)
    return entries, payloads, peak_rss_bytes()


def _finish(pending: tuple[int, Callable[[], None]], on_sample: Callable[[int], None] | None) -> None:
    position, finish = pending
    finish()
    if on_sample is not None:
        on_sample(position)


# A sample's rebuild: bytes before the cast, its image_grid_thw, and its results (bytes after
# the cast, one fingerprint entry per image), which the overlapped rebuild has only once its
# worker jobs are done.
_Rebuilt = tuple[int, Any, Callable[[], tuple[int, list[dict[str, Any]]]]]


class _Sequential(Exception):
    """This sample's processor outputs are not of the shape the worker path assumes."""


def _rebuild_overlapped(
    position: int,
    sample: Sample,
    processor: ReplayProcessor,
    dtype: Any,
    media: MediaReader,
    worker: PixelWorker,
) -> _Rebuilt | None:
    """The rebuild of :func:`compute_multimodal_train_inputs`, cast and fingerprints handed to
    ``worker`` image by image, or None for a sample without images.

    Raises :class:`_Sequential` unless each image's output is one ``pixel_values`` tensor whose
    rows are its ``image_grid_thw`` rows' patches, of one trailing shape and dtype across the
    sample, and an integer grid of ``(t, h, w)`` rows (what every Qwen2-VL-family processor
    returns): only then are per-image fingerprints those of the concatenated sample."""
    import torch

    where = f"sample index {sample.index} (position {position})"
    images = sample_images(sample, where)
    if not images:
        return None
    before = 0
    grids: list[Any] = []
    jobs: list[Future[PixelResult]] = []
    first: tuple[Any, Any] | None = None
    for j, raw in enumerate(processed_batches(images, processor, media, where)):
        if set(raw) != _PER_IMAGE_KEYS:
            raise _Sequential
        pixels, grid = raw.pop("pixel_values"), raw.pop("image_grid_thw")
        if not (
            isinstance(pixels, torch.Tensor) and isinstance(grid, torch.Tensor) and pixels.dim() >= 1
            and grid.dim() == 2 and grid.shape[1] == 3 and not grid.is_floating_point()
        ):  # fmt: skip
            raise _Sequential
        patches = [int(t) * int(h) * int(w) for t, h, w in grid.tolist()]
        if first is None:
            first = (pixels.shape[1:], pixels.dtype)
        if pixels.shape[0] != sum(patches) or (pixels.shape[1:], pixels.dtype) != first:
            raise _Sequential
        before += pixels.numel() * pixels.element_size() + grid.numel() * grid.element_size()
        jobs.append(worker.submit([pixels], dtype, patches, trim=j == len(images) - 1))
        del pixels  # the worker holds the only reference
        grids.append(grid)
    grid = grids[0] if len(grids) == 1 else torch.cat(grids, dim=0)

    def results() -> tuple[int, list[dict[str, Any]]]:
        done = [_wait(job) for job in jobs]
        rows = [row for fingerprints_of_image, _ in done for row in fingerprints_of_image]
        after = sum(n for _, n in done) + grid.numel() * grid.element_size()
        images = [
            {"image": j, "pixel_values": row, "image_grid_thw": grid_fingerprint(g)[1]}
            for j, (row, g) in enumerate(zip(rows, grid, strict=True))
        ]
        return after, images

    return before, grid, results


def _rebuild_sequential(
    position: int,
    sample: Sample,
    processor: ReplayProcessor,
    dtype: Any,
    media: MediaReader,
    kept: list[dict[str, Any]] | None = None,
) -> _Rebuilt | None:
    """The rebuild as the trainer does it, for the outputs :func:`_rebuild_overlapped` refuses,
    and for a replay that scores with a model (the rebuilt tensors appended to ``kept``)."""
    before = [0]
    rebuilt = compute_multimodal_train_inputs(
        [sample],
        processor,
        dtype,
        on_sample=lambda _p, _c, b: before.__setitem__(0, b),
        first_position=position,
        media=media,
    )[0]
    if rebuilt is None:
        return None
    if kept is not None:
        kept.append(rebuilt)
    after, images = tensor_bytes(rebuilt), fingerprints(rebuilt)
    return before[0], rebuilt.get("image_grid_thw"), lambda: (after, images)


def _replay_one(
    position: int,
    sample: Sample,
    processor: ReplayProcessor,
    dtype: Any,
    args: Namespace,
    plan: ReplayPlan,
    media: MediaReader,
    with_payload: bool,
    worker: PixelWorker,
    scorer: LogprobScorer | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None, Callable[[], None]]:
    """Everything but the fingerprints, which ``finish()`` fills in once the worker has them."""
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
    problems.extend(_guard_problems(args, sample, position))
    rebuilt: _Rebuilt | None
    kept: list[dict[str, Any]] | None = [] if scorer is not None else None
    try:
        try:
            if kept is not None:  # the scorer needs the tensors themselves: the trainer's rebuild
                raise _Sequential
            rebuilt = _rebuild_overlapped(position, sample, processor, dtype, media, worker)
        except _Sequential:
            rebuilt = _rebuild_sequential(position, sample, processor, dtype, media, kept)
    except (OSError, ValueError, BundleError) as e:
        problems.append({"kind": "rebuild", "message": str(e), "image": None})  # names index and position
        rebuilt = None
    finish: Callable[[], None] = _nothing
    if rebuilt is not None:
        before, grid, results = rebuilt
        entry["bytes_before_cast"] = before
        tokens_per_image = _token_check(sample, grid, processor, problems if plan.token_space else [])

        def fill_images() -> None:
            entry["bytes_after_cast"], images = results()
            for img, (want, got) in zip(images, tokens_per_image, strict=True):
                img["vision_tokens"] = want
                img["placeholder_tokens"] = got
            entry["images"] = [{k: img.get(k) for k in _IMAGE_KEYS} for img in images]

        finish = fill_images

    payload = None
    try:
        payload = build_prefill_scoring_payload(args, sample, {}, media=media, images=with_payload)
    except (OSError, ValueError, BundleError) as e:
        problems.append({"kind": "payload", "message": str(e), "image": None})
    if scorer is not None and (item := score_item(sample, entry, kept[0] if kept else None)) is not None:
        scorer.add(item)
    return entry, payload, finish


def _guard_problems(args: Namespace, sample: Sample, position: int) -> list[dict[str, Any]]:
    """The conversion guard's violations for ``sample`` (``guard``), or the converter's refusal
    (``convert``)."""
    try:
        train = _default_convert(args, [sample], {})
        return [
            {"kind": "guard", "message": message, "image": None}
            for _, _, message in guard_violations(train, first_position=position)
        ]
    except (ValueError, TypeError, KeyError) as e:
        return [{"kind": "convert", "message": f"sample index {sample.index}: {e}", "image": None}]


def _token_check(
    sample: Sample, grid: Any, processor: ReplayProcessor, problems: list[dict[str, Any]]
) -> list[tuple[int, int | None]]:
    """Per image: ``(vision tokens the grid gives, placeholders found)``; a mismatch is added to
    ``problems`` as ``token_count`` (the caller passes a throwaway list outside token space)."""
    if grid is None:
        return []
    # not a list: a payload problem
    tokens = sample.tokens if isinstance(sample.tokens, (list, tuple)) else []
    expected, found, token_problems = check_image_tokens(
        tokens,
        grid,
        merge_size=processor.merge_size,
        image_token_id=processor.image_token_id,
        sample_index=sample.index,
    )
    problems.extend(token_problems)
    return list(zip(expected, found, strict=True))


def _nothing() -> None:
    pass


_PER_IMAGE_KEYS = frozenset({"pixel_values", "image_grid_thw"})
_IMAGE_KEYS = ("image", "vision_tokens", "placeholder_tokens", "pixel_values", "image_grid_thw")


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
