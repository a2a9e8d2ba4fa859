"""``rollout-bundle serve`` costs what a page shows (issue 36, items 13 and 14).

Each test measures what a page costs, never guesses it: Python memory held after the pages
(tracemalloc, in process), the peak resident memory of a real ``serve`` subprocess
(``VmHWM`` of ``/proc/<pid>/status``), CPU time of the thread that parses, the size of the HTML,
the number of ``diff`` processes alive at once, the descriptors of the server
(``/proc/<pid>/fd``). None asserts a wall-clock duration.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import http.client
import io
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from helpers import noise_png, put_media, wait_until

from bundles import write_bundle
from bundles.support import LIMITS

pytest.importorskip("starlette", reason="serve needs the [serve] extra (starlette)")
pytest.importorskip("jinja2", reason="serve needs the [serve] extra (jinja2)")
pytest.importorskip("PIL.Image")
from starlette.testclient import TestClient

from trainer_hooks.serve import create_app
from trainer_hooks.view import sample_view, write_html_report

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/<pid>")


def _sample(i: int, images: list[str], **extra: Any) -> dict[str, Any]:
    return {"index": i, "group_index": i // 2, "prompt": f"task {i}", "response": "done", "reward": 1.0,
            "status": "completed", "multimodal_inputs": {"images": images}, **extra}  # fmt: skip


def _indexed(app: Any) -> None:
    state = app.state.serve
    for e in state.run.ordered():
        state.indexer.want(e)
    wait_until(lambda: all(state.indexer.state(e).complete or state.indexer.state(e).error
                           for e in state.run.ordered()), "every bundle indexed", timeout=120)  # fmt: skip


def _ids(page: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r'href="/b/([0-9a-f]{16})"', page)))


# -- a real server ------------------------------------------------------------------------------------


def _serve(
    args: list[str], tmp_path: Path, preexec: Any = None, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "trainer_hooks.cli", "serve", *args, "--port", "0",
                             "--no-progress", "--cache-dir", str(tmp_path / "cache")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=preexec)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read() if proc.stderr else "serve printed nothing")
    m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert m, line
    return proc, int(m.group(1))


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    return proc.stderr.read()


def _get(port: int, path: str, timeout: float = 120) -> tuple[int, bytes]:
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        con.request("GET", path)
        r = con.getresponse()
        return r.status, r.read()
    finally:
        con.close()


def _listed(port: int, n: int) -> bytes | None:
    """The run page once the listing has ended with ``n`` bundles (None before)."""
    body = _get(port, "/")[1]
    return body if "listing…".encode() not in body and f">{n}</div>".encode() in body else None


def _status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field, in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    assert m, text
    return int(m.group(1)) * 1024


# -- item 13: text cut before it is parsed ------------------------------------------------------------


def tool_calls(response: str) -> list[str]:
    """The tool calls a page reads of ``response`` (``view``'s rule, shared by serve)."""
    return sample_view(0, {"response": response}, "/nowhere/").tool_calls


def test_tool_calls_read_a_bounded_prefix_in_linear_time() -> None:
    # 12,000 unclosed tags: the lazy regex scanned the rest of the text from each (9 s of CPU on
    # e5d94e3, the GIL held: the whole server stopped); CPU time, not wall time, is measured.
    started = time.thread_time()
    assert tool_calls("<tool_call>" * 12_000) == []
    assert time.thread_time() - started < 1.0
    calls = tool_calls("<tool_call>click(1, 2)</tool_call>" * 5_000)
    assert len(calls) == LIMITS["MAX_SHOWN_TURNS"] and calls[0] == "click(1, 2)"
    # What lies past MAX_SHOWN_CHARS is never read.
    late = "x" * LIMITS["MAX_SHOWN_CHARS"] + "<tool_call>click(3, 4)</tool_call>"
    assert tool_calls(late) == []


def test_a_view_keeps_what_a_page_shows_of_a_huge_sample() -> None:
    n = LIMITS["MAX_SHOWN_CHARS"]
    turns = LIMITS["MAX_SHOWN_TURNS"]
    sample = _sample(0, [f"/elsewhere/{k}.png" for k in range(5 * turns)], response="r" * (50 * n),
                     metadata={"actions": ["click(1, 2)"] * (5 * turns), "note": "m" * (50 * n),
                               "many": list(map(str, range(100_000)))})  # fmt: skip
    v = sample_view(0, sample, "/nowhere/")
    assert len(v.response or "") == n and v.response_chars == 50 * n and v.more_response == 49 * n
    assert len(v.images) == turns and v.turn_count == 5 * turns and v.more_turns == 4 * turns
    assert v.actions is not None and len(v.actions) == turns
    assert len(v.metadata["note"]) < n + 40 and v.metadata["note"].endswith(f"({50 * n} characters)")
    assert (
        len(v.metadata["many"]) == turns + 1 and v.metadata["many"][-1] == f"… {100_000 - turns} more items"
    )


# -- item 13: caches bounded in bytes -------------------------------------------------------------------


def test_the_sample_cache_holds_bytes_not_whole_responses(tmp_path: Path) -> None:
    # 12 samples of 4 MiB of incompressible text each (too large for the index's stored views, so
    # every page reads its shard): e5d94e3's cache kept 64 whole views, 48 MiB here (1.6 GB with
    # 100 MiB responses). Measured: Python memory still held once the pages are answered.
    size = 4 * MiB
    samples = [
        _sample(i, [], response=base64.b64encode(os.urandom(size * 3 // 4)).decode()) for i in range(12)
    ]
    write_bundle(tmp_path / "run" / "big", samples)
    del samples
    app = create_app(tmp_path / "run", cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        _indexed(app)
        bid = _ids(client.get("/").text)[0]
        client.get(f"/b/{bid}/s/0")  # templates compiled, pools warmed before the baseline
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for pos in range(12):
                page = client.get(f"/b/{bid}/s/{pos}")
                assert page.status_code == 200
                assert f"{size - LIMITS['MAX_SHOWN_CHARS']} more characters" in page.text
            del page
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert held < 8 * MiB, f"{held / MiB:.1f} MiB held after 12 sample pages of 4 MiB responses"


# -- item 13: pictures within a pixel budget per page ---------------------------------------------------


def _big_png(width: int, height: int, color: tuple[int, int, int, int]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGBA", (width, height), color).save(out, "PNG", compress_level=1)
    return out.getvalue()


@needs_proc
def test_a_page_decodes_its_pictures_within_a_pixel_budget(tmp_path: Path) -> None:
    # Four 6000x6000 RGBA PNGs (small files, 36 M pixels each, within decode_image's bound): a
    # page's budget (MAX_PAGE_PIXELS, 64 M) draws one and names the others; e5d94e3 decoded all
    # four at once (4 threads, each picture ~11 bytes a pixel while flattened: ~1.6 GB peak).
    side = 6000
    assert 2 * side * side > LIMITS["MAX_PAGE_PIXELS"] >= side * side
    media = tmp_path / "media"
    shots = [put_media(media, _big_png(side, side, (40 * k, 90, 200, 128))) for k in range(4)]
    write_bundle(tmp_path / "run" / "b", [_sample(0, shots)], media_roots=[media])
    proc, port = _serve([str(tmp_path / "run")], tmp_path)
    try:
        status, body = _get(port, "/")
        bid = _ids(body.decode())[0]
        base_rss = _status(proc.pid, "VmRSS")
        status, body = _get(port, f"/b/{bid}/s/0")
        assert status == 200
        page = body.decode()
        peak = _status(proc.pid, "VmHWM")
    finally:
        err = _stop(proc)
    assert page.count("not drawn:") == 3, page
    assert page.count('<svg class="thumb"') == 1
    assert "past this page&#39;s budget" in page or "past this page's budget" in page
    assert "Traceback" not in err
    # One picture decoded: 144 MiB of RGBA and its reduced copies, not four of them.
    assert peak - base_rss < 450 * MiB, f"peak {peak / MiB:.0f} MiB, {base_rss / MiB:.0f} MiB before the page"
    # The refusal is not cached: the picture not drawn on that page is drawn on its own.
    thumbs = list((tmp_path / "cache" / "thumbs").rglob("*.json"))
    assert len(thumbs) == 1


@needs_proc
def test_concurrent_picture_requests_decode_a_bounded_number_at_once(tmp_path: Path) -> None:
    # Eight 5000x5000 RGBA pictures asked for at once (a crawler, a page's lazy images): each
    # within a page's budget, but e5d94e3 decoded all eight together (~2 GB peak here).
    import threading

    side, n = 5000, 8
    media = tmp_path / "media"
    shots = [put_media(media, _big_png(side, side, (30 * k, 60, 90, 200))) for k in range(n)]
    write_bundle(tmp_path / "run" / "b", [_sample(0, shots)], media_roots=[media])
    # Two malloc arenas: freed pixels are reused by the next decode rather than kept by each of
    # the eight request threads' own arena, so the peak says how many pictures were in memory at once.
    proc, port = _serve([str(tmp_path / "run")], tmp_path, env={"MALLOC_ARENA_MAX": "2"})
    try:
        bid = _ids(_get(port, "/")[1].decode())[0]
        base_rss = _status(proc.pid, "VmRSS")
        names = [Path(s).name for s in shots]
        statuses: list[int] = []
        clients = [threading.Thread(target=lambda m=m: statuses.append(_get(port, f"/b/{bid}/img/{m}?w=320")[0]))
                   for m in names]  # fmt: skip
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        peak = _status(proc.pid, "VmHWM")
    finally:
        err = _stop(proc)
    assert statuses == [200] * n and "Traceback" not in err
    assert peak - base_rss < 1000 * MiB, f"peak {peak / MiB:.0f} MiB, {base_rss / MiB:.0f} MiB before"


# -- item 13: turns per page ------------------------------------------------------------------------------


def test_a_sample_of_thousands_of_turns_shows_a_page_of_them(tmp_path: Path) -> None:
    # 5,000 turns (10^6 in the issue: 125 MB of HTML): the page shows MAX_SHOWN_TURNS and says
    # how many more there are; its HTML is bounded by that, not by the sample.
    media = tmp_path / "media"
    shot = put_media(media, noise_png(32, 18, 1))
    n = 5_000
    sample = _sample(0, [shot] * n, metadata={"actions": ["click(1, 2)"] * n})
    sample["response"] = "<tool_call>click(1, 2)</tool_call>" * n
    write_bundle(tmp_path / "run" / "b", [sample], media_roots=[media])
    app = create_app(tmp_path / "run", cache_dir=tmp_path / "cache")
    with TestClient(app) as client:
        _indexed(app)
        bid = _ids(client.get("/").text)[0]
        page = client.get(f"/b/{bid}/s/0")
        assert page.status_code == 200
        shown = LIMITS["MAX_SHOWN_TURNS"]
        assert f"{n - shown} more turns not shown" in page.text
        assert page.text.count('<li class="turn">') == shown
        assert len(page.content) < 2 * MiB, len(page.content)
        assert f">{n}</td>" in client.get(f"/b/{bid}").text  # the table counts every turn
    # view's static page: the same rule.
    out = tmp_path / "view.html"
    write_html_report(tmp_path / "run" / "b", out, progress=False)
    text = out.read_text()
    assert f"{n - shown} more turns not shown" in text and len(text) < 4 * MiB


# -- item 13: the socket listens before the run is listed; the run page is paged -----------------------


def _tiny_run(root: Path, n: int, packed: bool = False) -> list[Path]:
    from bundles import pack_bundle

    out = []
    for i in range(n):
        where = root / "rollout" / f"rollout_{i}"
        write_bundle(where, [{"index": i, "reward": float(i % 2), "response": "ok", "status": "completed"}],
                     meta={"rollout_id": i})  # fmt: skip
        if packed:
            out.append(Path(pack_bundle(where, root / "rollout" / f"rollout_{i}.rbundle")))
            import shutil

            shutil.rmtree(where)
        else:
            out.append(where)
    return out


def test_the_run_page_answers_while_the_run_is_listed(tmp_path: Path) -> None:
    # Deterministic: the listing is held after its first batch (a fault point) while a page is
    # asked for. e5d94e3 had no such thing: the app listed the whole run before it answered.
    import threading

    from bundles.support import on_fault_point

    _tiny_run(tmp_path / "run", 600)
    reached, release = threading.Event(), threading.Event()

    def hold(found: int) -> None:
        reached.set()
        release.wait(120)

    with on_fault_point("serve.listed-batch", hold):
        app = create_app(tmp_path / "run", cache_dir=tmp_path / "cache", list_in_background=True)
        with TestClient(app) as client:
            assert reached.wait(120), "the listing never reached its first batch"
            page = client.get("/").text
            release.set()
            assert re.search(r"listing… \d+ found so far", page), page
            assert 0 < len(_ids(page)) < 600 and "listing… 600" not in page
            wait_until(lambda: _listed_text(client, 600), "the whole run listed", timeout=120)
            assert len(_ids(client.get("/").text)) == 100


def _listed_text(client: Any, n: int) -> bool:
    text = client.get("/").text
    return "listing…" not in text and f">{n}</div>" in text


@needs_proc
def test_the_server_answers_while_a_large_run_is_listed_and_its_run_page_is_paged(tmp_path: Path) -> None:
    # 2,000 tiny bundles (100,000 in the issue: 51 s before the socket listened, 1.3 GB, a 22 s
    # unpaged run page). e5d94e3 listed and opened every bundle before it printed its address.
    n = 2_000
    _tiny_run(tmp_path / "run", n)
    proc, port = _serve([str(tmp_path / "run")], tmp_path)
    try:
        status, first = _get(port, "/")
        assert status == 200
        m = re.search(r"listing… (\d+) found so far", first.decode())
        assert m, "the first page was answered after the listing ended"
        assert int(m.group(1)) < n
        page = wait_until(lambda: _listed(port, n), "the run listed", timeout=300, poll=0.2)
        text = page.decode()
        assert len(_ids(text)) == 100 and 'href="/?from=100"' in text and "bundles 1–100" in text
        assert len(page) < 150_000, len(page)  # a page of 100 rows, whatever the run holds
        last = _get(port, "/?from=1900")[1].decode()
        assert len(_ids(last)) == 100 and "rollout/rollout_1999" in last and "next page" not in last
        assert _get(port, "/?from=2000")[0] == 404 and _get(port, "/?from=x")[0] == 400
        # What a listed bundle costs: its row, not an open bundle (e5d94e3: ~13 KB each).
        rss = _status(proc.pid, "VmRSS")
    finally:
        err = _stop(proc)
    assert "Traceback" not in err and f"{n} bundle(s) under" in err
    assert rss < 400 * MiB, f"{rss / MiB:.0f} MiB resident with {n} bundles listed"


def test_a_listed_bundle_costs_its_run_page_row_not_an_open_bundle(tmp_path: Path) -> None:
    # Python memory a run of 2,000 tiny bundles holds once listed (e5d94e3 kept each bundle open,
    # its manifest parsed: ~4.5 KB each here, 13 KB of RSS each at 100,000 in the issue). Measured
    # in a fresh process: in this one, threads other tests left (an indexer finishing) allocate
    # while tracemalloc counts.
    _tiny_run(tmp_path / "run", 2_000)
    script = (
        "import gc, sys, tracemalloc\n"
        "from trainer_hooks.serve._run import Run\n"
        "gc.collect(); tracemalloc.start()\n"
        "run = Run(sys.argv[1]); gc.collect()\n"
        "held = tracemalloc.get_traced_memory()[0]; tracemalloc.stop()\n"
        "print(len(run.entries), len(run.problems), held); run.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    entries, problems, held = (int(x) for x in done.stdout.split())
    assert (entries, problems) == (2_000, 0)
    assert held / 2_000 < 2_500, f"{held / 2_000:.0f} bytes per listed bundle"


# -- item 14: a bounded pool for diff work ------------------------------------------------------------------


def _children(pid: int, word: str) -> int:
    """Processes whose parent is ``pid`` and whose command line holds ``word``."""
    count = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid and word in Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0"):
                count += 1
        except (OSError, ValueError, IndexError):
            continue
    return count


@needs_proc
def test_concurrent_compares_run_a_bounded_number_of_diffs_and_other_pages_answer(tmp_path: Path) -> None:
    # 16 compares at once (40 in the issue: 40 diff processes, another client waited 8 s): at
    # most DIFF_WORKERS diff processes ever run, the rest are told to retry, a plain page answers.
    import threading

    from trainer_hooks.serve._app import DIFF_WORKERS

    _tiny_run(tmp_path / "run", 6)
    proc, port = _serve([str(tmp_path / "run")], tmp_path)
    try:
        wait_until(lambda: len(_ids(_get(port, "/")[1].decode())) == 6, "the run listed", timeout=120)
        ids = _ids(_get(port, "/")[1].decode())
        pairs = [(a, b) for a in ids for b in ids if a != b][:16]
        most = 0
        done = threading.Event()

        def watch() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, _children(proc.pid, b"diff"))

        statuses: list[int] = []

        def compare(a: str, b: str) -> None:
            statuses.append(_get(port, f"/compare?a={a}&b={b}", timeout=300)[0])

        watcher = threading.Thread(target=watch)
        watcher.start()
        clients = [threading.Thread(target=compare, args=pair) for pair in pairs]
        for c in clients:
            c.start()
        wait_until(lambda: _children(proc.pid, b"diff") > 0 or len(statuses) == len(pairs), "a diff running")
        plain = _get(port, "/")  # answered while diffs run
        for c in clients:
            c.join()
        done.set()
        watcher.join()
    finally:
        err = _stop(proc)
    assert plain[0] == 200
    assert 1 <= most <= DIFF_WORKERS, most
    assert sorted(set(statuses)) <= [200, 503] and statuses.count(200) >= 1 and statuses.count(503) >= 1, (
        statuses
    )
    assert "Traceback" not in err


# -- item 14: descriptors opened on demand, closed when a bundle goes ----------------------------------------


def _fds(pid: int, packed_only: bool = False) -> int:
    """The descriptors ``pid`` holds (with ``packed_only``, those of packed bundle files)."""
    names = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return sum(1 for n in names if ".rbundle" in n) if packed_only else len(names)


def _low_fd_limit(n: int) -> Any:
    def lower() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return lower


@needs_proc
def test_a_run_of_more_packed_bundles_than_descriptors_is_served(tmp_path: Path) -> None:
    # 400 packed bundles under a limit of 256 descriptors (1,500 under 1,024 in the issue):
    # e5d94e3 kept every packed bundle open and did not start.
    _tiny_run(tmp_path / "run", 400, packed=True)
    proc, port = _serve([str(tmp_path / "run")], tmp_path, preexec=_low_fd_limit(256))
    try:
        page = wait_until(lambda: _listed(port, 400), "the run listed", timeout=300, poll=0.2)
        ids = _ids(page.decode())
        for bid in ids[:100]:  # every page on the first, each bundle opened
            assert _get(port, f"/b/{bid}")[0] == 200
            assert _get(port, f"/b/{bid}/s/0")[0] == 200
        last = _ids(_get(port, "/?from=300")[1].decode())
        assert _get(port, f"/b/{last[-1]}/s/0")[0] == 200
        held = _fds(proc.pid)
    finally:
        err = _stop(proc)
    assert "Too many open files" not in err and "Traceback" not in err, err[-2000:]
    assert held < 200, held


@needs_proc
def test_under_follow_replaced_and_removed_packed_bundles_are_closed(tmp_path: Path) -> None:
    # 60 changes (9 -> 70 descriptors on e5d94e3): a packed bundle replaced or removed is let go.
    root = tmp_path / "run"
    packed = _tiny_run(root, 4, packed=True)
    proc, port = _serve([str(root), "--follow", "--follow-interval", "0.1"], tmp_path)
    try:
        wait_until(lambda: len(_ids(_get(port, "/")[1].decode())) == 4, "the run listed", timeout=120)
        for bid in _ids(_get(port, "/")[1].decode()):
            assert _get(port, f"/b/{bid}/s/0")[0] == 200
        before = _fds(proc.pid, packed_only=True)
        scratch = tmp_path / "scratch"
        for k in range(30):
            _change(port, root, packed[k % 4], scratch, k)
        # At most one per bundle of the run, once the work in flight is done (an index build of a
        # bundle that went holds it until the build stops; under load that is a while).
        counts: list[int] = []
        with contextlib.suppress(AssertionError):  # said below, with the counts
            wait_until(lambda: counts.append(_fds(proc.pid, packed_only=True)) or counts[-1] <= max(before, 4),
                       "the packed bundles that went closed", timeout=120, poll=0.2)  # fmt: skip
    finally:
        err = _stop(proc)
    assert "Traceback" not in err
    assert counts and counts[-1] <= max(before, 4), (before, counts[-5:])


def _change(port: int, root: Path, target: Path, scratch: Path, k: int) -> None:
    """Two changes under a followed run: ``target`` replaced by a new packed file (a page opens
    it), and another packed bundle added, opened, removed."""
    from bundles import pack_bundle

    write_bundle(
        scratch / f"b{k}", [{"index": k, "reward": 1.0, "response": f"v{k}"}], meta={"rollout_id": k % 4}
    )
    os.replace(pack_bundle(scratch / f"b{k}", scratch / f"b{k}.rbundle"), target)
    wait_until(lambda: f"v{k}".encode() in _sample_of(port, target.name), "the replaced bundle served",
               timeout=60, poll=0.05)  # fmt: skip
    extra = root / "rollout" / f"extra_{k}.rbundle"
    os.replace(pack_bundle(scratch / f"b{k}", scratch / f"e{k}.rbundle"), extra)
    wait_until(lambda: f"v{k}".encode() in _sample_of(port, extra.name), "the added bundle served",
               timeout=60, poll=0.05)  # fmt: skip
    extra.unlink()
    wait_until(lambda: extra.name.encode() not in _get(port, "/")[1], "the removed bundle gone",
               timeout=60, poll=0.05)  # fmt: skip


def _sample_of(port: int, name: str) -> bytes:
    """The first sample page of the bundle named ``name`` on the run page (b"" while not listed)."""
    page = _get(port, "/")[1].decode()
    m = re.search(rf'href="/b/([0-9a-f]{{16}})">rollout/{re.escape(name)}<', page)
    if not m:
        return b""
    return _get(port, f"/b/{m.group(1)}/s/0")[1]
