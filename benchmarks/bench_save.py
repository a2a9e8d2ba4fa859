"""Save-path benchmark: bundles vs. torch.save, on a round of 1080p screenshots (not a test).

    python benchmarks/bench_save.py [--n 600] [--repeats 3] [--tokens 1024 11000] [--dir bench-out]
                                    [--profile auto]

N screenshots (~1 MB PNGs, named by sha256 as a run media store names them) are rendered once
and cached under ``<dir>/media/``. Samples share them the way a multi-turn agent's do: each
trajectory has ``--turns`` screenshots and its turn k references the first k+1 of them, so there
are N samples and N*(turns+1)/2 references to N distinct files.

Each repeat times, in this order, with ``os.sync()`` before each so the source files are clean
and every method pays only for its own durability:

* ``write_bundle(link="auto")``   hard links into the bundle (same filesystem);
* ``write_bundle(link="copy")``   copies and hashes every file;
* ``torch.save``                  the samples with the image bytes inside (each image one shared
                                  ``bytes`` object, so pickle stores it once), fsynced;
* ``copytree + torch.save``       ``shutil.copytree`` of the run media dir, every file and dir
                                  fsynced, plus ``torch.save`` of the samples (paths), fsynced.

Then ``open_bundle(verify="full")`` on the auto bundle, against single-core ``hashlib.sha256``
over the same bytes held in memory. Targets (issues 2 and 11), at 1,024 tokens a sample: auto <= 5 %
of copy; auto >= 20x faster than torch.save; full verify >= 70 % of single-core sha256 throughput.
``--tokens 1024 11000`` adds a computer-use-sized round (four 1080p screenshots are ~11,000 tokens)
reported beside it.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import multiprocessing
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # screenshots.py

from screenshots import render_screenshot, store_media

import bundles

CACHE_VERSION = 1  # bump when render_screenshot changes, so a stale cache is not reused


# -- inputs ----------------------------------------------------------------------------------------
def _render_one(job: tuple[str, int]) -> str:
    run_dir, seed = job
    return store_media(Path(run_dir), render_screenshot(seed)).name


def ensure_media(bench_dir: Path, n: int) -> list[Path]:
    """The N cached screenshots, rendered on all cores the first time."""
    run_dir = bench_dir / "media" / f"run-v{CACHE_VERSION}-n{n}"
    index = run_dir / "INDEX"  # written last: its presence means the cache is complete
    if not index.exists():
        print(f"rendering {n} screenshots into {run_dir} (once) ...", flush=True)
        t = time.perf_counter()
        run_dir.mkdir(parents=True, exist_ok=True)
        with multiprocessing.Pool() as pool:
            names = pool.map(_render_one, [(str(run_dir), 10_000 + i) for i in range(n)], chunksize=4)
        index.write_text("\n".join(names) + "\n")
        print(f"  done in {time.perf_counter() - t:.0f} s", flush=True)
    return [run_dir / name for name in index.read_text().split()]


def make_samples(paths: list[Path], turns: int, tokens: int = 1024) -> list[dict[str, Any]]:
    """Sample dicts shaped like Miles' ``Sample.to_dict()``, referencing screenshots by absolute path."""
    rng = np.random.default_rng(0)
    samples = []
    for t in range(0, len(paths), turns):
        shots = [str(p) for p in paths[t : t + turns]]
        for k in range(len(shots)):
            samples.append(
                {
                    "group_index": t // turns,
                    "index": len(samples),
                    "prompt": f"<|im_start|>user\nstep {k}: finish the task on screen<|im_end|>",
                    "tokens": rng.integers(0, 150_000, tokens).tolist(),
                    "multimodal_inputs": {"images": shots[: k + 1]},
                    "response": "<tool_call>click(960, 540)</tool_call>",
                    "response_length": 256,
                    "reward": float(k == len(shots) - 1),
                    "loss_mask": [1] * 256,
                    "rollout_log_probs": rng.standard_normal(256).astype(np.float32),
                    "status": "completed",
                    "metadata": {"turn": k},
                }
            )
    return samples


def with_image_bytes(samples: list[dict[str, Any]], blobs: dict[str, bytes]) -> list[dict[str, Any]]:
    """The same samples carrying the images themselves, as a checkpoint without a bundle must."""
    return [
        {**s, "multimodal_inputs": {"images": [blobs[p] for p in s["multimodal_inputs"]["images"]]}}
        for s in samples
    ]


# -- the methods being timed ---------------------------------------------------------------------
def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_torch_save(obj: Any, path: Path) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_file(path.parent)


def durable_copytree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        fsync_file(p)
    fsync_file(dst)
    fsync_file(dst.parent)


def timed(fn: Callable[[], Any], profile: cProfile.Profile | None = None) -> float:
    os.sync()  # every method starts from clean page cache state, so none pays for another's writeback
    t = time.perf_counter()
    if profile is not None:
        profile.runcall(fn)
    else:
        fn()
    return time.perf_counter() - t


# -- reporting -----------------------------------------------------------------------------------
def machine_description(path: Path) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        fs = subprocess.run(
            ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        fs = "?"
    import torch

    return (
        f"{cpu}, {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM; "
        f"filesystem {fs} at {path}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"rollout-bundles {bundles.__version__}"
    )


def run_round(
    args: argparse.Namespace,
    tokens: int,
    paths: list[Path],
    blobs: dict[str, bytes],
    out: Path,
    profiles: dict[str, cProfile.Profile],
) -> dict[str, float]:
    """Time every save method on samples of ``tokens`` token ids; return their medians."""
    run_dir = paths[0].parent
    samples = make_samples(paths, args.turns, tokens)
    media_bytes = sum(len(b) for b in blobs.values())
    refs = sum(len(s["multimodal_inputs"]["images"]) for s in samples)
    heavy = with_image_bytes(samples, blobs)
    refs_only = [{"multimodal_inputs": s["multimodal_inputs"]} for s in samples]
    print(
        f"--- {len(samples)} samples ({tokens} tokens each), {refs} references to {len(paths)} screenshots "
        f"({media_bytes / 1e6:.0f} MB); {args.repeats} repeats",
        flush=True,
    )
    methods: dict[str, Callable[[], Any]] = {
        "write_bundle(link='auto')": lambda: bundles.write_bundle(
            out / "auto.bundle", samples, media_roots=[run_dir], link="auto"
        ),
        # The media part alone: the same references, without the tokens/log-probs every method
        # must encode anyway (an information row: where the rest of auto's time goes).
        "write_bundle(link='auto'), references only": lambda: bundles.write_bundle(
            out / "auto-refs.bundle", refs_only, media_roots=[run_dir], link="auto"
        ),
        "write_bundle(link='copy')": lambda: bundles.write_bundle(
            out / "copy.bundle", samples, media_roots=[run_dir], link="copy"
        ),
        "torch.save (images inside)": lambda: durable_torch_save(heavy, out / "samples_with_images.pt"),
        "copytree + torch.save": lambda: (
            durable_copytree(run_dir, out / "media_copy"),
            durable_torch_save(samples, out / "samples.pt"),
        ),
    }
    if args.methods == "auto-copy":
        # The ratio alone, interleaved auto/copy pairs: cheap enough for many repeats on a busy
        # machine (torch.save takes 10-40 s a repeat there).
        methods = {n: f for n, f in methods.items() if n.startswith("write_bundle")}
    profile_of = {"write_bundle(link='auto')": "auto", "write_bundle(link='copy')": "copy"}
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.warmup):
        shutil.rmtree(out)
        out.mkdir()
        for fn in methods.values():
            timed(fn)
    for r in range(args.repeats):
        shutil.rmtree(out)
        out.mkdir()
        for name, fn in methods.items():
            prof = profiles.get(profile_of.get(name, "")) if r == 0 else None
            times[name].append(timed(fn, prof))
        print(f"repeat {r + 1}: " + ", ".join(f"{n} {ts[-1]:.3f} s" for n, ts in times.items()), flush=True)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print()
    print(f"| method ({tokens} tokens a sample) | median s (range) | throughput |")
    print("|---|---:|---:|")
    for name, m in med.items():
        ts = times[name]
        print(f"| {name} | {m:.3f} ({min(ts):.3f}-{max(ts):.3f}) | {media_bytes / m / 1e6:,.0f} MB/s |")
    auto, copy = med["write_bundle(link='auto')"], med["write_bundle(link='copy')"]
    ratios = [
        a / c
        for a, c in zip(times["write_bundle(link='auto')"], times["write_bundle(link='copy')"], strict=True)
    ]
    refs_only_time = med["write_bundle(link='auto'), references only"]
    tsave = med.get("torch.save (images inside)")
    print(
        f"\nauto / copy = {auto / copy:.2%} (per repeat {min(ratios):.2%}-{max(ratios):.2%}, median of the "
        f"per-repeat ratios {statistics.median(ratios):.2%}); "
        + (f"torch.save / auto = {tsave / auto:.1f}x; " if tsave else "")
        + f"auto, references only / copy = {refs_only_time / copy:.2%}\n",
        flush=True,
    )
    med["auto/copy per repeat, median"] = statistics.median(ratios)
    return med


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=600, help="screenshots (default 600, ~0.6 GB)")
    parser.add_argument("--turns", type=int, default=8, help="screenshots per trajectory (default 8)")
    parser.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=[1024],
        help="token ids per sample, a plain list (default 1024); several values run one round each, "
        "e.g. --tokens 1024 11000 (a computer-use round: four 1080p screenshots are ~11,000 tokens)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of each method first (default 1): a training loop saves every step, so "
        "the steady state is what counts, not a process's first call",
    )
    parser.add_argument(
        "--dir", type=Path, default=Path("bench-out"), help="cache and outputs (one filesystem)"
    )
    parser.add_argument(
        "--methods",
        choices=["all", "auto-copy"],
        default="all",
        help="auto-copy: time only the write_bundle rows (the auto/copy ratio), skipping torch.save",
    )
    parser.add_argument(
        "--profile",
        choices=["auto", "copy", "verify"],
        action="append",
        default=[],
        help="print a cProfile of the first repeat of this method, first round (repeatable)",
    )
    args = parser.parse_args(argv)

    bench_dir = args.dir.resolve()
    paths = ensure_media(bench_dir, args.n)
    blobs = {str(p): p.read_bytes() for p in paths}
    media_bytes = sum(len(b) for b in blobs.values())
    # A fresh folder per run: a concurrent run (or anything else under --dir) is never touched.
    out = Path(tempfile.mkdtemp(prefix="out-", dir=bench_dir))
    print(machine_description(bench_dir))
    print(f"outputs in {out}\n", flush=True)

    profiles = {name: cProfile.Profile() for name in args.profile}
    rounds: dict[int, dict[str, float]] = {}
    for i, tokens in enumerate(args.tokens):
        rounds[tokens] = run_round(args, tokens, paths, blobs, out, profiles if i == 0 else {})

    # Verification reads the bytes of the last round's auto bundle, warm in the page cache like
    # the sha256 baseline's.
    bundle_files = [p for p in (out / "auto.bundle").rglob("*") if p.is_file() and p.name != "manifest.json"]
    verified_bytes = sum(p.stat().st_size for p in bundle_files)
    verify_times = [
        timed(
            lambda: bundles.open_bundle(out / "auto.bundle", verify="full"),
            profiles.get("verify") if i == 0 else None,
        )
        for i in range(args.repeats)
    ]
    in_memory = [p.read_bytes() for p in bundle_files]
    sha_times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        for data in in_memory:
            hashlib.sha256(data).digest()
        sha_times.append(time.perf_counter() - t)
    verify_tp = verified_bytes / statistics.median(verify_times) / 1e6
    sha_tp = verified_bytes / statistics.median(sha_times) / 1e6

    print("| method | median s | throughput |")
    print("|---|---:|---:|")
    for tokens, med in rounds.items():
        for name, m in med.items():
            if name.startswith("auto/copy"):
                continue
            print(f"| {name}, {tokens} tokens | {m:.3f} | {media_bytes / m / 1e6:,.0f} MB/s |")
    print(f"| open_bundle(verify='full') | {statistics.median(verify_times):.3f} | {verify_tp:,.0f} MB/s |")
    print(f"| hashlib.sha256, 1 core, in memory | {statistics.median(sha_times):.3f} | {sha_tp:,.0f} MB/s |")

    print()
    for tokens, med in rounds.items():
        auto, copy = med["write_bundle(link='auto')"], med["write_bundle(link='copy')"]
        tsave, ctree = med.get("torch.save (images inside)"), med.get("copytree + torch.save")
        refs = med["write_bundle(link='auto'), references only"]
        # Issue 2's 5 % target is set at 1,024 tokens a sample; other sizes are reported beside it.
        target = tokens == 1024
        checks = [
            (
                f"auto / copy                 = {auto / copy:7.2%}",
                "<= 5 %",
                auto <= 0.05 * copy if target else None,
            ),
            (
                f"auto / copy, per repeat     = {med['auto/copy per repeat, median']:7.2%}",
                "(info)",
                None,
            ),
        ]
        if tsave is not None and ctree is not None:
            checks += [
                (
                    f"torch.save / auto           = {tsave / auto:7.1f}x",
                    ">= 20x",
                    tsave >= 20 * auto if target else None,
                ),
                (f"copytree+torch.save / auto  = {ctree / auto:7.1f}x", "(info)", None),
            ]
        checks.append((f"auto, references only / copy = {refs / copy:7.2%}", "(info)", None))
        print(f"{tokens} tokens a sample:")
        for text, tgt, ok in checks:
            verdict = "" if ok is None else ("PASS" if ok else "MISS")
            print(f"  {text}   target {tgt if ok is not None else '(info)':7} {verdict}")
    ok = verify_tp >= 0.7 * sha_tp
    print(
        f"verify / sha256 throughput  = {verify_tp / sha_tp:7.1%}   target >= 70 %  {'PASS' if ok else 'MISS'}"
    )

    shutil.rmtree(out)
    for name, prof in profiles.items():
        print(f"\n--- cProfile: {name} (first repeat), top 25 by cumulative time ---")
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
