"""bundles.support: the public module set for tools built on bundles (issue 17 item 1).

Its names are public API (trainer_hooks and the CLI import them instead of bundles' private
modules); names that moved there from the format API keep an alias that warns for one release.
"""

from __future__ import annotations

import warnings

import pytest

import bundles
import bundles.cli
from bundles import support


def test_support_declares_its_audience_and_every_name_resolves():
    assert support.__doc__ and "trainer_hooks" in support.__doc__ and "Stability" in support.__doc__
    assert len(set(support.__all__)) == len(support.__all__)
    for name in support.__all__:
        assert getattr(support, name) is not None, name


def test_not_about_bundles_is_not_in_the_format_api():
    # scratch_dir, the CLI kit and Progress are support, not format API.
    assert "scratch_dir" not in bundles.__all__
    assert set(bundles.cli.__all__) == {"main", "register"}


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (bundles, "scratch_dir"),
        (bundles.cli, "Progress"),
        (bundles.cli, "CommandError"),
        (bundles.cli, "add_command"),
        (bundles.cli, "build_parser"),
        (bundles.cli, "run_command"),
    ],
)
def test_moved_names_keep_a_deprecated_alias(module, name):
    with pytest.warns(DeprecationWarning, match=f"use bundles.support.{name}"):
        alias = getattr(module, name)
    assert alias is getattr(support, name)


def test_unknown_names_still_raise_attribute_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            bundles.no_such_name  # noqa: B018
        with pytest.raises(AttributeError):
            bundles.cli.no_such_name  # noqa: B018
