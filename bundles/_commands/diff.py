"""What differs between two bundles: ``rollout-bundle diff A B``.

Samples are matched by position (sample ``i`` of A with sample ``i`` of B), or with ``by`` by
the value at a key path (``index``), so that a dump with one sample dropped does not read as
every later sample changed. Values are compared in their :func:`bundles._commands.show.fingerprint`
form: media by content (their ``media/<sha256><suffix>`` path, the same in both bundles
wherever they sit), arrays, tensors and bytes by dtype, shape and the sha256 of their bytes.

A changed sample lists the key paths that differ (``multimodal_inputs.images[1]``), at most
``limit`` of them. A list of numbers with the same length on both sides that differs in more
than a few places (log-probs after a cast) is one entry naming how many items differ and the
first of them, rather than a line per token. A list whose length differs (a screenshot dropped) is
one entry with both lengths and the first position where the two lists part (the end of the
shorter one when it is a prefix of the longer: the list was shortened or extended).

Matched by position, both bundles are read one shard at a time; with ``by``, A's fingerprints
are held in memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from bundles._commands.show import fingerprint, select, summarise
from bundles._errors import BundleError
from bundles._format.codec import key_path
from bundles._format.layout import MEDIA_DIR
from bundles._local.reader import Bundle

__all__ = ["DiffKeyError", "diff_bundles"]

SPELLED_OUT = 3  # a same-length number list differing in more places than this is one entry
_SUMMARIES = ("ndarray", "tensor", "bytes")


class DiffKeyError(BundleError, ValueError):
    """``by`` cannot match the samples: a sample lacks the key path, or its value is not a unique
    number or string. The caller's choice of key (the CLI's ``--by``), not a damaged bundle."""


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


def _is_summary(v: dict[str, Any]) -> bool:
    return "sha256" in v and v.get("type") in _SUMMARIES


def _shown(v: Any) -> Any:
    """A value as a change record shows it: long number lists summarised."""
    if isinstance(v, list) and len(v) > 32 and all(type(x) in (int, float, bool) for x in v):
        return summarise(v)
    return v


def _scalars(v: list[Any]) -> bool:
    return all(x is None or type(x) in (int, float, bool, str) for x in v)


def changes(a: Any, b: Any, path: str = "") -> Iterator[dict[str, Any]]:
    """The differences between two fingerprints, one record per key path (lazily)."""
    if a == b:
        return
    if a is ABSENT:
        yield {"path": path, "only_in": "b", "b": _shown(b)}
        return
    if b is ABSENT:
        yield {"path": path, "only_in": "a", "a": _shown(a)}
        return
    if isinstance(a, dict) and isinstance(b, dict) and not _is_summary(a) and not _is_summary(b):
        for k in [*a, *(k for k in b if k not in a)]:
            yield from changes(a.get(k, ABSENT), b.get(k, ABSENT), key_path(path, k) if path else k)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        if _scalars(a) and _scalars(b):
            differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
            if len(differ) > SPELLED_OUT:
                i = differ[0]
                yield {
                    "path": path,
                    "length": len(a),
                    "items_differ": len(differ),
                    "first": i,
                    "a": a[i],
                    "b": b[i],
                }
                return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from changes(x, y, f"{path}[{i}]")
        return
    if isinstance(a, list) and isinstance(b, list):
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        yield {
            "path": path,
            "length_a": len(a),
            "length_b": len(b),
            "first": first,
            "a": _shown(a),
            "b": _shown(b),
        }
        return
    yield {"path": path, "a": _shown(a), "b": _shown(b)}


def _first(records: Iterator[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], int]:
    """At most ``limit`` records and how many more there are."""
    shown = list(itertools.islice(records, limit))
    return shown, sum(1 for _ in records)


def _side(b: Bundle) -> dict[str, Any]:
    return {"path": str(b.path), "kind": b.kind, "samples": len(b), "media_files": len(b.media)}


def _key(bundle: Bundle, i: int, sample: dict[Any, Any], parts: list[str], by: str) -> Any:
    picked: Any = select(sample, [parts])
    for p in parts:
        if not isinstance(picked, dict) or p not in picked:
            raise DiffKeyError(f"{bundle.path}: samples[{i}]: has no key path {by!r} to match samples by")
        picked = picked[p]
    if picked is not None and type(picked) not in (int, float, str, bool):
        raise DiffKeyError(
            f"{bundle.path}: samples[{i}].{by}: expected a number or string to match samples by, "
            f"found {type(picked).__name__}"
        )
    return picked


def _keyed(bundle: Bundle, by: str) -> Iterator[tuple[Any, int, dict[Any, Any]]]:
    """``(key, position, sample)`` for every sample, refusing a key that repeats."""
    parts = by.split(".")
    first: dict[Any, int] = {}
    for i, s in enumerate(bundle.samples()):
        key = _key(bundle, i, s, parts, by)
        if key in first:
            raise DiffKeyError(
                f"{bundle.path}: samples[{i}].{by}: {key!r} repeats samples[{first[key]}]; "
                "matching needs a key path whose value is unique per sample"
            )
        first[key] = i
        yield key, i, s


def diff_bundles(a: Bundle, b: Bundle, *, by: str | None = None, limit: int = 20) -> dict[str, Any]:
    """Compare two open bundles; return a JSON-able report (``"same"`` is true when nothing differs).

    ``by`` is a key path (``"index"``, ``"metadata.task_id"``) whose value identifies a sample
    in both bundles; it must be present and unique in every sample.
    """
    if type(limit) is not int or limit < 0:
        raise BundleError(f"diff_bundles: limit: expected an int >= 0, found {limit!r}")
    report: dict[str, Any] = {"a": _side(a), "b": _side(b), "by": by or "position"}
    report["kind"] = None if a.kind == b.kind else {"a": a.kind, "b": b.kind}
    meta, more = _first(changes(fingerprint(a.meta), fingerprint(b.meta), "meta"), limit)
    report["meta"] = {"changes": meta, "more": more}
    samples = report["samples"] = _compare_samples(a, b, by, limit)
    media = report["media"] = _compare_media(a, b)
    report["same"] = not (
        report["kind"]
        or meta
        or samples["added"]
        or samples["removed"]
        or samples["changed"]
        or media["only_in_a"]
        or media["only_in_b"]
    )
    return report


def _compare_samples(a: Bundle, b: Bundle, by: str | None, limit: int) -> dict[str, Any]:
    """The samples added, removed and changed (with at most ``limit`` key paths each), matched by
    position or by the value at the key path ``by``, and how many are unchanged."""
    added: list[Any] = []
    removed: list[Any] = []
    changed: list[dict[str, Any]] = []
    unchanged = 0
    pa, pb = f"{a.path}/{MEDIA_DIR}/", f"{b.path}/{MEDIA_DIR}/"

    def compare(key: Any, i: int, j: int, fa: Any, fb: Any) -> None:
        nonlocal unchanged
        if fa == fb:
            unchanged += 1
            return
        shown, more = _first(changes(fa, fb), limit)
        changed.append({"key": key, "position_a": i, "position_b": j, "changes": shown, "more": more})

    if by is None:
        for left, right in itertools.zip_longest(enumerate(a.samples()), enumerate(b.samples())):
            if right is None:
                removed.append(left[0])
            elif left is None:
                added.append(right[0])
            else:
                compare(
                    left[0],
                    left[0],
                    right[0],
                    fingerprint(left[1], media_prefix=pa),
                    fingerprint(right[1], media_prefix=pb),
                )
    else:
        by_key = {key: (i, fingerprint(s, media_prefix=pa)) for key, i, s in _keyed(a, by)}
        seen: dict[Any, int] = {}
        for key, j, s in _keyed(b, by):
            seen[key] = j
            if key not in by_key:
                added.append(key)
            else:
                i, fa = by_key[key]
                compare(key, i, j, fa, fingerprint(s, media_prefix=pb))
        removed = [k for k in by_key if k not in seen]
    return {"added": added, "removed": removed, "changed": changed, "unchanged": unchanged}


def _compare_media(a: Bundle, b: Bundle) -> dict[str, Any]:
    """The media files stored in only one of the bundles, and how many both hold."""
    names_a = {r.filename: r.size for r in a.media}
    names_b = {r.filename: r.size for r in b.media}
    return {
        "only_in_a": [
            {"path": f"{MEDIA_DIR}/{n}", "size": s} for n, s in sorted(names_a.items()) if n not in names_b
        ],
        "only_in_b": [
            {"path": f"{MEDIA_DIR}/{n}", "size": s} for n, s in sorted(names_b.items()) if n not in names_a
        ],
        "common": len(names_a.keys() & names_b.keys()),
    }
