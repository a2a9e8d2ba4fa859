"""The image processor a replay rebuilds with: :func:`load_processor`, by model family, checked.

A bundle records the engines' processor settings in ``meta["processor"]`` (see
:mod:`trainer_hooks.arguments._processor`): ``model_path``, ``image_processor_backend``,
``mm_process_config`` (``{"image": {"max_pixels": ...}}`` as SGLang takes it, or flat) and,
when the model directory said so, ``image_token_id``. Only token-space runs record them
(``--enable-token-space-processor``); a bundle whose ``processor`` is null says nothing about its
model, and a replay says so as a named problem (:mod:`trainer_hooks.replay._report`).

**Family.** The processor is picked by the recorded model's family (:data:`FAMILIES`):
Qwen2-VL, Qwen2.5-VL and Qwen3-VL, all of which use transformers' ``Qwen2VLImageProcessor``
with their own hub ``preprocessor_config.json`` (Qwen3-VL: 16-pixel patches, ``size`` bounds,
0.5 mean/std). The family comes from the local model directory's ``config.json``
``model_type`` or ``preprocessor_config.json`` ``processor_class``, else from the model id
(``Qwen/Qwen2.5-VL-7B-Instruct``). Any other family (Gemma, LLaVA, ...) is refused in one line
naming it, rather than rebuilt with a Qwen processor into nonsense token counts.

**Config.** 1. ``model_path`` a local model directory (or a model in the local Hugging Face
cache): its own ``preprocessor_config.json`` (a regular file of at most 1 MiB, opened without
blocking); 2. otherwise the family's hub config shipped in ``trainer_hooks/data/`` (sources in
``trainer_hooks/data/README.md``). Not the transformers class defaults: those cap an image at
1003520 pixels where the Qwen2-VL hub config allows 12845056, so a 1920x1080 screenshot becomes
1222 vision tokens instead of the 2691 the model saw. Then ``mm_process_config``'s
``min_pixels``/``max_pixels`` (and ``patch_size``, ``merge_size``, ``temporal_patch_size``) are
applied. Nothing is ever downloaded.

**Checked before use** (:func:`check_image_settings`): a bundle may come from anyone, and these
numbers size every allocation of the rebuild. Sizes are ints (an integral float is taken as its
int), ``patch_size`` 1..:data:`MAX_PATCH_SIZE`, ``merge_size`` and ``temporal_patch_size``
1..:data:`MAX_MERGE_SIZE`, ``0 <= min_pixels <= max_pixels <= MAX_REPLAY_PIXELS``;
``image_mean``/``image_std`` three finite numbers, no zero std. A value outside is refused naming
its key path, before transformers sees it (``patch_size: 0`` was a ``ZeroDivisionError``,
``temporal_patch_size: 0`` rebuilt every image as a ``[16, 0]`` tensor and reported "problems:
none", ``min_pixels: 4e8`` allocated ~9 GiB).

Whatever cannot be honoured is *reported*, never dropped: a recorded setting the processor
actually built disagrees with (read back from the built object), a key of ``mm_process_config``
the processor does not have, a backend other than the one built (e.g. ``torchvision`` recorded,
PIL built because torchvision is not installed). :class:`ReplayProcessor` carries these in
``disagreements``; ``rollout-bundle replay`` prints them and writes them into its report.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from trainer_hooks.replay._media import check_small_file

__all__ = [
    "DEFAULT_IMAGE_TOKEN_ID",
    "FAMILIES",
    "MAX_MERGE_SIZE",
    "MAX_PATCH_SIZE",
    "MAX_REPLAY_PIXELS",
    "SHIPPED_PREPROCESSOR_CONFIG",
    "Family",
    "ReplayProcessor",
    "check_image_settings",
    "load_processor",
    "model_family",
    "resolve_processor",
    "shipped_preprocessor_config",
]

# ``<|image_pad|>`` of Qwen2-VL, Qwen2.5-VL and Qwen3-VL alike (config.json ``image_token_id``).
DEFAULT_IMAGE_TOKEN_ID = 151655
#: Largest ``min_pixels``/``max_pixels`` a replay accepts: twice the largest shipped hub config
#: (Qwen3-VL's 16777216), so ~0.8 GB of float32 pixel values for one image at most.
MAX_REPLAY_PIXELS = 1 << 25
#: Largest ``patch_size`` (Qwen2-VL: 14, Qwen3-VL: 16).
MAX_PATCH_SIZE = 128
#: Largest ``merge_size`` and ``temporal_patch_size`` (both 2 in every Qwen-VL config).
MAX_MERGE_SIZE = 16
_MAX_CONFIG_BYTES = 1 << 20
# Settings of mm_process_config a Qwen2-VL image processor understands.
_TUNABLE = ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size")
_IMAGE_PROCESSOR_TYPES = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")


@dataclass(frozen=True)
class Family:
    """A model family replay can rebuild for: its name, its shipped hub config, and how it is recognised."""

    key: str
    name: str
    config_file: str
    hub_model: str
    model_types: tuple[str, ...]
    processor_classes: tuple[str, ...]
    id_pattern: str


FAMILIES: dict[str, Family] = {
    f.key: f
    for f in (
        # Checked in this order: "qwen2.5-vl" must not be taken for "qwen2-vl".
        Family("qwen2_5_vl", "Qwen2.5-VL", "qwen2_5_vl_preprocessor_config.json", "Qwen/Qwen2.5-VL-7B-Instruct",
               ("qwen2_5_vl",), ("Qwen2_5_VLProcessor",), r"qwen2[._-]?5[._-]?vl"),
        Family("qwen3_vl", "Qwen3-VL", "qwen3_vl_preprocessor_config.json", "Qwen/Qwen3-VL-8B-Instruct",
               ("qwen3_vl", "qwen3_vl_moe"), ("Qwen3VLProcessor",), r"qwen3[._-]?vl"),
        Family("qwen2_vl", "Qwen2-VL", "qwen2_vl_preprocessor_config.json", "Qwen/Qwen2-VL-7B-Instruct",
               ("qwen2_vl",), ("Qwen2VLProcessor",), r"qwen2[._-]?vl"),
    )
}  # fmt: skip
DEFAULT_FAMILY = "qwen2_vl"
SHIPPED_PREPROCESSOR_CONFIG = FAMILIES[DEFAULT_FAMILY].config_file
_KNOWN = ", ".join(f.name for f in FAMILIES.values())


def shipped_preprocessor_config(family: str = DEFAULT_FAMILY) -> dict[str, Any]:
    """The hub ``preprocessor_config.json`` of ``family`` shipped with the package (default Qwen2-VL-7B-Instruct)."""
    name = FAMILIES[family].config_file
    text = resources.files("trainer_hooks").joinpath(f"data/{name}").read_text()
    config: dict[str, Any] = json.loads(text)
    return config


def model_family(
    model_path: Any,
    *,
    model_config: Mapping[str, Any] | None = None,
    preprocessor: Mapping[str, Any] | None = None,
) -> str:
    """The :data:`FAMILIES` key of a model, from its ``config.json`` ``model_type``, its
    ``preprocessor_config.json`` ``processor_class``, else its id or directory name.

    Raises:
        ValueError: the family is none replay knows, naming the model and what said so.
    """
    model_type = (model_config or {}).get("model_type")
    if model_type is not None:
        for f in FAMILIES.values():
            if model_type in f.model_types:
                return f.key
        raise ValueError(
            f"model {model_path!r}: config.json model_type {str(model_type)[:80]!r} is not a family replay "
            f"can rebuild ({_KNOWN})"
        )
    if preprocessor is not None:
        kind = preprocessor.get("image_processor_type")
        if kind is not None and kind not in _IMAGE_PROCESSOR_TYPES:
            raise ValueError(
                f"model {model_path!r}: preprocessor_config.json image_processor_type {str(kind)[:80]!r} is not "
                f"a family replay can rebuild ({_KNOWN})"
            )
        cls = preprocessor.get("processor_class")
        for f in FAMILIES.values():
            if cls in f.processor_classes:
                return f.key
    name = str(model_path).rstrip("/").lower()
    tail = "/".join(name.split("/")[-2:])  # "Qwen/Qwen2.5-VL-7B-Instruct", or a directory's last parts
    for f in FAMILIES.values():
        if re.search(f.id_pattern, tail):
            return f.key
    raise ValueError(
        f"model {str(model_path)[:200]!r}: not a model family replay can rebuild ({_KNOWN}); "
        "its image processor is unknown here"
    )


def _as_size(key: str, value: Any, low: int, high: int, where: str) -> int:
    """``value`` as an int in ``low..high`` (an integral float as its int), else ValueError naming it."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if ok and isinstance(value, float):
        ok = math.isfinite(value) and value == int(value)
    if not ok or not low <= value <= high:
        raise ValueError(f"{where}.{key}: expected an int in {low}..{high}, found {repr(value)[:80]}")
    return int(value)


def check_image_settings(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` (image processor settings) checked against the processor's own constraints;
    sizes as ints. Keys other than those checked pass through unchanged.

    Raises:
        ValueError: naming ``where``, the key, the allowed range and the value found.
    """
    out = dict(values)
    limits = {
        "patch_size": (1, MAX_PATCH_SIZE),
        "merge_size": (1, MAX_MERGE_SIZE),
        "temporal_patch_size": (1, MAX_MERGE_SIZE),
        "min_pixels": (0, MAX_REPLAY_PIXELS),
        "max_pixels": (1, MAX_REPLAY_PIXELS),
    }
    for key, (low, high) in limits.items():
        if key in out:
            out[key] = _as_size(key, out[key], low, high, where)
    size = out.get("size")
    if size is not None:
        if not isinstance(size, Mapping):
            raise ValueError(
                f"{where}.size: expected an object with shortest_edge/longest_edge, found {size!r}"
            )
        size = dict(size)
        for key, low in (("shortest_edge", 0), ("longest_edge", 1)):
            if key in size:
                size[key] = _as_size(key, size[key], low, MAX_REPLAY_PIXELS, f"{where}.size")
        out["size"] = size
    least = out.get("min_pixels", (size or {}).get("shortest_edge"))
    most = out.get("max_pixels", (size or {}).get("longest_edge"))
    if isinstance(least, int) and isinstance(most, int) and least > most:
        raise ValueError(f"{where}: min_pixels {least} is above max_pixels {most}")
    for key in ("image_mean", "image_std"):
        if key in out:
            v = out[key]
            ok = (
                isinstance(v, (list, tuple))
                and len(v) == 3
                and all(
                    not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in v
                )
            )
            if not ok or (key == "image_std" and any(x == 0 for x in v)):
                raise ValueError(
                    f"{where}.{key}: expected three finite numbers{' (none 0)' if key == 'image_std' else ''}, found {v!r}"[
                        :300
                    ]
                )
    return out


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
                f"{where}.{k} = {repr(v)[:80]}: not a setting the Qwen2-VL image processor has "
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


def _read_json_file(path: str) -> dict[str, Any] | None:
    """A small JSON object file, or None when absent; never blocks on a FIFO, never reads a device.

    Raises:
        ValueError: not a regular file, over 1 MiB, not a JSON object, unreadable.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        check_small_file(fd, path, _MAX_CONFIG_BYTES, limit_of=" of a config file")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(_MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not valid JSON: {str(e)[:200]}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _local_config(model_path: str) -> tuple[dict[str, Any], str, dict[str, Any] | None] | None:
    """``(preprocessor_config.json, its path, config.json or None)`` of a local model directory
    or of a model in the local hub cache; None when neither exists (nothing is downloaded)."""
    if os.path.isdir(model_path):
        path = os.path.join(model_path, "preprocessor_config.json")
        config = _read_json_file(path)
        if config is None:
            return None
        return config, path, _read_json_file(os.path.join(model_path, "config.json"))
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return None
    try:
        cached = try_to_load_from_cache(model_path, "preprocessor_config.json")
        cached_model = try_to_load_from_cache(model_path, "config.json")
    except Exception:  # an id that is not a valid repo name: nothing cached under it
        return None
    if isinstance(cached, str) and os.path.isfile(cached):
        config = _read_json_file(cached)
        if config is None:
            return None
        model = _read_json_file(cached_model) if isinstance(cached_model, str) else None
        return config, cached, model
    return None


def _processor_class() -> tuple[type, str]:
    import transformers

    # transformers 5 without torchvision builds the PIL backend anyway (with a warning); asking
    # for it by name says so. transformers 4.x has one (numpy/PIL) class.
    cls = getattr(transformers, "Qwen2VLImageProcessorPil", None)
    if cls is not None:
        return cls, "pil"
    return transformers.Qwen2VLImageProcessor, "pil"


@dataclass
class ProcessorSpec:
    """What :func:`load_processor` builds, decided and checked without transformers."""

    family: str
    config: dict[str, Any]
    source: str
    kwargs: dict[str, Any]
    wanted: dict[str, Any]
    mm: dict[str, Any] | None
    model_config: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)


def resolve_processor(settings: Mapping[str, Any] | None, where: str = "processor") -> ProcessorSpec:
    """Decide the family, the config and the settings a processor is built with, all checked.

    Raises:
        ValueError: ``settings`` is not a mapping, ``mm_process_config`` not an object, a setting
            outside its bounds (:func:`check_image_settings`) or a family replay does not know,
            each naming ``where`` and the key.
    """
    from trainer_hooks.arguments import parse_mm_process_config

    if settings is not None and not isinstance(settings, Mapping):
        raise ValueError(f"{where}: expected a mapping (meta['processor']), found {str(settings)[:200]!r}")
    settings = dict(settings or {})
    model_path = settings.get("model_path")
    if model_path is not None and not isinstance(model_path, str):
        raise ValueError(f"{where}.model_path: expected a string or null, found {str(model_path)[:200]!r}")
    mm = parse_mm_process_config(settings.get("mm_process_config"), where=f"{where}.mm_process_config")
    wanted, disagreements, notes = _image_settings(mm)
    image_where = f"{where}.mm_process_config" + (
        ".image" if mm and isinstance(mm.get("image"), Mapping) else ""
    )
    wanted = check_image_settings(wanted, image_where)
    spec = ProcessorSpec(DEFAULT_FAMILY, {}, "", {}, wanted, mm, None, notes, disagreements)
    _choose_config(spec, model_path, bool(settings), where)
    spec.kwargs = _processor_kwargs(spec.config, wanted)
    check_image_settings(spec.kwargs, f"{where} (recorded settings over {spec.source})")
    return spec


def _choose_config(spec: ProcessorSpec, model_path: str | None, recorded: bool, where: str) -> None:
    """Fill ``spec``'s family, config, source and model config: the local model directory's
    (or cached) config when ``model_path`` names one, else the family's shipped hub config, with a
    note (a model named but not found) or a disagreement (settings ``recorded`` without a model)."""
    local = None
    if model_path:
        try:  # what model_path names: a local config, else a family known by the model's name
            local = _local_config(model_path)
            if local is None:
                spec.family = model_family(model_path)
        except ValueError as e:
            raise ValueError(f"{where}.model_path: {e}") from None
    if local is not None:
        config, spec.source, spec.model_config = local
        spec.family = model_family(model_path, model_config=spec.model_config, preprocessor=config)
        # Saved configs may write an unset setting as null: the class default applies to it.
        spec.config = check_image_settings({k: v for k, v in config.items() if v is not None}, spec.source)
        return
    family = FAMILIES[spec.family]
    if model_path:
        spec.notes.append(
            f"model_path {model_path!r}: no local model directory or cached preprocessor_config.json; "
            f"built from the shipped {family.hub_model} hub config (the {family.name} family)"
        )
    elif recorded:
        spec.disagreements.append(
            f"{where}.model_path: not recorded; assumed the {family.name} family "
            f"(the shipped {family.hub_model} hub config)"
        )
    spec.config = shipped_preprocessor_config(spec.family)
    spec.source = f"shipped:{family.config_file}"


def _processor_kwargs(config: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The processor class's keyword arguments: ``config`` with the ``wanted`` settings over it."""
    kwargs = {k: v for k, v in config.items() if k not in ("image_processor_type", "processor_class")}
    # Hub configs of transformers 4.x carry both min/max_pixels and size; min/max_pixels win there.
    if "min_pixels" in kwargs or "max_pixels" in kwargs:
        kwargs.pop("size", None)
    if ("min_pixels" in wanted or "max_pixels" in wanted) and "size" in kwargs:
        # A size-style config (Qwen3-VL): carry its other bound over as min/max_pixels.
        size = kwargs.pop("size") or {}
        if "shortest_edge" in size:
            kwargs.setdefault("min_pixels", size["shortest_edge"])
        if "longest_edge" in size:
            kwargs.setdefault("max_pixels", size["longest_edge"])
    kwargs.update(wanted)
    return kwargs


def _model_image_token_id(model_config: Mapping[str, Any] | None) -> int | None:
    value = (model_config or {}).get("image_token_id")
    return value if type(value) is int and value >= 0 else None


def _unhonoured(spec: ProcessorSpec, built: Mapping[str, Any]) -> list[str]:
    """The settings (recorded, or of the config) that the built processor does not use."""
    out = []
    for key, value in spec.wanted.items():
        if built.get(key) != value:
            out.append(
                f"mm_process_config {key}: recorded {value!r}, but the built processor uses {built.get(key)!r}"
            )
    config = spec.config
    for key in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size"):
        if key in config and key not in spec.wanted and built.get(key) != config[key]:
            out.append(
                f"{spec.source} {key}: the config says {config[key]!r}, the built processor uses {built[key]!r}"
            )
    return out


def _image_token(settings: Mapping[str, Any], spec: ProcessorSpec) -> tuple[Any, str]:
    """The placeholder id and where it came from: recorded, the model's config.json, the default."""
    token_id = settings.get("image_token_id")
    if token_id is not None:
        return token_id, "recorded"
    token_id = _model_image_token_id(spec.model_config)
    if token_id is not None:
        return token_id, "model config.json"
    return DEFAULT_IMAGE_TOKEN_ID, f"default ({FAMILIES[spec.family].name} <|image_pad|>)"


def load_processor(settings: Mapping[str, Any] | None = None) -> ReplayProcessor:
    """Build the image processor a bundle's ``meta["processor"]`` describes, offline.

    Args:
        settings: ``meta["processor"]`` of a bundle (``model_path``, ``image_processor_backend``,
            ``mm_process_config``, optional ``image_token_id``), or None for the shipped
            Qwen2-VL hub config with nothing overridden.

    Returns:
        A :class:`ReplayProcessor`; its ``disagreements`` name every recorded setting that the
        built processor does not follow as recorded.

    Raises:
        ValueError: see :func:`resolve_processor` (bad settings, an unknown model family).
        ImportError: transformers is not installed (``pip install 'rollout-bundles[replay]'``).
    """
    spec = resolve_processor(settings, "load_processor: processor")
    settings = dict(settings or {})
    model_path = settings.get("model_path")
    cls, backend = _processor_class()
    try:
        proc = cls(**spec.kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"load_processor: {spec.source}: {cls.__name__} refused the settings {spec.kwargs}: {e}"
        ) from None

    built = _read_back(proc)
    disagreements = spec.disagreements
    disagreements.extend(_unhonoured(spec, built))
    recorded_backend = settings.get("image_processor_backend")
    if recorded_backend not in (None, backend):
        disagreements.append(
            f"image_processor_backend: recorded {str(recorded_backend)[:80]!r}, built the {backend!r} backend "
            f"({cls.__name__}); pixel values can differ in the last bits"
        )
    token_id, token_source = _image_token(settings, spec)
    import transformers

    used = {
        "source": spec.source,
        "family": spec.family,
        "model_path": model_path,
        "image_processor_backend": backend,
        "recorded_image_processor_backend": recorded_backend,
        "mm_process_config": spec.mm,
        "class": cls.__name__,
        "transformers": transformers.__version__,
        **built,
        "image_token_id": int(token_id),
        "image_token_id_source": token_source,
        "notes": spec.notes,
        "disagreements": disagreements,
    }
    return ReplayProcessor(image_processor=proc, settings=used, notes=spec.notes, disagreements=disagreements)
