"""Who may ask, and what every answer carries: :class:`Guard`, the ASGI middleware around the app.

The first module a request passes through. Only ``GET``/``HEAD`` are served (the server only
reads); on loopback the ``Host`` header must be one the server printed (a page elsewhere cannot
reach it by rebinding a name to 127.0.0.1: DNS rebinding); beyond loopback the token printed at
start is asked for (Jupyter's way: ``?token=`` once, answered by a redirect that sets an
``HttpOnly``, ``SameSite=Strict`` cookie named for the port, compared in constant time); every
response gets :data:`SECURITY_HEADERS` (a strict Content-Security-Policy: ``default-src 'none'``,
images and the stylesheet from the server itself only; ``nosniff``, no referrer, no framing). A
failure inside the app is a page saying "internal error"; its traceback goes to the terminal,
never to the browser.
"""

from __future__ import annotations

import hmac
import secrets
import sys
import traceback
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CSP", "SECURITY_HEADERS", "TOKEN_COOKIE", "Guard", "cookie_name", "new_token"]

CSP = ("default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")  # fmt: skip
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
TOKEN_COOKIE = "rollout_bundle_serve_token"  # + "_<port>": cookies are shared by every port of a host


class Guard:
    """ASGI middleware around the app: only ``GET``/``HEAD``; the ``Host`` header checked on
    loopback (a page elsewhere cannot reach the server by rebinding a name to 127.0.0.1); the
    token when one is set; the security headers on every response."""

    def __init__(self, app: Any, *, token: str | None, allowed_hosts: list[str] | None,
                 error_page: Callable[[int, str, str], bytes]) -> None:  # fmt: skip
        self.app, self.token, self.allowed_hosts, self.error_page = app, token, allowed_hosts, error_page

    async def _page(self, send: Any, status: int, heading: str, message: str,
                    extra: list[tuple[bytes, bytes]] | None = None) -> None:  # fmt: skip
        body = self.error_page(status, heading, message)
        headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store")] + (extra or [])  # fmt: skip
        headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await self._page(send, 405, "read-only", f"this server only reads: {scope['method']} is not served",
                             [(b"allow", b"GET, HEAD")])  # fmt: skip
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.allowed_hosts is not None and headers.get("host", "").lower() not in self.allowed_hosts:
            await self._page(send, 400, "unknown host", "this server answers only to the address it printed")
            return
        if self.token is not None:
            query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = (query.get("token") or [None])[0]
            if given is not None:
                if not hmac.compare_digest(given.encode(), self.token.encode()):
                    await self._page(
                        send, 403, "wrong token", "the token does not match the one the server printed"
                    )
                    return
                rest = {k: v for k, v in query.items() if k != "token"}
                # One leading slash: "//host/..." would be another site's address.
                target = "/" + (scope.get("root_path", "") + scope["path"]).lstrip("/")
                if rest:
                    target += "?" + urllib.parse.urlencode(rest, doseq=True)
                body = b""
                await send({"type": "http.response.start", "status": 303, "headers": [
                    (b"location", urllib.parse.quote(target, safe="/?=&%").encode()),
                    (b"set-cookie", f"{cookie_name(scope)}={self.token}; HttpOnly; SameSite=Strict; Path=/".encode()),
                    (b"content-length", b"0"), (b"cache-control", b"no-store"),
                    *[(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
            cookie = _cookie(headers.get("cookie", ""), cookie_name(scope))
            if cookie is None or not hmac.compare_digest(cookie.encode(), self.token.encode()):
                await self._page(send, 403, "token required", "open the address with ?token=... that "
                                 "`rollout-bundle serve` printed when it started")  # fmt: skip
                return
        started = False

        async def guarded(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {k.lower() for k, _ in message.get("headers", [])}
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + [
                    (k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items() if k.encode() not in names
                ]
            await send(message)

        try:
            await self.app(scope, receive, guarded)
        except Exception:  # the page says "internal error"; the traceback is the terminal's
            traceback.print_exc(file=sys.stderr)
            if not started:
                await self._page(send, 500, "internal error", "the server failed on this page; "
                                 "its terminal shows why")  # fmt: skip


def cookie_name(scope: Mapping[str, Any]) -> str:
    """The token cookie of the server answering ``scope``: :data:`TOKEN_COOKIE` and its port."""
    server = scope.get("server") or ("", 0)
    return f"{TOKEN_COOKIE}_{server[1]}"


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def new_token() -> str:
    """A token for a server bound beyond loopback (printed once, at start)."""
    return secrets.token_urlsafe(32)
