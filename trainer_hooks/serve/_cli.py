"""``rollout-bundle serve ROOT [--port N] [--host H] [--follow] [--cache-dir DIR]``."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bundles.support import CommandError, add_command, add_progress_option, display

__all__ = ["is_loopback", "register"]

DEFAULT_PORT = 8470
T = TypeVar("T")


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, ``localhost``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _parsed(text: str, convert: Callable[[str], T], expected: str) -> T:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, found {text!r}") from None


def _port(text: str) -> int:
    n = _parsed(text, int, "a port 0..65535")
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0..65535, found {n}")
    return n


def _seconds(text: str) -> float:
    s = _parsed(text, float, "seconds > 0")
    if not 0 < s < 86400:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, found {text!r}")
    return s


def _bind(host: str, port: int) -> tuple[socket.socket, int, str]:
    """A socket listening on ``host``:``port`` (a port 0 gets a free one), the port it got, and
    the host as an address shows it (``[::1]``). Bound first, so the address printed is the one
    served."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every answer on a kept-alive connection waits ~40 ms for the peer's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise CommandError(
            f"--host {host} --port {port}: cannot listen: {e.strerror or e}", status=2
        ) from None
    sock.listen(128)
    shown_host = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    return sock, sock.getsockname()[1], shown_host


def run_serve(ns: argparse.Namespace) -> int:
    """Bind, listen, then list the run: the socket answers while a run of 100,000 bundles is
    still being walked (its run page says how many were found so far)."""
    from trainer_hooks.serve._run import Run

    # A local ROOT that names nothing is refused before a missing extra, a socket or a cache
    # directory; what is under it (and a store URL) is listed once the server listens.
    for root in ns.root:
        if "://" not in root and not os.path.exists(root) and not ns.follow:
            raise CommandError(f"{display(root)}: no such directory or bundle, and no bundle under it")
    run, *others = [Run(root, list_now=False) for root in ns.root]
    try:
        import jinja2  # noqa: F401
        import PIL  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise CommandError(f"serve needs {e.name}: pip install 'rollout-bundles[serve]'", status=2) from None
    from trainer_hooks.serve._app import ServeApp, ServeConfig, default_cache_dir
    from trainer_hooks.serve._guard import new_token
    from trainer_hooks.serve._routes import asgi_app

    host = ns.host
    loopback = is_loopback(host)
    token = None if loopback else new_token()
    sock, port, shown_host = _bind(host, ns.port)
    allowed = None
    if loopback:
        allowed = [f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]", shown_host.lower())]
    cache_dir = Path(ns.cache_dir) if ns.cache_dir else default_cache_dir()
    config = ServeConfig(run.root, cache_dir, token=token, follow=ns.follow_interval if ns.follow else None,
                         progress=ns.progress, allowed_hosts=allowed)  # fmt: skip
    app = asgi_app(ServeApp(config, run, others))
    url = f"http://{shown_host}:{port}/"
    print(f"rollout-bundle serve: listing {display(run.root)}; indexes and thumbnails in {display(str(cache_dir))}",
          file=sys.stderr)  # fmt: skip
    if token is not None:
        print(
            f"rollout-bundle serve: listening on {host} beyond this machine: open {url}?token={token}",
            flush=True,
        )
    else:
        print(f"rollout-bundle serve: open {url}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                                           date_header=False, lifespan="on"))  # fmt: skip
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def register(subparsers: Any) -> None:
    """Add ``serve`` to a ``rollout-bundle`` parser."""
    p = add_command(
        subparsers,
        "serve",
        "serve a run's bundles as a local, read-only web application",
        run_serve,
        description="Serve a run (its --save or --dump-details directory, one bundle, or an s3:// / az:// prefix) "
        "as a read-only web application: every bundle with trends across steps; a bundle's samples filtered, "
        "sorted, searched and paged on the server from a per-bundle SQLite index built once (cached by the "
        "bundle's identity); each sample's screenshots with their actions drawn over them; one prompt across "
        "training; two bundles or two samples compared. Binds 127.0.0.1 unless --host widens it, and then asks "
        "for a token it prints once. Pages run no script.",
    )
    p.add_argument(
        "root", metavar="ROOT", nargs="+",
        help="a run directory, a bundle (directory or packed file) or a store URL; two or more runs are "
        "compared on /runs (the same prompts' reward and success per step, the prompts whose outcome "
        "differs most, one prompt's trajectories from both side by side)",
    )  # fmt: skip
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, metavar="N",
                   help=f"port to listen on (default {DEFAULT_PORT}; 0: a free one)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", metavar="H",
                   help="address to listen on (default 127.0.0.1; any other asks for the printed token)")  # fmt: skip
    p.add_argument(
        "--follow", action="store_true", help="pick up bundles committed while serving (a live run)"
    )
    p.add_argument("--follow-interval", type=_seconds, default=10.0, metavar="S",
                   help="seconds between listings of ROOT with --follow (default 10)")  # fmt: skip
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where indexes and thumbnails are kept (default ~/.cache/rollout-bundles/serve)")  # fmt: skip
    add_progress_option(p)
