"""``rollout-bundle serve ROOT`` (issue 32): a read-only web application over a run's bundles.

Routes are driven through Starlette's TestClient on real bundles written by ``write_bundle``;
one real ``rollout-bundle serve`` subprocess on a free port answers raw HTTP (traversal with
encoded separators, a foreign Host header), another bound beyond loopback asks for its token.
The hostile vectors of ``tests/vectors/hostile`` are served and every route is checked on each.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import html
import http.client
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import noise_png, put_media, wait_until

from bundles import is_bundle, pack_bundle, remove_bundle, write_bundle
from bundles.support import LIMITS
from trainer_hooks.view import OVERLAY_COLOR, advantages

pytest.importorskip("starlette", reason="serve needs the [serve] extra (starlette)")
pytest.importorskip("jinja2", reason="serve needs the [serve] extra (jinja2)")
pytest.importorskip("PIL.Image")
from starlette.testclient import TestClient

from trainer_hooks.serve import CSP, TOKEN_COOKIE, create_app

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "vectors" / "hostile"
ACTIONS = ["click(100, 50)", "type('dark mode')", "scroll(0, -3)"]


# -- a run as a trainer writes it -------------------------------------------------------------------------


def _shots(media: Path, n: int, seed: int = 0) -> list[str]:
    return [put_media(media, noise_png(96, 54, seed + k)) for k in range(n)]


def make_samples(shots: list[str], n: int, step: int, per_group: int = 4) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        g = i // per_group
        out.append({
            "index": i,
            "group_index": g,
            "prompt": f"task {g}: open the settings and switch on dark mode <b>now</b>",
            "response": "".join(f"<tool_call>{a}</tool_call>" for a in ACTIONS[:2])
            + (f" word{i}x{step}" if i % 5 == 0 else ""),
            "response_length": 10 + i,
            "reward": float((i + step) % 3 == 0),
            "status": "truncated" if i % 7 == 0 else "completed",
            "multimodal_inputs": {"images": [shots[(i + t) % len(shots)] for t in range(2)]},
            "metadata": {"actions": ACTIONS[:2], "screen": [960, 540]},
            "tokens": list(range(20 + i)),
            "rollout_log_probs": [-0.1 - 0.01 * k for k in range(10)],
        })  # fmt: skip
    return out


def make_run(root: Path, steps: tuple[int, ...] = (1, 2, 3), n: int = 12) -> dict[int, Path]:
    media = root.parent / f"{root.name}-media"
    shots = _shots(media, 4)
    out = {}
    for step in steps:
        out[step] = Path(write_bundle(root / "ckpt" / "rollout" / f"fully_async_{step}",
                                      make_samples(shots, n, step), media_roots=[media],
                                      kind="rollout_checkpoint", meta={"rollout_id": step}))  # fmt: skip
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    make_run(root)
    return root


def ids_of(page: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r'href="/b/([0-9a-f]{16})"', page)))


def unescape(href: str) -> str:
    return html.unescape(href)


def indexed(app: Any, errors: bool = False) -> None:
    """Wait until every bundle's index is complete (or, with ``errors``, has failed)."""
    state = app.state.serve
    for e in state.run.ordered():
        state.indexer.want(e)
    wait_until(lambda: all(state.indexer.state(e).complete or state.indexer.state(e).error
                           for e in state.run.ordered()), "every bundle indexed")  # fmt: skip
    if not errors:
        failed = [state.indexer.state(e).error for e in state.run.ordered() if state.indexer.state(e).error]
        assert not failed, failed


@pytest.fixture
def served(run: Path, tmp_path: Path) -> Iterator[tuple[TestClient, Any]]:
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        yield client, app


def entry_by_step(app: Any, step: int) -> Any:
    return next(e for e in app.state.serve.run.ordered() if e.step == step)


def assert_page(r: Any, status: int = 200) -> str:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    text = r.text
    assert "Traceback" not in text and "<script" not in text.lower()
    return text


# -- the run --------------------------------------------------------------------------------------------


def test_the_run_page_shows_every_committed_bundle_with_its_measures_and_trends(
    run: Path, tmp_path: Path
) -> None:
    # What is not a bundle stays out: a directory without a manifest (a writer that died), a user file.
    (run / "ckpt" / "rollout" / "fully_async_9").mkdir()
    (run / "ckpt" / "rollout" / "fully_async_9" / "samples").mkdir()
    (run / "notes.txt").write_text("mine")
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        text = assert_page(client.get("/"))
    assert len(ids_of(text)) == 3
    assert "fully_async_9" not in text and "notes.txt" not in text
    for step in (1, 2, 3):
        rewards = [float((i + step) % 3 == 0) for i in range(12)]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        row = re.search(rf"<tr><td class=\"num\">{step}</td>.*?</tr>", text, re.S)
        assert row, step
        assert f">{mean:.3g}<" in row.group(0) and f">{std:.3g}<" in row.group(0)
        assert "truncated" in row.group(0) and "completed" in row.group(0)
    assert text.count('<svg class="trend"') == 4  # reward, length, turns, truncation across steps
    assert "reward mean ± std" in text


def test_checkpoints_and_dumps_are_two_series_of_trends(run: Path, tmp_path: Path) -> None:
    media = tmp_path / "dm"
    for step in (1, 2):
        write_bundle(run / "debug" / f"rollout_{step}.bundle", make_samples(_shots(media, 2, seed=50), 4, step),
                     media_roots=[media], kind="debug_dump", meta={"rollout_id": step})  # fmt: skip
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        text = assert_page(client.get("/"))
    assert len(ids_of(text)) == 5
    assert text.count('<svg class="trend"') == 8
    assert "reward mean ± std · debug_dump" in text and "reward mean ± std · rollout_checkpoint" in text
    assert "debug/rollout_2.bundle" in text


def test_follow_picks_up_bundles_committed_while_serving_and_never_a_half_written_one(
    run: Path, tmp_path: Path
) -> None:
    app = create_app(run, cache_dir=tmp_path / "cache", follow=0.1)
    with TestClient(app) as client:
        assert len(ids_of(client.get("/").text)) == 3
        half = run / "ckpt" / "rollout" / "fully_async_4"
        (half / "samples").mkdir(parents=True)  # shards written, no manifest yet
        time.sleep(0.5)
        assert len(ids_of(client.get("/").text)) == 3
        shutil.rmtree(half)
        media = tmp_path / "m4"
        write_bundle(half, make_samples(_shots(media, 2, seed=40), 5, 4), media_roots=[media],
                     meta={"rollout_id": 4})  # fmt: skip
        wait_until(lambda: len(ids_of(client.get("/").text)) == 4, "the new bundle on the run page")
        assert ">4</td>" in client.get("/").text
        # A checkpoint rewritten in place is read again; one a retention policy removed goes.
        first = run / "ckpt" / "rollout" / "fully_async_1"
        write_bundle(first, make_samples(_shots(media, 2, seed=41), 7, 1), media_roots=[media],
                     meta={"rollout_id": 1}, overwrite=True)  # fmt: skip
        remove_bundle(run / "ckpt" / "rollout" / "fully_async_2")

        def shown() -> bool:
            text = client.get("/").text
            return (
                len(ids_of(text)) == 3
                and "fully_async_2" not in text
                and bool(re.search(r'fully_async_1</a></td><td>[^<]*</td><td class="num">7</td>', text))
            )

        wait_until(shown, "the rewritten checkpoint re-read and the removed one gone")
        e = entry_by_step(app, 1)
        indexed(app)
        assert "7 of 7 samples match" in client.get(f"/b/{e.id}").text


# -- a bundle -------------------------------------------------------------------------------------------


def test_the_bundle_page_filters_sorts_searches_and_pages_on_the_server(
    served: tuple[TestClient, Any],
) -> None:
    client, app = served
    e = entry_by_step(app, 2)
    base = f"/b/{e.id}"
    page = assert_page(client.get(base))
    assert "12 of 12 samples match" in page
    truncated = assert_page(client.get(base, params={"status": "truncated"}))
    assert "2 of 12 samples match" in truncated  # positions 0 and 7
    assert re.findall(r'href="/b/[0-9a-f]+/s/(\d+)"', truncated) == ["0", "7"]
    best = assert_page(client.get(base, params={"sort": "reward", "order": "desc", "limit": "3"}))
    first = re.findall(r'href="/b/[0-9a-f]+/s/(\d+)"', best)
    assert [float((int(p) + 2) % 3 == 0) for p in first] == [1.0, 1.0, 1.0]
    longest = assert_page(client.get(base, params={"sort": "length", "order": "desc", "limit": "2"}))
    assert re.findall(r'href="/b/[0-9a-f]+/s/(\d+)"', longest) == ["11", "10"]
    found = assert_page(client.get(base, params={"q": "word5x2"}))
    assert "1 of 12 samples match" in found
    assert re.findall(r'href="/b/[0-9a-f]+/s/(\d+)"', found) == ["5"]
    ranged = assert_page(client.get(base, params={"length_min": "15", "length_max": "17", "turns_min": "2"}))
    assert re.findall(r'href="/b/[0-9a-f]+/s/(\d+)"', ranged) == ["5", "6", "7"]
    group = assert_page(client.get(base, params={"group": "1"}))
    assert re.findall(r'href="/b/[0-9a-f]+/s/(\d+)"', group) == ["4", "5", "6", "7"]

    # Keyset paging: following "next" visits every sample once, in the sort's order.
    for sort, order in (("position", "asc"), ("reward", "desc"), ("advantage", "asc")):
        seen: list[int] = []
        url: str | None = f"{base}?sort={sort}&order={order}&limit=5"
        while url:
            text = assert_page(client.get(url))
            page_rows = [int(p) for p in re.findall(r'href="/b/[0-9a-f]+/s/(\d+)"', text)]
            assert 0 < len(page_rows) <= 5  # the page size travels with the next link
            seen += page_rows
            nxt = re.search(r'href="([^"]+)">next page', text)
            url = unescape(nxt.group(1)) if nxt else None
        assert sorted(seen) == list(range(12)), (sort, seen)
    for bad in (
        {"reward_min": "lots"},
        {"sort": "pos; DROP TABLE samples"},
        {"after": "x:y"},
        {"order": "up"},
    ):
        assert_page(client.get(base, params=bad), 400)
    # FTS5 syntax in the box is words, never an operator or an error.
    assert "0 of 12" in assert_page(client.get(base, params={"q": 'NEAR("a" b) OR * "'}))


def test_the_index_is_built_once_and_cached_by_the_bundles_identity(run: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    app = create_app(run, cache_dir=cache)
    with TestClient(app):
        indexed(app)
        e = entry_by_step(app, 1)
        index = cache / "index" / f"{e.identity}.sqlite"
        assert index.is_file()
        assert len(list((cache / "index").glob("*.sqlite"))) == 3
        assert not list((cache / "index").glob("*.building.sqlite"))
        before = index.stat().st_mtime_ns
    app = create_app(run, cache_dir=cache)  # a second server: nothing rebuilt
    with TestClient(app) as client:
        e = entry_by_step(app, 1)
        assert app.state.serve.indexer.state(e).complete  # at once: no build
        assert "12 of 12" in client.get(f"/b/{e.id}").text
    assert index.stat().st_mtime_ns == before
    # The same place holding another bundle is another identity: indexed again, never the old rows.
    media = tmp_path / "m"
    write_bundle(e.location, make_samples(_shots(media, 2, seed=9), 3, 1), media_roots=[media],
                 meta={"rollout_id": 1}, overwrite=True)  # fmt: skip
    app = create_app(run, cache_dir=cache)
    with TestClient(app) as client:
        indexed(app)
        e2 = entry_by_step(app, 1)
        assert e2.identity != e.identity
        assert "3 of 3" in client.get(f"/b/{e2.id}").text
    # A packed copy of a bundle is the same bundle: one index serves both.
    packed = run / "copy.rbundle"
    pack_bundle(entry_by_step(app, 2).location, packed)
    app = create_app(run, cache_dir=cache)
    with TestClient(app) as client:
        copy = next(x for x in app.state.serve.run.ordered() if x.location.endswith("copy.rbundle"))
        assert copy.identity == entry_by_step(app, 2).identity
        assert app.state.serve.indexer.state(copy).complete
        # Read in place: the packed file's screenshots by member range.
        page = assert_page(client.get(f"/b/{copy.id}/s/2"))
        href = unescape(re.findall(r'href="(/b/[0-9a-f]+/img/[^"]+)"', page)[0])
        assert client.get(href).content[:3] == b"\xff\xd8\xff"


def test_an_unindexed_bundle_shows_its_first_rows_and_a_wanted_one_is_not_queued_behind(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    media = tmp_path / "m"
    shots = _shots(media, 2)
    write_bundle(root / "rollout" / "fully_async_1", make_samples(shots, 6000, 1), media_roots=[media],
                 meta={"rollout_id": 1})  # fmt: skip
    write_bundle(root / "rollout" / "fully_async_2", make_samples(shots, 12, 2), media_roots=[media],
                 meta={"rollout_id": 2})  # fmt: skip
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        big, small = entry_by_step(app, 1), entry_by_step(app, 2)
        # The big one is first in the run's queue and being built; the one a page asks for is
        # built beside it, not after it.
        wait_until(lambda: app.state.serve.indexer.state(big).rows > 0, "the first bundle's build under way")
        page = assert_page(client.get(f"/b/{small.id}"))
        wait_until(lambda: "12 of 12 samples match" in client.get(f"/b/{small.id}").text, "the wanted bundle")
        assert not app.state.serve.indexer.state(big).complete
        t = time.perf_counter()
        page = assert_page(client.get(f"/b/{big.id}"))
        assert time.perf_counter() - t < 10
        assert re.search(r"of 6000 samples match \(of \d+ indexed so far\)", page)
        assert 'href="/b/' + big.id + '/s/0"' in page and "indexing:" in page
        assert '<meta http-equiv="refresh" content="3">' in page
        indexed(app)
        assert "6000 of 6000 samples match" in client.get(f"/b/{big.id}").text


def test_root_may_be_one_bundle_a_directory_or_a_packed_file(run: Path, tmp_path: Path) -> None:
    directory = run / "ckpt" / "rollout" / "fully_async_3"
    packed = tmp_path / "dump_3.rbundle"
    pack_bundle(directory, packed)
    for root in (directory, packed):
        app = create_app(root, cache_dir=tmp_path / "cache")
        with TestClient(app) as client:
            (e,) = app.state.serve.run.ordered()
            assert e.rel == root.name and e.step == 3
            indexed(app)
            assert "12 of 12 samples match" in assert_page(client.get(f"/b/{e.id}"))
            assert assert_page(client.get(f"/b/{e.id}/s/11")).count('<svg class="thumb"') == 2


def test_grpo_groups_side_by_side_with_their_advantages(served: tuple[TestClient, Any]) -> None:
    client, app = served
    e = entry_by_step(app, 1)
    groups = assert_page(client.get(f"/b/{e.id}/groups"))
    assert groups.count("/group?g=") == 3
    text = assert_page(client.get(f"/b/{e.id}/group", params={"g": "1"}))
    rewards = [float((i + 1) % 3 == 0) for i in range(4, 8)]
    expected = advantages(rewards)
    heads = re.findall(
        r'class="gcell ghead"><a href="/b/[0-9a-f]+/s/(\d+)">.*?advantage <b>([^<]+)</b>', text
    )
    assert [int(p) for p, _ in heads] == [4, 5, 6, 7]
    assert [float(a) for _, a in heads] == pytest.approx([float(f"{x:+.3g}") for x in expected])
    assert text.count('<svg class="thumb"') == 8  # two turns each, side by side
    assert_page(client.get(f"/b/{e.id}/group", params={"g": "nope"}), 404)


# -- a sample -------------------------------------------------------------------------------------------


def test_the_sample_page_draws_every_turn_with_its_action_and_caches_pictures_by_digest(
    served: tuple[TestClient, Any], tmp_path: Path
) -> None:
    client, app = served
    e = entry_by_step(app, 1)
    text = assert_page(client.get(f"/b/{e.id}/s/3"))
    assert text.count('<svg class="thumb"') == 2
    assert 'class="lb" id="v3-0"' in text and 'class="lb" id="v3-1"' in text  # the large views
    assert "click (100, 50)" in text and 'type "dark mode"' in html.unescape(text)
    # The mark of the click, scaled from the 960x540 screen to the 96x54 screenshot: (10, 5).
    assert re.search(r'<circle class="ov-halo" cx="10" cy="5"', text)
    assert "&lt;b&gt;now&lt;/b&gt;" in text  # the prompt's markup is text
    css = client.get("/static/style.css")
    assert css.status_code == 200 and OVERLAY_COLOR in css.text
    pictures = [unescape(h) for h in re.findall(r'href="(/b/[0-9a-f]+/img/[^"]+)"', text)]
    assert pictures
    for url in pictures:
        r = client.get(url)
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
        assert r.content[:3] == b"\xff\xd8\xff"
    thumbs = sorted((tmp_path / "cache" / "thumbs").rglob("*.320.jpg"))
    assert len(thumbs) == 2
    stamps = [p.stat().st_mtime_ns for p in thumbs]
    # The same screenshot in another bundle (one digest) is not decoded again.
    other = entry_by_step(app, 2)
    assert_page(client.get(f"/b/{other.id}/s/3"))
    assert [
        p.stat().st_mtime_ns for p in sorted((tmp_path / "cache" / "thumbs").rglob("*.320.jpg"))
    ] == stamps
    assert_page(client.get(f"/b/{e.id}/s/12"), 404)
    assert_page(client.get(f"/b/{e.id}/s/-1"), 404)
    assert_page(client.get(f"/b/{e.id}/img/{'0' * 64}.png?w=320"), 404)
    assert_page(client.get(pictures[0].replace("w=1280", "w=7").replace("w=320", "w=7")), 400)


def test_one_prompt_across_training_and_two_steps_side_by_side(served: tuple[TestClient, Any]) -> None:
    client, app = served
    e1, e3 = entry_by_step(app, 1), entry_by_step(app, 3)
    bundle = client.get(f"/b/{e1.id}", params={"group": "2"}).text
    key = unescape(re.search(r'href="(/prompt\?key=[^"]+)"', bundle).group(1))
    text = assert_page(client.get(key))
    for step in (1, 2, 3):
        rewards = [float((i + step) % 3 == 0) for i in range(8, 12)]
        assert re.search(rf'<td class="num">{step}</td><td><a href="/b/[0-9a-f]+">[^<]+</a></td><td class="num">4</td>'
                         rf'<td class="num">{sum(rewards) / 4:.3g}</td>', text), step  # fmt: skip
    assert '<svg class="trend"' in text
    side = assert_page(client.get(key + f"&a={e1.id}&b={e3.id}"))
    assert side.count('<section class="card sample"') == 8  # 4 samples of the prompt at each step
    assert "fully_async_1" in side and "fully_async_3" in side
    assert_page(client.get("/prompt"), 400)


def _open_indexes(cache: Path) -> list[str]:
    """This process's descriptors open on an index file under ``cache`` (Linux: /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(cache / "index")) and target.endswith(".sqlite"):
                found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc/self/fd")
def test_connections_to_complete_indexes_are_kept_between_requests_and_closed_at_shutdown(
    run: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    app = create_app(run, cache_dir=cache)
    with TestClient(app) as client:
        indexed(app)
        e1 = entry_by_step(app, 1)
        link = re.search(r'href="(/prompt\?key=[^"]+)"', client.get(f"/b/{e1.id}").text)
        assert link, "no prompt link on the bundle page"
        key = unescape(link.group(1))
        assert_page(client.get(key))  # reads every bundle's index
        kept = _open_indexes(cache)
        assert sorted(set(kept)) == sorted(str(app.state.serve.indexer.path(e.identity))
                                           for e in app.state.serve.run.ordered()), kept  # fmt: skip
        for _ in range(5):  # the same connections again, not new ones
            assert_page(client.get(key))
            assert_page(client.get(f"/b/{e1.id}", params={"sort": "reward"}))
        assert sorted(_open_indexes(cache)) == sorted(kept)
    assert _open_indexes(cache) == []  # the app's shutdown closed them


def test_compare_two_bundles_shows_what_rollout_bundle_diff_reports(served: tuple[TestClient, Any]) -> None:
    client, app = served
    a, b = entry_by_step(app, 1), entry_by_step(app, 2)
    page = assert_page(client.get("/compare", params={"a": a.id, "b": b.id}))
    text = html.unescape(page)
    done = subprocess.run([sys.executable, "-m", "trainer_hooks.cli", "diff", a.location, b.location, "--by", "index",
                           "--json"], capture_output=True, text=True, check=False)  # fmt: skip
    report = json.loads(done.stdout)
    changed = report["samples"]["changed"]
    assert changed
    for c in changed:  # a row per sample changed, with links to it on either side and side by side
        i, j = c["position_a"], c["position_b"]
        assert f'href="/b/{a.id}/s/{i}"' in page and f'href="/b/{b.id}/s/{j}"' in page
        assert f"/compare/samples?a={a.id}&i={i}&b={b.id}&j={j}" in text
    plain = re.sub(r"<[^>]+>", "", text)
    assert (
        f"{len(changed)} changed, 0 only in A, 0 only in B, {report['samples']['unchanged']} unchanged"
        in plain
    )
    assert "samples matched by index" in plain
    assert "meta.rollout_id: 1 -> 2" in text
    assert_page(client.get("/compare", params={"a": a.id, "b": "0" * 16}), 404)


def test_compare_two_samples_side_by_side(served: tuple[TestClient, Any]) -> None:
    client, app = served
    a, b = entry_by_step(app, 1), entry_by_step(app, 2)
    text = html.unescape(
        assert_page(client.get("/compare/samples", params={"a": a.id, "i": 2, "b": b.id, "j": 2}))
    )
    assert "reward: 1.0 -> 0.0" in text
    assert text.count('class="card sample"') == 2
    same = html.unescape(
        assert_page(client.get("/compare/samples", params={"a": a.id, "i": 4, "b": a.id, "j": 4}))
    )
    assert "the same" in same


def test_replay_verdicts_beside_a_bundle_are_shown_on_its_pages(run: Path, tmp_path: Path) -> None:
    from bundles import open_bundle
    from trainer_hooks.replay import bundle_identity

    target = run / "ckpt" / "rollout" / "fully_async_1"
    with open_bundle(target) as b:
        ident = bundle_identity(b)
    report = {"format": "rollout-bundle-replay", "version": 1, "bundle": str(target), "bundle_id": ident,
              "dtype": "bf16", "summary": {"samples": 2, "problems": {"token_count": 1}},
              "samples": [{"position": 0, "index": 0, "problems": [], "images": [],
                           "logprob_diff": {"max_abs": 0.25, "mean_abs": 0.01, "tokens": 10}},
                          {"position": 1, "index": 1, "images": [],
                           "problems": [{"kind": "token_count", "message": "3 placeholders <i>but</i> 4", "image": 1}]}]}  # fmt: skip
    Path(f"{target}.replay.json").write_text(json.dumps(report))
    other = run / "ckpt" / "rollout" / "fully_async_2"
    Path(f"{other}.replay.json").write_text(json.dumps(report))  # of another bundle: refused, said so
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        e, e2 = entry_by_step(app, 1), entry_by_step(app, 2)
        assert "2 samples replayed; problems: token_count 1" in client.get(f"/b/{e.id}").text
        ok = assert_page(client.get(f"/b/{e.id}/s/0"))
        assert "guard and token checks passed" in ok and "max <b>0.25</b>" in ok
        bad = assert_page(client.get(f"/b/{e.id}/s/1"))
        assert "3 placeholders &lt;i&gt;but&lt;/i&gt; 4 (image 1)" in bad
        assert "not in the replay report" in assert_page(client.get(f"/b/{e.id}/s/2"))
        note = html.unescape(client.get(f"/b/{e2.id}").text)
        assert "replay report beside the bundle not used" in note
        assert "Replay" not in client.get(f"/b/{e2.id}/s/0").text


def test_the_replays_log_prob_mismatch_sorts_a_bundle_and_draws_the_runs_trend(
    run: Path, tmp_path: Path
) -> None:
    """Reports with log-prob differences beside steps 1 and 3 (none beside 2), written as replay
    --model writes them with known numbers (issue 38, item 3)."""
    from helpers.logprob_reports import logprob_report

    # Step 1: samples 0..5 compared, sample p shifted by 0.01 (p + 1) a token, sample 4's token 3 by 0.6.
    shifts = {p: [0.01 * (p + 1)] * 10 for p in range(6)}
    shifts[4][3] = 0.6
    one = logprob_report(run / "ckpt" / "rollout" / "fully_async_1", shifts)
    three = logprob_report(run / "ckpt" / "rollout" / "fully_async_3", {p: [0.03] * 10 for p in range(12)})
    for step, report in ((1, one), (3, three)):
        Path(f"{run / 'ckpt' / 'rollout' / f'fully_async_{step}'}.replay.json").write_text(json.dumps(report))
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        e1, e2 = entry_by_step(app, 1), entry_by_step(app, 2)
        page = html.unescape(assert_page(client.get(f"/b/{e1.id}")))
        m = one["summary"]["logprob"]["mean_abs"]
        assert (
            f"log-prob mismatch: mean_abs over 6 samples: mean {m['mean']:.4g} · p50 {m['p50']:.4g}" in page
        )
        assert '<option value="mismatch"' in page and f'href="/b/{e1.id}?sort=mismatch&order=desc"' in page
        # Sorted by mean_abs, furthest first (sample 4: (9 x 0.05 + 0.6) / 10), those not compared last.
        ranked = html.unescape(assert_page(client.get(f"/b/{e1.id}", params={"sort": "mismatch", "order": "desc",
                                                                             "limit": 4})))  # fmt: skip
        assert re.findall(rf'<a href="/b/{e1.id}/s/(\d+)">', ranked) == ["4", "5", "3", "2"]
        assert '<td class="num">0.06</td>' in ranked and '<td class="num">0.105</td>' in ranked
        nxt = re.search(r'<a href="([^"]+)">next page', ranked)
        assert nxt is not None
        rest = assert_page(client.get(html.unescape(nxt.group(1)).replace("limit=4", "limit=50")))
        assert re.findall(rf'<a href="/b/{e1.id}/s/(\d+)">', rest) == ["1", "0", *map(str, range(11, 5, -1))]
        # Without a report beside it, the bundle offers no such sort and refuses it by name.
        assert '<option value="mismatch"' not in assert_page(client.get(f"/b/{e2.id}"))
        refused = html.unescape(assert_page(client.get(f"/b/{e2.id}", params={"sort": "mismatch"}), 400))
        assert "sort: mismatch needs a replay report beside the bundle" in refused
        # The sample: its strips against the recorded log-probs, the first token over 0.2 marked.
        sample = html.unescape(assert_page(client.get(f"/b/{e1.id}/s/4")))
        assert "first token over the threshold: turn 0, response token 3 (id 17), |diff| 0.6" in sample
        assert sample.count('<i class="over" style="left:35.000%"') == 3
        assert "k3 <b>" in sample and "TIS clipped <b>0</b> tokens" in sample
        # The run page: the mismatch across steps, from the two reports (step 2 has none).
        run_page = html.unescape(assert_page(client.get("/")))
        fig = run_page.split("log-prob mismatch: mean |Δ| of the samples (band p50…p99)", 1)[1].split(
            "</figure>"
        )[0]
        assert re.findall(r"<title>step (\d+): ([^<]+)</title>", fig) == [
            ("1", f"{m['mean']:.3g}"),
            ("3", "0.03"),
        ]
        assert '<polygon class="band"' in fig
        assert "log-prob mismatch: k3 KL estimate" in run_page


@pytest.mark.parametrize("limit", ["bytes", "reads"])
def test_the_runs_mismatch_trend_reads_reports_within_a_page_budget_then_the_rest(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str
) -> None:
    """A run page load reads at most TREND_REPORT_BYTES, and TREND_REPORT_READS reports, for its
    trend: a report past either is left for the next load (said on the page), whose trend then
    has both steps; a file over MAX_REPORT_BYTES is never read nor promised."""
    from helpers.logprob_reports import logprob_report

    from trainer_hooks.serve import _pages

    paths = {}
    for step, shift in ((1, 0.01), (3, 0.03)):
        target = run / "ckpt" / "rollout" / f"fully_async_{step}"
        report = logprob_report(target, {p: [shift] * 10 for p in range(6)})
        paths[step] = Path(f"{target}.replay.json")
        paths[step].write_text(json.dumps(report))
    big = run / "ckpt" / "rollout" / "fully_async_2.replay.json"
    with open(big, "wb") as f:  # sparse: a report over MAX_REPORT_BYTES, refused unread
        f.truncate(LIMITS["MAX_REPORT_BYTES"] + 1)
    if limit == "bytes":  # step 1's report fits (each read is charged its size + 1), step 3's does not
        monkeypatch.setattr(_pages, "TREND_REPORT_BYTES", paths[1].stat().st_size + paths[3].stat().st_size)
    else:
        monkeypatch.setattr(_pages, "TREND_REPORT_READS", 1)
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        title = "log-prob mismatch: mean |Δ| of the samples (band p50…p99)"
        first = html.unescape(assert_page(client.get("/")))
        fig = first.split(title, 1)[1].split("</figure>")[0]
        assert re.findall(r"<title>step (\d+): ", fig) == ["1"]
        assert "the log-prob mismatch of 1 more bundle is read on the next loads" in first
        second = html.unescape(assert_page(client.get("/")))
        fig = second.split(title, 1)[1].split("</figure>")[0]
        assert re.findall(r"<title>step (\d+): ", fig) == ["1", "3"]
        assert "read on the next loads" not in second


def test_two_runs_side_by_side_on_the_same_prompts(run: Path, tmp_path: Path) -> None:
    """``serve RUN_A RUN_B`` (issue 39, item 5): per step the same prompts' reward and success in
    each run, the prompts whose outcome differs most, one prompt's trajectories from both."""
    other = tmp_path / "runb"
    media = tmp_path / "runb-media"
    shots = _shots(media, 4, seed=50)
    written: dict[str, dict[int, list[dict[str, Any]]]] = {"run": {}, "runb": {}}
    for step in (1, 2, 3):
        written["run"][step] = make_samples(shots, 12, step)  # what make_run wrote for the run fixture
        samples = make_samples(shots, 12, step)
        for smp in samples:  # run B solves task 0 always and task 1 never
            smp["reward"] = {0: 1.0, 1: 0.0}.get(smp["group_index"], smp["reward"])
        written["runb"][step] = samples
        write_bundle(other / "ckpt" / "rollout" / f"fully_async_{step}", samples, media_roots=[media],
                     kind="rollout_checkpoint", meta={"rollout_id": step})  # fmt: skip
    # An eval bundle at step 2 (every reward 0): another kind, never summed into the rollouts' step 2.
    evals = make_samples(shots, 12, 2)
    for smp in evals:
        smp["reward"] = 0.0
    write_bundle(other / "ckpt" / "eval" / "eval_2", evals, media_roots=[media], kind="eval",
                 meta={"rollout_id": 2})  # fmt: skip
    app = create_app(run, cache_dir=tmp_path / "cache", more_roots=[other])
    with TestClient(app) as client:
        indexed(app)
        for r in app.state.serve.runs[1:]:
            for e in r.ordered():
                app.state.serve.indexer.want(e)
        state = app.state.serve
        wait_until(
            lambda: all(state.indexer.state(e).complete for _, e in state.entries()), "both runs indexed"
        )
        assert 'href="/runs"' in assert_page(client.get("/"))
        page = html.unescape(assert_page(client.get("/runs")))
        # The rollout kind (most bundles) is compared by default, and the page says so and links eval.
        assert '<div class="v">rollout_checkpoint</div><div class="k">kind of bundle compared</div>' in page
        assert 'compare instead: <a href="/runs?kind=eval">eval</a> (1)' in page
        rows = re.findall(r'<tr><td class="num">(\d+)</td>((?:<td class="num">[^<]*</td>){6})</tr>', page)
        assert [int(step) for step, _ in rows] == [1, 2, 3]
        for step, cells in rows:
            shown = re.findall(r'<td class="num">([^<]*)</td>', cells)
            expected = []
            for name in ("run", "runb"):
                rewards = [smp["reward"] for smp in written[name][int(step)]]
                success = sum(1 for x in rewards if x > 0) / len(rewards)
                expected += [f"{sum(rewards) / len(rewards):.3g}", f"{success:.0%}", str(len(rewards))]
            assert shown == expected, (step, shown, expected)

        # The prompts whose success differs most over the three steps, furthest first (ties by text).
        def rate(name: str, g: int) -> float:
            rewards = [
                smp["reward"] for st in (1, 2, 3) for smp in written[name][st] if smp["group_index"] == g
            ]
            return sum(1 for x in rewards if x > 0) / len(rewards)

        spreads = sorted(((abs(rate("run", g) - rate("runb", g)), g) for g in range(3)), key=lambda x: -x[0])
        listed = re.findall(r'<tr><td class="num">(\d+%)</td><td class="num">(\d+%)</td><td class="num">(\d+%)</td>'
                            r'<td class="head"><a href="([^"]+)">task (\d+):', page)  # fmt: skip
        assert [int(g) for *_, g in listed] == [g for _, g in spreads]
        spread, a_rate, b_rate, href, g = listed[0]
        assert (spread, a_rate, b_rate) == (f"{spreads[0][0]:.0%}", f"{rate('run', int(g)):.0%}",
                                            f"{rate('runb', int(g)):.0%}")  # fmt: skip
        # That prompt: the latest step of each run, side by side, each bundle named with its run.
        side = html.unescape(assert_page(client.get(html.unescape(href))))
        assert "<h3>step 3 · run · ckpt/rollout/fully_async_3</h3>" in side
        assert "<h3>step 3 · runb · ckpt/rollout/fully_async_3</h3>" in side
        assert side.count('<section class="card sample') == 2 * 4  # a task's four samples a side
        # A bundle of the second run is served by its id like the first run's.
        b_id = re.search(r"b=([0-9a-f]{16})", html.unescape(href)).group(1)
        assert "fully_async_3" in assert_page(client.get(f"/b/{b_id}"))
        # ?kind=eval compares the eval bundles: run B's step 2 alone (run A holds none, so no prompt is shared).
        evals_page = html.unescape(assert_page(client.get("/runs?kind=eval")))
        assert '<div class="v">eval</div><div class="k">kind of bundle compared</div>' in evals_page
        assert re.findall(r'<tr><td class="num">(\d+)</td>', evals_page) == ["2"]
        assert "no prompt every run holds" in evals_page
        unknown = html.unescape(assert_page(client.get("/runs?kind=nope")))
        assert "no bundle of kind nope with a step: comparing rollout_checkpoint" in unknown


def _entry(name: str, step: int) -> Any:
    from trainer_hooks.serve._run import BundleEntry

    return BundleEntry(id=name, location=name, rel=name, kind="rollout_checkpoint", samples=0, stored_bytes=0,
                       identity=name, step=step)  # fmt: skip


def test_runs_side_by_side_figures_are_one_pass_and_count_distinct_prompts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prompts that differ are found from each run's totals (prompts x runs, never walking the
    steps again), the totals are the sums over the steps, and left-out prompts count once each."""
    from trainer_hooks.serve import _versus

    steps, per_step, prompts = 400, 25, 1000  # 10,000 rows a run; each prompt at 10 steps
    runs = []
    for r in range(2):
        f = _versus._RunFigures(f"run{r}")
        for s in range(steps):
            rows = [
                (f"p{(s * per_step + i) % prompts}", 2, float(r + i % 3), (r + i) % 3)
                for i in range(per_step)
            ]
            f.add(_entry(f"r{r}s{s}", s), [(*row[:3], min(row[3], 2), f"task {row[0]}") for row in rows])
        runs.append(f)
    for f in runs:  # the totals are the per-step tallies summed, in the same pass
        for key in ("p0", "p517", "p999"):
            over = [t[key] for t in f.by_step.values() if key in t]
            assert (f.totals[key].n, f.totals[key].success) == (
                sum(t.n for t in over),
                sum(t.success for t in over),
            )
            assert f.latest[key].step == max(s for s, t in f.by_step.items() if key in t)

    class Counting(dict):  # type: ignore[type-arg]
        gets = 0

        def get(self, *a: Any) -> Any:
            Counting.gets += 1
            return super().get(*a)

    class Untouchable(dict):  # type: ignore[type-arg]
        def __getattribute__(self, name: str) -> Any:
            raise AssertionError(f"_differing walked the steps ({name})")

    expected = {k: [f.totals[k].success / f.totals[k].n for f in runs] for k in runs[0].heads}
    for f in runs:
        f.totals, f.by_step = Counting(f.totals), Untouchable()
    listed = _versus._differing(runs, set(runs[0].heads))
    assert Counting.gets == len(expected) * len(runs)  # prompts x runs look-ups, no step walked
    spreads = sorted((abs(a - b) for a, b in expected.values()), reverse=True)[: _versus.SHOWN_PROMPTS]
    assert [p["spread"] for p in listed] == [f"{x:.0%}" for x in spreads]

    monkeypatch.setattr(_versus, "MAX_PROMPTS", 3)
    f = _versus._RunFigures("small")
    for s in (1, 2):  # the same five prompts at two steps: two prompts beyond the three kept
        f.add(_entry(f"s{s}", s), [(f"k{i}", 1, 1.0, 1, "") for i in range(5)])
    assert (sorted(f.heads), sorted(f.left_out)) == (["k0", "k1", "k2"], ["k3", "k4"])


def test_runs_side_by_side_cache_rereads_only_when_its_sources_move() -> None:
    """A run's figures are read once while the bundles and their indexes' build state hold; a
    moved signature (an index completed) reads them again; the cache holds CACHE_RUNS runs."""
    from trainer_hooks.serve import _versus

    cache, reads = _versus._Cache(), []

    def read() -> Any:
        reads.append(1)
        return _versus._RunFigures(f"read {len(reads)}")

    first = cache.get("run", (("b1", False),), read)
    assert cache.get("run", (("b1", False),), read) is first and len(reads) == 1
    assert cache.get("run", (("b1", True),), read).name == "read 2"
    for i in range(_versus.CACHE_RUNS):
        cache.get(f"other{i}", (), read)
    assert (
        cache.get("run", (("b1", True),), read).name == f"read {_versus.CACHE_RUNS + 3}"
    )  # evicted, re-read


# -- safety ---------------------------------------------------------------------------------------------


def test_a_bundle_lying_about_a_digest_plants_no_picture_for_another(run: Path, tmp_path: Path) -> None:
    from PIL import Image, ImageStat

    sound = run / "ckpt" / "rollout" / "fully_async_1"
    liar = run / "ckpt" / "rollout" / "fully_async_9"
    shutil.copytree(sound, liar)  # a copy, then one screenshot's bytes swapped for another picture
    name = sorted(p.name for p in (liar / "media").iterdir())[0]
    (liar / "media" / name).chmod(0o644)
    red = io.BytesIO()
    Image.new("RGB", (96, 54), (255, 0, 0)).save(red, "PNG")
    size = (liar / "media" / name).stat().st_size
    # The same size (a PNG decodes the same with bytes after its end): only the digest tells.
    (liar / "media" / name).write_bytes(red.getvalue().ljust(size, b"\0"))
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        bad = next(e for e in app.state.serve.run.ordered() if e.rel.endswith("fully_async_9"))
        good = entry_by_step(app, 1)
        r = client.get(f"/b/{bad.id}/img/{name}?w=320")
        assert r.status_code == 404
        assert "its bytes are not the digest it is stored under" in r.text
        assert not list((tmp_path / "cache" / "thumbs").rglob(name.partition(".")[0] + "*"))
        r = client.get(f"/b/{good.id}/img/{name}?w=320")
        assert r.status_code == 200
        # The sound bundle's noise, not the liar's red: green averages about 128, never 0.
        assert ImageStat.Stat(Image.open(io.BytesIO(r.content)).convert("RGB")).mean[1] > 60


def test_every_template_escapes_and_none_is_marked_safe() -> None:
    from trainer_hooks.pages import environment

    env = environment()
    assert env.autoescape is True
    folder = ROOT / "trainer_hooks" / "serve" / "templates"
    for path in folder.glob("*.j2"):
        text = path.read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text, path.name
        assert "<script" not in text.lower(), path.name
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    page = env.get_template("error.html.j2").render(
        base="", crumbs=[(None, hostile)], refresh=None, version="x", title=hostile, status=400,
        heading=hostile, message=hostile,
    )  # fmt: skip
    assert "<script>" not in page and "<img src=x" not in page and "&lt;script&gt;" in page


def _copy_vectors(dest: Path) -> list[str]:
    """The hostile bundles (directories and packed files; not the runtime-made ones) under ``dest``."""
    table = json.loads((HOSTILE / "expected.json").read_text())
    names = []
    for row in table.values():
        if row.get("runtime"):
            continue
        src = HOSTILE / row["path"]
        if src.is_dir():
            shutil.copytree(src, dest / row["path"], symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dest / row["path"])
        else:
            continue
        names.append(row["path"])
    view = json.loads((HOSTILE / "view" / "expected.json").read_text())
    for row in view.values():
        shutil.copytree(HOSTILE / "view" / row["path"], dest / row["path"], symlinks=True)
        names.append(row["path"])
    return names


def test_every_route_holds_on_the_hostile_vectors(tmp_path: Path) -> None:
    root = tmp_path / "hostile"
    root.mkdir()
    names = _copy_vectors(root)
    assert len(names) > 40
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app, raise_server_exceptions=False) as client:
        text = assert_page(client.get("/"))
        state = app.state.serve
        served = {e.rel for e in state.run.ordered()}
        # A bundle is served, or named on the run page as not served: never silently dropped.
        for name in names:
            if is_bundle(root / name):
                assert name in served or name in html.unescape(text), name
        indexed(app, errors=True)
        for e in state.run.ordered():
            for url in (f"/b/{e.id}", f"/b/{e.id}?q=script&sort=reward&order=desc", f"/b/{e.id}/groups",
                        f"/b/{e.id}/s/0", f"/b/{e.id}/group?g=0"):  # fmt: skip
                r = client.get(url)
                assert r.status_code in (200, 400, 404, 502, 503), (e.rel, url, r.status_code)
                page = assert_page(r, r.status_code)
                assert "<script>alert" not in page and "<script>document" not in page, (e.rel, url)
            sample = client.get(f"/b/{e.id}/s/0")
            for href in re.findall(r'href="(/b/[0-9a-f]+/img/[^"]+)"', sample.text):
                r = client.get(unescape(href))
                assert r.status_code in (200, 404, 502)
                if r.status_code == 200:
                    assert r.headers["content-type"] == "image/jpeg" and r.content[:3] == b"\xff\xd8\xff"
                else:
                    assert_page(r, r.status_code)
            # Every stored media name of the manifest, whatever its suffix: only a JPEG or a page.
            for m in list(e.bundle.manifest.media)[:8]:
                r = client.get(f"/b/{e.id}/img/{m.digest[7:]}{m.suffix}?w=320")
                assert r.headers["content-type"] in ("image/jpeg", "text/html; charset=utf-8"), e.rel
        # view's vectors: each screenshot that cannot be shown is named on its sample page.
        view = json.loads((HOSTILE / "view" / "expected.json").read_text())
        for row in view.values():
            e = next(x for x in state.run.ordered() if x.rel == row["path"])
            page = html.unescape(client.get(f"/b/{e.id}/s/0").text)
            for fragment in row["not_shown"]:
                assert fragment in page, (row["path"], fragment)
            for fragment in row["absent"]:
                assert fragment not in client.get(f"/b/{e.id}/s/0").text, (row["path"], fragment)


def test_nothing_outside_root_is_read_whatever_the_url_says(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    media = tmp_path / "om"
    write_bundle(outside, make_samples(_shots(media, 2, seed=70), 3, 7), media_roots=[media],
                 meta={"rollout_id": 7})  # fmt: skip
    (run / "linked").symlink_to(outside)  # a symlink in the run to a bundle elsewhere
    (run / "ckpt" / "elsewhere").symlink_to(outside.parent)  # and to a directory holding one
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"TOP-SECRET")
    # A media file of a bundle replaced by a symlink to a file outside: not read through it.
    victim = run / "ckpt" / "rollout" / "fully_async_3"
    name = next(p.name for p in (victim / "media").iterdir())
    (victim / "media" / name).chmod(0o644)
    (victim / "media" / name).unlink()
    (victim / "media" / name).symlink_to(secret)
    app = create_app(run, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        rels = {e.rel for e in app.state.serve.run.ordered()}
        assert rels == {f"ckpt/rollout/fully_async_{s}" for s in (1, 2, 3)}
        e = entry_by_step(app, 3)
        r = client.get(f"/b/{e.id}/img/{name}?w=320")
        assert r.status_code in (404, 502) and b"TOP-SECRET" not in r.content
        for url in ("/b/../../etc/passwd", "/b/%2e%2e/%2e%2e/etc/passwd", f"/b/{e.id}/img/..%2F..%2Fmanifest.json",
                    f"/b/{e.id}/img/%2e%2e%2fmanifest.json?w=320", f"/b/{e.id}/img/{secret}?w=320",
                    "/static/../../../etc/passwd", "/static/style.css/../../manifest.json", f"/b/{e.id[:15]}",
                    f"/b/{e.id}/img/{name}%00.png?w=320"):  # fmt: skip
            r = client.get(url)
            assert r.status_code in (400, 404), (url, r.status_code)
            assert b"root:" not in r.content and b"format_version" not in r.content
    assert "TOP-SECRET" not in "".join(
        p.read_text("latin-1") for p in (tmp_path / "cache").rglob("*") if p.is_file()
    )


def test_read_only_errors_are_pages_and_the_token_is_required_when_set(run: Path, tmp_path: Path) -> None:
    app = create_app(run, cache_dir=tmp_path / "cache", token="s3cret-token")
    with TestClient(app) as client:
        r = client.get("/")
        assert_page(r, 403)
        assert "token" in r.text
        assert_page(client.get("/?token=wrong"), 403)
        r = client.get("/?token=s3cret-token", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        assert (
            f"{TOKEN_COOKIE}_80=s3cret-token" in r.headers["set-cookie"]
            and "HttpOnly" in r.headers["set-cookie"]
        )
        client.cookies.set(f"{TOKEN_COOKIE}_80", "s3cret-token")  # the TestClient's server: port 80
        assert len(ids_of(assert_page(client.get("/")))) == 3
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            r = client.request(method, "/")
            assert_page(r, 405)
        assert_page(client.get("/no/such/page"), 404)


def _serve(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "trainer_hooks.cli", "serve", *args, "--port", "0",
                             "--cache-dir", str(tmp_path / "cache")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read() if proc.stderr else "serve printed nothing")
    url = re.search(r"(http://\S+)", line)
    assert url, line
    return proc, url.group(1)


def _get(port: int, path: str, host: str | None = None, headers: dict[str, str] | None = None) -> Any:
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    con.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)  # the path exactly as written
    con.putheader("Host", host or f"127.0.0.1:{port}")
    for k, v in (headers or {}).items():
        con.putheader(k, v)
    con.endheaders()
    r = con.getresponse()
    body = r.read()
    con.close()
    return r, body


def test_rollout_bundle_serve_on_a_free_port_answers_raw_http_safely(run: Path, tmp_path: Path) -> None:
    proc, url = _serve([str(run), "--progress"], tmp_path)
    try:
        m = re.match(r"http://127\.0\.0\.1:(\d+)/$", url)
        assert m, url  # loopback by default
        port = int(m.group(1))
        r, body = _get(port, "/")
        assert r.status == 200 and r.getheader("content-security-policy") == CSP
        ids = ids_of(body.decode())
        assert len(ids) == 3
        bid = ids[0]
        wait_until(lambda: b"12 of 12 samples match" in _get(port, f"/b/{bid}")[1], "the bundle indexed")
        r, body = _get(port, f"/b/{bid}/s/1")
        assert r.status == 200 and b'<svg class="thumb"' in body
        # A page elsewhere that rebinds a name to 127.0.0.1 gets nothing.
        r, body = _get(port, "/", host="evil.example")
        assert r.status == 400 and b"b/" + bid.encode() not in body
        for path in ("/b/..%2f..%2f..%2fetc%2fpasswd", "/..%2f..%2fetc/passwd", "/%2e%2e/%2e%2e/etc/passwd",
                     f"/b/{bid}/img/..%2f..%2fmanifest.json", f"/b/{bid}/img/..%5c..%5cmanifest.json",
                     "//etc/passwd", "/b/" + bid + "/img/%2fetc%2fpasswd", "/static/..%2f..%2fpyproject.toml"):  # fmt: skip
            r, body = _get(port, path)
            assert r.status in (400, 404), (path, r.status)
            assert b"root:" not in body and b"format_version" not in body and b"[project]" not in body, path
            assert b"Traceback" not in body and r.getheader("content-type", "").startswith("text/html"), path
        r, body = _get(port, "/")
        con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        con.request("HEAD", f"/b/{bid}")
        head = con.getresponse()
        assert head.status == 200 and head.read() == b"" and head.getheader("content-security-policy") == CSP
        con.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode in (0, -15)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "indexing ckpt/rollout/fully_async_1" in err and "100.0%" in err  # progress on the terminal
    assert "Traceback" not in err


def test_beyond_loopback_serve_prints_a_token_once_and_asks_for_it(run: Path, tmp_path: Path) -> None:
    proc, url = _serve([str(run), "--host", "0.0.0.0", "--no-progress"], tmp_path)
    try:
        m = re.match(r"http://0\.0\.0\.0:(\d+)/\?token=([A-Za-z0-9_-]{32,})$", url)
        assert m, url
        port, token = int(m.group(1)), m.group(2)
        r, body = _get(port, "/")
        assert r.status == 403 and b"token" in body and b"/b/" not in body
        r, _ = _get(port, f"/?token={token}")
        assert r.status == 303
        cookie = r.getheader("set-cookie").split(";")[0]
        r, body = _get(port, "/", headers={"Cookie": cookie})
        assert r.status == 200 and len(ids_of(body.decode())) == 3
        assert cookie.startswith(f"{TOKEN_COOKIE}_{port}=")
        r, _ = _get(port, "/", headers={"Cookie": f"{TOKEN_COOKIE}_{port}=guess"})
        assert r.status == 403
        r, _ = _get(
            port, f"/?token={token}", headers={"Cookie": f"{TOKEN_COOKIE}_1={token}"}
        )  # another port's
        assert r.status == 303
        r, _ = _get(port, f"//evil.example/x?token={token}")
        assert r.status == 303 and r.getheader("location") == "/evil.example/x"  # never another site
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- on a store -----------------------------------------------------------------------------------------


@pytest.fixture(params=["seaweedfs", "azurite"])
def store_prefix(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty prefix on a store server on loopback: SeaweedFS (s3://) or Azurite (az://)."""
    if request.param == "seaweedfs":
        server: Any = request.getfixturevalue("seaweed_s3")
        prefix = f"s3://{server.bucket()}"
    else:
        server = request.getfixturevalue("azurite_az")
        prefix = f"az://{server.container()}"
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    return prefix


def test_a_run_on_a_store_is_served_in_place(store_prefix: str, tmp_path: Path) -> None:
    media = tmp_path / "m"
    shots = _shots(media, 3, seed=5)
    for step in (1, 2):
        write_bundle(f"{store_prefix}/run/rollout/fully_async_{step}", make_samples(shots, 6, step),
                     media_roots=[media], meta={"rollout_id": step}, shared_media=True)  # fmt: skip
    app = create_app(f"{store_prefix}/run", cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        text = assert_page(client.get("/"))
        assert len(ids_of(text)) == 2
        indexed(app)
        e = entry_by_step(app, 2)
        assert e.bundle.location == "object store"
        assert "6 of 6 samples match" in client.get(f"/b/{e.id}").text
        sample = assert_page(client.get(f"/b/{e.id}/s/1"))
        href = unescape(re.findall(r'href="(/b/[0-9a-f]+/img/[^"]+)"', sample)[0])
        r = client.get(href)
        assert r.status_code == 200 and r.content[:3] == b"\xff\xd8\xff"
        name = href.split("/img/")[1].split("?")[0]
        assert hashlib.sha256(Path(media, name).read_bytes()).hexdigest() == name.partition(".")[0]


def test_the_pages_templates_are_compiled_while_the_server_starts(run: Path, tmp_path: Path) -> None:
    # A fresh process (the Jinja2 environment is one per process): no page asked for, yet the
    # first pages' templates get compiled, so a person's first page does not wait ~50 ms for it.
    wanted = ["bundle.html.j2", "base.html.j2", "macros.html.j2", "run.html.j2", "sample.html.j2",
              "turn.html.j2"]  # fmt: skip
    code = (
        "import sys, time\n"
        "from trainer_hooks.serve import create_app\n"
        "from trainer_hooks.pages import environment\n"
        "app = create_app(sys.argv[1], cache_dir=sys.argv[2])\n"
        "names = lambda: {key[1] for key in environment().cache.keys()}\n"
        "deadline = time.monotonic() + 20\n"
        "while not set(sys.argv[3:]) <= names() and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "app.state.serve.close()\n"
        "print(sorted(names()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path / "cache"), *wanted],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})  # fmt: skip
    assert out.returncode == 0, out.stderr
    compiled = ast.literal_eval(out.stdout.strip())
    assert set(wanted) <= set(compiled), compiled


def test_the_cli_lists_serve_with_its_options() -> None:
    done = subprocess.run([sys.executable, "-m", "trainer_hooks.cli", "serve", "--help"], capture_output=True,
                          text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0
    for flag in ("--port", "--host", "--follow", "--cache-dir"):
        assert flag in done.stdout
    missing = subprocess.run([sys.executable, "-m", "trainer_hooks.cli", "serve", "/no/such/run", "--port", "0"],
                             capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert missing.returncode == 1 and "rollout-bundle serve: error: /no/such/run" in missing.stderr
    assert "Traceback" not in missing.stderr
