"""``rollout-bundle replay --model`` against the same forward pass called directly (not a test).

    python benchmarks/bench_replay_logprobs.py [--samples 16] [--repeats 3] [--dir bench-out] [--quick]

The workload: ``--samples`` samples, each with two real screenshots (the project's own
``docs/img/serve-run.png`` 1280x860 and ``serve-sample.png`` 1280x900, 1,400 and 1,470 vision
tokens with the Qwen2-VL hub config), a prompt and a 32-token response, written as a token-space
debug dump with the public writer; the model is a small Qwen2-VL with random weights (hidden size
64, two layers, a two-layer vision tower, ~20 M parameters: ``save_pretrained`` into ``--dir``), in
fp32 on the CPU. ``--quick``: two samples of two 224x168 crops, one repeat (the smoke test).

Child processes, each fresh so that its RSS high-water mark (``ru_maxrss``) is its own:

* ``direct``: the model loaded, the samples' inputs rebuilt *before* the clock starts, then one
  forward pass per sample (``input_ids``, ``pixel_values``, ``image_grid_thw``,
  ``mm_token_type_ids``; the log-softmax of the response positions): the floor.
* ``replay``: ``replay_bundle(dump, model=..., batch_bytes=1)``, one sample per forward pass as
  the floor does, everything included (reading the bundle, decoding the screenshots, the rebuild,
  the guard, the token check, the payloads, the fingerprints, loading the model). The time inside
  the scorer's forward passes is clocked by wrapping ``LogprobScorer._forward`` in the child (the
  benchmark's instrument; the product has no timers); the model's load is timed apart.
* ``rebuild``: ``compute_multimodal_train_inputs`` over the same samples alone, one at a time as
  the replay does it: the rebuild's share of the replay's time.
* ``batched``: the same replay with its default memory budget (samples packed into one pass).
* ``alternating``: the replay's scorer (``LogprobScorer``, one sample per pass) and the direct
  forward pass on the same inputs in one process, taking turns sample by sample: the two code
  paths compared without the noise of separate processes on a shared machine.

The replay children fix glibc's mmap threshold as ``rollout-bundle replay`` does. Printed: medians
of samples/s (by wall and by CPU time: CPU time is the steadier on a shared machine) and of peak
RSS; where the replay's CPU time goes; the floor: the replay's forward passes <= 1.1x the direct
ones' CPU time on the same inputs (taking turns in one process; the separate processes' ratio is
printed too), and peak RSS <= 1.1x; and the rebuild's share of the replay.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PAD, VISION_START, VISION_END = 151655, 151652, 151653


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def screenshots(quick: bool) -> list[bytes]:
    from PIL import Image

    out = []
    for name in ("serve-run.png", "serve-sample.png"):
        with Image.open(ROOT / "docs" / "img" / name) as im:
            image = im.convert("RGB")
            if quick:
                image = image.crop((0, 0, 224, 168))
            buf = io.BytesIO()
            image.save(buf, format="PNG")
            out.append(buf.getvalue())
    return out


def build(bench: Path, samples: int, quick: bool) -> tuple[Path, Path]:
    """The model directory and the dump (built once per ``--dir`` and workload)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from trainer_hooks import Sample, load_processor, parse_args, save_debug_rollout_data, store_media

    model_dir = bench / "qwen2vl-small"
    if not (model_dir / "config.json").exists():
        torch.manual_seed(0)
        config = Qwen2VLConfig(
            text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=151936, max_position_embeddings=8192,
                             rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
            vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
            image_token_id=PAD, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
            initializer_range=0.1,
        )  # fmt: skip
        Qwen2VLForConditionalGeneration(config).save_pretrained(model_dir)
        shipped = ROOT / "trainer_hooks" / "data" / "qwen2_vl_preprocessor_config.json"
        (model_dir / "preprocessor_config.json").write_bytes(shipped.read_bytes())
    name = f"dump-{samples}{'-quick' if quick else ''}"
    args = parse_args([
        "--rollout-batch-size", "1", "--shared-media-dir", str(bench / "shared"), "--run-uuid", "bench-logprobs",
        "--save-debug-rollout-data", str(bench / f"{name}_{{rollout_id}}"), "--enable-token-space-processor",
        "--sglang-model-path", str(model_dir), "--sglang-image-processor-backend", "pil",
        "--sglang-mm-process-config", '{"image": {"max_pixels": 12845056, "min_pixels": 3136}}',
    ])  # fmt: skip
    dump = bench / f"{name}_0"
    if dump.exists():
        return model_dir, dump
    pngs = screenshots(quick)
    refs = [store_media(args, png, ".png") for png in pngs]
    from PIL import Image

    proc = load_processor({"model_path": str(model_dir)})
    grid = proc(images=[Image.open(io.BytesIO(p)).convert("RGB") for p in pngs], return_tensors="pt")[
        "image_grid_thw"
    ]
    prompt = [151644, 872, 198]
    for t, h, w in grid.tolist():
        prompt += [VISION_START, *[PAD] * (t * h * w // 4), VISION_END]
    prompt += [3838, 374, 389, 279, 4171, 30, 151645, 198, 151644, 77091, 198]
    out = []
    for i in range(samples):
        response = [1000 + 37 * i + k for k in range(32)]
        out.append(Sample(index=i, group_index=i, prompt="bench", tokens=prompt + response,
                          multimodal_inputs={"images": list(refs)}, response_length=len(response),
                          loss_mask=[1] * len(response), rollout_log_probs=[-12.0] * len(response),
                          status=Sample.Status.COMPLETED))  # fmt: skip
    return model_dir, Path(str(save_debug_rollout_data(args, out, 0, evaluation=False)))


def _inputs(model_dir: Path, quick: bool) -> tuple[dict, object]:
    """The rebuilt inputs of every sample (they all show the same two screenshots) and the processor."""
    from PIL import Image

    from trainer_hooks import compute_multimodal_train_inputs, load_processor

    proc = load_processor({"model_path": str(model_dir)})
    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in screenshots(quick)]
    (inputs,) = compute_multimodal_train_inputs([{"multimodal_inputs": {"images": images}}], proc, _fp32())
    return inputs, proc


def _fp32():
    import torch

    return torch.float32


def child_direct(ns: argparse.Namespace) -> dict:
    """One forward pass per sample on inputs rebuilt before the clock starts."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from bundles import open_bundle
    from trainer_hooks import Sample

    model = Qwen2VLForConditionalGeneration.from_pretrained(ns.model, dtype=torch.float32).eval()
    with open_bundle(ns.dump) as bundle:
        samples = list(bundle.samples(Sample))
    inputs, _ = _inputs(Path(ns.model), ns.quick)
    t, cpu = time.perf_counter(), time.process_time()
    for s in samples:
        _direct_forward(model, s, inputs)
    return {"seconds": time.perf_counter() - t, "cpu": time.process_time() - cpu, "samples": len(samples),
            "peak_rss": peak_rss()}  # fmt: skip


def _direct_forward(model, s, inputs) -> list[float]:
    """The forward pass called directly: one sample, its response's log-probs."""
    import torch

    ids = torch.tensor([s.tokens])
    n = s.response_length
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"],
                       image_grid_thw=inputs["image_grid_thw"], mm_token_type_ids=(ids == PAD).to(torch.int32),
                       logits_to_keep=n + 1, use_cache=False).logits  # fmt: skip
    logp = torch.log_softmax(logits[0, :-1].float(), -1)
    return logp.gather(-1, ids[0, -n:].unsqueeze(-1)).squeeze(-1).tolist()


def child_alternating(ns: argparse.Namespace) -> dict:
    """The replay's scorer and the direct forward pass on the same inputs, in one process, taking
    turns sample by sample (which goes first alternates): the code paths compared without the
    noise of separate processes on a shared machine."""
    import torch

    from bundles import open_bundle
    from trainer_hooks import Sample
    from trainer_hooks.replay import LogprobScorer, ScoreItem, load_model

    model = load_model(ns.model, "cpu", torch.float32)
    with open_bundle(ns.dump) as bundle:
        samples = list(bundle.samples(Sample))
    inputs, _ = _inputs(Path(ns.model), ns.quick)
    scorer = LogprobScorer(model, "cpu", 1, None, None, PAD)

    def replay(s) -> list[float]:
        item = ScoreItem({}, s.tokens, len(s.tokens) - s.response_length, inputs, [], None)
        return scorer._forward([item])[0]

    spent = {"direct": 0.0, "replay": 0.0}
    _direct_forward(model, samples[0], inputs), replay(samples[0])  # warm both paths
    for k, s in enumerate(samples):
        order = ("direct", "replay") if k % 2 else ("replay", "direct")
        for name in order:
            cpu = time.process_time()
            _direct_forward(model, s, inputs) if name == "direct" else replay(s)
            spent[name] += time.process_time() - cpu
    return {"direct_cpu": spent["direct"], "replay_cpu": spent["replay"], "samples": len(samples)}


class _Clock:
    """Wall and CPU seconds spent inside the functions :meth:`wrap` wraps, by name."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {}

    def wrap(self, owner: object, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        def timed(*a, **kw):
            t, cpu = time.perf_counter(), time.process_time()
            try:
                return inner(*a, **kw)
            finally:
                spent = self.spent.setdefault(name, [0.0, 0.0])
                spent[0] += time.perf_counter() - t
                spent[1] += time.process_time() - cpu

        setattr(owner, attr, timed)


def child_replay(ns: argparse.Namespace) -> dict:
    """``replay_bundle`` with the model, one sample per forward pass (``--batched``: the default
    budget). The time inside the scorer's forward passes is clocked by wrapping
    ``LogprobScorer._forward`` in this child (the benchmark's instrument; the product has no
    timers); the model's load is measured beforehand, apart."""
    import torch

    from trainer_hooks import replay_bundle
    from trainer_hooks.replay import LogprobScorer, load_model, tune_allocator

    tune_allocator()  # as `rollout-bundle replay` does
    # Imported before the clock starts, as the direct child imports them: one-off costs of a process.
    from transformers import Qwen2VLImageProcessorPil  # noqa: F401

    t, cpu = time.perf_counter(), time.process_time()
    load_model(ns.model, "cpu", torch.float32)
    load, load_cpu = time.perf_counter() - t, time.process_time() - cpu
    clock = _Clock()
    clock.wrap(LogprobScorer, "_forward", "forward")
    t, cpu = time.perf_counter(), time.process_time()
    # One sample a pass: a budget one sample fits and two do not (a sample over the budget alone is
    # refused, not run). The samples are alike: the scorer's estimate of one row (hidden 64, 4 heads,
    # fp32: activations + attention scores + kept logits) and room for pixels under one more row.
    from bundles import open_bundle
    from trainer_hooks import Sample

    with open_bundle(ns.dump) as bundle:
        first = next(iter(bundle.samples(Sample)))
    n, keep = len(first.tokens), first.response_length + 1
    row = n * 64 * 4 * 24 + 4 * n * n * 4 + keep * 151936 * 8
    one = row + min(row - 1, 64 << 20)
    report = replay_bundle(ns.dump, model=ns.model, batch_bytes=1 << 30 if ns.batched else one)
    seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    assert report["summary"]["problems"] == {}, report["summary"]
    forward, forward_cpu = clock.spent["forward"]
    return {"seconds": seconds, "cpu": cpu, "samples": len(report["samples"]), "peak_rss": peak_rss(),
            "load": load, "load_cpu": load_cpu, "forward": forward, "forward_cpu": forward_cpu}  # fmt: skip


def child_rebuild(ns: argparse.Namespace) -> dict:
    """The rebuild alone, over the bundle's samples and stored media, one sample at a time as
    the replay does it (``compute_multimodal_train_inputs``, fp32)."""
    from bundles import open_bundle
    from trainer_hooks import Sample, compute_multimodal_train_inputs, load_processor
    from trainer_hooks.replay import tune_allocator

    tune_allocator()
    with open_bundle(ns.dump) as bundle:
        samples = list(bundle.samples(Sample))
        proc = load_processor(bundle.meta["processor"])
        t, cpu = time.perf_counter(), time.process_time()
        for s in samples:
            compute_multimodal_train_inputs([s], proc, _fp32())
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    return {"seconds": seconds, "cpu": cpu, "samples": len(samples), "peak_rss": peak_rss()}


CHILDREN = {
    "direct": child_direct,
    "replay": child_replay,
    "rebuild": child_rebuild,
    "alternating": child_alternating,
}


def _run_child(kind: str, ns: argparse.Namespace, model_dir: Path, dump: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    child = "replay" if kind == "batched" else kind
    cmd = [sys.executable, __file__, "--child", child, "--model", str(model_dir), "--dump", str(dump)]
    cmd += ["--quick"] if ns.quick else []
    cmd += ["--batched"] if kind == "batched" else []
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="child processes of each kind (alternating)")
    p.add_argument("--dir", type=Path, default=Path("bench-out"))
    p.add_argument(
        "--quick", action="store_true", help="2 samples of two small crops, one repeat (smoke test)"
    )
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--dump", help=argparse.SUPPRESS)
    p.add_argument("--batched", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        print(json.dumps(CHILDREN[ns.child](ns)))
        return 0
    if ns.quick:
        ns.samples, ns.repeats = 2, 1
    bench = ns.dir.resolve()
    bench.mkdir(parents=True, exist_ok=True)
    model_dir, dump = build(bench, ns.samples, ns.quick)
    sizes = "two 224x168 crops" if ns.quick else "two 1280x860/1280x900 screenshots"
    print(
        f"workload: {ns.samples} samples x {sizes}, 32 response tokens; Qwen2-VL ~20 M parameters, fp32, CPU"
    )
    runs: dict[str, list[dict]] = {k: [] for k in ("direct", "replay", "rebuild", "batched")}
    for r in range(ns.repeats):
        kinds = ["direct", "replay", "rebuild", "batched"]
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            result = _run_child(kind, ns, model_dir, dump)
            runs[kind].append(result)
            print(f"  {kind} run {r + 1}: {result['seconds']:.2f} s, {result['samples'] / result['seconds']:.2f} "
                  f"samples/s, peak RSS {result['peak_rss'] / 2**20:.0f} MiB", flush=True)  # fmt: skip
    alternating = [_run_child("alternating", ns, model_dir, dump) for _ in range(ns.repeats)]
    return _report(runs, alternating, ns.quick)


def _report(runs: dict[str, list[dict]], alternating: list[dict], quick: bool) -> int:
    def med(kind: str, field: str) -> float:
        return statistics.median(x[field] for x in runs[kind])

    print()
    print(f"{'':32}{'samples/s':>10}{'(by CPU)':>10}{'peak RSS':>13}")
    for kind, label in (("direct", "forward pass called directly"), ("replay", "replay --model, 1 per pass"),
                        ("batched", "replay --model, batched")):  # fmt: skip
        n = med(kind, "samples")
        print(f"{label:32}{n / med(kind, 'seconds'):>10.2f}{n / med(kind, 'cpu'):>10.2f}"
              f"{med(kind, 'peak_rss') / 2**20:>9.0f} MiB")  # fmt: skip
    print("inside the replay (1 per pass), median CPU time:")
    total = med("replay", "cpu")
    parts = {"forward": med("replay", "forward_cpu"), "rebuild": med("rebuild", "cpu")}
    parts["the rest"] = total - sum(parts.values())
    for name, spent in parts.items():
        print(f"  {name:10}{spent:>8.2f} s {spent / total:>5.0%}")
    print(f"  (the model's load, apart: {med('replay', 'load_cpu'):.2f} s)")
    ratio = parts["forward"] / med("direct", "cpu")
    wall = med("replay", "forward") / med("direct", "seconds")
    rss = med("replay", "peak_rss") / med("direct", "peak_rss")
    same = statistics.median(x["replay_cpu"] / x["direct_cpu"] for x in alternating)
    print(f"replay's forward passes / direct  {ratio:.2f}x CPU time ({wall:.2f}x wall), separate processes")
    print(f"  the same, in one process taking turns: {same:.2f}x CPU time (median of {len(alternating)})")
    print(f"replay / direct peak RSS          {rss:.2f}x")
    print(f"rebuild's share of the replay     {parts['rebuild'] / total:.0%} of its CPU time (the rebuild alone,"
          " in its own process)")  # fmt: skip
    verdict = "meets" if same <= 1.1 and rss <= 1.1 else "MISSES"
    print(f"floor: replay <= 1.1x the direct forward pass (CPU time taking turns, peak RSS): {verdict} it")
    return 0 if quick or verdict == "meets" else 1


if __name__ == "__main__":
    sys.exit(main())
