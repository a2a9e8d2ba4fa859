"""What every ``rollout-bundle`` subcommand shares: registration, common options, errors.

A command module exposes ``register(subparsers)``, which calls :func:`add_command` once per
subcommand it owns. The entry point (:mod:`trainer_hooks.cli`, or :mod:`bundles.cli` for the
bundle commands alone) imports each package's register function by name and builds one parser
from them with :func:`build_parser`; :func:`run_command` then runs the chosen subcommand.

The habits every subcommand follows, enforced here rather than in each command:

- one error prefix, ``rollout-bundle CMD: error: ...`` (argparse's own usage errors already
  read that way), and no traceback for an expected failure: a :class:`BundleError`, an
  ``OSError`` on a path the user named, or a :class:`CommandError`;
- one exit-status rule (README.md, "Command line"): 0 on success; 1 for the bundle's problem
  (a BUNDLE, FILE or directory the command works on is missing, unreadable, corrupt or fails its
  check; verify's problems, replay's violations, diff's differences, an I/O error while working);
  2 for the caller's (bad usage or values, an INDEX out of range, a key path no sample has, an
  option's input that is unusable or made from another bundle, an output that exists without
  --force or cannot be written as named, a URL scheme that is not served, a refusal that needs a
  flag, a missing optional dependency). ``tests/test_cli_exit_codes.py`` holds every command to it;
- messages name the CLI's flags, not the API arguments the library's messages mention
  (``pass overwrite=True`` reads ``pass --force`` here);
- nothing read from a bundle, a directory listing or a store reaches the terminal raw: every
  error passes :func:`cli_message`, which shows it through :func:`bundles.support.display` (a
  name holding a newline cannot forge a line, an escape sequence cannot drive the terminal), and
  every command prints the names and texts it read through ``display`` too;
- ``--json`` on every command that reports, ``--progress/--no-progress`` (default: drawn only
  when stderr is a terminal) on every command that does long work.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bundles._errors import (
    BundleError,
    BundleExistsError,
    BundleVerificationError,
    UnsupportedLocationError,
    public_path,
)
from bundles._format.layout import FORMAT_VERSION
from bundles._format.limits import MAX_SHOWN_CHARS
from bundles._format.repr import display
from bundles._version import __version__

PROG = "rollout-bundle"

# Library messages name API arguments ("pass overwrite=True to replace it"); a person at a shell
# typed flags. Each advice is rewritten wherever it occurs in a message the command line prints.
API_TO_FLAG: tuple[tuple[str, str], ...] = (
    ("pass overwrite=True", "pass --force"),
    ("pass trust_pickle=True", "pass --trust-pickle"),
    ("pass missing_media='keep'", "pass --keep-missing-media"),
)

Handler = Callable[[argparse.Namespace], int]


class CommandError(Exception):
    """An expected failure a subcommand reports in one line; ``status`` 1 is the bundle's problem,
    2 the caller's (see the module docstring)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an int >= ``minimum`` (``--limit N``), refused naming what was given."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, found {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, found {n}")
        return n

    return parse


def check_output_file(flag: str, path: str | os.PathLike[str] | None, *, create_parent: bool = False) -> None:
    """Refuse, before any work is done, an output file the command could not write at the end:
    a directory, or (unless the command creates it) a parent directory that does not exist."""
    if path is None:
        return
    if os.path.isdir(path):
        raise CommandError(f"{flag} {os.fspath(path)}: is a directory; name the file to write", status=2)
    parent = os.path.dirname(os.path.abspath(path))
    if not create_parent and not os.path.isdir(parent):
        raise CommandError(f"{flag} {os.fspath(path)}: directory {parent} does not exist", status=2)


def version_text() -> str:
    return (
        f"{PROG} {__version__} (bundle format_version {FORMAT_VERSION}; Python {platform.python_version()})"
    )


def add_command(
    subparsers: Any,
    name: str,
    summary: str,
    handler: Handler,
    *,
    description: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """Add subcommand ``name``; ``summary`` is its one line in ``rollout-bundle --help``.

    ``description`` (default: the summary) opens ``rollout-bundle NAME --help``.
    """
    if not summary or "\n" in summary:
        raise ValueError(f"{name}: the summary must be one line")
    p = subparsers.add_parser(
        name,
        help=summary,
        description=description or summary[0].upper() + summary[1:] + ".",
        epilog=epilog,
    )
    p.set_defaults(func=handler, command=name)
    return p


def add_json_option(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON instead of text")


def add_progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw a progress line on stderr (default: only when stderr is a terminal)",
    )


class _SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an argument it does not know is its error, printed with its usage.

    argparse hands a subparser's unknown arguments back to the top-level parser, which then
    prints the top-level usage (``rollout-bundle [-h] [--version] COMMAND ...``) for a typo in
    ``ls --lnog``; here the subcommand refuses them itself (``usage: rollout-bundle ls ...``)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def build_parser(registrars: Iterable[Callable[[Any], None]], description: str) -> argparse.ArgumentParser:
    """One parser with the subcommands of every ``register(subparsers)`` in ``registrars``."""
    parser = argparse.ArgumentParser(prog=PROG, description=description)
    parser.add_argument("--version", action="version", version=version_text())
    subparsers = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_SubcommandParser
    )
    for register in registrars:
        register(subparsers)
    return parser


def cli_message(message: str) -> str:
    """``message`` as the command line prints it: API advice rewritten as flags, and shown through
    :func:`bundles.support.display` (one line, control characters and bidirectional overrides
    escaped, non-UTF-8 bytes and lone surrogates spelled out, at most ``MAX_SHOWN_CHARS``), since
    a message may name a path, key or meta value read from an untrusted bundle or listing."""
    for api, flag in API_TO_FLAG:
        message = message.replace(api, flag)
    return display(message, limit=MAX_SHOWN_CHARS)


def error(command: str, message: str) -> None:
    """Print ``rollout-bundle COMMAND: error: MESSAGE`` to stderr."""
    print(f"{PROG} {command}: error: {cli_message(message)}", file=sys.stderr)


def warn(command: str, message: str) -> None:
    """Print ``rollout-bundle COMMAND: MESSAGE`` to stderr (a problem the command survived)."""
    print(f"{PROG} {command}: {cli_message(message)}", file=sys.stderr)


def run_command(ns: argparse.Namespace) -> int:
    """Run the subcommand chosen in ``ns``; expected failures become one message and a status."""
    command = getattr(ns, "command", None) or "?"
    try:
        return int(ns.func(ns))
    except CommandError as e:
        error(command, str(e))
        return e.status
    except BundleVerificationError as e:
        error(command, f"{e.path}: {len(e.problems)} problem(s):")
        for p in e.problems:
            print(f"  - {cli_message(p)}", file=sys.stderr)
        return 1
    except (BundleExistsError, UnsupportedLocationError) as e:
        error(command, str(e))  # an output that exists (pass --force), a URL that is not served:
        return 2  # the caller's to change
    except BundleError as e:
        error(command, str(e))
        return 1
    except BrokenPipeError:  # `rollout-bundle show B | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:  # a path the user named: missing, not a directory, no permission, disk full
        error(command, _os_message(e))
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {command}: interrupted", file=sys.stderr)
        return 130


def _os_message(e: OSError) -> str:
    """``[Errno 2] No such file or directory: 'x'`` reads ``x: No such file or directory``."""
    if e.filename is not None and e.strerror:
        # Named as the user knows it, never by a staging or temporary name.
        where = str(public_path(e.filename))
        where += f" -> {public_path(e.filename2)}" if e.filename2 is not None else ""
        return f"{where}: {e.strerror}"
    return str(e)


def main_with(
    registrars: Iterable[Callable[[Any], None]], description: str, argv: Sequence[str] | None = None
) -> int:
    ns = build_parser(registrars, description).parse_args(argv)
    return run_command(ns)
