"""Command-line options, with Miles' names and definitions, and their validation in one pass.

Two kinds of options (listed in docs/TRAINER_HOOKS.md):

* This project's own (and the token-space engine build's): :data:`OWN_OPTIONS`, from one table,
  :data:`SETTINGS` (flag, argparse definition, the types a config file may give). Everything that
  reaches them is derived from it: the argparse options (:func:`add_arguments`, and
  :func:`add_own_arguments` for a parser that already has Miles' options, such as the one a custom
  generate function's ``add_arguments`` receives), the checks of values that were set on ``args``
  without argparse (:func:`check_settings`: Miles' ``--custom-config-path`` YAML), and the value
  checks both share (:func:`validate_settings`).
* Miles' (``--save``, ``--fp16``, ``--rollout-batch-size``, ``--sglang-*``, …):
  :data:`MILES_OPTIONS`, with Miles' type, default and choices (SGLang's for ``--sglang-*``).
  :func:`add_arguments` never adds them directly, because Miles calls its
  ``add_custom_arguments`` hook *before* defining its own options and argparse refuses an option
  defined twice; it arranges for the parser to add the ones still missing when it parses.
  :func:`parse_args` (no Miles) adds them all up front.
``validate_args`` raises ``ValueError`` naming the option (:func:`validate_settings` for ours, then
Miles' that we use); it normalizes some values in place
(``shared_media_dir``, ``save``, ``load`` and the debug-dump templates made absolute, because
Ray workers may run in another directory;
``sglang_mm_process_config`` parsed from JSON) and sets ``args.rollout_processor_args``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from bundles import LinkMode, UnsupportedLocationError, Verify, check_location
from bundles.support import bounded_repr, local_path_only
from trainer_hooks.arguments._miles_options import miles_options
from trainer_hooks.arguments._processor import RolloutEngineProcessorArgs, parse_mm_process_config
from trainer_hooks.run_media import check_run_id

__all__ = [
    "BUNDLE_LINK_MODES",
    "BUNDLE_VERIFY_MODES",
    "MAX_JOURNAL_INTERVAL_S",
    "MILES_OPTIONS",
    "OWN_OPTIONS",
    "SETTINGS",
    "Setting",
    "add_arguments",
    "add_miles_options",
    "add_own_arguments",
    "build_parser",
    "check_settings",
    "parse_args",
    "validate_args",
    "validate_settings",
]

# The choices of --bundle-link-mode / --bundle-verify: bundles' own vocabularies.
BUNDLE_LINK_MODES = LinkMode.values()
BUNDLE_VERIFY_MODES = Verify.values()
#: The longest ``--rollout-journal-interval``: a day. The interval bounds how much generation a
#: crash loses; a longer one journals in effect never (0 says that), and a timer that far off
#: overflows the journal writer's waits (``1e10`` s is past ``threading.TIMEOUT_MAX``).
MAX_JOURNAL_INTERVAL_S = 86400.0
_ADDR_RE = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]{1,5})")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    # argparse has no public way to ask which option strings exist.
    return set(parser._option_string_actions)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One of this project's options: its flag, its argparse definition, and what a value set on
    ``args`` without argparse (a ``--custom-config-path`` YAML key) may be."""

    flag: str
    kwargs: Mapping[str, Any]
    #: What the value may be when it did not come through argparse: ``"str"``, ``"int"``,
    #: ``"float"`` (an int too), ``"bool"``, ``"fields"`` (a comma-separated string or a list of
    #: strings); None is allowed where the default is None.
    kind: str

    @property
    def name(self) -> str:
        """The ``args`` attribute (argparse's dest), also the YAML key."""
        return self.flag[2:].replace("-", "_")

    @property
    def default(self) -> Any:
        return self.kwargs.get("default")


# Options that exist only here, or only in the token-space engine build: Miles never defines
# them, so they are safe to add in Miles' add_custom_arguments hook (which runs before Miles
# adds its own options, where any option Miles defines later would be a conflict). Every one of
# them that the Miles plugins read (trainer_hooks.miles, trainer_hooks.checkpoints, run media)
# is here: tests/test_miles_settings.py checks the source against this table.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "--shared-media-dir",
        dict(
            default=None,
            help="Shared filesystem directory for rollout media; each run writes under <dir>/<run uuid> "
            "and removes that directory at teardown.",
        ),
        "str",
    ),
    # None until validate_settings draws a uuid4: a default drawn here would be shared by every
    # parse in the process.
    Setting(
        "--run-uuid",
        dict(default=None, help="Name of this run's media directory (default: a new uuid4 hex)."),
        "str",
    ),
    Setting(
        "--bundle-link-mode",
        dict(
            choices=BUNDLE_LINK_MODES,
            default="auto",
            help="How bundles take media from the run directory: hardlink, reflink, copy, or auto "
            "(the first that works).",
        ),
        "str",
    ),
    Setting(
        "--keep-rollout-checkpoints",
        dict(type=int, default=None, help="Keep only the newest N rollout checkpoints (default: keep all)."),
        "int",
    ),
    Setting(
        "--bundle-verify",
        dict(
            choices=BUNDLE_VERIFY_MODES,
            default="fast",
            help="Verification when opening a bundle: none, fast (sizes), full (hashes).",
        ),
        "str",
    ),
    Setting(
        "--resume-verify-media",
        dict(
            action=argparse.BooleanOptionalAction,
            default=True,
            help="Hash every media file a resume places in the run directory (default: on). Hard "
            "links share inodes with the checkpoint, so an in-place edit would otherwise go unseen.",
        ),
        "bool",
    ),
    Setting(
        "--rollout-journal-interval",
        dict(
            type=float,
            default=1.0,
            metavar="SECONDS",
            help="Journal every graded sample beside the rollout checkpoints and fsync the journal at "
            "most this often, on a background thread (default 1.0; 0 disables the journal; at most 86400, "
            "a day). A crash then loses at most this much generation (docs/RESUME.md).",
        ),
        "float",
    ),
    Setting(
        "--resume-accept-changes",
        dict(
            default=None,
            metavar="FIELD[,FIELD]",
            help="Resume although the checkpoint's fingerprint differs in these fields (model_path, "
            "tokenizer, processor, training_dtype, n_samples_per_prompt, dataset); resume refuses any "
            "other difference.",
        ),
        "fields",
    ),
    # Miles skips SGLang's model_path (it uses --hf-checkpoint); the processor check reads it.
    Setting(
        "--sglang-model-path",
        dict(default=None, help="The engines' model path (default: --hf-checkpoint)."),
        "str",
    ),
    # The token-space engine build's trainer-side switch.
    Setting(
        "--enable-token-space-processor",
        dict(
            action="store_true",
            default=False,
            help="Process multimodal inputs in the trainer with the engines' processor; requires every "
            "engine group to share the processor settings (checked at parse time).",
        ),
        "bool",
    ),
)


def _own_options() -> list[tuple[str, dict[str, Any]]]:
    return [(st.flag, dict(st.kwargs)) for st in SETTINGS]


#: Options ``add_arguments`` adds at once; the others (:data:`MILES_OPTIONS`) only where absent at parse time.
OWN_OPTIONS = tuple(flag for flag, _ in _own_options())
#: Options Miles defines; never added by ``add_arguments`` before Miles has had its turn.
MILES_OPTIONS = tuple(flag for flag, _ in miles_options())

_DEFERRED_MARK = "_trainer_hooks_miles_options_deferred"


def _add_missing(
    parser: argparse.ArgumentParser, options: list[tuple[str, dict[str, Any]]], title: str
) -> argparse.ArgumentParser:
    """Add the ``options`` that ``parser`` lacks, in one argument group titled ``title`` (none
    when nothing is missing: calling it again is harmless); return the parser."""
    existing = _options(parser)
    missing = [(flag, kw) for flag, kw in options if flag not in existing]
    if missing:
        group = parser.add_argument_group(title)
        for flag, kw in missing:
            group.add_argument(flag, **kw)
    return parser


def add_miles_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add, with Miles' definitions, the Miles options ``parser`` does not define yet."""
    return _add_missing(
        parser, miles_options(), "Miles options used by trainer_hooks (as Miles defines them)"
    )


def add_own_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add this project's own options (:data:`SETTINGS`) that ``parser`` lacks; return it. Nothing
    else: for a parser that already has Miles' options (a custom generate function's
    ``add_arguments`` gets Miles' finished parser)."""
    return _add_missing(parser, _own_options(), "rollout bundles and run media")


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
    add_own_arguments(parser)
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


_KINDS: dict[str, str] = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "fields": "a comma-separated string or a list of strings",
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, (str, os.PathLike))
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "fields":
        return isinstance(value, str) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        )
    raise AssertionError(kind)


def check_settings(values: Mapping[str, Any], *, where: str) -> None:
    """Check the types of this project's settings among ``values`` (a namespace's ``vars`` or a
    config file's keys) that did not come through argparse; raise ``ValueError`` naming ``where``,
    the key, its option, what was expected and what was found. Keys that are not ours are left
    alone; :func:`validate_settings` checks the values themselves."""
    for st in SETTINGS:
        if st.name not in values:
            continue
        value = values[st.name]
        if value is None and st.default is None:
            continue
        if not _is_kind(value, st.kind):
            choices = st.kwargs.get("choices")
            expected = f"one of {', '.join(choices)}" if choices else _KINDS[st.kind]
            raise ValueError(
                f"{where}: {st.name} ({st.flag}): expected {expected}, found {bounded_repr(value)}"
            )


def _fields(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    return [f.strip() for v in items for f in str(v).split(",") if f.strip()]


def _seconds(value: Any) -> float:
    """``value`` as a float; NaN where it is none (a huge int, a string that is no number), so
    that every range check refuses it."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _names(names: list[str], shown: int = 5) -> str:
    """Names for a message: each cut to 40 characters, at most ``shown`` of them."""
    cut = [n if len(n) <= 40 else n[:37] + "..." for n in names[:shown]]
    return ", ".join(cut) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def validate_settings(
    args: argparse.Namespace, *, where: str | None = None, from_config: Collection[str] = ()
) -> argparse.Namespace:
    """Check this project's own settings on ``args`` (:data:`SETTINGS`), whichever way they were
    set, with the command line's messages; normalize ``shared_media_dir`` (``~`` expanded, then
    absolute; a URL is refused) and draw ``run_uuid`` when unset. Settings absent from ``args``
    are left absent (their readers use the table's defaults). Returns ``args``;
    :func:`validate_args` starts with it, and the Miles plugins call it (through
    :func:`trainer_hooks.miles.check_args`) on a stock Miles run's ``args``.

    A setting named in ``from_config`` (the keys of a config file) is named in a message as the
    file's key, ``<where>: <key> (<flag>)``, as :func:`check_settings` names it: the user wrote
    the key, not the flag. Every value a message shows is :func:`bundles.support.bounded_repr`'s."""
    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    keys = frozenset(from_config)

    def label(name: str) -> str:
        flag = "--" + name.replace("_", "-")
        return f"{where}: {name} ({flag})" if where is not None and name in keys else flag

    if g("shared_media_dir") is not None:
        args.shared_media_dir = _shared_media_dir(args.shared_media_dir, label("shared_media_dir"))
    if g("run_uuid") is None:
        args.run_uuid = uuid.uuid4().hex
    check_run_id(args.run_uuid, option=label("run_uuid"))
    _check_retention_and_journal(g, label)
    for name, choices in (("bundle_link_mode", BUNDLE_LINK_MODES), ("bundle_verify", BUNDLE_VERIFY_MODES)):
        value = g(name)
        if value is not None and value not in choices:
            raise ValueError(
                f"{label(name)}: expected one of {', '.join(choices)}, found {bounded_repr(value)}"
            )
    return args


def _shared_media_dir(raw: Any, label: str) -> str:
    """``--shared-media-dir`` as an absolute local directory path (``~`` expanded); ValueError
    naming ``label`` for a URL, a non-path, an unexpandable ``~`` or a file."""
    try:  # bundles' rule: a URL is never taken for a local path (s3://b/m is not ./s3:/b/m)
        local_path_only(raw, "the shared media directory")
    except UnsupportedLocationError as e:
        raise ValueError(f"{label}: {e}") from None
    if not isinstance(raw, (str, os.PathLike)):
        raise ValueError(f"{label}: expected a path, found {bounded_repr(raw)}")
    path = os.path.expanduser(os.fspath(raw))
    if path.startswith("~"):
        raise ValueError(
            f"{label} {bounded_repr(path)}: cannot expand '~' (no such user or no "
            "home directory); give an absolute path"
        )
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{label} {path}: expected a directory, found a file")
    return path


def _check_retention_and_journal(g: Callable[..., Any], label: Callable[[str], str]) -> None:
    """``--keep-rollout-checkpoints``, ``--rollout-journal-interval`` and
    ``--resume-accept-changes``, read through ``g`` (getattr on the args), named by ``label``."""
    keep = g("keep_rollout_checkpoints")
    if keep is not None and keep < 1:
        raise ValueError(
            f"{label('keep_rollout_checkpoints')}: expected at least 1 (the newest is needed to resume), "
            f"found {bounded_repr(keep)}"
        )
    interval = g("rollout_journal_interval")
    if interval is not None and not 0 <= _seconds(interval) <= MAX_JOURNAL_INTERVAL_S:
        raise ValueError(
            f"{label('rollout_journal_interval')}: expected seconds from 0 (disables the journal) to "
            f"{MAX_JOURNAL_INTERVAL_S:g} (a day), found {bounded_repr(interval)}"
        )
    accept = g("resume_accept_changes")
    if accept is not None:
        from trainer_hooks.checkpoints import FINGERPRINT_FIELDS

        unknown = [f for f in _fields(accept) if f not in FINGERPRINT_FIELDS]
        if unknown:
            raise ValueError(
                f"{label('resume_accept_changes')}: unknown field(s) {_names(unknown)}; expected some of "
                f"{', '.join(FINGERPRINT_FIELDS)}"
            )


def validate_args(args: argparse.Namespace) -> argparse.Namespace:
    """Check the options in one pass; raise ``ValueError`` naming the option. Returns ``args``."""
    validate_settings(args)
    _resolve_locations(args)
    if getattr(args, "fp16", None) and getattr(args, "bf16", None):
        raise ValueError("--fp16 and --bf16: choose at most one")
    _check_subsample(args)
    _check_counts(args)
    if getattr(args, "sglang_mm_process_config", None) is not None:
        args.sglang_mm_process_config = parse_mm_process_config(
            args.sglang_mm_process_config, where="--sglang-mm-process-config"
        )
    _check_engines(args)
    return args


def _resolve_locations(args: argparse.Namespace) -> None:
    """Every path the rollout side writes or reads, made absolute now, on the driver (a Ray actor
    may run in another working directory); a URL only where the option takes one."""
    for name in (
        "save",
        "load",
        "save_debug_rollout_data",
        "save_debug_trajectory_data",
        "load_debug_rollout_data",
    ):
        if getattr(args, name, None) is None:
            continue
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


def _check_subsample(args: argparse.Namespace) -> None:
    ratio = getattr(args, "load_debug_rollout_data_subsample", None)
    if ratio is None:
        return
    # 0 is what Miles accepts and means "keep everything" (its slice data[:0] + data[-0:]);
    # above 1 Miles' slices overlap and train rows twice, below 0 they cut the middle out.
    if not 0.0 <= _seconds(ratio) <= 1.0:
        raise ValueError(
            f"--load-debug-rollout-data-subsample: expected 0 <= r <= 1 (0 keeps every row, as in Miles), "
            f"found {bounded_repr(ratio)}"
        )
    if getattr(args, "load_debug_rollout_data", None) is None:
        raise ValueError("--load-debug-rollout-data-subsample: requires --load-debug-rollout-data")


def _check_counts(args: argparse.Namespace) -> None:
    for name in ("num_rollout", "rollout_batch_size", "save_interval", "update_weights_interval"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ValueError(
                f"--{name.replace('_', '-')}: expected a positive integer, found {bounded_repr(value)}"
            )
    start = getattr(args, "start_rollout_id", None)
    if start is not None and start < 0:
        raise ValueError(f"--start-rollout-id: expected >= 0, found {bounded_repr(start)}")


def _check_engines(args: argparse.Namespace) -> None:
    """The external engines' addresses, and the token-space processor where its settings can be
    known (``args.rollout_processor_args``: None unless enabled)."""
    addrs = getattr(args, "rollout_external_engine_addrs", None)
    for addr in addrs or ():
        m = _ADDR_RE.fullmatch(addr)
        if m is None or not 0 < int(m["port"]) < 65536:
            raise ValueError(
                f"--rollout-external-engine-addrs: expected HOST:PORT, found {bounded_repr(addr)}"
            )
    args.rollout_processor_args = None
    if not getattr(args, "enable_token_space_processor", None):
        return
    # External engines run with server settings we never see, so agreement can't be checked.
    if addrs:
        raise ValueError(
            "--enable-token-space-processor cannot be used with --rollout-external-engine-addrs: "
            "the external engines' processor settings are unknown"
        )
    if getattr(args, "custom_inference_engine_provider_path", None) is not None:
        raise ValueError(
            "--enable-token-space-processor cannot be used with --custom-inference-engine-provider-path: "
            f"the engines provided by {args.custom_inference_engine_provider_path!r} are external and "
            "their processor settings are unknown"
        )
    args.rollout_processor_args = RolloutEngineProcessorArgs.from_sglang_config(args)


def build_parser() -> argparse.ArgumentParser:
    """A parser with this project's options and the Miles options it uses (Miles' definitions)."""
    parser = argparse.ArgumentParser(prog="trainer-hooks", allow_abbrev=False)
    add_miles_options(parser)
    return add_arguments(parser)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with :func:`build_parser`, then validate. ``--rollout-batch-size`` is
    required, as in Miles."""
    return validate_args(build_parser().parse_args(argv))
