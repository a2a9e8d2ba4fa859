"""The search page, the one page with a script, and its Content-Security-Policy hashes.

Its one reason to change is the search page: which text it holds, and the CSP that allows exactly
its one script and its one stylesheet by their SHA-256 hashes.
"""

from __future__ import annotations

from trainer_hooks.pages import SampleView, prompt_messages, render, reward_text

__all__ = ["render_search", "search_rows"]

SEARCH_TEXT = 2000  # characters of a prompt and of a response the search page holds
_HASH_SLOT = "__SCRIPT_AND_STYLE_HASHES__"


def search_rows(views: list[SampleView]) -> list[dict[str, str]]:
    rows = []
    for v in views:
        prompt = " ".join(m["text"] for m in prompt_messages(v.prompt) or [])
        rows.append({"pos": str(v.position), "status": v.status or "no status", "reward": reward_text(v.reward),
                     "prompt": prompt[:SEARCH_TEXT], "response": (v.response or "")[:SEARCH_TEXT]})  # fmt: skip
    return rows


def render_search(rows: list[dict[str, str]], title: str, report_href: str) -> str:
    """The search page: a table of every sample's prompt and response (text, escaped by the
    template engine) and one small script, ``templates/search.js``, that hides the rows not
    holding every typed word. Its CSP allows exactly that script and that stylesheet, by their
    SHA-256 hashes, and nothing else (no other script, no fetch, no image): the bundle's text is
    only ever read by the script as ``textContent``, never run or parsed as HTML."""
    import base64
    import hashlib
    import re

    page = render("search.html.j2", {"csp": f"default-src 'none'; {_HASH_SLOT}; base-uri 'none'; form-action 'none'",
                                     "title": title, "rows": rows, "report_href": report_href})  # fmt: skip

    def digest(body: str) -> str:
        return (
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode("ascii") + "'"
        )

    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(scripts) == 1 and len(styles) == 1, "the search page has one script and one style, ours"
    return page.replace(_HASH_SLOT, f"script-src {digest(scripts[0])}; style-src {digest(styles[0])}", 1)
