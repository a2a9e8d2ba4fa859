"""What the bundle subcommands print: JSON, escaped lines, counts, locations as messages name them."""

from __future__ import annotations

import json
import sys
from typing import Any

from bundles._api.location import Location
from bundles._format.limits import MAX_SHOWN_CHARS
from bundles._format.repr import display

BUNDLE_HELP = "a bundle directory or a packed bundle file, local or on an object store (s3://bucket/prefix)"


def print_json(obj: Any) -> None:
    # ensure_ascii: a control character, a bidirectional override or a lone surrogate read from a
    # bundle is written as a \uXXXX escape, never raw.
    print(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True))


def say(line: str, *, file: Any = None) -> None:
    """Print one line of text output. A line names paths, keys and values read from a bundle or a
    listing: it goes through :func:`bundles.support.display` (one line, nothing raw)."""
    print(display(line, limit=MAX_SHOWN_CHARS), file=file or sys.stdout)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def location_shown(location: str) -> str:
    """A location as messages name it: a URL as given, a local path made absolute."""
    return str(Location.of(location))
