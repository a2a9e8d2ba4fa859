"""``rollout-bundle replay --model``: the trainer's log-probs against the rollout's, on a real
reference run (issue 38).

A small Qwen2-VL with random weights is saved with ``save_pretrained`` (no hub, no download); it
generates a rollout over real screenshots through the real processor (``helpers.reference_run``),
written as a debug dump with the public writer. Replayed against the same model, every sample's
``mean_abs`` is at most 1e-4 in fp32. Then each bug replay exists to catch is planted in a copy of
the dump and is flagged over the threshold, or refused earlier by the check that owns it, naming
the sample. The model, the rollout and the reference dump are built once for the module.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL.Image")

from helpers.reference_run import PAD, Rollout, make_rollout, prefill_logprobs, save_model, write_dump  # noqa: E402

from trainer_hooks import replay_bundle, store_media  # noqa: E402
from trainer_hooks.cli import main  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.processor, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 1e-3  # --max-logprob-diff of the planted bugs: 10x the reference's bound


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Rollout:
    tmp = tmp_path_factory.mktemp("reference")
    return make_rollout(tmp, save_model(tmp / "model"))


@pytest.fixture(scope="module")
def reference(run) -> Path:
    return write_dump(run, "reference")


def _replay(dump: Path, run: Rollout, **kw) -> dict:
    return replay_bundle(dump, model=str(run.model_dir), max_logprob_diff=LIMIT, **kw)


def _problems(report: dict) -> dict[int, list[tuple[str, str]]]:
    """Per sample index: its problems' kinds and messages."""
    return {e["index"]: [(p["kind"], p["message"]) for p in e["problems"]] for e in report["samples"]}


def _planted(run: Rollout) -> list:
    return [copy.deepcopy(s) for s in run.samples]


def test_the_reference_run_replays_within_1e_4_in_fp32(run, reference, tmp_path):
    """A real `rollout-bundle replay --model` subprocess: exit 0, every sample within 1e-4, the
    two-turn sample broken down by turn (the observation between them left out), the summary."""
    report = tmp_path / "replay.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "trainer_hooks.cli", "replay", str(reference), "--model", str(run.model_dir),
         "--max-logprob-diff", str(LIMIT), "--report", str(report), "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "log-probs      4 samples, 25 tokens" in done.stdout and "k3 KL" in done.stdout
    doc = json.loads(report.read_text())
    assert doc["dtype"] == "fp32" and doc["summary"]["problems"] == {}
    for entry, sample in zip(doc["samples"], run.samples, strict=True):
        diff = entry["logprob_diff"]
        assert diff["mean_abs"] <= 1e-4 and diff["max_abs"] <= 1e-4, (entry["index"], diff)
        assert len(diff["recomputed"]) == sample.response_length and diff["first_over"] is None
    turns = doc["samples"][3]["logprob_diff"]["turns"]
    assert [(t["turn"], t["start"], t["tokens"]) for t in turns] == [(0, 0, 5), (1, 20, 5)]
    assert doc["samples"][3]["logprob_diff"]["tokens"] == 10  # the observation's 15 tokens not compared
    summary = doc["summary"]["logprob"]
    assert summary["samples"] == 4 and summary["tokens"] == 25 and summary["mean_abs"]["max"] <= 1e-4
    assert abs(summary["k3"]) < 1e-8 and summary["tis_clipped_tokens"] == 0
    assert doc["model"] == {"path": str(run.model_dir), "device": "cpu", "max_logprob_diff": LIMIT}


def test_a_swapped_screenshot_is_over_the_threshold_naming_the_sample(run, tmp_path):
    samples = _planted(run)
    # Screenshot 2 is the size of screenshot 0 (same grid, same placeholders): only the model sees it.
    samples[0].multimodal_inputs["images"][0] = store_media(run.args, run.pngs[2], ".png")
    report = _replay(write_dump(run, "swapped", samples), run)
    assert report["summary"]["problems"] == {"logprob": 1}
    ((kind, message),) = _problems(report)[20]
    assert kind == "logprob" and message.startswith(
        "sample index 20 (position 0): the trainer's log-probs differ"
    )
    assert "first token over it: turn 0, response token 0" in message
    assert report["samples"][0]["logprob_diff"]["mean_abs"] > 10 * LIMIT
    assert report["samples"][0]["logprob_diff"]["first_over"]["token"] == run.samples[0].tokens[-5]
    assert all(e["logprob_diff"]["mean_abs"] <= 1e-4 for e in report["samples"][1:])
    assert report["summary"]["logprob"]["mean_abs"]["max"] > 10 * LIMIT


def test_a_dropped_screenshot_with_its_placeholders_kept_is_refused_by_the_token_check(run):
    samples = _planted(run)
    del samples[1].multimodal_inputs["images"][1]
    report = _replay(write_dump(run, "dropped", samples), run)
    ((kind, message),) = _problems(report)[21]
    assert kind == "token_count" and "sample index 21" in message
    assert report["samples"][1]["logprob_diff"] is None  # not scored on inputs the check refused
    assert [e["logprob_diff"]["mean_abs"] <= 1e-4 for e in report["samples"] if e["index"] != 21] == [
        True
    ] * 3


def test_a_dropped_screenshot_outside_token_space_is_refused_by_the_model_naming_the_sample(run, tmp_path):
    """Without recorded processor settings there is no token check: the model refuses the inputs."""
    from helpers.args import trainer_args

    from trainer_hooks import save_debug_rollout_data

    samples = _planted(run)[1:2]
    del samples[0].multimodal_inputs["images"][1]
    args = trainer_args(
        run.tmp, "run-reference", "--save-debug-rollout-data", str(tmp_path / "plain_{rollout_id}")
    )
    dump = save_debug_rollout_data(args, samples, 0, evaluation=False)
    report = _replay(Path(str(dump)), run)
    problems = [(k, m) for k, m in _problems(report)[21] if k != "processor"]
    assert len(problems) == 1 and problems[0][0] == "logprob", problems
    assert problems[0][1].startswith("sample index 21 (position 0): the model refused the inputs")


def test_a_max_pixels_that_differs_from_the_engines_is_refused_by_the_token_check(run):
    dump = write_dump(run, "max_pixels", max_pixels=200 * 150)  # the engines ran the hub config's
    report = _replay(dump, run)
    problems = _problems(report)
    assert all(kinds and {k for k, _ in kinds} == {"token_count"} for kinds in problems.values()), problems
    assert all(f"sample index {i}" in problems[i][0][1] for i in problems)
    assert all(e["logprob_diff"] is None for e in report["samples"])


def test_placeholders_expanded_twice_are_refused_by_the_token_check(run):
    samples = _planted(run)
    tokens = samples[2].tokens
    first = tokens.index(PAD)
    count = tokens.count(PAD)
    samples[2].tokens = tokens[:first] + [PAD] * count + tokens[first:]
    report = _replay(write_dump(run, "twice", samples), run)
    ((kind, message),) = _problems(report)[22]
    assert kind == "token_count" and "sample index 22" in message and "expanded twice" in message


def test_the_fp16_path_where_bf16_was_recorded_is_over_the_threshold(run):
    """The engine scored in bf16 and the run trains in bf16: a bf16 replay agrees (a control),
    an fp16 one (the trainer's --fp16 by mistake) is flagged on every sample."""
    samples = _planted(run)
    for sample, logprobs in zip(samples, prefill_logprobs(run, "bf16"), strict=True):
        sample.rollout_log_probs = [v if m else 0.0 for v, m in zip(logprobs, sample.loss_mask, strict=True)]
    dump = write_dump(run, "bf16", samples, dtype="--bf16")
    control = _replay(dump, run)
    assert control["dtype"] == "bf16" and control["summary"]["problems"] == {}
    fp16 = _replay(dump, run, dtype="fp16")
    assert fp16["summary"]["problems"] == {"logprob": 4}
    for index, problems in _problems(fp16).items():
        assert (
            problems[0][1].startswith(f"sample index {index} ")
            and "over --max-logprob-diff" in problems[0][1]
        )


def _item(tokens: list[int], response: int):
    from trainer_hooks.replay._score import ScoreItem

    return ScoreItem(
        {"index": 0, "position": 0, "problems": []}, tokens, len(tokens) - response, None, [], None
    )


def test_batches_equal_one_sample_at_a_time(run, reference):
    from trainer_hooks.replay._score import batch_bytes

    together = replay_bundle(reference, model=str(run.model_dir))
    # A budget each sample fits alone (its pixels: at most 3 small screenshots, < 4 MiB) and no two do.
    dims = (64, 4, 151936, 4)  # helpers.reference_run's model, fp32
    items = [_item(s.tokens, s.response_length) for s in run.samples[:2]]  # limit=2
    budget = max(batch_bytes([i], *dims) for i in items) + (4 << 20)
    assert all(batch_bytes([a, b], *dims) > budget for a, b in itertools.pairwise(items))
    alone = replay_bundle(reference, model=str(run.model_dir), batch_bytes=budget, limit=2)
    for a, b in zip(alone["samples"], together["samples"], strict=False):
        assert a["logprob_diff"]["recomputed"] == pytest.approx(b["logprob_diff"]["recomputed"], abs=1e-5)
    assert len(alone["samples"]) == 2  # --limit with --model


def test_ray_replays_with_one_model_per_task(run, reference, ray_local):
    local = replay_bundle(reference, model=str(run.model_dir))
    remote = replay_bundle(reference, model=str(run.model_dir), use_ray=True, num_tasks=2)
    for a, b in zip(remote["samples"], local["samples"], strict=True):
        assert a["logprob_diff"]["recomputed"] == pytest.approx(b["logprob_diff"]["recomputed"], abs=1e-5)
    assert remote["summary"]["logprob"]["samples"] == 4


def test_another_family_and_bad_usage_are_refused_in_one_line(run, reference, tmp_path, capsys):
    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "config.json").write_text('{"model_type": "llava"}')
    assert main(["replay", str(reference), "--model", str(llava), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        "config.json model_type 'llava' is not a family replay can score (Qwen2.5-VL, Qwen3-VL, Qwen2-VL)"
        in err
    )
    assert len(err.splitlines()) == 1
    assert main(["replay", str(reference), "--max-logprob-diff", "0.1", "--no-progress"]) == 2
    assert "--max-logprob-diff needs --model or --engine" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", str(reference), "--model", str(run.model_dir), "--max-logprob-diff", "-1"])


def test_json_carries_the_mismatch_summary(run, reference, capsys):
    assert main(["replay", str(reference), "--model", str(run.model_dir), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)["logprob"]
    assert set(summary) == {"samples", "mean_abs", "tokens", "non_finite_tokens", "k3", "tis_cap",
                            "tis_clipped_tokens", "tis_clipped_fraction"}  # fmt: skip
    assert set(summary["mean_abs"]) == {"mean", "p50", "p99", "max"} and summary["tis_cap"] == 2.0


# ------------------------------------------------------------------ the figures, on numbers worked by hand


def test_a_samples_mismatch_by_turn_with_the_first_token_over_the_threshold():
    from trainer_hooks.replay._mismatch import sample_mismatch

    rollout = [-1.0, -2.0, 0.0, 0.0, -3.0, -4.0]
    trainer = [-1.0, -2.5, -9.0, -9.0, -3.0, -3.0]  # the observation (mask 0) is never compared
    diff = sample_mismatch(trainer, rollout, [11, 12, 13, 14, 15, 16], [1, 1, 0, 0, 1, 1], 0.4, tis_cap=2.0)
    assert diff["tokens"] == 4 and diff["mean_abs"] == pytest.approx(1.5 / 4) and diff["max_abs"] == 1.0
    assert diff["turns"] == [
        {"turn": 0, "start": 0, "tokens": 2, "mean_abs": 0.25, "max_abs": 0.5},
        {"turn": 1, "start": 4, "tokens": 2, "mean_abs": 0.5, "max_abs": 1.0},
    ]
    assert diff["first_over"] == {"offset": 1, "turn": 0, "token": 12, "abs": 0.5}
    # r = exp(trainer - rollout) per compared token: 1, e^-0.5, 1, e^1; k3 = mean of (r - 1) - log r.
    import math

    expected = [0.0, math.exp(-0.5) - 1 + 0.5, 0.0, math.e - 1 - 1]
    assert diff["k3"] == pytest.approx(sum(expected) / 4)
    assert diff["tis_clipped"] == 1  # e^1 > 2
    # No loss_mask: the whole response is one turn; no threshold: no first token over it.
    whole = sample_mismatch([-1.0, -1.0], [-1.0, -1.5], [1, 2], None, None)
    assert whole["turns"] == [{"turn": 0, "start": 0, "tokens": 2, "mean_abs": 0.25, "max_abs": 0.5}]
    assert whole["first_over"] is None


def test_the_bundles_mismatch_distribution():
    from trainer_hooks.replay._mismatch import mismatch_summary

    def entry(mean: float, tokens: int, k3: float, clipped: int) -> dict:
        return {"logprob_diff": {"mean_abs": mean, "max_abs": mean, "tokens": tokens, "k3": k3,
                                 "tis_clipped": clipped}}  # fmt: skip

    entries = [entry(float(i), 2, 0.1 * i, i % 2) for i in range(1, 102)] + [{"logprob_diff": None}]
    s = mismatch_summary(entries, 2.0)
    assert s["samples"] == 101 and s["tokens"] == 202
    assert s["mean_abs"] == {"mean": 51.0, "p50": 51.0, "p99": 100.0, "max": 101.0}
    assert s["k3"] == pytest.approx(0.1 * 51.0) and s["tis_clipped_tokens"] == 51
    assert s["tis_clipped_fraction"] == pytest.approx(51 / 202)
    assert mismatch_summary([{"logprob_diff": None}], 2.0) is None


def test_a_nan_log_prob_flags_its_token_and_the_report_stays_strict_json(tmp_path):
    """An fp16 overflow's NaN must not vanish from max (it did: max_abs 0.0, no first_over, k3 NaN)."""
    from trainer_hooks.replay._mismatch import mismatch_summary, sample_mismatch, threshold_problem
    from trainer_hooks.replay._report import write_report

    nan = float("nan")
    diff = sample_mismatch([-1.0, nan, -3.0], [-1.0, -2.0, -3.0], [7, 8, 9], None, None)
    assert diff["max_abs"] == float("inf") and diff["mean_abs"] == float("inf") and diff["non_finite"] == 1
    assert diff["first_over"] == {"offset": 1, "turn": 0, "token": 8, "abs": float("inf")}
    assert diff["k3"] == 0.0 and diff["recomputed"] == [-1.0, None, -3.0]
    problem = threshold_problem("sample index 3 (position 0)", diff, None)
    assert problem is not None and problem["message"] == (
        "sample index 3 (position 0): the trainer's log-prob of 1 response token(s) is not a finite number "
        "(NaN or inf: an overflow?); first: turn 0, response token 1 (id 8)"
    )
    clean = sample_mismatch([-1.0], [-1.0], [7], None, None)
    summary = mismatch_summary([{"logprob_diff": diff}, {"logprob_diff": clean}], 2.0)
    assert summary["mean_abs"]["max"] == float("inf") and summary["non_finite_tokens"] == 1
    assert summary["mean_abs"]["p50"] == float("inf")  # not NaN (inf - inf)
    write_report({"samples": [{"logprob_diff": diff}], "summary": {"logprob": summary}}, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text(), parse_constant=pytest.fail)
    assert doc["samples"][0]["logprob_diff"]["max_abs"] is None and doc["summary"]["logprob"]["k3"] == 0.0


def test_a_batch_is_costed_as_its_padded_shape_not_the_sum_of_its_samples():
    """One 3000-token sample and five of 300 (Qwen2-VL-2B's dimensions, bf16): each sample's own
    cost sums to under 1 GiB, but left-padded the batch is six rows of 3000 tokens, each keeping the
    longest response's logits: over 3 GiB. The scorer packs on the padded cost (it summed before)."""
    from trainer_hooks.replay._score import batch_bytes

    dims = (1536, 12, 151936, 2)
    items = [_item([1] * 3000, 20)] + [_item([1] * 300, 20) for _ in range(5)]
    own = sum(batch_bytes([i], *dims) for i in items)
    assert own < 1 << 30  # what the old estimate packed into a 1 GiB budget
    padded = batch_bytes(items, *dims)
    assert padded == 6 * (3000 * 1536 * 2 * 24 + 12 * 3000 * 3000 * 4 + 21 * 151936 * 8)
    assert padded > 3 << 30


def test_a_sample_too_long_over_the_budget_alone_or_off_the_vocabulary_is_refused_not_run(run):
    from trainer_hooks.replay._score import LogprobScorer, load_model

    model = load_model(str(run.model_dir), "cpu", torch.float32)
    scored, failed = [], []

    def scorer(budget: int) -> LogprobScorer:
        return LogprobScorer(
            model, "cpu", budget, lambda i, v: scored.append(i), lambda i, m: failed.append(m), PAD
        )

    long = _item([1] * 5000, 10)  # max_position_embeddings 4096
    scorer(1 << 40).add(long)
    big = _item([1] * 2000, 10)
    small = scorer(1 << 20)
    small.add(big)
    small.flush()
    scorer(1 << 40).add(_item([1, 2, 151936, 3], 2))  # vocab_size 151936
    scorer(1 << 40).add(_item([1, -1, 3], 1))
    broken = _item([1, 2, 3], 1)
    broken.inputs = {"pixel_values": torch.zeros(4, 1176)}  # no image_grid_thw: a KeyError in the scorer
    lone = scorer(1 << 40)
    lone.add(broken)
    lone.flush()
    assert scored == [] and failed == [
        "5000 tokens, over the model's max_position_embeddings 4096: not scored",
        "2000 tokens need an estimated 0.0835 GiB for one forward pass, over the budget of 0.000977 GiB "
        "(batch_bytes): not scored",
        "tokens[2] = 151936 is not a token id of the model (vocab_size 151936): not scored",
        "tokens[1] = -1 is not a token id of the model (vocab_size 151936): not scored",
        "the model refused the inputs: 'image_grid_thw'",
    ]


def test_a_model_that_cannot_load_or_a_missing_cuda_is_exit_2_in_one_line(run, reference, tmp_path, capsys):
    import shutil

    if not torch.cuda.is_available():  # this machine: CPU-only torch
        assert main(["replay", str(reference), "--model", str(run.model_dir), "--device", "cuda",
                     "--no-progress"]) == 2  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert (
            "--device cuda: this torch" in err and "sees no CUDA device" in err and len(err.splitlines()) == 1
        )
    corrupt = tmp_path / "corrupt"
    shutil.copytree(run.model_dir, corrupt)
    (weights,) = corrupt.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:1000])
    assert main(["replay", str(reference), "--model", str(corrupt), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--model {corrupt}: cannot load: " in err and len(err.splitlines()) == 1, err
