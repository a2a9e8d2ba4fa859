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


def test_place_file_links_copies_and_never_places_a_file_swapped_in(tmp_path):
    """The one "hard-link, else copy" of the tools built on bundles (the journal, a resume)."""
    import os

    from bundles import UnsafeBundleError

    src = tmp_path / "a.png"
    src.write_bytes(b"screenshot")
    assert support.place_file(src, tmp_path / "linked") == "hardlink"
    assert os.stat(tmp_path / "linked").st_ino == os.stat(src).st_ino
    assert support.place_file(src, tmp_path / "linked") == "exists"
    assert support.place_file(src, tmp_path / "copied", link="copy") == "copy"
    assert os.stat(tmp_path / "copied").st_ino != os.stat(src).st_ino
    assert (tmp_path / "copied").read_bytes() == b"screenshot"
    # A symlink is linked as a link (never followed), so a placed "file" cannot reach outside.
    (tmp_path / "evil").symlink_to("/etc/passwd")
    support.place_file(tmp_path / "evil", tmp_path / "placed-link")
    assert (tmp_path / "placed-link").is_symlink()
    # Opened first, then swapped: the link would be another inode, so nothing is placed.
    (tmp_path / "other").write_bytes(b"someone else's file")
    with open(src, "rb") as opened:
        os.replace(tmp_path / "other", src)
        with pytest.raises(UnsafeBundleError, match="replaced while it was being linked"):
            support.place_file(src, tmp_path / "swapped", opened=opened)
        assert not (tmp_path / "swapped").exists()
        # A copy reads the file that was opened, not the one now at the path.
        assert support.place_file(src, tmp_path / "copy-of-opened", link="copy", opened=opened) == "copy"
        assert (tmp_path / "copy-of-opened").read_bytes() == b"screenshot"


def test_gc_paused_pauses_the_collector_and_gives_it_back_as_it_found_it():
    import gc

    from bundles.support import gc_paused

    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner exit leaves it paused
            pass
        assert not gc.isenabled()
        raise KeyError("x")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
