"""The compatibility fingerprint of a rollout checkpoint and journal: resume refuses what differs.

A checkpoint (and each journal segment) records what its samples depend on::

    {"model_path", "tokenizer", "processor", "training_dtype", "n_samples_per_prompt",
     "dataset": {"path", "bytes", "head_sha256", "prompts"}}

``model_path`` is ``--hf-checkpoint`` (else ``--sglang-model-path``); ``tokenizer`` the
tokenizer-relevant options present (``--apply-chat-template``, ``--input-key``…); ``processor`` the
engines' resolved processor settings; ``dataset`` identifies ``--prompt-data`` by path, size and
the sha256 of its first MiB (hashing a whole multi-GB dataset on every save would cost more than
the check is worth: an edit beyond the first MiB that keeps the size is not seen), and the prompt
count when the data source can tell it.

Resume compares the stored fingerprint with this run's and raises :class:`IncompatibleResumeError`
naming every field that differs, old and new, and deleting nothing; ``--resume-accept-changes
FIELD[,FIELD]`` (``args.resume_accept_changes``) accepts the named ones (logged once). A field
absent from the stored fingerprint (an older checkpoint) is not compared.
"""

from __future__ import annotations

import hashlib
import logging
import os
from argparse import Namespace
from typing import Any

from bundles import BundleError
from trainer_hooks._sample_bundle import processor_settings, training_dtype_name

__all__ = [
    "FINGERPRINT_FIELDS",
    "IncompatibleResumeError",
    "accepted_changes",
    "check_fingerprint",
    "run_fingerprint",
]

logger = logging.getLogger(__name__)

FINGERPRINT_FIELDS = (
    "model_path",
    "tokenizer",
    "processor",
    "training_dtype",
    "n_samples_per_prompt",
    "dataset",
)
_TOKENIZER_OPTIONS = ("apply_chat_template", "input_key", "label_key", "tool_key", "rollout_max_prompt_len")
_HEAD_BYTES = 1 << 20


class IncompatibleResumeError(BundleError):
    """Resume refused: the checkpoint was written with settings this run does not share."""


def _dataset(args: Namespace, prompts: int | None) -> dict[str, Any] | None:
    path = getattr(args, "prompt_data", None)
    if path is None and prompts is None:
        return None
    out: dict[str, Any] = {"path": None if path is None else os.path.abspath(str(path)), "prompts": prompts}
    if path is not None and os.path.isfile(path):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            h.update(f.read(_HEAD_BYTES))
        out["bytes"] = os.path.getsize(path)
        out["head_sha256"] = h.hexdigest()
    return out


def run_fingerprint(args: Namespace, *, prompts: int | None = None) -> dict[str, Any]:
    """This run's fingerprint (see the module docstring); ``prompts`` is the dataset's size."""
    tokenizer = {k: getattr(args, k) for k in _TOKENIZER_OPTIONS if getattr(args, k, None) is not None}
    return {
        "model_path": getattr(args, "hf_checkpoint", None) or getattr(args, "sglang_model_path", None),
        "tokenizer": tokenizer,
        "processor": processor_settings(args),
        "training_dtype": training_dtype_name(args),
        "n_samples_per_prompt": getattr(args, "n_samples_per_prompt", None),
        "dataset": _dataset(args, prompts),
    }


def accepted_changes(args: Namespace) -> set[str]:
    value = getattr(args, "resume_accept_changes", None) or ()
    if isinstance(value, str):
        value = [value]
    out = {f.strip() for v in value for f in str(v).split(",") if f.strip()}
    unknown = out - set(FINGERPRINT_FIELDS)
    if unknown:
        raise ValueError(
            f"--resume-accept-changes: unknown field(s) {', '.join(sorted(unknown))}; expected some of "
            f"{', '.join(FINGERPRINT_FIELDS)}"
        )
    return out


def check_fingerprint(stored: Any, now: dict[str, Any], *, where: str, args: Namespace) -> list[str]:
    """Raise :class:`IncompatibleResumeError` naming each differing field (old and new) unless
    accepted; returns the accepted differences (logged once each)."""
    if not isinstance(stored, dict):
        return []
    accept = accepted_changes(args)
    differs = [k for k in FINGERPRINT_FIELDS if k in stored and stored[k] != now.get(k)]
    refused = [k for k in differs if k not in accept]
    if refused:
        lines = "; ".join(f"{k}: checkpoint {stored[k]!r}, this run {now.get(k)!r}" for k in refused)
        raise IncompatibleResumeError(
            f"{where}: refusing to resume with a different setup ({lines}). Nothing was deleted. Pass "
            f"--resume-accept-changes {','.join(refused)} to resume anyway"
        )
    for k in differs:
        logger.warning(
            "%s: %s changed (%r -> %r): accepted by --resume-accept-changes", where, k, stored[k], now.get(k)
        )
    return differs
