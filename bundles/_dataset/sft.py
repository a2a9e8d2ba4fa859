"""Successful trajectories in the layout TRL's vision SFT takes: ``messages`` + ``images``.

TRL's ``SFTTrainer`` with a vision model reads rows of ``messages`` (a list of
``{"role", "content": [{"type": "image"} | {"type": "text", "text": ...}]}``, one
``{"type": "image"}`` placeholder per picture, in order) and ``images`` (the pictures, in the
order of the placeholders): the layout of ``HuggingFaceH4/llava-instruct-mix-vsft`` in TRL's
documentation. :func:`sft_rows` turns a batch of :mod:`bundles._dataset.arrow` rows into it.

Which rows: successful trajectories, status ``completed`` and a finite reward above 0 (or at
least ``min_reward`` when given); a NaN or infinite reward is never a success.

Which convention the turns are read by, one per row, counted in :class:`Conventions` so that the
export can say which it read:

* ``turns``: the sample's ``metadata.actions`` and its screenshots, a computer-use episode: the
  user's prompt with screenshot 0, then for each action an assistant message (the action's text)
  and a user message with the next screenshot; screenshots past the last action go to the last
  user message.
* ``prompt-response``: no actions: one user message (every screenshot, then the prompt's text)
  and one assistant message (the response). A prompt that is a list of chat messages keeps its
  messages (their text), the screenshots placed at the start of its first user message.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

__all__ = ["Conventions", "sft_rows", "sft_schema"]


class Conventions(Counter[str]):
    """How many rows each convention (``turns``, ``prompt-response``) gave."""


def sft_schema() -> Any:
    import pyarrow as pa

    content = pa.list_(pa.struct([("type", pa.string()), ("text", pa.string())]))
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.schema(
        [
            ("bundle_id", pa.string()),
            ("position", pa.int64()),
            ("reward", pa.float64()),
            ("convention", pa.string()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", content)]))),
            ("images", pa.list_(image)),
        ]
    )


def _image() -> dict[str, Any]:
    return {"type": "image", "text": None}


def _textpart(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _chat(prompt: str | None) -> list[dict[str, Any]] | None:
    """A prompt stored as a list of chat messages (JSON text in the prompt column), or None."""
    if prompt is None or not prompt.startswith("["):
        return None
    try:
        value = json.loads(prompt)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m for m in value):
        return None
    out = []
    for m in value:
        c = m.get("content")
        text = c if isinstance(c, str) else json.dumps(c, ensure_ascii=False)
        out.append({"role": str(m["role"]), "content": [_textpart(text)]})
    return out


def _by_turns(prompt: str | None, actions: list[str | None], n_images: int) -> list[dict[str, Any]]:
    first = ([_image()] if n_images else []) + ([_textpart(prompt)] if prompt else [])
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    shown = 1 if n_images else 0
    for action in actions:
        messages.append({"role": "assistant", "content": [_textpart(action or "")]})
        if shown < n_images:
            messages.append({"role": "user", "content": [_image()]})
            shown += 1
    if shown < n_images:  # screenshots past the last action
        if messages[-1]["role"] != "user":
            messages.append({"role": "user", "content": []})
        messages[-1]["content"] += [_image() for _ in range(n_images - shown)]
    return messages


def _by_response(prompt: str | None, response: str | None, n_images: int) -> list[dict[str, Any]]:
    chat = _chat(prompt)
    if chat is None:
        chat = [{"role": "user", "content": [_textpart(prompt or "")]}]
    first_user = next((m for m in chat if m["role"] == "user"), None)
    if first_user is None:
        first_user = {"role": "user", "content": []}
        chat.insert(0, first_user)
    first_user["content"] = [_image() for _ in range(n_images)] + first_user["content"]
    return [*chat, {"role": "assistant", "content": [_textpart(response or "")]}]


def sft_rows(
    batch: dict[str, list[Any]], min_reward: float | None, seen: Conventions
) -> dict[str, list[Any]]:
    """The SFT rows of ``batch`` (a ``to_arrow`` batch as ``to_pydict()``, with ``images``)."""
    out: dict[str, list[Any]] = {n: [] for n in sft_schema().names}
    for i in range(len(batch["position"])):
        reward = batch["reward"][i]
        if batch["status"][i] != "completed" or reward is None or not math.isfinite(reward):
            continue  # a NaN compares False both ways: it must never pass as a success
        if not ((reward >= min_reward) if min_reward is not None else (reward > 0)):
            continue
        images = batch["images"][i] or []
        actions = [t["action"] for t in batch["turns"][i] or [] if t["action"] is not None]
        if actions:
            convention, messages = "turns", _by_turns(batch["prompt"][i], actions, len(images))
        else:
            convention = "prompt-response"
            messages = _by_response(batch["prompt"][i], batch["response"][i], len(images))
        seen[convention] += 1
        for name, value in (("bundle_id", batch["bundle_id"][i]), ("position", batch["position"][i]),
                            ("reward", reward), ("convention", convention),
                            ("messages", messages), ("images", images)):  # fmt: skip
            out[name].append(value)
    return out
