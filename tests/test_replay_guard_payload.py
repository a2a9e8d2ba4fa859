"""The conversion guard, prefill payloads (SGLang field names) and the token-space check.

None of this needs torch or a processor: the guard looks at which fields are filled, payloads
are plain JSON, and the token check counts placeholder runs against ``image_grid_thw`` rows.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from bundles import MediaRef
from trainer_hooks import (
    Sample,
    _build_prefill_scoring_payload,
    build_prefill_scoring_payload,
    check_image_tokens,
    convert_samples_to_train_data,
)
from trainer_hooks.replay import sglang_generate_fields

ROOT = Path(__file__).resolve().parents[1]
PAD = 151655


def write_png(path: Path, mode: str = "RGB", size: tuple[int, int] = (6, 4)) -> Path:
    from PIL import Image

    Image.new(mode, size, 7 if mode in ("L", "P") else (200, 10, 30, 128)[: len(mode)]).save(path)
    return path


def ref(tmp_path: Path, name: str) -> MediaRef:
    return MediaRef.from_file(write_png(tmp_path / f"{name}.png"))


def data_url_pixels(url: str) -> tuple[str, tuple[int, int], bytes]:
    """Mode, size and pixels of a ``data:image/png;base64,`` URL."""
    import base64
    import io

    from PIL import Image

    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    with Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :]))) as im:
        return im.mode, im.size, im.tobytes()


def sample(i: int, *, images=None, dense=None, tokens=None, response_length=3) -> Sample:
    tokens = tokens if tokens is not None else [1, 2, 3, 4, 5, 6]
    return Sample(
        group_index=0,
        index=i,
        tokens=tokens,
        multimodal_inputs={"images": images} if images is not None else None,
        multimodal_train_inputs=dense,
        response_length=response_length,
        reward=float(i),
        loss_mask=[1] * response_length,
        rollout_log_probs=[-0.1] * response_length,
        status=Sample.Status.COMPLETED,
    )


DENSE = {"pixel_values": np.zeros((4, 1176), np.float32), "image_grid_thw": np.array([[1, 2, 2]])}


# ---------------------------------------------------------------------------------------------- guard


def test_default_converter_output_keys_and_values(tmp_path):
    s = [sample(7, images=[ref(tmp_path, "a")]), sample(8), sample(9, dense=DENSE)]
    s[1].status = Sample.Status.TRUNCATED
    data = convert_samples_to_train_data(Namespace(enable_token_space_processor=True), s)
    assert data["tokens"] == [x.tokens for x in s]
    assert data["response_lengths"] == [3, 3, 3]
    assert data["rewards"] == data["raw_reward"] == [7.0, 8.0, 9.0]
    assert data["truncated"] == [0, 1, 0]
    assert data["sample_indices"] == [7, 8, 9]
    assert data["loss_masks"] == [[1, 1, 1]] * 3
    assert data["rollout_log_probs"] == [[-0.1] * 3] * 3
    # One entry per sample, None where a sample has none; only one kind per sample: no violation.
    assert data["multimodal_inputs"] == [s[0].multimodal_inputs, None, None]
    assert data["multimodal_train_inputs"] == [None, None, DENSE]


def test_guard_fires_for_the_default_converter_naming_the_first_index(tmp_path):
    s = [
        sample(7),
        sample(8, images=[ref(tmp_path, "a")], dense=DENSE),
        sample(9, images=[ref(tmp_path, "b")], dense=DENSE),
    ]
    with pytest.raises(ValueError, match=r"sample index 8 \(position 1\) carries both media references") as e:
        convert_samples_to_train_data(Namespace(enable_token_space_processor=True), s)
    assert "1 more sample" in str(e.value) and "pixel_values, image_grid_thw" in str(e.value)


def test_guard_fires_for_a_custom_converter(tmp_path):
    def custom(args, samples):
        return {
            "tokens": [x.tokens for x in samples],
            "sample_indices": [x.index for x in samples],
            "multimodal_inputs": [x.multimodal_inputs for x in samples],
            "multimodal_train_inputs": [DENSE for _ in samples],  # ships dense tensors for all
        }

    refs_only = [sample(3), sample(4, images=[ref(tmp_path, "a")])]
    with pytest.raises(ValueError, match=r"custom converter .*custom.*sample index 4 \(position 1\)"):
        convert_samples_to_train_data(Namespace(), refs_only, None, custom)
    # The same converter on text-only samples ships dense tensors only: allowed.
    out = convert_samples_to_train_data(Namespace(), [sample(3), sample(5)], None, custom)
    assert out["multimodal_train_inputs"] == [DENSE, DENSE]
    # Output the guard cannot read is refused naming the converter, not an AttributeError.
    with pytest.raises(
        ValueError, match=r"custom converter .*<lambda>\): expected a dict of per-sample lists, found list"
    ):
        convert_samples_to_train_data(Namespace(), refs_only, None, lambda args, s: list(s))
    with pytest.raises(ValueError, match=r"multimodal_inputs: expected one entry per sample, found dict"):
        convert_samples_to_train_data(Namespace(), refs_only, None, lambda args, s: {"multimodal_inputs": {}})


def test_guard_passes_with_references_only_and_dense_only(tmp_path):
    refs = convert_samples_to_train_data(
        Namespace(), [sample(1, images=[ref(tmp_path, "a")])], token_space=True
    )
    assert "multimodal_train_inputs" not in refs
    dense = convert_samples_to_train_data(Namespace(), [sample(1, dense=DENSE)])
    assert "multimodal_inputs" not in dense and dense["multimodal_train_inputs"] == [DENSE]


def test_converter_refuses_a_loss_mask_of_the_wrong_length_and_custom_rewards_apply():
    bad = sample(4)
    bad.loss_mask = [1]
    with pytest.raises(
        ValueError,
        match=r"sample index 4 \(position 0\): loss_mask has 1 entries, expected response_length = 3",
    ):
        convert_samples_to_train_data(Namespace(), [bad])
    out = convert_samples_to_train_data(
        Namespace(), [sample(1), sample(2)], None, None, lambda args, s: ([5, 6], [0.5, -0.5])
    )
    assert out["raw_reward"] == [5, 6] and out["rewards"] == [0.5, -0.5]


def test_grpo_rewards_are_normalised_per_group():
    args = Namespace(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=False)
    s = [sample(1), sample(3), sample(10)]
    s[2].group_index = 1
    out = convert_samples_to_train_data(args, s)
    assert out["raw_reward"] == [1.0, 3.0, 10.0]
    assert out["rewards"] == [-1.0, 1.0, 0.0]


# -------------------------------------------------------------------------------------------- payload


def test_payload_fields_for_media_and_text_samples_in_token_space(tmp_path):
    pytest.importorskip("PIL", reason="image payloads need Pillow")
    args = Namespace(enable_token_space_processor=True)
    images = [ref(tmp_path, "a"), str(write_png(tmp_path / "b.png", "L"))]
    media = sample(1, images=images, tokens=[1, PAD, PAD, 2, 3, 4, 5])
    payload = build_prefill_scoring_payload(args, media, {"top_p": 1.0})
    assert payload["input_ids"] == media.tokens
    assert payload["sampling_params"] == {
        "top_p": 1.0, "max_new_tokens": 0, "temperature": 0, "skip_special_tokens": False,
    }  # fmt: skip
    assert payload["return_logprob"] is True
    assert payload["logprob_start_len"] == 7 - 3 - 1
    # Images as Miles sends them: RGB PNG data URLs a remote engine can read, never local paths.
    (mode_a, size_a, _), (mode_b, size_b, pixels_b) = map(data_url_pixels, payload["image_data"])
    assert (mode_a, size_a, mode_b, size_b) == ("RGB", (6, 4), "RGB", (6, 4))
    assert pixels_b == bytes([7, 7, 7]) * 24  # L converted to RGB
    assert payload["mm_token_expansion_start_len"] == len(media.tokens)

    text = build_prefill_scoring_payload(args, sample(2), {})
    assert "image_data" not in text and "mm_token_expansion_start_len" not in text
    # Outside token space the engine expands placeholders itself: no expanded-prefix field.
    plain = build_prefill_scoring_payload(Namespace(), media, {})
    assert "mm_token_expansion_start_len" not in plain and plain["image_data"]
    assert _build_prefill_scoring_payload is build_prefill_scoring_payload
    json.dumps(payload)  # the request body is JSON

    stock = sglang_generate_fields(token_space=False)
    for p in (payload, text, plain):
        assert set(p) <= sglang_generate_fields(), set(p) - sglang_generate_fields()
        assert set(p) - stock <= {"mm_token_expansion_start_len"}


def test_payload_lora_path_as_miles_names_adapters():
    from trainer_hooks import AdapterRef

    s = sample(1)
    assert "lora_path" not in build_prefill_scoring_payload(Namespace(), s, {})
    assert build_prefill_scoring_payload(Namespace(lora_rank=8), s, {})["lora_path"] == "miles_lora"
    assert "lora_path" not in build_prefill_scoring_payload(
        Namespace(lora_rank=8, lora_train_only=True), s, {}
    )
    s.adapter = AdapterRef(name="math", slot=3)
    assert build_prefill_scoring_payload(Namespace(), s, {})["lora_path"] == "__miles_slot_3"


def test_payload_refuses_a_sample_without_prompt_tokens():
    with pytest.raises(ValueError, match=r"sample index 5: .*len\(tokens\) = 3 and response_length = 3"):
        build_prefill_scoring_payload(Namespace(), sample(5, tokens=[1, 2, 3]), {})


def test_shipped_sglang_field_list_is_what_the_script_generates():
    doc = json.loads((ROOT / "trainer_hooks" / "data" / "sglang_generate_req_input_fields.json").read_text())
    assert doc["sglang"] == "0.5.23" and doc["class"] == "GenerateReqInput"
    assert doc["token_space_additions"] == ["mm_token_expansion_start_len"]
    # Stock 0.5.23 lacks the token-space field; the names Miles' payload uses are all there.
    assert "mm_token_expansion_start_len" not in doc["fields"]
    for name in ("input_ids", "image_data", "return_logprob", "logprob_start_len", "sampling_params",
                 "top_logprobs_num", "lora_path", "rid", "text"):  # fmt: skip
        assert name in doc["fields"]
    # The script's parser, on source shaped like io_struct.py (a dataclass with a local base).
    spec = importlib.util.spec_from_file_location("sglang_fields", ROOT / "scripts" / "sglang_fields.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = (
        "from typing import ClassVar, Optional\n"
        "class Base:\n    rid: Optional[str] = None\n"
        "@dataclass\nclass GenerateReqInput(Base):\n"
        "    text: Optional[str] = None\n    KIND: ClassVar[str] = 'x'\n"
        "    input_ids: list = None\n    def normalize(self):\n        local: int = 1\n"
    )
    assert mod.class_fields(ast.parse(src), "GenerateReqInput") == ["rid", "text", "input_ids"]


# -------------------------------------------------------------------------------------- token check


def test_token_check_accepts_exact_counts_and_names_mismatches():
    grid = [[1, 4, 6], [1, 2, 2]]  # 6 and 1 placeholders with merge_size 2
    tokens = [1, *[PAD] * 6, 2, PAD, 3]
    expected, found, problems = check_image_tokens(tokens, grid, sample_index=4)
    assert (expected, found, problems) == ([6, 1], [6, 1], [])

    short = [1, *[PAD] * 5, 2, PAD, 3]
    _, found, problems = check_image_tokens(short, grid, sample_index=4)
    assert found == [5, 1]
    assert [p["image"] for p in problems] == [0]
    assert problems[0]["message"] == (
        "sample index 4, image 0: expected 6 placeholder tokens (id 151655) from image_grid_thw, found 5"
    )


def test_token_check_says_expanded_twice():
    grid = np.array([[1, 4, 6], [1, 2, 4]])
    doubled = [1, *[PAD] * 12, 2, *[PAD] * 4, 3]
    _, _, problems = check_image_tokens(doubled, grid, sample_index=9, image_token_id=PAD)
    assert [p["image"] for p in problems] == [0, 1]
    assert all(p["message"].endswith("(expanded twice)") for p in problems)
    assert (
        "image 1: expected 2 placeholder tokens (id 151655) from image_grid_thw, found 4"
        in problems[1]["message"]
    )
    # Runs that can't be matched to images: the totals, for the sample as a whole.
    split = [1, *[PAD] * 6, 2, *[PAD] * 6, 3, *[PAD] * 2, 4, *[PAD] * 2]
    _, found, problems = check_image_tokens(split, grid, sample_index=9)
    assert found == [None, None] and len(problems) == 1 and problems[0]["image"] is None
    assert (
        "expect 8 placeholder tokens" in problems[0]["message"]
        and "found 16 in 4 run(s) (expanded twice)" in problems[0]["message"]
    )
    # Another placeholder id (recorded settings): nothing found for the default id.
    _, found, problems = check_image_tokens(
        [1, 7, 7, 7, 7, 7, 7, 2, 7, 7], [[1, 4, 6], [1, 2, 4]], image_token_id=7
    )
    assert found == [6, 2] and problems == []


# ------------------------------------------------------------------------- what a bundle records


def test_dumps_record_the_processor_settings_and_dtype_replay_needs(tmp_path):
    from helpers import trainer_args

    from bundles import open_bundle
    from trainer_hooks import save_debug_rollout_data

    model = tmp_path / "Qwen2-VL-7B-Instruct"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "image_token_id": 151655}))
    args = trainer_args(
        tmp_path, "run-a", "--fp16", "--enable-token-space-processor",
        "--sglang-model-path", str(model), "--sglang-image-processor-backend", "pil",
        "--sglang-mm-process-config", '{"image": {"max_pixels": 1003520, "min_pixels": 3136}}',
        "--save-debug-rollout-data", str(tmp_path / "dump_{rollout_id}"),
    )  # fmt: skip
    path = save_debug_rollout_data(args, [sample(1)], 0, evaluation=False)
    meta = open_bundle(path).meta
    assert meta["training_dtype"] == "fp16"
    assert meta["processor"]["model_path"] == str(model)
    assert meta["processor"]["image_processor_backend"] == "pil"
    assert meta["processor"]["mm_process_config"] == {"image": {"max_pixels": 1003520, "min_pixels": 3136}}
    assert meta["processor"]["image_token_id"] == 151655


def test_replay_modules_import_one_way():
    """Issue 17 item 5: planning, running (local, Ray), fingerprinting/comparing and report I/O
    each in its own module, and no module of trainer_hooks.replay imports one that imports it
    back, at module level or inside a function."""
    pkg = ROOT / "trainer_hooks" / "replay"
    graph: dict[str, set[str]] = {}
    for path in pkg.glob("*.py"):
        name = path.stem
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainer_hooks.replay."):
                deps.add(node.module.rsplit(".", 1)[1])
        graph[name] = deps - {name}

    def reaches(a: str, b: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(d == b or (d not in seen and reaches(d, b, seen | {d})) for d in graph.get(a, ()))

    cycles = sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))
    assert cycles == [], cycles
    # The layers, lowest first: each imports only modules to its left.
    order = ["_report", "_plan", "_run", "_ray", "_replay"]
    for i, name in enumerate(order):
        assert graph[name] & set(order) <= set(order[:i]), (name, graph[name])
    assert "_report" not in graph["_fingerprint"] or graph["_fingerprint"] & set(order) == {"_report"}
    assert max(len((pkg / f"{n}.py").read_text().splitlines()) for n in order) < 400
