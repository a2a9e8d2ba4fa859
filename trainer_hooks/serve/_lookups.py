"""The index read: what the pages ask of a bundle's index, in SQL.

The bundle page's table (:class:`Query`: filters, a sort, a keyset page: ``after`` is the last
row's sort value and position, never an ``OFFSET``), a bundle's statuses, its GRPO groups (paged by
name) and one group's rows, one prompt's rows, one row, and the positions of the samples ``diff
--by index`` names. Every value reaches SQLite as a parameter; the column names come from
:data:`~trainer_hooks.serve._rows.SORTS`, never from the URL.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from trainer_hooks.serve._rows import BIG, SORTS, fts_query, key_text

__all__ = ["Query", "group_rows", "groups_page", "positions_of", "prompt_rows", "row_at", "statuses"]


@dataclass
class Query:
    """What the bundle page asks: filters, a sort, a page (keyset: ``after`` is the last row's
    sort value and position)."""

    status: str | None = None
    group: str | None = None
    prompt: str | None = None  # a prompt key
    search: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    length_min: int | None = None
    length_max: int | None = None
    turns_min: int | None = None
    turns_max: int | None = None
    truncated: bool | None = None
    sort: str = "position"
    desc: bool = False
    after: tuple[float, int] | None = None
    limit: int = 50

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if self.status is not None:
            if self.status == "no status":
                clauses.append("status IS NULL")
            else:
                clauses.append("status = ?")
                args.append(self.status)
        if self.group is not None:
            clauses.append("grp = ?")
            args.append(self.group)
        if self.prompt is not None:
            clauses.append("prompt_key = ?")
            args.append(self.prompt)
        for col, lo, hi in (("reward", self.reward_min, self.reward_max), ("resp_len", self.length_min, self.length_max),
                            ("turns", self.turns_min, self.turns_max)):  # fmt: skip
            if lo is not None:
                clauses.append(f"{col} >= ?")
                args.append(lo)
            if hi is not None:
                clauses.append(f"{col} <= ?")
                args.append(hi)
        if self.truncated is not None:
            clauses.append("truncated = ?")
            args.append(int(self.truncated))
        fts = fts_query(self.search) if self.search else None
        if fts is not None:
            clauses.append("pos IN (SELECT rowid FROM fts WHERE fts MATCH ?)")
            args.append(fts)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def run(self, con: sqlite3.Connection) -> tuple[list[dict[str, Any]], int, tuple[float, int] | None]:
        """(rows of this page, rows matching, the cursor of the next page or None)."""
        where, args = self.where()
        total = con.execute(f"SELECT count(*) FROM samples{where}", args).fetchone()[0]
        col = SORTS.get(self.sort, "pos")
        key = "pos" if col == "pos" else f"ifnull({col}, {-BIG if self.desc else BIG})"
        direction = "DESC" if self.desc else "ASC"
        page_args = list(args)
        keyset = ""
        if self.after is not None:
            op = "<" if self.desc else ">"
            keyset = (" AND " if where else " WHERE ") + (
                f"pos {op} ?" if col == "pos" else f"({key}, pos) {op} (?, ?)"
            )
            page_args += [self.after[1]] if col == "pos" else [self.after[0], self.after[1]]
        sql = (f"SELECT pos, idx, grp, status, reward, reward_text, resp_len, tokens, turns, advantage, prompt_key, "
               f"prompt_head, truncated, {key} FROM samples{where}{keyset} ORDER BY {key} {direction}, pos {direction} "
               f"LIMIT ?")  # fmt: skip
        page_args.append(self.limit + 1)
        names = ("pos", "idx", "grp", "status", "reward", "reward_text", "resp_len", "tokens", "turns", "advantage",
                 "prompt_key", "prompt_head", "truncated", "_key")  # fmt: skip
        rows = [dict(zip(names, r, strict=True)) for r in con.execute(sql, page_args)]
        nxt = None
        if len(rows) > self.limit:
            rows = rows[: self.limit]
            last = rows[-1]
            nxt = (float(last["_key"]), int(last["pos"]))
        return rows, total, nxt


def statuses(con: sqlite3.Connection) -> list[tuple[str, int]]:
    return [(s, n) for s, n in con.execute(
        "SELECT ifnull(status, 'no status'), count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC LIMIT 50")]  # fmt: skip


def group_rows(con: sqlite3.Connection, group: str, limit: int = 64) -> list[dict[str, Any]]:
    names = ("pos", "status", "reward", "reward_text", "advantage", "resp_len", "turns")
    return [dict(zip(names, r, strict=True)) for r in con.execute(
        "SELECT pos, status, reward, reward_text, advantage, resp_len, turns FROM samples WHERE grp = ? ORDER BY pos "
        "LIMIT ?", (group, limit))]  # fmt: skip


def groups_page(con: sqlite3.Connection, offset_after: str | None, limit: int) -> list[dict[str, Any]]:
    """Groups ordered by name (keyset on the name), with their size and reward spread."""
    args: list[Any] = []
    where = "WHERE grp IS NOT NULL"
    if offset_after is not None:
        where += " AND grp > ?"
        args.append(offset_after)
    args.append(limit)
    names = ("grp", "n", "mean", "lo", "hi")
    return [dict(zip(names, r, strict=True)) for r in con.execute(
        f"SELECT grp, count(*), avg(reward), min(reward), max(reward) FROM samples {where} GROUP BY grp ORDER BY grp "
        f"LIMIT ?", args)]  # fmt: skip


def prompt_rows(con: sqlite3.Connection, key: str, limit: int = 64) -> list[dict[str, Any]]:
    names = ("pos", "status", "reward", "reward_text", "resp_len", "turns", "prompt_head")
    return [dict(zip(names, r, strict=True)) for r in con.execute(
        "SELECT pos, status, reward, reward_text, resp_len, turns, prompt_head FROM samples WHERE prompt_key = ? "
        "ORDER BY pos LIMIT ?", (key, limit))]  # fmt: skip


def row_at(con: sqlite3.Connection, pos: int) -> dict[str, Any] | None:
    names = ("pos", "idx", "grp", "status", "reward", "reward_text", "resp_len", "tokens", "turns", "advantage",
             "prompt_key", "prompt_head", "truncated")  # fmt: skip
    r = con.execute(f"SELECT {', '.join(names)} FROM samples WHERE pos = ?", (pos,)).fetchone()
    return None if r is None else dict(zip(names, r, strict=True))


def positions_of(con: sqlite3.Connection, keys: list[Any]) -> dict[Any, int]:
    """The positions of the samples whose ``index`` is each of ``keys`` (as ``diff --by index``
    names them), where the index holds one."""
    out: dict[Any, int] = {}
    for key in keys:
        text = key_text(key)
        if text is None:
            continue
        r = con.execute("SELECT pos FROM samples WHERE idx = ? ORDER BY pos LIMIT 1", (text,)).fetchone()
        if r is not None:
            out[key] = int(r[0])
    return out
