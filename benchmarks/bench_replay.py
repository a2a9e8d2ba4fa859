"""Peak memory and time of the replay rebuild, float32 against bf16 (not a test).

    python benchmarks/bench_replay.py [--samples 20] [--images 2] [--repeats 3] [--dir bench-out]

The workload of issue 7: ``--samples`` samples with ``--images`` 1920x1080 screenshots each
(``examples/screenshots.py`` renders them once, cached under ``<dir>/media`` by
``benchmarks/bench_save.py``'s ``ensure_media``), rebuilt with the real Qwen2-VL image processor
built from the shipped hub config (2691 vision tokens, 10764 x 1176 float32 ``pixel_values``,
50.6 MB per screenshot) by :func:`trainer_hooks.compute_multimodal_train_inputs`, which holds
every sample's result as the trainer's ``get_rollout_data`` does for a step.

Each (dtype, repeat) runs in a fresh child process so that its RSS high-water mark
(``ru_maxrss``) is that rebuild's alone; the child also reports its RSS after imports (the
floor: interpreter, torch, transformers, the processor), the bytes the processor returned and
the bytes kept. The child sets glibc's mmap threshold as ``rollout-bundle replay`` does
(``--default-allocator`` leaves it; see ``trainer_hooks/replay/_memory.py``). Printed: medians per dtype and the bf16/fp32 ratios, of peak RSS, of peak above
the floor, and of wall and CPU time (CPU time is the steadier on a shared machine). Target (issue 7): bf16 peak RSS <= 0.6 x fp32 peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench_save.py
sys.path.insert(0, str(HERE.parent / "examples"))  # screenshots.py, for bench_save


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(ns: argparse.Namespace) -> int:
    import torch

    from trainer_hooks import Sample, compute_multimodal_train_inputs, load_processor
    from trainer_hooks.replay import dtype_from_name, tune_allocator

    tuned = tune_allocator() if not ns.default_allocator else False
    paths = json.loads(Path(ns.paths).read_text())
    proc = load_processor(None)
    samples = [
        Sample(index=i, multimodal_inputs={"images": paths[i * ns.images : (i + 1) * ns.images]})
        for i in range(ns.samples)
    ]
    floor = rss_now()
    before = [0]

    def count(_position, _cast, fp32_bytes):
        before[0] += fp32_bytes

    t, cpu = time.perf_counter(), time.process_time()
    kept = compute_multimodal_train_inputs(samples, proc, dtype_from_name(ns.child), on_sample=count)
    seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - cpu
    after = sum(
        v.numel() * v.element_size() for d in kept if d for v in d.values() if isinstance(v, torch.Tensor)
    )
    tokens = sum(int(g.prod()) // proc.merge_size**2 for d in kept if d for g in d["image_grid_thw"])
    print(
        json.dumps(
            {
                "dtype": ns.child,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "floor_rss": floor,
                "bytes_before_cast": before[0],
                "bytes_kept": after,
                "vision_tokens": tokens,
                "pixel_dtype": str(kept[0]["pixel_values"].dtype),
                "allocator_tuned": tuned,
            }
        )
    )
    return 0


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--images", type=int, default=2, help="1920x1080 screenshots per sample")
    p.add_argument("--repeats", type=int, default=3, help="child processes per dtype (alternating)")
    p.add_argument("--dir", type=Path, default=Path("bench-out"))
    p.add_argument(
        "--default-allocator",
        action="store_true",
        help="leave glibc's mmap threshold as it is (rollout-bundle replay fixes it at 4 MiB)",
    )
    p.add_argument("--child", choices=["fp32", "bf16", "fp16"], help=argparse.SUPPRESS)
    p.add_argument("--paths", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        return child(ns)

    from bench_save import ensure_media, machine_description

    bench_dir = ns.dir.resolve()
    n = ns.samples * ns.images
    paths = [str(x) for x in ensure_media(bench_dir, n)]
    paths_file = bench_dir / f"replay-paths-{n}.json"
    paths_file.write_text(json.dumps(paths))
    print(machine_description(bench_dir))
    print(f"workload: {ns.samples} samples x {ns.images} screenshots of 1920x1080, Qwen2-VL hub config")
    allocator = (
        "glibc default" if ns.default_allocator else "mmap threshold 4 MiB, as rollout-bundle replay sets it"
    )
    print(f"allocator: {allocator}; malloc_trim after each sample")
    runs: dict[str, list[dict]] = {"fp32": [], "bf16": []}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    for r in range(ns.repeats):
        for dtype in ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32"):
            cmd = [sys.executable, __file__, "--child", dtype, "--paths", str(paths_file),
                   "--samples", str(ns.samples), "--images", str(ns.images)]  # fmt: skip
            if ns.default_allocator:
                cmd.append("--default-allocator")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            result = json.loads(out.strip().splitlines()[-1])
            runs[dtype].append(result)
            print(
                f"  {dtype} run {r + 1}: {result['seconds']:.2f} s ({result['cpu_seconds']:.2f} s CPU), peak RSS {gib(result['peak_rss'])} "
                f"(floor {gib(result['floor_rss'])}), kept {gib(result['bytes_kept'])}",
                flush=True,
            )
    med = {
        d: {
            k: statistics.median(x[k] for x in rs)
            for k in ("seconds", "cpu_seconds", "peak_rss", "floor_rss")
        }
        for d, rs in runs.items()
    }
    first = {d: rs[0] for d, rs in runs.items()}
    print()
    print(f"{'':24}{'fp32':>12}{'bf16':>12}{'bf16/fp32':>12}")
    rows = [
        ("processor output", first["fp32"]["bytes_before_cast"], first["bf16"]["bytes_before_cast"], gib),
        ("tensors kept", first["fp32"]["bytes_kept"], first["bf16"]["bytes_kept"], gib),
        ("peak RSS (median)", med["fp32"]["peak_rss"], med["bf16"]["peak_rss"], gib),
        ("RSS after imports", med["fp32"]["floor_rss"], med["bf16"]["floor_rss"], gib),
        ("peak above imports", med["fp32"]["peak_rss"] - med["fp32"]["floor_rss"],
         med["bf16"]["peak_rss"] - med["bf16"]["floor_rss"], gib),
        ("wall time (median)", med["fp32"]["seconds"], med["bf16"]["seconds"], lambda s: f"{s:.2f} s"),
        ("CPU time (median)", med["fp32"]["cpu_seconds"], med["bf16"]["cpu_seconds"], lambda s: f"{s:.2f} s"),
    ]  # fmt: skip
    for name, a, b, fmt in rows:
        print(f"{name:24}{fmt(a):>12}{fmt(b):>12}{b / a:>11.2f}x")
    print(f"vision tokens: {first['bf16']['vision_tokens']} ({first['bf16']['pixel_dtype']} pixel_values)")
    ratio = med["bf16"]["peak_rss"] / med["fp32"]["peak_rss"]
    verdict = "meets" if ratio <= 0.6 else "MISSES"
    print(f"target: bf16 peak RSS <= 0.6 x fp32: {ratio:.3f}x, {verdict} it")
    return 0 if ratio <= 0.6 else 1


if __name__ == "__main__":
    sys.exit(main())
