"""The page's HTML comes from Jinja2 templates with autoescaping (issue 17): a hostile string in
every field a bundle or a replay report can set lands escaped. Turning autoescape off, or marking
a value ``|safe`` in a template, fails these tests."""

from __future__ import annotations

import html
import io
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media

from bundles import MediaRef, open_bundle, write_bundle
from trainer_hooks.replay import bundle_identity
from trainer_hooks.view import write_html_report

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("jinja2")

TEMPLATES = Path(__file__).resolve().parents[1] / "trainer_hooks" / "view" / "templates"


def mark(n: int) -> str:
    """A distinct piece of markup per field: found raw, it would be an element on the page."""
    return f"<i data-x=F{n}>'&</i>"


def escaped(n: int) -> str:
    return html.escape(mark(n), quote=True).replace("&#x27;", "&#39;")


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 18), (10, 20, 30)).save(out, "PNG")
    return out.getvalue()


def hostile_bundle(tmp_path: Path) -> tuple[Path, dict[str, Any], int]:
    n = iter(range(1000))
    run = tmp_path / "run"
    img = MediaRef.from_file(put_media(run, png()))
    sample = {
        "index": mark(next(n)),
        "group_index": mark(next(n)),
        "status": mark(next(n)),
        "reward": mark(next(n)),
        "response_length": mark(next(n)),
        "prompt": [
            {"role": mark(next(n)), "content": mark(next(n))},
            {"role": "user", "content": [{"type": "text", "text": mark(next(n))}, {"type": mark(next(n))}]},
        ],
        "response": mark(next(n)),
        "multimodal_inputs": {"images": [img, mark(next(n))]},
        "metadata": {mark(next(n)): mark(next(n)), "actions": [mark(next(n)), mark(next(n))]},
        mark(next(n)): mark(next(n)),  # an unknown field: its name and its value
    }
    second = {"prompt": mark(next(n)), "response": "ok", "status": "completed"}
    meta = {
        "run_uuid": mark(next(n)),
        "rollout_id": mark(next(n)),
        "training_dtype": mark(next(n)),
        "processor": {mark(next(n)): mark(next(n))},
        "metadata": {mark(next(n)): mark(next(n))},
        mark(next(n)): mark(next(n)),
    }
    bundle = write_bundle(tmp_path / f"dump{mark(next(n))}", [sample, second], media_roots=[run], meta=meta)
    report = {
        "format": "rollout-bundle-replay",
        "version": 1,
        "bundle_id": bundle_identity(open_bundle(bundle)),
        "bundle": mark(next(n)),
        "dtype": mark(next(n)),
        "processor": {mark(next(n)): mark(next(n))},
        "summary": {"samples": mark(next(n)), "images": mark(next(n)), "vision_tokens": mark(next(n)),
                    "bytes_before_cast": mark(next(n)), "bytes_after_cast": 1,
                    "problems": {mark(next(n)): mark(next(n))},
                    "logprob": {"samples": mark(next(n)), "k3": mark(next(n)), "tis_cap": mark(next(n)),
                                "tokens": mark(next(n)), "mean_abs": {q: mark(next(n)) for q in ("mean", "p50", "p99", "max")}}},
        "samples": [{
            "position": 0,
            "problems": [{"kind": mark(next(n)), "message": mark(next(n)), "image": mark(next(n))}],
            "images": [{"image": 0, "vision_tokens": 4, "placeholder_tokens": 5,
                        "pixel_values": {"dtype": mark(next(n)), "shape": mark(next(n))}}],
            "logprob_diff": {"max_abs": mark(next(n)), "mean_abs": mark(next(n)), "tokens": mark(next(n)),
                             "k3": mark(next(n)), "tis_clipped": mark(next(n)),
                             "first_over": {"turn": mark(next(n)), "offset": mark(next(n)), "token": mark(next(n))},
                             "turns": [{"turn": mark(next(n)), "start": mark(next(n)), "tokens": mark(next(n)),
                                        "mean_abs": mark(next(n)), "max_abs": mark(next(n))}, {"turn": 1}]},
        }],
    }  # fmt: skip
    return bundle, report, next(n)


def test_hostile_strings_in_every_field_land_escaped(tmp_path: Path) -> None:
    bundle, report, fields = hostile_bundle(tmp_path)
    out = tmp_path / "r.html"
    write_html_report(bundle, out, replay=report)
    text = out.read_text()
    assert "<i data-x" not in text and "<script" not in text.lower()
    missing = [n for n in range(fields) if escaped(n) not in text]
    assert missing == [], f"fields not on the page, or not escaped as expected: {missing}"


def test_templates_ship_as_package_data_and_the_view_extra_exists() -> None:
    pyproject = (TEMPLATES.parents[2] / "pyproject.toml").read_text()
    assert '"view/templates/*"' in pyproject  # [tool.setuptools.package-data] trainer_hooks
    assert re.search(r'^view = \[.*"jinja2>=3.1".*"pillow>=10".*\]$', pyproject, re.M)
    assert {p.suffix for p in TEMPLATES.iterdir()} <= {".j2", ".css", ".js"}
