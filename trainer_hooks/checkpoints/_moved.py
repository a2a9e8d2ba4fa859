"""Names that moved to another package and stay importable where they were (:pep:`562`).

A package whose names moved (``trainer_hooks.checkpoints``: the rollout state machines to
``trainer_hooks.rollout``, the journal to ``trainer_hooks.journal``) defines a module
``__getattr__`` that calls :func:`moved_name`: a moved name is looked up in its new home the
first time it is asked for, then kept in the old module's globals. The new homes import the old
package, so a plain ``from new import name`` in it would be a circle; looking a name up by its
module's name at first use keeps the import graph one way, and importing the old package costs
nothing of the new ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["moved_name"]


def moved_name(module: str, moved: Mapping[str, str], namespace: dict[str, Any], name: str) -> Any:
    """``name`` of ``module`` from the module ``moved[name]`` now holding it, stored in ``namespace``
    (the old module's globals) for the next time; :class:`AttributeError` for any other name."""
    home = moved.get(name)
    if home is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    namespace[name] = value
    return value
