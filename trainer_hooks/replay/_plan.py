"""What one replay does, decided once: :class:`ReplayPlan` and :func:`plan_replay`.

The plan is JSON-ready (the bundle's path, the dtype, the processor settings, the positions, the
outside-media permission) so that it travels to Ray tasks as it is, and every check of what the
bundle *recorded* happens here, before any work: a bad value is the bundle's error
(``BundleError``, exit 1, naming the key path), a bad ``mm_process_config`` of the caller's a
``ValueError`` (exit 2).
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bundles import Bundle, BundleError, open_bundle
from trainer_hooks.arguments import parse_mm_process_config
from trainer_hooks.replay._processor import resolve_processor
from trainer_hooks.replay._rebuild import DTYPE_NAMES

__all__ = ["ReplayPlan", "first_trainable", "open_replay_bundle", "plan_replay"]


def open_replay_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Open a bundle directory or packed file with fast verification. A packed file is read in
    place (its media through :meth:`~bundles.Bundle.open_media`): nothing is unpacked beside it."""
    return open_bundle(path, verify="fast")


@dataclass(frozen=True)
class ReplayPlan:
    """What every worker of one replay needs, JSON-ready so that it travels to Ray tasks as-is."""

    bundle: str
    dtype: str
    processor_settings: dict[str, Any] | None
    token_space: bool
    positions: tuple[int, ...]
    allow_outside_media: bool = False
    #: ``--model``: a local model directory whose log-probs fill each ``logprob_diff``
    #: (:mod:`trainer_hooks.replay._score`), run on ``device``; None: no model.
    model: str | None = None
    device: str = "cpu"
    #: ``--engine``: a running SGLang server whose prefill answers fill each ``logprob_diff``
    #: (:mod:`trainer_hooks.replay._engine`; asked from the driver, never from Ray tasks).
    engine: str | None = None
    #: ``--max-logprob-diff``: a sample whose ``mean_abs`` is over it is a ``logprob`` violation.
    max_logprob_diff: float | None = None
    #: The importance-ratio cap of the TIS figure (:mod:`trainer_hooks.replay._mismatch`).
    tis_cap: float = 2.0
    #: The estimated memory of one forward pass (:data:`~trainer_hooks.replay._score.DEFAULT_BATCH_BYTES`).
    batch_bytes: int = 1 << 30

    def args(self) -> Namespace:
        """A Miles-style args namespace for the converter and the payload builder."""
        return Namespace(
            enable_token_space_processor=self.token_space,
            bf16=self.dtype == "bf16",
            fp16=self.dtype == "fp16",
        )


def plan_replay(
    bundle: Bundle,
    *,
    dtype: str | None = None,
    limit: int | None = None,
    mm_process_config: Mapping[str, Any] | None = None,
    allow_outside_media: bool = False,
) -> ReplayPlan:
    """The dtype (given, else the bundle's ``training_dtype``, else fp32), the processor settings
    (``meta["processor"]``, with ``mm_process_config`` replaced when given) and the positions.

    Raises:
        BundleError: what the bundle recorded is unusable (bad processor settings, an unknown
            model family, a bad dtype), naming the key path.
        ValueError: ``mm_process_config`` (the caller's) is unusable, or ``limit`` < 1.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected an int >= 1 (omit it for every sample), found {limit!r}")
    meta = bundle.meta
    recorded = meta.get("processor")
    if recorded is not None and not isinstance(recorded, Mapping):
        raise BundleError(f"{bundle.path}: meta.processor: expected an object or null, found {recorded!r}")
    if recorded is not None:
        # What the bundle recorded is checked here, so that a bad value is the bundle's error (exit 1,
        # naming it) and not taken for a bad --mm-process-config (exit 2).
        where = f"{bundle.path}: meta.processor"
        try:
            parse_mm_process_config(recorded.get("mm_process_config"), where=f"{where}.mm_process_config")
            resolve_processor(recorded, where)  # bounds, family: before transformers sees a value
        except ValueError as e:
            raise BundleError(str(e)) from None
        token_id = recorded.get("image_token_id")
        if token_id is not None and (type(token_id) is not int or token_id < 0):
            raise BundleError(
                f"{where}.image_token_id: expected a token id (int >= 0) or null, found {token_id!r}"
            )
    if dtype is None:
        dtype = meta.get("training_dtype") or "fp32"
    if dtype not in DTYPE_NAMES:
        raise BundleError(
            f"{bundle.path}: meta.training_dtype: expected one of {', '.join(DTYPE_NAMES)}, found {dtype!r}"
        )
    settings = dict(recorded) if recorded is not None else None
    if mm_process_config is not None:
        settings = {**(settings or {}), "mm_process_config": dict(mm_process_config)}
        resolve_processor(settings, "--mm-process-config")  # ValueError: the caller's, exit 2
    first = first_trainable(bundle)
    end = len(bundle) if limit is None else min(first + limit, len(bundle))
    return ReplayPlan(
        bundle=str(bundle.path),
        dtype=dtype,
        processor_settings=settings,
        # The engines' processor settings are resolved (and recorded) only in token space.
        token_space=recorded is not None,
        positions=tuple(range(first, end)),
        allow_outside_media=bool(allow_outside_media),
    )


def first_trainable(bundle: Bundle) -> int:
    """Where training data starts: a rollout checkpoint stores its in-flight (pending) groups first,
    which training never sees as they are (they are resubmitted on resume); a dump starts at 0."""
    from trainer_hooks.checkpoints import CHECKPOINT_KIND

    if bundle.kind != CHECKPOINT_KIND:
        return 0
    sizes = bundle.meta.get("pending_group_sizes") or []
    if not isinstance(sizes, list) or not all(type(n) is int and n >= 0 for n in sizes):
        raise BundleError(
            f"{bundle.path}: meta.pending_group_sizes: expected a list of counts, found {sizes!r}"
        )
    return min(sum(sizes), len(bundle))
