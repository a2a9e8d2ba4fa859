"""Command-line options: Miles' own (kept as Miles defines them) and ours, and parse-time checks.

* :mod:`._options`: :func:`add_arguments` (usable as Miles' parser hook), :func:`parse_args`,
  :func:`validate_args`; the table of this project's settings :data:`SETTINGS` (whence
  :data:`OWN_OPTIONS`, :func:`add_own_arguments`, :func:`check_settings`,
  :func:`validate_settings`) and :data:`MILES_OPTIONS`.
* :mod:`._processor`: :class:`RolloutEngineProcessorArgs`, which resolves every engine group's
  image-processor settings and refuses groups that disagree, at launch.
"""

from trainer_hooks.arguments._options import (
    BUNDLE_LINK_MODES,
    BUNDLE_VERIFY_MODES,
    MILES_OPTIONS,
    OWN_OPTIONS,
    SETTINGS,
    Setting,
    add_arguments,
    add_miles_options,
    add_own_arguments,
    build_parser,
    check_settings,
    parse_args,
    validate_args,
    validate_settings,
)
from trainer_hooks.arguments._processor import (
    PROCESSOR_FIELDS,
    RolloutEngineProcessorArgs,
    load_sglang_config,
    parse_mm_process_config,
)

__all__ = [
    "BUNDLE_LINK_MODES",
    "BUNDLE_VERIFY_MODES",
    "MILES_OPTIONS",
    "OWN_OPTIONS",
    "PROCESSOR_FIELDS",
    "SETTINGS",
    "RolloutEngineProcessorArgs",
    "Setting",
    "add_arguments",
    "add_miles_options",
    "add_own_arguments",
    "build_parser",
    "check_settings",
    "load_sglang_config",
    "parse_args",
    "parse_mm_process_config",
    "validate_args",
    "validate_settings",
]
