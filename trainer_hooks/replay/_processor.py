"""The image processor a replay rebuilds with: :func:`load_processor`.

A bundle records the engines' processor settings in ``meta["processor"]`` (see
:mod:`trainer_hooks.arguments._processor`): ``model_path``, ``image_processor_backend``,
``mm_process_config`` (``{"image": {"max_pixels": ...}}`` as SGLang takes it, or flat) and,
when the model directory said so, ``image_token_id``. A replay on another machine must rebuild
the pixel values the training run would have built, so the processor is made from those settings:

1. ``model_path`` is a local model directory (or a model already in the local Hugging Face
   cache): its own ``preprocessor_config.json``, loaded with ``local_files_only``;
2. otherwise the Qwen2-VL-7B-Instruct hub ``preprocessor_config.json`` shipped in this package
   (``trainer_hooks/data/qwen2_vl_preprocessor_config.json``). Not the transformers class
   defaults: those cap an image at 1003520 pixels where the hub config allows 12845056, so a
   1920x1080 screenshot becomes 1222 vision tokens instead of the 2691 the model saw.

Then ``mm_process_config``'s ``min_pixels``/``max_pixels`` (and ``patch_size``, ``merge_size``,
``temporal_patch_size``) are applied. Nothing is ever downloaded.

Whatever cannot be honoured is *reported*, never dropped: a recorded setting the processor
actually built disagrees with (read back from the built object), a key of ``mm_process_config``
the processor does not have, a backend other than the one built (e.g. ``torchvision`` recorded,
PIL built because torchvision is not installed). :class:`ReplayProcessor` carries these in
``notes``; ``rollout-bundle replay`` prints them and writes them into its report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

__all__ = [
    "DEFAULT_IMAGE_TOKEN_ID",
    "SHIPPED_PREPROCESSOR_CONFIG",
    "ReplayProcessor",
    "load_processor",
    "shipped_preprocessor_config",
]

# Qwen2-VL's ``<|image_pad|>`` (config.json ``image_token_id``).
DEFAULT_IMAGE_TOKEN_ID = 151655
SHIPPED_PREPROCESSOR_CONFIG = "qwen2_vl_preprocessor_config.json"
# Settings of mm_process_config a Qwen2-VL image processor understands.
_TUNABLE = ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size")


def shipped_preprocessor_config() -> dict[str, Any]:
    """The Qwen2-VL-7B-Instruct hub ``preprocessor_config.json`` shipped with the package."""
    text = resources.files("trainer_hooks").joinpath(f"data/{SHIPPED_PREPROCESSOR_CONFIG}").read_text()
    config: dict[str, Any] = json.loads(text)
    return config


@dataclass
class ReplayProcessor:
    """A built image processor and what it was built from.

    Call it like the transformers processor it wraps (``proc(images=[...], return_tensors="pt")``).
    ``settings`` is JSON-ready: the values the built processor actually uses (read back from
    it), where its config came from, the placeholder id, the transformers version.
    ``disagreements`` lists every recorded setting that could not be honoured as recorded (a
    replay reports each as a ``processor`` problem); ``notes`` says where defaults came from.
    """

    image_processor: Any
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)

    @property
    def merge_size(self) -> int:
        return int(self.settings["merge_size"])

    @property
    def image_token_id(self) -> int:
        return int(self.settings["image_token_id"])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.image_processor(*args, **kwargs)


def _image_settings(
    mm_process_config: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], list[str], list[str]]:
    """The image part of ``mm_process_config`` (nested under ``"image"`` or flat), disagreements
    (image keys the processor does not have) and notes (other modalities' sections)."""
    if not mm_process_config:
        return {}, [], []
    notes = []
    problems = []
    if isinstance(mm_process_config.get("image"), Mapping):
        image = dict(mm_process_config["image"])
        where = "mm_process_config.image"
        for k in mm_process_config:
            if k != "image":
                notes.append(f"mm_process_config.{k}: not used to rebuild images (only 'image' settings are)")
    else:
        image = dict(mm_process_config)
        where = "mm_process_config"
    out = {}
    for k, v in image.items():
        if k in _TUNABLE:
            out[k] = v
        else:
            problems.append(
                f"{where}.{k} = {v!r}: not a setting the Qwen2-VL image processor has "
                f"(known: {', '.join(_TUNABLE)}); not applied"
            )
    return out, problems, notes


def _read_back(proc: Any) -> dict[str, Any]:
    """What a built Qwen2-VL image processor really uses, across transformers 4.x and 5.x."""
    size = getattr(proc, "size", None)

    def from_size(key: str) -> Any:
        if size is None:
            return None
        value = size.get(key) if isinstance(size, Mapping) else getattr(size, key, None)
        return value

    min_pixels = from_size("shortest_edge")
    max_pixels = from_size("longest_edge")
    if min_pixels is None:
        min_pixels = getattr(proc, "min_pixels", None)
    if max_pixels is None:
        max_pixels = getattr(proc, "max_pixels", None)
    return {
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "patch_size": getattr(proc, "patch_size", None),
        "temporal_patch_size": getattr(proc, "temporal_patch_size", None),
        "merge_size": getattr(proc, "merge_size", None),
        "image_mean": [float(x) for x in getattr(proc, "image_mean", None) or []],
        "image_std": [float(x) for x in getattr(proc, "image_std", None) or []],
    }


def _local_config(model_path: str) -> tuple[dict[str, Any], str] | None:
    """``preprocessor_config.json`` of a local model directory or of a model in the local hub
    cache; None when neither exists (nothing is downloaded)."""
    if os.path.isdir(model_path):
        path = os.path.join(model_path, "preprocessor_config.json")
        if os.path.isfile(path):
            with open(path) as f:
                return json.load(f), path
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return None
    try:
        cached = try_to_load_from_cache(model_path, "preprocessor_config.json")
    except Exception:  # an id that is not a valid repo name: nothing cached under it
        return None
    if isinstance(cached, str) and os.path.isfile(cached):
        with open(cached) as f:
            return json.load(f), cached
    return None


def _model_image_token_id(model_path: str | None) -> int | None:
    if model_path and os.path.isfile(os.path.join(model_path, "config.json")):
        try:
            with open(os.path.join(model_path, "config.json")) as f:
                value = json.load(f).get("image_token_id")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, int) else None
    return None


def _processor_class() -> tuple[type, str]:
    import transformers

    # transformers 5 without torchvision builds the PIL backend anyway (with a warning); asking
    # for it by name says so. transformers 4.x has one (numpy/PIL) class.
    cls = getattr(transformers, "Qwen2VLImageProcessorPil", None)
    if cls is not None:
        return cls, "pil"
    return transformers.Qwen2VLImageProcessor, "pil"


def load_processor(settings: Mapping[str, Any] | None = None) -> ReplayProcessor:
    """Build the Qwen2-VL image processor a bundle's ``meta["processor"]`` describes, offline.

    Args:
        settings: ``meta["processor"]`` of a bundle (``model_path``, ``image_processor_backend``,
            ``mm_process_config``, optional ``image_token_id``), or None for the shipped hub
            config with nothing overridden.

    Returns:
        A :class:`ReplayProcessor`; its ``disagreements`` name every recorded setting that the
        built processor does not follow as recorded.

    Raises:
        ValueError: ``settings`` is not a mapping, or ``mm_process_config`` is not an object.
        ImportError: transformers is not installed (``pip install 'rollout-bundles[replay]'``).
    """
    from trainer_hooks.arguments import parse_mm_process_config

    if settings is not None and not isinstance(settings, Mapping):
        raise ValueError(
            f"load_processor: settings: expected a mapping (meta['processor']), found {settings!r}"
        )
    settings = dict(settings or {})
    notes: list[str] = []
    disagreements: list[str] = []
    model_path = settings.get("model_path")
    mm = parse_mm_process_config(settings.get("mm_process_config"), where="processor.mm_process_config")
    wanted, mm_problems, mm_notes = _image_settings(mm)
    disagreements.extend(mm_problems)
    notes.extend(mm_notes)

    local = _local_config(model_path) if isinstance(model_path, str) and model_path else None
    if local is not None:
        config, source = local
    else:
        config, source = shipped_preprocessor_config(), f"shipped:{SHIPPED_PREPROCESSOR_CONFIG}"
        if model_path:
            notes.append(
                f"model_path {model_path!r}: no local model directory or cached preprocessor_config.json; "
                f"built from the shipped Qwen2-VL-7B-Instruct hub config (right for the Qwen2-VL family: "
                f"Qwen2-VL, Qwen2.5-VL)"
            )
    kwargs = {k: v for k, v in config.items() if k not in ("image_processor_type", "processor_class")}
    # Hub configs of transformers 4.x carry both min/max_pixels and size; min/max_pixels win there.
    if "min_pixels" in kwargs or "max_pixels" in kwargs:
        kwargs.pop("size", None)
    kwargs.update(wanted)
    if "min_pixels" in wanted or "max_pixels" in wanted:
        kwargs.pop("size", None)

    cls, backend = _processor_class()
    try:
        proc = cls(**kwargs)
    except TypeError as e:
        raise ValueError(
            f"load_processor: {source}: {cls.__name__} refused the settings {kwargs}: {e}"
        ) from None

    built = _read_back(proc)
    for key, value in wanted.items():
        if built.get(key) != value:
            disagreements.append(
                f"mm_process_config {key}: recorded {value!r}, but the built processor uses {built.get(key)!r}"
            )
    for key in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size"):
        if key in config and key not in wanted and built.get(key) != config[key]:
            disagreements.append(
                f"{source} {key}: the config says {config[key]!r}, the built processor uses {built[key]!r}"
            )
    recorded_backend = settings.get("image_processor_backend")
    if recorded_backend not in (None, backend):
        disagreements.append(
            f"image_processor_backend: recorded {recorded_backend!r}, built the {backend!r} backend "
            f"({cls.__name__}); pixel values can differ in the last bits"
        )
    token_id = settings.get("image_token_id")
    token_source = "recorded"
    if token_id is None:
        token_id = _model_image_token_id(model_path if isinstance(model_path, str) else None)
        token_source = "model config.json"
    if token_id is None:
        token_id, token_source = DEFAULT_IMAGE_TOKEN_ID, "default (Qwen2-VL <|image_pad|>)"
    import transformers

    used = {
        "source": source,
        "model_path": model_path,
        "image_processor_backend": backend,
        "recorded_image_processor_backend": recorded_backend,
        "mm_process_config": mm,
        "class": cls.__name__,
        "transformers": transformers.__version__,
        **built,
        "image_token_id": int(token_id),
        "image_token_id_source": token_source,
        "notes": notes,
        "disagreements": disagreements,
    }
    return ReplayProcessor(image_processor=proc, settings=used, notes=notes, disagreements=disagreements)
