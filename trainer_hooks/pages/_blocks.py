"""One sample as a page draws it: its head, prompt, turns, response, and its replay verdicts.

Its one reason to change is what a sample's block shows. ``view``'s report and every ``serve``
page that shows a sample (a sample, a group, a prompt across training, two samples compared)
build the block here and draw it with one macro (``templates/sample_block.html.j2``'s
``sample_block``); they differ only in where a picture comes from (an inlined ``data:`` URI, or a
same-origin JPEG the server makes), which the caller says through :func:`draw_turn`.

A replay verdict (guard, token checks, log-prob differences of ``rollout-bundle replay
--report``) is presented by :func:`replay_block` alone, for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainer_hooks.pages._actions import parse_action
from trainer_hooks.pages._format import badge, compact, finite, fmt, num, pretty, px, reward_text, text
from trainer_hooks.pages._graphics import logprob_strip, mismatch_strips, overlay
from trainer_hooks.pages._samples import MAX_SHOWN_TURNS, SampleView

__all__ = [
    "advantages",
    "draw_turn",
    "link_turns",
    "logprob_summary",
    "mismatch_of",
    "new_turn",
    "prompt_messages",
    "replay_block",
    "reward_spread",
    "sample_block",
    "turn_action",
]

MAX_PROBLEM_KIND = 40  # characters of a replay problem's kind shown
MAX_PROBLEM_MESSAGE = 2000  # characters of a replay problem's message shown


def prompt_messages(prompt: Any) -> list[dict[str, Any]] | None:
    """The prompt as messages ``{"role", "text"}`` (role None for a plain string or other value)."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return [{"role": None, **text(prompt)}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        out = []
        for m in prompt:
            content = m.get("content")
            if isinstance(content, list):
                body = "\n".join(
                    str(c.get("text", "")) if isinstance(c, dict) and c.get("type") == "text" else
                    f"[{c.get('type', 'part')}]" if isinstance(c, dict) else str(c)
                    for c in content
                )  # fmt: skip
            else:
                body = "" if content is None else content if isinstance(content, str) else compact(content)
            out.append({"role": str(m["role"]), **text(body)})
        return out
    return [{"role": None, **text(pretty(prompt))}]


def turn_action(v: SampleView, j: int) -> tuple[str | None, Any, str | None]:
    """Turn ``j``'s action: its text (the sample's recorded actions, else its j-th tool call), the
    parsed action (drawn over the screenshot by ``overlay``) and, unless it is plain text, its
    description."""
    said = v.actions[j] if v.actions is not None and j < len(v.actions) else None
    if said is None and v.actions is None and j < len(v.tool_calls):
        said = v.tool_calls[j]
    action = parse_action(said) if said is not None else None
    return said, action, action.describe() if action is not None and action.kind != "text" else None


def new_turn(v: SampleView, j: int, uid: str = "") -> tuple[dict[str, Any], Any]:
    """Turn ``j`` of ``v`` before its picture is known (a placeholder naming why there is none),
    and its parsed action."""
    img = v.images[j]
    turn: dict[str, Any] = {"j": j, "id": f"{uid}v{v.position}-{j}", "ref": None, "href": None, "why": img.shown_as,
                            "size": None, "large": None, "shapes": [], "mark": None, "name": img.name,
                            "title": img.shown_as, "vision": None}  # fmt: skip
    turn["action"], action, turn["action_desc"] = turn_action(v, j)
    return turn, action


def draw_turn(turn: dict[str, Any], v: SampleView, action: Any, ref: str, size: tuple[int, int],
              thumb: tuple[int, int]) -> None:  # fmt: skip
    """Put the picture ``ref`` (the id of its thumbnail, ``size`` pixels, drawn ``thumb`` pixels
    large) on ``turn``, with the action drawn over it in the picture's own pixels: the whole
    action for the large view, one ring where the pointer went for the thumbnail."""
    w, h = size
    tw, th = thumb
    turn.update(ref=ref, w=w, h=h, tw=tw, th=th, scale=px(w / tw))
    turn["shapes"] = overlay(action, (w, h), v.screen)
    ring = next((sh for sh in reversed(turn["shapes"]) if sh["t"] == "ring"), None)
    turn["mark"] = {"cx": ring["cx"], "cy": ring["cy"], "r": px(max(w, h) / 40)} if ring else None


def link_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each large view's links to the turns before and after it that have one."""
    for k, t in enumerate(turns):
        t["prev"] = turns[k - 1]["id"] if k > 0 and turns[k - 1]["large"] else None
        t["next"] = turns[k + 1]["id"] if k + 1 < len(turns) and turns[k + 1]["large"] else None
    return turns


def sample_block(v: SampleView, turns: list[dict[str, Any]], advantage: float | None) -> dict[str, Any]:
    """What ``sample_block`` draws of ``v`` (its turns built by the caller); ``replay``,
    ``href``, ``classes`` and ``order`` are the caller's to fill in."""
    head = [("index", fmt(v.index)), ("group", fmt(v.group_index))]
    tail = [("reward", reward_text(v.reward))]
    if advantage is not None:
        tail.append(("advantage", f"{advantage:+.3g}"))
    tail += [("tokens", fmt(v.tokens)), ("response", fmt(v.response_length))]
    if v.loss_mask is not None:
        tail.append(("loss mask", v.loss_mask))
    if v.logprob_mean is not None:
        tail.append(("mean log-prob", f"{v.logprob_mean:.4g}"))
    return {
        "pos": v.position, "href": None, "classes": None, "order": None, "head": head, "badge": badge(v.status),
        "tail": tail, "replay": None,
        "prompt": prompt_messages(v.prompt),
        "turns": turns,
        "more_turns": v.more_turns,
        "response": text(v.response, v.more_response) if v.response else None,
        "strip": logprob_strip(v.logprobs),
        "metadata": text(pretty(v.metadata)) if v.metadata else None,
        "other": text(pretty(v.other)) if v.other else None,
        "other_count": len(v.other),
    }  # fmt: skip


def replay_block(r: Mapping[str, Any] | None, recorded: list[float | None] | None = None) -> dict[str, Any]:
    """A sample's replay verdicts (its row of a replay report; None: not in the report) as
    ``sample_block`` draws them: each problem's kind and message, the log-prob differences
    (``diff``: the figures, the first token over the threshold, one line per turn up to
    ``MAX_SHOWN_TURNS``) and, given the sample's ``recorded`` log-probs, the strips of both against
    each other (:func:`~trainer_hooks.pages._graphics.mismatch_strips`)."""
    if r is None:
        return {"missing": True, "problems": [], "diff": None, "strips": None}
    problems = []
    for p in r.get("problems") or []:
        if isinstance(p, dict):
            where = f" (image {fmt(p['image'])})" if p.get("image") is not None else ""
            kind, message = fmt(p.get("kind", "problem")), fmt(p.get("message", ""))
            problems.append(
                {"kind": kind[:MAX_PROBLEM_KIND], "message": message[:MAX_PROBLEM_MESSAGE] + where}
            )
    diff = r.get("logprob_diff")
    d: dict[str, Any] | None = None
    strips = None
    if isinstance(diff, dict):
        d = {"max": fmt(diff.get("max_abs")), "mean": fmt(diff.get("mean_abs")), "tokens": fmt(diff.get("tokens")),
             "k3": None if diff.get("k3") is None else fmt(diff.get("k3")),
             "tis_clipped": None if diff.get("tis_clipped") is None else fmt(diff.get("tis_clipped")),
             "first_over": _first_over(diff.get("first_over")), "turns": [], "more_turns": 0}  # fmt: skip
        turns: list[Any] = diff["turns"] if isinstance(diff.get("turns"), list) else []
        d["turns"] = [{"turn": fmt(t.get("turn")), "start": fmt(t.get("start")), "tokens": fmt(t.get("tokens")),
                       "mean": fmt(t.get("mean_abs")), "max": fmt(t.get("max_abs"))}
                      for t in turns[:MAX_SHOWN_TURNS] if isinstance(t, dict)]  # fmt: skip
        d["more_turns"] = max(0, len(turns) - MAX_SHOWN_TURNS)
        strips = mismatch_strips(recorded, diff.get("recomputed"), diff.get("first_over"))
    return {"missing": False, "problems": problems, "diff": d, "strips": strips}


def _first_over(first: Any) -> str | None:
    """The first token over the replay's threshold, as a line: None when there is none."""
    if not isinstance(first, dict):
        return None
    shown = {k: "–" if first.get(k) is None else num(first.get(k)) for k in ("turn", "offset", "token")}
    return (f"turn {shown['turn']}, response token {shown['offset']} (id {shown['token']}), "
            f"|diff| {fmt(finite(first.get('abs')))}")  # fmt: skip


def mismatch_of(r: Mapping[str, Any] | None) -> float | None:
    """How far a sample's recomputed log-probs are from its recorded ones (its report row's
    ``logprob_diff.mean_abs``), the key both pages sort by; None when not compared."""
    diff = r.get("logprob_diff") if r is not None else None
    return finite(diff.get("mean_abs")) if isinstance(diff, dict) else None


def logprob_summary(report: Mapping[str, Any]) -> str | None:
    """The bundle's mismatch across its samples (a replay report's ``summary.logprob``) as one
    line: the distribution of the samples' ``mean_abs``, the k3 KL estimate, and the share of
    tokens a truncated importance-sampling correction clips; None when the report has none."""
    summary = report.get("summary")
    s = summary.get("logprob") if isinstance(summary, dict) else None
    if not isinstance(s, dict):
        return None
    dist: dict[str, Any] = s["mean_abs"] if isinstance(s.get("mean_abs"), dict) else {}
    share = finite(s.get("tis_clipped_fraction"))
    return (f"mean_abs over {fmt(s.get('samples'))} samples: mean {fmt(dist.get('mean'))} · p50 "
            f"{fmt(dist.get('p50'))} · p99 {fmt(dist.get('p99'))} · max {fmt(dist.get('max'))}; k3 "
            f"{fmt(s.get('k3'))}; TIS at cap {fmt(s.get('tis_cap'))} clips "
            f"{'–' if share is None else f'{share:.2%}'} of {fmt(s.get('tokens'))} tokens")  # fmt: skip


def reward_spread(rewards: list[float]) -> dict[str, Any] | None:
    """A GRPO group's reward spread as its page shows it (mean, unbiased std, min, max, and
    ``flat``: every reward equal, so every advantage is 0); None without rewards."""
    if not rewards:
        return None
    mean = math.fsum(rewards) / len(rewards)
    std = (
        math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        if len(rewards) > 1
        else 0.0
    )
    return {"mean": f"{mean:.3g}", "std": f"{std:.3g}", "min": f"{min(rewards):.3g}",
            "max": f"{max(rewards):.3g}", "flat": len(rewards) > 1 and std == 0}  # fmt: skip


def advantages(rewards: list[float | None]) -> list[float | None]:
    """GRPO advantages as Miles computes them (``_normalize_rewards_by_rollout``): reward minus
    the group mean, divided by the group's unbiased standard deviation + 1e-6 when the group has
    more than one sample and that deviation is not 0 (``--disable-grpo-std-normalization`` off)."""
    known = [r for r in rewards if r is not None]
    if not known:
        return [None] * len(rewards)
    mean = math.fsum(known) / len(known)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in known) / (len(known) - 1)) if len(known) > 1 else 0.0
    return [None if r is None else (r - mean) / (std + 1e-6) if std > 0 else r - mean for r in rewards]
