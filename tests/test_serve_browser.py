"""``rollout-bundle serve`` in a real browser (issue 32, item 9): Playwright drives the system
Chromium against a real ``rollout-bundle serve`` subprocess on a free loopback port.

A person's path through a run is clicked, not fetched: the run page, a bundle, a filter, a
sample, its large view, the prompt across training and a comparison, on a run laid out as the
demo's (``ckpt/rollout/fully_async_<step>`` checkpoints and ``debug/rollout_<step>.bundle``
dumps of demo-style 1920x1080 screenshots) and on a run on SeaweedFS. Each step's screenshot is
kept under ``$ROLLOUT_BUNDLES_ARTIFACTS/<test>`` when that is set (else the test's tmp_path; the
directory is printed). The hostile vectors of ``tests/vectors/hostile`` are then served and every
route of every bundle is opened in the browser: no dialog opens, no script runs, no console
error comes from a bundle's content, and every response carries the CSP.

Chromium is Debian's package (``/usr/bin/chromium``), launched offline with ``--no-sandbox``;
the test skips, naming what is missing, when Playwright or Chromium is not installed.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from helpers.browser import find_chromium

from bundles import is_bundle, write_bundle

pytest.importorskip("starlette", reason="serve needs the [serve] extra (starlette)")
pytest.importorskip("jinja2", reason="serve needs the [serve] extra (jinja2)")
pytest.importorskip("PIL.Image")
sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="Playwright is not installed (pip install playwright; it drives /usr/bin/chromium)",
)

from trainer_hooks.serve import CSP  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "vectors" / "hostile"
CHROMIUM = os.environ.get("ROLLOUT_BUNDLES_CHROMIUM") or (
    "/usr/bin/chromium" if os.path.isfile("/usr/bin/chromium") else find_chromium() or "/usr/bin/chromium"
)
ACTIONS = ["click(212, 148)", "double_click(960, 540)", "type('dark mode')", "scroll(0, -3)",
           "drag(300, 400, 900, 420)"]  # fmt: skip
TIMEOUT_MS = 30_000  # per action: generous, for a CI machine running tox envs in parallel
START_TIMEOUT_S = 60

pytestmark = [
    # ~45 s of a real browser: tox runs it once, in py311-full (the light envs deselect the marker).
    pytest.mark.browser,
    pytest.mark.skipif(
        not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)),
        reason=f"Chromium not found at {CHROMIUM}: apt-get install -y chromium (or set ROLLOUT_BUNDLES_CHROMIUM)",
    ),
]


# -- the server, the browser and what the page says ----------------------------------------------------


@pytest.fixture
def shots_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    base = os.environ.get("ROLLOUT_BUNDLES_ARTIFACTS")
    out = Path(base) / re.sub(r"[^\w.-]+", "_", request.node.name) if base else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    print(f"screenshots of {request.node.name}: {out}")
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


class Serve:
    """``rollout-bundle serve ROOT --port 0`` as a subprocess; its URL from the line it prints."""

    def __init__(self, root: str, work: Path, env: dict[str, str] | None = None) -> None:
        self.log = work / "serve.stderr"
        self._err = self.log.open("w")
        cmd = [sys.executable, "-m", "trainer_hooks.cli", "serve", root, "--port", "0",
               "--cache-dir", str(work / "cache"), "--no-progress"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})  # fmt: skip
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        m = re.search(r"open (http://127\.0\.0\.1:\d+/)", line)
        if m is None:
            self.close()
            raise AssertionError(f"serve printed {line!r}; stderr: {self.log.read_text()[-2000:]}")
        self.url = m.group(1)
        # The server listens before it lists the run: the pages below start from a listed run.
        wait_until(lambda: "listing…" not in urllib.request.urlopen(self.url, timeout=30).read().decode(),
                   "the run listed", timeout=START_TIMEOUT_S)  # fmt: skip

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._err.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Watch:
    """Everything a page did that it must not: dialogs (dismissed), uncaught exceptions, console
    errors, and every response, to check its headers."""

    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    responses: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)

    def attach(self, page: Any) -> None:
        def on_dialog(d: Any) -> None:
            self.dialogs.append(f"{d.type}: {d.message}")
            d.dismiss()

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on(
            "console",
            lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
        )
        page.on("response", lambda r: self.responses.append((r.url, r.status, r.all_headers())))


@pytest.fixture
def page(browser: Any) -> Iterator[tuple[Any, Watch]]:
    # Offline: the context reaches nothing but the server on loopback.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, java_script_enabled=True)
    context.route(re.compile(r"^(?!http://127\.0\.0\.1:)"), lambda route: route.abort())
    p = context.new_page()
    p.set_default_timeout(TIMEOUT_MS)
    watch = Watch()
    watch.attach(p)
    try:
        yield p, watch
    finally:
        context.close()


def scripts_ran(page: Any) -> dict[str, Any]:
    """What a page holds that would run: ``evaluate`` runs outside the page's CSP."""
    return page.evaluate("""() => ({scripts: document.scripts.length,
        handlers: Array.from(document.querySelectorAll('*')).filter(el => Array.from(el.attributes).some(
            a => a.name.startsWith('on'))).length,
        iframes: document.querySelectorAll('iframe, object, embed').length,
        pwned: document.title.includes('pwned') || window.__pwned === true})""")


def images_loaded(page: Any, selector: str) -> list[int]:
    """The natural widths of the pictures under ``selector`` (0: broken), <img> or SVG <image>."""
    return page.evaluate(
        """sel => Promise.all(Array.from(document.querySelectorAll(sel)).map(el => {
            const src = el.tagName.toLowerCase() === 'img' ? el.currentSrc || el.src : el.href.baseVal;
            const img = new Image(); img.src = src;
            return img.decode().then(() => img.naturalWidth, () => 0); }))""",
        selector,
    )


def check_headers(watch: Watch, base: str) -> None:
    served = [(u, s, h) for u, s, h in watch.responses if u.startswith(base)]
    assert served, "no response from the server"
    for url, status, headers in served:
        assert headers.get("content-security-policy") == CSP, (url, status, headers)
        assert headers.get("x-content-type-options") == "nosniff", url
        assert status < 500 or status in (502, 503), (url, status)


# -- a run laid out as the demo's ----------------------------------------------------------------------


def demo_like_run(root: Path, media: Path, steps: tuple[int, ...] = (1, 2, 3), n: int = 8,
                  dest: str | None = None) -> None:  # fmt: skip
    """Checkpoints and debug dumps as the demo's run writes them (``--save``'s ``rollout/``
    and ``--save-debug-rollout-data``), of the demo's 1920x1080 desktops with small photos."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from screenshots import render_screenshot
    finally:
        sys.path.remove(str(ROOT / "examples"))
    media.mkdir(parents=True, exist_ok=True)
    shots = []
    for k in range(6):
        p = media / f"desktop{k}.png"
        p.write_bytes(render_screenshot(k, noise_pixels=20_000))
        shots.append(str(p))
    base = dest or str(root)
    for step in steps:
        samples = []
        for i in range(n):
            acts = [ACTIONS[(i + t + step) % len(ACTIONS)] for t in range(3)]
            samples.append({
                "index": i, "group_index": i // 4,
                "prompt": f"<|im_start|>user\ntask {i // 4}: open Settings and turn on dark mode<|im_end|>",
                "response": "".join(f"<tool_call>{a}</tool_call>" for a in acts) + f" step{step}word{i}",
                "response_length": 20 + i, "reward": float((i + step) % 2),
                "status": "truncated" if i % 3 == 0 else "completed",
                "tokens": list(range(60)), "rollout_log_probs": [-0.05 - 0.01 * (k % 7) for k in range(20)],
                "multimodal_inputs": {"images": [shots[(i + t) % len(shots)] for t in range(3)]},
                "metadata": {"actions": acts, "screen": [1920, 1080]},
            })  # fmt: skip
        write_bundle(f"{base}/ckpt/rollout/fully_async_{step}", samples, media_roots=[media],
                     kind="rollout_checkpoint", meta={"rollout_id": step},
                     shared_media=dest is not None)  # fmt: skip
        write_bundle(f"{base}/debug/rollout_{step}.bundle", samples, media_roots=[media], kind="debug_dump",
                     meta={"rollout_id": step}, shared_media=dest is not None)  # fmt: skip


def wait_indexed(page: Any, url: str) -> None:
    """Load ``url`` until the bundle page lists rows (an index may still be building)."""
    deadline = time.monotonic() + 30
    while True:
        page.goto(url)
        if page.locator("table a[href*='/s/']").count() or time.monotonic() > deadline:
            return
        time.sleep(0.3)


def click_through(page: Any, watch: Watch, url: str, shots: Path, tag: str) -> dict[str, Any]:
    """run -> bundle -> filter -> sample -> large view -> prompt history -> compare, by clicks."""
    seen: dict[str, Any] = {}
    sample_url = to_the_large_view(page, url, shots, tag, seen)
    prompt_and_compare(page, url, sample_url, shots, tag, seen)
    assert scripts_ran(page)["scripts"] == 0
    assert watch.dialogs == [] and watch.errors == [], (watch.dialogs, watch.errors)
    check_headers(watch, url)
    return seen


def to_the_large_view(page: Any, url: str, shots: Path, tag: str, seen: dict[str, Any]) -> str:
    """run -> bundle -> filter -> sample -> large view; the sample page's URL."""
    page.goto(url)
    rows = page.locator("a[href^='/b/']")
    names = [rows.nth(k).inner_text() for k in range(rows.count())]
    seen["bundles"] = names
    page.screenshot(path=str(shots / f"{tag}-1-run.png"), full_page=True)

    # A bundle: the checkpoint of step 2.
    page.get_by_role("link", name="ckpt/rollout/fully_async_2", exact=True).click()
    page.wait_for_load_state()
    assert re.search(r"/b/[0-9a-f]{16}$", page.url), page.url
    wait_indexed(page, page.url)
    bundle_url = page.url
    assert page.locator("table a[href*='/s/']").count() == 8
    page.screenshot(path=str(shots / f"{tag}-2-bundle.png"), full_page=True)

    # A filter, as a person sets it: the status menu, then the form's button (or Enter).
    page.select_option("form.filters select[name=status]", "truncated")
    submit = page.locator("form.filters button[type=submit], form.filters input[type=submit]")
    if submit.count():
        submit.first.click()
    else:
        page.locator("form.filters input[name=q]").press("Enter")
    page.wait_for_load_state()
    assert "status=truncated" in page.url, page.url
    statuses = page.locator("table tbody .badge").all_inner_texts()
    seen["filtered"] = statuses
    assert statuses and set(statuses) == {"truncated"}, statuses
    page.screenshot(path=str(shots / f"{tag}-3-filter.png"), full_page=True)

    # A sample: its turns' screenshots decode and are drawn at their size.
    page.locator("table a[href*='/s/3']").first.click()
    page.wait_for_load_state()
    assert page.url.endswith("/s/3"), page.url
    thumbs = page.locator("a.shot")
    assert thumbs.count() == 3
    widths = images_loaded(page, "a.shot img, a.shot image, svg.defs image")
    assert widths and all(w > 0 for w in widths), widths
    box = thumbs.first.bounding_box()
    assert box is not None and box["width"] > 150, box
    page.screenshot(path=str(shots / f"{tag}-4-sample.png"), full_page=True)
    sample_url = page.url

    # The large view: a click on a thumbnail opens it (CSS :target), with its action drawn.
    thumbs.nth(1).click()
    target = page.url.split("#", 1)[1]
    view = page.locator(f"[id='{target}']")
    view.wait_for(state="visible")
    vbox = view.bounding_box()
    assert vbox is not None and vbox["width"] > 800, vbox
    assert view.locator(".ov, .ov-fill").count() > 0, "no action drawn over the large view"
    page.screenshot(path=str(shots / f"{tag}-5-large-view.png"))
    view.get_by_role("link", name=re.compile("close")).last.click()
    assert not view.is_visible()
    seen["bundle_url"] = bundle_url
    return sample_url


def prompt_and_compare(
    page: Any, url: str, sample_url: str, shots: Path, tag: str, seen: dict[str, Any]
) -> None:
    """From a sample page: its prompt across training, then compare it, then compare two bundles."""

    # The prompt across training: the same prompt at steps 1, 2 and 3.
    page.get_by_role("link", name="this prompt across training").first.click()
    page.wait_for_load_state()
    assert "/prompt?" in page.url
    body = page.locator("body").inner_text()
    for step in (1, 2, 3):
        assert f"fully_async_{step}" in body, step
    seen["prompt"] = page.url
    page.screenshot(path=str(shots / f"{tag}-6-prompt-history.png"), full_page=True)

    # Compare: this sample with the same position in the dump of step 3, from the sample's form.
    page.goto(sample_url)
    form = page.locator("form[action='/compare/samples']")
    options = form.locator("select[name=b] option")
    labels = [options.nth(k).inner_text() for k in range(options.count())]
    pick = next(k for k, t in enumerate(labels) if "rollout_3" in t)
    form.locator("select[name=b]").select_option(index=pick)
    form.locator("button[type=submit], input[type=submit]").first.click()
    page.wait_for_load_state()
    assert "/compare/samples?" in page.url, page.url
    text = page.locator("body").inner_text()
    assert "fully_async_2" in text and "rollout_3" in text, text[:500]
    page.screenshot(path=str(shots / f"{tag}-7-compare-samples.png"), full_page=True)

    # Compare two bundles from the run page's form.
    page.goto(url)
    run_form = page.locator("form[action='/compare']")
    run_form.locator("select[name=a]").select_option(index=0)
    run_form.locator("select[name=b]").select_option(index=1)
    run_form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert "/compare?" in page.url, page.url
    page.screenshot(path=str(shots / f"{tag}-8-compare-bundles.png"), full_page=True)


def test_a_person_clicks_through_a_demo_like_run(
    page: tuple[Any, Watch], tmp_path: Path, shots_dir: Path
) -> None:
    p, watch = page
    root = tmp_path / "run"
    demo_like_run(root, tmp_path / "media")
    server = Serve(str(root), tmp_path)
    try:
        seen = click_through(p, watch, server.url, shots_dir, "local")
    finally:
        server.close()
    assert sorted(seen["bundles"]) == sorted(
        [f"ckpt/rollout/fully_async_{s}" for s in (1, 2, 3)]
        + [f"debug/rollout_{s}.bundle" for s in (1, 2, 3)]
    )
    assert len(list(shots_dir.glob("local-*.png"))) == 8


def test_a_person_clicks_through_a_run_on_seaweedfs(
    seaweed_s3: Any, page: tuple[Any, Watch], tmp_path: Path, shots_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in seaweed_s3.env.items():
        monkeypatch.setenv(k, v)
    bucket = seaweed_s3.bucket()
    prefix = f"s3://{bucket}/run"
    demo_like_run(tmp_path / "unused", tmp_path / "media", dest=prefix)
    p, watch = page
    server = Serve(prefix, tmp_path, env=dict(seaweed_s3.env))
    try:
        seen = click_through(p, watch, server.url, shots_dir, "seaweedfs")
    finally:
        server.close()
    assert len(seen["bundles"]) == 6
    assert len(list(shots_dir.glob("seaweedfs-*.png"))) == 8


# -- the hostile vectors, route by route ---------------------------------------------------------------


def copy_vectors(dest: Path) -> list[str]:
    """The hostile bundles (directories and packed files; not the runtime-made ones) under ``dest``."""
    names = []
    for row in json.loads((HOSTILE / "expected.json").read_text()).values():
        src = HOSTILE / row["path"]
        if row.get("runtime") or not (src.is_dir() or src.is_file()):
            continue
        if src.is_dir():
            shutil.copytree(src, dest / row["path"], symlinks=True)
        else:
            shutil.copy2(src, dest / row["path"])
        names.append(row["path"])
    for row in json.loads((HOSTILE / "view" / "expected.json").read_text()).values():
        shutil.copytree(HOSTILE / "view" / row["path"], dest / row["path"], symlinks=True)
        names.append(row["path"])
    return names


def test_the_hostile_vectors_run_no_script_in_the_browser(
    page: tuple[Any, Watch], tmp_path: Path, shots_dir: Path
) -> None:
    root = tmp_path / "hostile"
    root.mkdir()
    assert len(copy_vectors(root)) > 40
    p, watch = page
    server = Serve(str(root), tmp_path)
    try:
        p.goto(server.url)
        p.screenshot(path=str(shots_dir / "hostile-run.png"), full_page=True)
        ids = list(dict.fromkeys(re.findall(r'href="/b/([0-9a-f]{16})"', p.content())))
        assert len(ids) > 20, len(ids)
        routes = 0
        for k, bid in enumerate(ids):
            for path in (f"b/{bid}", f"b/{bid}?q=script&sort=reward&order=desc", f"b/{bid}/groups",
                         f"b/{bid}/group?g=0", f"b/{bid}/s/0"):  # fmt: skip
                r = p.goto(
                    server.url + path, wait_until="load" if path.endswith("/s/0") else "domcontentloaded"
                )
                assert r is not None and r.headers.get("content-security-policy") == CSP, path
                assert "Traceback" not in p.content(), path
                ran = scripts_ran(p)
                assert ran == {"scripts": 0, "handlers": 0, "iframes": 0, "pwned": False}, (path, ran)
                routes += 1
            # The sample's first large view opened and closed, as a person would.
            shots = p.locator("a.shot")
            for j in range(min(shots.count(), 1)):
                shots.nth(j).click()
                target = p.url.split("#", 1)[1]
                assert scripts_ran(p)["pwned"] is False
                p.locator(f"[id='{target}']").get_by_role("link", name=re.compile("close")).last.click()
            if k < 3:
                p.screenshot(path=str(shots_dir / f"hostile-{k}-sample.png"))
            # The prompt history and the comparison with the next bundle.
            prompt = p.locator("a[href^='/prompt?']")
            if prompt.count():
                prompt.first.click()
                p.wait_for_load_state()
                assert scripts_ran(p)["scripts"] == 0
                routes += 1
            other = ids[(k + 1) % len(ids)]
            for path in (f"compare?a={bid}&b={other}", f"compare/samples?a={bid}&i=0&b={other}&j=0"):
                p.goto(server.url + path, wait_until="domcontentloaded")
                assert scripts_ran(p)["scripts"] == 0, path
                routes += 1
        assert routes > 5 * len(ids)
    finally:
        server.close()
    assert watch.dialogs == [], watch.dialogs
    # No console error comes from a bundle's content: the only ones allowed are the browser's
    # own report of a failed load (an error page's status, a picture that cannot be shown).
    content = [
        e
        for e in watch.errors
        if not re.search(r"Failed to load resource: the server responded with a status of (4\d\d|50[23])", e)
    ]
    assert content == [], content[:10]
    check_headers(watch, server.url)


# -- genuine bundles beside hostile ones (issue 36) ------------------------------------------------------


def issue36_vectors(root: Path, run: Path) -> dict[str, str]:
    """The run browser's attacks of issue 36 (items 10-12), made at run time beside the run's
    genuine bundles: {where: what the run page must name}. Two of them are copies of the genuine
    step-2 checkpoint (one identity) listed before it: one whose shard is a FIFO, one whose
    screenshots are FIFOs (a cache keyed by digest must not take their errors for the genuine
    pictures')."""
    genuine = run / "ckpt" / "rollout" / "fully_async_2"
    made: dict[str, str] = {}
    twin = root / "a-twin" / "fully_async_2"
    shutil.copytree(genuine, twin)
    shard = next((twin / "samples").iterdir())
    shard.chmod(0o644)
    shard.unlink()
    os.mkfifo(shard)
    # Its row: its own note ("expected a regular file, found a FIFO") when it was indexed first, or
    # the index of its identity built from the genuine copy's verified shards when that came first
    # (the order the indexer takes them in is the run's, not this test's): either way a row.
    made["a-twin/fully_async_2"] = "a-twin/fully_async_2"
    fifo = root / "a-fifo" / "fully_async_2"
    shutil.copytree(genuine, fifo)
    for m in (fifo / "media").iterdir():
        m.chmod(0o644)
        m.unlink()
        os.mkfifo(m)
    made["a-fifo/fully_async_2"] = "a-fifo/fully_async_2"  # served: its rows, its pictures refused
    small = [{"index": 0, "prompt": "p", "response": "r", "reward": 1.0}]
    linked = write_bundle(root / "linked-samples", small, meta={"rollout_id": 40})
    outside = root.parent / "outside-samples"
    (linked / "samples").rename(outside)
    (linked / "samples").symlink_to(outside)
    made["linked-samples"] = "samples: expected a directory, found a symlink"
    write_bundle(root / os.fsdecode(b"not-utf8-\xff"), small, meta={"rollout_id": 41})
    made["not-utf8-\\xff"] = "not-utf8-\\xff"
    write_bundle(root / "surrogate", small, meta={"rollout_id": 42, "note": "\ud800"})
    made["surrogate"] = "surrogate"
    deep = write_bundle(root / "deep-report", small, meta={"rollout_id": 43})
    Path(f"{deep}.replay.json").write_text("[" * 200_000)
    made["deep-report"] = "deep-report"
    return made


def test_genuine_bundles_browse_normally_beside_the_hostile_vectors(
    page: tuple[Any, Watch], tmp_path: Path, shots_dir: Path
) -> None:
    """Issue 36: a run holding every hostile vector beside genuine bundles. The genuine ones are
    browsed as a person would (run -> bundle -> filter -> sample with its screenshots -> large
    view); every hostile one is its own row or its own note on the run page; no page is a 500."""
    root = tmp_path / "run"
    demo_like_run(root, tmp_path / "media")
    (root / "hostile").mkdir()
    vectors = copy_vectors(root / "hostile")
    made = issue36_vectors(root / "hostile36", root)
    p, watch = page
    server = Serve(str(root), tmp_path)
    try:
        # The FIFO copy's sample first: its pictures are refused, on its page only.
        p.goto(server.url)
        fifo_id = p.locator("a", has_text="hostile36/a-fifo/fully_async_2").first.get_attribute("href")
        assert fifo_id is not None
        r = p.goto(server.url + fifo_id.lstrip("/") + "/s/3", wait_until="load")
        assert r is not None and r.status == 200
        assert "expected a regular file, found a FIFO" in p.locator("body").inner_text()
        seen: dict[str, Any] = {}
        to_the_large_view(p, server.url, shots_dir, "beside", seen)  # the genuine step 2, by clicks
        # The run page once every bundle is indexed or failed.
        deadline = time.monotonic() + 120
        while True:
            p.goto(server.url)
            text = p.locator("body").inner_text()
            if "not indexed yet" not in text or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        p.screenshot(path=str(shots_dir / "beside-run.png"), full_page=True)
        for name in vectors:  # each hostile bundle: its own row, or its own note
            if is_bundle(root / "hostile" / name):
                assert f"hostile/{name}" in text, name
        for where, fragment in made.items():
            assert f"hostile36/{where}" in text and fragment in text, (where, fragment)
        genuine_rows = [p.locator("tr", has=p.get_by_role("link", name=n, exact=True)).inner_text()
                        for n in ("ckpt/rollout/fully_async_2", "debug/rollout_3.bundle")]  # fmt: skip
        for row in genuine_rows:  # its measures, not a neighbour's error
            assert "cannot index" not in row and "completed" in row, row
        # Every bundle's pages: none is a 500.
        ids = list(dict.fromkeys(re.findall(r'href="/b/([0-9a-f]{16})"', p.content())))
        for bid in ids:
            for path in (f"b/{bid}", f"b/{bid}/s/0", f"b/{bid}/group?g=0"):
                r = p.goto(server.url + path, wait_until="domcontentloaded")
                assert r is not None and r.status != 500, (path, r.status if r else None)
                assert scripts_ran(p)["scripts"] == 0, path
    finally:
        server.close()
    assert watch.dialogs == [], watch.dialogs
    assert "Traceback" not in server.log.read_text(), server.log.read_text()[-3000:]
    check_headers(watch, server.url)
