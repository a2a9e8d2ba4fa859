"""A deterministic symlink swap in the middle of a tree deletion (issue 8, defect 1).

An attacker who can write inside a run directory waits until the deleter has listed a
subdirectory, then replaces that subdirectory with a symlink to a directory outside the shared
root holding files of the same names. A deleter that unlinks ``<run>/<sub>/<name>`` by full path
then deletes the outside files. :func:`swap_after_listing` performs that swap at exactly that
moment, every time: it wraps ``os.scandir`` (the listing itself stays real) and, right after
the listing of ``sub`` it was armed for, renames ``sub`` away and puts the symlink in its place.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def make_victim(outside: Path, names: list[str]) -> dict[str, bytes]:
    """A directory outside the shared root full of files; returns their contents by name."""
    outside.mkdir(parents=True)
    content = {}
    for name in names:
        data = f"precious {name}".encode()
        (outside / name).write_bytes(data)
        content[name] = data
    (outside / "deeper").mkdir()
    (outside / "deeper" / "also-precious").write_bytes(b"deep")
    return content


def victim_intact(outside: Path, content: dict[str, bytes]) -> list[str]:
    """Names of outside files that were deleted or changed (empty when intact)."""
    lost = [
        name
        for name, data in content.items()
        if not (outside / name).is_file() or (outside / name).read_bytes() != data
    ]
    if not (outside / "deeper" / "also-precious").is_file():
        lost.append("deeper/also-precious")
    return lost


class _Listed:
    """What ``os.scandir`` returns, from a list made before the swap."""

    def __init__(self, entries: list[os.DirEntry[Any]]) -> None:
        self._it = iter(entries)

    def __iter__(self) -> _Listed:
        return self

    def __next__(self) -> os.DirEntry[Any]:
        return next(self._it)

    def __enter__(self) -> _Listed:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def close(self) -> None:
        return None


@contextmanager
def swap_after_listing(
    monkeypatch: pytest.MonkeyPatch,
    sub: Path,
    outside: Path,
    parking: Path,
    *,
    trigger: Path | None = None,
    skip: int = 0,
) -> Iterator[dict[str, int]]:
    """Swap directory ``sub`` for a symlink to ``outside`` right after the ``skip + 1``-th listing
    of ``trigger`` (default: ``sub`` itself; ``skip`` lets listings made before the deletion, such
    as sweep's size walk, pass). The real directory is moved to ``parking``. Yields counters:
    ``listings`` of ``trigger`` and ``swapped``."""
    real_scandir = os.scandir
    st = os.lstat(trigger or sub)
    ident = (st.st_dev, st.st_ino)
    state = {"listings": 0, "swapped": 0}

    def scandir(arg: Any = ".") -> Any:
        listing = real_scandir(arg)
        if state["swapped"]:
            return listing
        try:
            st = os.fstat(arg) if isinstance(arg, int) else os.stat(arg)
        except OSError:
            return listing
        if (st.st_dev, st.st_ino) != ident or not stat.S_ISDIR(st.st_mode):
            return listing
        state["listings"] += 1
        if state["listings"] <= skip:
            return listing
        with listing:
            entries = list(listing)
        # Where the trigger is now: the deleter may have renamed the tree first (a retired bundle).
        where = Path(os.readlink(f"/proc/self/fd/{arg}") if isinstance(arg, int) else os.fspath(arg))
        target = where / sub.relative_to(trigger) if trigger is not None else where
        os.rename(target, parking)
        os.symlink(outside, target, target_is_directory=True)
        state["swapped"] += 1
        return _Listed(entries)

    monkeypatch.setattr(os, "scandir", scandir)
    try:
        yield state
    finally:
        monkeypatch.setattr(os, "scandir", real_scandir)
