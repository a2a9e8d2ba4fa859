"""The one Jinja2 environment of every page, and the one stylesheet.

Its one reason to change is how templates are found, loaded and escaped. Templates are looked up
by name in three folders, each read through its package (``jinja2.PackageLoader``, never a file
path): this package's (``macros.html.j2``, ``turn.html.j2``, ``sample_block.html.j2``: what every page
draws a sample with), then ``trainer_hooks.view``'s (the report and its search page), then
``trainer_hooks.serve``'s (the served pages, extending ``base.html.j2``). The folders are named,
not imported: this package imports neither ``view`` nor ``serve``.

The environment escapes every ``{{ value }}`` (``autoescape=True``, for every template, whatever
its name), so a prompt, an action, a file name or a replay message from a stranger's bundle lands
as text, and no template uses ``|safe`` (``tests/test_pages.py``, ``tests/test_view_templates.py``
and ``tests/test_serve.py`` check both, with hostile strings in every field). Undefined names are
errors (``StrictUndefined``), so a typo in a template fails the tests, not the page.

Every value a page prints goes through :func:`_printable` (Jinja2's ``finalize``): a text that
cannot be encoded as UTF-8 (a lone surrogate from a manifest's meta, a non-UTF-8 file name held
as ``surrogateescape``) is shown through :func:`bundles.support.display` instead of failing the
page. Names (a bundle's path, a note) are put through ``display`` where the page is assembled;
this is the net under them, so that no value from a bundle can make a page fail.

:func:`stylesheet` is ``style.css`` (the colours of badges, the layout of a sample) with the
overlay colour after it (``overlay.css.j2``): the report inlines both, the server serves them with
its own additions after them as ``/static/style.css``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

from bundles import BundleError
from bundles.support import display
from trainer_hooks.pages._graphics import OVERLAY_COLOR

__all__ = ["TEMPLATE_PACKAGES", "environment", "package_text", "render", "stylesheet"]

#: The packages whose ``templates/`` folders the environment reads, in the order names are looked up.
TEMPLATE_PACKAGES = ("trainer_hooks.pages", "trainer_hooks.view", "trainer_hooks.serve")


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
    """The one Jinja2 environment of every page: templates shipped in the packages, autoescaped."""
    try:
        import jinja2
    except ImportError:
        raise BundleError(
            "pages are written from Jinja2 templates: pip install 'rollout-bundles[view]'"
        ) from None
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.PackageLoader(p, "templates") for p in TEMPLATE_PACKAGES]),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,  # a template's text ends as its file does
        finalize=_printable,
        auto_reload=False,  # the package's templates do not change while serving: no stat per page
    )


def render(template: str, context: Mapping[str, Any]) -> str:
    """``template`` rendered with ``context``."""
    return str(environment().get_template(template).render(**context))


def package_text(package: str, name: str) -> str:
    """The text of ``templates/<name>`` shipped in ``package``, read through the package."""
    return resources.files(package).joinpath(f"templates/{name}").read_text("utf-8")


@functools.cache
def stylesheet() -> str:
    """The pages' stylesheet: ``style.css`` then the overlay colours (``overlay.css.j2``, which the
    report includes after it too); a page that adds rules of its own puts them after this."""
    colours = render("overlay.css.j2", {"overlay_color": OVERLAY_COLOR})
    return package_text("trainer_hooks.pages", "style.css") + "\n" + colours
