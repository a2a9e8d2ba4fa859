"""A ``Sample`` compatible with Miles' ``miles.utils.types.Sample`` for the fields this project touches.

Compatibility contract (what bundles and debug dumps rely on):

* ``to_dict()`` is a shallow copy of the instance's ``__dict__`` (fields *and* attributes set
  later) with ``status`` replaced by its string value; tensors, arrays and media references
  pass through unchanged, uncopied.
* ``from_dict(d)`` requires ``status``; keys that are fields go to the constructor, every other
  key becomes an attribute, so a dump written by a Miles version with more fields
  (``spec_info``, ``session_id``, …) loads and writes back without losing them. The input
  dict is not modified.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any

__all__ = ["Sample"]


@dataclass
class Sample:
    """One generated sample (a prompt, its response and everything training needs of it)."""

    group_index: int | None = None
    index: int | None = None
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
    # numpy int32 arrays when present.
    rollout_routed_experts: Any = None
    rollout_indexer_topk: Any = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    train_metadata: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        value = self.__dict__.copy()
        value["status"] = self.status.value
        return value

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
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
        names = _FIELD_NAMES
        sample = Sample(**{k: v for k, v in data.items() if k in names and k != "status"}, status=status)
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def reset_for_retry(self) -> None:
        """Clear everything generation produced, keeping the sample's inputs.

        Kept: ``prompt`` and ``multimodal_inputs`` (the engine needs them again, and the media
        they reference stays in the run directory), and the dataset-given identity and ground
        truth ``group_index``, ``index``, ``label`` and ``metadata``. Everything else goes back
        to its default and ``status`` to pending.
        """
        for f in fields(self):
            if f.name in _KEPT_ON_RETRY:
                continue
            if f.default_factory is not MISSING:
                setattr(self, f.name, f.default_factory())
            else:
                setattr(self, f.name, f.default)


_FIELD_NAMES = frozenset(f.name for f in fields(Sample))
_KEPT_ON_RETRY = frozenset({"group_index", "index", "prompt", "multimodal_inputs", "label", "metadata"})
