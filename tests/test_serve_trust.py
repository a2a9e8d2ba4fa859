"""What ``rollout-bundle serve`` trusts (issue 36, items 10, 11, 12, 15, 20): nothing outside a
bundle is read, a cache holds only what the server verified and never an error, one bundle's
defect is that bundle's note, and a page waiting for an index says so.

Every scenario is a real run on disk served through Starlette's TestClient; hostile files are
real symlinks, FIFOs and damaged files; a cache shared by two servers (same HOME) is two apps on
one cache directory, one after the other.
"""

from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from bundles import is_bundle, write_bundle

pytest.importorskip("starlette", reason="serve needs the [serve] extra (starlette)")
pytest.importorskip("jinja2", reason="serve needs the [serve] extra (jinja2)")
pytest.importorskip("PIL.Image")
from starlette.testclient import TestClient
from test_serve import _shots, assert_page, entry_by_step, indexed, make_run, make_samples

from trainer_hooks.serve import create_app


def _entry(app: Any, suffix: str) -> Any:
    return next(e for e in app.state.serve.run.ordered() if e.rel.endswith(suffix))


def _all_cache_text(cache: Path) -> str:
    return "".join(p.read_text("latin-1") for p in cache.rglob("*") if p.is_file())


def _thumb(client: TestClient, e: Any, name: str) -> Any:
    return client.get(f"/b/{e.id}/img/{name}?w=320")


# -- item 10: nothing outside the bundle ----------------------------------------------------------------


def test_a_bundle_whose_media_or_samples_is_a_symlink_serves_nothing_from_outside(tmp_path: Path) -> None:
    root = tmp_path / "run"
    make_run(root, steps=(1,))
    # Two bundles of their own pictures and words, whose media/ and samples/ are then moved out
    # of the run and linked back: the files outside are the genuine ones (their digests match).
    for step, seed in ((7, 70), (8, 80)):
        write_bundle(root / "ckpt" / "rollout" / f"fully_async_{step}",
                     make_samples(_shots(tmp_path / f"m{step}", 2, seed=seed), 3, step),
                     media_roots=[tmp_path / f"m{step}"], meta={"rollout_id": step})  # fmt: skip
    outside = tmp_path / "outside"
    outside.mkdir()
    linked_media = root / "ckpt" / "rollout" / "fully_async_7"
    (linked_media / "media").rename(outside / "media")
    (linked_media / "media").symlink_to(outside / "media")
    linked_samples = root / "ckpt" / "rollout" / "fully_async_8"
    (linked_samples / "samples").rename(outside / "samples")
    (linked_samples / "samples").symlink_to(outside / "samples")
    user = outside / "notes.txt"
    user.write_text("a user's file")
    names = sorted(p.name for p in (outside / "media").iterdir())
    cache = tmp_path / "cache"
    app = create_app(root, cache_dir=cache)
    with TestClient(app) as client:
        indexed_ok = entry_by_step(app, 1)
        e7, e8 = entry_by_step(app, 7), entry_by_step(app, 8)
        wait_until(lambda: app.state.serve.indexer.state(e8).error, "the samples-linked bundle's index fails")
        for name in names:
            r = _thumb(client, e7, name)
            assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
            assert f"{linked_media}/media: expected a directory, found a symlink" in html.unescape(r.text)
        sample = html.unescape(assert_page(client.get(f"/b/{e7.id}/s/0")))
        assert "media: expected a directory, found a symlink" in sample  # the page names the refusal
        assert not list((cache / "thumbs").rglob(names[0].partition(".")[0] + "*"))
        page = html.unescape(assert_page(client.get(f"/b/{e8.id}")))
        assert f"{linked_samples}/samples: expected a directory, found a symlink" in page
        r = client.get(f"/b/{e8.id}/s/0")
        assert r.status_code == 502 and "samples: expected a directory, found a symlink" in html.unescape(
            r.text
        )
        assert "word0x8" not in r.text and "word0x8" not in page  # the outside shard's words
        run_page = html.unescape(assert_page(client.get("/")))
        assert "samples: expected a directory, found a symlink" in run_page
        assert f'href="/b/{indexed_ok.id}"' in run_page
    assert "word0x8" not in _all_cache_text(cache)
    assert user.read_text() == "a user's file"


# -- item 11: the cache holds what the server verified, never an error --------------------------------


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_a_hostile_bundle_in_another_run_cannot_refuse_a_genuine_screenshot(
    tmp_path: Path, planted: str
) -> None:
    genuine_root, hostile_root = tmp_path / "genuine", tmp_path / "hostile"
    make_run(genuine_root, steps=(1,))
    genuine = genuine_root / "ckpt" / "rollout" / "fully_async_1"
    hostile = hostile_root / "fully_async_1"
    shutil.copytree(genuine, hostile)
    name = sorted(p.name for p in (genuine / "media").iterdir())[0]
    target = hostile / "media" / name
    target.chmod(0o644)
    target.unlink()
    if planted == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(genuine / "media" / name)  # the genuine bytes, through a link
    cache = tmp_path / "cache"  # one HOME: one cache for both servers
    app = create_app(hostile_root, cache_dir=cache)
    with TestClient(app) as client:
        r = _thumb(client, app.state.serve.run.ordered()[0], name)
        assert r.status_code == 404
        assert f"expected a regular file, found {'a FIFO' if planted == 'fifo' else 'a symlink'}" in r.text
    app = create_app(genuine_root, cache_dir=cache)
    with TestClient(app) as client:
        e = entry_by_step(app, 1)
        r = _thumb(client, e, name)
        assert r.status_code == 200 and r.content[:3] == b"\xff\xd8\xff", r.text[:300]
        sample = assert_page(client.get(f"/b/{e.id}/s/0"))
        assert str(hostile_root) not in html.unescape(sample)
    assert str(hostile_root) not in _all_cache_text(cache)


def test_two_bundles_of_one_identity_each_show_their_own_index_or_error(tmp_path: Path) -> None:
    root = tmp_path / "run"
    make_run(root / "b_genuine", steps=(1,))
    genuine = root / "b_genuine" / "ckpt" / "rollout" / "fully_async_1"
    twin = root / "a_twin" / "fully_async_1"  # listed, and queued, first
    shutil.copytree(genuine, twin)
    shard = next((twin / "samples").iterdir())
    shard.chmod(0o644)
    shard.unlink()
    os.mkfifo(shard)  # the same manifest, so the same identity; its shard is a FIFO
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        g, t = _entry(app, "b_genuine/ckpt/rollout/fully_async_1"), _entry(app, "a_twin/fully_async_1")
        assert g.identity == t.identity
        indexed(app, errors=True)
        state = app.state.serve.indexer
        assert state.state(g).complete and state.state(g).error is None
        assert "expected a regular file, found a FIFO" in (state.state(t).error or "")
        page = html.unescape(assert_page(client.get(f"/b/{g.id}")))
        assert "12 of 12 samples match" in page and str(twin) not in page
        assert len(re.findall(rf'href="/b/{g.id}/s/\d+"', page)) == 12
        assert "found a FIFO" in html.unescape(assert_page(client.get(f"/b/{t.id}")))


# -- item 12: one bundle's defect is its note ------------------------------------------------------------


def test_a_name_that_is_not_utf8_and_a_lone_surrogate_in_meta_are_notes_not_failures(tmp_path: Path) -> None:
    root = tmp_path / "run"
    make_run(root, steps=(1,))
    odd = os.fsdecode(b"dump-\xff\x1b[2J")  # not UTF-8, with a terminal escape
    media = tmp_path / "m"
    write_bundle(root / odd, make_samples(_shots(media, 2, seed=5), 2, 5), media_roots=[media],
                 meta={"rollout_id": 5})  # fmt: skip
    app = create_app(root, cache_dir=tmp_path / "cache", follow=3600.0)
    with TestClient(app) as client:
        page = html.unescape(assert_page(client.get("/")))
        assert "dump-\\xff\\x1b[2J" in page
        e = entry_by_step(app, 5)
        assert "dump-\\xff\\x1b[2J" in html.unescape(assert_page(client.get(f"/b/{e.id}")))
        # Under --follow: a manifest whose meta holds a lone surrogate (valid JSON), then a
        # sound bundle; both are listed by the next listings, the run keeps being served.
        write_bundle(root / "surrogate", make_samples(_shots(media, 2, seed=6), 2, 6), media_roots=[media],
                     meta={"rollout_id": 6, "note": "\ud800"})  # fmt: skip
        app.state.serve.run.refresh()
        write_bundle(root / "later", make_samples(_shots(media, 2, seed=7), 2, 7), media_roots=[media],
                     meta={"rollout_id": 7})  # fmt: skip
        app.state.serve.run.refresh()
        steps = {e.step for e in app.state.serve.run.ordered()}
        assert {1, 5, 6, 7} <= steps
        assert_page(client.get("/"))
        assert_page(client.get(f"/b/{entry_by_step(app, 6).id}"))
    # And a server started on a run that already holds it starts.
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        assert 6 in {e.step for e in app.state.serve.run.ordered()}
        assert_page(client.get("/"))


def test_a_replay_report_nested_200000_deep_is_the_bundles_note(tmp_path: Path) -> None:
    root = tmp_path / "run"
    bundles_ = make_run(root, steps=(1, 2))
    Path(f"{bundles_[1]}.replay.json").write_text("[" * 200_000)
    Path(f"{bundles_[2]}.replay.json").write_text("[" * 10 + "]" * 10)
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        e1, e2 = entry_by_step(app, 1), entry_by_step(app, 2)
        page = html.unescape(assert_page(client.get(f"/b/{e1.id}")))
        assert "replay report beside the bundle not used" in page
        assert "not a replay report: nested deeper than 64 levels" in page
        assert_page(client.get(f"/b/{e1.id}/s/0"))
        assert "expected a replay report object, found list" in html.unescape(
            assert_page(client.get(f"/b/{e2.id}"))
        )
        assert_page(client.get("/"))


@settings(max_examples=300, deadline=None)
@given(st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=40))
def test_any_text_a_bundle_holds_renders_as_utf8(text: str) -> None:
    """Lone surrogates, undecodable bytes as surrogateescape, controls: every page value renders
    and encodes (the environment's finalize), and text UTF-8 can encode is left as it is."""
    from trainer_hooks.pages import environment

    page = environment().from_string("<p>{{ x }}</p><p title='{{ x }}'>{{ [x] }}</p>").render(x=text)
    page.encode("utf-8")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert "\\u" in page or "\\x" in page
    else:
        assert html.unescape(page).startswith(f"<p>{text}</p>")


# -- item 15: paging, a damaged cache, notes that go, failures asked again -------------------------------


def test_paging_past_sqlites_integers_is_a_400(tmp_path: Path) -> None:
    root = tmp_path / "run"
    make_run(root, steps=(1,))
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        e = entry_by_step(app, 1)
        for after in ("1:9223372036854775808", "1:-1", "1e400:3", f"1:{2**70}"):
            for sort in ("position", "reward"):
                r = client.get(f"/b/{e.id}", params={"after": after, "sort": sort})
                assert r.status_code == 400, (after, sort, r.status_code)
                assert "after:" in html.unescape(assert_page(r, 400))


def test_a_damaged_index_in_the_cache_is_rebuilt_and_its_path_never_shown(tmp_path: Path) -> None:
    root = tmp_path / "run"
    make_run(root, steps=(1,))
    cache = tmp_path / "cache"
    app = create_app(root, cache_dir=cache)
    with TestClient(app) as client:
        indexed(app)
    [index] = list((cache / "index").glob("*[0-9a-f].sqlite"))
    index.write_bytes(b"not a database " * 100)
    app = create_app(root, cache_dir=cache)
    with TestClient(app) as client:
        e = entry_by_step(app, 1)
        for url in ("/", f"/b/{e.id}", f"/b/{e.id}/groups", f"/b/{e.id}/s/0"):
            text = assert_page(client.get(url))
            assert str(cache) not in html.unescape(text), url
        indexed(app)
        page = html.unescape(assert_page(client.get(f"/b/{e.id}")))
        assert "12 of 12 samples match" in page and str(cache) not in page


def test_a_removed_bundles_note_goes_with_it(tmp_path: Path) -> None:
    root = tmp_path / "run"
    make_run(root, steps=(1,))
    damaged = root / "damaged"
    damaged.mkdir()
    (damaged / "manifest.json").write_text('{"format_version": 1, "kind": ')
    listed = is_bundle(damaged)  # what the one bundle proof says: a note only where it lists it
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        before = html.unescape(assert_page(client.get("/")))
        assert (f"{damaged}/manifest.json: not valid JSON" in before) == listed
        shutil.rmtree(damaged)
        app.state.serve.run.refresh()  # what --follow does every interval
        after = html.unescape(assert_page(client.get("/")))
        assert str(damaged) not in after and not app.state.serve.run.problems
        assert f'href="/b/{entry_by_step(app, 1).id}"' in after


def test_a_bundle_copied_in_late_is_indexed_once_whole(tmp_path: Path) -> None:
    root = tmp_path / "run"
    make_run(root, steps=(1,))
    elsewhere = make_run(tmp_path / "elsewhere", steps=(9,))[9]  # an identity of its own
    # A bundle copied in without a commit: its manifest (and media) first, its shards later.
    late = root / "late" / "fully_async_9"
    shutil.copytree(elsewhere, late, ignore=shutil.ignore_patterns("*.zst"))
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        state = app.state.serve
        e = _entry(app, "late/fully_async_9")
        wait_until(lambda: state.indexer.state(e).error, "the half-copied bundle fails to index")
        assert "cannot index" in html.unescape(assert_page(client.get("/")))
        for shard in (elsewhere / "samples").iterdir():
            shutil.copy2(shard, late / "samples" / shard.name)
        # Asked again once its files changed: the next visit builds it.
        wait_until(lambda: assert_page(client.get(f"/b/{e.id}")) and state.indexer.state(e).complete,
                   "the bundle indexed once whole")  # fmt: skip
        assert "12 of 12 samples match" in html.unescape(assert_page(client.get(f"/b/{e.id}")))
        assert "cannot index" not in html.unescape(assert_page(client.get("/")))


# -- item 20: a group page while its bundle indexes ---------------------------------------------------


def test_a_group_link_while_the_index_builds_is_a_page_that_waits(tmp_path: Path) -> None:
    import fcntl

    from bundles import open_bundle
    from trainer_hooks.serve._run import identity_of

    root = tmp_path / "run"
    made = make_run(root, steps=(1,))
    cache = tmp_path / "cache"
    (cache / "index").mkdir(parents=True)
    with open_bundle(made[1]) as b:
        identity = identity_of(b)
    # Another server is building this index (it holds the lock): this one waits for it.
    lock = open(cache / "index" / f"{identity}.lock", "a+b")  # noqa: SIM115 - closed below
    fcntl.flock(lock, fcntl.LOCK_EX)
    app = create_app(root, cache_dir=cache)
    with TestClient(app) as client:
        try:
            e = entry_by_step(app, 1)
            r = client.get(f"/b/{e.id}/group", params={"g": "0"})
            bundle_page = html.unescape(assert_page(client.get(f"/b/{e.id}")))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        text = html.unescape(assert_page(r, 200))
        assert '<meta http-equiv="refresh" content="2">' in r.text
        assert "building the index of this bundle: 0% (0 of 12 samples)" in text
        assert "a group's page waits until the bundle is indexed" in bundle_page
        indexed(app)
        done = html.unescape(assert_page(client.get(f"/b/{e.id}/group", params={"g": "0"})))
        assert "group 0" in done and "building the index" not in done


# -- item 20: the compare page matches by key and links both samples ----------------------------------


def test_compare_matches_samples_by_index_and_links_both_sides(tmp_path: Path) -> None:
    root = tmp_path / "run"
    media = tmp_path / "m"
    shots = _shots(media, 4)
    samples = make_samples(shots, 8, 1)
    write_bundle(root / "a", samples, media_roots=[media], meta={"rollout_id": 1})
    # The same samples in another order (a trainer's workers finish in any order): by position
    # every one differs, by index none does.
    write_bundle(root / "b", samples[4:] + samples[:4], media_roots=[media], meta={"rollout_id": 1})
    changed = [dict(s, reward=5.0) if s["index"] == 6 else s for s in samples]
    write_bundle(root / "c", changed[::-1], media_roots=[media], meta={"rollout_id": 1})
    unkeyed = [{k: v for k, v in s.items() if k != "index"} for s in samples]
    write_bundle(root / "d", unkeyed, media_roots=[media], meta={"rollout_id": 1})
    app = create_app(root, cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        indexed(app)
        a, b, c, d = (_entry(app, n) for n in "abcd")
        page = html.unescape(assert_page(client.get("/compare", params={"a": a.id, "b": b.id})))
        plain = re.sub(r"<[^>]+>", "", page)
        assert "samples matched by index: 0 changed, 0 only in A, 0 only in B, 8 unchanged" in plain
        assert f'href="/b/{a.id}"' in page and f'href="/b/{b.id}"' in page
        page = html.unescape(assert_page(client.get("/compare", params={"a": a.id, "b": c.id})))
        plain = re.sub(r"<[^>]+>", "", page)
        assert "1 changed, 0 only in A, 0 only in B, 7 unchanged" in plain
        # index 6 is position 6 in A and position 1 in C (reversed): a row linking both.
        assert f'href="/b/{a.id}/s/6"' in page and f'href="/b/{c.id}/s/1"' in page
        assert f"/compare/samples?a={a.id}&i=6&b={c.id}&j=1" in page
        assert "reward: 0.0 -> 5.0" in plain or "reward: 1.0 -> 5.0" in plain
        # No index to match by: by position, and the page says why.
        page = html.unescape(assert_page(client.get("/compare", params={"a": d.id, "b": a.id})))
        assert "matched by position" in page and "index" in page
        plain = re.sub(r"<[^>]+>", "", page)
        assert "samples matched by position" in plain
