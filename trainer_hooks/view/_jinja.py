"""The Jinja2 environment: where the templates come from and how they escape.

Its one reason to change is how templates are loaded and escaped. The environment escapes every
``{{ value }}`` (``autoescape=True``, for every template, whatever its name), so a prompt, an
action, a file name or a replay message from a stranger's bundle lands as text, and no template
uses ``|safe`` (``tests/test_view_templates.py`` checks both, with hostile strings in every
field). Undefined names are errors (``StrictUndefined``), so a typo in a template fails the
tests, not the page.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from bundles import BundleError

__all__ = ["environment", "render_page"]


@functools.cache
def environment() -> Any:
    """The one Jinja2 environment of the page: templates shipped in the package, autoescaped."""
    try:
        import jinja2
    except ImportError:
        raise BundleError(
            "view writes its page from Jinja2 templates: pip install 'rollout-bundles[view]'"
        ) from None

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trainer_hooks.view", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return env


def render_page(context: Mapping[str, Any]) -> str:
    return str(environment().get_template("report.html.j2").render(**context))
