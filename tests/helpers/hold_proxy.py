"""A loopback proxy that holds chosen requests until the test releases them: a slow DELETE of a
remove or gc, a slow PUT of a writer, landing exactly where the test wants it (issue 36, item 4).

It is :class:`helpers.store.FaultProxy` (one request per connection, read whole, forwarded on a
fresh upstream connection) plus :meth:`HoldProxy.hold`: the ``nth`` request matching a method and
a path substring (obstore deletes with ``POST /<bucket>?delete``) waits, once its request line
and headers are read, until :meth:`Hold.release`; :attr:`Hold.arrived` is set when it starts
waiting and :attr:`Hold.done` once the server's answer was sent back. Every wait ends after
``timeout_s`` at most, so a test on code without the fault point that would release it fails
instead of hanging.
"""

from __future__ import annotations

import socket
import threading

from helpers.store import FaultProxy


class Hold:
    def __init__(self, method: str, part: str, nth: int, timeout_s: float) -> None:
        self.method, self.part, self.nth, self.timeout_s = method, part, nth, timeout_s
        self.seen = 0
        self.path = ""
        self.arrived = threading.Event()
        self.released = threading.Event()
        self.done = threading.Event()

    def release(self) -> None:
        self.released.set()

    def wait_arrived(self) -> None:
        assert self.arrived.wait(self.timeout_s), f"no {self.method} {self.part!r} #{self.nth} came"

    def wait_done(self) -> None:
        assert self.done.wait(self.timeout_s), f"the held {self.method} {self.path} was not answered"


class HoldProxy(FaultProxy):
    def __init__(self, upstream: str) -> None:
        self.holds: list[Hold] = []
        self._mine = threading.local()
        super().__init__(upstream)

    def hold(self, method: str, part: str, nth: int = 1, timeout_s: float = 60.0) -> Hold:
        """Hold the ``nth`` ``method`` request whose path contains ``part`` (from now on)."""
        h = Hold(method, part, nth, timeout_s)
        with self._lock:
            self.holds.append(h)
        return h

    def _match(self, method: str, path: str) -> tuple[str, int] | None:
        chosen = None
        with self._lock:
            for h in self.holds:
                if h.method == method and h.part in path and not h.arrived.is_set():
                    h.seen += 1
                    if h.seen == h.nth:
                        chosen = h
                        break
        self._mine.hold = chosen
        if chosen is not None:
            chosen.path = path
            chosen.arrived.set()
            chosen.released.wait(chosen.timeout_s)
        return super()._match(method, path)

    def _handle(self, sock: socket.socket) -> None:
        self._mine.hold = None
        try:
            super()._handle(sock)
        finally:
            held = getattr(self._mine, "hold", None)
            if held is not None:
                held.done.set()
