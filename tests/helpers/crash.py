"""The SIGKILL crash suites' fork server (tests/test_journal_crash.py, tests/test_async_crash.py).

One server process imports trainer_hooks once (a fork of the threaded pytest process would be
unsafe) and forks one child per run: it reads a JSON config per line on stdin, runs the suite's
``child(cfg)`` in a fork, kills it with SIGKILL after ``cfg["kill_after"]`` seconds when given
(fault points armed by the child kill it at a named moment instead), and answers one JSON line:
the exit status and when the child ended.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import trainer_hooks

__all__ = ["IMPORT_ROOT", "ForkServer"]

IMPORT_ROOT = Path(trainer_hooks.__file__).resolve().parents[1]

_LOOP = textwrap.dedent(
    """
    print("ready", flush=True)
    for line in sys.stdin:
        cfg = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                child(cfg)
                code = 0
            except BaseException as e:
                import traceback; traceback.print_exc()
            finally:
                os._exit(code)
        delay = cfg.get("kill_after")
        started = time.time()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if delay is not None and time.time() - started >= delay:
                os.kill(pid, signal.SIGKILL)
                delay = None
            time.sleep(0.002)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status), "t_end": time.time()}), flush=True)
    """
)


class ForkServer:
    """``child_source``: Python source defining ``child(cfg)``; ``{repo}`` in it is the import
    root (inserted into ``sys.path`` first), other braces doubled as for ``str.format``."""

    def __init__(
        self,
        tmp_path: Path,
        child_source: str,
        env_extra: dict[str, str] | None = None,
        *,
        trial_timeout: float = 60,
    ) -> None:
        script = tmp_path / "server.py"
        head = "import json, os, sys, time, signal\nsys.path.insert(0, {repo!r})\n"
        script.write_text((head + child_source).format(repo=str(IMPORT_ROOT)) + _LOOP)
        self.trial_timeout = trial_timeout
        env = {**os.environ, **(env_extra or {})}
        env.pop("ROLLOUT_BUNDLES_KILL_AT", None)
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self._line(60) == "ready"

    def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"crash server: no answer within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"crash server died: {err[-3000:]}")
        return line.strip()

    def run(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """One run of ``child(cfg)``; returns ``{"status": exit code (-9: SIGKILL), "t_end": time}``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cfg) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line(self.trial_timeout))

    def close(self) -> str:
        """Stop the server; returns its stderr (the children's tracebacks)."""
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.stderr.read() if self.proc.stderr else ""
