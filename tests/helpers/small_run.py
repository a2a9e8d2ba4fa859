"""A small stand-in rollout for journal tests: prompt groups and a grader that stores a screenshot.

``prompt_groups(groups, size)`` is ``groups`` groups of ``size`` samples (``index = g * size + i``,
prompt ``p<g>``); ``grader(tokens)`` is a ``generate_sample`` that stores one 8x8 PNG through the
run's media (:func:`trainer_hooks.store_media`), gives the sample ``tokens`` token ids and its index,
rewards it its index and marks it completed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from trainer_hooks import Sample, store_media
from trainer_hooks.testing import png_bytes

__all__ = ["grader", "prompt_groups"]


def prompt_groups(groups: int, size: int) -> list[list[Sample]]:
    return [
        [Sample(group_index=g, index=g * size + i, prompt=f"p{g}") for i in range(size)]
        for g in range(groups)
    ]


def grader(tokens: int) -> Callable[[Any, Sample], Awaitable[Sample]]:
    async def generate(args: Any, s: Sample) -> Sample:
        await asyncio.sleep(0.001)
        s.multimodal_inputs = {"images": [store_media(args, png_bytes(8, 8, (s.index % 256, 17, 99)))]}
        s.tokens = [*range(tokens), s.index]
        s.reward = float(s.index)
        s.status = Sample.Status.COMPLETED
        return s

    return generate
