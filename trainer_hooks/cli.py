"""The ``rollout-bundle`` command.

Each subcommand lives in a command module that exposes ``register(subparsers)``;
:data:`COMMAND_MODULES` lists them in the order ``rollout-bundle --help`` shows them. A new
subcommand is one new module and one line here. What every subcommand shares (the error prefix
``rollout-bundle CMD: error: ...``, exit statuses, ``--json``, ``--progress/--no-progress``,
``--version``) lives in :mod:`bundles._cli`.

Exit status: 0 on success, 1 for the bundle's problem (missing, unreadable, corrupt, or failing
the command's check), 2 for the caller's (usage, values, options, outputs); the rule in full is in
README.md's "Command line" and :mod:`bundles._cli`, and ``tests/test_cli_exit_codes.py`` runs
every subcommand against it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from bundles.support import build_parser as _build_parser
from bundles.support import run_command

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

COMMAND_MODULES: tuple[str, ...] = (
    "bundles.cli",  # inspect, show, diff, verify, pack, unpack, gc, ls, cp, rm
    "trainer_hooks.journal._cli",  # inspect also shows a rollout journal (no new command)
    "trainer_hooks.view._cli",  # view BUNDLE -o report.html [--replay REPORT.json]
    "trainer_hooks.run_media._sweep_cli",  # sweep SHARED_MEDIA_DIR [--delete]
    "trainer_hooks.dumps._legacy",  # import-dump OLD.pt -o BUNDLE --trust-pickle
    "trainer_hooks.replay._cli",  # replay BUNDLE [--dtype] [--report] [--expect] [--ray]
    "trainer_hooks.serve._cli",  # serve ROOT [--port N] [--host H] [--follow]
)

DESCRIPTION = "Rollout bundles and run media: look into, check, pack and convert bundles; sweep run media."


def build_parser() -> argparse.ArgumentParser:
    return _build_parser([importlib.import_module(name).register for name in COMMAND_MODULES], DESCRIPTION)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
