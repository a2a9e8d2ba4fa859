"""``rollout-bundle sweep``: list, and with ``--delete`` remove, media directories of dead runs.

``sweep SHARED_MEDIA_DIR [--older-than DURATION] [--delete] [--json]`` lists the run media
directories under a shared media root with what sweep makes of them (see
:mod:`trainer_hooks.run_media._lease` for the rules) and, with ``--delete``, removes the crashed, stale
and orphaned ones. Without ``--delete`` nothing is changed. A live run is never deleted.

Exit status: 0 on success, 1 when a directory could not be removed or the root is missing,
2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bundles.support import add_command, human_bytes
from trainer_hooks.run_media._lease import (
    DEFAULT_SWEEP_OLDER_THAN_S,
    SweepEntry,
    format_duration,
    parse_duration,
    sweep_run_media,
)

__all__ = ["register", "run_sweep"]


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(subparsers: Any) -> None:
    """Add ``sweep`` to a ``rollout-bundle`` parser."""
    p = add_command(
        subparsers,
        "sweep",
        "list (and with --delete remove) media directories left by crashed runs",
        run_sweep,
        description=(
            "List run media directories under SHARED_MEDIA_DIR whose lease is stale or whose process is "
            "gone on this host, or that have no lease and did not change for DURATION. Deletes them only "
            "with --delete; a run whose lease is fresh is never deleted."
        ),
    )
    p.add_argument(
        "shared_media_dir",
        metavar="SHARED_MEDIA_DIR",
        help="the shared media root that holds one directory per run (--shared-media-dir of the runs)",
    )
    p.add_argument(
        "--older-than",
        type=_duration,
        default=DEFAULT_SWEEP_OLDER_THAN_S,
        metavar="DURATION",
        help="heartbeat (or, without a lease, modification) age after which a run counts as dead: "
        "30s, 10m, 2h, 1d (default: 1h)",
    )
    p.add_argument("--delete", action="store_true", help="remove the directories listed as removable")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object per directory instead of a table"
    )


def run_sweep(args: argparse.Namespace) -> int:
    entries = sweep_run_media(args.shared_media_dir, older_than=args.older_than, delete=args.delete)
    out = sys.stdout
    if args.json:
        for e in entries:
            out.write(json.dumps(e.to_dict(), sort_keys=True) + "\n")
    else:
        _print_table(entries, args, out)
    return 1 if any(e.error for e in entries) else 0


def _print_table(entries: list[SweepEntry], args: argparse.Namespace, out: object) -> None:
    write = out.write  # type: ignore[attr-defined]
    if not entries:
        write(f"{args.shared_media_dir}: no run directories\n")
        return
    rows = [("STATE", "SIZE", "AGE", "RUN", "DETAIL")]
    for e in entries:
        state = e.state
        if e.deleted:
            state += " (deleted)"
        elif e.error:
            state += " (FAILED)"
        detail = e.reason if not e.error else f"{e.reason}; delete failed: {e.error}"
        age = "-" if e.age_s is None else format_duration(e.age_s)
        rows.append((state, human_bytes(e.size), age, e.run_id, detail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        write("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] + "\n")
    removable = [e for e in entries if e.removable]
    kept = len(entries) - len(removable)
    total = sum(e.size for e in removable)
    if args.delete:
        deleted = [e for e in removable if e.deleted]
        freed = sum(e.freed for e in deleted)
        failed = len(removable) - len(deleted)
        write(
            f"deleted {len(deleted)} run director{'y' if len(deleted) == 1 else 'ies'}, freed {human_bytes(freed)}; "
            f"kept {kept}" + (f"; {failed} could not be deleted" if failed else "") + "\n"
        )
    elif removable:
        write(
            f"{len(removable)} of {len(entries)} run directories can be removed ({human_bytes(total)}); "
            "run again with --delete to remove them\n"
        )
    else:
        write(f"nothing to remove ({len(entries)} run director{'y' if len(entries) == 1 else 'ies'} kept)\n")
