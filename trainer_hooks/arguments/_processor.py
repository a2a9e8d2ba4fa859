"""The processor settings every rollout engine must share: :class:`RolloutEngineProcessorArgs`.

With ``--enable-token-space-processor`` the trainer turns images into pixel values and token
ids itself, with the engines' image processor; an engine group configured with another model,
processor backend or ``mm_process_config`` would see tokens that don't match its own
processing. Before this check, the disagreement surfaced when the first training step read
the samples, after a whole rollout round. Now it fails while parsing arguments.

Resolution, per engine group, for each of ``model_path``, ``image_processor_backend`` and
``mm_process_config`` (SGLang ``ServerArgs`` field names, as in the YAML ``overrides``):

1. the group's ``overrides[field]``, else
2. the model entry's ``field`` in ``--sglang-config``, else
3. the base value ``--sglang-<field>`` (for ``model_path``, falling back to Miles'
   ``args.hf_checkpoint`` when that exists).

Placeholder groups run no engine and are skipped. Every other group of every model must
agree: a reward or reference model served through SGLang receives the same token-space
inputs. Values compare exactly (``mm_process_config`` as parsed JSON, so key order and
spacing don't matter; paths as strings, so ``./m`` and ``m`` disagree: a false alarm at
launch is cheap, a silent mismatch is not).

The resolved settings are stored on ``args.rollout_processor_args``; bundles record
:meth:`RolloutEngineProcessorArgs.to_dict` in their metadata (``meta["processor"]``, with the
model's ``image_token_id`` when its directory is local) so that replay rebuilds inputs with the
engines' own processor and counts the right placeholder (:mod:`trainer_hooks.replay`).
"""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["PROCESSOR_FIELDS", "RolloutEngineProcessorArgs", "load_sglang_config", "parse_mm_process_config"]

PROCESSOR_FIELDS = ("model_path", "image_processor_backend", "mm_process_config")
IMPLICIT_GROUP = "default (base --sglang-* options, no --sglang-config)"


def parse_mm_process_config(value: Any, *, where: str) -> dict[str, Any] | None:
    """``None``, a mapping, or a JSON object string → a dict; anything else is a ValueError naming ``where``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{where}: expected a JSON object, found {value!r} ({e})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a JSON object, found {type(value).__name__} {value!r}")
    return dict(value)


def load_sglang_config(path: str | Path) -> list[dict[str, Any]]:
    """The list of model entries of a ``--sglang-config`` YAML file, with its shape checked."""
    where = f"--sglang-config {path}"
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"{where}: cannot read it: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML: {e}") from None
    models = doc.get("sglang", doc.get("models")) if isinstance(doc, dict) else None
    if not isinstance(models, list):
        raise ValueError(
            f"{where}: expected a mapping with a list under 'sglang', found {type(doc).__name__}"
        )
    for i, model in enumerate(models):
        if not isinstance(model, dict) or not isinstance(model.get("name"), str):
            raise ValueError(
                f"{where}: sglang[{i}]: expected a mapping with a string 'name', found {model!r}"
            )
        groups = model.get("server_groups", model.get("engine_groups", []))
        if groups is None:
            groups = []
        if not isinstance(groups, list):
            raise ValueError(f"{where}: sglang[{i}].server_groups: expected a list, found {groups!r}")
        for j, group in enumerate(groups):
            if not isinstance(group, dict):
                raise ValueError(
                    f"{where}: sglang[{i}].server_groups[{j}]: expected a mapping, found {group!r}"
                )
            overrides = group.get("overrides") or {}
            if not isinstance(overrides, dict):
                raise ValueError(
                    f"{where}: sglang[{i}].server_groups[{j}].overrides: expected a mapping, found {overrides!r}"
                )
    return models


@dataclass(frozen=True)
class RolloutEngineProcessorArgs:
    """Processor settings shared by every rollout engine, resolved at parse time."""

    model_path: str | None
    image_processor_backend: str | None
    mm_process_config: dict[str, Any] | None = field(default=None, hash=False)
    # Labels of the engine groups that were checked (and agree); not part of equality.
    engine_groups: tuple[str, ...] = field(default=(), compare=False)
    # The image placeholder id (``image_token_id`` of the model's config.json) when the model is a
    # local directory; replay counts these tokens per image (None: Qwen2-VL's 151655).
    image_token_id: int | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for bundle metadata."""
        return {
            "model_path": self.model_path,
            "image_processor_backend": self.image_processor_backend,
            "mm_process_config": None if self.mm_process_config is None else dict(self.mm_process_config),
            "engine_groups": list(self.engine_groups),
            "image_token_id": self.image_token_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutEngineProcessorArgs:
        missing = [k for k in PROCESSOR_FIELDS if k not in data]
        if missing:
            raise ValueError(
                f"RolloutEngineProcessorArgs.from_dict: missing keys {missing}; found {sorted(data)}"
            )
        return cls(
            model_path=data["model_path"],
            image_processor_backend=data["image_processor_backend"],
            mm_process_config=parse_mm_process_config(data["mm_process_config"], where="mm_process_config"),
            engine_groups=tuple(data.get("engine_groups", ())),
            image_token_id=data.get("image_token_id"),
        )

    @classmethod
    def from_sglang_config(cls, args: Namespace) -> RolloutEngineProcessorArgs:
        """Resolve every engine group's processor settings and require them to agree.

        Raises:
            ValueError: naming the field and each disagreeing group with its value and where
                the value came from.
        """
        base_model_path = getattr(args, "sglang_model_path", None)
        if base_model_path is None:
            base_model_path = getattr(args, "hf_checkpoint", None)
        base: _Resolved = {
            "model_path": (base_model_path, "--sglang-model-path"),
            "image_processor_backend": (
                getattr(args, "sglang_image_processor_backend", None),
                "--sglang-image-processor-backend",
            ),
            "mm_process_config": (
                parse_mm_process_config(
                    getattr(args, "sglang_mm_process_config", None), where="--sglang-mm-process-config"
                ),
                "--sglang-mm-process-config",
            ),
        }
        config_path = getattr(args, "sglang_config", None)
        groups = _engine_groups(base, config_path)
        where = f"--sglang-config {config_path}" if config_path is not None else "--sglang-* options"
        agreed = {f: _agreed(f, groups, where) for f in PROCESSOR_FIELDS}
        return cls(
            model_path=agreed["model_path"],
            image_processor_backend=agreed["image_processor_backend"],
            mm_process_config=agreed["mm_process_config"],
            engine_groups=tuple(groups),
            image_token_id=_image_token_id(agreed["model_path"]),
        )


_Resolved = dict[str, tuple[Any, str]]  # field -> (value, where the value came from)


def _engine_groups(base: _Resolved, config_path: str | None) -> dict[str, _Resolved]:
    """Every engine group that runs engines, by label, with its processor fields resolved: the
    command line's, then the model's in ``--sglang-config``, then the group's overrides."""
    if config_path is None:
        return {IMPLICIT_GROUP: dict(base)}
    groups: dict[str, _Resolved] = {}
    for i, model in enumerate(load_sglang_config(config_path)):
        name = model["name"]
        model_level = {
            f: (model[f], f"sglang[{i}].{f}") for f in PROCESSOR_FIELDS if model.get(f) is not None
        }
        raw_groups = model.get("server_groups", model.get("engine_groups")) or [{}]
        for j, group in enumerate(raw_groups):
            worker_type = group.get("worker_type", "regular")
            if worker_type == "placeholder":
                continue
            overrides = group.get("overrides") or {}
            resolved = dict(base)
            resolved.update(model_level)
            for f in PROCESSOR_FIELDS:
                if overrides.get(f) is not None:
                    resolved[f] = (overrides[f], f"sglang[{i}].server_groups[{j}].overrides.{f}")
            label = (
                f"{name}.server_groups[{j}] ({worker_type})"
                if "server_groups" in model or "engine_groups" in model
                else name
            )
            groups[label] = resolved
    if not groups:
        raise ValueError(
            f"--sglang-config {config_path}: no engine group runs engines (all are placeholders)"
        )
    return groups


def _agreed(f: str, groups: dict[str, _Resolved], where: str) -> Any:
    """The one value of field ``f`` every group has; ValueError naming each group otherwise."""
    values = {}
    for label, resolved in groups.items():
        value, source = resolved[f]
        if f == "mm_process_config":
            value = parse_mm_process_config(value, where=f"{where}: {source}")
        elif value is not None and not isinstance(value, str):
            raise ValueError(f"{where}: {source}: expected a string, found {type(value).__name__} {value!r}")
        values[label] = (value, source)
    distinct = {_canonical(v) for v, _ in values.values()}
    if len(distinct) > 1:
        shown = "; ".join(f"{label} = {v!r} (from {src})" for label, (v, src) in values.items())
        raise ValueError(
            f"{where}: rollout engine groups disagree on {f}, which every engine must share with "
            f"--enable-token-space-processor: {shown}"
        )
    return next(iter(values.values()))[0]


def _image_token_id(model_path: str | None) -> int | None:
    """``image_token_id`` from ``<model_path>/config.json`` when that is a readable local file."""
    if not model_path:
        return None
    try:
        with open(Path(model_path) / "config.json") as f:
            value = json.load(f).get("image_token_id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if type(value) is int else None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
