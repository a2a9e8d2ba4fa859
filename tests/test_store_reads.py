"""What a reader of a store reports is what is there: ``list_bundles`` lists bundles (never a
generation, the live one or a dead writer's unpublished one), and a journal shipment's damage names
the store object it came from. Against real servers on 127.0.0.1 (moto in-process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore", reason="obstore (rollout-bundles[s3]) is not installed")

import obstore
from obstore.store import S3Store

from bundles import list_bundles, open_bundle, write_bundle
from bundles._local.faults import KILL_ENV

ROOT = Path(__file__).resolve().parents[1]


def _keys(server: Any, bucket: str, prefix: str) -> list[str]:
    raw = S3Store(bucket, **server.options(), client_options={"allow_http": True})
    return sorted(str(m["path"]) for batch in obstore.list(raw, prefix) for m in batch)


_DEAD_WRITER = """
import json, sys
from bundles import write_bundle
write_bundle(sys.argv[1], [{"index": 0, "tokens": [1, 2, 3]}], storage_options=json.loads(sys.argv[2]), overwrite=True)
"""


def _die_before_publishing(server: Any, url: str) -> None:
    """A writer SIGKILLed after its generation's manifest, before its pointer (a real process)."""
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT), KILL_ENV: "store.before-publish"}
    proc = subprocess.run(
        [sys.executable, "-c", _DEAD_WRITER, url, json.dumps(server.options())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr


def test_list_bundles_never_lists_a_generation(moto_s3: Any) -> None:
    bucket = moto_s3.bucket()
    options = moto_s3.options()
    root = f"s3://{bucket}/R"
    write_bundle(f"{root}/b1", [{"index": 1}], storage_options=options)
    write_bundle(f"{root}/b1/nested", [{"index": 2}], storage_options=options)  # a bundle inside one
    _die_before_publishing(moto_s3, f"{root}/b2")  # a new bundle that never published
    _die_before_publishing(moto_s3, f"{root}/b1")  # an overwrite that never published

    # What the dead writers left: a generation with its manifest (the last object before the
    # pointer) under b2, which has no pointer, and a second one under b1 beside the live one.
    def manifests(prefix: str) -> list[str]:
        return [
            k for k in _keys(moto_s3, bucket, prefix) if k.count("/") == 3 and k.endswith("/manifest.json")
        ]

    assert len(manifests("R/b2/")) == 1 and not _keys(moto_s3, bucket, "R/b2/bundle.json")
    assert len(manifests("R/b1/")) == 2

    assert list_bundles(root, storage_options=options) == [f"{root}/b1"]
    # Inside a bundle: its nested bundle, not its live generation nor the dead overwrite's.
    assert list_bundles(f"{root}/b1", storage_options=options) == [f"{root}/b1/nested"]
    # The dead writer's prefix: nothing (its docstring's promise).
    assert list_bundles(f"{root}/b2", storage_options=options) == []
    assert [s["index"] for s in open_bundle(f"{root}/b1", storage_options=options)] == [1]
