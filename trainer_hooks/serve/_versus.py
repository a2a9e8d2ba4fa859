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
Costs: each run's figures come from at most :data:`~trainer_hooks.serve._pages.TREND_BUNDLES`
indexed bundles spread over it, one ``GROUP BY`` each; at most :data:`MAX_PROMPTS` prompts are
kept per run (the rest counted), :data:`SHOWN_PROMPTS` listed.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from trainer_hooks.pages import fmt
from trainer_hooks.serve._app import ServeApp
from trainer_hooks.serve._parts import trend
from trainer_hooks.serve._run import BundleEntry, Run

__all__ = ["MAX_PROMPTS", "SHOWN_PROMPTS", "runs_page"]

MAX_PROMPTS = 100_000  # prompts kept per run; beyond, counted and left out
SHOWN_PROMPTS = 50  # prompts listed as differing most


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
    latest: dict[str, BundleEntry] = field(default_factory=dict)  # prompt -> the latest bundle holding it
    heads: dict[str, str] = field(default_factory=dict)
    left_out: int = 0
    pending: int = 0


def _run_name(run: Run) -> str:
    return os.path.basename(run.root.rstrip("/")) or run.root


def _figures(app: ServeApp, run: Run, trend_bundles: int) -> _RunFigures:
    every = [e for e in run.ordered() if e.step is not None]
    step = max(1, -(-len(every) // trend_bundles))
    out = _RunFigures(_run_name(run))
    for e in every[::step]:
        st = app.indexer.state(e)
        if not st.complete:
            out.pending += 0 if st.error else 1
            continue
        with app.indexer.connect(e) as con:
            rows = con.execute(
                "SELECT prompt_key, count(*), sum(reward), sum(reward > 0), max(prompt_head) FROM samples "
                "WHERE reward IS NOT NULL GROUP BY prompt_key"
            ).fetchall()
        tallies = out.by_step.setdefault(int(e.step or 0), {})
        for key, n, total, success, head in rows:
            if key not in out.heads and len(out.heads) >= MAX_PROMPTS:
                out.left_out += 1
                continue
            tallies.setdefault(key, _Tally()).add(int(n), float(total), int(success))
            out.heads.setdefault(key, (head or "")[:120])
            out.latest[key] = e  # in the run's order: the latest step last
    return out


def _over(tallies: dict[str, _Tally], keys: set[str]) -> _Tally:
    t = _Tally()
    for k in keys & tallies.keys():
        t.add(tallies[k].n, tallies[k].reward, tallies[k].success)
    return t


def _rate(t: _Tally) -> float | None:
    return t.success / t.n if t.n else None


def runs_page(app: ServeApp, trend_bundles: int) -> str:
    """The ``/runs`` page (see the module doc)."""
    runs = [_figures(app, r, trend_bundles) for r in app.runs]
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
    trends = []
    for f in runs:
        tallies = [(s, _over(f.by_step[s], common)) for s in sorted(f.by_step)]
        points = [(s, r) for s, t in tallies if (r := _rate(t)) is not None]
        rewards = [(s, t.reward / t.n) for s, t in tallies if t.n]
        trends += [
            c
            for c in (trend(f"success rate · {f.name}", points), trend(f"reward mean · {f.name}", rewards))
            if c
        ]
    return app.render("runs.html.j2", title="runs side by side", runs=[f.name for f in runs], rows=rows,
                      trends=trends, common=len(common), prompts=_differing(runs, common),
                      left_out=sum(f.left_out for f in runs), pending=sum(f.pending for f in runs),
                      refresh=5 if any(f.pending for f in runs) else None,
                      crumbs=[(None, "runs side by side")])  # fmt: skip


def _differing(runs: list[_RunFigures], common: set[str]) -> list[dict[str, Any]]:
    """The prompts every run holds, by how far apart the runs' success rates are (over all steps)."""
    out = []
    for key in common:
        rates = [_rate(_over_steps(f, key)) for f in runs]
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


def _over_steps(f: _RunFigures, key: str) -> _Tally:
    t = _Tally()
    for tallies in f.by_step.values():
        if key in tallies:
            t.add(tallies[key].n, tallies[key].reward, tallies[key].success)
    return t


def _percent(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"
