"""A turn's action, parsed from text, so the page can draw it over the screenshot.

Two families of action text are understood (docs/TRAINER_HOOKS.md, "view"):

1. **Function calls**, as the demo and pyautogui-style agents write them, inside
   ``<tool_call>...</tool_call>`` or alone: ``click(212, 148)``, ``double_click(960, 540)``,
   ``right_click(x=10, y=20)``, ``move(…)``/``moveTo(…)``, ``drag(x1, y1, x2, y2)``, ``dragTo(x, y)``,
   ``scroll(dx, dy)`` (demo: ``scroll(0, -3)`` is 3 down), ``scroll(clicks)`` (pyautogui: positive
   is up), ``type('text')``/``typewrite``/``write``, ``key('enter')``/``press``/``hotkey('ctrl', 'c')``.
   A ``pyautogui.``/``computer.`` prefix is ignored. Arguments are read with
   :func:`ast.literal_eval`, never evaluated.
2. **JSON tool calls** of the computer-use tool (Qwen2.5-VL's ``computer_use`` function, the
   Anthropic-style ``computer`` tool that Miles' CUA environments pass through):
   ``{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [x, y]}}``, with
   ``arguments`` as an object or a JSON string, or the arguments object alone. Actions
   ``left_click``/``click``, ``right_click``, ``middle_click``, ``double_click``, ``triple_click``,
   ``mouse_move``, ``left_click_drag`` (``start_coordinate`` → ``coordinate``), ``scroll``
   (``scroll_direction`` + ``scroll_amount``, or Qwen's ``pixels``: positive is up), ``type``
   (``text``), ``key`` (``keys`` or ``text``), ``wait``, ``terminate``.

Anything else (an unknown name, a malformed call, text too long to be an action) is an
:class:`Action` of kind ``"text"``: the page shows it as text and draws nothing; parsing never
raises. Coordinates are in the screen space the agent saw: ``metadata.screen`` (``[w, h]``)
when the sample records it, else the screenshot's own pixels; the page scales them.

Which text belongs to which turn: ``metadata.actions[j]`` when the sample has that list (the
demo does), else the ``j``-th ``<tool_call>`` of the response.

Cost: a response may be any length and hold any number of ``<tool_call>`` tags (one of 12,000
unclosed tags made a lazy ``<tool_call>(.*?)</tool_call>`` regex scan the rest of the text from
every tag: quadratic, holding the GIL). :func:`tool_calls` therefore reads at most
``MAX_SHOWN_CHARS`` characters of the response (``bundles.support.LIMITS``), with ``str.find``
(each character looked at a bounded number of times), and returns at most ``MAX_SHOWN_TURNS``
calls: what a page shows, never more.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from bundles.support import LIMITS

__all__ = ["Action", "parse_action", "tool_calls"]

MAX_ACTION_TEXT = 4000  # longer text is shown, not parsed
MAX_SHOWN_CHARS = LIMITS["MAX_SHOWN_CHARS"]  # of a response, read for its tool calls
MAX_SHOWN_TURNS = LIMITS["MAX_SHOWN_TURNS"]  # tool calls taken from one response
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"^\s*(?:pyautogui\.|computer\.)?([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*;?\s*$", re.S)

_CLICKS = {
    "click": "click", "left_click": "click", "leftclick": "click", "tap": "click",
    "double_click": "double_click", "doubleclick": "double_click",
    "triple_click": "triple_click", "tripleclick": "triple_click",
    "right_click": "right_click", "rightclick": "right_click",
    "middle_click": "middle_click", "middleclick": "middle_click",
    "move": "move", "moveto": "move", "mouse_move": "move", "hover": "move",
}  # fmt: skip
_TYPES = {"type", "typewrite", "write", "type_text"}
_KEYS = {"key", "press", "hotkey", "key_press", "keypress"}
_DRAGS = {"drag", "dragto", "left_click_drag", "drag_to"}


@dataclass
class Action:
    kind: str  # click, double_click, triple_click, right_click, middle_click, move, drag, scroll, type, key, wait, done, text
    raw: str
    points: list[tuple[float, float]] = field(default_factory=list)  # click/move: 1; drag: 2 (from, to)
    scroll: tuple[float, float] | None = None  # (dx, dy) in wheel steps or pixels, +y is down
    text: str | None = None  # typed text, keys

    def describe(self) -> str:
        """A short human label: ``click (212, 148)``, ``scroll ↓ 3``, ``type "dark"``."""
        pts = " → ".join(f"({_n(x)}, {_n(y)})" for x, y in self.points)
        if self.kind == "scroll" and self.scroll is not None:
            dx, dy = self.scroll
            arrows = ("↓" if dy > 0 else "↑" if dy < 0 else "") + ("→" if dx > 0 else "←" if dx < 0 else "")
            amount = _n(max(abs(dx), abs(dy)))
            return f"scroll {arrows} {amount}" + (f" at {pts}" if pts else "")
        if self.kind in ("type", "key"):
            return f"{self.kind} {json.dumps(self.text or '', ensure_ascii=False)}"
        if self.kind == "text":
            return self.raw
        return f"{self.kind.replace('_', ' ')} {pts}".strip()


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.4g}"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # a JSON integer of 400 digits
        return None
    return f if math.isfinite(f) and abs(f) < 1e7 else None


def _point(v: Any) -> tuple[float, float] | None:
    if isinstance(v, (list, tuple)) and len(v) == 2:
        x, y = _num(v[0]), _num(v[1])
        if x is not None and y is not None:
            return (x, y)
    return None


def tool_calls(response: str) -> list[str]:
    """The text of each ``<tool_call>...</tool_call>`` in ``response``, in order: of its first
    ``MAX_SHOWN_CHARS`` characters, at most ``MAX_SHOWN_TURNS`` calls, in time linear in what is read.

    A tag with no closing tag ends the search (every later tag would be inside it), as the lazy
    regex this replaces matched nothing from it.
    """
    text = response[:MAX_SHOWN_CHARS]
    out: list[str] = []
    at = 0
    while len(out) < MAX_SHOWN_TURNS:
        start = text.find(_OPEN, at)
        if start < 0:
            break
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        out.append(text[start + len(_OPEN) : end].strip())
        at = end + len(_CLOSE)
    return out


def parse_action(text: str) -> Action:
    """Parse one action's text; an :class:`Action` of kind ``"text"`` when it is not understood."""
    raw = text
    if len(text) > MAX_ACTION_TEXT:
        return Action("text", raw)
    calls = tool_calls(text)
    if calls:
        text = calls[0]
    text = text.strip()
    try:
        if text.startswith("{"):
            return _from_json(json.loads(text), raw) or Action("text", raw)
        m = _CALL.match(text)
        if m:
            return _from_call(m.group(1), m.group(2), raw) or Action("text", raw)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        pass
    return Action("text", raw)


def _from_call(name: str, args_text: str, raw: str) -> Action | None:
    tree = ast.parse(f"f({args_text})", mode="eval")
    call = tree.body
    if not isinstance(call, ast.Call):
        return None
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    key = name.lower()
    nums = [n for n in (_num(a) for a in args) if n is not None]
    if key in _CLICKS:
        x, y = _num(kwargs.get("x")), _num(kwargs.get("y"))
        if x is None and len(nums) >= 2:
            x, y = nums[0], nums[1]
        if x is None and args and _point(args[0]):
            x, y = _point(args[0])  # type: ignore[misc]
        if x is None or y is None:
            return None
        return Action(_CLICKS[key], raw, [(x, y)])
    if key in _DRAGS:
        if len(nums) >= 4:
            return Action("drag", raw, [(nums[0], nums[1]), (nums[2], nums[3])])
        x, y = _num(kwargs.get("x")), _num(kwargs.get("y"))
        if x is None and len(nums) >= 2:
            x, y = nums[0], nums[1]
        if x is None or y is None:
            return None
        return Action("drag", raw, [(x, y)])  # to here, from wherever the pointer was
    if key == "scroll":
        if len(nums) >= 2:  # demo: scroll(dx, dy), +dy is down
            return Action("scroll", raw, scroll=(nums[0], nums[1]))
        if len(nums) == 1:  # pyautogui: scroll(clicks), positive is up
            point = (
                [(_num(kwargs.get("x")), _num(kwargs.get("y")))] if "x" in kwargs and "y" in kwargs else []
            )
            return Action("scroll", raw, [p for p in point if None not in p], scroll=(0.0, -nums[0]))  # type: ignore[misc]
        return None
    if key in ("hscroll",) and nums:
        return Action("scroll", raw, scroll=(nums[0], 0.0))
    if key in _TYPES:
        value = args[0] if args else kwargs.get("text", kwargs.get("message"))
        return Action("type", raw, text=value) if isinstance(value, str) else None
    if key in _KEYS:
        keys = [a for a in args if isinstance(a, str)] or (
            [kwargs["key"]] if isinstance(kwargs.get("key"), str) else []
        )
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            keys = [k for k in args[0] if isinstance(k, str)]
        return Action("key", raw, text="+".join(keys)) if keys else None
    if key in ("wait", "sleep"):
        return Action("wait", raw)
    if key in ("done", "terminate", "finish", "answer"):
        return Action("done", raw)
    return None


def _from_json(obj: Any, raw: str) -> Action | None:
    if not isinstance(obj, dict):
        return None
    args = obj.get("arguments", obj.get("input", obj))
    if isinstance(args, str):
        args = json.loads(args)
    if not isinstance(args, dict):
        return None
    action = args.get("action")
    if not isinstance(action, str):
        return None
    a = action.lower()
    coord = _point(args.get("coordinate"))
    if a in _CLICKS:
        return Action(_CLICKS[a], raw, [coord]) if coord else None
    if a in _DRAGS:
        start = _point(args.get("start_coordinate"))
        if start and coord:
            return Action("drag", raw, [start, coord])
        path = args.get("path")
        if isinstance(path, list):
            pts = [p for p in (_point(q) for q in path) if p]
            if len(pts) >= 2:
                return Action("drag", raw, [pts[0], pts[-1]])
        return Action("drag", raw, [coord]) if coord else None
    if a == "scroll":
        amount = _num(args.get("scroll_amount"))
        direction = args.get("scroll_direction")
        if isinstance(direction, str) and amount is not None:
            d = {"down": (0.0, 1.0), "up": (0.0, -1.0), "right": (1.0, 0.0), "left": (-1.0, 0.0)}.get(
                direction.lower()
            )
            if d:
                return Action("scroll", raw, [coord] if coord else [], scroll=(d[0] * amount, d[1] * amount))
        pixels = _num(args.get("pixels"))
        if pixels is not None:  # Qwen2.5-VL computer_use: positive scrolls up
            return Action("scroll", raw, [coord] if coord else [], scroll=(0.0, -pixels))
        return None
    if a in ("type", "type_text"):
        t = args.get("text")
        return Action("type", raw, text=t) if isinstance(t, str) else None
    if a in ("key", "hotkey", "key_press"):
        keys = args.get("keys", args.get("text"))
        if isinstance(keys, list):
            keys = "+".join(k for k in keys if isinstance(k, str))
        return Action("key", raw, text=keys) if isinstance(keys, str) and keys else None
    if a == "wait":
        return Action("wait", raw)
    if a in ("terminate", "done", "answer"):
        return Action("done", raw)
    return None
