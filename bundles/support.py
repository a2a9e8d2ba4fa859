"""Support for tools built on bundles: the primitives a bundle's writer uses that its clients
need too, so that the project has one implementation of each.

Audience: code built on :mod:`bundles` that writes next to bundles or adds commands to
``rollout-bundle``: :mod:`trainer_hooks` (run media, leases, checkpoints, debug dumps, replay,
view) and the CLI. It is not the format API: someone who only reads and writes bundles needs
:mod:`bundles` alone.

What is here, by concern:

* **Files and trees.** :func:`atomic_write` / :func:`atomic_writer` / :func:`atomic_path`, the one
  atomic file write (temporary file beside the destination, optional fsync of file and
  directory, rename, cleanup on failure; protocol in :mod:`bundles._local.atomic`); :func:`place_file`,
  the one "hard-link, else copy" of the tools built on bundles;
  :func:`remove_stale_temps` for the leftovers of writers that died mid-write;
  :func:`remove_tree`, the one tree deletion (fd-relative, never follows a symlink, never crosses
  a mount); :func:`scratch_dir`, a work directory beside a bundle that a later write cleans up if
  its process dies.
* **Untrusted files.** :func:`open_regular_file`, the one open of a file this project did not
  write itself (a bundle's members, a rollout journal's segments and media): regular files only,
  never through a symlink, never blocking on a FIFO, one named error; :func:`read_at_most`, the
  one bounded read of such a file (a cap + 1 read tells an oversized file from one that fits);
  :func:`media_name_ok`, the one rule for a content-addressed media name (``<64 hex><suffix>``,
  never a path); :func:`local_path_only`, the one refusal of a URL where only a local path makes
  sense (a media directory, a scratch directory).
* **Messages.** :func:`bounded_repr`, the one ``repr`` of a value an error message shows: bounded
  in length and in the time it takes, whatever the value (a YAML alias bomb, a gigabyte string);
  :func:`display`, the one way an untrusted name or text reaches a terminal or a page (control
  characters, bidirectional overrides, non-UTF-8 bytes and lone surrogates escaped, cut to a bound).
* **Limits.** :data:`LIMITS`, the one table of limits (:mod:`bundles._format.limits`): every size and
  count from an untrusted file is checked against its row before it is spent, by writer and
  reader alike (a row is read by name: ``LIMITS["MAX_CURSOR_BYTES"]``); :func:`nesting_depth_exceeds`,
  the one depth check of a parsed JSON document (iterative: a hostile depth cannot exhaust the
  stack), which the manifest reader and the meta writer use too.
* **Process identity.** :func:`boot_id`, :func:`pid_namespace`, :func:`proc_stat`,
  :func:`pid_alive`: enough to prove a leftover's writer dead (same boot, same pid namespace, no
  such live process), the only case in which it may be deleted.
* **Fault points.** :func:`fault_point` marks a moment a crash test may kill the process at
  (``ROLLOUT_BUNDLES_KILL_AT=<name>[@<n>]``, :func:`arm_kill`) or run a callback at
  (:func:`on_fault_point`); unarmed it costs one function call.
* **Progress.** :class:`Progress` (a progress line drawn only on a terminal) and
  :func:`human_bytes`, the one size format of every command's output.
* **The CLI kit.** What every ``rollout-bundle`` subcommand shares: :func:`add_command`,
  :func:`add_json_option`, :func:`add_progress_option`, :func:`build_parser`,
  :func:`run_command`, :func:`main_with`, :class:`CommandError`, :func:`check_output_file`,
  :func:`int_at_least`, :func:`cli_message` (habits described in :mod:`bundles._commands.common`).
* **Codec primitives.** :func:`only_numbers`, the C-speed proof that a list holds only ints,
  floats and bools, which the encoder uses to pack a number list as it is; a client that proves a
  list once (a snapshot's type check) hands its result to the encoder (``number_lists`` of
  :func:`bundles.sample_encoder`'s ``encode``) instead of proving it twice; :func:`gc_paused`,
  the cyclic collector paused around work that builds many containers and no cycles (a save, a
  decode, a journal's scan), whose collections would otherwise walk the whole process's heap.
* **On-disk names** a tool looking inside a bundle directory needs: :data:`MANIFEST_NAME`,
  :data:`MEDIA_DIR`, :data:`SHARDS_DIR` (docs/FORMAT.md); and :data:`SINGLE_WRITER_ENV`, the
  environment variable that opts in to writing on a store that ignores preconditions.

Stability: the names in ``__all__`` are public API with the same promise as :mod:`bundles`':
within a major version a name is kept, its arguments only gain keyword options with defaults that
keep today's behaviour, and a name that goes is first kept for one release as an alias that warns
(``DeprecationWarning``). Everything not listed here stays private to :mod:`bundles` and may
change in any release: import it from here, never from a ``bundles._private`` module
(tests/test_architecture.py fails on such an import outside ``bundles``).
"""

from __future__ import annotations

from bundles._commands.common import (
    PROG,
    CommandError,
    add_command,
    add_json_option,
    add_progress_option,
    build_parser,
    check_output_file,
    cli_message,
    int_at_least,
    main_with,
    run_command,
)
from bundles._format.codec import gc_paused, only_numbers
from bundles._format.layout import MANIFEST_NAME, MEDIA_DIR, SHARDS_DIR
from bundles._format.limits import LIMITS
from bundles._format.manifest import nesting_depth_exceeds
from bundles._format.repr import bounded_repr, display
from bundles._local.atomic import atomic_path, atomic_write, atomic_writer, place_file, remove_stale_temps
from bundles._local.commit import scratch_dir
from bundles._local.faults import KILL_ENV, arm_kill, fault_point, on_fault_point
from bundles._local.fs import remove_tree
from bundles._local.proc import boot_id, pid_alive, pid_namespace, proc_stat
from bundles._local.progress import Progress, human_bytes
from bundles._local.reader import read_at_most
from bundles._local.sources import media_name_ok, open_regular_file
from bundles._urls import SINGLE_WRITER_ENV, local_path_only

__all__ = [
    "KILL_ENV",
    "LIMITS",
    "MANIFEST_NAME",
    "MEDIA_DIR",
    "PROG",
    "SHARDS_DIR",
    "SINGLE_WRITER_ENV",
    "CommandError",
    "Progress",
    "add_command",
    "add_json_option",
    "add_progress_option",
    "arm_kill",
    "atomic_path",
    "atomic_write",
    "atomic_writer",
    "boot_id",
    "bounded_repr",
    "build_parser",
    "check_output_file",
    "cli_message",
    "display",
    "fault_point",
    "gc_paused",
    "human_bytes",
    "int_at_least",
    "local_path_only",
    "main_with",
    "media_name_ok",
    "nesting_depth_exceeds",
    "on_fault_point",
    "only_numbers",
    "open_regular_file",
    "pid_alive",
    "pid_namespace",
    "place_file",
    "proc_stat",
    "read_at_most",
    "remove_stale_temps",
    "remove_tree",
    "run_command",
    "scratch_dir",
]
