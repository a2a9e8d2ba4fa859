"""Every location runs the one conformance suite (tests/helpers/location_suite.py): a local
directory, a packed file, a prefix on SeaweedFS and on moto, a packed file on SeaweedFS, and a
prefix on Azure Storage's emulator (Azurite). Each subclass says only where its bundles go; the
servers are real, on 127.0.0.1, started once per session by the fixtures in conftest.py, and each
test gets a bucket (or container) of its own through the standard environment.

gs:// runs no server here: no GCS emulator this project can install honours the preconditions
the commit protocol needs, so gs:// is tested only for URL parsing and configuration errors
(tests/test_store_urls.py); docs/TESTING.md says exactly what was and was not tested."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from helpers.location_suite import LocationTests

LOCAL = {"commits_by": "rename", "needs_probe": False, "has_pool": False, "uploads": False}
ON_STORE = {"can_hard_link": False, "commits_by": "create-only put", "needs_probe": True, "uploads": True}


class TestDirectory(LocationTests):
    name = "directory"
    capabilities: ClassVar[dict[str, object]] = {**LOCAL, "can_hard_link": True}

    def dest(self, tmp_path: Path, name: str) -> str:
        return str(tmp_path / "bundles" / name)


class TestPackedFile(LocationTests):
    name = "packed file"
    packed = True
    capabilities: ClassVar[dict[str, object]] = {**LOCAL, "can_hard_link": False}
    kill_point = "atomic_write.after-data"  # the packed file is written beside and renamed

    def dest(self, tmp_path: Path, name: str) -> str:
        return str(tmp_path / "bundles" / f"{name}.rbundle")


class _OnStore(LocationTests):
    capabilities: ClassVar[dict[str, object]] = {**ON_STORE, "has_pool": True}
    kill_point = "store.before-publish"
    scheme = "s3"
    server_fixture = ""

    @pytest.fixture(autouse=True)
    def _bucket(self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        server: Any = request.getfixturevalue(self.server_fixture)
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        self.bucket = server.container() if hasattr(server, "container") else server.bucket()
        yield

    def dest(self, tmp_path: Path, name: str) -> str:
        return f"{self.scheme}://{self.bucket}/bundles/{name}"


class TestSeaweedFS(_OnStore):
    name = "SeaweedFS"
    server_fixture = "seaweed_s3"


class TestMoto(_OnStore):
    name = "moto"
    server_fixture = "moto_s3"


class TestPackedOnSeaweedFS(_OnStore):
    name = "packed file on SeaweedFS"
    server_fixture = "seaweed_s3"
    packed = True
    capabilities: ClassVar[dict[str, object]] = {**ON_STORE, "has_pool": False}
    kill_point = "store.before-put"  # packed locally, killed before its one put

    def dest(self, tmp_path: Path, name: str) -> str:
        return f"s3://{self.bucket}/bundles/{name}.rbundle"


class TestAzurite(_OnStore):
    name = "az:// on Azurite"
    server_fixture = "azurite_az"
    scheme = "az"
