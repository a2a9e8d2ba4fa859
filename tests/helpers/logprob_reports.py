"""Replay reports with log-prob differences, written as ``rollout-bundle replay --model`` writes
them (trainer_hooks/replay/_report.py's shape, _mismatch.py's figures), with known numbers: a real
replay needs a model, and the pages only read the report.

:func:`logprob_report` takes a bundle, each sample's recorded log-probs (its
``rollout_log_probs``) and a shift per token; the recomputed log-probs are the recorded plus the
shift, so every figure on the page follows from the shifts: ``mean_abs`` is the mean |shift|,
``first_over`` the first token whose |shift| is over ``threshold``, ``k3`` the mean of
``exp(s) - 1 - s``, ``tis_clipped`` the tokens with ``exp(s) > 2``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bundles import open_bundle
from trainer_hooks.replay import REPORT_FORMAT, bundle_identity

TIS_CAP = 2.0


def _quantile(values: list[float], q: float) -> float:
    pos = (len(values) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


def logprob_diff(
    recorded: list[float], shifts: list[float], threshold: float, tokens: list[int]
) -> dict[str, Any]:
    """One sample's ``logprob_diff``: the whole response one turn (no loss mask)."""
    diffs = [abs(s) for s in shifts]
    over = next((k for k, d in enumerate(diffs) if d > threshold), None)
    return {
        "max_abs": max(diffs),
        "mean_abs": sum(diffs) / len(diffs),
        "tokens": len(diffs),
        "recomputed": [a + s for a, s in zip(recorded, shifts, strict=True)],
        "first_over": None if over is None else {"offset": over, "turn": 0, "token": tokens[over], "abs": diffs[over]},
        "turns": [{"turn": 0, "start": 0, "tokens": len(diffs), "mean_abs": sum(diffs) / len(diffs),
                   "max_abs": max(diffs)}],
        "k3": sum(math.exp(s) - 1 - s for s in shifts) / len(shifts),
        "tis_clipped": sum(1 for s in shifts if math.exp(s) > TIS_CAP),
    }  # fmt: skip


def logprob_report(bundle: Path, shifts: dict[int, list[float]], threshold: float = 0.2) -> dict[str, Any]:
    """The report of ``bundle`` whose samples at the positions of ``shifts`` were scored (the
    others replayed without a comparison), with its ``summary.logprob``."""
    with open_bundle(bundle) as b:
        ident = bundle_identity(b)
        samples = list(b.samples())
    entries = []
    for pos, s in enumerate(samples):
        diff = None
        if pos in shifts:
            recorded = [float(x) for x in s["rollout_log_probs"]]
            tokens = [int(t) for t in s["tokens"]][-len(recorded) :]
            diff = logprob_diff(recorded, shifts[pos], threshold, tokens)
        entries.append({"position": pos, "index": s.get("index"), "group_index": s.get("group_index"),
                        "problems": [], "images": [], "logprob_diff": diff})  # fmt: skip
    scored = [e["logprob_diff"] for e in entries if e["logprob_diff"]]
    means = sorted(d["mean_abs"] for d in scored)
    tokens = sum(d["tokens"] for d in scored)
    clipped = sum(d["tis_clipped"] for d in scored)
    summary = {"samples": len(entries), "images": 0, "problems": {}, "logprob": {
        "samples": len(scored),
        "mean_abs": {"mean": sum(means) / len(means), "p50": _quantile(means, 0.5), "p99": _quantile(means, 0.99),
                     "max": means[-1]},
        "tokens": tokens, "k3": sum(d["k3"] * d["tokens"] for d in scored) / tokens, "tis_cap": TIS_CAP,
        "tis_clipped_tokens": clipped, "tis_clipped_fraction": clipped / tokens,
    }}  # fmt: skip
    return {"format": REPORT_FORMAT, "version": 1, "bundle": str(bundle), "bundle_id": ident, "dtype": "fp32",
            "processor": {}, "summary": summary, "samples": entries,
            "model": {"path": "/models/tiny", "device": "cpu", "max_logprob_diff": threshold}}  # fmt: skip
