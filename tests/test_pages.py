"""The presentation layer (``trainer_hooks.pages``, issue 37): one Jinja2 environment, one
stylesheet, one status class and one replay block for ``view`` and ``serve``.

The environment escapes everything and no template of any folder it reads opts out; a report
rendered with autoescape off puts hostile markup on the page raw, which the escaping tests of
``test_view_templates.py`` would then find.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_view_templates import hostile_bundle

from trainer_hooks import pages
from trainer_hooks.view import write_html_report

pytest.importorskip("PIL.Image")
jinja2 = pytest.importorskip("jinja2")

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [ROOT / p.replace(".", "/") / "templates" for p in pages._jinja.TEMPLATE_PACKAGES]


def test_one_environment_reads_every_template_folder_escapes_and_none_opts_out() -> None:
    env = pages.environment()
    assert env.autoescape is True
    assert [f.parent.name for f in FOLDERS] == ["pages", "view", "serve"]
    for folder in FOLDERS:
        for path in folder.glob("*.j2"):
            source = path.read_text()
            for opt_out in ("|safe", "| safe", "autoescape false", "Markup"):
                assert opt_out not in source, f"{path.name}: {opt_out}"
            env.get_template(path.name)  # found by name, whichever folder holds it
    names = [p.name for folder in FOLDERS for p in folder.iterdir()]
    assert len(names) == len(set(names)), "a template name in two folders: one would hide the other"


def test_the_escaping_test_catches_a_template_without_autoescape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same templates rendered with autoescape off put the hostile markup on the page raw:
    what the escaping test of ``test_view_templates.py`` would then find."""
    bundle, report, _ = hostile_bundle(tmp_path)
    unsafe = jinja2.Environment(
        loader=jinja2.FileSystemLoader(FOLDERS), autoescape=False, undefined=jinja2.StrictUndefined
    )
    monkeypatch.setattr(pages._jinja, "environment", lambda: unsafe)
    write_html_report(bundle, tmp_path / "unsafe.html", replay=report)
    assert "<i data-x" in (tmp_path / "unsafe.html").read_text()


def test_the_stylesheet_is_one_file_with_the_overlay_colour_and_every_status_class() -> None:
    css = pages.stylesheet()
    assert css.startswith(pages.package_text("trainer_hooks.pages", "style.css"))
    assert f".ov {{ stroke: {pages.OVERLAY_COLOR}; }}" in css
    for cls in set(pages.STATUS_CLASS.values()):
        assert re.search(rf"\.badge\.{cls}\b", css), cls  # every status class has its colour
    assert pages.badge("Failed") == {"cls": "bad", "text": "Failed"}
    assert pages.badge(None) == {"cls": "", "text": "no status"}


def test_the_templates_ship_as_package_data() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    for folder in FOLDERS:
        assert f'"{folder.parent.name}/templates/*"' in pyproject


def test_a_replay_block_names_each_problem_bounded_and_says_what_is_missing() -> None:
    assert pages.replay_block(None) == {"missing": True, "problems": [], "diff": None, "strips": None}
    block = pages.replay_block({
        "problems": [{"kind": "k" * 100, "message": "m" * 5000, "image": 2}, "not a problem"],
        "logprob_diff": {"max_abs": 0.25, "mean_abs": None, "tokens": 10},
    })  # fmt: skip
    (p,) = block["problems"]
    assert p["kind"] == "k" * 40 and p["message"] == "m" * 2000 + " (image 2)"
    assert block["diff"] == {"max": "0.25", "mean": "–", "tokens": "10", "k3": None, "tis_clipped": None,
                             "first_over": None, "turns": [], "more_turns": 0}  # fmt: skip
    assert not block["missing"] and block["strips"] is None  # no recomputed log-probs: nothing to draw
