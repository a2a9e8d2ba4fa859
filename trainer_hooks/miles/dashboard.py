"""Miles' dashboard on dumps our hooks write: :class:`BundleDumpReader`, and a launcher.

    python -m trainer_hooks.miles.dashboard --dump-details DIR [Miles' dashboard options]

Miles' dashboard (``miles.dashboard``) reads ``<DIR>/rollout_data/<id>.pt`` with ``torch.load``.
Our hooks write a bundle there (a directory named ``<id>.pt``, or a packed file);
:class:`BundleDumpReader` is Miles' ``DumpReader`` whose file loader opens such a bundle
(:func:`trainer_hooks.dumps.dump_payload`, no pickle) and hands everything else (Miles' own
``train_data/*.pt`` shards, old ``.pt`` dumps) to Miles' loader. The rest is Miles' reader,
unchanged: discovery, the ``dashboard_columns`` parquet mirror (built lazily from the loaded
samples), joins with the train shards. The launcher runs Miles' ``miles.dashboard.serve`` with
this reader in place of its own.

Needs Miles' dashboard dependencies (polars; fastapi and uvicorn to serve).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from miles.dashboard.dump_reader import DumpReader

from bundles import is_bundle
from trainer_hooks.dumps import dump_payload

__all__ = ["BundleDumpReader", "main"]


class BundleDumpReader(DumpReader):
    """Miles' ``DumpReader`` that also reads debug dumps written as bundles."""

    def _torch_load(self, path: Path, *, mmap: bool = False) -> Any:
        if is_bundle(path):
            return dump_payload(path)
        return super()._torch_load(path, mmap=mmap)


def main(argv: list[str] | None = None) -> None:
    import miles.dashboard.serve as serve

    serve.DumpReader = BundleDumpReader  # the one thing that differs from Miles' own launcher
    serve.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
