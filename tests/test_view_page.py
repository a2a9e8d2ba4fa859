"""The view page in a real headless Chromium (issue 21): overlays where the actions say, CSS-only
filters, sorting and groups, histograms, no request leaving the page, no script running."""

from __future__ import annotations

import io
import json
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from helpers import put_media
from helpers.browser import INSTALL_HINT, find_chromium, render

from bundles import MediaRef, pack_bundle, write_bundle
from trainer_hooks.view import write_html_report

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("jinja2")

W, H = 1280, 720
MAGENTA = (255, 43, 214)  # the page's overlay colour (trainer_hooks.pages.OVERLAY_COLOR)
HOSTILE_PROMPT = (
    "<script>document.title='pwned'</script><img src=http://127.0.0.1:9/img.png onerror=\"document.title='x'\">"
    "</style><style>body{background:url(http://127.0.0.1:9/css.png)}</style>"
    "<link rel=stylesheet href=http://127.0.0.1:9/s.css><iframe src=http://127.0.0.1:9/f></iframe>"
)


def need_chromium() -> None:
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail(INSTALL_HINT + " (.ci/run installs it)")
        pytest.skip(INSTALL_HINT)


def white(seed: int) -> bytes:
    """A plain white 1280x720 screenshot with a grey bar whose width depends on ``seed``, so
    each is a distinct file: nothing on it is magenta."""
    im = Image.new("RGB", (W, H), (255, 255, 255))
    im.paste((200, 200, 200), (0, 0, 40 + seed, 12))
    out = io.BytesIO()
    im.save(out, "PNG")
    return out.getvalue()


def drag_call() -> str:
    args = {"action": "left_click_drag", "start_coordinate": [100, 100], "coordinate": [600, 400]}
    return "<tool_call>" + json.dumps({"name": "computer_use", "arguments": args}) + "</tool_call>"


def page_dump(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shot = [MediaRef.from_file(put_media(run, white(k))) for k in range(6)]
    html_media = MediaRef.from_file(
        put_media(run, white(99) + b"<script>document.title='pwned'</script>", ".html")
    )
    samples: list[dict[str, Any]] = [
        {"group_index": 0, "index": 0, "reward": 1.0, "status": "completed", "prompt": HOSTILE_PROMPT,
         "response": "<tool_call>click(320, 180)</tool_call>", "response_length": 10,
         "rollout_log_probs": [-0.1] * 10, "multimodal_inputs": {"images": [shot[0]]},
         "metadata": {"actions": ["click(320, 180)"], "screen": [W, H]}},
        {"group_index": 0, "index": 1, "reward": 0.0, "status": "failed", "prompt": "p",
         "response": drag_call(), "response_length": 30, "multimodal_inputs": {"images": [shot[1], html_media]}},
        {"group_index": 1, "index": 2, "reward": 0.5, "status": "truncated", "prompt": "p", "response_length": 20,
         "response": "<tool_call>scroll(0, 5)</tool_call><tool_call>type('hello')</tool_call>",
         "multimodal_inputs": {"images": [shot[2], shot[3]]}},
        {"group_index": 1, "index": 3, "reward": 0.25, "status": "completed", "prompt": "p", "response_length": 40,
         "response": "frobnicate the widget", "multimodal_inputs": {"images": [shot[4]]},
         "metadata": {"actions": ["frobnicate the widget"]}},
    ]  # fmt: skip
    return write_bundle(tmp_path / "dump", samples, media_roots=[run], kind="debug_dump")


@pytest.fixture
def page(tmp_path: Path) -> Path:
    out = tmp_path / "report.html"
    write_html_report(page_dump(tmp_path), out)
    return out


VISIBLE = """Array.from(document.querySelectorAll('.samples .sample'))
    .filter(s => getComputedStyle(s).display !== 'none')
    .sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top)
    .map(s => Number(s.id.slice(1)))"""


def click(label_text: str) -> str:
    """A DevTools evaluation clicking the control label whose text starts with ``label_text``
    (the page itself runs no script: its CSP forbids it)."""
    return f"""Array.from(document.querySelectorAll('nav.controls label'))
        .find(l => l.textContent.trim().startsWith({json.dumps(label_text)})).click()"""


def test_page_renders_runs_no_script_and_requests_nothing(page: Path, tmp_path: Path) -> None:
    need_chromium()
    check = """({scripts: document.scripts.length, title: document.title,
        handlers: Array.from(document.querySelectorAll('*')).flatMap(e => Array.from(e.attributes))
            .filter(a => a.name.startsWith('on')).length,
        iframes: document.querySelectorAll('iframe, object, embed, link[rel=stylesheet]').length,
        samples: document.querySelectorAll('.samples .sample').length,
        csp: document.querySelector('meta[http-equiv=Content-Security-Policy]').content})"""
    r = render(page.as_uri(), check, tmp_path / "page.png")
    assert r.errors == [] and r.console == []
    v = r.value
    assert v["scripts"] == 0 and v["handlers"] == 0 and v["iframes"] == 0 and v["samples"] == 4
    assert v["title"] == "debug_dump · dump" and "default-src 'none'" in v["csp"]
    # The only requests: the page itself and data: URIs (never the network, never a linked file
    # before its large view is opened).
    others = [u for u in r.requests if u != page.as_uri() and not u.startswith("data:")]
    assert others == [], others
    text = page.read_text()
    links = re.findall(r'(?:href|src)="([^"#][^"]*)"', text)
    others = {u for u in links if not u.startswith("data:") and not u.endswith(".png")}
    assert others == {"report.search.html"}  # the .html media file is never a link target


def overlay_pixels(png: Path, box: tuple[float, float, float, float]) -> list[tuple[int, int]]:
    """Pixels of the overlay colour inside ``box`` (x, y, w, h) of a screenshot."""
    x0, y0, bw, bh = (round(v) for v in box)
    with Image.open(png) as im:
        rgb = im.convert("RGB")
        px = rgb.load()
        found = []
        for y in range(max(0, y0), min(rgb.height, y0 + bh)):
            for x in range(max(0, x0), min(rgb.width, x0 + bw), 2):
                r, g, b = px[x, y]
                if abs(r - MAGENTA[0]) < 40 and abs(g - MAGENTA[1]) < 50 and abs(b - MAGENTA[2]) < 40:
                    found.append((x, y))
    return found


STAGE = """(() => { const lb = document.querySelector(':target'); const r = lb.querySelector('.stage').getBoundingClientRect();
    return {id: lb.id, x: r.left, y: r.top, w: r.width, h: r.height, shown: getComputedStyle(lb).display}; })()"""


@pytest.mark.parametrize(
    "fragment, points",
    [("v0-0", [(320, 180)]), ("v1-0", [(100, 100), (600, 400)])],
    ids=["click", "drag"],
)
def test_the_overlay_sits_where_the_action_says(
    page: Path, tmp_path: Path, fragment: str, points: list[tuple[int, int]]
) -> None:
    """A pixel check on a white synthetic screenshot: the overlay's colour is found around each
    point the action names (scaled to the large view as shown), and not far from them."""
    need_chromium()
    shot = tmp_path / f"{fragment}.png"
    r = render(page.as_uri() + "#" + fragment, STAGE, shot, 1400, 1000, full_page=False)
    stage = r.value
    assert stage["id"] == fragment and stage["shown"] == "flex" and stage["w"] >= 1280 * 0.9
    scale = stage["w"] / W
    for x, y in points:
        px, py = stage["x"] + x * scale, stage["y"] + y * scale
        ring = 2.2 * W / 100 * scale  # the ring's radius on screen
        near = overlay_pixels(shot, (px - 3 * ring, py - 3 * ring, 6 * ring, 6 * ring))
        assert len(near) > 20, (x, y, len(near))
        cx = sum(p[0] for p in near) / len(near)
        cy = sum(p[1] for p in near) / len(near)
        assert abs(cx - px) < ring and abs(cy - py) < ring, ((cx, cy), (px, py))
    # Far from every point (the bottom-right quarter), the screenshot is untouched.
    far = overlay_pixels(shot, (stage["x"] + stage["w"] * 0.8, stage["y"] + stage["h"] * 0.75,
                                stage["w"] * 0.2, stage["h"] * 0.25))  # fmt: skip
    assert far == []


def test_filters_sorting_and_groups_work_without_script(page: Path, tmp_path: Path) -> None:
    need_chromium()
    r = render(page.as_uri(), VISIBLE, tmp_path / "all.png")
    assert r.value == [0, 1, 2, 3]
    r = render(page.as_uri(), VISIBLE, tmp_path / "failed.png", actions=[click("failed")])
    assert r.value == [1]
    r = render(page.as_uri(), VISIBLE, tmp_path / "reward.png", actions=[click("0.5")])
    assert r.value == [2]
    r = render(page.as_uri(), VISIBLE, tmp_path / "sorted.png", actions=[click("reward ↑")])
    assert r.value == [1, 3, 2, 0]
    r = render(page.as_uri(), VISIBLE, tmp_path / "both.png", actions=[click("completed"), click("reward ↑")])
    assert r.value == [3, 0]
    groups = """({shown: getComputedStyle(document.querySelector('.view-groups')).display,
        samples: getComputedStyle(document.querySelector('.view-samples')).display,
        groups: Array.from(document.querySelectorAll('.group')).map(g => ({
            heads: Array.from(g.querySelectorAll('.ghead')).map(h => h.textContent.replace(/\\s+/g, ' ').trim()),
            head: g.querySelector('.group-head').textContent.replace(/\\s+/g, ' ')}))})"""
    r = render(page.as_uri(), groups, tmp_path / "groups.png", actions=[click("groups side by side")])
    v = r.value
    assert v["shown"] != "none" and v["samples"] == "none" and len(v["groups"]) == 2
    g0 = v["groups"][0]
    # Rewards 1 and 0: mean 0.5, unbiased std 0.7071, advantages (r - mean) / (std + 1e-6).
    assert "advantage +0.707" in g0["heads"][0] and "advantage -0.707" in g0["heads"][1]
    assert "mean 0.5" in g0["head"] and "std 0.707" in g0["head"]


def test_histograms_and_logprob_strip_are_drawn(page: Path) -> None:
    text = page.read_text()
    charts = re.findall(
        r'<figure class="card chart"><figcaption>([^<]+)</figcaption>(.*?)</figure>', text, re.S
    )
    assert [c[0] for c in charts] == ["reward", "response length", "turns"]
    reward_bars = re.findall(
        r'<rect class="bar [^"]*"[^>]*height="([\d.]+)"><title>([^<]+)</title>', charts[0][1]
    )
    assert [t for _, t in reward_bars] == [
        "0: 1 sample",  # not "1 samples" (issue 24, item 8)
        "0.25: 1 sample",
        "0.5: 1 sample",
        "1: 1 sample",
    ]
    assert len(re.findall(r'<img src="data:image/png;base64,[^"]+" alt="per-token log-probs', text)) == 1


def test_an_unparsable_action_is_shown_as_text(page: Path) -> None:
    text = page.read_text()
    lightbox = re.search(r'<div class="lb" id="v3-0">(.*?)</figure></div>', text, re.S).group(1)
    assert "frobnicate the widget" in lightbox and "<circle" not in lightbox


def test_large_views_inline_for_packed_and_link_png_for_a_large_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    refs = [MediaRef.from_file(put_media(run, white(k))) for k in range(30)]
    samples = [
        {"multimodal_inputs": {"images": refs[k : k + 1]}, "metadata": {"actions": ["click(1, 1)"]}}
        for k in range(30)
    ]
    b = write_bundle(tmp_path / "big", samples, media_roots=[run])
    write_html_report(b, tmp_path / "dir.html")
    text = (tmp_path / "dir.html").read_text()
    links = re.findall(r'<img class="base" loading="lazy" src="([^"]+)"', text)
    assert len(links) == 30 and all(
        s.endswith(".png") and (tmp_path / urllib.parse.unquote(s)).is_file() for s in links
    )
    assert '<image id="L' not in text  # 30 distinct screenshots: linked, not inlined
    packed = pack_bundle(b, tmp_path / "big.rbundle")
    write_html_report(packed, tmp_path / "packed.html", inline_budget=200_000)
    text = (tmp_path / "packed.html").read_text()
    inlined = len(re.findall(r'<image id="L\d+"', text))
    assert 0 < inlined < 30 and '<img class="base"' not in text
    assert text.count("enlarged thumbnail: the large view was not inlined") == 30 - inlined


def test_a_600_turn_page_stays_small(tmp_path: Path) -> None:
    """Size scales with distinct screenshots: inlined once, drawn by reference (no browser needed)."""
    run = tmp_path / "run"
    refs = [MediaRef.from_file(put_media(run, white(k % 40))) for k in range(40)]
    samples = [{"group_index": i // 4, "reward": float(i % 2), "status": "completed",
                "multimodal_inputs": {"images": refs[(i * 5) % 40 : (i * 5) % 40 + 5]},
                "metadata": {"actions": ["click(10, 10)", "type('a')", "scroll(0, 3)", "key('enter')", "wait()"]}}
               for i in range(120)]  # fmt: skip
    b = write_bundle(tmp_path / "b", samples, media_roots=[run])
    written = write_html_report(b, tmp_path / "r.html")
    assert written.images == 600
    assert written.bytes < 3 * 2**20, written.bytes


def test_the_search_page_runs_only_its_own_script(page: Path, tmp_path: Path) -> None:
    """The search box lives on a second page whose CSP allows one script by its hash: typing
    hides the rows without the words; the bundle's hostile text runs nothing and fetches nothing."""
    need_chromium()
    search = page.with_name("report.search.html")
    assert search.is_file() and 'href="report.search.html"' in page.read_text()
    typed = """(() => { const q = document.getElementById('q'); q.value = WORDS;
        q.dispatchEvent(new Event('input')); })()"""
    visible = """({rows: Array.from(document.querySelectorAll('tbody tr')).filter(r => !r.hidden)
            .map(r => Number(r.querySelector('a').textContent)),
        n: document.getElementById('n').textContent, scripts: document.scripts.length, title: document.title})"""
    r = render(search.as_uri(), visible, tmp_path / "s0.png")
    assert r.errors == [] and r.value["rows"] == [0, 1, 2, 3] and r.value["n"] == "4"
    assert r.value["scripts"] == 1 and r.value["title"] == "search · debug_dump · dump"
    r = render(
        search.as_uri(), visible, tmp_path / "s1.png", actions=[typed.replace("WORDS", '"hello type"')]
    )
    assert r.value["rows"] == [2] and r.value["n"] == "1"  # its script ran: the CSP hash matches
    r = render(
        search.as_uri(), visible, tmp_path / "s2.png", actions=[typed.replace("WORDS", '"document.title"')]
    )
    assert r.value["rows"] == [0] and r.value["title"] == "search · debug_dump · dump"  # found as text only
    assert [u for u in r.requests if u != search.as_uri() and not u.startswith("data:")] == []
    assert r.errors == []
