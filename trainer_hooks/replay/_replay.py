"""Replay a bundle the way training would see it, and report: :func:`replay_bundle`.

Opens the bundle (a packed file read in place), plans (:mod:`._plan`: dtype, processor settings,
positions, all recorded values checked), runs the per-sample work locally or as Ray tasks
(:mod:`._run`, :mod:`._ray`; with a model, :mod:`._score` scores each sample's response),
compares with an earlier report (:mod:`._fingerprint`), fills log-prob differences from engine
answers, summarizes (the mismatch across the bundle: :mod:`._mismatch`), and writes ``--payloads-out`` atomically
(:mod:`._report`). The report's format is in :mod:`trainer_hooks.replay._report`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from bundles import Bundle, child_location
from trainer_hooks._sample import Sample
from trainer_hooks.replay._fingerprint import compare_reports
from trainer_hooks.replay._mismatch import DEFAULT_TIS_CAP, mismatch_summary
from trainer_hooks.replay._payload import compare_prefill_logprobs
from trainer_hooks.replay._plan import ReplayPlan, first_trainable, open_replay_bundle, plan_replay
from trainer_hooks.replay._processor import FAMILIES, ReplayProcessor, load_processor
from trainer_hooks.replay._report import (
    REPORT_FORMAT,
    REPORT_VERSION,
    bundle_identity,
    check_replay_report,
    check_report_bundle,
    write_json_lines,
)
from trainer_hooks.replay._run import peak_rss_bytes, replay_positions, summarize
from trainer_hooks.replay._score import DEFAULT_BATCH_BYTES, model_class_name

__all__ = ["replay_bundle"]


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
    model: str | os.PathLike[str] | None = None,
    engine: str | None = None,
    device: str = "cpu",
    max_logprob_diff: float | None = None,
    tis_cap: float = DEFAULT_TIS_CAP,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
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
        model / device: a local model directory (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; offline) run on
            ``device``: each ``logprob_diff`` compares its log-probs of the response, on what
            training would be handed, with ``rollout_log_probs`` (:mod:`._score`, :mod:`._mismatch`;
            ``summary["logprob"]`` sums them up). Not with ``answers``.
        engine: a running SGLang server's URL: the same, from its prefill answers (:mod:`._engine`).
        max_logprob_diff: a sample whose ``mean_abs`` is over it is a ``logprob`` problem.
        tis_cap / batch_bytes: the TIS figure's ratio cap; the memory of one forward pass.
    """
    scoring = _scoring(model, engine, device, max_logprob_diff, tis_cap, batch_bytes, answers is not None)
    if expect is not None:
        check_replay_report(expect, "expect")  # before the work, not after it
    bundle = open_replay_bundle(path)
    try:
        return _replay_open_bundle(
            path, bundle, dtype=dtype, limit=limit, mm_process_config=mm_process_config, expect=expect,
            payloads_out=payloads_out, answers=answers, ray_address=ray_address, use_ray=use_ray,
            num_tasks=num_tasks, progress=progress, allow_outside_media=allow_outside_media, scoring=scoring,
        )  # fmt: skip
    finally:
        bundle.close()


def _scoring(
    model: str | os.PathLike[str] | None,
    engine: str | None,
    device: str,
    max_logprob_diff: float | None,
    tis_cap: float,
    batch_bytes: int,
    with_answers: bool,
) -> dict[str, Any]:
    """The :class:`ReplayPlan` fields of log-prob scoring, checked before any work (a family
    replay cannot score is refused here, in one line naming it)."""
    if sum((model is not None, engine is not None, with_answers)) > 1:
        raise ValueError("--model, --engine and --answers each fill logprob_diff: give one of them")
    if max_logprob_diff is not None and model is None and engine is None:
        raise ValueError("--max-logprob-diff needs --model or --engine")
    if engine is not None and not engine.startswith(("http://", "https://")):
        raise ValueError(f"--engine: expected an http:// or https:// URL, found {engine[:200]!r}")
    if not (isinstance(tis_cap, (int, float)) and tis_cap > 0):
        raise ValueError(f"tis_cap: expected a number > 0, found {tis_cap!r}")
    if model is not None:
        model_class_name(os.fspath(model))
    return {
        "model": os.fspath(model) if model is not None else None, "engine": engine, "device": device,
        "max_logprob_diff": max_logprob_diff, "tis_cap": float(tis_cap), "batch_bytes": int(batch_bytes),
    }  # fmt: skip


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
    scoring: Mapping[str, Any],
) -> dict[str, Any]:
    if expect is not None:
        check_report_bundle(expect, bundle, "expect")  # before the work, not after it
    plan = plan_replay(
        bundle, dtype=dtype, limit=limit, mm_process_config=mm_process_config,
        allow_outside_media=allow_outside_media,
    )  # fmt: skip
    plan = replace(plan, **scoring)
    processor = load_processor(plan.processor_settings)
    entries, payloads, peak = _replay_samples(
        plan, bundle, processor, with_payloads=payloads_out is not None, ray_address=ray_address,
        use_ray=use_ray, num_tasks=num_tasks, progress=progress,
    )  # fmt: skip
    if answers is not None:
        _fill_logprob_diffs(bundle, entries, answers)
    if plan.engine is not None:
        from trainer_hooks.replay._engine import score_on_engine

        score_on_engine(bundle, plan, entries, plan.engine)
    _note_unrecorded_processor(bundle, processor)
    report = _assemble_report(path, bundle, plan, processor, entries, peak, expect)
    if payloads_out is not None:
        write_json_lines(payloads, payloads_out)
    return report


def _replay_samples(
    plan: ReplayPlan,
    bundle: Bundle,
    processor: ReplayProcessor,
    *,
    with_payloads: bool,
    ray_address: str | None,
    use_ray: bool,
    num_tasks: int | None,
    progress: Callable[[int, int], None] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Replay every planned position, on Ray or in this process: the entries, the payloads and
    the peak RSS."""
    if use_ray or ray_address is not None:
        from trainer_hooks.replay._ray import replay_on_ray

        entries, payloads, peak = replay_on_ray(
            plan, address=ray_address, with_payloads=with_payloads, num_tasks=num_tasks, progress=progress
        )
        return entries, payloads, max(peak, peak_rss_bytes())
    total = len(plan.positions)
    done = [0]

    def tick(_position: int) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    return replay_positions(
        plan,
        plan.positions,
        bundle=bundle,
        processor=processor,
        with_payloads=with_payloads,
        on_sample=tick,
    )


def _note_unrecorded_processor(bundle: Bundle, processor: ReplayProcessor) -> None:
    if bundle.meta.get("processor") is None:
        # Nothing recorded: the rebuild is a guess, and the report must say so (never "none").
        family = FAMILIES[processor.settings["family"]]
        processor.disagreements.insert(
            0,
            f"{bundle.path}: meta.processor is null: the bundle recorded no processor settings (only "
            f"token-space runs record them); rebuilt with the shipped {family.hub_model} hub config, which "
            "may not be the model's",
        )


def _assemble_report(
    path: str | os.PathLike[str],
    bundle: Bundle,
    plan: ReplayPlan,
    processor: ReplayProcessor,
    entries: list[dict[str, Any]],
    peak: int,
    expect: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The report (see the module docstring), compared with ``expect`` when given."""
    proc_problems = [{"kind": "processor", "message": n, "image": None} for n in processor.disagreements]
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "bundle": str(child_location(path, "")),
        "bundle_id": bundle_identity(bundle),
        "kind": bundle.kind,
        "dtype": plan.dtype,
        "token_space": plan.token_space,
        # Positions before this one are a checkpoint's pending (in-flight) groups: not training data.
        "skipped_pending": first_trainable(bundle),
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
    mismatch = mismatch_summary(entries, plan.tis_cap)
    if mismatch is not None:
        report["summary"]["logprob"] = mismatch
    if plan.model is not None:
        report["model"] = {
            "path": plan.model,
            "device": plan.device,
            "max_logprob_diff": plan.max_logprob_diff,
        }
    if plan.engine is not None:
        report["engine"] = {"url": plan.engine, "max_logprob_diff": plan.max_logprob_diff}
    return report
