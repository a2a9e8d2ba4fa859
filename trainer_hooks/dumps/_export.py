"""A debug dump as Miles' own tools read it: the ``torch.save`` payload shape, from a bundle.

Miles' dump readers expect, at ``<--dump-details>/rollout_data/<id>.pt``, a ``torch.save`` of
``{"rollout_id", "metadata", "samples": [Sample.to_dict(), ...]}``. Our hooks write a bundle at that
very path (a directory named ``<id>.pt``, or a packed file). Two ways to use Miles' tools on it:

* :func:`dump_payload` returns that dict from the bundle (never unpickling anything). Miles'
  dashboard reads it through :class:`trainer_hooks.miles.dashboard.BundleDumpReader`, its
  ``DumpReader`` with the file loader pointed here (``python -m trainer_hooks.miles.dashboard
  --dump-details DIR`` serves Miles' dashboard with it).
* :func:`export_torch_dump` writes the payload with ``torch.save`` to a ``.pt`` file, for a
  consumer that calls ``torch.load`` itself: Miles' CI injection
  (``--ci-inject-rollout-data-path``, ``RolloutDataInjectionUtil``). This module only *writes*
  pickle, for Miles' consumption; nothing here reads one.

Media come back as absolute path strings inside the dump (``MediaRef``s are turned into their
paths: Miles passes images on as paths, PIL images or base64 strings), and PIL images stored by
the dump as PIL images. The dump must stay where it is while those paths are used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bundles import MediaRef
from bundles.support import atomic_writer
from trainer_hooks.dumps._debug_dump import DEBUG_DUMP_KIND, open_debug_dump

__all__ = ["dump_payload", "export_torch_dump"]


def _paths_for_refs(value: Any) -> Any:
    if isinstance(value, MediaRef):
        return str(value.path)
    if type(value) is dict:
        return {k: _paths_for_refs(v) for k, v in value.items()}
    if type(value) is list:
        return [_paths_for_refs(v) for v in value]
    if type(value) is tuple:
        return tuple(_paths_for_refs(v) for v in value)
    return value


def dump_payload(path: str | os.PathLike[str], verify: str = "fast") -> dict[str, Any]:
    """``{"rollout_id", "metadata", "samples"}`` of the debug dump at ``path``, as Miles'
    ``torch.save`` dump holds it (samples are ``to_dict()`` dicts, ``status`` a string)."""
    bundle = open_debug_dump(path, verify=verify)
    if bundle.kind != DEBUG_DUMP_KIND:
        from bundles import BundleFormatError

        raise BundleFormatError(f"{bundle.path}: kind: expected {DEBUG_DUMP_KIND!r}, found {bundle.kind!r}")
    meta = bundle.meta
    rollout_id = meta.get("rollout_id")
    if isinstance(rollout_id, str) and rollout_id.startswith("eval_"):
        rollout_id = int(rollout_id.removeprefix("eval_"))  # Miles stores the bare id in eval dumps too
    return {
        "rollout_id": rollout_id,
        "metadata": meta.get("metadata") or {},
        "samples": [_paths_for_refs(s) for s in bundle.samples(sample_cls=dict)],
    }


def export_torch_dump(
    src: str | os.PathLike[str], dest: str | os.PathLike[str], verify: str = "full"
) -> Path:
    """Write the dump at ``src`` as Miles' ``torch.save`` file ``dest`` (atomically: a temporary
    file beside it, then a rename). Verified fully by default, since Miles' tools will trust it."""
    import torch

    payload = dump_payload(src, verify=verify)
    out = Path(os.path.abspath(dest))
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(out, durable=True) as f:  # the one atomic write (bundles.support)
        torch.save(payload, f)
    return out
