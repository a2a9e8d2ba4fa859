"""The bundle subcommands of ``rollout-bundle``: inspect, show, diff, verify, pack, unpack, ls, cp,
rm, gc and export.

:func:`register` adds them to a ``rollout-bundle`` parser (see :mod:`bundles.support` for the
CLI kit every subcommand shares); the ``rollout-bundle`` entry point (:mod:`trainer_hooks.cli`) adds the
training-side commands beside them. ``python -m bundles.cli`` runs the bundle commands alone.
"""

from __future__ import annotations

import sys
from typing import Any

from bundles._commands import common, copying, exporting, listing, packing, reading, removing

__all__ = ["main", "register"]

# The CLI kit (and Progress) used to be exported from here; they moved to bundles.support, the
# module for tools built on bundles. Kept for one release as aliases that warn.
_MOVED_TO_SUPPORT = frozenset(
    {
        "CommandError",
        "Progress",
        "add_command",
        "add_json_option",
        "add_progress_option",
        "build_parser",
        "check_output_file",
        "cli_message",
        "int_at_least",
        "main_with",
        "run_command",
    }
)


def __getattr__(name: str) -> object:
    from bundles._deprecated import moved_to_support
    from bundles._local.progress import Progress

    found = {n: Progress if n == "Progress" else getattr(common, n) for n in _MOVED_TO_SUPPORT}
    return moved_to_support("bundles.cli", found, name)


def register(subparsers: Any) -> None:
    """Add the bundle subcommands (inspect, show, diff, verify, pack, unpack, ls, cp, rm, gc, export) to a
    ``rollout-bundle`` parser."""
    reading.register(subparsers)
    packing.register(subparsers)
    listing.register(subparsers)
    copying.register(subparsers)
    removing.register(subparsers)
    exporting.register(subparsers)


def main(argv: list[str] | None = None) -> int:
    """A bundles-only entry point (``python -m bundles.cli``); ``rollout-bundle`` adds more."""
    return common.main_with(
        [register], "Self-contained, verifiable bundles of rollout samples and their media.", argv
    )


if __name__ == "__main__":
    sys.exit(main())
