"""A real reference run for ``replay --model``, on CPU, offline: a small Qwen2-VL with random
weights saved with ``save_pretrained``, screenshots, and a rollout whose response tokens and
``rollout_log_probs`` that model produced through the real processor, written as a debug dump.

The screenshots are crops of the project's own serve screenshots (``docs/img/*.png``: real pages,
text and tables), small so that a forward pass stays near 0.1 s. The model: hidden size 64, two
layers, a two-layer vision tower (~20 M parameters, the Qwen2-VL vocabulary and token ids), its
weights drawn from a fixed seed with a wider init than the default so that an image changes the
response's log-probs (a swapped screenshot moves them by ~1). Generation samples with KV caching,
as an engine does; the log-probs recorded are those of the sampling distribution (temperature 1).
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.args import trainer_args
from trainer_hooks import Sample, load_processor, save_debug_rollout_data, store_media

ROOT = Path(__file__).resolve().parents[2]
PAD, VISION_START, VISION_END = 151655, 151652, 151653
PROMPT = [151644, 872, 198]  # <|im_start|>user\n
PROMPT_END = [151645, 198, 151644, 77091, 198]  # <|im_end|>\n<|im_start|>assistant\n
OBSERVATION = [151645, 198, 151644, 872, 198, 1986, 374, 279, 1102, 13, 151645, 198, 151644, 77091, 198]
#: (width, height, left, top, source) of each screenshot crop.
CROPS = (
    (224, 168, 0, 0, "serve-run.png"),
    (252, 140, 400, 300, "serve-run.png"),
    (224, 168, 100, 200, "serve-sample.png"),
    (196, 196, 700, 500, "serve-sample.png"),
    (224, 168, 600, 80, "serve-sample.png"),
)
MAX_PIXELS = 12845056  # the Qwen2-VL hub config's, as the engines ran


def screenshots() -> list[bytes]:
    """The crops of :data:`CROPS` as PNG bytes."""
    from PIL import Image

    out = []
    for w, h, left, top, name in CROPS:
        with Image.open(ROOT / "docs" / "img" / name) as im:
            crop = im.convert("RGB").crop((left, top, left + w, top + h))
        buf = io.BytesIO()
        crop.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def save_model(directory: Path, seed: int = 0) -> Path:
    """A small random Qwen2-VL saved with ``save_pretrained`` into ``directory``, with the shipped
    Qwen2-VL ``preprocessor_config.json`` beside it (a model directory as a user has one)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2VLConfig(
        text_config=dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        ),
        image_token_id=PAD, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        initializer_range=0.1,
    )  # fmt: skip
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.save_pretrained(directory)
    shipped = ROOT / "trainer_hooks" / "data" / "qwen2_vl_preprocessor_config.json"
    shutil.copyfile(shipped, directory / "preprocessor_config.json")
    return directory


@dataclass
class Rollout:
    """What the fixture made: the model directory, the samples, the screenshots and the options."""

    model_dir: Path
    samples: list[Sample]
    pngs: list[bytes]
    args: Any
    tmp: Path
    extra: dict[str, Any] = field(default_factory=dict)


def run_args(
    tmp: Path, name: str, model_dir: Path, *, dtype: str | None = None, max_pixels: int = MAX_PIXELS
) -> Any:
    """Options of a token-space run whose engines serve ``model_dir`` with ``max_pixels``."""
    extra = [
        "--save-debug-rollout-data", str(tmp / f"{name}_{{rollout_id}}"),
        "--enable-token-space-processor",
        "--sglang-model-path", str(model_dir),
        "--sglang-image-processor-backend", "pil",
        "--sglang-mm-process-config", json.dumps({"image": {"max_pixels": max_pixels, "min_pixels": 3136}}),
    ]  # fmt: skip
    if dtype is not None:
        extra.append(dtype)
    return trainer_args(tmp, "run-reference", *extra)


def _generate(
    model: Any, ids: list[int], inputs: dict[str, Any], n: int, seed: int
) -> tuple[list[int], list[float]]:
    """``n`` tokens sampled after ``ids`` (KV cache, temperature 1) and their log-probs."""
    import torch

    x = torch.tensor([ids])
    kwargs = dict(inputs)
    kwargs["mm_token_type_ids"] = (x == PAD).to(torch.int32)
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=x, attention_mask=torch.ones_like(x), **kwargs, max_new_tokens=n, min_new_tokens=n,
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, return_dict_in_generate=True, output_logits=True,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    new = out.sequences[0, len(ids) :].tolist()
    # Special tokens (the image placeholder among them) are not suppressed, which costs seconds a
    # step in transformers; the seeds are fixed, and none is drawn (checked).
    assert all(t < 151643 for t in new), new
    logps = [
        torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, new, strict=True)
    ]
    return new, logps


def make_rollout(tmp: Path, model_dir: Path) -> Rollout:
    """Four samples (one, two, one and two screenshots; the last one has two turns) that the model
    in ``model_dir`` generated in fp32 over the screenshots through the real processor."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    args = run_args(tmp, "reference", model_dir)
    proc = load_processor(
        {"model_path": str(model_dir), "mm_process_config": {"image": {"max_pixels": MAX_PIXELS}}}
    )
    pngs = screenshots()
    refs = [store_media(args, png, ".png") for png in pngs]
    layout = [[0], [1, 2], [3], [4, 0]]
    samples = []
    for i, images in enumerate(layout):
        pil = [_decode(pngs[j]) for j in images]
        inputs = dict(proc(images=pil, return_tensors="pt"))
        tokens = list(PROMPT)
        for t, h, w in inputs["image_grid_thw"].tolist():
            tokens += [VISION_START, *[PAD] * (t * h * w // 4), VISION_END]
        tokens += [3838, 374, 389, 279, 4171, 30, *PROMPT_END]
        response, logps, mask = [], [], []
        for turn in range(2 if i == 3 else 1):
            if turn:
                response += OBSERVATION
                logps += [0.0] * len(OBSERVATION)  # the environment's: never sampled, not trained
                mask += [0] * len(OBSERVATION)
            new, lp = _generate(model, tokens + response, inputs, 5, seed=100 * i + turn)
            response, logps, mask = response + new, logps + lp, mask + [1] * len(new)
        samples.append(
            Sample(group_index=i // 2, index=20 + i, prompt="what is on the screen?", tokens=tokens + response,
                   multimodal_inputs={"images": [refs[j] for j in images]}, response="...",
                   response_length=len(response), reward=1.0, loss_mask=mask, rollout_log_probs=logps,
                   status=Sample.Status.COMPLETED)
        )  # fmt: skip
    return Rollout(model_dir, samples, pngs, args, tmp, {"layout": layout})


def _decode(png: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB")


def write_dump(rollout: Rollout, name: str, samples: list[Sample] | None = None, **run: Any) -> Path:
    """Write ``samples`` (default: the rollout's) as a debug dump with :func:`run_args` ``(**run)``."""
    args = run_args(rollout.tmp, name, rollout.model_dir, **run)
    out = save_debug_rollout_data(
        args, samples if samples is not None else rollout.samples, 0, evaluation=False
    )
    return Path(str(out))


def prefill_logprobs(rollout: Rollout, dtype: str) -> list[list[float]]:
    """Each sample's response log-probs from one forward pass of the model in ``dtype`` (an engine
    in that dtype rescoring by prefill), its pixel values cast to it as training casts them."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    model = Qwen2VLForConditionalGeneration.from_pretrained(rollout.model_dir, dtype=torch_dtype).eval()
    proc = load_processor({"model_path": str(rollout.model_dir)})
    out = []
    for s in rollout.samples:
        pil = [
            _decode(rollout.pngs[rollout.extra["layout"][s.index - 20][j]])
            for j in range(len(s.multimodal_inputs["images"]))
        ]
        inputs = dict(proc(images=pil, return_tensors="pt"))
        x = torch.tensor([s.tokens])
        with torch.inference_mode():
            logits = model(
                input_ids=x, pixel_values=inputs["pixel_values"].to(torch_dtype),
                image_grid_thw=inputs["image_grid_thw"], mm_token_type_ids=(x == PAD).to(torch.int32),
            ).logits  # fmt: skip
        logp = torch.log_softmax(logits[0].float(), -1)
        n = s.response_length
        rows = logp[len(s.tokens) - n - 1 : len(s.tokens) - 1]
        out.append(rows.gather(-1, x[0, -n:].unsqueeze(-1)).squeeze(-1).tolist())
    return out
