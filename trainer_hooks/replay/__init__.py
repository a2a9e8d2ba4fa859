"""Replay: what training would see of a checkpoint or a debug dump.

* :func:`convert_samples_to_train_data` (Miles' call shape) with the guard: train data never
  carries both media references and dense ``multimodal_train_inputs``.
* :func:`compute_multimodal_train_inputs`, :func:`training_dtype`, :func:`get_rollout_data`:
  rebuild vision tensors from media references, cast to the training dtype per sample.
* :func:`load_processor`: the image processor of the recorded model family (Qwen2-VL, Qwen2.5-VL,
  Qwen3-VL) from a bundle's recorded settings, checked, offline.
* :func:`build_prefill_scoring_payload` (alias ``_build_prefill_scoring_payload``): SGLang prefill
  payloads, with ``mm_token_expansion_start_len`` in token space.
* :func:`check_image_tokens`: placeholder counts against ``image_grid_thw``.
* :func:`replay_bundle`: all of the above over a bundle, with fingerprints, ``expect`` and Ray;
  ``rollout-bundle replay`` (:mod:`trainer_hooks.replay._cli`); with ``model`` (``--model DIR``)
  the trainer's log-probs of each response against ``rollout_log_probs``
  (:mod:`trainer_hooks.replay._score`), summed up across the bundle
  (:mod:`trainer_hooks.replay._mismatch`); :func:`load_model`, :class:`LogprobScorer` and
  :class:`ScoreItem` score a script's own samples the same way.
* :func:`load_replay_report`, :func:`check_replay_report`, :func:`check_report_bundle` (a report
  of another bundle is refused: ``view --replay``, ``replay --expect``), :func:`bundle_identity`.

A bundle may come from anyone: replay reads only the media stored in it (unless told
otherwise), decodes images only through :func:`bundles.decode_image`, and checks every recorded
setting before use (docs/RELIABILITY.md, "Untrusted input").

torch, transformers, PIL and Ray are imported only when used.
"""

from trainer_hooks.replay._cli import register as register_commands
from trainer_hooks.replay._fingerprint import compare_reports
from trainer_hooks.replay._guard import convert_samples_to_train_data
from trainer_hooks.replay._memory import tune_allocator
from trainer_hooks.replay._payload import (
    # Miles' private name for the same function, importable for drop-in parity, not in __all__.
    _build_prefill_scoring_payload as _build_prefill_scoring_payload,
)
from trainer_hooks.replay._payload import (
    build_prefill_scoring_payload,
    sglang_generate_fields,
)
from trainer_hooks.replay._processor import DEFAULT_IMAGE_TOKEN_ID, ReplayProcessor, load_processor
from trainer_hooks.replay._rebuild import (
    DTYPE_NAMES,
    compute_multimodal_train_inputs,
    dtype_from_name,
    get_rollout_data,
    training_dtype,
)
from trainer_hooks.replay._replay import replay_bundle
from trainer_hooks.replay._report import (
    REPORT_FORMAT,
    ReportError,
    bundle_identity,
    check_replay_report,
    check_report_bundle,
    load_replay_report,
)
from trainer_hooks.replay._score import LogprobScorer, ScoreItem, load_model
from trainer_hooks.replay._tokens import check_image_tokens

__all__ = [
    "DEFAULT_IMAGE_TOKEN_ID",
    "DTYPE_NAMES",
    "REPORT_FORMAT",
    "LogprobScorer",
    "ReplayProcessor",
    "ReportError",
    "ScoreItem",
    "build_prefill_scoring_payload",
    "bundle_identity",
    "check_image_tokens",
    "check_replay_report",
    "check_report_bundle",
    "compare_reports",
    "compute_multimodal_train_inputs",
    "convert_samples_to_train_data",
    "dtype_from_name",
    "get_rollout_data",
    "load_model",
    "load_processor",
    "load_replay_report",
    "register_commands",
    "replay_bundle",
    "sglang_generate_fields",
    "training_dtype",
    "tune_allocator",
]
