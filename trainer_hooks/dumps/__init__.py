"""Debug rollout dumps as bundles, their trajectory sidecar, and the import of old ``.pt`` dumps.

* :mod:`._debug_dump`: :func:`save_debug_rollout_data` / :func:`load_debug_rollout_data`, Miles'
  ``--save-debug-rollout-data`` / ``--load-debug-rollout-data`` with bundles instead of
  ``torch.save`` files (directory or packed ``.rbundle``).
* :mod:`._trajectory`: the ``--save-debug-trajectory-data`` JSONL sidecar.
* :mod:`._uploads`: dumps to an object-store URL upload in the background;
  :func:`flush_dump_uploads` waits for them (the drivers do, before releasing run media).
* :mod:`._export`: :func:`dump_payload` / :func:`export_torch_dump`, a dump as Miles' own tools
  read it (its dashboard, its CI injection).
* :mod:`._legacy`: :func:`import_legacy_dump` (``rollout-bundle import-dump``), the one place
  that may unpickle, and only when told to trust the file.
"""

from trainer_hooks.dumps._debug_dump import (
    DEBUG_DUMP_KIND,
    load_debug_rollout_data,
    open_debug_dump,
    save_debug_rollout_data,
    write_dump_bundle,
)
from trainer_hooks.dumps._export import dump_payload, export_torch_dump
from trainer_hooks.dumps._legacy import LegacyDumpError, PickleRefusedError, import_legacy_dump
from trainer_hooks.dumps._legacy import register as register_commands
from trainer_hooks.dumps._trajectory import save_debug_trajectory_data, strip_messages, trajectory_rows
from trainer_hooks.dumps._uploads import DumpUploadError, flush_dump_uploads

__all__ = [
    "DEBUG_DUMP_KIND",
    "DumpUploadError",
    "LegacyDumpError",
    "PickleRefusedError",
    "dump_payload",
    "export_torch_dump",
    "flush_dump_uploads",
    "import_legacy_dump",
    "load_debug_rollout_data",
    "open_debug_dump",
    "register_commands",
    "save_debug_rollout_data",
    "save_debug_trajectory_data",
    "strip_messages",
    "trajectory_rows",
    "write_dump_bundle",
]
