"""Prefill scoring payloads for SGLang: :func:`build_prefill_scoring_payload`.

With ``--recompute-logprobs-via-prefill`` the rollout's log-probs are recomputed by sending each
finished sample back to the engine as a zero-token generation with ``return_logprob``. The
payload uses SGLang's ``GenerateReqInput`` field names; the list of those names is generated from
the pinned sglang release's source by ``scripts/sglang_fields.py`` (never importing sglang) and
shipped as ``trainer_hooks/data/sglang_generate_req_input_fields.json``.

Expanded prefix: with ``--enable-token-space-processor`` the trainer expands each image into its
``<|image_pad|>`` placeholders while building ``sample.tokens``.
An engine handed those tokens with ``image_data`` would expand the placeholders a second time;
``mm_token_expansion_start_len = len(sample.tokens)`` tells the token-space engine build that the
whole input is already expanded. That field is the one documented addition to stock
``GenerateReqInput`` (sglang 0.5.23 lacks it). Text-only samples carry neither ``image_data`` nor
``mm_token_expansion_start_len``.

Images: as Miles sends them (``miles.utils.processing_utils.encode_image_for_rollout_engine``):
converted to RGB when they are not, PNG, base64 ``data:`` URLs. Whatever the sample holds (a PIL
image, a path, a ``MediaRef``, an image read back from a bundle directory or a packed file), the
engine gets pixels, never a local path it may not be able to open (a remote engine). Apart from
``mm_token_expansion_start_len`` the payload is Miles' own, key for key
(``tests/test_replay_parity.py`` calls Miles' ``_build_prefill_scoring_payload`` side by side).
"""

from __future__ import annotations

import base64
import io
import json
import math
from argparse import Namespace
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

from trainer_hooks.replay._media import MediaReader, to_rgb
from trainer_hooks.replay._rebuild import sample_images

__all__ = [
    "SGLANG_FIELDS_FILE",
    "build_prefill_scoring_payload",
    "compare_prefill_logprobs",
    "encode_image",
    "is_token_space",
    "logprob_diff",
    "prompt_length",
    "rollout_log_probs",
    "sample_token_fields",
    "sglang_generate_fields",
]

SGLANG_FIELDS_FILE = "sglang_generate_req_input_fields.json"


@cache
def _fields_doc() -> dict[str, Any]:
    text = resources.files("trainer_hooks").joinpath(f"data/{SGLANG_FIELDS_FILE}").read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


def sglang_generate_fields(*, token_space: bool = True) -> frozenset[str]:
    """Field names of SGLang's ``GenerateReqInput`` (pinned release), plus, with ``token_space``,
    the token-space engine build's ``mm_token_expansion_start_len``."""
    doc = _fields_doc()
    names = set(doc["fields"])
    if token_space:
        names.update(doc["token_space_additions"])
    return frozenset(names)


def is_token_space(args: Namespace) -> bool:
    """Whether media reach the engine in token space (``--enable-token-space-processor``)."""
    return bool(getattr(args, "enable_token_space_processor", False))


def sample_token_fields(sample: Any, what: str) -> tuple[list[int], int]:
    """``(tokens, response_length)`` of ``sample``, checked: a list of ints and an int in
    ``0..len(tokens)``; ``ValueError`` naming ``what``, the sample index and the field otherwise
    (a bundle may hold anything there)."""
    where = f"{what}: sample index {str(getattr(sample, 'index', None))[:40]}"
    tokens = getattr(sample, "tokens", None)
    if not isinstance(tokens, (list, tuple)) or not all(type(t) is int for t in tokens):
        found = type(tokens).__name__ if not isinstance(tokens, (list, tuple)) else "a list holding a non-int"
        raise ValueError(f"{where}: tokens: expected a list of token ids, found {found}")
    n = getattr(sample, "response_length", None)
    if type(n) is not int or not 0 <= n <= len(tokens):
        raise ValueError(
            f"{where}: response_length: expected an int in 0..len(tokens) = {len(tokens)}, found {repr(n)[:40]}"
        )
    return list(tokens), n


def encode_image(image: Any) -> str:
    """A PIL image as Miles sends it to the engine: RGB (``convert("RGB")`` for any other mode),
    PNG, base64, as a ``data:image/png;base64,`` URL (``miles.utils.processing_utils.
    encode_image_for_rollout_engine``). A data URL works against a remote engine, which a local
    file path does not."""
    buf = io.BytesIO()
    to_rgb(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("utf-8")


def _lora_path(args: Namespace, sample: Any) -> str | None:
    """Miles' adapter name to score under: the sample's multi-LoRA slot (``__miles_slot_<slot>``),
    else ``miles_lora`` when LoRA takes part in rollout, else None."""
    adapter = getattr(sample, "adapter", None)
    if adapter is not None and getattr(adapter, "slot", None) is not None:
        return f"__miles_slot_{adapter.slot}"
    lora = (getattr(args, "lora_rank", 0) or 0) > 0 or getattr(args, "lora_adapter_path", None) is not None
    if lora and not getattr(args, "lora_train_only", False):
        return "miles_lora"
    return None


def build_prefill_scoring_payload(
    args: Namespace,
    sample: Any,
    sampling_params: Mapping[str, Any] | None = None,
    *,
    media: MediaReader | None = None,
    images: bool = True,
) -> dict[str, Any]:
    """The SGLang ``/generate`` request that rescores ``sample``'s response by prefill.

    ``input_ids`` = ``sample.tokens``; ``sampling_params`` = the given ones plus
    ``max_new_tokens: 0``, ``temperature: 0``, ``skip_special_tokens: False``;
    ``return_logprob: True``; ``logprob_start_len`` = prompt length - 1 (SGLang returns
    ``input_token_logprobs`` from there, the first being None, so the tail covers every response
    token); ``lora_path`` as Miles names adapters (``__miles_slot_<slot>`` for a sample with an
    ``adapter``, ``miles_lora`` with ``--lora-rank``/``--lora-adapter-path`` unless
    ``--lora-train-only``); ``image_data`` = the
    sample's images as Miles sends them (:func:`encode_image`: RGB, PNG, base64 data URLs, so
    that a remote engine can read them; paths and ``MediaRef``s are read through ``media``, by
    default as the caller's own files, and decoded by :func:`bundles.decode_image`); and, in token space
    (``args.enable_token_space_processor``) for a sample with images,
    ``mm_token_expansion_start_len = len(sample.tokens)``.

    ``images=False`` leaves ``image_data`` out (a replay that only checks the payload can be
    built does not encode screenshots it will not write).

    Raises:
        ValueError: the prompt length (``len(tokens) - response_length``) is not positive, naming
            both lengths and the sample index; an image that cannot be read or decoded, naming
            the sample index and the image index.
    """
    tokens, prompt_len = prompt_length(sample, "prefill scoring payload")
    payload: dict[str, Any] = {
        "input_ids": tokens,
        "sampling_params": {
            **dict(sampling_params or {}),
            "max_new_tokens": 0,
            "temperature": 0,
            "skip_special_tokens": False,
        },
        "return_logprob": True,
        "logprob_start_len": prompt_len - 1,
    }
    if (lora_path := _lora_path(args, sample)) is not None:
        payload["lora_path"] = lora_path
    payload.update(_image_fields(args, sample, len(tokens), media, images))
    return payload


def prompt_length(sample: Any, what: str) -> tuple[list[int], int]:
    """``(tokens, prompt length)`` of ``sample`` (:func:`sample_token_fields`), the prompt at least
    one token long.

    Raises:
        ValueError: the prompt length (``len(tokens) - response_length``) is not positive, naming
            ``what``, both lengths and the sample index.
    """
    tokens, response_length = sample_token_fields(sample, what)
    prompt_len = len(tokens) - response_length
    if prompt_len <= 0:
        raise ValueError(
            f"{what}: sample index {getattr(sample, 'index', None)}: needs at least one prompt "
            f"token, found len(tokens) = {len(tokens)} and response_length = {sample.response_length} "
            f"(prompt length {prompt_len})"
        )
    return tokens, prompt_len


def _image_fields(
    args: Namespace, sample: Any, n_tokens: int, media: MediaReader | None, images: bool
) -> dict[str, Any]:
    """A payload's ``image_data`` (unless ``images`` is False) and, in token space,
    ``mm_token_expansion_start_len``; nothing for a text-only sample."""
    items = sample_images(sample, f"prefill scoring payload: sample index {getattr(sample, 'index', None)}")
    if not items:
        return {}
    out: dict[str, Any] = {}
    where = (
        f"prefill scoring payload: sample index {getattr(sample, 'index', None)}: multimodal_inputs.images"
    )
    if images:
        reader = media if media is not None else MediaReader()
        out["image_data"] = [encode_image(reader.image(img, f"{where}[{j}]")) for j, img in enumerate(items)]
    if is_token_space(args):
        out["mm_token_expansion_start_len"] = n_tokens
    return out


def compare_prefill_logprobs(sample: Any, response: Mapping[str, Any]) -> dict[str, Any]:
    """Compare an SGLang prefill answer to the rollout's log-probs on the response tail.

    ``response`` is the ``/generate`` answer to :func:`build_prefill_scoring_payload`:
    ``meta_info.input_token_logprobs`` holds ``[logprob, token_id, text]`` from
    ``logprob_start_len`` on (the first logprob None). Its last ``response_length`` entries must
    score exactly the response tokens; their log-probs are compared to ``rollout_log_probs``.

    Returns:
        ``{"max_abs", "mean_abs", "tokens", "recomputed"}`` (``recomputed``: the engine's
        log-prob of each response token, in order).

    Raises:
        ValueError: no ``input_token_logprobs``, token ids that do not line up with the response,
            a None log-prob in the tail, or no ``rollout_log_probs`` to compare with.
    """
    where = f"sample index {getattr(sample, 'index', None)}"
    meta = response.get("meta_info") if isinstance(response, Mapping) else None
    items = meta.get("input_token_logprobs") if isinstance(meta, Mapping) else None
    if not items:
        raise ValueError(f"{where}: the engine answer has no meta_info.input_token_logprobs")
    if not isinstance(items, (list, tuple)):
        raise ValueError(
            f"{where}: the answer's meta_info.input_token_logprobs: expected a list, found {type(items).__name__}"
        )
    tokens, n = sample_token_fields(sample, "logprob comparison")
    rollout = rollout_log_probs(sample, n, where)
    recomputed = _response_tail_logprobs(list(items), tokens, n, where)
    return logprob_diff(recomputed, rollout)


def rollout_log_probs(sample: Any, n: int, where: str) -> list[float]:
    """``sample.rollout_log_probs`` checked: ``n`` finite numbers, else ValueError naming ``where``."""
    rollout = getattr(sample, "rollout_log_probs", None)
    if not isinstance(rollout, (list, tuple)):
        raise ValueError(
            f"{where}: rollout_log_probs: expected {n} finite numbers to compare with, found {type(rollout).__name__}"
        )
    numbers = all(type(v) in (int, float) and math.isfinite(v) for v in rollout)
    if not numbers or len(rollout) != n:
        raise ValueError(
            f"{where}: rollout_log_probs: expected {n} finite numbers to compare with, found {len(rollout)}"
            + ("" if len(rollout) != n else " (not all finite numbers)")
        )
    return [float(v) for v in rollout]


def _response_tail_logprobs(items: list[Any], tokens: list[int], n: int, where: str) -> list[float]:
    """The engine's log-probs of the last ``n`` tokens, each entry checked to score the response
    token it should."""
    tail = items[-n:] if n else []
    for k, item in enumerate(tail):
        if not isinstance(item, (list, tuple)) or len(item) < 2:
            raise ValueError(
                f"{where}: the answer's meta_info.input_token_logprobs[{len(items) - len(tail) + k}]: "
                f"expected [logprob, token_id, text], found {item!r}"
            )
    want = tokens[-n:] if n else []
    got = [item[1] for item in tail]
    if got != want or len(tail) != n:
        raise ValueError(
            f"{where}: the answer's last {n} input_token_logprobs score tokens {got[:8]}…, "
            f"expected the response tokens {want[:8]}… ({len(tail)} scored, {n} expected)"
        )
    logprobs = [item[0] for item in tail]
    if any(v is None for v in logprobs):
        raise ValueError(f"{where}: the answer has a None log-prob inside the response tail")
    if not all(type(v) in (int, float) for v in logprobs):
        bad = next(v for v in logprobs if type(v) not in (int, float))
        raise ValueError(f"{where}: the answer's response tail holds a log-prob that is no number: {bad!r}")
    if not all(math.isfinite(v) for v in logprobs):
        k = next(k for k, v in enumerate(logprobs) if not math.isfinite(v))
        raise ValueError(
            f"{where}: the answer's log-prob of response token {k} is not a finite number: {logprobs[k]!r}"
        )
    return [float(v) for v in logprobs]


def logprob_diff(recomputed: list[float], rollout: list[float]) -> dict[str, Any]:
    """A sample's ``logprob_diff``: ``max_abs``, ``mean_abs`` of ``|recomputed - rollout|`` over
    the response tokens, their count and the ``recomputed`` log-probs (what
    ``rollout-bundle view --replay`` draws as its |Δ| strip)."""
    diffs = [abs(a - b) for a, b in zip(recomputed, rollout, strict=True)]
    return {
        "max_abs": max(diffs) if diffs else 0.0,
        "mean_abs": sum(diffs) / len(diffs) if diffs else 0.0,
        "tokens": len(recomputed),
        "recomputed": recomputed,
    }


# Miles' private name, for drop-in use.
_build_prefill_scoring_payload = build_prefill_scoring_payload
