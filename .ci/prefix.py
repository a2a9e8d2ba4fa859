"""Run a command with each line of its output prefixed by a name: ``prefix.py NAME CMD [ARG...]``.

``make test`` runs the tox envs in parallel with ``--parallel-live``, so that pytest's progress
shows as it happens instead of after each env ends; tox runs pytest through this, so that the
interleaved lines of concurrent envs say which env printed them (``py311-full: tests/... [ 45%]``).
Standard error is merged into standard output; the exit status is the command's.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: prefix.py NAME CMD [ARG...]", file=sys.stderr)
        return 2
    name, command = argv[0], argv[1:]
    # PYTHONUNBUFFERED: a Python child (pytest) writes each line as it completes, not per 8 KiB.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
    )
    assert proc.stdout is not None
    out = sys.stdout.buffer
    prefix = f"{name}: ".encode()
    for line in proc.stdout:  # each line as it is completed
        out.write(prefix + line)
        out.flush()
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
