"""Helpers shared by the tests: content-addressed media files and trainer arguments."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def put_media(run_dir: Path, data: bytes, suffix: str = ".png") -> str:
    """Store ``data`` as a run media store does, ``<sha256 hex><suffix>``; return its absolute path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / (hashlib.sha256(data).hexdigest() + suffix)
    if not path.exists():
        path.write_bytes(data)
    return str(path)


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def digest_of(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``, from hashlib: never from the code under test."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def wait_until(condition: Callable[[], T], what: str, timeout: float = 30.0, poll: float = 0.005) -> T:
    """Poll ``condition`` until it returns something truthy and return that; fail the test naming
    ``what`` after ``timeout`` seconds. Tests wait on conditions, never on a fixed sleep: a sleep
    is too short on a loaded machine, and an "absent" check after one passes if nothing happened."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def trainer_args(tmp_path: Path, run: str, *extra: str) -> Any:
    """Parsed trainer options for a run ``run`` under ``tmp_path``: shared media, --save and
    --load in ``tmp_path``, plus ``extra``."""
    from trainer_hooks import parse_args

    return parse_args(
        [
            "--rollout-batch-size",
            "1",
            "--shared-media-dir",
            str(tmp_path / "shared"),
            "--run-uuid",
            run,
            "--save",
            str(tmp_path / "ckpt"),
            "--load",
            str(tmp_path / "ckpt"),
            *extra,
        ]
    )
