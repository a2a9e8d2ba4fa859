"""``rollout-bundle view``: one self-contained HTML report, checked as text and in a real Chromium."""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import random
import re
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import put_media
from helpers.browser import INSTALL_HINT, find_chromium, render

from bundles import MediaRef, open_bundle, pack_bundle, remove_bundle, write_bundle
from trainer_hooks.cli import build_parser, main

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("jinja2", reason="view needs the [view] extra (jinja2)")
ImageDraw = pytest.importorskip("PIL.ImageDraw")

HOSTILE = "<script>alert(1)</script>"


def screenshot(seed: int, w: int = 480, h: int = 270) -> bytes:
    """A small synthetic desktop: a wallpaper, a taskbar and three windows (PNG)."""
    r = random.Random(seed)
    im = Image.new("RGB", (w, h), (r.randrange(40, 90), r.randrange(60, 120), r.randrange(120, 200)))
    d = ImageDraw.Draw(im)
    d.rectangle([0, h - 18, w, h], fill=(30, 30, 35))
    for k in range(3):
        x, y = r.randrange(0, w - 160), r.randrange(0, h - 120)
        d.rectangle([x, y, x + 160, y + 100], fill=(245, 245, 245), outline=(90, 90, 90))
        d.rectangle([x, y, x + 160, y + 14], fill=(210, 215, 225))
        d.text((x + 5, y + 2), f"window {seed}-{k}", fill=(20, 20, 20))
    out = io.BytesIO()
    im.save(out, "PNG")
    return out.getvalue()


def cua_dump(tmp_path: Path) -> Path:
    """A debug dump of two prompt groups x two attempts x three turns; turn 0 is shared within a
    group; sample 2 also names a file that is not an image; prompts and actions carry HTML."""
    run = tmp_path / "run"
    samples = []
    for i in range(4):
        shots = [screenshot(100 * (i // 2))] + [screenshot(100 * i + t) for t in (1, 2)]
        samples.append(
            {
                "group_index": i // 2,
                "index": i,
                "prompt": f"<|im_start|>user\nOpen Settings and turn on dark mode. {HOSTILE}<|im_end|>",
                "tokens": list(range(240)),
                "response": "<tool_call>click(212, 148)</tool_call>"
                + ("<img src=x onerror=alert(2)>" if i == 3 else ""),
                "response_length": 48,
                "loss_mask": [1] * 48,
                "rollout_log_probs": [-0.05] * 48,
                "reward": 1.0 if i % 2 == 0 else 0.0,
                "status": ["completed", "truncated", "completed", "failed"][i],
                "multimodal_inputs": {"images": [MediaRef.from_file(put_media(run, s)) for s in shots]},
                "multimodal_train_inputs": {"image_grid_thw": np.tile(np.array([[1, 26, 46]]), (3, 1))},
                "metadata": {
                    "task": i // 2,
                    "actions": ["click(212, 148)", "type('dark')", "key('</code>')"],
                },
            }
        )
    samples[2]["multimodal_inputs"]["images"].append(
        MediaRef.from_file(put_media(run, b"\x89PNG\r\n\x1a\nbroken"))
    )
    meta = {
        "rollout_id": 3,
        "run_uuid": "3f1c9a",
        "training_dtype": "bf16",
        "processor": {"model_path": "Qwen/Qwen2-VL-2B-Instruct", "image_processor_backend": "fast"},
        "metadata": {"note": HOSTILE},
    }
    return write_bundle(tmp_path / "dump_3", samples, media_roots=[run], kind="debug_dump", meta=meta)


def replay_report(bundle: Path) -> dict[str, Any]:
    """A replay report of the shape `rollout-bundle replay --report` writes (hand-written)."""

    def image(j: int, placeholders: int = 299) -> dict[str, Any]:
        return {
            "image": j,
            "vision_tokens": 299,
            "placeholder_tokens": placeholders,
            "pixel_values": {"shape": [1196, 1176], "dtype": "bfloat16", "sha256": "0" * 64},
            "image_grid_thw": {
                "shape": [1, 3],
                "dtype": "int64",
                "sha256": "1" * 64,
                "values": [[1, 26, 46]],
            },
        }

    return {
        "format": "rollout-bundle-replay",
        "version": 1,
        "bundle": str(bundle),
        "dtype": "bf16",
        "processor": {"class": "Qwen2VLImageProcessor", "merge_size": 2},
        "summary": {
            "samples": 3,
            "images": 9,
            "vision_tokens": 2691,
            "bytes_before_cast": 4_000_000,
            "bytes_after_cast": 2_000_000,
            "peak_rss_bytes": 900_000_000,
            "problems": {"token_count": 1},
        },
        "samples": [
            {"position": 0, "index": 0, "group_index": 0, "problems": [], "images": [image(j) for j in range(3)],
             "logprob_diff": None},
            {"position": 1, "index": 1, "group_index": 0,
             "problems": [{"kind": "token_count", "message": f"image 1: 299 vision tokens, 300 placeholders {HOSTILE}",
                           "image": 1}],
             "images": [image(0), image(1, placeholders=300), image(2)],
             "logprob_diff": {"max_abs": 0.0123, "mean_abs": 0.0021, "tokens": 48}},
            {"position": 3, "index": 3, "group_index": 1, "problems": [], "images": [], "logprob_diff": None},
        ],
    }  # fmt: skip


def view(tmp_path: Path, *extra: str, replay: bool = True) -> tuple[Path, str]:
    bundle = cua_dump(tmp_path)
    args = ["view", str(bundle), "-o", str(tmp_path / "report.html"), *extra]
    if replay:
        (tmp_path / "replay.json").write_text(json.dumps(replay_report(bundle)))
        args += ["--replay", str(tmp_path / "replay.json")]
    assert main(args) == 0
    return tmp_path / "report.html", (tmp_path / "report.html").read_text()


def test_report_is_self_contained_and_escapes_sample_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, text = view(tmp_path)
    assert f"wrote {out} (4 samples, 12 screenshots" in capsys.readouterr().out
    assert "default-src 'none'" in html.unescape(text) and "<script" not in text.lower()
    assert HOSTILE not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<img src=x" not in text and "&lt;img src=x onerror=alert(2)&gt;" in text
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", text)  # nothing fetched from a network
    # Each stored screenshot is inlined once (10 decodable ones) and drawn at each of its 12 turns.
    images = re.findall(r'<image id="(m\d+)" width="(\d+)" height="(\d+)" href="([^"]+)"/>', text)
    assert len(images) == 10 and all(href.startswith("data:image/jpeg;base64,") for *_, href in images)
    samples_view = text.split('<div class="view-groups">')[0]  # the groups view draws them again
    uses = re.findall(r'<svg class="thumb"[^>]*><use href="#(m\d+)"', samples_view)
    assert len(uses) == 12 and set(uses) == {i for i, *_ in images}
    # Large views (1280 px wide, at most the original's size) are inlined once each too.
    large = re.findall(r'<image id="(L\d+)" width="(\d+)" height="(\d+)" href="data:image/jpeg;base64,', text)
    assert len(large) == 10 and all(w == "480" for _, w, _ in large)
    thumb = Image.open(io.BytesIO(base64.b64decode(images[0][3].split(",", 1)[1])))
    assert thumb.format == "JPEG" and thumb.size == (320, 180) and images[0][1:3] == ("320", "180")
    # Full-size images by relative links that resolve while the bundle sits next to the report.
    hrefs = re.findall(r'<a href="([^"#][^"]*)">stored file</a>', text)
    assert len(hrefs) == 12 and all(not h.startswith("/") for h in hrefs)
    for h in hrefs:
        assert (out.parent / urllib.parse.unquote(h)).is_file(), h
    assert "cannot decode" in text  # the broken file is named, not shown as a broken image
    # Header: kind, meta, counts, sizes, dedup ratio; per sample the replay's findings.
    for needle in ("debug_dump", "3f1c9a", "bf16", "Qwen/Qwen2-VL-2B-Instruct", "dedup ratio", "1.18×",
                   "299 vision tokens ≠ 300 placeholders", "token_count", "max <b>0.0123</b>",
                   "not in the replay report", "pixel_values bfloat16 [1196, 1176]"):  # fmt: skip
        assert needle in text, needle


def test_vision_tokens_from_the_grid_without_a_replay(tmp_path: Path) -> None:
    _, text = view(tmp_path, replay=False)
    assert text.count("≈299 vision tokens") == 12  # 26 x 46 patches / merge 2x2
    assert "Replay" not in text


def test_samples_and_limit_choose_what_is_shown(tmp_path: Path) -> None:
    _, text = view(tmp_path, "--samples", "3,1,2", "--limit", "2", replay=False)
    assert re.findall(r'<section class="card sample [^"]*" id="s(\d+)"', text) == ["3", "1"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--samples", "9"], "sample 9 is out of range: the bundle holds 4"),
        (["--replay", "REPORT"], "format: expected 'rollout-bundle-replay', found 'zarr'"),
        (["--replay", "MISSING"], "cannot read the replay report"),
        (["--replay", "SUMMARY"], "summary.problems: expected an object of counts by kind"),
    ],
)
def test_bad_input_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    bundle = cua_dump(tmp_path)
    (tmp_path / "REPORT").write_text(json.dumps({"format": "zarr"}))
    bad_summary = {**replay_report(bundle), "summary": {"problems": ["guard"]}}
    (tmp_path / "SUMMARY").write_text(json.dumps(bad_summary))
    args = [str(tmp_path / a) if a in ("REPORT", "MISSING", "SUMMARY") else a for a in args]
    assert main(["view", str(bundle), "-o", str(tmp_path / "r.html"), *args]) == 2  # the caller's input
    err = capsys.readouterr().err
    assert err.startswith("rollout-bundle view: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_an_output_that_is_a_directory_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = cua_dump(tmp_path)
    assert main(["view", str(bundle), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"rollout-bundle view: error: -o {tmp_path}: is a directory; name the file to write\n"
    assert not list(tmp_path.glob(".*.tmp"))


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail(INSTALL_HINT + " (.ci/run installs it)")
        pytest.skip(INSTALL_HINT)
    out, _ = view(tmp_path)
    # Every inlined screenshot decodes (naturalWidth of an image loaded from its data URI), every
    # turn's <use> resolves to one, and each drawn thumbnail has a size on the page.
    check = """Promise.all(Array.from(document.querySelectorAll('svg.defs image[id^=m]')).map(el => {
        const img = new Image(); img.src = el.getAttribute('href');
        return img.decode().then(() => img.naturalWidth, () => 0); }))
      .then(widths => ({widths: widths,
        unresolved: Array.from(document.querySelectorAll('svg use')).filter(
            u => !document.getElementById(u.getAttribute('href').slice(1))).length,
        drawn: Array.from(document.querySelectorAll('.view-samples svg.thumb')).map(s => s.getBoundingClientRect().width),
        scripts: document.scripts.length, title: document.title,
        samples: document.querySelectorAll('section.sample').length,
        hostile: document.body.innerText.includes('<script>alert(1)</script>')}))"""
    shot = tmp_path / "report.png"
    result = render(out.as_uri(), check, shot, width=1280, height=900)
    print(f"view screenshot: {shot}")
    assert result.errors == []
    value = result.value
    assert len(value["widths"]) == 10 and all(w == 320 for w in value["widths"]), value["widths"]
    assert value["unresolved"] == 0 and len(value["drawn"]) == 12 and all(w > 200 for w in value["drawn"])
    assert value["scripts"] == 0 and value["samples"] == 4 and value["hostile"] is True
    assert value["title"] == "debug_dump · dump_3"
    with Image.open(shot) as im:
        assert im.width > 1200 and im.height > 2000  # the whole page, not just the 900 px viewport


def test_packed_bundle_is_read_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = cua_dump(tmp_path)
    packed = tmp_path / "dump_3.rbundle"
    pack_bundle(bundle, packed)
    remove_bundle(bundle)  # nothing but the packed file is left
    assert main(["view", str(packed), "-o", str(tmp_path / "r.html"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 12
    text = (tmp_path / "r.html").read_text()
    assert len(re.findall(r'<image id="m\d+" [^>]*href="data:image/jpeg;base64,', text)) == 10
    samples_view = text.split('<div class="view-groups">')[0]
    assert len(re.findall(r'<svg class="thumb"[^>]*><use href="#m\d+"', samples_view)) == 12
    assert "stored file</a>" not in text and '<img class="base"' not in text  # no files inside a packed file
    lightboxes = text.split('<div class="lightboxes">')[1]
    assert len(re.findall(r'<use href="#L\d+"', lightboxes)) == 12  # every large view inlined instead
    assert "packed file" in text and not list(tmp_path.glob("*.unpacked"))


def test_view_says_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ "1 sample", not "1 samples"; the search page it writes beside the report is named, and is
    the only other file (issue 24, item 8); --no-search writes the report alone and says so."""
    b = write_bundle(tmp_path / "b", [{"prompt": "hi", "response": "ok"}])
    out = tmp_path / "out"
    out.mkdir()
    assert main(["view", str(b), "-o", str(out / "r.html")]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"wrote {out / 'r.html'} (1 sample, 0 screenshots, ") and "1 samples" not in line
    assert f" and its search page {out / 'r.search.html'}: open r.html in a browser\n" in line
    assert sorted(p.name for p in out.iterdir()) == ["r.html", "r.search.html"]
    (out / "r.search.html").unlink()
    assert main(["view", str(b), "-o", str(out / "r.html"), "--no-search"]) == 0
    line = capsys.readouterr().out
    assert "search" not in line and line.endswith(": open r.html in a browser\n")
    assert sorted(p.name for p in out.iterdir()) == ["r.html"]
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    summary = next(a.help for a in sub._choices_actions if a.dest == "view")
    assert summary and "one self-contained" not in summary and "search page" in summary


def test_view_of_a_pooled_bundle_on_a_store_shows_its_media(
    moto_s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's store example: ``write_bundle("s3://...", ..., shared_media=True)`` with path
    strings stores the media in the parent's pool (``<parent>/.media/<hex>.png``), and the samples
    name them there. Those are the bundle's media: the page shows every one (issue 30, item 15;
    it said "6 samples, 0 screenshots" and "not stored in the bundle: s3://.../.media/...")."""
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "run"
    shots = [put_media(run, screenshot(i)) for i in range(4)]
    samples = [{"index": i, "multimodal_inputs": {"images": [shots[0], shots[1 + i % 3]]}} for i in range(6)]
    url = f"s3://{moto_s3.bucket()}/run-7/rollout/fully_async_40"
    write_bundle(url, samples, media_roots=[str(run)], shared_media=True)
    out = tmp_path / "r.html"
    assert main(["view", url, "-o", str(out), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["samples"] == 6 and said["images"] == 12, said
    text = out.read_text()
    assert "not stored in the bundle" not in text and "/.media/" not in text
    # Four distinct files, each inlined once as a thumbnail (no files beside the page on a store).
    assert len(re.findall(r'<image id="m\d+" [^>]*href="data:image/jpeg;base64,', text)) == 4
    samples_view = text.split('<div class="view-groups">')[0]
    assert len(re.findall(r'<svg class="thumb"[^>]*><use href="#m\d+"', samples_view)) == 12
    # Through the public API, as the page reads them: a sample's reference opens on the bundle.
    b = open_bundle(url)
    first = b[0]["multimodal_inputs"]["images"][0]
    assert "/run-7/rollout/.media/" in first and str(first).endswith(".png"), first
    with b.open_media(first) as f:
        assert f.read() == Path(shots[0]).read_bytes()


def paged_dump(tmp_path: Path, n: int = 7) -> Path:
    run = tmp_path / "run"
    shots = [put_media(run, screenshot(i, 240, 150)) for i in range(n)]
    samples = [{"index": i, "group_index": i // 2, "prompt": f"task {i} needle{i}", "response": f"answer {i}",
                "reward": float(i % 2), "status": "completed", "multimodal_inputs": {"images": [shots[i]]}}
               for i in range(n)]  # fmt: skip
    return Path(write_bundle(tmp_path / "dump", samples, media_roots=[run]))


def test_a_large_bundle_is_written_as_pages_linked_to_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32, item 8: past --page-size samples the report is pages of N samples
    (r.html, r-2.html, r-3.html), each with only its samples and its pictures, linked to each
    other and to `rollout-bundle serve`; the search page links each sample to the page showing it."""
    bundle = paged_dump(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["view", str(bundle), "-o", str(out / "r.html"), "--page-size", "3", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    pages = [out / "r.html", out / "r-2.html", out / "r-3.html"]
    assert said["pages"] == [str(p) for p in pages] and said["samples"] == 7 and said["images"] == 7
    assert sorted(p.name for p in out.iterdir()) == ["r-2.html", "r-3.html", "r.html", "r.search.html"]
    assert said["bytes"] == sum(p.stat().st_size for p in pages)
    shown = []
    for k, page in enumerate(pages):
        text = page.read_text()
        ids = re.findall(r'<section class="card sample [^"]*" id="s(\d+)"', text)
        shown.append(ids)
        # Each page inlines only its own screenshots, and says which page it is.
        assert len(re.findall(r'<image id="m\d+"', text)) == len(ids)
        assert f"page {k + 1} of 3" in text and f"rollout-bundle serve {bundle}" in text
        links = re.findall(r'<a class="chip" (?:rel="(?:prev|next)" )?href="(r[^"#]*\.html)"', text)
        assert all((out / urllib.parse.unquote(h)).is_file() for h in links) and links
        assert ('rel="prev"' in text) == (k > 0) and ('rel="next"' in text) == (k < 2)
    assert shown == [["0", "1", "2"], ["3", "4", "5"], ["6"]]
    search = (out / "r.search.html").read_text()
    assert '<a href="r-2.html#s4">4</a>' in search and '<a href="r.html#s0">0</a>' in search
    assert '<a href="r-3.html#s6">6</a>' in search
    # The line that says so, without --json; --page-size 0 is one page, as before paging.
    assert main(["view", str(bundle), "-o", str(out / "r.html"), "--page-size", "3"]) == 0
    line = capsys.readouterr().out
    assert "and 2 more page(s) beside it, r-2.html to r-3.html (7 samples, at most 3 a page" in line
    assert f"`rollout-bundle serve {bundle}`" in line
    assert main(["view", str(bundle), "-o", str(tmp_path / "one.html"), "--page-size", "0"]) == 0
    one = (tmp_path / "one.html").read_text()
    assert len(re.findall(r'<section class="card sample', one)) == 7 and "page 1 of" not in one
    assert not (tmp_path / "one-2.html").exists()


def test_page_size_must_be_a_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = paged_dump(tmp_path, 2)
    with pytest.raises(SystemExit):
        main(["view", str(bundle), "-o", str(tmp_path / "r.html"), "--page-size", "-1"])
    assert "expected samples per page >= 1, or 0 for one page, found '-1'" in capsys.readouterr().err
    from trainer_hooks.view import write_html_report
    from trainer_hooks.view._report import PAGE_SIZE

    with pytest.raises(Exception, match="page_size must be at least 1"):
        write_html_report(bundle, tmp_path / "r.html", page_size=-2)
    from trainer_hooks.view._cli import PAGE_SIZE as CLI_PAGE_SIZE

    assert CLI_PAGE_SIZE == PAGE_SIZE


def test_a_page_of_a_paged_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Page 2 of 3 in a real Chromium: its own samples and pictures drawn, the pager's links on the
    page at the top and the bottom, no script, no error (issue 32, item 8)."""
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail(INSTALL_HINT + " (.ci/run installs it)")
        pytest.skip(INSTALL_HINT)
    bundle = paged_dump(tmp_path)
    assert main(["view", str(bundle), "-o", str(tmp_path / "r.html"), "--page-size", "3", "--no-search"]) == 0
    check = """({samples: Array.from(document.querySelectorAll('section.sample')).map(s => s.id),
        pagers: document.querySelectorAll('nav.pages').length,
        prev: Array.from(document.querySelectorAll('nav.pages a[rel=prev]')).map(a => a.href),
        next: Array.from(document.querySelectorAll('nav.pages a[rel=next]')).map(a => a.href),
        current: document.querySelector('nav.pages .cur').textContent,
        drawn: Array.from(document.querySelectorAll('.view-samples svg.thumb')).map(s => s.getBoundingClientRect().width),
        scripts: document.scripts.length})"""
    result = render((tmp_path / "r-2.html").as_uri(), check, tmp_path / "r-2.png", width=1280, height=900)
    assert result.errors == []
    v = result.value
    assert v["samples"] == ["s3", "s4", "s5"] and v["pagers"] == 2 and v["current"] == "2"
    assert (
        v["prev"] == [(tmp_path / "r.html").as_uri()] * 2
        and v["next"] == [(tmp_path / "r-3.html").as_uri()] * 2
    )
    assert len(v["drawn"]) == 3 and all(w > 150 for w in v["drawn"]) and v["scripts"] == 0


# -- the replay's log-prob mismatch (issue 38, item 3) ----------------------------------------------------

RECORDED = [-0.1 - 0.01 * k for k in range(10)]
#: Per sample, the replay's recomputed log-probs minus the recorded ones: sample 2 is the furthest
#: (its token 5 over the 0.2 threshold), then 0, then 3; sample 1 was not compared.
SHIFTS = {0: [0.01] * 10, 2: [0.05] * 5 + [0.5] + [0.05] * 4, 3: [-0.002] * 10}


def mismatch_dump(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    from helpers.logprob_reports import logprob_report

    samples = [{"index": i, "prompt": f"task {i}", "response": "done", "reward": float(i % 2), "status": "completed",
                "tokens": list(range(30)), "response_length": 10, "rollout_log_probs": RECORDED}
               for i in range(4)]  # fmt: skip
    bundle = Path(write_bundle(tmp_path / "dump", samples))
    report = logprob_report(bundle, SHIFTS)
    (tmp_path / "replay.json").write_text(json.dumps(report))
    out = tmp_path / "r.html"
    assert (
        main(["view", str(bundle), "-o", str(out), "--replay", str(tmp_path / "replay.json"), "--no-search"])
        == 0
    )
    return bundle, out, report


def section(text: str, pos: int) -> str:
    return text.split(f'id="s{pos}"', 1)[1].split("</section>", 1)[0]


def test_the_replays_recomputed_log_probs_are_drawn_against_the_recorded_sorted_and_summed(
    tmp_path: Path,
) -> None:
    _, out, report = mismatch_dump(tmp_path)
    text = html.unescape(out.read_text())
    # The bundle's figures, from the report's summary.logprob, in the report's replay summary.
    s = report["summary"]["logprob"]
    m = s["mean_abs"]
    assert (f"mean_abs over 3 samples: mean {m['mean']:.4g} · p50 {m['p50']:.4g} · p99 {m['p99']:.4g} · max "
            f"{m['max']:.4g}; k3 {s['k3']:.4g}; TIS at cap 2 clips 0.00% of 30 tokens") in text  # fmt: skip
    # Sample 2: its figures, the first token over the threshold, three strips with the token marked.
    two = section(text, 2)
    assert "mean <b>0.095</b> over <b>10</b> tokens" in two and "max <b>0.5</b>" in two
    assert "first token over the threshold: turn 0, response token 5 (id 25), |diff| 0.5" in two
    assert two.count('<i class="over" style="left:55.000%"') == 3  # token 5 of 10: the 6th pixel's middle
    for alt in ("log-probs the rollout recorded", "log-probs the replay recomputed", "|difference| between"):
        assert alt in two, alt
    strips = re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="per-token ([^"]+)"', two)
    diff_png = next(b for b, alt in strips if alt.startswith("|difference|"))
    strip = Image.open(io.BytesIO(base64.b64decode(diff_png))).convert("RGB")
    pixels = [strip.getpixel((k, 0)) for k in range(strip.width)]
    assert len(pixels) == 10 and pixels[5] == (200, 30, 30)  # |0.5|: full red
    tenth = (249.5, 232.5, 232.5)  # |0.05|: a tenth of the way from white to red
    assert all(abs(c - t) <= 1 for k, p in enumerate(pixels) if k != 5 for c, t in zip(p, tenth, strict=True))
    assert "no log-prob comparison" in section(text, 1) and "mismatch-strips" not in section(text, 1)
    assert "first token over" not in section(text, 0)  # 0.01 everywhere: none over 0.2
    # The sort "log-prob mismatch ↓": the 7th, furthest first, not compared last; the index table's column.
    sorts = re.findall(r'<label class="chip" for="sort-(\d+)">([^<]+)</label>', text)
    assert ("7", "log-prob mismatch ↓") in sorts
    order = {
        p: int(re.findall(r"--o7:(\d+);", text.split(f'id="s{p}"', 1)[1].split(">", 1)[0])[0])
        for p in range(4)
    }
    assert sorted(order, key=order.__getitem__) == [2, 0, 3, 1]
    rows = re.findall(
        r'<tr class="fsel [^"]*" style="[^"]*--o7:(\d+);"><td class="num"><a href="#s(\d+)">', text
    )
    assert sorted(rows) == sorted((str(order[p]), str(p)) for p in range(4))
    assert re.search(r'<a href="#s2">2</a>.*?<td class="num">0\.095</td></tr>', text)


def test_the_mismatch_sort_and_the_first_token_over_are_drawn_in_headless_chromium(tmp_path: Path) -> None:
    """In a real Chromium: the sort "log-prob mismatch ↓" (a label clicked, no script of the page's)
    orders the samples and the index table's rows furthest first, and the mark of the first token
    over the threshold sits over that token's pixel of each strip (issue 38, item 3)."""
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail(INSTALL_HINT + " (.ci/run installs it)")
        pytest.skip(INSTALL_HINT)
    _, out, _ = mismatch_dump(tmp_path)
    check = """(() => {
        const byTop = els => els.sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
        const strips = Array.from(document.querySelectorAll('#s2 .mismatch-strips .bar'));
        return {samples: byTop(Array.from(document.querySelectorAll('section.sample'))).map(s => s.id),
            rows: byTop(Array.from(document.querySelectorAll('table.index tbody tr'))).map(r => r.querySelector('a').textContent),
            marks: strips.map(b => { const r = b.getBoundingClientRect(), m = b.querySelector('i.over').getBoundingClientRect();
                                     return (m.left + m.width / 2 - r.left) / r.width; }),
            scripts: document.scripts.length};
    })()"""
    result = render(
        out.as_uri(),
        check,
        tmp_path / "r.png",
        actions=["document.querySelector('label[for=sort-7]').click()"],
    )
    assert result.errors == []
    v = result.value
    assert v["samples"] == ["s2", "s0", "s3", "s1"] and v["rows"] == ["2", "0", "3", "1"]
    assert len(v["marks"]) == 3 and all(abs(x - 0.55) < 0.02 for x in v["marks"]), v["marks"]
    assert v["scripts"] == 0
