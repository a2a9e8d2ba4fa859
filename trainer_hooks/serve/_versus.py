"""Two (or more) runs side by side: ``rollout-bundle serve RUN_A RUN_B``'s ``/runs`` page.

What a person comparing two runs asks first (what OSWorld's monitor shows for two runs): on the
*same* prompts, how do reward and success move step by step in each run, which prompts does one
run solve and the other not, and what did each run do on one of those prompts. So the page holds:

- per step, for each run, the mean reward and the success rate (the share of samples whose
  reward is above 0) over the prompts every run holds (a prompt only one run saw would make the
  runs' figures incomparable), and a trend of each;
- the prompts whose success rate differs most between the runs (over all their steps), each
  linked to the prompt page with the latest bundle of the first run that holds it beside the
  latest of the run that differs most from it, where the trajectories are drawn side by side.

A prompt is the key the index gives it (its ``metadata.prompt_id`` / ``dataset_index`` /
``data_index`` / ``task_id``, else the hash of its text), so two runs over one dataset match.
One kind is compared at a time (a run's eval bundles and its rollout bundles are two series, as
on the run page): the kind with most bundles over the runs by default (the rollout kind), another
with ``?kind=``; the page says which kind it compares and links the others.

Costs: each run's figures come from at most :data:`~trainer_hooks.serve._pages.TREND_BUNDLES`
indexed bundles of the kind spread over it, one ``GROUP BY`` each, read in one pass that keeps
beside each step's tallies the run's total per prompt, so the prompts that differ are found in
prompts x runs (not prompts x steps x runs). At most :data:`MAX_PROMPTS` prompts are kept per run
(the distinct rest counted, up to as many again). A run's figures are cached, keyed by what they
were read from: the sampled bundles' ids and identities and their indexes' build state (a complete
index never changes); a refresh while indexes build re-reads only when one of those has moved, and
an entry is dropped after :data:`CACHE_SECONDS` or when :data:`CACHE_RUNS` newer ones are kept.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer_hooks.pages import fmt
from trainer_hooks.serve._app import ServeApp
from trainer_hooks.serve._parts import trend
from trainer_hooks.serve._run import BundleEntry, Run

__all__ = ["MAX_PROMPTS", "SHOWN_PROMPTS", "runs_page"]

MAX_PROMPTS = 100_000  # prompts kept per run; beyond, counted and left out
SHOWN_PROMPTS = 50  # prompts listed as differing most
CACHE_SECONDS = 60.0  # a run's figures are reused this long at most (and only while their sources hold)
CACHE_RUNS = 16  # runs' figures kept in the cache at most (each up to MAX_PROMPTS prompts per step read)


@dataclass
class _Tally:
    """Samples with a reward, their reward sum and how many succeeded (reward > 0)."""

    n: int = 0
    reward: float = 0.0
    success: int = 0

    def add(self, n: int, reward: float, success: int) -> None:
        self.n, self.reward, self.success = self.n + n, self.reward + reward, self.success + success


@dataclass
class _RunFigures:
    name: str
    by_step: dict[int, dict[str, _Tally]] = field(default_factory=dict)  # step -> prompt -> tally
    totals: dict[str, _Tally] = field(default_factory=dict)  # prompt -> its tally over every step read
    latest: dict[str, BundleEntry] = field(default_factory=dict)  # prompt -> the latest bundle holding it
    heads: dict[str, str] = field(default_factory=dict)
    left_out: set[str] = field(default_factory=set)  # distinct prompts beyond MAX_PROMPTS (at most as many)
    pending: int = 0

    def add(self, e: BundleEntry, rows: list[tuple[Any, ...]]) -> None:
        """One bundle's ``(prompt_key, n, reward sum, successes, head)`` rows, in the run's order."""
        tallies = self.by_step.setdefault(int(e.step or 0), {})
        for key, n, total, success, head in rows:
            if key not in self.heads and len(self.heads) >= MAX_PROMPTS:
                if len(self.left_out) < MAX_PROMPTS:
                    self.left_out.add(key)
                continue
            tallies.setdefault(key, _Tally()).add(int(n), float(total), int(success))
            self.totals.setdefault(key, _Tally()).add(int(n), float(total), int(success))
            self.heads.setdefault(key, (head or "")[:120])
            self.latest[key] = e  # in the run's order: the latest step last


class _Cache:
    """A run's figures by (app, run, kind), each with the signature of what it was read from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, tuple[float, Hashable, _RunFigures]] = {}

    def get(self, key: Hashable, signature: Hashable, read: Callable[[], _RunFigures]) -> _RunFigures:
        now = time.monotonic()
        with self._lock:
            hit = self._held.get(key)
            if hit is not None and hit[1] == signature and now - hit[0] < CACHE_SECONDS:
                return hit[2]
        figures = read()
        with self._lock:
            self._held.pop(key, None)
            self._held[key] = (now, signature, figures)
            while len(self._held) > CACHE_RUNS:
                self._held.pop(next(iter(self._held)))
        return figures


_CACHE = _Cache()


def _run_name(run: Run) -> str:
    return os.path.basename(run.root.rstrip("/")) or run.root


def _sampled(run: Run, kind: str, trend_bundles: int) -> list[BundleEntry]:
    every = [e for e in run.ordered() if e.step is not None and e.kind == kind]
    return every[:: max(1, -(-len(every) // trend_bundles))]


def _figures(app: ServeApp, run: Run, kind: str, trend_bundles: int) -> _RunFigures:
    sampled = _sampled(run, kind, trend_bundles)
    states = [app.indexer.state(e) for e in sampled]
    signature = tuple(
        (e.id, e.identity, st.complete, st.error) for e, st in zip(sampled, states, strict=True)
    )
    return _CACHE.get((id(app), run.root, kind, trend_bundles), signature,
                      lambda: _read(app, _run_name(run), sampled, states))  # fmt: skip


def _read(app: ServeApp, name: str, sampled: list[BundleEntry], states: list[Any]) -> _RunFigures:
    out = _RunFigures(name)
    for e, st in zip(sampled, states, strict=True):
        if not st.complete:
            out.pending += 0 if st.error else 1
            continue
        with app.indexer.connect(e) as con:
            rows = con.execute(
                "SELECT prompt_key, count(*), sum(reward), sum(reward > 0), max(prompt_head) FROM samples "
                "WHERE reward IS NOT NULL GROUP BY prompt_key"
            ).fetchall()
        out.add(e, rows)
    return out


def _kinds(runs: list[Run]) -> list[tuple[str, int]]:
    """Every kind of bundle with a step over the runs, with its count, most bundles first."""
    counts: dict[str, int] = {}
    for r in runs:
        for e in r.ordered():
            if e.step is not None:
                counts[e.kind] = counts.get(e.kind, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _over(tallies: dict[str, _Tally], keys: set[str]) -> _Tally:
    t = _Tally()
    for k in keys & tallies.keys():
        t.add(tallies[k].n, tallies[k].reward, tallies[k].success)
    return t


def _rate(t: _Tally | None) -> float | None:
    return t.success / t.n if t is not None and t.n else None


def runs_page(app: ServeApp, trend_bundles: int, query: Mapping[str, str] | None = None) -> str:
    """The ``/runs`` page (see the module doc); ``?kind=`` picks the kind of bundle compared."""
    kinds = _kinds(app.runs)
    asked = (query or {}).get("kind")
    kind = asked if asked in dict(kinds) else (kinds[0][0] if kinds else "")
    runs = [_figures(app, r, kind, trend_bundles) for r in app.runs]
    common = set.intersection(*(set(f.heads) for f in runs)) if runs else set()
    steps = sorted({s for f in runs for s in f.by_step})
    rows = []
    for s in steps:
        cells = []
        for f in runs:
            t = _over(f.by_step.get(s, {}), common)
            cells.append({"reward": fmt(t.reward / t.n if t.n else None, 3), "success": _percent(_rate(t)),
                          "n": t.n})  # fmt: skip
        rows.append({"step": s, "cells": cells})
    others = [
        {"kind": k, "n": n, "href": "/runs?" + urllib.parse.urlencode({"kind": k})}
        for k, n in kinds
        if k != kind
    ]
    return app.render("runs.html.j2", title="runs side by side", runs=[f.name for f in runs], rows=rows,
                      trends=_trends(runs, common), common=len(common), prompts=_differing(runs, common),
                      kind=kind, other_kinds=others, unknown_kind=asked if asked and asked != kind else None,
                      left_out=sum(len(f.left_out) for f in runs), pending=sum(f.pending for f in runs),
                      refresh=5 if any(f.pending for f in runs) else None,
                      crumbs=[(None, "runs side by side")])  # fmt: skip


def _trends(runs: list[_RunFigures], common: set[str]) -> list[Any]:
    out = []
    for f in runs:
        tallies = [(s, _over(f.by_step[s], common)) for s in sorted(f.by_step)]
        points = [(s, r) for s, t in tallies if (r := _rate(t)) is not None]
        rewards = [(s, t.reward / t.n) for s, t in tallies if t.n]
        out += [
            c
            for c in (trend(f"success rate · {f.name}", points), trend(f"reward mean · {f.name}", rewards))
            if c
        ]
    return out


def _differing(runs: list[_RunFigures], common: set[str]) -> list[dict[str, Any]]:
    """The prompts every run holds, by how far apart the runs' success rates are (over all steps):
    one look-up of each run's total per prompt (prompts x runs)."""
    out = []
    for key in common:
        rates = [_rate(f.totals.get(key)) for f in runs]
        known = [r for r in rates if r is not None]
        if len(known) < 2:
            continue
        spread = max(known) - min(known)
        first = rates[0] if rates[0] is not None else known[0]
        other = max(range(len(runs)), key=lambda k: -1.0 if rates[k] is None else abs(rates[k] - first))  # type: ignore[operator]
        a, b = runs[0].latest[key], runs[other].latest[key]
        query = urllib.parse.urlencode({"key": key, "a": a.id, "b": b.id})
        out.append((spread, runs[0].heads.get(key, ""), f"/prompt?{query}", [_percent(r) for r in rates]))
    out.sort(key=lambda p: (-p[0], p[1]))
    return [{"spread": _percent(spread), "head": head, "href": href, "rates": rates}
            for spread, head, href, rates in out[:SHOWN_PROMPTS]]  # fmt: skip


def _percent(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"
