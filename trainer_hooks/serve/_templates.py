"""The Jinja2 environment of the served pages: serve's templates, then view's.

Serve's own templates (``trainer_hooks/serve/templates``) extend ``base.html.j2``; the macros
that draw a sample's turns and its large views are view's (``macros.html.j2``,
``turn.html.j2``), loaded by package name, so a screenshot and its action look the same in a
static report and on the server. Everything is autoescaped (``autoescape=True`` for every
template), no template uses ``|safe``, and an undefined name is an error.

Every value a page prints goes through :func:`_printable` (Jinja2's ``finalize``): a text that
cannot be encoded as UTF-8 (a lone surrogate from a manifest's meta, a non-UTF-8 file name held
as ``surrogateescape``) is shown through :func:`bundles.support.display` instead of failing the
page. Names (a bundle's path, a note) are put through ``display`` where the page is assembled;
this is the net under them, so that no value from a bundle can make a page a 500.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from bundles import BundleError
from bundles.support import display

__all__ = ["environment", "stylesheet"]


def _printable(value: Any) -> Any:
    """``value``, or where it is a text UTF-8 cannot encode, that text shown by ``display``
    (its undecodable bytes and lone surrogates escaped, nothing cut)."""
    if type(value) is str and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return display(value, len(value) + 1)
    return value


@functools.cache
def environment() -> Any:
    try:
        import jinja2
    except ImportError:
        raise BundleError(
            "serve writes its pages from Jinja2 templates: pip install 'rollout-bundles[serve]'"
        ) from None
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [
                jinja2.PackageLoader("trainer_hooks.serve", "templates"),
                jinja2.PackageLoader("trainer_hooks.view", "templates"),
            ]
        ),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_printable,
        auto_reload=False,  # the package's templates do not change while serving: no stat per page
    )


@functools.cache
def stylesheet() -> bytes:
    """view's stylesheet, the overlay colours, then serve's additions: one file, served as ``'self'``."""
    from trainer_hooks.view import OVERLAY_COLOR

    view_css = resources.files("trainer_hooks.view").joinpath("templates/style.css").read_text("utf-8")
    serve_css = resources.files("trainer_hooks.serve").joinpath("templates/serve.css").read_text("utf-8")
    colours = (f".ov {{ stroke: {OVERLAY_COLOR}; }}\n.ov-fill {{ fill: {OVERLAY_COLOR}; }}\n"
               f"#arrow path {{ fill: {OVERLAY_COLOR}; }}\n")  # fmt: skip
    return (view_css + "\n" + colours + serve_css).encode("utf-8")
