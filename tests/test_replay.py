"""Replay with the real Qwen2-VL image processor (offline): processor settings, the rebuild with
cast, ``rollout-bundle replay`` (exit codes, report, payloads, ``--expect``) and Ray replay."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from helpers import noise_png  # noqa: E402
from helpers.replay import PAD, make_dump  # noqa: E402

from bundles import pack_bundle, write_bundle  # noqa: E402
from trainer_hooks import (  # noqa: E402
    Sample,
    compute_multimodal_train_inputs,
    get_rollout_data,
    load_processor,
    replay_bundle,
    training_dtype,
)
from trainer_hooks.cli import main  # noqa: E402
from trainer_hooks.replay import sglang_generate_fields  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.processor]


def tokens_1080p(proc, size=(1920, 1080)) -> int:
    out = proc(images=[Image.new("RGB", size, (40, 80, 120))], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    return t * h * w // 4


# ------------------------------------------------------------------------------------------ processor


def test_shipped_hub_config_not_class_defaults():
    proc = load_processor(None)
    s = proc.settings
    assert (s["min_pixels"], s["max_pixels"], s["patch_size"], s["temporal_patch_size"], s["merge_size"]) == (
        3136, 12845056, 14, 2, 2,
    )  # fmt: skip
    assert s["image_mean"] == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    assert s["image_std"] == pytest.approx([0.26862954, 0.26130258, 0.27577711])
    assert s["image_token_id"] == PAD and proc.disagreements == []
    assert tokens_1080p(proc) == 2691
    # What the class defaults would have made of the same screenshot.
    from trainer_hooks.replay._processor import _processor_class

    cls, _ = _processor_class()
    assert tokens_1080p(cls()) == 1222


def test_recorded_settings_apply_and_disagreements_are_reported():
    proc = load_processor(
        {
            "model_path": "Qwen/Qwen2-VL-7B-Instruct",
            "image_processor_backend": "torchvision",
            "mm_process_config": {
                "image": {"max_pixels": 1003520, "do_pan_and_scan": True},
                "video": {"fps": 2},
            },
        }
    )
    assert proc.settings["max_pixels"] == 1003520 and tokens_1080p(proc) == 1222
    text = "\n".join(proc.disagreements)
    assert "mm_process_config.image.do_pan_and_scan = True: not a setting" in text
    assert "image_processor_backend: recorded 'torchvision', built the 'pil' backend" in text
    assert len(proc.disagreements) == 2
    assert any("no local model directory" in n for n in proc.notes)
    assert any("mm_process_config.video" in n for n in proc.notes)


def test_local_model_directory_wins_over_the_shipped_config(tmp_path):
    from trainer_hooks.replay._processor import shipped_preprocessor_config

    model = tmp_path / "model"
    model.mkdir()
    config = {**shipped_preprocessor_config(), "max_pixels": 200704}
    (model / "preprocessor_config.json").write_text(json.dumps(config))
    (model / "config.json").write_text(json.dumps({"image_token_id": 42}))
    proc = load_processor(
        {"model_path": str(model), "image_processor_backend": "pil", "mm_process_config": None}
    )
    assert proc.settings["source"] == str(model / "preprocessor_config.json")
    assert proc.settings["max_pixels"] == 200704 and proc.image_token_id == 42
    assert proc.settings["image_token_id_source"] == "model config.json"
    assert proc.disagreements == [] and proc.notes == []


# -------------------------------------------------------------------------------------------- rebuild


def image_samples(tmp_path: Path) -> list[Sample]:
    paths = []
    for j, (w, h) in enumerate([(112, 84), (140, 56)]):
        p = tmp_path / f"{j}.png"
        p.write_bytes(noise_png(w, h, seed=j))
        paths.append(str(p))
    from bundles import MediaRef

    pil = Image.open(paths[1]).convert("RGB")
    return [
        Sample(index=0, multimodal_inputs={"images": [MediaRef.from_file(paths[0]), paths[1]]}),
        Sample(index=1, tokens=[1, 2]),  # text only
        Sample(index=2, multimodal_inputs={"images": [pil]}),
    ]


def test_rebuild_casts_floating_tensors_only(tmp_path):
    samples = image_samples(tmp_path)
    proc = load_processor(None)
    fp32 = compute_multimodal_train_inputs(samples, proc, torch.float32)
    assert fp32[1] is None
    direct = proc(
        images=[Image.open(tmp_path / "0.png").convert("RGB"), Image.open(tmp_path / "1.png").convert("RGB")],
        return_tensors="pt",
    )
    assert set(fp32[0]) == {"pixel_values", "image_grid_thw"}
    assert fp32[0]["pixel_values"].dtype == torch.float32
    assert torch.equal(fp32[0]["pixel_values"], direct["pixel_values"])  # fp32: untouched
    assert torch.equal(fp32[0]["image_grid_thw"], direct["image_grid_thw"])
    for dtype in (torch.bfloat16, torch.float16):
        seen: list[tuple[int, int]] = []

        def record(position, cast, fp32_bytes, seen=seen):
            seen.append((position, fp32_bytes))

        cast = compute_multimodal_train_inputs(samples, proc, dtype, on_sample=record)
        for i in (0, 2):
            assert cast[i]["pixel_values"].dtype == dtype
            assert torch.equal(cast[i]["pixel_values"], fp32[i]["pixel_values"].to(dtype))
            assert cast[i]["image_grid_thw"].dtype == torch.int64
            assert torch.equal(cast[i]["image_grid_thw"], fp32[i]["image_grid_thw"])
        assert (
            seen[1] == (1, 0)
            and seen[0][1] == fp32[0]["pixel_values"].nbytes + fp32[0]["image_grid_thw"].nbytes
        )


def test_training_dtype_and_get_rollout_data(tmp_path):
    assert training_dtype(Namespace(bf16=True)) is torch.bfloat16
    assert training_dtype(Namespace(fp16=True)) is torch.float16
    assert training_dtype(Namespace()) is torch.float32
    samples = image_samples(tmp_path)
    for s in samples:
        s.status, s.response_length, s.loss_mask, s.reward = Sample.Status.COMPLETED, 0, [], 0.0
    data = get_rollout_data(Namespace(fp16=True), samples, load_processor(None))
    mti = data["multimodal_train_inputs"]
    assert mti[1] is None and mti[0]["pixel_values"].dtype == torch.float16
    assert data["sample_indices"] == [0, 1, 2]
    # A sample that shipped dense tensors and no references (allowed) keeps them beside rebuilt ones.
    dense = {"pixel_values": torch.ones(4, 1176), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    samples[1].multimodal_train_inputs = dense
    mti = get_rollout_data(Namespace(bf16=True), samples, load_processor(None))["multimodal_train_inputs"]
    assert mti[1] is dense and mti[0]["pixel_values"].dtype == mti[2]["pixel_values"].dtype == torch.bfloat16
    samples[1].multimodal_train_inputs = None
    samples[0].multimodal_train_inputs = {"pixel_values": torch.zeros(1, 1176)}
    with pytest.raises(ValueError, match=r"sample index 0 \(position 0\) carries both"):
        get_rollout_data(Namespace(bf16=True), samples, load_processor(None))


# ---------------------------------------------------------------------------------------------- CLI


def run_cli(*argv: str) -> int:
    return main(["replay", *argv])


def test_clean_dump_replays_with_exit_0_report_and_payloads(tmp_path, capsys):
    dump = make_dump(tmp_path, 3, text_only=(2,))
    report_path, payloads_path = tmp_path / "r.json", tmp_path / "p.jsonl"
    assert run_cli(str(dump), "--report", str(report_path), "--payloads-out", str(payloads_path)) == 0
    out = capsys.readouterr().out
    assert "problems       none" in out and "samples        3" in out
    report = json.loads(report_path.read_text())
    assert report["format"] == "rollout-bundle-replay" and report["version"] == 1
    assert report["dtype"] == "bf16" and report["bundle"] == str(dump)
    s = report["summary"]
    assert (s["samples"], s["images"], s["problems"]) == (3, 4, {})
    grid_bytes = 4 * 3 * 8  # image_grid_thw: 4 images x (t, h, w) int64, never cast
    assert s["bytes_after_cast"] - grid_bytes == (s["bytes_before_cast"] - grid_bytes) // 2
    first = report["samples"][0]
    assert (first["position"], first["index"], first["group_index"], first["logprob_diff"]) == (
        0,
        10,
        0,
        None,
    )
    img = first["images"][0]
    assert img["vision_tokens"] == img["placeholder_tokens"] == 12
    assert img["pixel_values"]["dtype"] == "bfloat16" and img["pixel_values"]["shape"] == [48, 1176]
    assert img["image_grid_thw"]["values"] == [[1, 6, 8]] and img["image_grid_thw"]["dtype"] == "int64"
    assert len(img["pixel_values"]["sha256"]) == 64
    assert s["vision_tokens"] == sum(i["vision_tokens"] for e in report["samples"] for i in e["images"])
    payloads = [json.loads(line) for line in payloads_path.read_text().splitlines()]
    assert len(payloads) == 3
    for p, e in zip(payloads, report["samples"], strict=True):
        assert set(p) <= sglang_generate_fields()
        assert ("mm_token_expansion_start_len" in p) == bool(e["images"])
        if e["images"]:
            assert p["mm_token_expansion_start_len"] == len(p["input_ids"])
    # --json: the summary only; --dtype overrides the recorded one.
    assert run_cli(str(dump), "--json", "--dtype", "fp32", "--limit", "1") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dtype"] == "fp32" and summary["samples"] == 1
    assert summary["bytes_before_cast"] == summary["bytes_after_cast"] > 0


def test_progress_line_counts_samples_only_when_asked(tmp_path, capsys):
    dump = make_dump(tmp_path, 3)
    assert run_cli(str(dump), "--progress", "--json") == 0
    err = capsys.readouterr().err
    assert err.startswith("\rreplay [") and "100.0% 3/3 samples" in err and err.endswith("\n")
    assert run_cli(str(dump), "--json") == 0  # captured stderr is no terminal: no line by default
    assert capsys.readouterr().err == ""


def test_guard_violation_and_double_expansion_exit_1(tmp_path, capsys):
    dump = make_dump(tmp_path, 3, dense=(1,), expanded_twice=(2,))
    assert run_cli(str(dump), "--report", str(tmp_path / "r.json")) == 1
    out = capsys.readouterr().out
    assert "problems       guard 1, token_count 2" in out
    assert "[guard] sample index 11 (position 1) carries both" in out
    assert (
        "sample index 12, image 0: expected 12 placeholder tokens (id 151655) from image_grid_thw, found 24 (expanded twice)"
        in out
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert [[p["kind"] for p in e["problems"]] for e in report["samples"]] == [
        [],
        ["guard"],
        ["token_count"] * 2,
    ]


def test_expect_catches_a_changed_max_pixels(tmp_path, capsys):
    dump = make_dump(tmp_path, 2)
    before = tmp_path / "before.json"
    assert run_cli(str(dump), "--report", str(before)) == 0
    assert run_cli(str(dump), "--expect", str(before)) == 0  # same machine, same settings: identical
    capsys.readouterr()
    after = tmp_path / "after.json"
    code = run_cli(
        str(dump), "--expect", str(before), "--report", str(after),
        "--mm-process-config", '{"image": {"max_pixels": 3200, "min_pixels": 3136}}',
    )  # fmt: skip
    assert code == 1
    out = capsys.readouterr().out
    report = json.loads(after.read_text())
    changed = report["expect"]["changed"]
    named = {(c["position"], c["image"]) for c in changed if c["image"] is not None}
    assert named == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert "sample index 10, image 0: rebuilt tensors changed: pixel_values.shape [48, 1176] ->" in out
    assert "image_grid_thw [[1, 6, 8]] -> [[1, " in out
    assert any("max_pixels 12845056 -> 3200" in c["message"] for c in changed)
    assert report["summary"]["problems"]["fingerprint"] == 5


def test_bad_usage_exits_2(tmp_path, capsys):
    dump = make_dump(tmp_path, 1)
    capsys.readouterr()
    # --limit 0 is refused in one line (it used to mean "every sample" in one command, "none" in another).
    assert run_cli(str(dump), "--limit", "0") == 2
    assert capsys.readouterr().err == (
        "rollout-bundle replay: error: --limit must be at least 1; omit it for every sample\n"
    )
    not_a_report = tmp_path / "x.json"
    not_a_report.write_text('{"samples": []}')
    assert run_cli(str(dump), "--expect", str(not_a_report)) == 2
    assert "expected a replay report" in capsys.readouterr().err
    not_a_report.write_text(
        json.dumps({"format": "rollout-bundle-replay", "version": 1, "samples": [{"images": []}]})
    )
    assert run_cli(str(dump), "--expect", str(not_a_report)) == 2  # checked before the replay runs
    assert f"{not_a_report}: samples[0].position: expected an int" in capsys.readouterr().err
    # Outputs that could not be written are refused before the replay runs, naming the flag.
    assert run_cli(str(dump), "--report", str(tmp_path / "no-dir" / "r.json")) == 2
    assert f"--report {tmp_path / 'no-dir' / 'r.json'}: directory {tmp_path / 'no-dir'} does not exist" in (
        capsys.readouterr().err
    )
    assert run_cli(str(dump), "--payloads-out", str(tmp_path)) == 2
    assert f"--payloads-out {tmp_path}: is a directory" in capsys.readouterr().err
    # No bundle (BUNDLE is optional to argparse only so that `--ray BUNDLE` works): still required.
    assert run_cli("--ray", "auto") == 2
    assert (
        capsys.readouterr().err
        == "rollout-bundle replay: error: the following arguments are required: BUNDLE\n"
    )
    # A path that is no bundle: an error naming it, exit 1.
    assert run_cli(str(tmp_path / "nothing")) == 1


@pytest.mark.parametrize(
    "processor, message",
    [
        ({"mm_process_config": "x{"}, "meta.processor.mm_process_config: expected a JSON object, found 'x{'"),
        ({"image_token_id": [1]}, "meta.processor.image_token_id: expected a token id (int >= 0) or null"),
    ],
)
def test_bad_recorded_processor_settings_are_the_bundles_error(tmp_path, capsys, processor, message):
    """Exit 1 naming the bundle and key path (not 2, which is for bad flags; not a TypeError)."""
    bundle = write_bundle(
        tmp_path / "b", [{"tokens": [1, 2, 3], "response_length": 1, "status": "completed"}],
        kind="debug_dump", meta={"processor": processor, "training_dtype": "bf16"},
    )  # fmt: skip
    assert run_cli(str(bundle)) == 1
    err = capsys.readouterr().err
    assert err.startswith("rollout-bundle replay: error: ") and f"{bundle}: {message}" in err
    assert err.count("\n") == 1


def test_an_image_over_pillows_bomb_limit_is_a_rebuild_violation(tmp_path, capsys):
    """A hostile bundle: a PNG header claiming 30000x30000 pixels (Pillow refuses it on open with
    DecompressionBombError, which is no OSError) is a ``rebuild`` problem naming it, exit 1."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "bomb.png").write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )
    sample = {"tokens": [1, 2, 3], "response_length": 1, "status": "completed",
              "multimodal_inputs": {"images": [str(run / "bomb.png")]}}  # fmt: skip
    bundle = write_bundle(
        tmp_path / "b", [sample], media_roots=[run], kind="debug_dump", meta={"processor": None}
    )
    assert run_cli(str(bundle)) == 1
    out = capsys.readouterr().out
    assert "[rebuild] sample index None (position 0): multimodal_inputs.images[0]" in out
    assert "cannot decode as PNG: Image size (900000000 pixels) exceeds limit" in out


def test_multimodal_inputs_of_the_wrong_shape_are_named_not_a_traceback(tmp_path, capsys):
    base = {"index": 7, "tokens": [1, 2, 3], "response_length": 1, "status": "completed"}
    samples = [
        {**base, "multimodal_inputs": ["a.png"]},
        {**base, "index": 8, "multimodal_inputs": {"images": "a.png"}},
    ]
    bundle = write_bundle(tmp_path / "b", samples, kind="debug_dump", meta={"processor": None})
    assert run_cli(str(bundle), "--no-progress") == 1
    out = capsys.readouterr().out
    assert "[rebuild] sample index 7 (position 0): multimodal_inputs: expected an object" in out
    assert (
        "[rebuild] sample index 8 (position 1): multimodal_inputs.images: expected a list, found str" in out
    )
    assert (
        "[payload] prefill scoring payload: sample index 8: multimodal_inputs.images: expected a list" in out
    )


def test_packed_bundle_replays_the_same(tmp_path):
    dump = make_dump(tmp_path, 2)
    packed = pack_bundle(dump, tmp_path / "dump.rbundle")
    a, b = replay_bundle(dump), replay_bundle(packed)
    assert a["samples"] == b["samples"]


# ---------------------------------------------------------------------------------------------- Ray


@pytest.mark.ray
def test_ray_replay_equals_local_replay(tmp_path, ray_local, capsys):
    dump = make_dump(tmp_path, 5, dense=(1,), text_only=(3,))
    local = replay_bundle(dump, payloads_out=tmp_path / "local.jsonl")
    seen: list[tuple[int, int]] = []
    remote = replay_bundle(
        dump, use_ray=True, num_tasks=2, payloads_out=tmp_path / "ray.jsonl",
        progress=lambda done, total: seen.append((done, total)),
    )  # fmt: skip
    assert sorted(seen) == [(2, 5), (5, 5)] or sorted(seen) == [(3, 5), (5, 5)]  # shards of 3 and 2
    assert remote["samples"] == local["samples"]  # fingerprints included
    drop = lambda s: {k: v for k, v in s.items() if k != "peak_rss_bytes"}  # noqa: E731
    assert drop(remote["summary"]) == drop(local["summary"])
    assert remote["summary"]["problems"] == {"guard": 1}
    assert (tmp_path / "ray.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()
    # `replay --ray BUNDLE` (no address): the bundle path is not taken for a Ray address.
    assert main(["replay", "--ray", str(dump), "--json", "--no-progress"]) == 1  # the guard violation
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] == 5 and summary["problems"] == {"guard": 1}


def sglang_answer(payload: dict, logprobs: list[float], *, shift: int = 0) -> dict:
    """The shape of SGLang's /generate answer to a prefill payload (no server runs here: it needs a
    GPU): ``input_token_logprobs`` from ``logprob_start_len`` on, ``[logprob, token_id, text]``,
    the first logprob None, then the response tail's scores."""
    ids = payload["input_ids"][payload["logprob_start_len"] :]
    n = len(logprobs)
    items = [[None if i == 0 else -1.0, t + shift, None] for i, t in enumerate(ids)]
    for k in range(n):
        items[len(items) - n + k][0] = logprobs[k]
    return {
        "text": "",
        "meta_info": {"input_token_logprobs": items, "prompt_tokens": len(payload["input_ids"])},
    }


def test_answers_fill_logprob_diff_and_misaligned_answers_fail(tmp_path, capsys):
    dump = make_dump(tmp_path, 2, text_only=(1,))
    payloads_path = tmp_path / "p.jsonl"
    assert run_cli(str(dump), "--payloads-out", str(payloads_path)) == 0
    payloads = [json.loads(line) for line in payloads_path.read_text().splitlines()]
    rollout = [-0.25] * 4  # what make_dump recorded for each response token
    answers = [sglang_answer(payloads[0], [v + 0.01 for v in rollout]), sglang_answer(payloads[1], rollout)]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(a) + "\n" for a in answers))
    report_path = tmp_path / "r.json"
    assert run_cli(str(dump), "--answers", str(path), "--report", str(report_path)) == 0
    diffs = [e["logprob_diff"] for e in json.loads(report_path.read_text())["samples"]]
    assert diffs[0]["tokens"] == 4 and diffs[0]["max_abs"] == pytest.approx(0.01)
    assert diffs[0]["mean_abs"] == pytest.approx(0.01) and diffs[1] == {
        "max_abs": 0.0,
        "mean_abs": 0.0,
        "tokens": 4,
        "recomputed": rollout,
    }
    assert diffs[0]["recomputed"] == pytest.approx([v + 0.01 for v in rollout])
    # The view draws the per-token difference strip from it (only for the sample that differs
    # it is not all zero; both carry the strip).
    from trainer_hooks.view import write_html_report

    html = write_html_report(dump, tmp_path / "view.html", replay=report_path).path.read_text()
    assert html.count("per-token |difference| between recorded and recomputed log-probs") == 2
    # An answer scoring other tokens (e.g. a different tokenisation) is a violation.
    path.write_text(
        json.dumps(answers[0]) + "\n" + json.dumps(sglang_answer(payloads[1], rollout, shift=1)) + "\n"
    )
    capsys.readouterr()
    assert run_cli(str(dump), "--answers", str(path)) == 1
    assert (
        "[logprob] sample index 11: the answer's last 4 input_token_logprobs score tokens"
        in capsys.readouterr().out
    )
    # One answer for two payloads: bad usage.
    path.write_text(json.dumps(answers[0]) + "\n")
    assert run_cli(str(dump), "--answers", str(path)) == 2
    assert "expected one engine answer per payload (2" in capsys.readouterr().err
    # Answers of another shape are violations naming the entry, not TypeError/IndexError tracebacks.
    odd = [
        {"meta_info": {"input_token_logprobs": [1, 2, 3, 4, 5]}},
        {"meta_info": {"input_token_logprobs": [[[0.5], t, None] for t in payloads[1]["input_ids"]]}},
    ]
    path.write_text("".join(json.dumps(a) + "\n" for a in odd))
    assert run_cli(str(dump), "--answers", str(path)) == 1
    out = capsys.readouterr().out
    assert "input_token_logprobs[1]: expected [logprob, token_id, text], found 2" in out
    assert "a log-prob that is no number: [0.5]" in out


def test_pil_images_in_a_dump_replay_and_payloads_carry_them_as_data_urls(tmp_path):
    import io as _io

    from helpers import trainer_args

    from trainer_hooks import save_debug_rollout_data

    args = trainer_args(
        tmp_path, "run-pil", "--fp16", "--save-debug-rollout-data", str(tmp_path / "d_{rollout_id}")
    )
    image = Image.open(_io.BytesIO(noise_png(112, 84, seed=5))).convert("RGB")
    s = Sample(
        index=3, tokens=[1, 2, 3, 4], response_length=1, loss_mask=[1], reward=0.0,
        multimodal_inputs={"images": [image]}, status=Sample.Status.COMPLETED,
    )  # fmt: skip
    dump = save_debug_rollout_data(args, [s], 0, evaluation=False)
    payloads = tmp_path / "p.jsonl"
    report = replay_bundle(dump, payloads_out=payloads)
    # No token space: no processor recorded, which the report names (never "problems: none").
    assert report["dtype"] == "fp16" and report["summary"]["problems"] == {"processor": 1}
    img = report["samples"][0]["images"][0]
    assert img["pixel_values"]["dtype"] == "float16" and img["image_grid_thw"]["values"] == [[1, 6, 8]]
    (url,) = json.loads(payloads.read_text())["image_data"]
    import base64

    head = "data:image/png;base64,"
    assert url.startswith(head)
    with Image.open(_io.BytesIO(base64.b64decode(url[len(head) :]))) as sent:
        assert sent.mode == "RGB" and sent.tobytes() == image.tobytes()


def test_a_checkpoint_replays_its_completed_groups_not_the_pending_ones(tmp_path, capsys):
    from helpers import dump_args
    from helpers.replay import make_samples

    from trainer_hooks import save_rollout_checkpoint, store_media

    args = dump_args(tmp_path, "ckpt")
    # An in-flight group: a prompt with its screenshot and no generation yet (no tokens at all).
    pending = [
        Sample(group_index=9, index=90 + i, prompt="p", status=Sample.Status.PENDING,
               multimodal_inputs={"images": [store_media(args, noise_png(56, 56, seed=i), ".png")]})
        for i in range(2)
    ]  # fmt: skip
    path = save_rollout_checkpoint(args, 1, [pending], [make_samples(args, 2)])
    report_path = tmp_path / "r.json"
    assert run_cli(str(path), "--report", str(report_path)) == 0
    assert "samples        2 (after 2 pending sample(s) of in-flight groups" in capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert report["kind"] == "rollout_checkpoint" and report["skipped_pending"] == 2
    assert [e["position"] for e in report["samples"]] == [2, 3]
    assert [e["index"] for e in report["samples"]] == [10, 11]
    assert run_cli(str(path), "--limit", "1", "--json") == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 1
