"""Helpers shared by the bundle tests: a run media directory with content-addressed files."""

from __future__ import annotations

import hashlib
from pathlib import Path


def put_media(run_dir: Path, data: bytes, suffix: str = ".png") -> str:
    """Store ``data`` as a run media store does, ``<sha256 hex><suffix>``; return its absolute path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / (hashlib.sha256(data).hexdigest() + suffix)
    if not path.exists():
        path.write_bytes(data)
    return str(path)


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
