"""What a request asks, parsed: a value that does not parse is a :class:`PageError`, never a 500.

Each route's path and query parameters are read here before any page is assembled: a position
(:func:`parse_int`), and the bundle page's filters, sort and keyset page (:func:`parse_query`,
into a :class:`~trainer_hooks.serve._lookups.Query`). Numbers are bounded to what SQLite holds,
texts cut before they reach a query, and every refusal names the parameter and what was found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainer_hooks.serve._lookups import Query
from trainer_hooks.serve._rows import SORTS

__all__ = ["MAX_PAGE", "PAGE", "PageError", "not_found", "parse_int", "parse_query"]

PAGE = 50  # rows of a bundle page, unless ``limit`` says otherwise
MAX_PAGE = 500


class PageError(Exception):
    """A request refused, as a page: its HTTP status, a heading and a message."""

    def __init__(self, status: int, heading: str, message: str) -> None:
        super().__init__(message)
        self.status, self.heading, self.message = status, heading, message


def not_found(what: str) -> PageError:
    return PageError(404, "not found", what)


def parse_int(text: str, name: str) -> int:
    """``text`` as a position or a count: a 400 when it is not an integer, a 404 when out of range."""
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise PageError(400, "bad number", f"{name}: expected an integer, found {str(text)[:40]!r}") from None
    if n < 0 or n >= 2**62:
        raise PageError(404, "not found", f"{name}: {n} is out of range")
    return n


def parse_query(params: Mapping[str, str]) -> tuple[Query, dict[str, str]]:
    """The bundle page's query string as a :class:`Query`; a value that does not parse is a 400."""
    shown = {k: params.get(k, "") for k in ("q", "status", "group", "reward_min", "reward_max", "length_min",
                                            "length_max", "turns_min", "turns_max", "sort", "order")}  # fmt: skip
    q = Query()
    q.search = shown["q"][:400] or None
    q.status = shown["status"][:64] or None
    q.group = shown["group"][:200] or None

    def number(name: str, integer: bool) -> Any:
        text = shown[name].strip()
        if not text:
            return None
        try:
            v = int(text) if integer else float(text)
        except ValueError:
            raise PageError(400, "bad filter", f"{name}: expected {'an integer' if integer else 'a number'}, "
                            f"found {text[:40]!r}") from None  # fmt: skip
        if not integer and not math.isfinite(v):
            raise PageError(400, "bad filter", f"{name}: expected a finite number, found {text[:40]!r}")
        if integer and abs(v) >= 2**62:
            raise PageError(400, "bad filter", f"{name}: out of range")
        return v

    q.reward_min, q.reward_max = number("reward_min", False), number("reward_max", False)
    q.length_min, q.length_max = number("length_min", True), number("length_max", True)
    q.turns_min, q.turns_max = number("turns_min", True), number("turns_max", True)
    sort = shown["sort"] or "position"
    if sort not in SORTS:
        raise PageError(400, "bad sort", f"sort: expected one of {', '.join(SORTS)}, found {sort[:40]!r}")
    q.sort, shown["sort"] = sort, sort
    order = shown["order"] or "asc"
    if order not in ("asc", "desc"):
        raise PageError(400, "bad order", f"order: expected asc or desc, found {order[:40]!r}")
    q.desc, shown["order"] = order == "desc", order
    after = params.get("after")
    if after:
        value, _, pos = after.rpartition(":")
        try:
            v, p = float(value), int(pos)
        except ValueError:
            raise PageError(
                400, "bad page", f"after: expected <value>:<position>, found {after[:60]!r}"
            ) from None
        if not math.isfinite(v) or not 0 <= p < 2**62:  # SQLite's integers end at 2**63
            raise PageError(400, "bad page", f"after: out of range: {after[:60]!r}")
        q.after = (v, p)
    limit = params.get("limit")
    if limit:
        try:
            q.limit = max(1, min(MAX_PAGE, int(limit)))
        except ValueError:
            raise PageError(400, "bad limit", f"limit: expected an integer, found {limit[:20]!r}") from None
    else:
        q.limit = PAGE
    return q, shown
