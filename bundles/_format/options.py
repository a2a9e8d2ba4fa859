"""The vocabularies of the API's option arguments, each defined once.

``verify`` levels and ``link`` modes are str-Enums: a member *is* its string (``Verify.FAST ==
"fast"``, ``json.dumps`` writes ``"fast"``, ``f"{mode}"`` reads ``fast``), so every caller that
passes the old strings keeps working, and code that wants a checked value gets one from
:meth:`parse`. Argument parsers (``trainer_hooks.arguments``) take their ``choices`` from here.
``outside_paths`` is a string or a callable choosing one per path: :data:`OutsidePolicy`.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TypeVar

__all__ = ["OUTSIDE_PATHS", "LinkMode", "OutsidePolicy", "Verify"]

_E = TypeVar("_E", bound="_Choice")


class _Choice(str, Enum):
    # A member formats as its value on every Python version (3.10's mixin Enum would print
    # "Verify.FAST"): messages and argparse show the string a user types.
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The accepted strings, in order (``choices`` of a command-line option)."""
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls: type[_E], value: object) -> _E | None:
        """The member named by ``value`` (a member or its string), or None for anything else."""
        if isinstance(value, cls):
            return value
        if type(value) is not str:
            return None
        try:
            return cls(value)
        except ValueError:
            return None


class Verify(_Choice):
    """How much :func:`bundles.open_bundle` checks before returning (docs/FORMAT.md §7)."""

    NONE = "none"  #: the manifest only
    FAST = "fast"  #: every listed file present with its size; shard digests
    FULL = "full"  #: also every media file re-hashed


class LinkMode(_Choice):
    """How a writer (and ``rehydrate``) places media files it ingests."""

    AUTO = "auto"  #: hardlink, else reflink, else copy; probed once per pair of filesystems
    HARDLINK = "hardlink"
    REFLINK = "reflink"
    COPY = "copy"


#: ``write_bundle``'s ``outside_paths`` choices for a path outside every media root.
OUTSIDE_PATHS = ("keep", "warn", "error")
#: ``outside_paths``: one of :data:`OUTSIDE_PATHS`, or a callable choosing one per path.
OutsidePolicy = str | Callable[[str], str]
