"""How far the trainer's log-probs are from the rollout's: per sample and across a bundle.

Per sample (:func:`sample_mismatch`), what ``rollout-bundle replay --model`` writes into
``logprob_diff``: the shape ``--answers`` fills (``tokens``, ``mean_abs``, ``max_abs``,
``recomputed``) plus ``first_over`` (the response offset of the first token whose |difference| is
over the threshold, with its turn and token id) and ``turns`` (one entry per turn). A *turn* is a
run of trained tokens (``loss_mask`` 1) in the response: in a multi-turn rollout the tokens between
two runs are the environment's (observations, screenshots), which the engine never sampled and
training never learns from, so they are left out of the comparison. Without a ``loss_mask`` every
response token is compared and the response is one turn.

Across a bundle (:func:`mismatch_summary`): the distribution of the samples' ``mean_abs`` (mean,
p50, p99, max), the k3 estimate of KL(rollout || trainer) that Miles and verl log
(``r = exp(trainer - rollout)`` per token, ``k3 = (r - 1) - log r``, averaged over the tokens),
and what a truncated importance-sampling correction (TIS) would clip at ``tis_cap``: the share of
tokens whose ratio ``r`` is above it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_TIS_CAP", "mismatch_summary", "sample_mismatch", "threshold_problem", "turn_runs"]

#: The importance-ratio cap of the TIS figure (verl's ``tis_imp_ratio_cap`` default).
DEFAULT_TIS_CAP = 2.0


def turn_runs(loss_mask: Sequence[Any] | None, n: int) -> list[tuple[int, int]]:
    """``(start, end)`` response offsets of each run of trained tokens; the whole response when
    there is no usable ``loss_mask`` (absent, or not one entry per response token)."""
    if loss_mask is None or len(loss_mask) != n:
        return [(0, n)] if n else []
    runs: list[tuple[int, int]] = []
    start = None
    for k, m in enumerate(loss_mask):
        if m and start is None:
            start = k
        elif not m and start is not None:
            runs.append((start, k))
            start = None
    if start is not None:
        runs.append((start, n))
    return runs


def sample_mismatch(
    recomputed: Sequence[float],
    rollout: Sequence[float],
    response_tokens: Sequence[int],
    loss_mask: Sequence[Any] | None,
    threshold: float | None,
    tis_cap: float = DEFAULT_TIS_CAP,
) -> dict[str, Any]:
    """A sample's ``logprob_diff`` (see the module doc): ``recomputed`` and ``rollout`` hold one
    log-prob per response token, ``response_tokens`` the token ids; ``k3`` is the sample's mean
    over the compared tokens, ``tis_clipped`` how many of them have a ratio over ``tis_cap``."""
    n = len(recomputed)
    runs = turn_runs(loss_mask, n)
    diffs = [_abs_diff(a, b) for a, b in zip(recomputed, rollout, strict=True)]
    compared = [k for start, end in runs for k in range(start, end)]
    turns = []
    first_over = None
    for turn, (start, end) in enumerate(runs):
        part = diffs[start:end]
        turns.append(
            {"turn": turn, "start": start, "tokens": len(part), "mean_abs": sum(part) / len(part),
             "max_abs": max(part)}
        )  # fmt: skip
        if first_over is None:
            over = next((k for k in range(start, end) if _over(diffs[k], threshold)), None)
            if over is not None:
                first_over = {"offset": over, "turn": turn, "token": int(response_tokens[over]),
                              "abs": diffs[over]}  # fmt: skip
    finite = [k for k in compared if math.isfinite(diffs[k])]
    log_ratios = [_log_ratio(recomputed[k], rollout[k]) for k in finite]
    return {
        "max_abs": max((diffs[k] for k in compared), default=0.0),
        "mean_abs": sum(diffs[k] for k in compared) / len(compared) if compared else 0.0,
        "tokens": len(compared),
        "non_finite": len(compared) - len(finite),
        "recomputed": [float(v) if math.isfinite(float(v)) else None for v in recomputed],
        "first_over": first_over,
        "turns": turns,
        "k3": sum(math.exp(x) - 1.0 - x for x in log_ratios) / len(log_ratios) if log_ratios else 0.0,
        "tis_clipped": sum(1 for x in log_ratios if math.exp(x) > tis_cap),
    }


def _abs_diff(trainer: float, rollout: float) -> float:
    """``|trainer - rollout|``, ``inf`` when either is not finite (a NaN from an fp16 overflow must
    flag the token, not vanish from ``max`` and ``>`` as NaN does)."""
    d = abs(float(trainer) - float(rollout))
    return d if math.isfinite(d) else math.inf


def _over(diff: float, threshold: float | None) -> bool:
    """Whether a token's difference is over ``threshold``; a non-finite one always is."""
    return diff == math.inf or (threshold is not None and diff > threshold)


def _log_ratio(trainer: float, rollout: float) -> float:
    """``log(pi_trainer / pi_rollout)`` of one token, bounded so that ``exp`` stays finite."""
    return max(min(float(trainer) - float(rollout), 50.0), -50.0)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``sorted_values`` by linear interpolation (numpy's default)."""
    pos = (len(sorted_values) - 1) * q
    low = math.floor(pos)
    a, b = sorted_values[low], sorted_values[min(low + 1, len(sorted_values) - 1)]
    return a if a == b or pos == low else a + (b - a) * (pos - low)  # inf - inf would be NaN


def mismatch_summary(entries: Sequence[Mapping[str, Any]], tis_cap: float) -> dict[str, Any] | None:
    """The bundle's mismatch figures over the entries whose ``logprob_diff`` is filled, or None
    when none is (see the module doc). Entries filled from engine answers (``--answers``) carry
    no ``k3``: they count in the distribution, not in the k3 and TIS figures."""
    scored = [e["logprob_diff"] for e in entries if isinstance(e.get("logprob_diff"), Mapping)]
    if not scored:
        return None
    means = sorted(float(d["mean_abs"]) for d in scored)
    weighted = [d for d in scored if "k3" in d]
    tokens = sum(int(d["tokens"]) for d in weighted)
    clipped = sum(int(d["tis_clipped"]) for d in weighted)
    return {
        "samples": len(scored),
        "mean_abs": {
            "mean": sum(means) / len(means),
            "p50": _quantile(means, 0.5),
            "p99": _quantile(means, 0.99),
            "max": means[-1],
        },
        "tokens": tokens,
        "non_finite_tokens": sum(int(d.get("non_finite", 0)) for d in scored),
        "k3": sum(float(d["k3"]) * int(d["tokens"]) for d in weighted) / tokens if tokens else 0.0,
        "tis_cap": tis_cap,
        "tis_clipped_tokens": clipped,
        "tis_clipped_fraction": clipped / tokens if tokens else 0.0,
    }


def threshold_problem(where: str, diff: Mapping[str, Any], limit: float | None) -> dict[str, Any] | None:
    """The ``logprob`` problem of a sample (``where``: its index and position) whose ``mean_abs``
    is over ``limit``, naming the turn and the first token over it; None when it is not."""
    first = diff.get("first_over") or {}
    if diff.get("non_finite"):
        return {"kind": "logprob", "image": None, "message": (
            f"{where}: the trainer's log-prob of {diff['non_finite']} response token(s) is not a finite "
            f"number (NaN or inf: an overflow?); first: turn {first.get('turn')}, response token "
            f"{first.get('offset')} (id {first.get('token')})"
        )}  # fmt: skip
    if limit is None or diff["mean_abs"] <= limit:
        return None
    return {"kind": "logprob", "image": None, "message": (
        f"{where}: the trainer's log-probs differ from the rollout's: mean_abs {diff['mean_abs']:.3g} over "
        f"--max-logprob-diff {limit:g} (max_abs {diff['max_abs']:.3g}); first token over it: turn "
        f"{first.get('turn')}, response token {first.get('offset')} (id {first.get('token')}, |diff| "
        f"{first.get('abs', 0.0):.3g})"
    )}  # fmt: skip
