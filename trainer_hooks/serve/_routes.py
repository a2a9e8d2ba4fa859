"""Routes and wiring: :func:`create_app` (Starlette), every route read-only and escaped.

Routes (all ``GET``/``HEAD``; any other method is refused with a page):

- ``/``: the run, one row per bundle and trend plots across steps;
- ``/b/<id>``: a bundle's samples, filtered, sorted and paged on the server from its index
  (``q``, ``status``, ``group``, ``reward_min/max``, ``length_min/max``, ``turns_min/max``,
  ``sort``, ``order``, ``after``); ``/b/<id>/groups`` and ``/b/<id>/group?g=`` the GRPO groups;
- ``/b/<id>/s/<pos>``: one sample, every turn's screenshot with its action drawn over it;
- ``/b/<id>/img/<name>?w=320|1280|1920``: a stored screenshot, decoded and re-encoded as JPEG;
- ``/prompt?key=...&a=<id>&b=<id>``: one prompt across training;
- ``/compare?a=<id>&b=<id>`` (what ``rollout-bundle diff`` reports) and
  ``/compare/samples?a=<id>&i=<pos>&b=<id>&j=<pos>``.

Safety, route by route: a bundle is named by its opaque id and nothing else
(:meth:`trainer_hooks.serve._run.Run.get`), a picture by a media name its manifest lists
(:class:`trainer_hooks.serve._media.Pictures`), so no URL text reaches a filesystem path or a
store key. Every value from a bundle reaches the page through Jinja2's autoescaping (no
``|safe``), pages carry no script, and every response has a strict Content-Security-Policy
(``default-src 'none'``; images and the stylesheet from the server itself only), ``nosniff``,
no referrer, no framing. Errors are HTML pages; a traceback goes to the terminal, never to the
browser. Beyond loopback, :class:`Guard` asks for the token printed at start (Jupyter's way:
``?token=`` once, then a cookie).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bundles import BundleError
from bundles.support import LIMITS, display
from trainer_hooks import pages
from trainer_hooks.pages import package_text
from trainer_hooks.serve import _pages
from trainer_hooks.serve._app import ServeApp, ServeConfig, default_cache_dir
from trainer_hooks.serve._guard import Guard
from trainer_hooks.serve._media import WIDTHS
from trainer_hooks.serve._query import PageError, parse_int
from trainer_hooks.serve._run import BundleEntry, Run
from trainer_hooks.serve._versus import runs_page

__all__ = ["asgi_app", "create_app", "stylesheet"]

MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]  # of an error message on a page


@functools.cache
def stylesheet() -> bytes:
    """What ``/static/style.css`` serves: the pages' stylesheet (:func:`trainer_hooks.pages.stylesheet`),
    then serve's own rules (``templates/serve.css``)."""
    return (pages.stylesheet() + package_text("trainer_hooks.serve", "serve.css")).encode("utf-8")


def create_app(
    root: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    follow: float | None = None,
    progress: bool | None = False,
    storage_options: dict[str, Any] | None = None,
    allowed_hosts: list[str] | None = None,
    list_in_background: bool = False,
    more_roots: Sequence[str | os.PathLike[str]] = (),
) -> Any:
    """The ASGI application serving the run (or bundle) at ``root``, read-only.

    Args:
        root: a run directory, a bundle (directory or packed file), or a store URL.
        more_roots: other runs, compared with ``root``'s on ``/runs`` (their bundles' pages too).
        cache_dir: where indexes and thumbnails are kept (default ``~/.cache/rollout-bundles/serve``).
        token: when set, every request must carry it (``?token=`` once, then a cookie).
        follow: list ``root`` again every ``follow`` seconds, adding bundles committed since.
        progress: draw a progress line while an index builds (None: on a terminal).
        storage_options: for a store URL, as :func:`bundles.open_bundle` takes them.
        allowed_hosts: ``Host`` headers answered (``["127.0.0.1:8000", "localhost:8000"]``);
            None answers any.
        list_in_background: list ``root`` in a thread, as ``rollout-bundle serve`` does (the
            app answers at once; the run page says how many bundles were found so far);
            False lists it before this returns.

    Returns:
        A Starlette application; ``app.state.serve`` is the state behind it (its ``close()``
        stops the background threads; the app's shutdown calls it).
    """
    from starlette.applications import Starlette  # noqa: F401  (the [serve] extra, checked first)

    config = ServeConfig(str(os.fspath(root)), Path(cache_dir) if cache_dir is not None else default_cache_dir(),
                         token=token, follow=follow, progress=progress, storage_options=storage_options,
                         allowed_hosts=allowed_hosts)  # fmt: skip
    run = Run(config.root, storage_options, list_now=not list_in_background)
    others = [Run(str(os.fspath(r)), storage_options, list_now=not list_in_background) for r in more_roots]
    return asgi_app(ServeApp(config, run, others))


def asgi_app(state: ServeApp) -> Any:
    """The Starlette application over ``state`` (what :func:`create_app` returns).

    Its routes are :func:`_page_routes` (HTML pages) and :func:`_asset_routes` (pictures, the
    stylesheet); an unknown address or a refused method is :func:`_http_error`'s page; the app's
    shutdown closes ``state``; :class:`Guard` wraps it all.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        state.close()

    app = Starlette(routes=[*_page_routes(state), *_asset_routes(state)],
                    exception_handlers={HTTPException: _http_error(state)}, lifespan=lifespan)  # fmt: skip
    app.state.serve = state
    app.add_middleware(
        Guard, token=state.config.token, allowed_hosts=state.config.allowed_hosts, error_page=state.error_page
    )
    return app


def _html(text: str, status: int = 200) -> Any:
    """An HTML response never cached (pages follow the index as it grows)."""
    from starlette.responses import HTMLResponse

    return HTMLResponse(text, status_code=status, headers={"cache-control": "no-store"})


def _error_html(state: ServeApp, status: int, heading: str, message: str) -> Any:
    return _html(state.error_page(status, heading, message).decode(), status)


def _page(state: ServeApp, fn: Callable[[Any], str]) -> Callable[[Any], Any]:
    """An endpoint answering ``fn(request)``'s HTML; a refused request or an unreadable bundle is a page."""

    def endpoint(request: Any) -> Any:
        try:
            return _html(fn(request))
        except PageError as e:
            return _error_html(state, e.status, e.heading, e.message)
        except BundleError as e:  # the bundle's problem, named: a page, not a traceback
            return _error_html(state, 502, "cannot read the bundle", display(str(e), MAX_SHOWN_CHARS))
        except sqlite3.DatabaseError:  # a cached index damaged after it was opened; its path is not shown
            return _error_html(state, 503, "index unreadable", "this bundle's cached index cannot be read; "
                               "delete serve's cache (--cache-dir) to have it built again")  # fmt: skip

    return endpoint


def _page_routes(state: ServeApp) -> list[Any]:
    """The HTML pages: the run, a bundle (its groups, a group, a sample), a prompt, the comparisons."""
    from starlette.routing import Route

    def bundle_id(request: Any) -> BundleEntry:
        return state.entry(request.path_params["bid"])

    def group(request: Any) -> str:
        g = request.query_params.get("g", "")
        if not g or len(g) > 200:
            raise PageError(400, "no group", "g: expected a group name from the groups page")
        return _pages.group_page(state, bundle_id(request), g)

    def sample(request: Any) -> str:
        return _pages.sample_page(
            state, bundle_id(request), parse_int(request.path_params["pos"], "position")
        )

    def compare(request: Any) -> str:
        p = request.query_params
        return _pages.compare_page(state, state.entry(p.get("a", "")), state.entry(p.get("b", "")))

    def compare_samples(request: Any) -> str:
        p = request.query_params
        return _pages.compare_samples_page(state, state.entry(p.get("a", "")), parse_int(p.get("i", ""), "i"),
                                          state.entry(p.get("b", "")), parse_int(p.get("j", ""), "j"))  # fmt: skip

    pages: list[tuple[str, Callable[[Any], str]]] = [
        ("/", lambda request: _pages.run_page(state, request.query_params)),
        ("/b/{bid}", lambda request: _pages.bundle_page(state, bundle_id(request), request.query_params)),
        (
            "/b/{bid}/groups",
            lambda request: _pages.groups_page(state, bundle_id(request), request.query_params),
        ),
        ("/b/{bid}/group", group),
        ("/b/{bid}/s/{pos}", sample),
        ("/prompt", lambda request: _pages.prompt_page(state, request.query_params)),
        ("/runs", lambda request: runs_page(state, _pages.TREND_BUNDLES, request.query_params)),
        ("/compare", compare),
        ("/compare/samples", compare_samples),
    ]
    return [Route(path, _page(state, fn)) for path, fn in pages]


def _asset_routes(state: ServeApp) -> list[Any]:
    """What a page loads: a bundle's pictures as JPEG, the stylesheet, and no favicon."""
    from starlette.responses import Response
    from starlette.routing import Route

    def image(request: Any) -> Any:
        try:
            entry = state.entry(request.path_params["bid"])
            w = parse_int(request.query_params.get("w", "320"), "w")
            if w not in WIDTHS:
                raise PageError(
                    400, "bad width", f"w: expected one of {', '.join(map(str, WIDTHS))}, found {w}"
                )
            data = state.image(entry, request.path_params["name"], w)
        except PageError as e:
            return _error_html(state, e.status, e.heading, e.message)
        except BundleError as e:
            return _error_html(state, 502, "cannot read the picture", display(str(e), MAX_SHOWN_CHARS))
        return Response(
            data, media_type="image/jpeg", headers={"cache-control": "private, max-age=86400, immutable"}
        )

    def style(request: Any) -> Any:
        return Response(stylesheet(), media_type="text/css; charset=utf-8",
                        headers={"cache-control": "private, max-age=3600"})  # fmt: skip

    return [
        Route("/static/style.css", style),
        Route("/favicon.ico", lambda request: Response(status_code=204)),  # no icon; no 404 in the console
        Route("/b/{bid}/img/{name}", image),
    ]


def _http_error(state: ServeApp) -> Callable[[Any, Exception], Any]:
    """The handler of Starlette's HTTP exceptions (no route, a refused method): a page."""
    from starlette.exceptions import HTTPException

    def handler(request: Any, exc: Exception) -> Any:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        heading = "not found" if status == 404 else "refused"
        return _error_html(state, status, heading, "no page of this server has that address")

    return handler
