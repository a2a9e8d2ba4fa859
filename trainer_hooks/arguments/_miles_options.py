"""The options Miles defines (itself, through its training backend, or from SGLang's
``ServerArgs``), with Miles' type, default and choices: :func:`miles_options`.

They are added only where the parser lacks them, at parse time
(:func:`trainer_hooks.arguments.add_arguments`, :data:`~trainer_hooks.arguments.MILES_OPTIONS`);
kept here, apart from this project's own settings table, so that the two lists read apart.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["miles_options"]


def miles_options() -> list[tuple[str, dict[str, Any]]]:
    """Every option Miles defines that this package reads, in the order they are added."""
    return _miles_dump_options() + _miles_run_options() + _miles_engine_options()


def _miles_dump_options() -> list[tuple[str, dict[str, Any]]]:
    """Checkpoints and debug dumps: where they are saved and loaded."""
    return [
        ("--save", dict(type=str, default=None, help="Checkpoint directory.")),
        ("--load", dict(type=str, default=None, help="Checkpoint directory to resume from.")),
        (
            "--save-debug-rollout-data",
            dict(
                type=str,
                default=None,
                help="Path template with {rollout_id} for dumping each rollout's samples.",
            ),
        ),
        (
            "--save-debug-trajectory-data",
            dict(
                type=str,
                default=None,
                help="Path template with {rollout_id} for each rollout's trajectory JSONL (samples with "
                "metadata['messages']).",
            ),
        ),
        (
            "--load-debug-rollout-data",
            dict(
                type=str,
                default=None,
                help="Path template with {rollout_id} to replay dumped samples instead of running engines.",
            ),
        ),
        (
            "--load-debug-rollout-data-subsample",
            dict(
                type=float,
                default=None,
                help="Keep this fraction (0 <= r <= 1; 0 keeps every row, as in Miles) of the replayed samples.",
            ),
        ),
    ]


def _miles_run_options() -> list[tuple[str, dict[str, Any]]]:
    """The training run: its dtype and its rollout steps."""
    return [
        # Miles' FSDP backend defines --fp16 as a BooleanOptionalAction; Megatron's --bf16 is a flag.
        ("--fp16", dict(action=argparse.BooleanOptionalAction, default=False)),
        ("--bf16", dict(action="store_true", default=False)),
        (
            "--num-rollout",
            dict(type=int, default=None, help="Number of rollout steps (the reference drivers need it)."),
        ),
        ("--start-rollout-id", dict(type=int, default=None, help="The first rollout step (default 0).")),
        ("--rollout-batch-size", dict(type=int, required=True, help="Prompt groups per rollout step.")),
        ("--save-interval", dict(type=int, default=None, help="Save a checkpoint every N rollout steps.")),
        ("--update-weights-interval", dict(type=int, default=1)),
    ]


def _miles_engine_options() -> list[tuple[str, dict[str, Any]]]:
    """The rollout engines (SGLang's own options as Miles exposes them) and the reward key."""
    return [
        (
            "--sglang-config",
            dict(
                type=str,
                default=None,
                help="YAML: sglang: [{name, model_path, server_groups: [{worker_type, num_gpus, overrides: {...}}]}].",
            ),
        ),
        # SGLang's ServerArgs definitions (0.5.23: arg_groups/fields/mm.py), as Miles exposes them.
        (
            "--sglang-image-processor-backend",
            dict(type=str, choices=["auto", "torchvision", "pil"], default="auto"),
        ),
        ("--sglang-mm-process-config", dict(type=json.loads, default=None, help="JSON object.")),
        ("--rollout-external-engine-addrs", dict(type=str, nargs="+", default=None, metavar="HOST:PORT")),
        ("--custom-inference-engine-provider-path", dict(type=str, default=None)),
        ("--recompute-logprobs-via-prefill", dict(action="store_true", default=False)),
        (
            "--reward-key",
            dict(type=str, default=None, help="Key of the reward value when rewards are dicts."),
        ),
    ]
