"""The one table of limits and the one display of untrusted names (issue 36).

The table (``bundles.support.LIMITS``) is what writers and readers import alike; docs/FORMAT.md
§8 prints it. ``display`` is how a name or a text from a bundle reaches a terminal or a page:
whatever it is given, what comes back is one line, encodable as UTF-8, without a control
character or a bidirectional override, and bounded in length.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bundles.support import LIMITS, display

ROOT = Path(__file__).resolve().parents[1]

# What no displayed text may hold: C0/C1 controls, DEL, bidi embeddings/overrides/isolates, the
# line and paragraph separators, and surrogates (which cannot be encoded at all).
_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")


def _section_8() -> str:
    text = (ROOT / "docs" / "FORMAT.md").read_text(encoding="utf-8")
    return text[text.index("## 8. Limits") : text.index("## 9.")]


def test_every_row_of_the_table_is_in_format_md_section_8() -> None:
    section = _section_8()
    missing = [name for name in LIMITS if f"`{name}`" not in section]
    assert not missing, f"docs/FORMAT.md §8 does not name these rows of bundles/_format/limits.py: {missing}"


def test_the_format_reads_its_limits_from_the_one_table() -> None:
    # The format's constants are the table's own objects, not copies that could drift.
    from bundles._format import images as _pil
    from bundles._format import layout as _layout
    from bundles._format import limits as _limits
    from bundles._store import pointer as _pointer

    for module, names in (
        (_layout, ["MAX_MANIFEST_BYTES", "MAX_SHARD_RAW_BYTES", "MAX_NESTING_DEPTH", "MAX_INT",
                   "MAX_SAMPLE_RAW_BYTES", "MAX_SAMPLE_ITEMS"]),
        (_pointer, ["MAX_POINTER_BYTES"]),
        (_pil, ["MAX_DECODE_PIXELS"]),
    ):  # fmt: skip
        for name in names:
            assert getattr(module, name) == LIMITS[name] == getattr(_limits, name), name


def test_the_table_holds_only_positive_ints() -> None:
    assert LIMITS and all(isinstance(v, int) and v > 0 for v in LIMITS.values())


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("plain name.png", "plain name.png"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),  # an escape sequence never reaches the terminal
        ("run\nfake line", "run\\nfake line"),  # a newline never forges a line
        ("tab\there\r", "tab\\there\\r"),
        ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
        ("evil\u202egnp.exe", "evil\\u202egnp.exe"),  # a right-to-left override
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),  # valid JSON, not encodable
        ("caf\udce9", "caf\\xe9"),  # os.listdir's surrogateescape of a Latin-1 name
        (b"caf\xe9", "caf\\xe9"),  # bytes that are not UTF-8
        ("zoë 東京 ✓", "zoë 東京 ✓"),  # letters of any script are shown as they are
    ],
)
def test_display_escapes_what_a_terminal_or_page_would_act_on(given: str | bytes, shown: str) -> None:
    assert display(given) == shown


def test_display_of_a_non_utf8_file_name_as_listed_from_disk(tmp_path: Path) -> None:
    name = b"shot\xff\x1b[31m.png"
    (tmp_path / os.fsdecode(name)).write_bytes(b"x")
    (listed,) = os.listdir(tmp_path)
    assert display(listed) == "shot\\xff\\x1b[31m.png"
    assert display(tmp_path / listed).endswith("/shot\\xff\\x1b[31m.png")


def test_display_is_bounded_and_says_how_long_the_text_was() -> None:
    shown = display("x" * 10**7, limit=50)
    assert shown == "x" * 50 + "... (10000000 characters)"
    assert display(b"y" * 1000, limit=10) == "y" * 10 + "... (1000 bytes)"


@given(st.one_of(st.text(), st.binary()), st.integers(min_value=1, max_value=400))
def test_display_of_anything_is_one_safe_bounded_line(value: str | bytes, limit: int) -> None:
    shown = display(value, limit=limit)
    shown.encode("utf-8")  # never raises: no surrogate survives
    assert not _FORBIDDEN.search(shown), ascii(shown)
    # each character becomes at most 6 characters (\u202e), plus the length note
    assert len(shown) <= 6 * limit + len(f"... ({len(value)} characters)")


@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf"))))
def test_display_leaves_printable_text_as_it_is(value: str) -> None:
    assert display(value, limit=max(1, len(value))) == value
    assert all(unicodedata.category(c) not in ("Cc", "Cs") for c in display(value))
