"""``Sample``, ``AdapterRef`` and ``RewardSpec`` at parity with Miles' ``miles.utils.types``.

For users without Miles installed: the same fields in the same order with the same defaults, the
same ``Status`` values, the nested ``SpecInfo`` / ``PrefixCacheInfo`` records and the methods
Miles code calls on loaded samples. Where Miles is importable, loaders build *its* class instead
(see :func:`trainer_hooks.default_sample_cls`): Miles compares ``sample.status ==
Sample.Status.TRUNCATED`` against its own enum, which a sample of this class would never equal.

Compatibility contract (what bundles and debug dumps rely on):

* ``to_dict()`` is a shallow copy of the instance's ``__dict__`` (fields *and* attributes set
  later) with ``status`` replaced by its string value and ``spec_info`` / ``prefix_cache_info``
  by plain dicts; tensors, arrays, media references and the frozen ``adapter`` / ``reward_spec``
  records pass through unchanged, uncopied.
* ``from_dict(d)`` requires ``status`` (``KeyError`` otherwise, ``ValueError`` for an unknown
  value); it rebuilds ``SpecInfo`` / ``PrefixCacheInfo`` from their dicts (missing keys read 0);
  keys that are fields go to the constructor, every other key becomes an attribute, so a dump
  written by a Miles version with more fields loads and writes back without losing them. The
  input dict is not modified.
* ``reset_for_retry()`` follows Miles: identity and prompt fields stay, generated outputs go
  back to their defaults, and ``status`` becomes ``ABORTED``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, ClassVar, TypeVar

from bundles import register_record_type

__all__ = [
    "RECORD_NAMES",
    "AdapterRef",
    "RewardSpec",
    "Sample",
    "default_sample_cls",
    "register_record_types",
    "resolve_sample_cls",
]


@dataclass(frozen=True)
class AdapterRef:
    """Which LoRA adapter a sample trains and infers with (``slot`` routes training, ``name`` is
    the engine's ``lora_path``)."""

    name: str
    slot: int


@dataclass(frozen=True)
class RewardSpec:
    """How a sample's response is scored, when it differs from the run's default reward model."""

    rm_type: str | None = None
    custom_rm_path: str | None = None


def _counter(data: Any, key: str) -> Any:
    return data.get(key, 0)


_C = TypeVar("_C", bound="_Counters")


@dataclass
class _Counters:
    """Counters summed over a sample's generation calls (``Sample.SpecInfo``,
    ``Sample.PrefixCacheInfo``). Each field adds up the engine's ``meta_info`` key of its own
    name, or the one ``_ENGINE_KEYS`` gives it; a dict holds them by field name (missing ones
    read 0)."""

    _ENGINE_KEYS: ClassVar[dict[str, str]] = {}

    def add(self, meta_info: dict[str, Any]) -> None:
        for f in fields(self):
            key = self._ENGINE_KEYS.get(f.name, f.name)
            setattr(self, f.name, getattr(self, f.name) + _counter(meta_info, key))

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls: type[_C], data: dict[str, Any]) -> _C:
        return cls(**{f.name: _counter(data, f.name) for f in fields(cls)})


@dataclass
class Sample:
    """One generated sample (a prompt, its response and everything training needs of it)."""

    group_index: int | None = None
    index: int | None = None
    # The rollout execution id; None falls back to ``index``.
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    # Raw inputs: {"images": [...], "videos": [...], "audios": [...]}; images are PIL images,
    # paths, or MediaRef objects pointing into the run's media directory.
    multimodal_inputs: dict[str, Any] | None = None
    # Processor outputs minus input_ids/attention_mask, e.g. pixel_values, image_grid_thw.
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    # numpy int32 arrays when present: (num_tokens - 1, layers, top-k).
    rollout_routed_experts: Any = None
    rollout_indexer_topk: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    opd_reverse_kl: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    adapter: AdapterRef | None = None
    reward_spec: RewardSpec | None = None
    routing_key: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo(_Counters):
        """Speculative-decoding counters summed over a sample's generation calls."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        # The engine reports completed tokens as "completion_tokens".
        _ENGINE_KEYS: ClassVar[dict[str, str]] = {"completion_token_num": "completion_tokens"}

        @property
        def spec_accept_rate(self) -> float:
            return (
                self.spec_accept_token_num / self.spec_draft_token_num
                if self.spec_draft_token_num > 0
                else 0.0
            )

        @property
        def spec_accept_length(self) -> float:
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo(_Counters):
        """Prompt tokens the engine found in its prefix cache, summed over generation calls."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        _ENGINE_KEYS: ClassVar[dict[str, str]] = {"total_prompt_tokens": "prompt_tokens"}

        @property
        def prefix_cache_hit_rate(self) -> float:
            return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        if "status" not in data:
            raise KeyError(
                f"Sample.from_dict: key 'status' is required (one of {[s.value for s in Sample.Status]}); "
                f"found keys {sorted(map(str, data))}"
            )
        status = data["status"]
        try:
            status = status if isinstance(status, Sample.Status) else Sample.Status(status)
        except ValueError:
            raise ValueError(
                f"Sample.from_dict: status: expected one of {[s.value for s in Sample.Status]}, found {status!r}"
            ) from None
        data = dict(data)
        data["status"] = status
        data["spec_info"] = _nested(Sample.SpecInfo, data.get("spec_info"), "spec_info")
        data["prefix_cache_info"] = _nested(
            Sample.PrefixCacheInfo, data.get("prefix_cache_info"), "prefix_cache_info"
        )
        names = _FIELD_NAMES
        sample = cls(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args: Any) -> Any:
        """The scalar reward: ``reward`` itself, or ``reward[args.reward_key]`` when that is set."""
        key = getattr(args, "reward_key", None)
        return self.reward if not key else self.reward[key]  # type: ignore[index]

    @property
    def effective_response_length(self) -> int:
        """Tokens that count for the loss: ``sum(loss_mask)``, else ``response_length``."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def validate(self) -> None:
        """Assert the per-token fields agree with ``response_length`` and ``tokens``."""
        n = self.response_length
        assert n >= 0, f"response_length must be >= 0, got {n}"
        assert len(self.tokens) >= n, f"tokens length ({len(self.tokens)}) must be >= response_length ({n})"
        for name in ("loss_mask", "rollout_log_probs", "teacher_log_probs", "opd_reverse_kl"):
            value = getattr(self, name)
            if value is not None:
                assert len(value) == n, f"{name} length ({len(value)}) != response_length ({n})"
        expect = len(self.tokens) - 1
        if self.rollout_routed_experts is not None:
            actual = len(self.rollout_routed_experts)
            # The engine may count a media item's expanded positions (one per patch or audio token).
            mm = self.multimodal_train_inputs or {}
            extra = sum(
                int(c) - 1
                for key in ("mm_vision_num_patches", "mm_audio_num_tokens")
                for c in list(mm.get(key) or [])
            )
            assert actual in (expect, expect + extra), (
                f"rollout_routed_experts length ({actual}) != len(tokens) - 1 ({expect})"
                f" or media-expanded ({expect + extra})"
            )
        if self.rollout_indexer_topk is not None:
            actual = len(self.rollout_indexer_topk)
            assert actual == expect, f"rollout_indexer_topk length ({actual}) != len(tokens) - 1 ({expect})"

    def strip_last_output_tokens(self, n: int, tokenizer: Any) -> None:
        """Remove the last ``n`` output tokens and every per-token value that goes with them;
        ``response`` is decoded again with ``tokenizer``."""
        if n <= 0:
            return
        assert n <= self.response_length, (
            f"cannot strip {n} tokens: only {self.response_length} output tokens available"
        )
        self.tokens = self.tokens[:-n]
        self.response_length -= n
        for name in (
            "rollout_log_probs",
            "teacher_log_probs",
            "opd_reverse_kl",
            "loss_mask",
            "rollout_routed_experts",
            "rollout_indexer_topk",
        ):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[:-n])
        if self.metadata and "opd_student_top_logprobs" in self.metadata:
            self.metadata["opd_student_top_logprobs"] = self.metadata["opd_student_top_logprobs"][:-n]
        self.response = (
            tokenizer.decode(self.tokens[-self.response_length :]) if self.response_length > 0 else ""
        )

    def reset_for_retry(self) -> None:
        """Clear what generation produced so the prompt can be sampled again (Miles' semantics).

        Kept: ``group_index``, ``index``, ``rollout_id``, ``prompt``, ``multimodal_inputs`` (the
        media they reference stay in the run directory), ``label``, ``metadata``,
        ``generate_function_path``, ``routing_key``, ``adapter``, ``reward_spec`` and, as in
        Miles, ``teacher_log_probs`` / ``opd_reverse_kl``. Everything else goes back to its
        default, and ``status`` becomes ``ABORTED``.
        """
        self.tokens = []
        self.multimodal_train_inputs = None
        self.response = ""
        self.response_length = 0
        self.reward = None
        self.loss_mask = None
        self.weight_versions = []
        self.rollout_log_probs = None
        self.rollout_routed_experts = None
        self.rollout_indexer_topk = None
        self.status = Sample.Status.ABORTED
        self.non_generation_time = 0.0
        self.spec_info = Sample.SpecInfo()
        self.prefix_cache_info = Sample.PrefixCacheInfo()
        self.remove_sample = False
        self.train_metadata = None

    @property
    def oldest_weight_version(self) -> int | None:
        """The lowest numeric weight version among the sample's generation calls, or None."""
        numeric = [int(v) for v in self.weight_versions if str(v).isdigit()]
        return min(numeric) if numeric else None

    def update_from_meta_info(self, args: Any, meta_info: dict[str, Any]) -> None:
        """Fold one engine answer's ``meta_info`` into the sample: speculative-decoding counters
        (when ``args.sglang_speculative_algorithm`` is set), prefix-cache counters, the weight
        version, and the status from ``finish_reason.type`` (length: truncated, abort: aborted,
        stop: completed; other types leave it)."""
        if getattr(args, "sglang_speculative_algorithm", None):
            self.spec_info.add(meta_info)
        self.prefix_cache_info.add(meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        finish = meta_info["finish_reason"]["type"]
        status = _FINISH_STATUS.get(finish)
        if status is not None:
            self.status = status


def _nested(cls: Any, value: Any, key: str) -> Any:
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls.from_dict(value)
    raise TypeError(
        f"Sample.from_dict: {key}: expected a dict or {cls.__qualname__}, found {type(value).__name__}"
    )


_FIELD_NAMES = frozenset(f.name for f in fields(Sample))
_FINISH_STATUS = {
    "length": Sample.Status.TRUNCATED,
    "abort": Sample.Status.ABORTED,
    "stop": Sample.Status.COMPLETED,
}


def default_sample_cls() -> type:
    """The class loaders build samples with when the caller names none: Miles' own
    ``miles.utils.types.Sample`` when ``miles`` is importable, else :class:`Sample`.

    Miles compares ``sample.status == Sample.Status.TRUNCATED`` against its own enum, so a
    Miles process must get Miles' class back. A ``miles`` package that is present but fails to
    import (a missing dependency) falls back to :class:`Sample` with a warning.
    """
    try:
        from miles.utils.types import Sample as miles_sample  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError as e:
        if e.name not in ("miles", "miles.utils", "miles.utils.types"):
            _warn_miles_unusable(e)
        return Sample
    except ImportError as e:
        _warn_miles_unusable(e)
        return Sample
    register_record_types()  # Miles' AdapterRef / RewardSpec are rebuilt as Miles' classes
    return miles_sample  # type: ignore[no-any-return,unused-ignore]


_warned: set[str] = set()


def _warn_miles_unusable(e: ImportError) -> None:
    msg = f"{type(e).__name__}: {e}"
    if msg not in _warned:
        _warned.add(msg)
        logging.getLogger(__name__).warning(
            "miles is installed but miles.utils.types does not import (%s); loaded samples are "
            "trainer_hooks.Sample",
            msg,
        )


def resolve_sample_cls(sample_cls: Any) -> Any:
    """What loaders hand to ``Bundle.samples(sample_cls=...)``: ``None`` means
    :func:`default_sample_cls`; ``dict`` keeps plain dicts; any other class must have
    ``from_dict``."""
    register_record_types()
    if sample_cls is None:
        return default_sample_cls()
    if sample_cls is dict:
        return dict
    if not callable(getattr(sample_cls, "from_dict", None)):
        raise TypeError(f"sample_cls: expected dict or a class with from_dict(dict), found {sample_cls!r}")
    return sample_cls


#: The record names AdapterRef and RewardSpec are stored under (bundles.register_record_type).
RECORD_NAMES = {"AdapterRef": "miles.AdapterRef", "RewardSpec": "miles.RewardSpec"}


def register_record_types() -> None:
    """Register ``AdapterRef`` and ``RewardSpec`` as bundle records: this package's classes and,
    when ``miles.utils.types`` is loaded, Miles' (registered last, so readers rebuild Miles'
    classes in a process that uses Miles). Idempotent and cheap; savers and loaders call it."""
    register_record_type(AdapterRef, RECORD_NAMES["AdapterRef"])
    register_record_type(RewardSpec, RECORD_NAMES["RewardSpec"])
    miles = sys.modules.get("miles.utils.types")
    for attr, name in RECORD_NAMES.items():
        cls = getattr(miles, attr, None) if miles is not None else None
        if isinstance(cls, type) and is_dataclass(cls) and cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            register_record_type(cls, name)


register_record_types()
