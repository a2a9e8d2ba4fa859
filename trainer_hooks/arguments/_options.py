"""Command-line options, with Miles' names and definitions, and their validation in one pass.

Two kinds of options (listed in docs/TRAINER_HOOKS.md):

* This project's own (and the token-space engine build's): :data:`OWN_OPTIONS`.
  :func:`add_arguments` adds them to any parser that lacks them.
* Miles' (``--save``, ``--fp16``, ``--rollout-batch-size``, ``--sglang-*``, …):
  :data:`MILES_OPTIONS`, with Miles' type, default and choices (SGLang's for ``--sglang-*``).
  :func:`add_arguments` never adds them directly, because Miles calls its
  ``add_custom_arguments`` hook *before* defining its own options and argparse refuses an option
  defined twice; it arranges for the parser to add the ones still missing when it parses.
  :func:`parse_args` (no Miles) adds them all up front.
``validate_args`` raises ``ValueError`` naming the option; it normalizes some values in place
(``shared_media_dir``, ``save``, ``load`` and the debug-dump templates made absolute, because
Ray workers may run in another directory;
``sglang_mm_process_config`` parsed from JSON) and sets ``args.rollout_processor_args``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import uuid
from collections.abc import Sequence
from typing import Any

from bundles import LinkMode, UnsupportedLocationError, Verify, check_location
from trainer_hooks.arguments._processor import RolloutEngineProcessorArgs, parse_mm_process_config
from trainer_hooks.run_media import check_run_id

__all__ = [
    "BUNDLE_LINK_MODES",
    "BUNDLE_VERIFY_MODES",
    "MILES_OPTIONS",
    "OWN_OPTIONS",
    "add_arguments",
    "add_miles_options",
    "build_parser",
    "parse_args",
    "validate_args",
]

# The choices of --bundle-link-mode / --bundle-verify: bundles' own vocabularies.
BUNDLE_LINK_MODES = LinkMode.values()
BUNDLE_VERIFY_MODES = Verify.values()
_ADDR_RE = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]{1,5})")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    # argparse has no public way to ask which option strings exist.
    return set(parser._option_string_actions)


# Options that exist only here, or only in the token-space engine build: Miles never defines
# them, so they are safe to add in Miles' add_custom_arguments hook (which runs before Miles
# adds its own options, where any option Miles defines later would be a conflict).
def _own_options() -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            "--shared-media-dir",
            dict(
                default=None,
                help="Shared filesystem directory for rollout media; each run writes under <dir>/<run uuid> "
                "and removes that directory at teardown.",
            ),
        ),
        # None until validate_args draws a uuid4: a default drawn here would be shared by every
        # parse in the process.
        (
            "--run-uuid",
            dict(default=None, help="Name of this run's media directory (default: a new uuid4 hex)."),
        ),
        (
            "--bundle-link-mode",
            dict(
                choices=BUNDLE_LINK_MODES,
                default="auto",
                help="How bundles take media from the run directory: hardlink, reflink, copy, or auto "
                "(the first that works).",
            ),
        ),
        (
            "--keep-rollout-checkpoints",
            dict(
                type=int, default=None, help="Keep only the newest N rollout checkpoints (default: keep all)."
            ),
        ),
        (
            "--bundle-verify",
            dict(
                choices=BUNDLE_VERIFY_MODES,
                default="fast",
                help="Verification when opening a bundle: none, fast (sizes), full (hashes).",
            ),
        ),
        (
            "--resume-verify-media",
            dict(
                action=argparse.BooleanOptionalAction,
                default=True,
                help="Hash every media file a resume places in the run directory (default: on). Hard "
                "links share inodes with the checkpoint, so an in-place edit would otherwise go unseen.",
            ),
        ),
        (
            "--rollout-journal-interval",
            dict(
                type=float,
                default=1.0,
                metavar="SECONDS",
                help="Journal every graded sample beside the rollout checkpoints and fsync the journal at "
                "most this often, on a background thread (default 1.0; 0 disables the journal). A crash then "
                "loses at most this much generation (docs/RESUME.md).",
            ),
        ),
        (
            "--resume-accept-changes",
            dict(
                default=None,
                metavar="FIELD[,FIELD]",
                help="Resume although the checkpoint's fingerprint differs in these fields (model_path, "
                "tokenizer, processor, training_dtype, n_samples_per_prompt, dataset); resume refuses any "
                "other difference.",
            ),
        ),
        # Miles skips SGLang's model_path (it uses --hf-checkpoint); the processor check reads it.
        (
            "--sglang-model-path",
            dict(default=None, help="The engines' model path (default: --hf-checkpoint)."),
        ),
        # The token-space engine build's trainer-side switch.
        (
            "--enable-token-space-processor",
            dict(
                action="store_true",
                default=False,
                help="Process multimodal inputs in the trainer with the engines' processor; requires every "
                "engine group to share the processor settings (checked at parse time).",
            ),
        ),
    ]


# Options Miles defines (itself, through its training backend, or from SGLang's ServerArgs), with
# Miles' type, default and choices. They are added only where the parser lacks them, at parse time.
def _miles_options() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("--save", dict(type=str, default=None, help="Checkpoint directory.")),
        ("--load", dict(type=str, default=None, help="Checkpoint directory to resume from.")),
        (
            "--save-debug-rollout-data",
            dict(
                type=str,
                default=None,
                help="Path template with {rollout_id} for dumping each rollout's samples.",
            ),
        ),
        (
            "--save-debug-trajectory-data",
            dict(
                type=str,
                default=None,
                help="Path template with {rollout_id} for each rollout's trajectory JSONL (samples with "
                "metadata['messages']).",
            ),
        ),
        (
            "--load-debug-rollout-data",
            dict(
                type=str,
                default=None,
                help="Path template with {rollout_id} to replay dumped samples instead of running engines.",
            ),
        ),
        (
            "--load-debug-rollout-data-subsample",
            dict(type=float, default=None, help="Keep this fraction (0 < r <= 1) of the replayed samples."),
        ),
        # Miles' FSDP backend defines --fp16 as a BooleanOptionalAction; Megatron's --bf16 is a flag.
        ("--fp16", dict(action=argparse.BooleanOptionalAction, default=False)),
        ("--bf16", dict(action="store_true", default=False)),
        (
            "--num-rollout",
            dict(type=int, default=None, help="Number of rollout steps (the reference drivers need it)."),
        ),
        ("--start-rollout-id", dict(type=int, default=None, help="The first rollout step (default 0).")),
        ("--rollout-batch-size", dict(type=int, required=True, help="Prompt groups per rollout step.")),
        ("--save-interval", dict(type=int, default=None, help="Save a checkpoint every N rollout steps.")),
        ("--update-weights-interval", dict(type=int, default=1)),
        (
            "--sglang-config",
            dict(
                type=str,
                default=None,
                help="YAML: sglang: [{name, model_path, server_groups: [{worker_type, num_gpus, overrides: {...}}]}].",
            ),
        ),
        # SGLang's ServerArgs definitions (0.5.23: arg_groups/fields/mm.py), as Miles exposes them.
        (
            "--sglang-image-processor-backend",
            dict(type=str, choices=["auto", "torchvision", "pil"], default="auto"),
        ),
        ("--sglang-mm-process-config", dict(type=json.loads, default=None, help="JSON object.")),
        ("--rollout-external-engine-addrs", dict(type=str, nargs="+", default=None, metavar="HOST:PORT")),
        ("--custom-inference-engine-provider-path", dict(type=str, default=None)),
        ("--recompute-logprobs-via-prefill", dict(action="store_true", default=False)),
        (
            "--reward-key",
            dict(type=str, default=None, help="Key of the reward value when rewards are dicts."),
        ),
    ]


#: Options ``add_arguments`` adds at once; the others (:data:`MILES_OPTIONS`) only where absent at parse time.
OWN_OPTIONS = tuple(flag for flag, _ in _own_options())
#: Options Miles defines; never added by ``add_arguments`` before Miles has had its turn.
MILES_OPTIONS = tuple(flag for flag, _ in _miles_options())

_DEFERRED_MARK = "_trainer_hooks_miles_options_deferred"


def add_miles_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add, with Miles' definitions, the Miles options ``parser`` does not define yet."""
    existing = _options(parser)
    missing = [(flag, kw) for flag, kw in _miles_options() if flag not in existing]
    if missing:
        group = parser.add_argument_group("Miles options used by trainer_hooks (as Miles defines them)")
        for flag, kw in missing:
            group.add_argument(flag, **kw)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add this project's options to ``parser``; return it. Works as Miles'
    ``parse_args(add_custom_arguments=add_arguments)`` hook and on a finished Miles parser.

    * Options only this project (or the token-space engine build) defines are added now, unless
      the parser already has them: calling it twice, or once as each hook, is harmless.
    * Options Miles defines (``--save``, ``--fp16``, ``--rollout-batch-size``, the
      ``--sglang-*`` ones, …) are never added now: Miles calls ``add_custom_arguments`` *before*
      adding its own options, and argparse refuses an option defined twice. They are added, with
      Miles' type, default and choices, when the parser parses and still lacks them (a parser
      that is not Miles').
    """
    existing = _options(parser)
    own = [(flag, kw) for flag, kw in _own_options() if flag not in existing]
    if own:
        group = parser.add_argument_group("rollout bundles and run media")
        for flag, kw in own:
            group.add_argument(flag, **kw)
    if not getattr(parser, _DEFERRED_MARK, False):
        parse_known_args = parser.parse_known_args

        def parse_known_args_with_miles_options(*a: Any, **kw: Any) -> Any:
            add_miles_options(parser)
            return parse_known_args(*a, **kw)

        # parse_args and parse_known_args both go through the instance's parse_known_args.
        setattr(parser, "parse_known_args", parse_known_args_with_miles_options)  # noqa: B010
        setattr(parser, _DEFERRED_MARK, True)
    return parser


# The options that may name an object-store URL: checkpoints and debug dumps are written to and
# read from a store (README "On an object store"); the trajectory sidecar stays local.
_STORE_OPTIONS: frozenset[str] = frozenset(
    {"save", "load", "save_debug_rollout_data", "load_debug_rollout_data"}
)


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
    for name in (
        "save",
        "load",
        "save_debug_rollout_data",
        "save_debug_trajectory_data",
        "load_debug_rollout_data",
    ):
        if g(name) is not None:
            option = "--" + name.replace("_", "-")
            try:
                remote = check_location(getattr(args, name), option)
            except UnsupportedLocationError as e:
                raise ValueError(str(e)) from None
            if remote:
                if name not in _STORE_OPTIONS:
                    raise ValueError(
                        f"{option} {getattr(args, name)}: an object-store URL is not supported for this option; "
                        "give a local path"
                    )
                continue  # a URL is absolute already
            setattr(args, name, os.path.abspath(os.fspath(getattr(args, name))))
    if g("run_uuid") is None:
        args.run_uuid = uuid.uuid4().hex
    check_run_id(args.run_uuid, option="--run-uuid")

    if g("fp16") and g("bf16"):
        raise ValueError("--fp16 and --bf16: choose at most one")

    ratio = g("load_debug_rollout_data_subsample")
    if ratio is not None:
        # 0 is what Miles accepts and means "keep everything" (its slice data[:0] + data[-0:]);
        # above 1 Miles' slices overlap and train rows twice, below 0 they cut the middle out.
        if not (0.0 <= float(ratio) <= 1.0):
            raise ValueError(
                f"--load-debug-rollout-data-subsample: expected 0 <= r <= 1 (0 keeps every row, as in Miles), "
                f"found {ratio}"
            )
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
    interval = g("rollout_journal_interval")
    if interval is not None and not (float(interval) >= 0 and float(interval) != float("inf")):
        raise ValueError(f"--rollout-journal-interval: expected seconds >= 0 (0 disables), found {interval}")
    if g("resume_accept_changes") is not None:
        from trainer_hooks.checkpoints import FINGERPRINT_FIELDS

        fields = [f.strip() for f in str(args.resume_accept_changes).split(",") if f.strip()]
        unknown = [f for f in fields if f not in FINGERPRINT_FIELDS]
        if unknown:
            raise ValueError(
                f"--resume-accept-changes: unknown field(s) {', '.join(unknown)}; expected some of "
                f"{', '.join(FINGERPRINT_FIELDS)}"
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


def build_parser() -> argparse.ArgumentParser:
    """A parser with this project's options and the Miles options it uses (Miles' definitions)."""
    parser = argparse.ArgumentParser(prog="trainer-hooks", allow_abbrev=False)
    add_miles_options(parser)
    return add_arguments(parser)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with :func:`build_parser`, then validate. ``--rollout-batch-size`` is
    required, as in Miles."""
    return validate_args(build_parser().parse_args(argv))
