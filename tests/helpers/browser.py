"""A real headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

No port, no WebDriver, no third-party client: Chromium reads NUL-terminated JSON commands from
fd 3 and writes replies and events to fd 4. :func:`render` loads a page, evaluates an expression
in it (``Runtime.evaluate`` is not subject to the page's Content-Security-Policy, so a report
that forbids scripts can still be inspected), collects every console error, uncaught exception
and browser log error, and saves a full-page screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]
MAX_SHOT_HEIGHT = 12_000
INSTALL_HINT = "headless Chromium not found: install it with `apt-get install -y chromium` (Debian/Ubuntu)"


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Rendered:
    value: Any  # what the expression evaluated to (returnByValue)
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    screenshot: Path | None = None
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, in order
    console: list[str] = field(default_factory=list)  # every console message, any level


class _Pipe:
    def __init__(
        self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int, log_path: str
    ) -> None:
        self.proc = proc
        self.log_path = log_path
        self.out = to_browser
        self.inp = from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return "; its stderr ends:\n" + f.read()[-3000:].decode(errors="replace")
        except OSError:
            return ""

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            e = self._read(deadline)
            if e.get("method") == method:
                return e
            self.events.append(e)

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer in time{self.log_tail()}")
            ready, _, _ = select.select([self.inp], [], [], left)
            if ready:
                chunk = os.read(self.inp, 1 << 20)
                if not chunk:
                    raise RuntimeError(
                        f"Chromium closed the pipe (exit status {self.proc.poll()}){self.log_tail()}"
                    )
                self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)  # type: ignore[no-any-return]


def render(
    url: str,
    expression: str,
    screenshot: Path,
    width: int = 1280,
    height: int = 900,
    *,
    full_page: bool = True,
    actions: list[str] = (),  # type: ignore[assignment]
) -> Rendered:
    """Load ``url`` in a fresh headless Chromium profile, evaluate each of ``actions`` (DevTools
    evaluations, e.g. clicking a label: not the page's own script, which its CSP forbids), then
    ``expression`` after the load event (awaiting it when it is a promise), and save a PNG
    screenshot of the whole page (``full_page``) or of the viewport. Every request the page
    makes is recorded (``Network.requestWillBeSent``), the page's own URL first."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError(INSTALL_HINT)
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    log = open(os.path.join(profile, "stderr.log"), "wb")  # noqa: SIM115 - closed in finally
    r_cmd, w_cmd = os.pipe()  # we write commands -> browser fd 3
    r_evt, w_evt = os.pipe()  # browser fd 4 -> we read

    def child_fds() -> None:
        # Move both ends above 4 first: a pipe end may itself be fd 3 or 4.
        cmd, evt = os.dup(r_cmd), os.dup(w_evt)
        os.dup2(cmd, 3)
        os.dup2(evt, 4)
        os.set_inheritable(3, True)
        os.set_inheritable(4, True)

    proc = subprocess.Popen(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        # Chromium talks on fds 3 and 4 exactly: dup2 the pipes there in the child. close_fds would
        # close them again after preexec_fn; our other fds are non-inheritable, so none leaks.
        preexec_fn=child_fds,
        close_fds=False,
    )
    os.close(r_cmd)
    os.close(w_evt)
    pipe = _Pipe(proc, w_cmd, r_evt, log.name)
    try:
        targets = pipe.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        session = pipe.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        pipe.send("Page.navigate", {"url": url}, session=session)
        pipe.wait_event("Page.loadEventFired", timeout=60)
        result = pipe.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=session,
            timeout=60,
        )
        for action in actions:
            done = pipe.send(
                "Runtime.evaluate", {"expression": action, "awaitPromise": True}, session=session
            )
            if "exceptionDetails" in done:
                raise RuntimeError(f"evaluating {action!r} failed: {done['exceptionDetails']}")
        if actions:
            result = pipe.send(
                "Runtime.evaluate",
                {"expression": expression, "awaitPromise": True, "returnByValue": True},
                session=session,
                timeout=60,
            )
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluating the check failed: {result['exceptionDetails']}")
        # The whole page, up to MAX_SHOT_HEIGHT pixels (Chromium refuses larger captures), or
        # what the viewport shows now (scrolled, with fixed elements where they are).
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = pipe.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            params["captureBeyondViewport"] = True
            params["clip"] = {"x": 0, "y": 0, "width": size["width"],
                              "height": min(size["height"], MAX_SHOT_HEIGHT), "scale": 1}  # fmt: skip
        shot = pipe.send("Page.captureScreenshot", params, session=session, timeout=60)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        errors, requests, console = [], [], []
        for e in pipe.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Network.requestWillBeSent":
                requests.append(p.get("request", {}).get("url", ""))
            if m == "Runtime.consoleAPICalled":
                console.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif m == "Runtime.exceptionThrown":
                errors.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append("log: " + p["entry"].get("text", ""))
        with contextlib.suppress(RuntimeError, TimeoutError):
            pipe.send("Browser.close", timeout=10)
        return Rendered(result.get("result", {}).get("value"), errors, screenshot, requests, console)
    finally:
        os.close(w_cmd)
        os.close(r_evt)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(profile, ignore_errors=True)
