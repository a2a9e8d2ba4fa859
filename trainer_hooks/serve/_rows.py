"""What the index holds of a sample: its row, its stored view, its words for search.

A row holds what the bundle table shows and filters and sorts on (status, reward, group, lengths,
turns, advantage, a prompt key), never a screenshot or a token list (:func:`row_of`: any legal
value, no crash); beside it each sample's page-ready view (what
:func:`trainer_hooks.pages.sample_view` keeps, compressed: :func:`view_bytes`), so a sample page
reads no shard. The text search indexes at most :data:`MAX_TEXT` characters of each prompt and
response (contentless FTS5: the text is not stored twice); the words typed in a search box reach
SQLite only as quoted phrases (:func:`fts_query`). :data:`SCHEMA` is the index file's tables.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import zlib
from collections.abc import Mapping
from typing import Any

from trainer_hooks.pages import Image, SampleView, finite

__all__ = [
    "BIG",
    "REPORT_SORTS",
    "SCHEMA",
    "SORTS",
    "fts_query",
    "key_text",
    "prompt_key",
    "prompt_text",
    "row_of",
    "view_bytes",
    "view_of",
]

MAX_VIEW_BYTES = 256 * 1024  # a sample's stored view, compressed; a larger one is read from its shard
MAX_TEXT = 16_000  # characters of a prompt / a response indexed for search
PROMPT_ID_KEYS = ("prompt_id", "dataset_index", "data_index", "task_id")
#: Sortable columns: URL name -> SQL column. ``mismatch`` is not in the index: it is the function
#: the bundle page registers on its connection, reading the replay report beside the bundle
#: (each sample's ``logprob_diff.mean_abs``; NULL without one), offered only when there is one.
SORTS = {"position": "pos", "reward": "reward", "length": "resp_len", "turns": "turns",
         "advantage": "advantage", "tokens": "tokens", "mismatch": "mismatch(pos)"}  # fmt: skip
#: The sorts that need a replay report beside the bundle.
REPORT_SORTS = ("mismatch",)
BIG = 1e308  # NULLs sort last, either direction

SCHEMA = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE samples (
  pos INTEGER PRIMARY KEY, idx TEXT, grp TEXT, status TEXT, reward REAL, reward_text TEXT,
  resp_len INTEGER, tokens INTEGER, turns INTEGER, advantage REAL, prompt_key TEXT,
  prompt_head TEXT, truncated INTEGER NOT NULL
);
CREATE TABLE views (pos INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE VIRTUAL TABLE fts USING fts5(prompt, response, content='', tokenize='unicode61 remove_diacritics 2');
"""


def _count(v: Any) -> int | None:
    if isinstance(v, (list, tuple, str, bytes)):
        return len(v)
    shape = getattr(v, "shape", None)
    if isinstance(shape, tuple) and len(shape) >= 1:
        try:
            return int(shape[0])
        except (TypeError, ValueError):
            return None
    return None


def key_text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v[:200]
    n = finite(v)
    if n is not None and float(n).is_integer() and abs(n) < 2**63:
        return str(int(n))
    if n is not None:
        return repr(n)
    try:
        return json.dumps(v, sort_keys=True, default=str)[:200]
    except (TypeError, ValueError):
        return None


def _status(v: Any) -> str | None:
    if v is None:
        return None
    value = getattr(v, "value", v)
    return value[:64] if isinstance(value, str) else str(value)[:64]


def prompt_text(prompt: Any) -> str:
    """The prompt's text: a string as it is, chat messages' text contents joined, else JSON."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt):
        parts = []
        for m in prompt:
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [
                    str(c.get("text", ""))
                    for c in content
                    if isinstance(c, Mapping) and c.get("type") == "text"
                ]
        return "\n".join(parts)
    try:
        return json.dumps(prompt, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return ""


def prompt_key(sample: Mapping[str, Any], text: str) -> str:
    """The same prompt across bundles: its dataset index / prompt id when the sample records one
    (``metadata.prompt_id``, ``dataset_index``, ``data_index``, ``task_id``), else a hash of its
    text."""
    md = sample.get("metadata")
    if isinstance(md, Mapping):
        for k in PROMPT_ID_KEYS:
            key = key_text(md.get(k))
            if key is not None:
                return f"{k}={key}"
    return "text:" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def row_of(pos: int, sample: Any) -> tuple[tuple[Any, ...], str, str]:
    """(the row, the prompt text, the response text) of one sample; any legal value, no crash."""
    s: Mapping[str, Any] = sample if isinstance(sample, Mapping) else {}
    md = s.get("metadata")
    md = md if isinstance(md, Mapping) else {}
    status = _status(s.get("status"))
    raw_reward = s.get("reward")
    reward = finite(raw_reward)
    if reward is not None:
        reward_text = f"{reward:.4g}"
    elif raw_reward is None:
        reward_text = None
    else:
        try:
            reward_text = json.dumps(raw_reward, sort_keys=True, default=str)[:80]
        except (TypeError, ValueError):
            reward_text = type(raw_reward).__name__
    response = s.get("response")
    response_text = response if isinstance(response, str) else ""
    rl = finite(s.get("response_length"))
    resp_len = (
        int(rl) if rl is not None and abs(rl) < 2**62 else (len(response_text) if response_text else None)
    )
    mm = s.get("multimodal_inputs")
    images = mm.get("images") if isinstance(mm, Mapping) else None
    turns = _count(images)
    if not turns:
        turns = _count(md.get("actions")) or turns
    truncated = int((status is not None and status.lower() == "truncated") or md.get("truncated") is True)
    text = prompt_text(s.get("prompt"))
    row = (pos, key_text(s.get("index")), key_text(s.get("group_index")), status, reward, reward_text,
           resp_len, _count(s.get("tokens")), turns, None, prompt_key(s, text), text[:160], truncated)  # fmt: skip
    return row, text[:MAX_TEXT], response_text[:MAX_TEXT]


_VIEW_FIELDS = tuple(f.name for f in dataclasses.fields(SampleView))


def view_bytes(view: SampleView) -> bytes | None:
    """What a sample page shows of a sample (:func:`trainer_hooks.pages.sample_view`), stored in
    the index so that a page never decodes a shard's earlier samples to reach it; None when it
    is too large to keep (the page then reads the sample)."""
    fields = {f: getattr(view, f) for f in _VIEW_FIELDS}
    fields["images"] = [(i.name, i.shown_as, i.grid) for i in view.images]
    data = zlib.compress(json.dumps(fields, default=str, check_circular=False).encode("utf-8"), 1)
    return data if len(data) <= MAX_VIEW_BYTES else None


def view_of(data: bytes) -> SampleView:
    d = json.loads(zlib.decompress(data))
    d["images"] = [Image(name, shown_as, grid) for name, shown_as, grid in d["images"]]
    d["screen"] = tuple(d["screen"]) if d.get("screen") is not None else None
    return SampleView(**d)


def fts_query(text: str) -> str | None:
    """A search box's words as an FTS5 query: each word a quoted phrase, all required (no FTS5
    syntax from the URL reaches SQLite: quotes are doubled, operators are words)."""
    words = re.findall(r"\w+", text)[:16]
    if not words:
        return None
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)
