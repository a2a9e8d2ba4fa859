"""``rollout-bundle serve ROOT``: a local, read-only web application over a run's bundles.

:func:`create_app` builds the ASGI application (Starlette) for ROOT (a run directory, one
bundle, or a store URL); the CLI (:mod:`trainer_hooks.serve._cli`) runs it under uvicorn on
127.0.0.1 unless ``--host`` widens it, with a token then. What it shows: the run (every bundle,
trends across steps), a bundle's samples (filtered, sorted, searched and paged on the server
from a per-bundle SQLite index), a sample (every turn's screenshot with its action drawn as
``view`` draws it), one prompt across training, and two bundles or two samples compared.
docs/SERVE.md says what is cached where and why SQLite.

The modules, by concern: ``_run`` (finding the bundles), ``_index`` (the index: build and
queries), ``_media`` (pictures, decoded once, cached by digest), ``_pages`` (page data),
``_templates`` (Jinja2), ``_app`` (routes, the guard), ``_cli`` (the command).
"""

from trainer_hooks.serve._app import CSP, SECURITY_HEADERS, TOKEN_COOKIE, create_app, default_cache_dir
from trainer_hooks.serve._cli import register as register_commands

__all__ = ["CSP", "SECURITY_HEADERS", "TOKEN_COOKIE", "create_app", "default_cache_dir", "register_commands"]
