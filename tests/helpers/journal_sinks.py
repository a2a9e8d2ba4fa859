"""Both journal sinks for one test: ``--save`` in a local directory and on SeaweedFS (loopback).

A test that takes the ``journal_place`` fixture runs once per sink (``[local]``, ``[seaweedfs]``)
through the same code: a :class:`JournalPlace` gives the ``--save`` root to pass, the
environment the store needs (set for the test), the journal's sink as a run opens it
(:func:`trainer_hooks.journal.run_journal`) and the names the sink keeps. The store
is started only for the ``[seaweedfs]`` case (the session's ``seaweed_s3`` fixture), and that
case is skipped where SeaweedFS is not installed. Import the fixture into a test module::

    from helpers.journal_sinks import journal_place  # noqa: F401 (a fixture)

The crash suites (tests/test_journal_crash.py) can take the same fixture, or call
:func:`journal_place_for` with the sink's name, for one parametrisation over both sinks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["SINKS", "JournalPlace", "journal_place", "journal_place_for"]

#: The sinks every journal test parametrised by ``journal_place`` runs on.
SINKS = ("local", "seaweedfs")


@dataclass
class JournalPlace:
    """Where one test's journal lives: ``save`` (the ``--save`` root: a directory or an
    ``s3://`` prefix), ``env`` (what the store needs, set for the test by the fixture)."""

    name: str
    save: str
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)

    def sink(self, spool: Callable[[], Path] | None = None) -> Any:
        """The journal's sink, as a run with this ``--save`` opens it (a store's spool in tmp)."""
        from trainer_hooks.journal import run_journal

        def default_spool() -> Path:
            path = self.tmp / f"spool-{uuid.uuid4().hex[:8]}"
            path.mkdir(parents=True)
            return path

        return run_journal(self.save, spool=spool or default_spool)

    def kept(self) -> list[str]:
        """The names of the segments (or shipments) the sink keeps, sorted."""
        sink = self.sink()
        if hasattr(sink, "shipments"):
            return sorted(name for name, _ in sink.shipments())
        return sorted(p.name for p in sink.directory.glob("segment-*"))

    def args(self, run: str, *extra: str, batch_size: int = 2, interval: str = "0.05") -> Any:
        """A run's parsed options with ``--save``/``--load`` here (the real parser)."""
        from trainer_hooks import parse_args

        return parse_args(
            [
                "--rollout-batch-size", str(batch_size),
                "--shared-media-dir", str(self.tmp / "shared"),
                "--run-uuid", run,
                "--save", self.save,
                "--load", self.save,
                "--rollout-journal-interval", interval,
                *extra,
            ]
        )  # fmt: skip


def journal_place_for(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> JournalPlace:
    """The :class:`JournalPlace` of sink ``name`` (one of :data:`SINKS`) for this test."""
    if name == "local":
        return JournalPlace(name, str(tmp_path / "ckpt"), tmp_path)
    if name == "seaweedfs":
        server = request.getfixturevalue("seaweed_s3")
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        save = f"s3://{server.bucket()}/{tmp_path.name}-{uuid.uuid4().hex[:8]}"
        return JournalPlace(name, save, tmp_path, dict(server.env))
    raise ValueError(f"journal sink: expected one of {', '.join(SINKS)}, found {name!r}")


@pytest.fixture(params=SINKS)
def journal_place(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> JournalPlace:
    """One test per journal sink (see the module docstring)."""
    return journal_place_for(request.param, request, tmp_path, monkeypatch)
