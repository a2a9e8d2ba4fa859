"""A loopback HTTP proxy that honours the commit protocol's preconditions at the probe and drops
them afterwards (issue 30, item 6): the store a writer trusted turns into one that ignores
``If-None-Match`` and ``If-Match``.

Each request is read whole and forwarded on a fresh upstream connection (one request per client
connection, as :class:`helpers.store.FaultProxy` does). Once three PUTs of a probe key
(``.rollout-bundle-probe-*``: the probe's two creates and its ``If-Match``) have passed, both
headers are stripped from every request, and a request that lost one is signed again (AWS
SigV4, with the test server's key: SeaweedFS checks signatures, and the client signed the
headers it sent). With ``hold_first_pointer``, the first PUT of a
``bundle.json`` after :meth:`arm` is held until a second one arrives; then the first is applied,
then the second, and the first's writer hears back only after the second's did (each wait ends
after ``hold_s`` at most; ``held_suffix`` names other keys to race for, ``.rbundle`` objects): two racing publishers both put their pointer after both looked for
one, and the earlier put is overtaken before its writer can read it back, every run.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse

from bundles._store.probe import PROBE_PREFIX
from helpers.store import ACCESS_KEY, SECRET_KEY, serve_loopback

STRIPPED = frozenset({"if-none-match", "if-match"})


class StripAfterProbeProxy:
    def __init__(
        self,
        upstream: str,
        *,
        keys: tuple[str, str] = (ACCESS_KEY, SECRET_KEY),
        hold_first_pointer: bool = True,
        hold_s: float = 30.0,
        held_suffix: str = "/bundle.json",
    ) -> None:
        self.held_suffix = held_suffix
        self.keys = keys
        parsed = urllib.parse.urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.hold_first_pointer = hold_first_pointer
        self.hold_s = hold_s
        self.probe_puts = 0
        self.stripped: list[tuple[str, str, str]] = []  # (method, path, header) never forwarded
        self.pointer_puts = 0  # PUTs of a bundle.json since arm()
        self.armed = False
        self._second_arrived = threading.Event()  # the second pointer PUT reached the proxy
        self._first_applied = threading.Event()  # the first was forwarded and applied
        self._answered = threading.Event()  # the second was answered
        self._lock = threading.Lock()
        self._server, self.endpoint = serve_loopback(self._handle)

    @property
    def stripping(self) -> bool:
        with self._lock:
            return self.probe_puts >= 3

    def arm(self) -> None:
        """Count (and hold the first of) the pointer PUTs from now on."""
        with self._lock:
            self.pointer_puts = 0
            for event in (self._second_arrived, self._first_applied, self._answered):
                event.clear()
            self.armed = True

    def close(self) -> None:
        for event in (self._second_arrived, self._first_applied, self._answered):
            event.set()
        self._server.shutdown()
        self._server.server_close()

    def _read_request(self, sock: socket.socket) -> tuple[bytes, str, str, list[bytes], bytes] | None:
        f = sock.makefile("rb")
        line = f.readline()
        if not line:
            return None
        method, path, _ = line.decode("latin-1").split(" ", 2)
        strip = self.stripping
        before = len(self.stripped)
        headers: list[bytes] = []
        length = 0
        while True:
            h = f.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            name = h.decode("latin-1").partition(":")[0].strip().lower()
            if name == "content-length":
                length = int(h.decode("latin-1").partition(":")[2].strip())
            if strip and name in STRIPPED:
                self.stripped.append((method, path, name))
            elif name not in ("connection", "keep-alive"):
                headers.append(h)
        body = f.read(length) if length else b""
        if strip and len(self.stripped) > before:
            headers = self._sign(method, path, headers, body)
        return line, method, path, headers, body

    def _sign(self, method: str, path: str, headers: list[bytes], body: bytes) -> list[bytes]:
        """``headers`` with a fresh SigV4 signature over what is forwarded."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        fields = {}
        for h in headers:
            name, _, value = h.decode("latin-1").partition(":")
            if name.strip().lower() not in ("authorization", "x-amz-date"):
                fields[name.strip()] = value.strip()
        host = next(v for k, v in fields.items() if k.lower() == "host")
        request = AWSRequest(method=method, url=f"http://{host}{path}", data=body, headers=fields)
        SigV4Auth(Credentials(*self.keys), "s3", "us-east-1").add_auth(request)
        return [f"{k}: {v}\r\n".encode("latin-1") for k, v in request.headers.items()]

    def _handle(self, sock: socket.socket) -> None:
        request = self._read_request(sock)
        if request is None:
            return
        line, method, path, headers, body = request
        key = urllib.parse.unquote(path.partition("?")[0])
        order = None
        with self._lock:
            if method == "PUT" and PROBE_PREFIX in key:
                self.probe_puts += 1
            elif method == "PUT" and key.endswith(self.held_suffix) and self.armed:
                order = self.pointer_puts
                self.pointer_puts += 1
        held = self.hold_first_pointer and order in (0, 1)
        if held and order == 0:
            self._second_arrived.wait(self.hold_s)  # neither is applied before both were sent
        elif held:
            self._second_arrived.set()
            self._first_applied.wait(self.hold_s)
        answer = self._forward(line + b"".join(headers) + b"Connection: close\r\n\r\n" + body)
        if held and order == 0:
            self._first_applied.set()
            self._answered.wait(self.hold_s)  # its writer hears back after the second's did
        head, sep, rest = answer.partition(b"\r\n\r\n")
        head = b"\r\n".join(h for h in head.split(b"\r\n") if not h.lower().startswith(b"connection:"))
        sock.sendall(head + b"\r\nConnection: close" + sep + rest)
        if held and order == 1:
            self._answered.set()

    def _forward(self, request: bytes) -> bytes:
        with socket.create_connection(self.upstream, timeout=30) as up:
            up.sendall(request)
            answer = b""
            while chunk := up.recv(1 << 16):
                answer += chunk
        return answer
