"""Shared fixtures. Ray is started at most once per session, only by tests that ask for it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Any]:
    """A local Ray cluster (2 CPUs, no dashboard, auth off) with a short temp dir of its own:
    Ray's unix socket paths must stay under ~107 characters, which pytest's tmp paths exceed."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
