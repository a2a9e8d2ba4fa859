"""View-page benchmark: size and Chromium load time of ``rollout-bundle view`` at 600 screenshots (not a test).

    python benchmarks/bench_view.py [--n 600] [--layout groups|steps] [--repeats 3] [--dir bench-out]
                                    [--packed] [--shot view-600.png]

The N screenshots are bench_save.py's (1080p, ~1.1 MB PNGs, rendered once and cached under
``<dir>/media/``). Two dump layouts:

* ``groups`` (default): GRPO groups of 4 trajectories x 5 turns, each sample one trajectory with
  its 5 screenshots and a demo-style action per turn (N/5 samples, N references);
* ``steps``: bench_save.py's layout, one sample per step of 8-turn trajectories, step k holding
  the first k+1 screenshots (N samples, ~4.5 N references).

Measured, in one run: the time ``write_html_report`` takes, the page's size, and its load time in
headless Chromium (navigation start to the end of the load event, from the Navigation Timing
entry; median of ``--repeats`` fresh browsers). The floor, measured the same way in the same run,
is a plain page holding only the same thumbnails as ``<img>`` data URIs, nothing else: the ratio
says what the page's structure (lightboxes, groups, filters, overlays) costs over showing the
pictures at all. Targets (issue 21): under 15 MB and under 3 s at 600 screenshots.

``--shot FILE`` also saves a full-page screenshot of the page (the command is printed).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench_save: the cached screenshots
sys.path.insert(0, str(ROOT / "tests"))  # helpers.browser: Chromium over the DevTools pipe

from bench_save import ensure_media  # noqa: E402
from helpers.browser import find_chromium, render  # noqa: E402

from bundles import MediaRef, pack_bundle, remove_bundle, write_bundle  # noqa: E402
from trainer_hooks.view import write_html_report  # noqa: E402

ACTIONS = ["click(212, 148)", "double_click(960, 540)", "type('dark')", "scroll(0, -3)", "key('enter')",
           "drag(300, 400, 900, 420)"]  # fmt: skip


def samples_groups(paths: list[Path], group: int = 4, turns: int = 5) -> list[dict[str, Any]]:
    out = []
    per_group = group * turns
    for g in range(len(paths) // per_group):
        for k in range(group):
            shots = paths[g * per_group + k * turns : g * per_group + (k + 1) * turns]
            actions = [ACTIONS[(g + k + t) % len(ACTIONS)] for t in range(turns)]
            out.append({
                "group_index": g, "index": len(out),
                "prompt": f"<|im_start|>user\ntask {g}: open Settings and turn on dark mode<|im_end|>",
                "tokens": list(range(1200)),
                "response": "".join(f"<tool_call>{a}</tool_call>" for a in actions),
                "response_length": 80 + 7 * ((g + k) % 9),
                "loss_mask": [1] * 80,
                "rollout_log_probs": [-0.05 - 0.3 * ((i * 7 + k) % 11 == 0) for i in range(80)],
                "reward": float((g + k) % 3 == 0),
                "status": ["completed", "completed", "truncated", "failed"][(g + k) % 4],
                "multimodal_inputs": {"images": [MediaRef.from_file(p) for p in shots]},
                "metadata": {"actions": actions, "screen": [1920, 1080]},
            })  # fmt: skip
    return out


def samples_steps(paths: list[Path], turns: int = 8) -> list[dict[str, Any]]:
    out = []
    for t in range(0, len(paths), turns):
        shots = paths[t : t + turns]
        for k in range(len(shots)):
            out.append({
                "group_index": t // turns, "index": len(out),
                "prompt": f"<|im_start|>user\nstep {k}: finish the task on screen<|im_end|>",
                "tokens": list(range(1024)),
                "multimodal_inputs": {"images": [MediaRef.from_file(p) for p in shots[: k + 1]]},
                "response": "<tool_call>click(960, 540)</tool_call>",
                "response_length": 256,
                "reward": float(k == len(shots) - 1),
                "loss_mask": [1] * 256,
                "rollout_log_probs": [-0.05] * 256,
                "status": "completed",
                "metadata": {"turn": k, "screen": [1920, 1080]},
            })  # fmt: skip
    return out


NAV = "performance.getEntriesByType('navigation')[0].toJSON()"


def load_ms(page: Path, out_dir: Path) -> float:
    r = render(page.as_uri(), NAV, out_dir / "timing.png", 1280, 900, full_page=False)
    if r.errors:
        raise SystemExit(f"{page}: the page logged errors: {r.errors[:3]}")
    return float(r.value["loadEventEnd"])


def floor_page(report: Path, dest: Path) -> None:
    """The same thumbnails as plain <img> data URIs, nothing else."""
    text = report.read_text()
    uris = re.findall(r'<image id="m\d+" width="\d+" height="\d+" href="(data:[^"]+)"', text)
    body = "".join(f'<img src="{u}" width="320">' for u in uris)
    dest.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>floor</title></head><body>{body}</body></html>"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--layout", choices=("groups", "steps"), default="groups")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=ROOT / "bench-out")
    ap.add_argument("--packed", action="store_true", help="view the packed file instead of the directory")
    ap.add_argument("--shot", type=Path, help="also save a full-page screenshot of the page here")
    a = ap.parse_args()
    if find_chromium() is None:
        raise SystemExit("headless Chromium not found: apt-get install -y chromium")
    paths = ensure_media(a.dir, a.n)
    samples = samples_groups(paths) if a.layout == "groups" else samples_steps(paths)
    work = a.dir / f"view-{a.layout}-n{a.n}"
    work.mkdir(parents=True, exist_ok=True)
    bundle = work / "dump"
    if bundle.exists():
        remove_bundle(bundle)
    write_bundle(bundle, samples, media_roots=[paths[0].parent], kind="debug_dump", link="auto")
    target: Path = bundle
    if a.packed:
        target = pack_bundle(bundle, work / "dump.rbundle", overwrite=True)
    page = work / "report.html"
    t = time.perf_counter()
    written = write_html_report(target, page)
    write_s = time.perf_counter() - t
    floor = work / "floor.html"
    floor_page(page, floor)
    ours = [load_ms(page, work) for _ in range(a.repeats)]
    base = [load_ms(floor, work) for _ in range(a.repeats)]
    mo, mb = statistics.median(ours), statistics.median(base)
    print(f"layout {a.layout}: {len(samples)} samples, {written.images} screenshots shown "
          f"({a.n} distinct), {'packed' if a.packed else 'directory'}")  # fmt: skip
    print(f"write_html_report      {write_s:6.1f} s")
    print(
        f"page size              {written.bytes / 1e6:6.2f} MB ({written.bytes / 2**20:.2f} MiB)   target < 15 MB"
    )
    print(f"floor page size        {floor.stat().st_size / 1e6:6.2f} MB (the thumbnails alone)")
    print(f"load in Chromium       {mo / 1000:6.2f} s median, {min(ours) / 1000:.2f} s min of {a.repeats} "
          f"({', '.join(f'{x / 1000:.2f}' for x in ours)})   target < 3 s")  # fmt: skip
    print(f"floor load             {mb / 1000:6.2f} s median, {min(base) / 1000:.2f} s min   "
          f"ratio page/floor {mo / mb:.2f}x (median), {min(ours) / min(base):.2f}x (min)")  # fmt: skip
    if a.shot:
        render(page.as_uri(), "1", a.shot, 1280, 2000)
        print(f"screenshot             {a.shot}")
    print(f"screenshot command     chromium --headless --no-sandbox --disable-gpu --screenshot=view-600.png "
          f"--window-size=1280,2000 {page.as_uri()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
