"""Command-line options, with Miles' names, and their validation in one pass after parsing.

``add_arguments`` adds to an existing parser and skips any option the parser already has, so
it can be called on Miles' own parser (which defines ``--save``, ``--fp16``, … itself).
``validate_args`` raises ``ValueError`` naming the option; it normalizes some values in place
(``shared_media_dir``, ``save``, ``load`` and the debug-dump templates made absolute, because
Ray workers may run in another directory;
``sglang_mm_process_config`` parsed from JSON) and sets ``args.rollout_processor_args``.
"""

from __future__ import annotations

import argparse
import os
import re
import uuid
from collections.abc import Sequence
from typing import Any

from trainer_hooks._processor_args import RolloutEngineProcessorArgs, parse_mm_process_config
from trainer_hooks._run_media import check_run_id

__all__ = ["BUNDLE_LINK_MODES", "BUNDLE_VERIFY_MODES", "add_arguments", "parse_args", "validate_args"]

BUNDLE_LINK_MODES = ("auto", "hardlink", "reflink", "copy")
BUNDLE_VERIFY_MODES = ("none", "fast", "full")
_ADDR_RE = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]{1,5})")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    # argparse has no public way to ask which option strings exist.
    return set(parser._option_string_actions)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add this project's and the used Miles options to ``parser``; return it.

    Options the parser already defines are left as they are.
    """
    existing = _options(parser)
    group = parser.add_argument_group("rollout bundles and run media")

    def add(flag: str, **kwargs: Any) -> None:
        if flag not in existing:
            group.add_argument(flag, **kwargs)

    # Run media.
    add(
        "--shared-media-dir",
        default=None,
        help="Shared filesystem directory for rollout media; each run writes under <dir>/<run uuid> "
        "and removes that directory at teardown.",
    )
    # None until validate_args draws a uuid4: a default drawn here would be shared by every
    # parse in the process.
    add("--run-uuid", default=None, help="Name of this run's media directory (default: a new uuid4 hex).")
    # Checkpoints and debug dumps (Miles).
    add("--save", default=None, help="Checkpoint directory.")
    add("--load", default=None, help="Checkpoint directory to resume from.")
    add(
        "--save-debug-rollout-data",
        default=None,
        help="Path template with {rollout_id} for dumping each rollout's samples.",
    )
    add(
        "--load-debug-rollout-data",
        default=None,
        help="Path template with {rollout_id} to replay dumped samples instead of running engines.",
    )
    add(
        "--load-debug-rollout-data-subsample",
        type=float,
        default=None,
        help="Keep this fraction (0 < r <= 1) of the replayed samples.",
    )
    add("--fp16", action="store_true", default=False)
    add("--bf16", action="store_true", default=False)
    # Driver loop (Miles); only what the reference drivers use.
    add("--num-rollout", type=int, default=1, help="Number of rollout steps to run.")
    add("--start-rollout-id", type=int, default=0)
    add("--rollout-batch-size", type=int, default=1, help="Prompt groups per rollout step.")
    add("--save-interval", type=int, default=None, help="Save a checkpoint every N rollout steps.")
    add("--update-weights-interval", type=int, default=1)
    # Engines and processing.
    add(
        "--enable-token-space-processor",
        action="store_true",
        default=False,
        help="Process multimodal inputs in the trainer with the engines' processor; requires every "
        "engine group to share the processor settings (checked at parse time).",
    )
    add(
        "--sglang-config",
        default=None,
        help="YAML: sglang: [{name, model_path, server_groups: [{worker_type, num_gpus, overrides: {...}}]}].",
    )
    add("--sglang-model-path", default=None)
    add("--sglang-image-processor-backend", default=None)
    add("--sglang-mm-process-config", default=None, help="JSON object.")
    add("--rollout-external-engine-addrs", nargs="+", default=None, metavar="HOST:PORT")
    add("--custom-inference-engine-provider-path", default=None)
    add("--recompute-logprobs-via-prefill", action="store_true", default=False)
    # Bundles.
    add(
        "--bundle-link-mode",
        choices=BUNDLE_LINK_MODES,
        default="auto",
        help="How bundles take media from the run directory: hardlink, reflink, copy, or auto "
        "(the first that works).",
    )
    add(
        "--keep-rollout-checkpoints",
        type=int,
        default=None,
        help="Keep only the newest N rollout checkpoints (default: keep all).",
    )
    add(
        "--bundle-verify",
        choices=BUNDLE_VERIFY_MODES,
        default="fast",
        help="Verification when opening a bundle: none, fast (sizes), full (hashes).",
    )
    return parser


def validate_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the options in one pass; raise ``ValueError`` naming the option. Returns ``args``."""
    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731

    if g("shared_media_dir") is not None:
        path = os.path.abspath(os.fspath(args.shared_media_dir))
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"--shared-media-dir {path}: expected a directory, found a file")
        args.shared_media_dir = path
    # Every path the rollout side writes or reads is resolved now, on the driver: a Ray actor
    # may run in another working directory.
    for name in ("save", "load", "save_debug_rollout_data", "load_debug_rollout_data"):
        if g(name) is not None:
            setattr(args, name, os.path.abspath(os.fspath(getattr(args, name))))
    if g("run_uuid") is None:
        args.run_uuid = uuid.uuid4().hex
    check_run_id(args.run_uuid, option="--run-uuid")

    if g("fp16") and g("bf16"):
        raise ValueError("--fp16 and --bf16: choose at most one")

    ratio = g("load_debug_rollout_data_subsample")
    if ratio is not None:
        if not (0.0 < float(ratio) <= 1.0):
            raise ValueError(f"--load-debug-rollout-data-subsample: expected 0 < r <= 1, found {ratio}")
        if g("load_debug_rollout_data") is None:
            raise ValueError("--load-debug-rollout-data-subsample: requires --load-debug-rollout-data")

    for name in ("num_rollout", "rollout_batch_size", "save_interval", "update_weights_interval"):
        value = g(name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a positive integer, found {value}")
    if g("start_rollout_id") is not None and args.start_rollout_id < 0:
        raise ValueError(f"--start-rollout-id: expected >= 0, found {args.start_rollout_id}")

    keep = g("keep_rollout_checkpoints")
    if keep is not None and keep < 1:
        raise ValueError(
            f"--keep-rollout-checkpoints: expected at least 1 (the newest is needed to resume), found {keep}"
        )
    for name, choices in (("bundle_link_mode", BUNDLE_LINK_MODES), ("bundle_verify", BUNDLE_VERIFY_MODES)):
        value = g(name)
        if value is not None and value not in choices:
            raise ValueError(
                f"--{name.replace('_', '-')}: expected one of {', '.join(choices)}, found {value!r}"
            )

    if g("sglang_mm_process_config") is not None:
        args.sglang_mm_process_config = parse_mm_process_config(
            args.sglang_mm_process_config, where="--sglang-mm-process-config"
        )

    addrs = g("rollout_external_engine_addrs")
    for addr in addrs or ():
        m = _ADDR_RE.fullmatch(addr)
        if m is None or not 0 < int(m["port"]) < 65536:
            raise ValueError(f"--rollout-external-engine-addrs: expected HOST:PORT, found {addr!r}")

    args.rollout_processor_args = None
    if g("enable_token_space_processor"):
        # External engines run with server settings we never see, so agreement can't be checked.
        if addrs:
            raise ValueError(
                "--enable-token-space-processor cannot be used with --rollout-external-engine-addrs: "
                "the external engines' processor settings are unknown"
            )
        if g("custom_inference_engine_provider_path") is not None:
            raise ValueError(
                "--enable-token-space-processor cannot be used with --custom-inference-engine-provider-path: "
                f"the engines provided by {args.custom_inference_engine_provider_path!r} are external and "
                "their processor settings are unknown"
            )
        args.rollout_processor_args = RolloutEngineProcessorArgs.from_sglang_config(args)
    return args


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with a parser holding only :func:`add_arguments`' options, then validate."""
    parser = argparse.ArgumentParser(prog="trainer-hooks", allow_abbrev=False)
    add_arguments(parser)
    return validate_args(parser.parse_args(argv))
