"""Names that moved to :mod:`bundles.support`, kept for one release as aliases that warn.

A module whose names moved defines ``__getattr__`` (PEP 562: called only for a name the module
does not have) as ``return moved_to_support(<its name>, <the moved names>, name)``: a moved name
warns (``DeprecationWarning``, pointing at the caller's line) and resolves to the support one;
any other name is the usual ``AttributeError``.
"""

from __future__ import annotations

import warnings
from collections.abc import Set

__all__ = ["moved_to_support"]


def moved_to_support(module: str, moved: Set[str], name: str) -> object:
    if name in moved:
        from bundles import support  # only when asked for: importing it is the cost of a warning

        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release: "
            f"use bundles.support.{name}",
            DeprecationWarning,
            stacklevel=3,  # past this function and the module's __getattr__: the caller
        )
        return getattr(support, name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
