"""``rollout-bundle replay BUNDLE``: the replay subcommand (registered by :func:`register`).

    rollout-bundle replay BUNDLE [--dtype {bf16,fp16,fp32}] [--limit N] [--json]
                          [--report FILE.json] [--payloads-out FILE.jsonl] [--expect FILE.json]
                          [--answers FILE.jsonl] [--mm-process-config JSON] [--ray [ADDRESS]]
                          [--model DIR [--device cpu|cuda] | --engine URL] [--max-logprob-diff X]
                          [--tis-cap C]

Opens the bundle (directory or packed file, fast verification), runs the conversion guard, the
rebuild with cast, the token-space check and the prefill payload build for each sample, and
prints a summary. Exit status: 0 when clean, 1 on any violation (``guard``, ``convert``,
``rebuild``, ``token_count``, ``payload``, ``logprob``, ``fingerprint``) or an unreadable bundle, 2 on bad
usage. Processor disagreements (``processor``) are printed and counted but do not fail a replay:
they describe this machine's processor, not the bundle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from bundles import BundleError
from bundles.support import (
    CommandError,
    Progress,
    add_command,
    add_json_option,
    add_progress_option,
    check_output_file,
    human_bytes,
)

__all__ = ["VIOLATION_KINDS", "register", "run_replay"]

VIOLATION_KINDS = frozenset(
    {"guard", "convert", "rebuild", "token_count", "payload", "logprob", "fingerprint"}
)
_SHOWN = 20  # problems listed in the text summary; the report has them all


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, found {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, found {text!r}")
    return value


LIMIT_MESSAGE = "--limit must be at least 1; omit it for every sample"


def _limit(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of samples, found {text!r}") from None


# The files replay writes or compares against: (flag, metavar, help).
_FILE_OPTIONS = (
    ("--report", "FILE.json", "write per-sample results and fingerprints"),
    ("--payloads-out", "FILE.jsonl", "write one SGLang prefill payload per sample"),
    (
        "--expect",
        "FILE.json",
        "compare fingerprints with an earlier --report; every changed image is a violation",
    ),
    (
        "--answers",
        "FILE.jsonl",
        "SGLang answers to the --payloads-out payloads (same order): fill each sample's logprob_diff "
        "(response tail against rollout_log_probs)",
    ),
)


def register(subparsers: Any) -> None:
    """Add ``replay`` to the ``rollout-bundle`` subcommands."""
    p = add_command(
        subparsers,
        "replay",
        "replay a checkpoint or debug dump as training would see it (guard, cast, tokens, payloads)",
        run_replay,
        description=(
            "Replay BUNDLE (a directory or packed file) as training would see it: the conversion guard, "
            "the rebuild of vision tensors with the recorded processor settings, cast to the training "
            "dtype, the token-space placeholder check, the SGLang prefill payloads, and a fingerprint of "
            "every rebuilt image. Exit 0 when clean, 1 on any violation, 2 on bad usage."
        ),
    )
    p.add_argument(
        "bundle",
        nargs="?",  # required; optional only so that `--ray BUNDLE` can be told apart (run_replay)
        metavar="BUNDLE",
        help="a rollout checkpoint or debug dump: a bundle directory or packed file",
    )
    p.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), default=None,
        help="cast floating tensors to this dtype (default: the training dtype the bundle recorded)",
    )  # fmt: skip
    p.add_argument(
        "--limit", type=_limit, default=None, metavar="N",
        help="replay only the first N samples (N >= 1; omit it for every sample)",
    )  # fmt: skip
    add_json_option(p, "the summary")
    add_progress_option(p)
    for flag, metavar, text in _FILE_OPTIONS:
        p.add_argument(flag, metavar=metavar, help=text)
    p.add_argument(
        "--mm-process-config", type=_json_object, default=None, metavar="JSON",
        help='replace the recorded mm_process_config, e.g. \'{"image": {"max_pixels": 1003520}}\'',
    )  # fmt: skip
    p.add_argument(
        "--allow-outside-media", action="store_true",
        help="also read image files that samples name outside the bundle (regular files only); by "
        "default replay reads only the media stored in the bundle, which may come from anyone",
    )  # fmt: skip
    _add_model_options(p)
    p.add_argument(
        "--ray", nargs="?", const="", default=None, metavar="ADDRESS",
        help="shard samples over Ray tasks (the bundle must be on a filesystem the cluster shares); "
        "ADDRESS as for ray.init (default: a running local cluster, else a new one)",
    )  # fmt: skip
    p.usage = (
        "%(prog)s BUNDLE [--dtype {bf16,fp16,fp32}] [--limit N] [--json] [--report FILE.json]\n"
        "       [--payloads-out FILE.jsonl] [--expect FILE.json] [--answers FILE.jsonl]\n"
        "       [--mm-process-config JSON] [--allow-outside-media] [--ray [ADDRESS]]\n"
        "       [--model DIR [--device {cpu,cuda}] | --engine URL] [--max-logprob-diff X] [--tis-cap C]\n"
        "       [--progress | --no-progress]"
    )


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, found {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, found {text!r}")
    return value


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """``--model`` and what goes with it: the trainer's log-probs against the rollout's."""
    p.add_argument(
        "--model", metavar="DIR",
        help="a local model directory (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; loaded offline): fill each "
        "sample's logprob_diff with the model's log-probs of the response, computed on what training "
        "would be handed, against rollout_log_probs",
    )  # fmt: skip
    p.add_argument(
        "--engine", metavar="URL",
        help="a running SGLang server (http://HOST:PORT): post each sample's prefill payload to its "
        "/generate and fill logprob_diff from its answer, as --model does",
    )  # fmt: skip
    p.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda"), help="where --model runs (default cpu)"
    )
    p.add_argument(
        "--max-logprob-diff", type=_positive, default=None, metavar="X",
        help="with --model or --engine: a sample whose mean |log-prob difference| is over X is a "
        "violation (exit 1)",
    )  # fmt: skip
    p.add_argument(
        "--tis-cap", type=_positive, default=2.0, metavar="C",
        help="the importance-ratio cap of the summary's truncated-importance-sampling figure (default 2)",
    )  # fmt: skip


def _all_problems(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = [p for e in report["samples"] for p in e["problems"]]
    out += [{"kind": "processor", "message": m} for m in report["processor"].get("disagreements", [])]
    out += list((report.get("expect") or {}).get("changed", []))
    return out


def _print_summary(report: dict[str, Any], out: TextIO) -> None:
    s = report["summary"]
    proc = report["processor"]
    w = out.write
    w(f"replay   {report['bundle']} ({report['kind']}), dtype {report['dtype']}"
      f"{', token space' if report['token_space'] else ''}\n")  # fmt: skip
    w(f"processor {proc['class']} from {proc['source']} (transformers {proc['transformers']}): "
      f"min_pixels {proc['min_pixels']}, max_pixels {proc['max_pixels']}, merge_size {proc['merge_size']}, "
      f"image token {proc['image_token_id']}\n")  # fmt: skip
    for note in proc.get("notes", []):
        w(f"  note: {note}\n")
    skipped = report.get("skipped_pending") or 0
    pending = (
        f" (after {skipped} pending sample(s) of in-flight groups, not training data)" if skipped else ""
    )
    w(f"samples        {s['samples']}{pending}\n")
    w(f"images         {s['images']}\n")
    w(f"vision tokens  {s['vision_tokens']}\n")
    before, after = s["bytes_before_cast"], s["bytes_after_cast"]
    ratio = f" ({after / before:.2f}x)" if before else ""
    w(
        f"tensor bytes   {human_bytes(before)} from the processor -> {human_bytes(after)} as {report['dtype']}{ratio}\n"
    )
    w(f"peak memory    {human_bytes(s['peak_rss_bytes'])} (RSS high-water mark)\n")
    if s.get("logprob"):
        _print_mismatch(s["logprob"], report, w)
    kinds = s["problems"]
    if not kinds:
        w("problems       none\n")
        return
    w("problems       " + ", ".join(f"{k} {n}" for k, n in kinds.items()) + "\n")
    problems = _all_problems(report)
    for p in problems[:_SHOWN]:
        tag = "warning" if p["kind"] not in VIOLATION_KINDS else p["kind"]
        w(f"  - [{tag}] {p['message']}\n")
    if len(problems) > _SHOWN:
        w(f"  ... {len(problems) - _SHOWN} more (see --report)\n")


def _print_mismatch(m: dict[str, Any], report: dict[str, Any], w: Any) -> None:
    """The summary's log-prob lines: the distribution of per-sample mean |difference|, k3, TIS."""
    d = m["mean_abs"]
    model, engine = report.get("model"), report.get("engine")
    source = f" ({model['path']} on {model['device']})" if model else ""
    source = f" (engine {engine['url']})" if engine else source
    w(f"log-probs      {m['samples']} samples, {m['tokens']} tokens{source}\n")
    w(f"  mean |diff|  mean {d['mean']:.3g}, p50 {d['p50']:.3g}, p99 {d['p99']:.3g}, max {d['max']:.3g}\n")
    if m["tokens"]:
        w(f"  k3 KL        {m['k3']:.3g} (rollout || trainer, per token)\n")
        w(
            f"  TIS cap {m['tis_cap']:g}  clips {m['tis_clipped_tokens']} tokens ({m['tis_clipped_fraction']:.2%})\n"
        )


def run_replay(ns: argparse.Namespace) -> int:
    from trainer_hooks.replay._report import write_report

    _check_arguments(ns)
    # A replay can take minutes: refuse outputs it could not write before doing the work.
    check_output_file("--report", ns.report)
    check_output_file("--payloads-out", ns.payloads_out)
    expect = _load_expect(ns)
    answers = _load_answers(ns)
    _require_replay_dependencies()
    from trainer_hooks.replay._memory import tune_allocator

    tune_allocator()  # this process exists to replay (see _memory)
    report = _replay_with_progress(ns, expect, answers)
    if ns.report is not None:
        write_report(report, ns.report)
    _print_outcome(ns, report)
    violated = any(kind in VIOLATION_KINDS for kind in report["summary"]["problems"])
    return 1 if violated else 0


def _check_arguments(ns: argparse.Namespace) -> None:
    """What argparse cannot check: the bundle that --ray swallowed, --limit, Ray installed."""
    if ns.bundle is None:
        # `replay --ray BUNDLE`: argparse hands the bundle to --ray's optional ADDRESS. An address
        # is "auto", HOST:PORT or ray://...; a path that exists is the bundle.
        if ns.ray and os.path.exists(ns.ray):
            ns.bundle, ns.ray = ns.ray, ""
        else:
            raise CommandError("the following arguments are required: BUNDLE", status=2)
    if ns.limit is not None and ns.limit < 1:
        raise CommandError(LIMIT_MESSAGE, status=2)
    if ns.ray is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise CommandError(
                "--ray needs Ray, which is not installed: pip install 'rollout-bundles[ray]'", status=2
            ) from None


def _load_expect(ns: argparse.Namespace) -> dict[str, Any] | None:
    """The --expect report, its shape and its bundle checked before minutes of work."""
    from trainer_hooks.replay._report import ReportError, check_report_bundle, load_replay_report

    if ns.expect is None:
        return None
    try:
        expect = load_replay_report(ns.expect)
    except ReportError as e:
        raise CommandError(
            f"--expect: expected a replay report (written by --report): {e}", status=2
        ) from None
    try:  # a report of another bundle: the caller's pair to fix (exit 2, as view --replay)
        check_report_bundle(expect, ns.bundle, f"--expect {ns.expect}")
    except ReportError as e:
        raise CommandError(str(e), status=2) from None
    return expect


def _load_answers(ns: argparse.Namespace) -> list[Any] | None:
    if ns.answers is None:
        return None
    try:
        with open(ns.answers) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise CommandError(f"--answers {ns.answers}: cannot read JSON lines: {e}", status=2) from None


def _require_replay_dependencies() -> None:
    # Imported here, not at the top: every other subcommand runs without them.
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise CommandError(
            f"replay needs torch and transformers ({e}): pip install 'rollout-bundles[replay]' torch==2.13.0",
            status=2,
        ) from None


def _replay_with_progress(
    ns: argparse.Namespace, expect: dict[str, Any] | None, answers: list[Any] | None
) -> dict[str, Any]:
    """Replay the bundle behind a progress bar; the errors that are the caller's exit 2."""
    from trainer_hooks.replay._replay import replay_bundle
    from trainer_hooks.replay._report import ReportError

    bar = Progress("replay", unit="samples", enabled=getattr(ns, "progress", None))

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.advance(done - bar.done)

    try:
        with bar:
            return replay_bundle(
                ns.bundle,
                dtype=ns.dtype,
                limit=ns.limit,
                mm_process_config=ns.mm_process_config,
                expect=expect,
                payloads_out=ns.payloads_out,
                answers=answers,
                use_ray=ns.ray is not None,
                ray_address=ns.ray or None,
                progress=progress,
                allow_outside_media=ns.allow_outside_media,
                model=ns.model,
                engine=ns.engine,
                device=ns.device,
                max_logprob_diff=ns.max_logprob_diff,
                tis_cap=ns.tis_cap,
            )
    except ReportError as e:  # --expect names a report of another bundle
        raise CommandError(f"--expect {ns.expect}: {str(e).removeprefix('expect: ')}", status=2) from None
    except BundleError:
        raise  # an unreadable bundle: exit 1 (some are ValueErrors too)
    except ValueError as e:  # --answers that do not match the payloads, unusable settings
        raise CommandError(str(e), status=2) from None


def _print_outcome(ns: argparse.Namespace, report: dict[str, Any]) -> None:
    if ns.json:
        from trainer_hooks.replay._report import strict_json

        print(
            json.dumps(
                strict_json({"bundle": report["bundle"], "dtype": report["dtype"], **report["summary"]}),
                sort_keys=True,
                allow_nan=False,
            )
        )
    else:
        _print_summary(report, sys.stdout)
        if ns.report is not None:
            print(f"report         {ns.report}")
        if ns.payloads_out is not None:
            print(f"payloads       {ns.payloads_out}")
