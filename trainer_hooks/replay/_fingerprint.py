"""Fingerprints of rebuilt tensors, and comparing two replay reports by them.

A fingerprint is the shape, dtype and sha256 of an image's rows of ``pixel_values`` and of its
``image_grid_thw`` row, as the cast left them: two replays agree on an image exactly when its
fingerprints are equal. :func:`compare_reports` lists every difference as a ``fingerprint``
problem (``replay --expect``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from trainer_hooks.replay._report import REPORT_FORMAT

__all__ = ["compare_reports", "fingerprints", "grid_fingerprint", "tensor_bytes", "tensor_fingerprint"]


def _digest(t: Any) -> str:
    import torch

    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    raw = t.reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(memoryview(raw)).hexdigest()


def _dtype_str(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def tensor_fingerprint(t: Any) -> dict[str, Any]:
    """Shape, dtype and sha256 of the bytes of ``t`` (row-major, as the cast left them)."""
    return {"shape": list(t.shape), "dtype": _dtype_str(t), "sha256": _digest(t)}


def grid_fingerprint(row: Any) -> tuple[int, dict[str, Any]]:
    """``(patches, fingerprint)`` of one ``image_grid_thw`` row ``(t, h, w)``."""
    t, h, w = (int(x) for x in row.tolist())
    return t * h * w, {**tensor_fingerprint(row), "values": [[t, h, w]]}


def fingerprints(inputs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per image: shape, dtype and sha256 of its rows of ``pixel_values`` and of ``image_grid_thw``."""
    grid = inputs.get("image_grid_thw")
    pixels = inputs.get("pixel_values")
    if grid is None:
        return []
    out = []
    offset = 0
    for j, row in enumerate(grid):
        patches, grid_entry = grid_fingerprint(row)
        entry: dict[str, Any] = {"image": j}
        if pixels is not None:
            entry["pixel_values"] = tensor_fingerprint(pixels[offset : offset + patches])
        offset += patches
        entry["image_grid_thw"] = grid_entry
        out.append(entry)
    return out


def tensor_bytes(inputs: Mapping[str, Any] | None) -> int:
    if not inputs:
        return 0
    return sum(v.numel() * v.element_size() for v in inputs.values() if hasattr(v, "element_size"))


def _image_key(entry: Mapping[str, Any], image: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry["position"], entry.get("index"), image["image"])


def compare_reports(report: Mapping[str, Any], expected: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every image whose rebuilt tensors (shape, dtype, sha256) differ from ``expected``'s, and every
    sample or image present in only one of the two; each as a ``fingerprint`` problem."""
    if expected.get("format") != REPORT_FORMAT:
        raise ValueError(
            f"--expect: expected a report with format {REPORT_FORMAT!r}, found {expected.get('format')!r}"
        )
    problems: list[dict[str, Any]] = []
    old = {_image_key(e, i): i for e in expected.get("samples", []) for i in e.get("images", [])}
    new = {_image_key(e, i): i for e in report["samples"] for i in e["images"]}
    old_positions = {e["position"] for e in expected.get("samples", [])}
    for key, img in new.items():
        if key[0] not in old_positions:
            continue  # a sample the earlier replay did not cover (another --limit)
        if key not in old:
            problems.append(_problem(key, "not in the expected report"))
            continue
        changed = _changed_tensors(old[key], img)
        if changed:
            problems.append(_problem(key, "rebuilt tensors changed: " + "; ".join(changed)))
    new_positions = {e["position"] for e in report["samples"]}
    for key in old:
        if key[0] in new_positions and key not in new:
            problems.append(_problem(key, "in the expected report, missing now"))
    diffs = _processor_diffs(expected.get("processor") or {}, report.get("processor") or {})
    if problems and diffs:
        problems.append(
            {"kind": "fingerprint", "image": None, "position": None,
             "message": "processor settings differ from the expected report's: " + "; ".join(diffs)}
        )  # fmt: skip
    return problems


def _problem(key: tuple[Any, ...], what: str) -> dict[str, Any]:
    """A ``fingerprint`` problem of the image ``key`` (position, sample index, image)."""
    position, index, j = key
    return {"kind": "fingerprint", "image": j, "position": position,
            "message": f"sample index {index}, image {j}: {what}"}  # fmt: skip


def _changed_tensors(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprint entries of one image, tensor by tensor."""
    changed = []
    for tensor in ("pixel_values", "image_grid_thw"):
        a, b = old.get(tensor) or {}, new.get(tensor) or {}
        if tensor == "image_grid_thw" and a.get("values") != b.get("values"):
            changed.append(f"image_grid_thw {a.get('values')} -> {b.get('values')}")
            continue  # the values say it all
        for field in ("shape", "dtype", "sha256"):
            if a.get(field) != b.get(field):
                changed.append(
                    f"{tensor}.{field} {a.get(field)} -> {b.get(field)}"
                    if field != "sha256"
                    else f"{tensor} bytes (sha256 {str(a.get(field))[:12]} -> {str(b.get(field))[:12]})"
                )
    return changed


_PROCESSOR_KEYS = (
    "min_pixels",
    "max_pixels",
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "transformers",
    "class",
)


def _processor_diffs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The processor settings of two reports that differ (what explains changed fingerprints)."""
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in _PROCESSOR_KEYS if old.get(k) != new.get(k)]
