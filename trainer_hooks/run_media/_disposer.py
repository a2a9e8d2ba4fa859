"""Teardown in a fixed order: :class:`RunDisposer`.

A training driver acquires things in an order (run media lease, rollout executor, trainers,
…) and must give them back in the reverse order, all of them, even when one of the steps
fails: a trainer that raises on close must not leave the rollout engines running or the run's
media on the shared filesystem. That is :class:`contextlib.ExitStack`'s contract; this class
keeps it and adds what drivers need on top:

* every callback has a name, and :attr:`RunDisposer.history` records the names in the order
  they ran, so tests (and logs) can check that ``release_run_media`` ran last;
* errors are not chained into each other. If the ``with`` body raised, that error propagates
  (it is the cause; teardown errors are logged and added to it as notes). Otherwise the first
  teardown error is raised after every callback ran, with the later ones added as notes and
  kept in its ``teardown_errors`` attribute. ``KeyboardInterrupt`` during teardown does not
  skip the remaining callbacks either.

Drivers register ``release_run_media`` first, so it runs last: after the trainers, the rollout
executor and any pending bundle writes are gone, since each of them may still read the media.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["RunDisposer"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(text)
    else:  # pragma: no cover - Python 3.10 keeps the notes, without printing them
        exc.__notes__ = [*getattr(exc, "__notes__", []), text]  # type: ignore[attr-defined]


class RunDisposer:
    """Callbacks run in reverse order of registration; all of them run even when some raise.

    Example:
        >>> with RunDisposer() as disposer:            # doctest: +SKIP
        ...     disposer.callback(release_run_media, args)
        ...     executor = disposer.enter_context(make_executor(args))
        ...     train_loop(executor)
    """

    def __init__(self) -> None:
        self._callbacks: list[tuple[str, Callable[[], Any]]] = []
        self._closed = False
        self.history: list[str] = []
        self.errors: list[tuple[str, BaseException]] = []

    @property
    def names(self) -> list[str]:
        """Names of the callbacks still to run, in registration order."""
        return [name for name, _ in self._callbacks]

    def callback(self, fn: Callable[..., Any], /, *args: Any, name: str | None = None, **kwargs: Any) -> None:
        """Register ``fn(*args, **kwargs)`` to run at close (before everything registered earlier)."""
        if self._closed:
            raise RuntimeError(f"RunDisposer: cannot register {name or _name_of(fn)!r} after close()")
        self._callbacks.append((name or _name_of(fn), lambda: fn(*args, **kwargs)))

    def enter_context(self, cm: AbstractContextManager[T], *, name: str | None = None) -> T:
        """Enter ``cm`` now and register its exit (called with no exception info)."""
        value = cm.__enter__()
        self.callback(cm.__exit__, None, None, None, name=name or f"{type(cm).__name__}.__exit__")
        return value

    def close(self) -> None:
        """Run every callback, newest first; raise the first error after all have run."""
        first = self._run_all()
        if first is not None:
            raise first

    def _run_all(self) -> BaseException | None:
        if self._closed:
            return None
        self._closed = True
        while self._callbacks:
            name, fn = self._callbacks.pop()
            self.history.append(name)
            try:
                fn()
            except BaseException as e:
                logger.error("teardown step %r failed: %s: %s", name, type(e).__name__, e)
                self.errors.append((name, e))
        if not self.errors:
            return None
        first_name, first = self.errors[0]
        _note(first, f"raised by teardown step {first_name!r}")
        for later_name, later in self.errors[1:]:
            _note(first, f"teardown step {later_name!r} also failed: {type(later).__name__}: {later}")
        first.teardown_errors = [later for _, later in self.errors[1:]]  # type: ignore[attr-defined]
        return first

    def __enter__(self) -> RunDisposer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        first = self._run_all()
        if first is None:
            return
        if exc is None:
            raise first
        # The body's error is the cause of the failure; teardown errors ride along as notes.
        for name, err in self.errors:
            _note(exc, f"during teardown, step {name!r} failed: {type(err).__name__}: {err}")


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
