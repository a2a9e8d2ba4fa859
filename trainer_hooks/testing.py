"""Small stand-ins for Miles' rollout manager and trainer, for the reference drivers' demo and tests.

They do real file work and no model work: the rollout manager stores a tiny PNG per sample in
the run's media directory (through :func:`trainer_hooks.store_media`) and returns
:class:`trainer_hooks.Sample` objects referencing it; the trainer reads every referenced file
back and checks its digest, as a trainer building pixel values would. Both append what they
do to an ``events`` list (shared when passed in) and can be told to fail at a step.

Public, but not a stable API: it exists for tests and examples.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from argparse import Namespace
from pathlib import Path

from bundles import MediaRef
from trainer_hooks._sample import Sample
from trainer_hooks.run_media import store_media

__all__ = ["StandInRolloutManager", "StandInTrainer", "png_bytes"]


def png_bytes(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid, deterministic, single-colour RGB PNG, without needing pillow."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    row = b"\x00" + bytes(rgb) * width  # filter type 0, then the pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height, 9))
        + chunk(b"IEND", b"")
    )


class StandInRolloutManager:
    """Generates ``args.rollout_batch_size`` samples per step, each with one stored image."""

    def __init__(
        self,
        args: Namespace,
        *,
        events: list[str] | None = None,
        fail_at: int | None = None,
        generate_delay_s: float = 0.0,
        image_size: tuple[int, int] = (8, 8),
    ) -> None:
        self.args = args
        self.events = events if events is not None else []
        self.fail_at = fail_at
        self.generate_delay_s = generate_delay_s
        self.image_size = image_size
        self.media: list[MediaRef] = []
        self.media_present_at_dispose: bool | None = None
        self._lock = threading.Lock()
        self.events.append("rollout_manager.init")

    def generate(self, rollout_id: int) -> list[Sample]:
        self.events.append(f"generate.start {rollout_id}")
        if self.generate_delay_s:
            time.sleep(self.generate_delay_s)
        if rollout_id == self.fail_at:
            self.events.append(f"generate.fail {rollout_id}")
            raise RuntimeError(f"stand-in rollout failed at rollout {rollout_id}")
        samples = []
        batch = getattr(self.args, "rollout_batch_size", 1) or 1
        for i in range(batch):
            colour = ((37 * rollout_id + 11 * i) % 256, (91 * i) % 256, 200)
            ref = store_media(self.args, png_bytes(*self.image_size, colour), ".png")
            with self._lock:
                self.media.append(ref)
            prompt_tokens = [1, 2, 3, 100 + i]
            response_tokens = [7, 8, 9]
            samples.append(
                Sample(
                    group_index=i,
                    index=rollout_id * batch + i,
                    prompt=f"describe image {i} of rollout {rollout_id}",
                    tokens=prompt_tokens + response_tokens,
                    multimodal_inputs={"images": [ref]},
                    response="a square",
                    response_length=len(response_tokens),
                    label="square",
                    reward=1.0,
                    loss_mask=[1] * len(response_tokens),
                    weight_versions=[str(rollout_id)],
                    rollout_log_probs=[-0.5] * len(response_tokens),
                    status=Sample.Status.COMPLETED,
                )
            )
        self.events.append(f"generate.end {rollout_id}")
        return samples

    def save(self, rollout_id: int) -> None:
        """Write the dataset state beside Miles' ``global_dataset_state_dict_<id>.pt`` (as JSON here)."""
        self.events.append(f"rollout_manager.save {rollout_id}")
        save = getattr(self.args, "save", None)
        if save is not None:
            path = Path(save) / "rollout" / f"global_dataset_state_dict_{rollout_id}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"rollout_id": rollout_id, "samples_generated": len(self.media)}))

    def flush(self) -> None:
        """The slot for pending bundle writes; the stand-in has none."""
        self.events.append("rollout_manager.flush")

    def dispose(self) -> None:
        with self._lock:
            media = list(self.media)
        # A real executor may still read media while shutting down (aborting and recording
        # partial groups); the teardown order guarantees the files are still there.
        self.media_present_at_dispose = all(m.path is not None and os.path.exists(m.path) for m in media)
        self.events.append("rollout_manager.dispose")


class StandInTrainer:
    """Trains by reading every image a sample references and checking its digest."""

    def __init__(
        self,
        args: Namespace,
        *,
        role: str = "actor",
        events: list[str] | None = None,
        fail_at: int | None = None,
    ) -> None:
        self.args = args
        self.role = role
        self.events = events if events is not None else []
        self.fail_at = fail_at
        self.images_read = 0
        self.weights_version = 0
        self.events.append(f"{role}.init")

    def train(self, rollout_id: int, samples: list[Sample]) -> None:
        self.events.append(f"{self.role}.train.start {rollout_id}")
        for sample in samples:
            for ref in (sample.multimodal_inputs or {}).get("images", []):
                data = Path(ref.path).read_bytes()
                if MediaRef.from_bytes(data).digest != ref.digest:
                    raise RuntimeError(f"{ref.path}: content does not match {ref.digest}")
                self.images_read += 1
        if rollout_id == self.fail_at:
            self.events.append(f"{self.role}.train.fail {rollout_id}")
            raise RuntimeError(f"stand-in {self.role} failed at rollout {rollout_id}")
        self.events.append(f"{self.role}.train.end {rollout_id}")

    def save_model(self, rollout_id: int) -> None:
        self.events.append(f"{self.role}.save_model {rollout_id}")
        save = getattr(self.args, "save", None)
        if save is not None:
            path = Path(save) / self.role / f"iter_{rollout_id:07d}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"rollout_id": rollout_id, "weights_version": self.weights_version}))

    def update_weights(self) -> None:
        self.weights_version += 1
        self.events.append(f"{self.role}.update_weights")

    def close(self) -> None:
        self.events.append(f"{self.role}.close")
