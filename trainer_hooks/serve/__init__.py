"""``rollout-bundle serve ROOT``: a local, read-only web application over a run's bundles.

:func:`create_app` builds the ASGI application (Starlette) for ROOT (a run directory, one
bundle, or a store URL); the CLI (:mod:`trainer_hooks.serve._cli`) runs it under uvicorn on
127.0.0.1 unless ``--host`` widens it, with a token then. What it shows: the run (every bundle,
trends across steps), a bundle's samples (filtered, sorted, searched and paged on the server
from a per-bundle SQLite index), a sample (every turn's screenshot with its action drawn as
``view`` draws it), one prompt across training, and two bundles or two samples compared. Given
two roots or more (``serve RUN_A RUN_B``), ``/runs`` compares the runs on the prompts they share.
docs/SERVE.md says what is cached where and why SQLite.

The modules, by job, in the order a request passes through them (each once; none calls back
into one above it):

1. ``_guard``: authentication and headers (:class:`~trainer_hooks.serve._guard.Guard`, ASGI
   middleware): only ``GET``/``HEAD``, the ``Host`` header, the token beyond loopback, the
   security headers on every answer;
2. ``_routes``: the Starlette wiring (:func:`create_app`): the address to its page, an error as
   a page, the pictures and the stylesheet;
3. ``_query``: the request's values parsed (a position, the bundle page's filters, sort and
   keyset page); what does not parse is a 400 page;
4. ``_pages``: page assembly, one function per page: it asks ``_app`` for its data and builds
   its parts with ``_parts``; ``_versus``, the runs side by side (``/runs``), the same way;
5. ``_app``: the state behind the pages (:class:`~trainer_hooks.serve._app.ServeApp`): the run
   (``_run``: finding the bundles), their indexes (``_index``: build and queries), the pictures
   (``_media``: decoded once, cached by digest), the samples, the replay reports, the ``diff``
   pool;
6. ``_parts``: parts of a page as plain data (a sample, a trend, a comparison); a sample's
   block, the formats and the template rendering are the presentation layer's,
   :mod:`trainer_hooks.pages`, shared with ``view`` (the one Jinja2 environment, reading
   ``templates/`` here by package name, and the one stylesheet, ``templates/serve.css`` after it).

A sample page, for instance: ``Guard`` → the ``/b/{bid}/s/{pos}`` route → ``parse_int`` →
``_pages.sample_page`` → ``ServeApp`` (its view from the index or the bundle, its row, its
pictures, its replay verdicts) → ``_parts.sample_context`` → ``trainer_hooks.pages.render``.
``_cli`` is the command.
"""

from trainer_hooks.serve._app import default_cache_dir
from trainer_hooks.serve._cli import register as register_commands
from trainer_hooks.serve._guard import CSP, SECURITY_HEADERS, TOKEN_COOKIE
from trainer_hooks.serve._routes import create_app

__all__ = ["CSP", "SECURITY_HEADERS", "TOKEN_COOKIE", "create_app", "default_cache_dir", "register_commands"]
