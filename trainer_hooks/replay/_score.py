"""The trainer's log-probs of a bundle's responses: :class:`LogprobScorer` (``replay --model``).

The model is loaded with transformers from a local directory only (``local_files_only``: nothing
is downloaded), for the families the processor check knows (:data:`MODEL_CLASSES`: Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, read from the directory's ``config.json`` ``model_type``); another family
is refused in one line naming it. It runs in the replay's dtype (the training dtype, or
``--dtype``) on ``--device``.

What it is handed is exactly what training would be: the sample's ``tokens``, its rebuilt and cast
``pixel_values`` and ``image_grid_thw`` (:func:`~trainer_hooks.replay._rebuild.
compute_multimodal_train_inputs`), and ``mm_token_type_ids`` (1 where a token is the image
placeholder), from which the model computes its M-RoPE positions as it does for its own
processor's output (transformers 5 needs them; 4.x reads the placeholders from ``input_ids``).
The log-prob of response token ``k`` is the log-softmax, in float32, of the logits one position
before it.

Batches: samples are packed, in order, into one forward pass while the estimated memory stays
under ``batch_bytes`` (:func:`batch_bytes`: every row padded to the longest sample, each with its
activations, its attention scores, and the float32 logits of the longest response's positions,
which alone are kept: ``logits_to_keep``). A sample over the budget alone, or longer than the
model's ``max_position_embeddings``, is refused (a ``logprob`` problem naming it), never run:
a bundle may come from anyone. Sequences are left-padded, so every response ends at the last position and one slice of
the logits covers the batch; the padding is masked (attention and positions), which changes the
real tokens' log-probs by float rounding only (tested: a batch equals one sample at a time within
1e-5 in fp32).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_hooks.replay._mismatch import sample_mismatch, threshold_problem
from trainer_hooks.replay._payload import prompt_length, rollout_log_probs
from trainer_hooks.replay._plan import ReplayPlan
from trainer_hooks.replay._processor import FAMILIES, _read_json_file

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "MODEL_CLASSES",
    "NOT_SCORED",
    "LogprobScorer",
    "ScoreItem",
    "batch_bytes",
    "load_model",
    "make_scorer",
    "model_class_name",
    "row_bytes",
    "score_item",
]

#: The transformers class of each ``config.json`` ``model_type`` replay can score with.
MODEL_CLASSES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
}
#: The memory one forward pass may use, estimated (:func:`batch_bytes`).
DEFAULT_BATCH_BYTES = 1 << 30
_KNOWN = ", ".join(f.name for f in FAMILIES.values())


def model_class_name(model_dir: str) -> str:
    """The transformers class for the model in ``model_dir`` (its ``config.json`` ``model_type``).

    Raises:
        ValueError: not a directory, no ``config.json``, or a family replay cannot score, in one
            line naming the directory and the ``model_type``.
    """
    if not os.path.isdir(model_dir):
        raise ValueError(f"--model {model_dir}: not a model directory (transformers' save_pretrained layout)")
    config = _read_json_file(os.path.join(model_dir, "config.json"))
    if config is None:
        raise ValueError(f"--model {model_dir}: no config.json")
    model_type = config.get("model_type")
    if model_type not in MODEL_CLASSES:
        raise ValueError(
            f"--model {model_dir}: config.json model_type {str(model_type)[:80]!r} is not a family replay "
            f"can score ({_KNOWN})"
        )
    return MODEL_CLASSES[model_type]


def load_model(model_dir: str, device: str, dtype: Any) -> Any:
    """The model in ``model_dir`` (offline), in ``dtype`` on ``device``, in eval mode.

    Raises:
        ValueError: (exit 2, the caller's arguments) ``--device cuda`` where torch has no CUDA, or
            a model transformers cannot load (missing or corrupt weights, a config it refuses), in
            one line naming the directory.
    """
    import torch
    import transformers

    name = model_class_name(model_dir)
    cls = getattr(transformers, name, None)
    if cls is None:
        raise ValueError(f"--model {model_dir}: this transformers ({transformers.__version__}) has no {name}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device")
    try:
        model = cls.from_pretrained(model_dir, dtype=dtype, local_files_only=True)
        return model.to(device).eval()
    except Exception as e:  # OSError, RuntimeError, SafetensorError, ValueError...: the caller's --model
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"--model {model_dir}: cannot load: {type(e).__name__}: {first[:300]}") from None


@dataclass
class ScoreItem:
    """One sample to score: its report entry, tokens, prompt length and rebuilt vision inputs."""

    entry: dict[str, Any]
    tokens: list[int]
    prompt_len: int
    inputs: Mapping[str, Any] | None
    rollout: list[float]
    loss_mask: Any

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.prompt_len


def row_bytes(length: int, keep: int, hidden: int, heads: int, vocab: int, element: int) -> int:
    """Estimated memory of one row of a forward pass, ``length`` tokens long, keeping the logits of
    ``keep`` positions: ~24 hidden-size activations per token in the model's dtype; the attention
    scores of a layer, ``heads x length^2`` float32 (an attention that materialises them, as CPU
    attention with a padding mask does); the float32 logits and log-softmax of the kept positions."""
    return length * hidden * element * 24 + heads * length * length * 4 + keep * vocab * 8


def _pixel_bytes(item: ScoreItem) -> int:
    return sum(v.numel() * v.element_size() for v in (item.inputs or {}).values() if hasattr(v, "numel"))


def batch_bytes(items: Sequence[ScoreItem], hidden: int, heads: int, vocab: int, element: int) -> int:
    """Estimated memory of one left-padded forward pass over ``items``: every row is as long as the
    longest sample and keeps the logits of the longest response (``len x cost(L_max, keep_max)``,
    not the sum of each sample's own cost: one long sample among short ones pads them all), plus
    the samples' pixels. The vision tower's attention runs image by image: not counted per row."""
    if not items:
        return 0
    length = max(len(item.tokens) for item in items)
    keep = max(item.response_len for item in items) + 1
    pixels = sum(_pixel_bytes(item) for item in items)
    return len(items) * row_bytes(length, keep, hidden, heads, vocab, element) + pixels


class LogprobScorer:
    """Scores samples in batches with one loaded model; :meth:`add` queues, :meth:`flush` runs.

    ``on_scored(item, logprobs)`` is called for each sample with its response tokens'
    log-probs (a list of floats), or ``on_failed(item, message)`` when the model refused the
    batch's inputs (e.g. placeholders that do not match the image features), or when the sample
    is refused before any forward pass: longer than the model's ``max_position_embeddings``, or
    over ``batch_bytes`` alone (a bundle may come from anyone: 2^24 tokens is not run), or holding
    a token id outside the model's vocabulary."""

    def __init__(
        self, model: Any, device: str, batch_bytes: int, on_scored: Any, on_failed: Any, image_token_id: int
    ) -> None:
        self.model = model
        self.device = device
        self.batch_bytes = batch_bytes
        self.on_scored = on_scored
        self.on_failed = on_failed
        self.image_token_id = image_token_id
        text = getattr(model.config, "text_config", model.config)
        self._dims = (int(text.hidden_size), int(getattr(text, "num_attention_heads", 1) or 1),
                      int(text.vocab_size), next(model.parameters()).element_size())  # fmt: skip
        self._vocab = self._dims[2]
        self._positions = getattr(text, "max_position_embeddings", None)
        self._mm_types = "mm_token_type_ids" in inspect.signature(model.forward).parameters
        self._queue: list[ScoreItem] = []

    def refusal(self, item: ScoreItem) -> str | None:
        """Why ``item`` is not run at all (see the class doc), or None."""
        n = len(item.tokens)
        bad = next((k for k, t in enumerate(item.tokens) if not 0 <= t < self._vocab), None)
        if bad is not None:  # on CUDA an out-of-range embedding index poisons the whole context
            return (
                f"tokens[{bad}] = {item.tokens[bad]} is not a token id of the model (vocab_size "
                f"{self._vocab}): not scored"
            )
        if isinstance(self._positions, int) and n > self._positions:
            return f"{n} tokens, over the model's max_position_embeddings {self._positions}: not scored"
        alone = batch_bytes([item], *self._dims)
        if alone > self.batch_bytes:
            return (
                f"{n} tokens need an estimated {alone / (1 << 30):.3g} GiB for one forward pass, over the "
                f"budget of {self.batch_bytes / (1 << 30):.3g} GiB (batch_bytes): not scored"
            )
        return None

    def add(self, item: ScoreItem) -> None:
        if (reason := self.refusal(item)) is not None:
            self.on_failed(item, reason)
            return
        if self._queue and batch_bytes([*self._queue, item], *self._dims) > self.batch_bytes:
            self.flush()
        self._queue.append(item)

    def flush(self) -> None:
        batch, self._queue = self._queue, []
        if not batch:
            return
        try:
            logprobs = self._forward(batch)
        except (ValueError, RuntimeError, IndexError, TypeError, KeyError) as e:
            if len(batch) > 1:  # name the sample: one at a time
                for item in batch:
                    self._queue = [item]
                    self.flush()
                return
            self.on_failed(batch[0], f"the model refused the inputs: {str(e)[:300]}")
            return
        for item, values in zip(batch, logprobs, strict=True):
            self.on_scored(item, values)

    def _forward(self, batch: Sequence[ScoreItem]) -> list[list[float]]:
        """One forward pass over ``batch`` (left-padded); each sample's response log-probs."""
        import torch

        kwargs = _batch_inputs(batch, self.image_token_id, self._mm_types, self.device)
        keep = max(item.response_len for item in batch) + 1
        with torch.inference_mode():
            logits = self.model(**kwargs, logits_to_keep=keep, use_cache=False).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        ids = kwargs["input_ids"]
        out = []
        for row, item in enumerate(batch):
            n = item.response_len
            # Position p's logits predict token p + 1: the response's logits end one before the last.
            rows = logp[row, keep - n - 1 : keep - 1]
            targets = ids[row, ids.shape[1] - n :]
            out.append(rows.gather(-1, targets.unsqueeze(-1)).squeeze(-1).tolist())
        return out


def _batch_inputs(
    batch: Sequence[ScoreItem], image_token_id: int, mm_types: bool, device: str
) -> dict[str, Any]:
    """The model's keyword arguments for ``batch``: left-padded ``input_ids`` and
    ``attention_mask``, ``mm_token_type_ids`` where the model takes them, and the samples'
    ``pixel_values`` and ``image_grid_thw`` concatenated in order."""
    import torch

    length = max(len(item.tokens) for item in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    mask = torch.zeros(len(batch), length, dtype=torch.long)
    for row, item in enumerate(batch):
        ids[row, length - len(item.tokens) :] = torch.tensor(item.tokens, dtype=torch.long)
        mask[row, length - len(item.tokens) :] = 1
    kwargs: dict[str, Any] = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if mm_types:
        kwargs["mm_token_type_ids"] = (ids == image_token_id).to(torch.int32).to(device)
    with_images = [item.inputs for item in batch if item.inputs]
    if with_images:
        for key in ("pixel_values", "image_grid_thw"):
            parts = [inputs[key] for inputs in with_images]
            kwargs[key] = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)).to(device)
    return kwargs


def _where(entry: Mapping[str, Any]) -> str:
    return f"sample index {entry['index']} (position {entry['position']})"


def make_scorer(plan: ReplayPlan, image_token_id: int) -> LogprobScorer | None:
    """The scorer of ``plan`` (None without ``plan.model``): its model loaded once (per Ray task,
    one model per worker); each scored sample's ``logprob_diff`` filled in its entry, a
    ``logprob`` problem added when its ``mean_abs`` is over ``plan.max_logprob_diff`` or the model
    refused its inputs."""
    if plan.model is None:
        return None
    from trainer_hooks.replay._rebuild import dtype_from_name

    model = load_model(plan.model, plan.device, dtype_from_name(plan.dtype))
    limit = plan.max_logprob_diff

    def scored(item: ScoreItem, values: list[float]) -> None:
        response = item.tokens[item.prompt_len :]
        diff = sample_mismatch(values, item.rollout, response, item.loss_mask, limit, plan.tis_cap)
        item.entry["logprob_diff"] = diff
        if (problem := threshold_problem(_where(item.entry), diff, limit)) is not None:
            item.entry["problems"].append(problem)

    def failed(item: ScoreItem, message: str) -> None:
        item.entry["problems"].append(
            {"kind": "logprob", "message": f"{_where(item.entry)}: {message}", "image": None}
        )

    return LogprobScorer(model, plan.device, plan.batch_bytes, scored, failed, image_token_id)


#: Problems after which a sample is not scored (by the model or the engine): the check that owns
#: them has named it, and its inputs are known to be wrong.
NOT_SCORED = frozenset({"rebuild", "token_count", "payload", "convert"})


def score_item(sample: Any, entry: dict[str, Any], inputs: Mapping[str, Any] | None) -> ScoreItem | None:
    """``sample`` as a :class:`ScoreItem`, or None (nothing to score) when an earlier check named
    a problem that makes its inputs wrong, or when it has no usable ``rollout_log_probs`` (a
    ``logprob`` problem naming it)."""
    if any(p["kind"] in NOT_SCORED for p in entry["problems"]):
        return None
    try:
        tokens, prompt_len = prompt_length(sample, "logprob comparison")
        rollout = rollout_log_probs(sample, len(tokens) - prompt_len, _where(entry))
    except ValueError as e:
        entry["problems"].append({"kind": "logprob", "message": str(e), "image": None})
        return None
    return ScoreItem(entry, tokens, prompt_len, inputs, rollout, getattr(sample, "loss_mask", None))
