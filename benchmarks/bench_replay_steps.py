"""``rollout-bundle replay`` against the bare image processor on the same screenshots (not a test).

    python benchmarks/bench_replay_steps.py [--samples 16] [--images 2] [--repeats 3] [--dir bench-out]

Issue 25, row 6. ``--samples`` samples with ``--images`` 1920x1080 screenshots each (rendered
once and cached under ``<dir>/media`` by ``benchmarks/bench_save.py``'s ``ensure_media``), written
as a token-space bf16 debug dump by our own API (``store_media`` + ``save_debug_rollout_data``,
placeholder counts from the processor). The processor is the real Qwen2-VL image processor built
offline from the shipped hub config (``load_processor``, as ``trainer_hooks`` builds it;
``HF_HUB_OFFLINE=1``). In the same process, on the same images, interleaved (the order alternates
per repeat), it times:

* (a) the bare processor, as a user would call it: ``PIL.Image.open(path).convert("RGB")`` and
  ``processor(images=[img], return_tensors="pt")`` per image, results dropped;
* (b) ``rollout-bundle replay DUMP --json --no-progress`` through ``trainer_hooks.cli.main``, the
  CLI's own entry point called in-process: the same code the command runs (bundle open and
  verification, plan, processor load, guard, rebuild, cast, fingerprints, token check, payload,
  report), without interpreter start-up and imports (paid once by this process, as by any CLI
  process before it reaches the replay).

Printed: the machine and load average, the medians of (a) and (b) in ms per image, the ratio
(b)/(a) against the goal (issue 25: <= 1.05x), and a per-step breakdown of one more, instrumented
replay (module functions wrapped with timers): ms per image for each step, split into the main
thread's time and time on replay's worker thread (overlapped with the main thread, so only the
main thread's time and its waits add to the wall time). ``replay: other`` is (b)'s wall time
minus the main thread's timed steps. Exit status 0 when the goal is met, 1 otherwise.

The CLI fixes glibc's mmap threshold for its process (``tune_allocator``); this process sets it
before anything is timed, so (a) and (b) run under the same allocator.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench_save.py
sys.path.insert(0, str(HERE.parent / "examples"))  # screenshots.py, for bench_save

GOAL = 1.05
PAD = 151655
PROMPT = [151644, 872, 198]
VISION_START, VISION_END = 151652, 151653


def write_dump(work: Path, paths: list[Path], images: int, samples: int, counts: dict[Path, int]) -> Path:
    """A token-space bf16 debug dump of ``samples`` samples, ``images`` screenshots each, written
    with the library's own API; returns its path."""
    from trainer_hooks import Sample, parse_args, save_debug_rollout_data, store_media

    args = parse_args(
        [
            "--rollout-batch-size", "1", "--shared-media-dir", str(work / "shared"),
            "--run-uuid", "bench-replay-steps", "--bf16",
            "--save-debug-rollout-data", str(work / "dump_{rollout_id}"),
            "--enable-token-space-processor", "--sglang-model-path", "Qwen/Qwen2-VL-7B-Instruct",
            "--sglang-image-processor-backend", "pil",
        ]
    )  # fmt: skip
    out = []
    for i in range(samples):
        shots = paths[i * images : (i + 1) * images]
        refs = [store_media(args, p.read_bytes(), ".png") for p in shots]
        tokens = list(PROMPT)
        for p in shots:
            tokens += [VISION_START, *[PAD] * counts[p], VISION_END]
        response = [9707, 11, 1879, 151645]
        out.append(
            Sample(
                group_index=i, index=i, prompt="finish the task on screen", tokens=tokens + response,
                multimodal_inputs={"images": refs}, response="ok", response_length=len(response),
                reward=1.0, loss_mask=[1] * len(response), rollout_log_probs=[-0.25] * len(response),
                status=Sample.Status.COMPLETED,
            )
        )  # fmt: skip
    return Path(save_debug_rollout_data(args, out, 0, evaluation=False))


def bare(processor: Any, paths: list[Path]) -> float:
    from PIL import Image

    t = time.perf_counter()
    for p in paths:
        with Image.open(p) as f:
            img = f.convert("RGB")
        out = processor(images=[img], return_tensors="pt")
        del out, img
    return time.perf_counter() - t


def replay(dump: Path) -> float:
    from trainer_hooks.cli import main

    sink = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        status = main(["replay", str(dump), "--json", "--no-progress"])
    seconds = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"replay exited {status}: {sink.getvalue()[-2000:]}")
    return seconds


# -- the instrumented replay -----------------------------------------------------------------------
# (label, module, attribute): leaf steps, none calling another. Missing ones are skipped, so that
# the same script measures versions of replay that split the work differently.
STEPS = [
    ("load/decode (bundle read + decode_image + RGB)", "trainer_hooks.replay._media", "MediaReader.image"),
    ("processor call", "trainer_hooks.replay._processor", "ReplayProcessor.__call__"),
    ("conversion (_default_convert)", "trainer_hooks.replay._run", "_default_convert"),
    ("guard (guard_violations)", "trainer_hooks.replay._run", "guard_violations"),
    ("cast fp32 -> bf16", "trainer_hooks.replay._rebuild", "_cast"),
    ("cast fp32 -> bf16", "trainer_hooks.replay._overlap", "PixelWorker._cast_into_buffer"),
    ("concatenate images (torch.cat)", "torch", "cat"),
    ("malloc_trim", "trainer_hooks.replay._rebuild", "release_freed_memory"),
    ("malloc_trim", "trainer_hooks.replay._overlap", "release_freed_memory"),
    ("fingerprints (sha256)", "trainer_hooks.replay._fingerprint", "_digest"),
    ("token check", "trainer_hooks.replay._run", "check_image_tokens"),
    ("payload", "trainer_hooks.replay._run", "build_prefill_scoring_payload"),
    ("wait for the worker thread", "trainer_hooks.replay._run", "_wait"),
    ("wait for the worker thread", "trainer_hooks.replay._overlap", "_wait"),
    ("bundle open + verify", "trainer_hooks.replay._replay", "open_replay_bundle"),
    ("plan", "trainer_hooks.replay._replay", "plan_replay"),
    ("processor load", "trainer_hooks.replay._replay", "load_processor"),
]


def instrumented(dump: Path) -> tuple[float, dict[str, list[float]]]:
    """One replay with every step in STEPS timed; returns (wall seconds, {label: [main s, worker s]})."""
    import importlib

    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    undo: list[Callable[[], None]] = []

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                main = threading.current_thread() is threading.main_thread()
                spent[label][0 if main else 1] += time.perf_counter() - t

        return wrapper

    for label, module, attr in STEPS:
        owner: Any = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if name not in vars(owner):
            continue
        original = vars(owner)[name]
        setattr(owner, name, timed(label, original))
        undo.append(lambda owner=owner, name=name, original=original: setattr(owner, name, original))
    try:
        seconds = replay(dump)
    finally:
        for u in reversed(undo):
            u()
    return seconds, dict(spent)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--images", type=int, default=2, help="1920x1080 screenshots per sample")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of (a) and (b)")
    p.add_argument("--dir", type=Path, default=Path("bench-out"))
    ns = p.parse_args(argv)

    import torch
    from bench_save import ensure_media, machine_description
    from PIL import Image

    from trainer_hooks import load_processor
    from trainer_hooks.replay import tune_allocator

    bench_dir = ns.dir.resolve()
    n = ns.samples * ns.images
    paths = ensure_media(bench_dir, n)
    print(machine_description(bench_dir))
    print(
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch threads {torch.get_num_threads()}"
    )
    tuned = tune_allocator()
    print(f"allocator: mmap threshold 4 MiB for (a) and (b), as rollout-bundle replay sets it ({tuned})")
    wrapped = load_processor(None)
    processor = wrapped.image_processor  # the transformers processor itself, as a user holds it
    print(
        f"workload: {ns.samples} samples x {ns.images} screenshots of 1920x1080, "
        f"{type(processor).__name__} from the shipped Qwen2-VL hub config (offline)"
    )
    sizes = {p: Image.open(p).size for p in paths}
    per_size = {}
    for size in set(sizes.values()):
        grid = processor(images=[Image.new("RGB", size)], return_tensors="pt")["image_grid_thw"][0]
        per_size[size] = int(grid.prod()) // wrapped.merge_size**2
    counts = {p: per_size[sizes[p]] for p in paths}
    work = bench_dir / "replay-steps"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        dump = write_dump(work, paths, ns.images, ns.samples, counts)
        print(f"debug dump: {dump} ({sum(counts.values())} vision tokens)")
        print(
            "(b) runs `rollout-bundle replay DUMP --json --no-progress` in-process (trainer_hooks.cli.main):"
        )
        print("    interpreter start-up and imports excluded")
        replay(dump)  # warm-up: page cache, lazy imports, first-call costs, for both
        bare(processor, paths[:2])
        times: dict[str, list[float]] = {"bare": [], "replay": []}
        for r in range(ns.repeats):
            for which in ("bare", "replay") if r % 2 == 0 else ("replay", "bare"):
                s = bare(processor, paths) if which == "bare" else replay(dump)
                times[which].append(s)
            print(
                f"  repeat {r + 1}: (a) bare {1e3 * times['bare'][-1] / n:.1f} ms/image, "
                f"(b) replay {1e3 * times['replay'][-1] / n:.1f} ms/image",
                flush=True,
            )
        a = statistics.median(times["bare"]) / n
        b = statistics.median(times["replay"]) / n
        ratio = b / a
        verdict = "meets" if ratio <= GOAL else "MISSES"
        print()
        print(f"(a) bare processor      {1e3 * a:8.1f} ms/image (median of {ns.repeats})")
        print(f"(b) rollout-bundle replay {1e3 * b:6.1f} ms/image (median of {ns.repeats})")
        print(f"ratio (b)/(a) {ratio:.3f}x; goal <= {GOAL:.2f}x: {verdict} it")
        print()
        total, spent = instrumented(dump)
        print(f"per-step breakdown, one instrumented replay ({1e3 * total / n:.1f} ms/image), ms per image:")
        print(f"  {'step':52}{'main':>9}{'worker':>9}")
        main_sum = 0.0
        for label in dict.fromkeys(label for label, _, _ in STEPS):
            if label not in spent:
                continue
            m, w = spent[label]
            main_sum += m
            print(f"  {label:52}{1e3 * m / n:9.2f}{1e3 * w / n:9.2f}")
        print(f"  {'other (report, shard decode, loop, ...)':52}{1e3 * (total - main_sum) / n:9.2f}")
        print(f"  (a)'s PIL open + processor, for comparison: {1e3 * a:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
