"""Structure-aware fuzzing of what ``rollout-bundle view`` reads (issue 16): samples, actions and
replay reports built from the shapes view looks for, filled with any legal value.

Whatever the example, a page is written or a ``BundleError`` raised (a replay report that is
not one: ``ReportError``); never another exception. Samples go through ``write_bundle`` and are
read back, so the values are the ones a real bundle holds. ``FUZZ_EXAMPLES`` sets how many
examples each test runs (default 60; the CI profile is derandomized).
"""

from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import put_media
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from bundles import BundleError, MediaRef, UnsupportedValueError, write_bundle
from trainer_hooks.pages import Action, parse_action
from trainer_hooks.view import write_html_report

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("jinja2")

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture,
                HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip

text = st.text(max_size=40)
numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True), st.booleans()
)
arrays = st.one_of(
    st.builds(lambda n: np.arange(n, dtype=np.float32), st.integers(0, 6)),
    st.builds(lambda n: np.full((n, 3), 7, dtype=np.int64), st.integers(0, 3)),
    st.just(np.array([[1.0, np.inf, -1.0]])),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
)
leaves = st.one_of(st.none(), numbers, text, st.binary(max_size=16), arrays)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**400), st.floats(allow_nan=False), text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)

action_text = st.one_of(
    text,
    st.builds(lambda name, args: f"{name}({args})",
              st.sampled_from(["click", "double_click", "drag", "scroll", "type", "key", "hotkey", "moveTo",
                               "pyautogui.click", "wait", "unknown"]),
              st.lists(st.one_of(st.integers(-5000, 5000).map(str), st.floats().map(repr), text.map(repr),
                                 st.just("x=3"), st.just("((((")), max_size=5).map(", ".join)),
    st.builds(lambda action, args: json.dumps({"name": "computer_use", "arguments": {"action": action, **args}}),
              st.sampled_from(["left_click", "left_click_drag", "scroll", "type", "key", "mouse_move", "zap"]),
              st.dictionaries(st.sampled_from(["coordinate", "start_coordinate", "text", "keys", "scroll_direction",
                                               "scroll_amount", "pixels", "path"]), json_values, max_size=4)),
)  # fmt: skip


def png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (48, 27), (seed % 256, 90, 160)).save(out, "PNG")
    return out.getvalue()


@st.composite
def samples(draw: Any, refs: list[MediaRef]) -> dict[str, Any]:
    keys = ["index", "group_index", "status", "reward", "tokens", "response", "response_length", "prompt",
            "loss_mask", "rollout_log_probs", "advantages"]  # fmt: skip
    s: dict[str, Any] = {k: draw(values) for k in draw(st.lists(st.sampled_from(keys), unique=True))}
    images = draw(st.lists(st.one_of(st.sampled_from(refs), text, values), max_size=4))
    s["multimodal_inputs"] = draw(st.one_of(st.just({"images": images}), values))
    s["multimodal_train_inputs"] = draw(st.one_of(st.just({"image_grid_thw": draw(values)}), values))
    actions = draw(st.one_of(st.lists(action_text, max_size=4), values))
    s["metadata"] = draw(st.one_of(st.just({"actions": actions, "screen": draw(values)}), values))
    if draw(st.booleans()):
        s["response"] = "".join(
            f"<tool_call>{a}</tool_call>" for a in draw(st.lists(action_text, max_size=3))
        )
    return s


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[MediaRef]]:
    run = tmp_path_factory.mktemp("run")
    refs = [MediaRef.from_file(put_media(run, png(k))) for k in range(3)]
    refs.append(MediaRef.from_file(put_media(run, b"%!PS-Adobe-3.0 EPSF-3.0\n", ".png")))
    refs.append(MediaRef.from_file(put_media(run, png(9) + b"<script>", ".html")))
    return run, refs


@FUZZ
@given(data=st.data())
def test_any_samples_give_a_page_or_a_bundle_error(
    tmp_path_factory: pytest.TempPathFactory, media: tuple[Path, list[MediaRef]], data: Any
) -> None:
    run, refs = media
    rows = data.draw(st.lists(samples(refs), min_size=1, max_size=4))
    tmp = tmp_path_factory.mktemp("fuzz")
    try:
        bundle = write_bundle(tmp / "b", rows, media_roots=[run], outside_paths="keep")
    except (UnsupportedValueError, BundleError, ValueError, TypeError):
        assume(False)  # a value the format does not store: not view's input
    try:
        written = write_html_report(bundle, tmp / "r.html")
    except BundleError:
        return
    text = (tmp / "r.html").read_text()
    assert written.samples == len(rows) and "<script" not in text.lower()


@settings(max_examples=EXAMPLES * 5)
@given(action_text)
@example(
    json.dumps({"arguments": {"action": "left_click", "coordinate": [1, 10**400]}})
)  # found: OverflowError
@example("click(" * 3000)
def test_any_action_text_parses_or_is_shown_as_text(s: str) -> None:
    a = parse_action(s)
    assert isinstance(a, Action) and isinstance(a.describe(), str)
    assert all(isinstance(c, float) for p in a.points for c in p)
    if a.kind == "text":
        assert a.points == [] and a.raw == s


REPORT = {
    "format": "rollout-bundle-replay",
    "version": 1,
    "bundle": "b",
    "dtype": "bf16",
    "processor": {"merge_size": 2},
    "summary": {"samples": 1, "images": 1, "vision_tokens": 4, "bytes_before_cast": 10, "bytes_after_cast": 5,
                "peak_rss_bytes": 100, "problems": {"guard": 1}},
    "samples": [{"position": 0, "index": 0, "problems": [{"kind": "guard", "message": "m", "image": 0}],
                 "images": [{"image": 0, "vision_tokens": 4, "placeholder_tokens": 4,
                             "pixel_values": {"shape": [16, 1176], "dtype": "bfloat16"}}],
                 "logprob_diff": {"max_abs": 0.1, "mean_abs": 0.01, "tokens": 3, "recomputed": [-0.1, -0.2, -0.3]}}],
}  # fmt: skip


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@FUZZ
@given(data=st.data())
def test_any_replay_report_gives_a_page_or_a_report_error(
    tmp_path_factory: pytest.TempPathFactory, media: tuple[Path, list[MediaRef]], data: Any
) -> None:
    """A valid report, then a few of its values (at any depth) replaced by any JSON value."""
    run, refs = media
    tmp = tmp_path_factory.mktemp("fuzz")
    bundle = write_bundle(tmp / "b", [{"multimodal_inputs": {"images": refs[:2]}, "rollout_log_probs": [-0.1] * 3,
                                       "metadata": {"actions": ["click(1, 2)"]}}], media_roots=[run])  # fmt: skip
    report = copy.deepcopy(REPORT)
    report["bundle"] = str(bundle)
    for _ in range(data.draw(st.integers(1, 4))):
        paths = [p for p in _paths(report) if p and p[0] not in ("format", "version", "bundle")]
        path = data.draw(st.sampled_from(paths))
        parent = report
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = data.draw(json_values)
    report = json.loads(json.dumps(report))  # what a report file read back holds
    try:
        write_html_report(bundle, tmp / "r.html", replay=report)
    except BundleError:
        return
    assert "<script" not in (tmp / "r.html").read_text().lower()
