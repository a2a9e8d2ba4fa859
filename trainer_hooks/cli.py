"""The ``rollout-bundle`` command.

Each subcommand is registered where its code lives: every package that owns commands exports a
``register_commands(subparsers)`` from its face (``bundles.cli`` its ``register``), imported
here by name, and :func:`register_commands` calls them in the order ``rollout-bundle --help``
shows the commands. A new subcommand is a ``register`` in its package's command module, exported
from the package's face, and one line in :func:`register_commands`.

``inspect`` is ``bundles``' command composed, in one visible step (:func:`_register_bundle_commands`),
with the rollout journal's (:func:`trainer_hooks.journal.inspect_with_journal`): pointed at a
journal, or at a checkpoint beside one, it also shows the journal. ``bundles`` knows nothing of
journals; the journal adds no command of its own.

What every subcommand shares (the error prefix ``rollout-bundle CMD: error: ...``, exit statuses,
``--json``, ``--progress/--no-progress``, ``--version``) lives in :mod:`bundles._commands.common`.

Exit status: 0 on success, 1 for the bundle's problem (missing, unreadable, corrupt, or failing
the command's check), 2 for the caller's (usage, values, options, outputs); the rule in full is in
README.md's "Command line" and :mod:`bundles._commands.common`, and ``tests/test_cli_exit_codes.py`` runs
every subcommand against it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from bundles.cli import register as register_bundle_commands
from bundles.support import build_parser as _build_parser
from bundles.support import run_command
from trainer_hooks.dumps import register_commands as register_dump_commands
from trainer_hooks.journal import INSPECT_DESCRIPTION, inspect_with_journal
from trainer_hooks.replay import register_commands as register_replay_commands
from trainer_hooks.run_media import register_commands as register_run_media_commands
from trainer_hooks.serve import register_commands as register_serve_commands
from trainer_hooks.view import register_commands as register_view_commands

__all__ = ["build_parser", "main", "register_commands"]

DESCRIPTION = "Rollout bundles and run media: look into, check, pack and convert bundles; sweep run media."


def _register_bundle_commands(subparsers: Any) -> None:
    """``bundles``' commands, ``inspect`` composed with the journal's handler and description."""
    register_bundle_commands(subparsers)  # inspect, show, diff, verify, pack, unpack, gc, ls, cp, rm
    inspect = subparsers.choices["inspect"]
    inspect.set_defaults(func=inspect_with_journal(inspect.get_default("func")))
    inspect.description = (inspect.description or "") + INSPECT_DESCRIPTION


def register_commands(subparsers: Any) -> None:
    """Every ``rollout-bundle`` subcommand, in the order ``--help`` lists them."""
    _register_bundle_commands(subparsers)
    register_view_commands(subparsers)  # view BUNDLE -o report.html [--replay REPORT.json]
    register_run_media_commands(subparsers)  # sweep SHARED_MEDIA_DIR [--delete]
    register_dump_commands(subparsers)  # import-dump OLD.pt -o BUNDLE --trust-pickle
    register_replay_commands(subparsers)  # replay BUNDLE [--dtype] [--report] [--expect] [--ray]
    register_serve_commands(subparsers)  # serve ROOT [--port N] [--host H] [--follow]


def build_parser() -> argparse.ArgumentParser:
    return _build_parser([register_commands], DESCRIPTION)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
