"""Structure-aware fuzzing of what ``replay`` reads from a bundle that may come from anyone:
the samples (their images, tokens, lengths, log-probs), the recorded settings (``meta.processor``,
``training_dtype``) and replay reports given back to it (``--expect``, ``view --replay``'s check).

Each example starts from a valid value and mutates it field by field, so that most examples get
past ``Sample.from_dict`` and the report's shape check and reach the rebuild, the processor and
the comparison. Whatever the mutation, :func:`trainer_hooks.replay_bundle` returns a report whose
problems are named (a known kind and a message), or raises a ``BundleError`` (``ValueError`` only
for what the *caller* passed, which these examples never vary); no example runs longer than
``HANG_S`` seconds; and no image that is not stored in the bundle is ever rebuilt (outside paths,
``/dev/stdin`` and a FIFO among the candidates). ``FUZZ_EXAMPLES`` scales the example counts
(default 150 in all); the ci profile derandomizes them.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL.Image")

from helpers import noise_png
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles import BundleError, MediaRef, write_bundle
from trainer_hooks import replay_bundle
from trainer_hooks.replay import check_report_bundle, compare_reports
from trainer_hooks.replay._cli import VIOLATION_KINDS

pytestmark = [pytest.mark.torch, pytest.mark.processor]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
SHARE = {"samples": 0.4, "settings": 0.35, "reports": 0.25}


def fuzz(kind: str) -> Any:
    return settings(
        max_examples=max(5, int(EXAMPLES * SHARE[kind])),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


HANG_S = 60
KINDS = VIOLATION_KINDS | {"processor"}
STATS: dict[str, Counter[str]] = {k: Counter() for k in SHARE}


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang() -> Iterator[None]:
    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"an example ran longer than {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- the valid starting point ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fuzz-untrusted")
    run = root / "run"
    run.mkdir()
    stored = []
    for i, (w, h) in enumerate([(28, 28), (56, 28)]):
        p = run / f"{i}.png"
        p.write_bytes(noise_png(w, h, seed=i))
        stored.append(MediaRef.from_file(p))
    outside = root / "outside.png"
    outside.write_bytes(noise_png(28, 28, seed=99))
    fifo = root / "pipe.png"
    os.mkfifo(fifo)
    sample = {
        "index": 0, "group_index": 0, "prompt": "open the settings",
        "tokens": [151644, 872, 198, 151652, *[151655] * 1, 151653, 9707, 11, 151645],
        "response_length": 3, "loss_mask": [1, 1, 1], "reward": 1.0,
        "rollout_log_probs": [-0.5, -0.25, -0.125], "status": "completed",
        "multimodal_inputs": {"images": [stored[0]]},
    }  # fmt: skip
    processor = {
        "model_path": "Qwen/Qwen2-VL-7B-Instruct",
        "image_processor_backend": "pil",
        "mm_process_config": {"image": {"max_pixels": 12845056, "min_pixels": 3136}},
    }
    meta = {"processor": processor, "training_dtype": "bf16"}
    good = write_bundle(root / "good", [sample], media_roots=[run], kind="debug_dump", meta=meta)
    report = replay_bundle(good)
    return {
        "root": root, "run": run, "stored": stored, "outside": str(outside), "fifo": str(fifo),
        "sample": sample, "meta": meta, "good": good, "report": report, "n": [0],
    }  # fmt: skip


def new_dir(base: dict[str, Any]) -> Path:
    base["n"][0] += 1
    return base["root"] / f"ex{base['n'][0]}"


def check_report(report: dict[str, Any], stored_only: set[str] | None = None) -> None:
    """Every problem named; the summary counts them; JSON-ready."""
    json.dumps(report)
    for entry in report["samples"]:
        for p in entry["problems"]:
            assert p["kind"] in KINDS and isinstance(p["message"], str) and p["message"], p
    assert isinstance(report["summary"]["problems"], dict)


# -- strategies ------------------------------------------------------------------------------------
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=8,
)  # fmt: skip
SIZES = st.one_of(
    st.integers(-5, 40), st.integers(-(2**64), 2**64), st.sampled_from([0, 1, 2, 14, 16, 3136, 12845056, 4e8, 1e12]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5), st.none(), st.booleans(), JSONISH,
)  # fmt: skip


def image_items(base: dict[str, Any]) -> st.SearchStrategy[Any]:
    outside = base["outside"]
    return st.one_of(
        st.sampled_from(base["stored"]),
        st.sampled_from([str(r.path) for r in base["stored"]]),
        st.sampled_from([outside, "../outside.png", "/etc/passwd", "/dev/stdin", "/dev/zero", base["fifo"],
                         "", "media/" + base["stored"][0].filename, os.path.dirname(outside)]),
        st.builds(lambda d: MediaRef.from_bytes(noise_png(4, 4, seed=d)), st.integers(0, 3)),  # unlisted
        JSONISH,
    )  # fmt: skip


@st.composite
def mutated_sample(draw: Any, base: dict[str, Any]) -> dict[str, Any]:
    s = copy.deepcopy(base["sample"])
    fields = ["multimodal_inputs", "tokens", "response_length", "loss_mask", "rollout_log_probs",
              "reward", "index", "group_index", "status", "multimodal_train_inputs", "images"]  # fmt: skip
    for field in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique=True)):
        if field in ("multimodal_inputs", "images"):
            choice = draw(st.integers(0, 4))
            items = draw(st.lists(image_items(base), max_size=4))
            s["multimodal_inputs"] = [
                {"images": items},
                items,
                {"images": draw(image_items(base))},
                draw(JSONISH),
                None,
            ][choice]
        elif field == "tokens":
            s["tokens"] = draw(st.one_of(st.lists(st.integers(-(2**40), 2**40), max_size=40),
                                         st.lists(st.sampled_from([151655, 151652, 151653, 1]), max_size=600),
                                         JSONISH))  # fmt: skip
        elif field == "status":
            s["status"] = draw(st.sampled_from(["completed", "truncated", "aborted", "pending", "nope"]))
        elif field in ("response_length", "index", "group_index"):
            s[field] = draw(SIZES)
        else:
            s[field] = draw(JSONISH)
    return s


# -- the fuzzers -----------------------------------------------------------------------------------
@fuzz("samples")
@given(data=st.data())
def test_fuzz_samples(base, data):
    sample = data.draw(mutated_sample(base))
    path = new_dir(base)
    try:
        write_bundle(path, [sample], media_roots=[base["run"]], kind="debug_dump", meta=base["meta"],
                     outside_paths="keep", missing_media="keep")  # fmt: skip
    except (BundleError, TypeError, ValueError):
        STATS["samples"]["refused by the writer"] += 1
        return
    with no_hang():
        try:
            report = replay_bundle(path, payloads_out=path.parent / f"{path.name}.jsonl")
        except BundleError:
            STATS["samples"]["refused (BundleError)"] += 1
            return
    check_report(report)
    STATS["samples"]["replayed"] += 1
    # Only stored media are ever rebuilt: a sample whose images all came back names only them.
    mm = sample.get("multimodal_inputs")
    items = mm.get("images") if isinstance(mm, dict) else None
    for entry in report["samples"]:
        if entry["images"]:
            STATS["samples"]["images rebuilt"] += 1
            assert isinstance(items, list) and all(
                (isinstance(i, MediaRef) and i in base["stored"])
                or i in {str(r.path) for r in base["stored"]}
                for i in items
            ), items
    payloads = (path.parent / f"{path.name}.jsonl").read_text()
    assert base["outside"] not in payloads and "/etc/passwd" not in payloads


@st.composite
def mutated_processor(draw: Any, base: dict[str, Any]) -> Any:
    proc = copy.deepcopy(base["meta"]["processor"])
    image = proc["mm_process_config"]["image"]
    keys = [
        "min_pixels",
        "max_pixels",
        "patch_size",
        "merge_size",
        "temporal_patch_size",
        "size",
        "do_resize",
    ]
    for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        image[key] = draw(SIZES)
    shape = draw(st.integers(0, 9))
    if shape == 1:
        proc["mm_process_config"] = image  # flat
    elif shape == 2:
        proc["mm_process_config"] = draw(st.one_of(st.text(max_size=20), JSONISH))
    elif shape == 3:
        proc["mm_process_config"] = json.dumps(proc["mm_process_config"], allow_nan=True)
    if draw(st.booleans()):
        proc["model_path"] = draw(st.one_of(
            st.sampled_from(["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen3-VL-8B-Instruct", "google/gemma-3-4b-it",
                             "/etc", "/dev/stdin", "", "qwen2-vl", base["fifo"], str(base["root"])]),
            JSONISH))  # fmt: skip
    if draw(st.booleans()):
        proc["image_token_id"] = draw(SIZES)
    if draw(st.booleans()):
        proc["image_processor_backend"] = draw(JSONISH)
    return draw(st.sampled_from([proc, proc, proc, None, [proc], "x"]))


@fuzz("settings")
@given(data=st.data())
def test_fuzz_recorded_settings(base, data):
    meta = {"processor": data.draw(mutated_processor(base)), "training_dtype": "bf16"}
    if data.draw(st.booleans()):
        meta["training_dtype"] = data.draw(
            st.one_of(st.sampled_from(["bf16", "fp16", "fp32", "fp8"]), JSONISH)
        )
    path = new_dir(base)
    try:
        write_bundle(path, [base["sample"]], media_roots=[base["run"]], kind="debug_dump", meta=meta)
    except (BundleError, TypeError, ValueError):  # not JSON (NaN in meta): the writer refuses
        STATS["settings"]["refused by the writer"] += 1
        return
    with no_hang():
        try:
            report = replay_bundle(path)
        except BundleError as e:
            assert "\n" not in str(e).strip(), str(e)  # one line
            STATS["settings"]["refused (BundleError)"] += 1
            return
    check_report(report)
    STATS["settings"]["replayed"] += 1
    proc = report["processor"]
    for key in ("patch_size", "merge_size", "temporal_patch_size"):
        assert isinstance(proc[key], int) and proc[key] >= 1, proc
    if report["samples"][0]["images"]:
        shape = report["samples"][0]["images"][0]["pixel_values"]["shape"]
        assert all(n > 0 for n in shape), shape  # never an empty [16, 0] tensor passed as clean


def mutate_json(draw: Any, value: Any, depth: int = 0) -> Any:
    """Replace, delete or keep entries of a JSON value, recursively."""
    if isinstance(value, dict) and value:
        out = dict(value)
        for key in draw(st.lists(st.sampled_from(sorted(out)), max_size=3, unique=True)):
            action = draw(st.integers(0, 3))
            if action == 0:
                del out[key]
            elif action == 1:
                out[key] = draw(JSONISH)
            else:
                out[key] = mutate_json(draw, out[key], depth + 1)
        return out
    if isinstance(value, list) and value:
        out_list = list(value)
        j = draw(st.integers(0, len(out_list) - 1))
        out_list[j] = mutate_json(draw, out_list[j], depth + 1) if draw(st.booleans()) else draw(JSONISH)
        return out_list
    return draw(JSONISH) if draw(st.booleans()) else value


@fuzz("reports")
@given(data=st.data())
def test_fuzz_replay_reports(base, data):
    report = mutate_json(data.draw, json.loads(json.dumps(base["report"])))
    with no_hang():
        try:
            check_report_bundle(report, base["good"], "expect")
        except BundleError as e:
            STATS["reports"]["refused by the check"] += 1
            assert "\n" not in str(e).strip()
            return
        STATS["reports"]["accepted by the check"] += 1
        compare_reports(base["report"], report)  # what --expect does with it: named problems or BundleError
        out = replay_bundle(base["good"], expect=report)
    check_report(out)
    for p in out.get("expect", {}).get("changed", []):
        assert p["kind"] == "fingerprint" and isinstance(p["message"], str)


def test_the_untrusted_fuzzers_reach_past_the_first_parser(capsys):
    """Run after the fuzzers (file order): most examples must reach the replay itself."""
    for kind, stats in STATS.items():
        if not stats:
            pytest.skip("run with the fuzzers above")
        with capsys.disabled():
            print(f"\n{kind}: {dict(stats)}")
    assert STATS["samples"]["replayed"] >= math.ceil(0.5 * EXAMPLES * SHARE["samples"])
    assert STATS["samples"]["images rebuilt"] >= 1
    assert STATS["settings"]["replayed"] >= 1 and STATS["settings"]["refused (BundleError)"] >= 1
    assert STATS["reports"]["accepted by the check"] >= 1 and STATS["reports"]["refused by the check"] >= 1
