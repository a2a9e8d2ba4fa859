"""Names that moved to :mod:`bundles.support`, kept for one release as aliases that warn.

A module whose names moved defines ``__getattr__`` (PEP 562: called only for a name the module
does not have) as ``return moved_to_support(<its name>, <the moved names and their objects>, name)``:
a moved name warns (``DeprecationWarning``, pointing at the caller's line) and resolves to the
object :mod:`bundles.support` also exports; any other name is the usual ``AttributeError``. The
caller hands the objects over, so that this leaf imports nothing of the package (``support``
imports the modules that use it).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

__all__ = ["moved_to_support"]


def moved_to_support(module: str, moved: Mapping[str, object], name: str) -> object:
    if name in moved:
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release: "
            f"use bundles.support.{name}",
            DeprecationWarning,
            stacklevel=3,  # past this function and the module's __getattr__: the caller
        )
        return moved[name]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
