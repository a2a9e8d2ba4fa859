"""What this process can know about another one: same machine and boot, same pid namespace,
alive. Used to decide whether a leftover (a staging directory, a lease) belongs to a process that
is provably dead, which is the only case in which it may be deleted.

On Linux the boot id is ``/proc/sys/kernel/random/boot_id`` (new at every boot) and the pid
namespace is the target of ``/proc/self/ns/pid`` (``pid:[4026531836]``). Where either is
unavailable it is ``None``: the caller then knows less, and must conclude less.
"""

from __future__ import annotations

import functools
import os

__all__ = ["boot_id", "pid_alive", "pid_namespace", "proc_stat"]


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def boot_id() -> str | None:
    """This boot's id (a uuid string), or None without /proc."""
    return _read_text("/proc/sys/kernel/random/boot_id") or None


def pid_namespace() -> str | None:
    """This process's pid namespace, e.g. ``pid:[4026531836]``, or None without /proc.

    Not cached: a process may ``unshare`` (rare, but then its children's pids live elsewhere)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) from /proc/<pid>/stat, if readable."""
    text = _read_text(f"/proc/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = text[text.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True when ``pid`` names a process in this pid namespace that has not exited (a zombie,
    killed but not yet reaped, counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return True  # can't tell: assume alive, the safe answer
    st = proc_stat(pid)
    return st is None or st[0] not in ("Z", "X")
