"""Miles' dashboard on dumps our hooks write: :class:`BundleDumpReader`, and a launcher.

    python -m trainer_hooks.miles.dashboard --dump-details DIR [--host ADDR] [Miles' dashboard options]

Miles' dashboard (``miles.dashboard``) reads ``<DIR>/rollout_data/<id>.pt`` with ``torch.load``.
Our hooks write a bundle there (a directory named ``<id>.pt``, or a packed file);
:class:`BundleDumpReader` is Miles' ``DumpReader`` whose file loader opens such a bundle
(:func:`trainer_hooks.dumps.dump_payload`, no pickle) and hands everything else (Miles' own
``train_data/*.pt`` shards, old ``.pt`` dumps) to Miles' loader. The rest is Miles' reader,
unchanged: discovery, the ``dashboard_columns`` parquet mirror (built lazily from the loaded
samples), joins with the train shards. The launcher runs Miles' ``miles.dashboard.serve`` with
this reader in place of its own, and differs from Miles' launcher in two more ways:

* it listens on ``127.0.0.1`` unless ``--host`` says otherwise (Miles' default, ``0.0.0.0``, would
  serve a run's prompts, responses and screenshots to the whole network); reach it over an SSH
  port-forward, or widen it explicitly with ``--host 0.0.0.0``;
* it checks the layout first: Miles' reader lists only ``DIR/rollout_data/<id>.pt`` (and
  ``eval_<id>.pt``) and shows an empty dashboard for anything else, so a directory in another
  layout is refused in one line saying what was expected and what was found (exit status 2).

Needs Miles' dashboard dependencies: ``pip install 'rollout-bundles[dashboard]'`` (polars,
fastapi, uvicorn) next to a Miles checkout; not Miles' rollout stack (no sglang). Run as
``python -m`` without them, the launcher says in one line what is missing and how to get it (exit
status 2, as every command does for a missing optional dependency); imported, the module raises
the ``ImportError``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from bundles import is_bundle
from trainer_hooks.dumps import dump_payload


def _missing(e: ImportError) -> str:
    """One line for a launcher that cannot import Miles' dashboard: what is missing, how to get it."""
    name = e.name or str(e)
    if name == "miles" or name.startswith("miles."):
        return (
            f"trainer_hooks.miles.dashboard: error: Miles is not importable ({e}): put a Miles checkout on "
            "PYTHONPATH (PYTHONPATH=/path/to/miles python -m trainer_hooks.miles.dashboard ...)"
        )
    return (
        f"trainer_hooks.miles.dashboard: error: Miles' dashboard needs {name!r}, which is not installed: "
        "pip install 'rollout-bundles[dashboard]'"
    )


try:
    from miles.dashboard.dump_reader import DumpReader
except ImportError as _e:
    if __name__ != "__main__":
        raise
    print(_missing(_e), file=sys.stderr)  # `python -m` without Miles: one line, not a traceback
    raise SystemExit(2) from None

__all__ = ["DEFAULT_HOST", "BundleDumpReader", "dump_layout_problem", "main", "miles_options_help"]

#: Where the launcher listens without ``--host``: this machine only.
DEFAULT_HOST = "127.0.0.1"
# The names Miles' DumpReader.rollout_ids lists under rollout_data/ (it parses the stem as an int).
_DUMP_NAME = re.compile(r"(eval_)?[0-9]+\.pt")
_SHOWN = 3  # names quoted in the layout error


class BundleDumpReader(DumpReader):
    """Miles' ``DumpReader`` that also reads debug dumps written as bundles."""

    def _torch_load(self, path: Path, *, mmap: bool = False) -> Any:
        if is_bundle(path):
            return dump_payload(path)
        return super()._torch_load(path, mmap=mmap)


def _bundles_under(root: Path, depth: int = 2) -> list[Path]:
    found: list[Path] = []
    try:
        children = sorted(root.iterdir())
    except OSError:
        return found
    for child in children:
        if is_bundle(child):
            found.append(child)
        elif depth > 1 and child.is_dir() and not child.is_symlink():
            found += _bundles_under(child, depth - 1)
    return found


def _quote(paths: list[Path], root: Path) -> str:
    names = [str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in paths[:_SHOWN]]
    more = f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else ""
    return ", ".join(names) + more


def dump_layout_problem(dump_dir: str | Path) -> str | None:
    """Why Miles' dashboard would show nothing of ``dump_dir``, in one line; None when it holds
    at least one ``rollout_data/<id>.pt`` (or ``eval_<id>.pt``), file or bundle."""
    root = Path(dump_dir)
    expected = f"--dump-details {root}: expected {root}/rollout_data/<id>.pt (the --dump-details layout"
    expected += ", as --save-debug-rollout-data DIR/rollout_data/{rollout_id}.pt writes it)"
    if not root.is_dir():
        return f"{expected}, found {'a file' if root.exists() else 'nothing'} at {root}"
    rollout_dir = root / "rollout_data"
    if rollout_dir.is_dir():
        entries = sorted(rollout_dir.iterdir())
        if any(_DUMP_NAME.fullmatch(p.name) for p in entries):
            return None
        if entries:
            return f"{expected}, found rollout_data/ holding only {_quote(entries, root)}"
        return f"{expected}, found an empty rollout_data/"
    bundles = _bundles_under(root)
    if bundles:
        return f"{expected}, found no rollout_data/ but {len(bundles)} bundle(s) in another layout: {_quote(bundles, root)}"
    entries = sorted(root.iterdir())
    if entries:
        return f"{expected}, found no rollout_data/, only {_quote(entries, root)}"
    return f"{expected}, found an empty directory"


PROG = "python -m trainer_hooks.miles.dashboard"
DESCRIPTION = f"""\
Miles' dashboard (miles.dashboard.serve) on a --dump-details directory whose
rollout_data/<id>.pt dumps are bundles, as a Miles fork's
trainer_hooks.save_debug_rollout_data writes them with
--save-debug-rollout-data DIR/rollout_data/{{rollout_id}}.pt (docs/INTEGRATION.md
section 9). Miles' own .pt pickles and train_data/ shards load as before.

Unlike Miles' launcher it listens on {DEFAULT_HOST} unless --host is given (Miles'
default 0.0.0.0 would serve the run's prompts, responses and screenshots to the
network): reach it with `ssh -L 7788:{DEFAULT_HOST}:7788 NODE`, or widen it on
purpose with --host 0.0.0.0. A directory without rollout_data/<id>.pt exits with
status 2 and one line saying what it found (`rollout-bundle view` opens any
bundle). Needs a Miles checkout on PYTHONPATH and
pip install 'rollout-bundles[dashboard]'."""
# Miles' options the launcher documents itself (it decides them, or reads them first).
_OWN = ("-h", "--help", "--dump-details", "--host")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} --dump-details DIR [--host ADDR] [Miles' dashboard options]",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        allow_abbrev=False,
    )
    own = parser.add_argument_group("options of this launcher")
    own.add_argument("-h", "--help", action="store_true", help="show this help message and exit")
    own.add_argument("--dump-details", metavar="DIR", help="the run's --dump-details directory")
    own.add_argument(
        "--host", metavar="ADDR", help=f"address to listen on (default: {DEFAULT_HOST}, this machine only)"
    )
    own.add_argument("--demo", action="store_true", help=argparse.SUPPRESS)
    return parser


def miles_options_help() -> str:
    """The options section of Miles' own launcher's help, without the options this launcher
    documents itself: ``--port``, ``--follow``, ... exactly as the Miles checkout defines them."""
    import contextlib
    import io

    import miles.dashboard.serve as serve

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        serve.main(["--help"])
    lines = out.getvalue().splitlines()
    start = next(
        (i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(":") and "option" in line), None
    )
    entries: list[list[str]] = []
    for line in lines[start or len(lines) :]:
        if line.startswith("  -"):
            entries.append([line])
        elif line.startswith("   ") and entries:
            entries[-1].append(line)
    kept = [
        e for e in entries if not any(flag in _OWN for flag in re.findall(r"(?<![\w-])-{1,2}[\w-]+", e[0]))
    ]
    return "\n".join(line for e in kept for line in e)


def _print_help(parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    try:
        miles = miles_options_help()
    except ImportError as e:
        miles = f"  (not available here: {e}; put a Miles checkout on PYTHONPATH)"
    print(
        f"{text.rstrip()}\n\nMiles' dashboard options (passed to miles.dashboard.serve unchanged):\n{miles}"
    )


def main(argv: list[str] | None = None) -> None:
    """Run Miles' dashboard server with :class:`BundleDumpReader`, on ``127.0.0.1`` unless
    ``--host`` is given; exit 2 with one line when the directory is not in the dump layout."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only what the launcher decides before Miles' parser sees the rest (which stays Miles').
    pre = _parser()
    known, _ = pre.parse_known_args(argv)
    if known.help:
        _print_help(pre)
        raise SystemExit(0)
    if known.dump_details is not None and not known.demo:
        problem = dump_layout_problem(known.dump_details)
        if problem is not None:
            print(f"trainer_hooks.miles.dashboard: {problem}", file=sys.stderr)
            raise SystemExit(2)
    if known.host is None:
        argv = ["--host", DEFAULT_HOST, *argv]

    import miles.dashboard.serve as serve

    serve.DumpReader = BundleDumpReader  # the reader is the one thing that differs inside Miles' launcher
    serve.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
